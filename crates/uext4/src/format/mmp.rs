//! The multi-mount protection block (`struct mmp_struct` in the kernel's fs/ext4/ext4.h): one
//! block, at s_mmp_block, whose sequence number the node using the filesystem rewrites every
//! s_mmp_update_interval seconds. Only its first 1024 bytes are defined; the rest of the block
//! is unused. The protocol is in `crate::mmp`.

use super::csum::crc32c;
use super::le_field;

/// The defined part of the MMP block.
pub const MMP_SIZE: usize = 1024;
/// `mmp_magic`: "MMP" in ASCII.
pub const MMP_MAGIC: u32 = 0x004D_4D50;
/// `mmp_seq` after a clean unmount: anyone may take the filesystem.
pub const MMP_SEQ_CLEAN: u32 = 0xFF4D_4D50;
/// `mmp_seq` while e2fsck (or another e2fsprogs tool opened read-write) holds it.
pub const MMP_SEQ_FSCK: u32 = 0xE24D_4D50;
/// The largest sequence number a live node writes.
pub const MMP_SEQ_MAX: u32 = 0xE24D_4D4F;
/// s_mmp_update_interval when the superblock gives none (EXT4_MMP_UPDATE_INTERVAL).
pub const MMP_UPDATE_INTERVAL: u32 = 5;
/// The largest update interval e2fsprogs accepts (EXT4_MMP_MAX_UPDATE_INTERVAL).
pub const MMP_MAX_UPDATE_INTERVAL: u32 = 300;
/// The shortest check interval, in seconds, whatever the superblock says
/// (EXT4_MMP_MIN_CHECK_INTERVAL).
pub const MMP_MIN_CHECK_INTERVAL: u32 = 5;
/// The longest check interval a running node advertises (EXT4_MMP_MAX_CHECK_INTERVAL).
pub const MMP_MAX_CHECK_INTERVAL: u32 = 300;
/// A running node checks for other writers after this many update intervals at the latest
/// (EXT4_MMP_CHECK_MULT).
pub const MMP_CHECK_MULT: u32 = 2;

/// Byte offset of `mmp_checksum`: the checksum covers everything before it.
const CSUM_OFFSET: usize = 0x3FC;

/// The MMP block's defined bytes.
///
/// | offset | size | field |
/// |---|---|---|
/// | 0x00 | 4 | `mmp_magic` |
/// | 0x04 | 4 | `mmp_seq` |
/// | 0x08 | 8 | `mmp_time` (seconds since the epoch of the last update) |
/// | 0x10 | 64 | `mmp_nodename` (the updating host, NUL-padded) |
/// | 0x50 | 32 | `mmp_bdevname` (its device name, NUL-padded) |
/// | 0x70 | 2 | `mmp_check_interval` (seconds) |
/// | 0x72 | 2 | `mmp_pad1` |
/// | 0x74 | 904 | `mmp_pad2` |
/// | 0x3FC | 4 | `mmp_checksum` (crc32c from the checksum seed, with metadata_csum) |
#[derive(Clone, PartialEq, Eq)]
pub struct MmpBlock(pub Box<[u8; MMP_SIZE]>);

impl MmpBlock {
    /// From the first `MMP_SIZE` bytes of `b` (or all of a shorter `b`, zero-padded).
    pub fn from_bytes(b: &[u8]) -> Self {
        let mut raw = Box::new([0u8; MMP_SIZE]);
        let n = b.len().min(MMP_SIZE);
        raw[..n].copy_from_slice(&b[..n]);
        MmpBlock(raw)
    }
    /// The block's bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.0[..]
    }
    /// The block's bytes, to change.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0[..]
    }

    le_field!(magic, set_magic, u32, 0x00);
    le_field!(seq, set_seq, u32, 0x04);
    le_field!(time, set_time, u64, 0x08);
    le_field!(check_interval, set_check_interval, u16, 0x70);
    le_field!(checksum, set_checksum, u32, CSUM_OFFSET);

    /// `mmp_nodename`, up to its first NUL.
    pub fn nodename(&self) -> String {
        text(&self.0[0x10..0x50])
    }
    /// The raw `mmp_nodename` bytes (compared whole, as the kernel does).
    pub fn nodename_bytes(&self) -> &[u8] {
        &self.0[0x10..0x50]
    }
    /// Sets `mmp_nodename`: the host that holds the filesystem.
    pub fn set_nodename(&mut self, n: &str) {
        set_text(&mut self.0[0x10..0x50], n);
    }
    /// `mmp_bdevname`, up to its first NUL.
    pub fn bdevname(&self) -> String {
        text(&self.0[0x50..0x70])
    }
    /// Sets `mmp_bdevname`: the device it holds it on.
    pub fn set_bdevname(&mut self, n: &str) {
        set_text(&mut self.0[0x50..0x70], n);
    }

    /// crc32c of the bytes before `mmp_checksum`, from the filesystem's checksum seed.
    pub fn csum(&self, seed: u32) -> u32 {
        crc32c(seed, &self.0[..CSUM_OFFSET])
    }
    /// Whether the checksum matches (always, without metadata_csum: `seed` is `None`).
    pub fn verify_csum(&self, seed: Option<u32>) -> bool {
        seed.is_none_or(|s| self.csum(s) == self.checksum())
    }
    /// Stores the checksum (nothing without metadata_csum).
    pub fn set_csum(&mut self, seed: Option<u32>) {
        if let Some(s) = seed {
            let c = self.csum(s);
            self.set_checksum(c);
        }
    }
}

/// A NUL-padded name, lossily as UTF-8 up to its first NUL.
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Stores `n` NUL-padded, cut to leave at least one NUL (as snprintf would).
fn set_text(b: &mut [u8], n: &str) {
    b.fill(0);
    let n = n.as_bytes();
    let l = n.len().min(b.len() - 1);
    b[..l].copy_from_slice(&n[..l]);
}

#[cfg(test)]
mod tests;
