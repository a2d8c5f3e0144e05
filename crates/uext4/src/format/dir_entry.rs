//! Directory entries (`ext4_dir_entry_2`) and the leaf checksum tail (`ext4_dir_entry_tail`).
//!
//! ```text
//! 0x0  inode      u32   0 = unused entry
//! 0x4  rec_len    u16   bytes to the next entry (multiple of 4; 0 or 65535 mean 65536)
//! 0x6  name_len   u8
//! 0x7  file_type  u8    FT_* when the filetype feature is on, else the high byte of name_len
//! 0x8  name       [u8; name_len]
//! ```
//!
//! With metadata_csum every leaf block ends in a 12-byte fake entry: inode 0, rec_len 12,
//! name_len 0, file_type 0xDE, then the crc32c of the block before it.

use crate::format::csum::crc32c;
use crate::format::inode::{
    S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use crate::format::{le16, le32, put16, put32};

/// Directory entry file type: unknown.
pub const FT_UNKNOWN: u8 = 0;
/// Directory entry file type: reg.
pub const FT_REG: u8 = 1;
/// Directory entry file type: dir.
pub const FT_DIR: u8 = 2;
/// Directory entry file type: chrdev.
pub const FT_CHRDEV: u8 = 3;
/// Directory entry file type: blkdev.
pub const FT_BLKDEV: u8 = 4;
/// Directory entry file type: fifo.
pub const FT_FIFO: u8 = 5;
/// Directory entry file type: sock.
pub const FT_SOCK: u8 = 6;
/// Directory entry file type: symlink.
pub const FT_SYMLINK: u8 = 7;
/// The file type byte of the checksum tail entry.
pub const FT_DIR_CSUM: u8 = 0xDE;

/// Size of the fixed part of an entry.
pub const DIRENT_HEADER: usize = 8;
/// Size of the checksum tail.
pub const DIRENT_TAIL_SIZE: usize = 12;
/// The smallest legal rec_len (an entry with a one-byte name).
pub const MIN_REC_LEN: usize = 12;
/// The longest name a directory entry holds, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The directory entry file type for an inode mode.
pub fn ftype_from_mode(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => FT_REG,
        S_IFDIR => FT_DIR,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

/// The rec_len an entry with a `name_len`-byte name needs (header and name, rounded to 4).
pub fn rec_len_for(name_len: usize) -> usize {
    (DIRENT_HEADER + name_len + 3) & !3
}

/// Decodes an on-disk rec_len (65536-byte blocks store 0 or 65535 for a whole block).
pub fn rec_len_from_disk(v: u16, block_size: usize) -> usize {
    if (v == 0 || v == 65535) && block_size >= 65536 {
        65536
    } else {
        v as usize
    }
}

/// Encodes a record length for the disk (65536, a whole 64 KiB block, is stored as 65535).
pub fn rec_len_to_disk(len: usize) -> u16 {
    if len >= 65536 {
        65535
    } else {
        len as u16
    }
}

/// A read-only view of the entry at `off` in a directory block. The caller has checked that
/// the header lies inside the block; `name` is clamped to the block.
#[derive(Clone, Copy)]
pub struct DirEntryRef<'a> {
    /// The directory block.
    pub block: &'a [u8],
    /// The entry's byte offset in the block.
    pub off: usize,
}

impl<'a> DirEntryRef<'a> {
    /// The inode the entry names (0: an unused entry).
    pub fn inode(&self) -> u32 {
        le32(self.block, self.off)
    }
    /// The entry's record length: where the next entry starts, relative to this one.
    pub fn rec_len(&self) -> usize {
        rec_len_from_disk(le16(self.block, self.off + 4), self.block.len())
    }
    /// The name's length in bytes.
    pub fn name_len(&self) -> usize {
        self.block[self.off + 6] as usize
    }
    /// The file type (`FT_*`).
    pub fn file_type(&self) -> u8 {
        self.block[self.off + 7]
    }
    /// The name's bytes.
    pub fn name(&self) -> &'a [u8] {
        let s = (self.off + DIRENT_HEADER).min(self.block.len());
        let e = (s + self.name_len()).min(self.block.len());
        &self.block[s..e]
    }
}

/// Writes a whole entry at `off`.
pub fn put_dirent(b: &mut [u8], off: usize, inode: u32, rec_len: usize, name: &[u8], ftype: u8) {
    put32(b, off, inode);
    put16(b, off + 4, rec_len_to_disk(rec_len));
    b[off + 6] = name.len() as u8;
    b[off + 7] = ftype;
    b[off + DIRENT_HEADER..off + DIRENT_HEADER + name.len()].copy_from_slice(name);
}

/// Sets the record length of the entry at `off`.
pub fn set_rec_len(b: &mut [u8], off: usize, rec_len: usize) {
    put16(b, off + 4, rec_len_to_disk(rec_len));
}

/// Whether the block ends in a well-formed checksum tail.
pub fn has_tail(b: &[u8]) -> bool {
    if b.len() < DIRENT_TAIL_SIZE {
        return false;
    }
    let t = b.len() - DIRENT_TAIL_SIZE;
    le32(b, t) == 0
        && le16(b, t + 4) as usize == DIRENT_TAIL_SIZE
        && b[t + 6] == 0
        && b[t + 7] == FT_DIR_CSUM
}

/// Writes the tail's fixed fields and `csum`.
pub fn put_tail(b: &mut [u8], csum: u32) {
    let t = b.len() - DIRENT_TAIL_SIZE;
    put32(b, t, 0);
    put16(b, t + 4, DIRENT_TAIL_SIZE as u16);
    b[t + 6] = 0;
    b[t + 7] = FT_DIR_CSUM;
    put32(b, t + 8, csum);
}

/// Writes the checksum tail of a leaf block: crc32c from the directory inode's seed over the
/// block before the tail.
pub fn set_tail_csum(b: &mut [u8], seed: u32) {
    let t = b.len() - DIRENT_TAIL_SIZE;
    let c = crc32c(seed, &b[..t]);
    put_tail(b, c);
}

/// The checksum stored in a directory block's tail.
pub fn tail_csum(b: &[u8]) -> u32 {
    le32(b, b.len() - 4)
}

#[cfg(test)]
mod tests;
