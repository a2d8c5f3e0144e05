//! The on-disk inode (Documentation/filesystems/ext4/inodes.rst): 128 bytes of base fields,
//! then i_extra_isize bytes of extra fields, then in-inode extended attributes up to
//! s_inode_size.

use super::csum::crc32c;
use super::le_field;

/// The root directory's inode number.
pub const ROOT_INO: u32 = 2;
/// The resize inode's number (reserved GDT blocks for online growth).
pub const RESIZE_INO: u32 = 7;
/// The journal inode's number.
pub const JOURNAL_INO: u32 = 8;
/// The first inode number not reserved, in revision 0 filesystems.
pub const GOOD_OLD_FIRST_INO: u32 = 11;
/// The size of an inode in revision 0 filesystems, and of every inode's fixed part.
pub const GOOD_OLD_INODE_SIZE: usize = 128;
/// i_extra_isize the kernel and mke2fs use: covers every extra field up to i_projid.
pub const EXTRA_ISIZE: u16 = 32;

/// The file type bits of a mode.
pub const S_IFMT: u16 = 0o170000;
/// File type in a mode: socket.
pub const S_IFSOCK: u16 = 0o140000;
/// File type in a mode: symbolic link.
pub const S_IFLNK: u16 = 0o120000;
/// File type in a mode: regular file.
pub const S_IFREG: u16 = 0o100000;
/// File type in a mode: block device.
pub const S_IFBLK: u16 = 0o060000;
/// File type in a mode: directory.
pub const S_IFDIR: u16 = 0o040000;
/// File type in a mode: character device.
pub const S_IFCHR: u16 = 0o020000;
/// File type in a mode: FIFO.
pub const S_IFIFO: u16 = 0o010000;

/// Inode flag `EXT4_SECRM_FL`.
pub const FL_SECRM: u32 = 0x1;
/// Inode flag `EXT4_IMMUTABLE_FL`.
pub const FL_IMMUTABLE: u32 = 0x10;
/// Inode flag `EXT4_APPEND_FL`.
pub const FL_APPEND: u32 = 0x20;
/// Inode flag `EXT4_INDEX_FL`.
pub const FL_INDEX: u32 = 0x1000;
/// Inode flag `EXT4_HUGE_FILE_FL`.
pub const FL_HUGE_FILE: u32 = 0x40000;
/// Inode flag `EXT4_EXTENTS_FL`.
pub const FL_EXTENTS: u32 = 0x80000;
/// Inode flag `EXT4_EA_INODE_FL`.
pub const FL_EA_INODE: u32 = 0x200000;
/// Inode flag `EXT4_INLINE_DATA_FL`.
pub const FL_INLINE_DATA: u32 = 0x1000_0000;

/// Size of i_block, the 60 bytes holding the extent root, block map or fast symlink.
pub const I_BLOCK_SIZE: usize = 60;

/// A whole on-disk inode, s_inode_size bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct RawInode(pub Vec<u8>);

impl std::fmt::Debug for RawInode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawInode(mode={:o} size={} links={})",
            self.mode(),
            self.size(),
            self.links_count()
        )
    }
}

/// A timestamp as the inode stores it: seconds (34 bits with the epoch extension) and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: u32,
}

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
    /// This time, or `limit` (whole seconds) if that is earlier: reproducible builds clamp
    /// every recorded time to SOURCE_DATE_EPOCH.
    pub fn at_most(self, limit: Option<i64>) -> Self {
        match limit {
            Some(l) if self.sec >= l => Timestamp { sec: l, nsec: 0 },
            _ => self,
        }
    }
    /// The time an inode can hold, as the kernel's timestamp_truncate makes it: with the
    /// extra fields (`extra`), seconds from -2^31 to 2^34 - 1 - 2^31 (year 2446); without, a
    /// signed 32-bit count of whole seconds (1901 to 2038). Past either end the time stops at
    /// the end, with no nanoseconds, instead of wrapping to a time far from it.
    pub fn clamped(self, extra: bool) -> Self {
        let (min, max) = if extra {
            (i32::MIN as i64, (1i64 << 34) - 1 + i32::MIN as i64)
        } else {
            (i32::MIN as i64, i32::MAX as i64)
        };
        let sec = self.sec.clamp(min, max);
        let nsec = if !extra || sec == min || sec == max {
            0
        } else {
            self.nsec.min(999_999_999)
        };
        Timestamp { sec, nsec }
    }
    /// Splits into (i_xtime, i_xtime_extra): low 32 bits of seconds, and nanoseconds << 2 |
    /// epoch bits (bits 32-33 of seconds).
    pub fn encode(self) -> (u32, u32) {
        let lo = self.sec as u32;
        let epoch = ((self.sec - (lo as i32 as i64)) >> 32) as u32 & 3;
        (lo, (self.nsec << 2) | epoch)
    }
    /// Decodes a time from its seconds field and, where the inode has one, its extra field.
    pub fn decode(lo: u32, extra: Option<u32>) -> Self {
        let base = lo as i32 as i64;
        match extra {
            None => Timestamp { sec: base, nsec: 0 },
            Some(x) => {
                let epoch = (x & 3) as i64;
                Timestamp {
                    sec: base + (epoch << 32),
                    nsec: (x >> 2).min(999_999_999),
                }
            }
        }
    }
}

