//! Block group descriptors (Documentation/filesystems/ext4/group_descr.rst): 32 bytes, or
//! s_desc_size (64) bytes with the 64bit feature.

use super::csum::{crc16, crc32c};
use super::le_field;

/// Group descriptor flag `EXT4_BG_INODE_UNINIT`.
pub const BG_INODE_UNINIT: u16 = 0x1;
/// Group descriptor flag `EXT4_BG_BLOCK_UNINIT`.
pub const BG_BLOCK_UNINIT: u16 = 0x2;
/// Group descriptor flag `EXT4_BG_INODE_ZEROED`.
pub const BG_INODE_ZEROED: u16 = 0x4;

/// One group descriptor, copied out of (and written back into) the descriptor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDesc {
    raw: [u8; 64],
    /// 32 or 64: how many of `raw`'s bytes are on disk.
    size: usize,
}

impl GroupDesc {
    /// A zeroed descriptor of `size` bytes on disk (32, or 64 with the 64bit feature).
    pub fn new(size: usize) -> Self {
        GroupDesc { raw: [0; 64], size }
    }
    /// A descriptor from its on-disk bytes.
    pub fn from_bytes(b: &[u8]) -> Self {
        let size = b.len().min(64);
        let mut raw = [0u8; 64];
        raw[..size].copy_from_slice(&b[..size]);
        GroupDesc { raw, size }
    }
    /// The descriptor's on-disk bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw[..self.size]
    }
    #[inline]
    fn bytes(&self) -> &[u8] {
        &self.raw[..]
    }
    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[..]
    }
    fn wide(&self) -> bool {
        self.size >= 64
    }

    le_field!(block_bitmap_lo, set_block_bitmap_lo, u32, 0x0);
    le_field!(inode_bitmap_lo, set_inode_bitmap_lo, u32, 0x4);
    le_field!(inode_table_lo, set_inode_table_lo, u32, 0x8);
    le_field!(free_blocks_count_lo, set_free_blocks_count_lo, u16, 0xC);
    le_field!(free_inodes_count_lo, set_free_inodes_count_lo, u16, 0xE);
    le_field!(used_dirs_count_lo, set_used_dirs_count_lo, u16, 0x10);
    le_field!(flags, set_flags, u16, 0x12);
    le_field!(block_bitmap_csum_lo, set_block_bitmap_csum_lo, u16, 0x18);
    le_field!(inode_bitmap_csum_lo, set_inode_bitmap_csum_lo, u16, 0x1A);
    le_field!(itable_unused_lo, set_itable_unused_lo, u16, 0x1C);
    le_field!(checksum, set_checksum, u16, 0x1E);
    le_field!(block_bitmap_hi, set_block_bitmap_hi, u32, 0x20);
    le_field!(inode_bitmap_hi, set_inode_bitmap_hi, u32, 0x24);
    le_field!(inode_table_hi, set_inode_table_hi, u32, 0x28);
    le_field!(free_blocks_count_hi, set_free_blocks_count_hi, u16, 0x2C);
    le_field!(free_inodes_count_hi, set_free_inodes_count_hi, u16, 0x2E);
    le_field!(used_dirs_count_hi, set_used_dirs_count_hi, u16, 0x30);
    le_field!(itable_unused_hi, set_itable_unused_hi, u16, 0x32);
    le_field!(block_bitmap_csum_hi, set_block_bitmap_csum_hi, u16, 0x38);
    le_field!(inode_bitmap_csum_hi, set_inode_bitmap_csum_hi, u16, 0x3A);
}

macro_rules! split_u32 {
    ($get:ident, $set:ident, $lo:ident, $set_lo:ident, $hi:ident, $set_hi:ident, $t:ty, $ht:ty) => {
        #[doc = concat!(
                    "`", stringify!($lo), "` and, with 64-bit descriptors, `", stringify!($hi), "`."
                )]
        pub fn $get(&self) -> u64 {
            let hi = if self.wide() { self.$hi() as u64 } else { 0 };
            (hi << (8 * std::mem::size_of::<$t>())) | self.$lo() as u64
        }
        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        pub fn $set(&mut self, v: u64) {
            self.$set_lo(v as $t);
            if self.wide() {
                self.$set_hi((v >> (8 * std::mem::size_of::<$t>())) as $ht);
            }
        }
    };
}

