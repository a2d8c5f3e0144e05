//! Orphan file blocks (Documentation/filesystems/ext4/orphan.rst): an array of le32 inode
//! numbers, then an 8-byte tail: a magic number and, with metadata_csum, the crc32c from the
//! orphan file inode's seed over the block's physical number and the array.

use crate::format::csum::crc32c;
use crate::format::put32;

/// The magic number in the tail of each orphan file block.
pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
/// Size of the tail (magic, checksum).
pub const ORPHAN_TAIL_SIZE: usize = 8;

/// Inode slots in an orphan file block.
pub fn entries_per_block(block_size: usize) -> usize {
    (block_size - ORPHAN_TAIL_SIZE) / 4
}

/// The checksum of orphan file block `b` at physical block `pblk`.
pub fn block_csum(seed: u32, pblk: u64, b: &[u8]) -> u32 {
    let c = crc32c(seed, &pblk.to_le_bytes());
    crc32c(c, &b[..entries_per_block(b.len()) * 4])
}

/// Writes the tail of block `b`: the magic, and the checksum when `seed` is given.
pub fn put_tail(b: &mut [u8], seed: Option<u32>, pblk: u64) {
    let t = b.len() - ORPHAN_TAIL_SIZE;
    put32(b, t, ORPHAN_BLOCK_MAGIC);
    if let Some(seed) = seed {
        let c = block_csum(seed, pblk, b);
        put32(b, t + 4, c);
    }
}

#[cfg(test)]
mod tests;
