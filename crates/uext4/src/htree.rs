//! The hashed directory index (htree, "dx"): name hashes and the index blocks.
//!
//! Block 0 of an indexed directory is the dx root: fake "." and ".." entries, `dx_root_info`
//! (hash version, indirect levels), then a count/limit header and (hash, block) entries. Interior
//! nodes are a fake empty directory entry followed by the same count/limit and entries. With
//! metadata_csum every index block ends in an 8-byte `dx_tail` holding its checksum.

use crate::format::csum::crc32c;
use crate::format::{le16, le32, put16, put32};

pub const DX_HASH_LEGACY: u8 = 0;
pub const DX_HASH_HALF_MD4: u8 = 1;
pub const DX_HASH_TEA: u8 = 2;
pub const DX_HASH_LEGACY_UNSIGNED: u8 = 3;
pub const DX_HASH_HALF_MD4_UNSIGNED: u8 = 4;
pub const DX_HASH_TEA_UNSIGNED: u8 = 5;

/// Offset of dx_root_info in the root block; of the count/limit header in root and nodes.
pub const ROOT_INFO: usize = 0x18;
pub const ROOT_COUNT: usize = 0x20;
pub const NODE_COUNT: usize = 0x8;

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

/// An index block's entries: `(hash, block)`; entry 0's hash is implicitly 0.
#[derive(Clone, Debug)]
pub struct DxNode {
    pub count_off: usize,
    pub limit: usize,
    pub entries: Vec<(u32, u32)>,
}

impl DxNode {
    pub fn parse(b: &[u8], count_off: usize) -> Option<DxNode> {
        if count_off + 8 > b.len() {
            return None;
        }
        let limit = le16(b, count_off) as usize;
        let count = le16(b, count_off + 2) as usize;
        if count == 0 || count > limit || count_off + limit * 8 > b.len() {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        entries.push((0, le32(b, count_off + 4)));
        for i in 1..count {
            entries.push((le32(b, count_off + i * 8), le32(b, count_off + i * 8 + 4)));
        }
        Some(DxNode {
            count_off,
            limit,
            entries,
        })
    }

    /// Writes the count/limit header and the entries (not the checksum).
    pub fn store(&self, b: &mut [u8]) {
        let o = self.count_off;
        put16(b, o, self.limit as u16);
        put16(b, o + 2, self.entries.len() as u16);
        put32(b, o + 4, self.entries[0].1);
        for (i, &(h, blk)) in self.entries.iter().enumerate().skip(1) {
            put32(b, o + i * 8, h);
            put32(b, o + i * 8 + 4, blk);
        }
        // Clear stale entries past the count, up to the limit.
        for i in self.entries.len()..self.limit {
            b[o + i * 8..o + i * 8 + 8].fill(0);
        }
    }

    /// Index of the entry whose subtree holds `hash`.
    pub fn find(&self, hash: u32) -> usize {
        let mut i = 1;
        while i < self.entries.len() && self.entries[i].0 <= hash {
            i += 1;
        }
        i - 1
    }
}

/// Capacity of an index block: root or node, with or without the checksum tail.
pub fn dx_limit(block_size: usize, root: bool, csum: bool) -> usize {
    let start = if root { ROOT_COUNT } else { NODE_COUNT };
    (block_size - start - if csum { 8 } else { 0 }) / 8
}

/// The dx checksum: over the header and used entries, then the tail's reserved word and a zero
/// checksum.
pub fn dx_csum(seed: u32, b: &[u8], count_off: usize) -> Option<u32> {
    let limit = le16(b, count_off) as usize;
    let count = le16(b, count_off + 2) as usize;
    let tail = count_off + limit * 8;
    if tail + 8 > b.len() || count > limit {
        return None;
    }
    let c = crc32c(seed, &b[..count_off + count * 8]);
    let c = crc32c(c, &b[tail..tail + 4]);
    Some(crc32c(c, &[0u8; 4]))
}

pub fn set_dx_csum(seed: u32, b: &mut [u8], count_off: usize) {
    let limit = le16(b, count_off) as usize;
    let tail = count_off + limit * 8;
    if let Some(c) = dx_csum(seed, b, count_off) {
        put32(b, tail, 0);
        put32(b, tail + 4, c);
    }
}

pub fn verify_dx_csum(seed: u32, b: &[u8], count_off: usize) -> bool {
    let limit = le16(b, count_off) as usize;
    let tail = count_off + limit * 8;
    match dx_csum(seed, b, count_off) {
        Some(c) => le32(b, tail + 4) == c,
        None => false,
    }
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
    }
}
