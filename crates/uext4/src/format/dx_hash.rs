//! The name hashes of the hashed directory index, as the kernel's fs/ext4/hash.c computes them:
//! the legacy hash, half MD4 and TEA, each with signed or unsigned `char` (the superblock says
//! which the filesystem was made with). Pure functions of the name, the version and the seed.

use crate::format::htree::{
    DX_HASH_HALF_MD4, DX_HASH_HALF_MD4_UNSIGNED, DX_HASH_LEGACY, DX_HASH_LEGACY_UNSIGNED,
    DX_HASH_TEA, DX_HASH_TEA_UNSIGNED,
};

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
    let mut buf: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    if seed.iter().any(|&s| s != 0) {
        buf = *seed;
    }
    let (hash, minor) = match version {
        DX_HASH_LEGACY => (dx_hack_hash(name, true), 0),
        DX_HASH_LEGACY_UNSIGNED => (dx_hack_hash(name, false), 0),
        DX_HASH_HALF_MD4 | DX_HASH_HALF_MD4_UNSIGNED => {
            let signed = version == DX_HASH_HALF_MD4;
            // As the kernel's `while (len > 0)`: an empty name (a casefolded one made only of
            // ignorable characters) hashes the seed alone.
            for p in (0..name.len()).step_by(32).map(|i| &name[i..]) {
                half_md4_transform(&mut buf, &str2hashbuf(p, 8, signed));
            }
            (buf[1], buf[2])
        }
        _ => {
            let signed = version == DX_HASH_TEA;
            for p in (0..name.len()).step_by(16).map(|i| &name[i..]) {
                tea_transform(&mut buf, &str2hashbuf(p, 4, signed));
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

/// Whether `v` (after the unsigned adjustment) is a hash version this engine computes.
pub fn hash_version_known(v: u8) -> bool {
    v <= DX_HASH_TEA_UNSIGNED
}

#[cfg(test)]
mod tests;
