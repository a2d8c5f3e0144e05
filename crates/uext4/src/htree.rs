//! The hashed directory index (htree, "dx"): name hashes and the index blocks.
//!
//! Block 0 of an indexed directory is the dx root: fake "." and ".." entries, `dx_root_info`
//! (hash version, indirect levels), then a count/limit header and (hash, block) entries. Interior
//! nodes are a fake empty directory entry followed by the same count/limit and entries. With
//! metadata_csum every index block ends in an 8-byte `dx_tail` holding its checksum.

pub use crate::format::htree::*;

const HTREE_EOF_32: u32 = 0x7fff_ffff;

/// Packs name bytes into 32-bit words as the kernel's str2hashbuf does (signed or unsigned
/// chars), padding with the length.
fn str2hashbuf(msg: &[u8], num: usize, signed: bool) -> [u32; 8] {
    let mut out = [0u32; 8];
    let len = msg.len() as u32;
    let mut pad = len | (len << 8);
    pad |= pad << 16;
    let mut val = pad;
    let n = msg.len().min(num * 4);
    let mut w = 0;
    let mut left = num as i32;
    for (i, &c) in msg[..n].iter().enumerate() {
        let c = if signed {
            c as i8 as i32 as u32
        } else {
            c as u32
        };
        val = c.wrapping_add(val << 8);
        if i % 4 == 3 {
            out[w] = val;
            w += 1;
            val = pad;
            left -= 1;
        }
    }
    left -= 1;
    if left >= 0 {
        out[w] = val;
        w += 1;
    }
    while left > 0 {
        left -= 1;
        out[w] = pad;
        w += 1;
    }
    out
}