impl GroupDesc {
    split_u32!(
        block_bitmap,
        set_block_bitmap,
        block_bitmap_lo,
        set_block_bitmap_lo,
        block_bitmap_hi,
        set_block_bitmap_hi,
        u32,
        u32
    );
    split_u32!(
        inode_bitmap,
        set_inode_bitmap,
        inode_bitmap_lo,
        set_inode_bitmap_lo,
        inode_bitmap_hi,
        set_inode_bitmap_hi,
        u32,
        u32
    );
    split_u32!(
        inode_table,
        set_inode_table,
        inode_table_lo,
        set_inode_table_lo,
        inode_table_hi,
        set_inode_table_hi,
        u32,
        u32
    );
    split_u32!(
        free_blocks_count,
        set_free_blocks_count,
        free_blocks_count_lo,
        set_free_blocks_count_lo,
        free_blocks_count_hi,
        set_free_blocks_count_hi,
        u16,
        u16
    );
    split_u32!(
        free_inodes_count,
        set_free_inodes_count,
        free_inodes_count_lo,
        set_free_inodes_count_lo,
        free_inodes_count_hi,
        set_free_inodes_count_hi,
        u16,
        u16
    );
    split_u32!(
        used_dirs_count,
        set_used_dirs_count,
        used_dirs_count_lo,
        set_used_dirs_count_lo,
        used_dirs_count_hi,
        set_used_dirs_count_hi,
        u16,
        u16
    );
    split_u32!(
        itable_unused,
        set_itable_unused,
        itable_unused_lo,
        set_itable_unused_lo,
        itable_unused_hi,
        set_itable_unused_hi,
        u16,
        u16
    );

    /// Stores the checksum of a block bitmap (`bits` is the bitmap's first clusters_per_group/8 bytes).
    pub fn set_block_bitmap_csum(&mut self, seed: u32, bits: &[u8]) {
        let c = crc32c(seed, bits);
        self.set_block_bitmap_csum_lo(c as u16);
        if self.wide() {
            self.set_block_bitmap_csum_hi((c >> 16) as u16);
        }
    }
    /// Whether the block bitmap `bits` matches its stored checksum.
    pub fn verify_block_bitmap_csum(&self, seed: u32, bits: &[u8]) -> bool {
        let c = crc32c(seed, bits);
        let ok_lo = self.block_bitmap_csum_lo() == c as u16;
        ok_lo && (!self.wide() || self.block_bitmap_csum_hi() == (c >> 16) as u16)
    }
    /// Stores the checksum of the inode bitmap `bits`.
    pub fn set_inode_bitmap_csum(&mut self, seed: u32, bits: &[u8]) {
        let c = crc32c(seed, bits);
        self.set_inode_bitmap_csum_lo(c as u16);
        if self.wide() {
            self.set_inode_bitmap_csum_hi((c >> 16) as u16);
        }
    }
    /// Whether the inode bitmap `bits` matches its stored checksum.
    pub fn verify_inode_bitmap_csum(&self, seed: u32, bits: &[u8]) -> bool {
        let c = crc32c(seed, bits);
        let ok_lo = self.inode_bitmap_csum_lo() == c as u16;
        ok_lo && (!self.wide() || self.inode_bitmap_csum_hi() == (c >> 16) as u16)
    }

    /// metadata_csum: low 16 bits of crc32c(seed, group number, descriptor with checksum zeroed).
    /// gdt_csum: crc16 over uuid, group number and the descriptor without the checksum field.
    pub fn csum(&self, kind: GdCsum, group: u32) -> u16 {
        match kind {
            GdCsum::None => 0,
            GdCsum::Crc32c { seed } => {
                let mut d = self.raw;
                d[0x1E] = 0;
                d[0x1F] = 0;
                let c = crc32c(seed, &group.to_le_bytes());
                (crc32c(c, &d[..self.size]) & 0xFFFF) as u16
            }
            GdCsum::Crc16 { uuid } => {
                let mut c = crc16(!0, &uuid);
                c = crc16(c, &group.to_le_bytes());
                c = crc16(c, &self.raw[..0x1E]);
                if self.size > 0x20 {
                    c = crc16(c, &self.raw[0x20..self.size]);
                }
                c
            }
        }
    }
    /// Whether the descriptor matches its stored checksum, as group `group`.
    pub fn verify_csum(&self, kind: GdCsum, group: u32) -> bool {
        matches!(kind, GdCsum::None) || self.csum(kind, group) == self.checksum()
    }
    /// Stores the descriptor's checksum, as group `group`.
    pub fn set_csum(&mut self, kind: GdCsum, group: u32) {
        if !matches!(kind, GdCsum::None) {
            let c = self.csum(kind, group);
            self.set_checksum(c);
        }
    }
}

/// Which group descriptor checksum the filesystem uses.
#[derive(Clone, Copy, Debug)]
pub enum GdCsum {
    /// No checksum.
    None,
    /// crc32c (metadata_csum), seeded with the filesystem's checksum seed.
    Crc32c {
        /// The checksum seed.
        seed: u32,
    },
    /// crc16 (gdt_csum), over the filesystem's UUID.
    Crc16 {
        /// The filesystem's UUID.
        uuid: [u8; 16],
    },
}
