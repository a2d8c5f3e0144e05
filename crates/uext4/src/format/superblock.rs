//! The superblock: 1024 bytes at byte offset 1024 of the device (Documentation/filesystems/ext4/super.rst).

use super::csum::crc32c;
use super::features::*;
use super::le_field;

/// Byte offset of the primary superblock on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// Size of the superblock.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// `s_magic` of every ext2/3/4 superblock.
pub const EXT4_MAGIC: u16 = 0xEF53;

/// Superblock state flag: valid.
pub const STATE_VALID: u16 = 0x1;
/// Superblock state flag: error.
pub const STATE_ERROR: u16 = 0x2;
/// Superblock state flag: orphans.
pub const STATE_ORPHANS: u16 = 0x4;

/// `s_flags`: directory hashes treat names as signed chars.
pub const FLAGS_SIGNED_HASH: u32 = 0x1;
/// `s_flags`: directory hashes treat names as unsigned chars.
pub const FLAGS_UNSIGNED_HASH: u32 = 0x2;

/// `s_encoding` of UTF-8 at Unicode 12.1 (`EXT4_ENC_UTF8_12_1`), the only encoding defined.
pub const ENCODING_UTF8_12_1: u16 = 1;
/// `s_encoding_flags`: names that are not valid UTF-8 are refused in casefolded directories
/// (`EXT4_ENC_STRICT_MODE_FL`).
pub const ENCODING_FLAG_STRICT: u16 = 0x1;

/// `s_checksum_type` for crc32c, the only one defined.
pub const CRC32C_CHKSUM: u8 = 1;

/// Whether `g` is 0, 1 or a power of 3, 5 or 7: the groups that keep superblock and descriptor
/// table copies under sparse_super.
pub fn sparse_group(g: u32) -> bool {
    if g <= 1 {
        return true;
    }
    for base in [3u32, 5, 7] {
        let mut p = base;
        while p < g {
            p = match p.checked_mul(base) {
                Some(v) => v,
                None => break,
            };
        }
        if p == g {
            return true;
        }
    }
    false
}

/// The superblock's bytes, with accessors for its fields.
#[derive(Clone)]
pub struct Superblock(pub Box<[u8; SUPERBLOCK_SIZE]>);