impl RawInode {
    /// A zeroed inode of `inode_size` bytes.
    pub fn new(inode_size: usize) -> Self {
        let mut r = RawInode(vec![0; inode_size]);
        if inode_size > GOOD_OLD_INODE_SIZE {
            r.set_extra_isize(EXTRA_ISIZE);
        }
        r
    }
    /// The inode's on-disk bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
    /// The inode's on-disk bytes, to change.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    le_field!(mode, set_mode, u16, 0x0);
    le_field!(uid_lo, set_uid_lo, u16, 0x2);
    le_field!(size_lo, set_size_lo, u32, 0x4);
    le_field!(atime_lo, set_atime_lo, u32, 0x8);
    le_field!(ctime_lo, set_ctime_lo, u32, 0xC);
    le_field!(mtime_lo, set_mtime_lo, u32, 0x10);
    le_field!(dtime, set_dtime, u32, 0x14);
    le_field!(gid_lo, set_gid_lo, u16, 0x18);
    le_field!(links_count, set_links_count, u16, 0x1A);
    le_field!(blocks_lo, set_blocks_lo, u32, 0x1C);
    le_field!(flags, set_flags, u32, 0x20);
    le_field!(version_lo, set_version_lo, u32, 0x24);
    le_field!(generation, set_generation, u32, 0x64);
    le_field!(file_acl_lo, set_file_acl_lo, u32, 0x68);
    le_field!(size_high, set_size_high, u32, 0x6C);
    le_field!(blocks_high, set_blocks_high, u16, 0x74);
    le_field!(file_acl_high, set_file_acl_high, u16, 0x76);
    le_field!(uid_high, set_uid_high, u16, 0x78);
    le_field!(gid_high, set_gid_high, u16, 0x7A);
    le_field!(checksum_lo, set_checksum_lo, u16, 0x7C);
    le_field!(extra_isize_raw, set_extra_isize, u16, 0x80);
    le_field!(checksum_hi, set_checksum_hi, u16, 0x82);
    le_field!(ctime_extra, set_ctime_extra, u32, 0x84);
    le_field!(mtime_extra, set_mtime_extra, u32, 0x88);
    le_field!(atime_extra, set_atime_extra, u32, 0x8C);
    le_field!(crtime_lo, set_crtime_lo, u32, 0x90);
    le_field!(crtime_extra, set_crtime_extra, u32, 0x94);
    le_field!(version_hi, set_version_hi, u32, 0x98);
    le_field!(projid, set_projid, u32, 0x9C);

    /// i_extra_isize, or 0 for 128-byte inodes.
    pub fn extra_isize(&self) -> u16 {
        if self.0.len() > GOOD_OLD_INODE_SIZE {
            self.extra_isize_raw()
        } else {
            0
        }
    }
    /// Whether an extra field ending at byte `end` (from the inode's start) is present.
    fn fits(&self, end: usize) -> bool {
        GOOD_OLD_INODE_SIZE + self.extra_isize() as usize >= end
    }

