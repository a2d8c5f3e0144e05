//! Extent tree nodes (Documentation/filesystems/ext4/ifork.rst): a 12-byte header, then 12-byte
//! entries: leaves (ext4_extent) at depth 0, indexes (ext4_extent_idx) above. The root lives in
//! i_block (4 entries); other nodes fill a block and end in a 4-byte checksum tail.

use super::csum::crc32c;
use super::{le16, le32, put16, put32};

/// `eh_magic` of every extent node header.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Size of an extent node header.
pub const HEADER_SIZE: usize = 12;
/// Size of one extent or index entry.
pub const ENTRY_SIZE: usize = 12;
/// ee_len above this marks an unwritten (preallocated) extent.
pub const MAX_INIT_LEN: u32 = 32768;
/// The longest unwritten extent, in blocks.
pub const MAX_UNWRITTEN_LEN: u32 = 32767;
/// A sane bound on tree depth (the kernel's EXT4_MAX_EXTENT_DEPTH).
pub const MAX_DEPTH: u16 = 5;

/// An extent node's header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentHeader {
    /// `eh_magic`: [`EXTENT_MAGIC`].
    pub magic: u16,
    /// `eh_entries`: how many entries the node holds.
    pub entries: u16,
    /// `eh_max`: how many entries fit.
    pub max: u16,
    /// `eh_depth`: 0 for a leaf.
    pub depth: u16,
    /// `eh_generation`.
    pub generation: u32,
}

impl ExtentHeader {
    /// Decodes the header at the start of `b`.
    pub fn read(b: &[u8]) -> Self {
        ExtentHeader {
            magic: le16(b, 0),
            entries: le16(b, 2),
            max: le16(b, 4),
            depth: le16(b, 6),
            generation: le32(b, 8),
        }
    }
    /// Encodes the header at the start of `b`.
    pub fn write(&self, b: &mut [u8]) {
        put16(b, 0, self.magic);
        put16(b, 2, self.entries);
        put16(b, 4, self.max);
        put16(b, 6, self.depth);
        put32(b, 8, self.generation);
    }
}

/// A leaf entry: `len` blocks from logical `lblk` at physical `pblk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// The first logical block.
    pub lblk: u32,
    /// The length in blocks.
    pub len: u32,
    /// The first physical block.
    pub pblk: u64,
    /// Whether the extent is allocated but not yet written (reads as zeros).
    pub unwritten: bool,
}

impl Extent {
    /// Decodes the leaf entry at the start of `b`.
    pub fn read(b: &[u8]) -> Self {
        let raw_len = le16(b, 4) as u32;
        let (len, unwritten) = if raw_len > MAX_INIT_LEN {
            (raw_len - MAX_INIT_LEN, true)
        } else {
            (raw_len, false)
        };
        Extent {
            lblk: le32(b, 0),
            len,
            pblk: (le16(b, 6) as u64) << 32 | le32(b, 8) as u64,
            unwritten,
        }
    }
    /// Encodes the leaf entry at the start of `b`.
    pub fn write(&self, b: &mut [u8]) {
        put32(b, 0, self.lblk);
        let raw = if self.unwritten {
            self.len + MAX_INIT_LEN
        } else {
            self.len
        };
        put16(b, 4, raw as u16);
        put16(b, 6, (self.pblk >> 32) as u16);
        put32(b, 8, self.pblk as u32);
    }
    /// The logical block just past the extent.
    pub fn end(&self) -> u64 {
        self.lblk as u64 + self.len as u64
    }
    /// The longest extent of either kind, in blocks.
    pub fn max_len(unwritten: bool) -> u32 {
        if unwritten {
            MAX_UNWRITTEN_LEN
        } else {
            MAX_INIT_LEN
        }
    }
}

/// An index entry: the subtree covering logical blocks from `lblk` lives in block `leaf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentIdx {
    /// The first logical block the subtree covers.
    pub lblk: u32,
    /// The block holding the subtree's node.
    pub leaf: u64,
}

impl ExtentIdx {
    /// Decodes the index entry at the start of `b`.
    pub fn read(b: &[u8]) -> Self {
        ExtentIdx {
            lblk: le32(b, 0),
            leaf: (le16(b, 8) as u64) << 32 | le32(b, 4) as u64,
        }
    }
    /// Encodes the index entry at the start of `b`.
    pub fn write(&self, b: &mut [u8]) {
        put32(b, 0, self.lblk);
        put32(b, 4, self.leaf as u32);
        put16(b, 8, (self.leaf >> 32) as u16);
        put16(b, 10, 0);
    }
}

/// Entries that fit in a node of `size` bytes (i_block: 60 -> 4; a block: minus the tail).
pub fn node_capacity(size: usize, is_root: bool) -> u16 {
    if is_root {
        ((size - HEADER_SIZE) / ENTRY_SIZE) as u16
    } else {
        ((size - HEADER_SIZE - 4) / ENTRY_SIZE) as u16
    }
}

/// Byte offset of a non-root node's checksum tail: right after eh_max entries.
pub fn tail_offset(max: u16) -> usize {
    HEADER_SIZE + ENTRY_SIZE * max as usize
}

/// Writes the checksum tail of a non-root node: crc32c from the inode's seed over the header
/// and all eh_max entries.
pub fn set_node_csum(b: &mut [u8], seed: u32) {
    let t = tail_offset(ExtentHeader::read(b).max);
    let c = crc32c(seed, &b[..t]);
    put32(b, t, c);
}

#[cfg(test)]
mod tests;
