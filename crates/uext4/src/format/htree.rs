//! On-disk layout of the hashed directory index (Documentation/filesystems/ext4/directory.rst,
//! "Hash Tree Directories").
//!
//! ```text
//! dx_root (logical block 0 of an indexed directory)
//! 0x00 "."  entry: inode, rec_len 12, name_len 1, type, ".\0\0\0"
//! 0x0C ".." entry: inode, rec_len block_size - 12, name_len 2, type, "..\0\0"
//! 0x18 dx_root_info: reserved_zero u32, hash_version u8, info_length u8 (8),
//!      indirect_levels u8, unused_flags u8
//! 0x20 dx_countlimit: limit u16, count u16, block u32 (entry 0, hash implicitly 0)
//! 0x28 dx_entry[count - 1]: hash u32, block u32
//!
//! dx_node (interior index block)
//! 0x00 fake entry: inode 0, rec_len block_size, name_len 0, type 0
//! 0x08 dx_countlimit, then dx_entry[count - 1]
//!
//! dx_tail (metadata_csum, right after `limit` entries): reserved u32, checksum u32
//! ```
//!
//! The checksum is crc32c(inode seed, header and the `count` used entries) continued over the
//! tail's reserved word and a zero checksum.

use crate::format::csum::crc32c;
use crate::format::{le16, le32, put16, put32};

/// Directory hash version: legacy.
pub const DX_HASH_LEGACY: u8 = 0;
/// Directory hash version: half md4.
pub const DX_HASH_HALF_MD4: u8 = 1;
/// Directory hash version: tea.
pub const DX_HASH_TEA: u8 = 2;
/// Directory hash version: legacy unsigned.
pub const DX_HASH_LEGACY_UNSIGNED: u8 = 3;
/// Directory hash version: half md4 unsigned.
pub const DX_HASH_HALF_MD4_UNSIGNED: u8 = 4;
/// Directory hash version: tea unsigned.
pub const DX_HASH_TEA_UNSIGNED: u8 = 5;
/// Directory hash version: siphash.
pub const DX_HASH_SIPHASH: u8 = 6;

/// Offset of dx_root_info in the root block.
pub const ROOT_INFO: usize = 0x18;
/// Fields of dx_root_info, relative to the block.
pub const ROOT_HASH_VERSION: usize = ROOT_INFO + 4;
/// Offset of dx_root_info's `info_length` in the root block.
pub const ROOT_INFO_LENGTH: usize = ROOT_INFO + 5;
/// Offset of dx_root_info's `indirect_levels` in the root block.
pub const ROOT_INDIRECT_LEVELS: usize = ROOT_INFO + 6;
/// Offset of dx_root_info's `unused_flags` in the root block.
pub const ROOT_UNUSED_FLAGS: usize = ROOT_INFO + 7;
/// Offset of the count/limit header in the root and in interior nodes.
pub const ROOT_COUNT: usize = 0x20;
/// Offset of the count/limit header in an interior node.
pub const NODE_COUNT: usize = 0x8;
/// Size of one dx_entry (and of dx_countlimit with its block), and of dx_tail.
pub const DX_ENTRY_SIZE: usize = 8;
/// Size of dx_tail (the checksum after the entries).
pub const DX_TAIL_SIZE: usize = 8;

/// An index block's entries: `(hash, block)`; entry 0's hash is implicitly 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DxNode {
    /// Offset of the count/limit header in the block.
    pub count_off: usize,
    /// How many entries fit.
    pub limit: usize,
    /// The entries.
    pub entries: Vec<(u32, u32)>,
}

impl DxNode {
    /// Parses count/limit and the entries; None when they do not fit the block or count is 0
    /// or over the limit.
    pub fn parse(b: &[u8], count_off: usize) -> Option<DxNode> {
        if count_off + 8 > b.len() {
            return None;
        }
        let limit = le16(b, count_off) as usize;
        let count = le16(b, count_off + 2) as usize;
        if count == 0 || count > limit || count_off + limit * DX_ENTRY_SIZE > b.len() {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        entries.push((0, le32(b, count_off + 4)));
        for i in 1..count {
            let o = count_off + i * DX_ENTRY_SIZE;
            entries.push((le32(b, o), le32(b, o + 4)));
        }
        Some(DxNode {
            count_off,
            limit,
            entries,
        })
    }

    /// Writes the count/limit header and the entries (not the checksum); clears stale entries
    /// past the count.
    pub fn store(&self, b: &mut [u8]) {
        let o = self.count_off;
        put16(b, o, self.limit as u16);
        put16(b, o + 2, self.entries.len() as u16);
        put32(b, o + 4, self.entries[0].1);
        for (i, &(h, blk)) in self.entries.iter().enumerate().skip(1) {
            put32(b, o + i * DX_ENTRY_SIZE, h);
            put32(b, o + i * DX_ENTRY_SIZE + 4, blk);
        }
        for i in self.entries.len()..self.limit {
            b[o + i * DX_ENTRY_SIZE..o + (i + 1) * DX_ENTRY_SIZE].fill(0);
        }
    }

    /// Index of the entry whose subtree holds `hash`: the last whose hash is <= `hash`.
    pub fn find(&self, hash: u32) -> usize {
        // Entries are sorted by hash (checked on read); binary search over 1..count.
        let (mut lo, mut hi) = (1usize, self.entries.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.entries[mid].0 <= hash {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo - 1
    }

    /// Whether no further entry fits.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.limit
    }
}

/// Capacity of an index block: root or node, with or without the checksum tail.
pub fn dx_limit(block_size: usize, root: bool, csum: bool) -> usize {
    let start = if root { ROOT_COUNT } else { NODE_COUNT };
    (block_size - start - if csum { DX_TAIL_SIZE } else { 0 }) / DX_ENTRY_SIZE
}

/// The dx checksum of an index block whose count/limit header is at `count_off`; None when
/// the tail does not fit.
pub fn dx_csum(seed: u32, b: &[u8], count_off: usize) -> Option<u32> {
    let limit = le16(b, count_off) as usize;
    let count = le16(b, count_off + 2) as usize;
    let tail = count_off + limit * DX_ENTRY_SIZE;
    if tail + DX_TAIL_SIZE > b.len() || count > limit {
        return None;
    }
    let c = crc32c(seed, &b[..count_off + count * DX_ENTRY_SIZE]);
    let c = crc32c(c, &b[tail..tail + 4]);
    Some(crc32c(c, &[0u8; 4]))
}

/// Stores an index block's checksum (in the dx_tail after `limit` entries).
pub fn set_dx_csum(seed: u32, b: &mut [u8], count_off: usize) {
    let limit = le16(b, count_off) as usize;
    let tail = count_off + limit * DX_ENTRY_SIZE;
    if tail + DX_TAIL_SIZE > b.len() {
        return;
    }
    put32(b, tail, 0);
    if let Some(c) = dx_csum(seed, b, count_off) {
        put32(b, tail + 4, c);
    }
}

/// Whether an index block matches its stored checksum.
pub fn verify_dx_csum(seed: u32, b: &[u8], count_off: usize) -> bool {
    if count_off + 4 > b.len() {
        return false;
    }
    let limit = le16(b, count_off) as usize;
    let tail = count_off + limit * DX_ENTRY_SIZE;
    match dx_csum(seed, b, count_off) {
        Some(c) => le32(b, tail + 4) == c,
        None => false,
    }
}

#[cfg(test)]
mod tests;