fn tea_transform(buf: &mut [u32; 4], inp: &[u32]) {
    let mut sum: u32 = 0;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let (a, b, c, d) = (inp[0], inp[1], inp[2], inp[3]);
    for _ in 0..16 {
        sum = sum.wrapping_add(0x9E37_79B9);
        b0 = b0.wrapping_add(
            ((b1 << 4).wrapping_add(a)) ^ (b1.wrapping_add(sum)) ^ ((b1 >> 5).wrapping_add(b)),
        );
        b1 = b1.wrapping_add(
            ((b0 << 4).wrapping_add(c)) ^ (b0.wrapping_add(sum)) ^ ((b0 >> 5).wrapping_add(d)),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

fn half_md4_transform(buf: &mut [u32; 4], x: &[u32; 8]) {
    let f = |x: u32, y: u32, z: u32| z ^ (x & (y ^ z));
    let g = |x: u32, y: u32, z: u32| (x & y).wrapping_add((x ^ y) & z);
    let h = |x: u32, y: u32, z: u32| x ^ y ^ z;
    const K2: u32 = 0o13240474631;
    const K3: u32 = 0o15666365641;
    let (mut a, mut b, mut c, mut d) = (buf[0], buf[1], buf[2], buf[3]);
    macro_rules! round {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $x:expr, $s:expr) => {
            $a = $a
                .wrapping_add($f($b, $c, $d))
                .wrapping_add($x)
                .rotate_left($s);
        };
    }
    round!(f, a, b, c, d, x[0], 3);
    round!(f, d, a, b, c, x[1], 7);
    round!(f, c, d, a, b, x[2], 11);
    round!(f, b, c, d, a, x[3], 19);
    round!(f, a, b, c, d, x[4], 3);
    round!(f, d, a, b, c, x[5], 7);
    round!(f, c, d, a, b, x[6], 11);
    round!(f, b, c, d, a, x[7], 19);
    round!(g, a, b, c, d, x[1].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[3].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[5].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[7].wrapping_add(K2), 13);
    round!(g, a, b, c, d, x[0].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[2].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[4].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[6].wrapping_add(K2), 13);
    round!(h, a, b, c, d, x[3].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[7].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[2].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[6].wrapping_add(K3), 15);
    round!(h, a, b, c, d, x[1].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[5].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[0].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[4].wrapping_add(K3), 15);
    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

fn dx_hack_hash(name: &[u8], signed: bool) -> u32 {
    let (mut hash0, mut hash1): (u32, u32) = (0x12a3_fe2d, 0x37ab_e8f9);
    for &c in name {
        let c = if signed { c as i8 as i32 } else { c as i32 };
        let mut hash = hash1.wrapping_add(hash0 ^ (c.wrapping_mul(7_152_373) as u32));
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// The (major, minor) hash of a name, as ext4fs_dirhash computes it. `version` is one of the
/// DX_HASH_* values (the unsigned variants included).
pub fn dirhash(name: &[u8], version: u8, seed: &[u32; 4]) -> (u32, u32) {
    #[cfg(test)]
    if let Some(f) = TEST_HASH.with(|c| c.get()) {
        return f(name);
    }
    let mut buf: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    if seed.iter().any(|&s| s != 0) {
        buf = *seed;
    }
    let (hash, minor) = match version {
        DX_HASH_LEGACY => (dx_hack_hash(name, true), 0),
        DX_HASH_LEGACY_UNSIGNED => (dx_hack_hash(name, false), 0),
        DX_HASH_HALF_MD4 | DX_HASH_HALF_MD4_UNSIGNED => {
            let signed = version == DX_HASH_HALF_MD4;
            let mut p = name;
            loop {
                let inp = str2hashbuf(p, 8, signed);
                half_md4_transform(&mut buf, &inp);
                if p.len() <= 32 {
                    break;
                }
                p = &p[32..];
            }
            (buf[1], buf[2])
        }
        _ => {
            let signed = version == DX_HASH_TEA;
            let mut p = name;
            loop {
                let inp = str2hashbuf(p, 4, signed);
                tea_transform(&mut buf, &inp);
                if p.len() <= 16 {
                    break;
                }
                p = &p[16..];
            }
            (buf[0], buf[1])
        }
    };
    let mut hash = hash & !1;
    if hash == HTREE_EOF_32 << 1 {
        hash = (HTREE_EOF_32 - 1) << 1;
    }
    (hash, minor)
}

#[cfg(test)]
pub(crate) type TestHashFn = fn(&[u8]) -> (u32, u32);

#[cfg(test)]
thread_local! {
    /// Unit tests only: replaces the hash on this thread (to force collisions).
    pub(crate) static TEST_HASH: std::cell::Cell<Option<TestHashFn>> =
        const { std::cell::Cell::new(None) };
}

/// Whether `v` (after the unsigned adjustment) is a hash version this engine computes.
pub fn hash_version_known(v: u8) -> bool {
    v <= DX_HASH_TEA_UNSIGNED
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from `debugfs -R "dx_hash -h <alg> [-s <seed>] <name>"` (e2fsprogs 1.47).
    #[test]
    fn hashes_match_debugfs() {
        let zero = [0u32; 4];
        // Seed 01234567-89ab-cdef-0123-456789abcdef, as the superblock stores it.
        let seed = [0x6745_2301, 0xefcd_ab89, 0x6745_2301, 0xefcd_ab89];
        let long = b"a-much-longer-file-name-that-spans-more-than-thirty-two-bytes";
        assert_eq!(
            dirhash(b"hello", DX_HASH_HALF_MD4, &zero),
            (0x1746da32, 0x420013b5)
        );
        assert_eq!(
            dirhash(long, DX_HASH_HALF_MD4, &seed),
            (0xfbf799c6, 0xc1749341)
        );
        assert_eq!(
            dirhash(b"hello", DX_HASH_TEA, &zero),
            (0x6f5bb1a8, 0x231917c2)
        );
        assert_eq!(dirhash(long, DX_HASH_TEA, &seed), (0xcbc3f652, 0xfc72fb09));
        assert_eq!(dirhash(b"hello", DX_HASH_LEGACY, &zero).0, 0x32252546);
        assert_eq!(dirhash(long, DX_HASH_LEGACY, &seed).0, 0x2e5820e2);
        // High-bit bytes: signed and unsigned variants differ (`dx_hash -h 0..5`).
        let hi = "héllo-wörld-ÿÿÿÿ-and-some-more-bytes-to-pass-32".as_bytes();
        assert_eq!(dirhash(hi, DX_HASH_LEGACY, &seed), (0x6d730bde, 0));
        assert_eq!(
            dirhash(hi, DX_HASH_HALF_MD4, &seed),
            (0x5d3f2162, 0x4c868d93)
        );
        assert_eq!(dirhash(hi, DX_HASH_TEA, &seed), (0x0c180df0, 0x8efa2bc3));
        assert_eq!(dirhash(hi, DX_HASH_LEGACY_UNSIGNED, &seed), (0xa6793918, 0));
        assert_eq!(
            dirhash(hi, DX_HASH_HALF_MD4_UNSIGNED, &seed),
            (0x89d4a130, 0x36456be4)
        );
        assert_eq!(
            dirhash(hi, DX_HASH_TEA_UNSIGNED, &seed),
            (0xd63a1fc4, 0x85bfc66d)
        );
        assert_eq!(
            dirhash(b"x", DX_HASH_TEA_UNSIGNED, &zero),
            (0xe958e760, 0x9772c62c)
        );
        assert_eq!(dirhash(b"x", DX_HASH_LEGACY, &zero).0, 0xb26f0bdc);
    }

    /// Many names against debugfs in one go (skipped when debugfs is missing).
    #[test]
    fn hashes_match_debugfs_bulk() {
        let seed_str = "8f3c2a10-5b6d-4e7f-9a01-23456789abcd";
        let u = [
            0x8f, 0x3c, 0x2a, 0x10, 0x5b, 0x6d, 0x4e, 0x7f, 0x9a, 0x01, 0x23, 0x45, 0x67, 0x89,
            0xab, 0xcd,
        ];
        let seed: [u32; 4] =
            std::array::from_fn(|i| u32::from_le_bytes(u[i * 4..i * 4 + 4].try_into().unwrap()));
        let names: Vec<String> = (0..40)
            .map(|i| match i % 4 {
                0 => format!("n{i}"),
                1 => format!("file-{i}-{}", "q".repeat(i)),
                2 => format!("é{i}ñ{}", "Ω".repeat(i % 9)),
                _ => "x".repeat(i * 6 + 1),
            })
            .collect();
        for v in 0..=5u8 {
            let mut script = String::new();
            for n in &names {
                script.push_str(&format!("dx_hash -h {v} -s {seed_str} {n}\n"));
            }
            let out = match std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf '{script}' | debugfs -f - 2>/dev/null"))
                .output()
            {
                Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
                _ => {
                    eprintln!("SKIP: debugfs not available");
                    return;
                }
            };
            let got: Vec<(u32, u32)> = out
                .lines()
                .filter(|l| l.starts_with("Hash of "))
                .map(|l| {
                    let h = l.split(" is 0x").nth(1).unwrap();
                    let (a, b) = h.split_once(" (minor 0x").unwrap();
                    (
                        u32::from_str_radix(a, 16).unwrap(),
                        u32::from_str_radix(b.trim_end_matches(')'), 16).unwrap(),
                    )
                })
                .collect();
            if got.is_empty() {
                eprintln!("SKIP: debugfs gave no dx_hash output");
                return;
            }
            assert_eq!(got.len(), names.len());
            for (n, g) in names.iter().zip(got) {
                assert_eq!(dirhash(n.as_bytes(), v, &seed), g, "version {v} name {n}");
            }
        }
    }
}