impl Superblock {
    /// A superblock from its on-disk bytes (the first 1024 of `b`).
    pub fn from_bytes(b: &[u8]) -> Self {
        let mut raw = Box::new([0u8; SUPERBLOCK_SIZE]);
        raw.copy_from_slice(&b[..SUPERBLOCK_SIZE]);
        Superblock(raw)
    }
    /// A zeroed superblock.
    pub fn zeroed() -> Self {
        Superblock(Box::new([0u8; SUPERBLOCK_SIZE]))
    }
    /// The superblock's bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.0[..]
    }
    /// The superblock's bytes, to change.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0[..]
    }

    le_field!(inodes_count, set_inodes_count, u32, 0x0);
    le_field!(blocks_count_lo, set_blocks_count_lo, u32, 0x4);
    le_field!(r_blocks_count_lo, set_r_blocks_count_lo, u32, 0x8);
    le_field!(free_blocks_count_lo, set_free_blocks_count_lo, u32, 0xC);
    le_field!(free_inodes_count, set_free_inodes_count, u32, 0x10);
    le_field!(first_data_block, set_first_data_block, u32, 0x14);
    le_field!(log_block_size, set_log_block_size, u32, 0x18);
    le_field!(log_cluster_size, set_log_cluster_size, u32, 0x1C);
    le_field!(blocks_per_group, set_blocks_per_group, u32, 0x20);
    le_field!(clusters_per_group, set_clusters_per_group, u32, 0x24);
    le_field!(inodes_per_group, set_inodes_per_group, u32, 0x28);
    le_field!(mtime, set_mtime, u32, 0x2C);
    le_field!(wtime, set_wtime, u32, 0x30);
    le_field!(mnt_count, set_mnt_count, u16, 0x34);
    le_field!(max_mnt_count, set_max_mnt_count, u16, 0x36);
    le_field!(magic, set_magic, u16, 0x38);
    le_field!(state, set_state, u16, 0x3A);
    le_field!(errors, set_errors, u16, 0x3C);
    le_field!(minor_rev_level, set_minor_rev_level, u16, 0x3E);
    le_field!(lastcheck, set_lastcheck, u32, 0x40);
    le_field!(checkinterval, set_checkinterval, u32, 0x44);
    le_field!(creator_os, set_creator_os, u32, 0x48);
    le_field!(rev_level, set_rev_level, u32, 0x4C);
    le_field!(def_resuid, set_def_resuid, u16, 0x50);
    le_field!(def_resgid, set_def_resgid, u16, 0x52);
    le_field!(first_ino, set_first_ino, u32, 0x54);
    le_field!(inode_size_raw, set_inode_size, u16, 0x58);
    le_field!(block_group_nr, set_block_group_nr, u16, 0x5A);
    le_field!(feature_compat, set_feature_compat, u32, 0x5C);
    le_field!(feature_incompat, set_feature_incompat, u32, 0x60);
    le_field!(feature_ro_compat, set_feature_ro_compat, u32, 0x64);
    le_field!(
        algorithm_usage_bitmap,
        set_algorithm_usage_bitmap,
        u32,
        0xC8
    );
    le_field!(reserved_gdt_blocks, set_reserved_gdt_blocks, u16, 0xCE);
    le_field!(journal_inum, set_journal_inum, u32, 0xE0);
    le_field!(journal_dev, set_journal_dev, u32, 0xE4);
    le_field!(last_orphan, set_last_orphan, u32, 0xE8);
    le_field!(def_hash_version, set_def_hash_version, u8, 0xFC);
    le_field!(jnl_backup_type, set_jnl_backup_type, u8, 0xFD);
    le_field!(desc_size_raw, set_desc_size, u16, 0xFE);
    le_field!(default_mount_opts, set_default_mount_opts, u32, 0x100);
    le_field!(first_meta_bg, set_first_meta_bg, u32, 0x104);
    le_field!(mkfs_time, set_mkfs_time, u32, 0x108);
    le_field!(blocks_count_hi, set_blocks_count_hi, u32, 0x150);
    le_field!(r_blocks_count_hi, set_r_blocks_count_hi, u32, 0x154);
    le_field!(free_blocks_count_hi, set_free_blocks_count_hi, u32, 0x158);
    le_field!(min_extra_isize, set_min_extra_isize, u16, 0x15C);
    le_field!(want_extra_isize, set_want_extra_isize, u16, 0x15E);
    le_field!(flags, set_flags, u32, 0x160);
    le_field!(mmp_update_interval, set_mmp_update_interval, u16, 0x166);
    le_field!(mmp_block, set_mmp_block, u64, 0x168);
    le_field!(log_groups_per_flex, set_log_groups_per_flex, u8, 0x174);
    le_field!(checksum_type, set_checksum_type, u8, 0x175);
    le_field!(kbytes_written, set_kbytes_written, u64, 0x178);
    le_field!(error_count, set_error_count, u32, 0x194);
    le_field!(first_error_time, set_first_error_time, u32, 0x198);
    le_field!(first_error_ino, set_first_error_ino, u32, 0x19C);
    le_field!(first_error_block, set_first_error_block, u64, 0x1A0);
    le_field!(first_error_line, set_first_error_line, u32, 0x1C8);
    le_field!(last_error_time, set_last_error_time, u32, 0x1CC);
    le_field!(last_error_ino, set_last_error_ino, u32, 0x1D0);
    le_field!(last_error_line, set_last_error_line, u32, 0x1D4);
    le_field!(last_error_block, set_last_error_block, u64, 0x1D8);
    le_field!(usr_quota_inum, set_usr_quota_inum, u32, 0x240);
    le_field!(grp_quota_inum, set_grp_quota_inum, u32, 0x244);
    le_field!(overhead_clusters, set_overhead_clusters, u32, 0x248);
    le_field!(backup_bg0, set_backup_bg0, u32, 0x24C);
    le_field!(backup_bg1, set_backup_bg1, u32, 0x250);
    le_field!(lpf_ino, set_lpf_ino, u32, 0x268);
    le_field!(prj_quota_inum, set_prj_quota_inum, u32, 0x26C);
    le_field!(checksum_seed, set_checksum_seed, u32, 0x270);
    le_field!(first_error_errcode, set_first_error_errcode, u8, 0x27A);
    le_field!(last_error_errcode, set_last_error_errcode, u8, 0x27B);
    le_field!(
        /// `s_encoding`: the filename encoding of casefolded directories (`ENCODING_UTF8_12_1`).
        encoding, set_encoding, u16, 0x27C);
    le_field!(
        /// `s_encoding_flags`: `ENCODING_FLAG_STRICT` refuses names that are not valid UTF-8.
        encoding_flags, set_encoding_flags, u16, 0x27E);
    le_field!(orphan_file_inum, set_orphan_file_inum, u32, 0x280);
    le_field!(checksum, set_checksum, u32, 0x3FC);

    /// `s_uuid`.
    pub fn uuid(&self) -> [u8; 16] {
        self.0[0x68..0x78].try_into().unwrap()
    }
    /// Sets `s_uuid`.
    pub fn set_uuid(&mut self, u: [u8; 16]) {
        self.0[0x68..0x78].copy_from_slice(&u)
    }
    /// `s_volume_name`, up to its first NUL.
    pub fn volume_name(&self) -> String {
        let b = &self.0[0x78..0x88];
        let end = b.iter().position(|&c| c == 0).unwrap_or(16);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
    /// Sets `s_volume_name` (cut at 16 bytes).
    pub fn set_volume_name(&mut self, n: &str) {
        let b = &mut self.0[0x78..0x88];
        b.fill(0);
        let n = n.as_bytes();
        let l = n.len().min(16);
        b[..l].copy_from_slice(&n[..l]);
    }
    /// `s_journal_uuid`.
    pub fn journal_uuid(&self) -> [u8; 16] {
        self.0[0xD0..0xE0].try_into().unwrap()
    }
    /// `s_hash_seed`: the directory hash's seed.
    pub fn hash_seed(&self) -> [u32; 4] {
        let mut s = [0u32; 4];
        for (i, v) in s.iter_mut().enumerate() {
            *v = super::le32(&self.0[..], 0xEC + 4 * i);
        }
        s
    }
    /// Sets `s_hash_seed`.
    pub fn set_hash_seed(&mut self, s: [u32; 4]) {
        for (i, v) in s.iter().enumerate() {
            super::put32(&mut self.0[..], 0xEC + 4 * i, *v);
        }
    }
    /// s_jnl_blocks: a copy of the journal inode's i_block[] and size, for e2fsck.
    pub fn set_jnl_blocks(&mut self, i_block: &[u8; 60], size_hi: u32, size_lo: u32) {
        self.0[0x10C..0x10C + 60].copy_from_slice(i_block);
        super::put32(&mut self.0[..], 0x10C + 60, size_hi);
        super::put32(&mut self.0[..], 0x10C + 64, size_lo);
    }
    /// Sets `s_first_error_func` (`first`) or `s_last_error_func` (cut at 32 bytes).
    pub fn set_error_func(&mut self, first: bool, func: &str) {
        let off = if first { 0x1A8 } else { 0x1E0 };
        let b = &mut self.0[off..off + 32];
        b.fill(0);
        let n = func.as_bytes();
        let l = n.len().min(32);
        b[..l].copy_from_slice(&n[..l]);
    }

    // Combining accessors for split fields.
    /// The block count (both halves).
    pub fn blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() {
            self.blocks_count_hi() as u64
        } else {
            0
        };
        (hi << 32) | self.blocks_count_lo() as u64
    }
    /// Sets the block count (both halves).
    pub fn set_blocks_count(&mut self, v: u64) {
        self.set_blocks_count_lo(v as u32);
        if self.is_64bit() {
            self.set_blocks_count_hi((v >> 32) as u32);
        }
    }
    /// The reserved block count (both halves).
    pub fn r_blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() {
            self.r_blocks_count_hi() as u64
        } else {
            0
        };
        (hi << 32) | self.r_blocks_count_lo() as u64
    }
    /// Sets the reserved block count (both halves).
    pub fn set_r_blocks_count(&mut self, v: u64) {
        self.set_r_blocks_count_lo(v as u32);
        if self.is_64bit() {
            self.set_r_blocks_count_hi((v >> 32) as u32);
        }
    }
    /// The free block count (both halves).
    pub fn free_blocks_count(&self) -> u64 {
        let hi = if self.is_64bit() {
            self.free_blocks_count_hi() as u64
        } else {
            0
        };
        (hi << 32) | self.free_blocks_count_lo() as u64
    }
    /// Sets the free block count (both halves).
    pub fn set_free_blocks_count(&mut self, v: u64) {
        self.set_free_blocks_count_lo(v as u32);
        if self.is_64bit() {
            self.set_free_blocks_count_hi((v >> 32) as u32);
        }
    }

    /// The block size in bytes.
    pub fn block_size(&self) -> u32 {
        1024u32.checked_shl(self.log_block_size()).unwrap_or(0)
    }
    /// The inode size in bytes (128 in revision 0).
    pub fn inode_size(&self) -> u16 {
        if self.rev_level() == 0 {
            128
        } else {
            self.inode_size_raw()
        }
    }
    /// The group descriptor size in bytes (32 without the 64bit feature).
    pub fn desc_size(&self) -> u16 {
        if self.is_64bit() {
            self.desc_size_raw()
        } else {
            32
        }
    }
    /// The first inode number not reserved (11 in revision 0).
    pub fn first_ino_checked(&self) -> u32 {
        if self.rev_level() == 0 {
            11
        } else {
            self.first_ino()
        }
    }

    /// Whether a compatible feature flag (`COMPAT_*`) is set.
    pub fn has_compat(&self, f: u32) -> bool {
        self.feature_compat() & f != 0
    }
    /// Whether a read-only compatible feature flag (`RO_COMPAT_*`) is set.
    pub fn has_ro_compat(&self, f: u32) -> bool {
        self.feature_ro_compat() & f != 0
    }
    /// Whether an incompatible feature flag (`INCOMPAT_*`) is set.
    pub fn has_incompat(&self, f: u32) -> bool {
        self.feature_incompat() & f != 0
    }
    /// Whether the 64bit feature is set.
    pub fn is_64bit(&self) -> bool {
        self.has_incompat(INCOMPAT_64BIT)
    }
    /// Whether the metadata_csum feature is set.
    pub fn has_metadata_csum(&self) -> bool {
        self.has_ro_compat(RO_COMPAT_METADATA_CSUM)
    }
    /// Whether the gdt_csum feature is set.
    pub fn has_gdt_csum(&self) -> bool {
        self.has_ro_compat(RO_COMPAT_GDT_CSUM)
    }

    /// The seed every metadata checksum starts from.
    pub fn csum_seed(&self) -> u32 {
        if self.has_incompat(INCOMPAT_CSUM_SEED) {
            self.checksum_seed()
        } else {
            crc32c(!0, &self.uuid())
        }
    }

    /// crc32c over the bytes before s_checksum.
    pub fn csum(&self) -> u32 {
        crc32c(!0, &self.0[..0x3FC])
    }
    /// Whether the superblock matches its stored checksum.
    pub fn verify_csum(&self) -> bool {
        !self.has_metadata_csum() || self.csum() == self.checksum()
    }
    /// Stores the superblock's checksum.
    pub fn set_csum(&mut self) {
        if self.has_metadata_csum() {
            let c = self.csum();
            self.set_checksum(c);
        }
    }
}