    /// The file type bits of the mode (`S_IF*`).
    pub fn file_type(&self) -> u16 {
        self.mode() & S_IFMT
    }
    /// Whether the inode is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == S_IFDIR
    }
    /// Whether the inode is a regular file.
    pub fn is_reg(&self) -> bool {
        self.file_type() == S_IFREG
    }
    /// Whether the inode is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.file_type() == S_IFLNK
    }

    /// The owner (both halves).
    pub fn uid(&self) -> u32 {
        (self.uid_high() as u32) << 16 | self.uid_lo() as u32
    }
    /// Sets the owner (both halves).
    pub fn set_uid(&mut self, v: u32) {
        self.set_uid_lo(v as u16);
        self.set_uid_high((v >> 16) as u16);
    }
    /// The group (both halves).
    pub fn gid(&self) -> u32 {
        (self.gid_high() as u32) << 16 | self.gid_lo() as u32
    }
    /// Sets the group (both halves).
    pub fn set_gid(&mut self, v: u32) {
        self.set_gid_lo(v as u16);
        self.set_gid_high((v >> 16) as u16);
    }
    /// The size in bytes (both halves).
    pub fn size(&self) -> u64 {
        (self.size_high() as u64) << 32 | self.size_lo() as u64
    }
    /// Sets the size in bytes (both halves).
    pub fn set_size(&mut self, v: u64) {
        self.set_size_lo(v as u32);
        self.set_size_high((v >> 32) as u32);
    }
    /// The xattr block (both halves; 0 for none).
    pub fn file_acl(&self) -> u64 {
        (self.file_acl_high() as u64) << 32 | self.file_acl_lo() as u64
    }
    /// Sets the xattr block (both halves).
    pub fn set_file_acl(&mut self, v: u64) {
        self.set_file_acl_lo(v as u32);
        self.set_file_acl_high((v >> 32) as u16);
    }
    /// i_blocks in 512-byte sectors (the engine never sets EXT4_HUGE_FILE_FL; a file with it
    /// counts in filesystem blocks, handled here for reading).
    pub fn blocks_512(&self, block_size: u32) -> u64 {
        let raw = (self.blocks_high() as u64) << 32 | self.blocks_lo() as u64;
        if self.flags() & FL_HUGE_FILE != 0 {
            raw * (block_size as u64 / 512)
        } else {
            raw
        }
    }
    /// Sets the block count in 512-byte units (both halves).
    pub fn set_blocks_512(&mut self, v: u64) {
        let flags = self.flags() & !FL_HUGE_FILE;
        self.set_flags(flags);
        self.set_blocks_lo(v as u32);
        self.set_blocks_high((v >> 32) as u16);
    }

    /// The access time.
    pub fn atime(&self) -> Timestamp {
        Timestamp::decode(self.atime_lo(), self.fits(0x90).then(|| self.atime_extra()))
    }
    /// The modification time.
    pub fn mtime(&self) -> Timestamp {
        Timestamp::decode(self.mtime_lo(), self.fits(0x8C).then(|| self.mtime_extra()))
    }
    /// The change time.
    pub fn ctime(&self) -> Timestamp {
        Timestamp::decode(self.ctime_lo(), self.fits(0x88).then(|| self.ctime_extra()))
    }
    /// The creation time, where the inode has room for it.
    pub fn crtime(&self) -> Option<Timestamp> {
        self.fits(0x98)
            .then(|| Timestamp::decode(self.crtime_lo(), Some(self.crtime_extra())))
    }
    /// Sets the access time.
    pub fn set_atime(&mut self, t: Timestamp) {
        let (lo, x) = t.clamped(self.fits(0x90)).encode();
        self.set_atime_lo(lo);
        if self.fits(0x90) {
            self.set_atime_extra(x);
        }
    }
    /// Sets the modification time.
    pub fn set_mtime(&mut self, t: Timestamp) {
        let (lo, x) = t.clamped(self.fits(0x8C)).encode();
        self.set_mtime_lo(lo);
        if self.fits(0x8C) {
            self.set_mtime_extra(x);
        }
    }
    /// Sets the change time.
    pub fn set_ctime(&mut self, t: Timestamp) {
        let (lo, x) = t.clamped(self.fits(0x88)).encode();
        self.set_ctime_lo(lo);
        if self.fits(0x88) {
            self.set_ctime_extra(x);
        }
    }
    /// Sets the creation time, where the inode has room for it.
    pub fn set_crtime(&mut self, t: Timestamp) {
        if self.fits(0x98) {
            let (lo, x) = t.clamped(true).encode();
            self.set_crtime_lo(lo);
            self.set_crtime_extra(x);
        }
    }

    /// `i_block`: the extent tree's root, block map, inline data or fast symlink.
    pub fn i_block(&self) -> &[u8] {
        &self.0[0x28..0x28 + I_BLOCK_SIZE]
    }
    /// `i_block`, to change.
    pub fn i_block_mut(&mut self) -> &mut [u8] {
        &mut self.0[0x28..0x28 + I_BLOCK_SIZE]
    }

    /// Where in-inode extended attributes start (after the extra fields), if there is room.
    pub fn xattr_area(&self) -> Option<std::ops::Range<usize>> {
        let start = GOOD_OLD_INODE_SIZE + self.extra_isize() as usize;
        if self.0.len() > GOOD_OLD_INODE_SIZE && start + 4 <= self.0.len() {
            Some(start..self.0.len())
        } else {
            None
        }
    }

    /// The seed of the checksums of this inode's blocks (extent, directory, xattr-in-inode).
    pub fn csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
        let c = crc32c(fs_seed, &ino.to_le_bytes());
        crc32c(c, &generation.to_le_bytes())
    }

    /// crc32c of the inode with both checksum fields zeroed, seeded per inode.
    pub fn csum(&self, fs_seed: u32, ino: u32) -> u32 {
        let seed = Self::csum_seed(fs_seed, ino, self.generation());
        let mut copy = self.0.clone();
        copy[0x7C] = 0;
        copy[0x7D] = 0;
        if self.fits(0x84) {
            copy[0x82] = 0;
            copy[0x83] = 0;
        }
        crc32c(seed, &copy)
    }
    /// Whether the inode matches its stored checksum (metadata_csum).
    pub fn verify_csum(&self, fs_seed: u32, ino: u32) -> bool {
        let c = self.csum(fs_seed, ino);
        if self.fits(0x84) {
            self.checksum_lo() == c as u16 && self.checksum_hi() == (c >> 16) as u16
        } else {
            self.checksum_lo() == c as u16
        }
    }
    /// Stores the inode's checksum (metadata_csum).
    pub fn set_csum(&mut self, fs_seed: u32, ino: u32) {
        let c = self.csum(fs_seed, ino);
        self.set_checksum_lo(c as u16);
        if self.fits(0x84) {
            self.set_checksum_hi((c >> 16) as u16);
        }
    }
}

#[cfg(test)]
mod tests;
