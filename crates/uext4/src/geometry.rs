//! The filesystem's geometry: immutable facts computed once at open from the superblock.

use crate::error::{Corruption, Error, Result};
use crate::format::features::*;
use crate::format::group_desc::GdCsum;
use crate::format::superblock::*;

/// Immutable facts about the filesystem, computed once at open.
#[derive(Clone, Debug)]
pub struct Geometry {
    /// Block size in bytes.
    pub block_size: u32,
    /// log2 of the block size.
    pub log_block_size: u32,
    /// Blocks in the filesystem.
    pub blocks_count: u64,
    /// The first block of group 0 (1 for 1 KiB blocks, else 0).
    pub first_data_block: u64,
    /// Blocks per group.
    pub blocks_per_group: u32,
    /// Inodes per group.
    pub inodes_per_group: u32,
    /// Inodes in the filesystem.
    pub inodes_count: u32,
    /// Block groups.
    pub group_count: u32,
    /// Inode size in bytes.
    pub inode_size: u32,
    /// Group descriptor size in bytes.
    pub desc_size: u32,
    /// Group descriptors per block.
    pub descs_per_block: u32,
    /// Blocks of group descriptor table (not counting reserved GDT blocks).
    pub gdt_blocks: u32,
    /// Reserved GDT blocks after each descriptor table copy.
    pub reserved_gdt_blocks: u32,
    /// The first inode number not reserved.
    pub first_ino: u32,
    /// The metadata checksum seed.
    pub csum_seed: u32,
    /// metadata_csum is on.
    pub metadata_csum: bool,
    /// The group descriptor checksum in use.
    pub gd_csum: GdCsum,
    /// sparse_super is on.
    pub sparse_super: bool,
    /// sparse_super2: the only groups besides group 0 with superblock and GDT copies
    /// (s_backup_bgs; 0 names none).
    pub backup_bgs: Option<[u32; 2]>,
    /// meta_bg: the first descriptor block kept in its own meta group (s_first_meta_bg).
    /// Descriptor blocks before it sit after the superblock as without meta_bg; descriptor
    /// block `n` from it on sits in the first group of meta group `n` (the `descs_per_block`
    /// groups it describes), with copies in that meta group's second and last groups.
    pub first_meta_bg: Option<u32>,
    /// Groups per flex group (1 without flex_bg).
    pub flex_bg_size: u32,
    /// 64bit is on.
    pub has_64bit: bool,
    /// Directory entries hold file types.
    pub filetype: bool,
    /// dir_index is on (hashed directories).
    pub dir_index: bool,
    /// huge_file is on.
    pub huge_file: bool,
    /// dir_nlink is on (directories past 65000 links).
    pub dir_nlink: bool,
    /// extents is on.
    pub extents: bool,
    /// log2 of blocks per allocation cluster (bigalloc; 0 without it).
    pub cluster_bits: u32,
    /// The directory hash seed.
    pub hash_seed: [u32; 4],
    /// The default directory hash version.
    pub def_hash_version: u8,
    /// Directory hashes treat names as unsigned chars.
    pub unsigned_hash: bool,
    /// casefold is on: directories with the casefold flag compare names by their utf8-12.1
    /// folding (format/casefold.rs).
    pub casefold: bool,
    /// The `encrypt` feature: inodes may be encrypted with fscrypt (encrypt.rs).
    pub encrypt: bool,
    /// casefold's strict mode: names that are not valid UTF-8 are refused in casefolded
    /// directories.
    pub casefold_strict: bool,
    /// The filesystem UUID.
    pub uuid: [u8; 16],
    /// The quota inodes (user, group, project; 0: that type is not kept) with the `quota`
    /// feature; all 0 without it. Usage is kept in them as inodes change (quota.rs).
    pub quota_inums: [u32; 3],
}

impl Geometry {
    /// Blocks per allocation cluster (1 without bigalloc).
    pub fn cluster_ratio(&self) -> u32 {
        1 << self.cluster_bits
    }

    /// First block of group `g`.
    pub fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + g as u64 * self.blocks_per_group as u64
    }
    /// Number of blocks in group `g` (the last may be short).
    pub fn blocks_in_group(&self, g: u32) -> u32 {
        let first = self.group_first_block(g);
        (self.blocks_count - first).min(self.blocks_per_group as u64) as u32
    }
    /// Bits of group `g`'s block bitmap that stand for its blocks: one per cluster (the last
    /// may be partly past the end of the filesystem), one per block without bigalloc.
    pub fn clusters_in_group(&self, g: u32) -> usize {
        (self.blocks_in_group(g) as usize).div_ceil(self.cluster_ratio() as usize)
    }
    /// The block bitmap bit of block `blk` in its group `g` (its cluster's index there).
    pub fn bitmap_bit(&self, g: u32, blk: u64) -> usize {
        ((blk - self.group_first_block(g)) >> self.cluster_bits) as usize
    }
    /// The group holding block `blk`.
    pub fn block_group(&self, blk: u64) -> u32 {
        ((blk - self.first_data_block) / self.blocks_per_group as u64) as u32
    }
    /// Whether group `g` holds a superblock backup (and GDT copy).
    pub fn group_has_super(&self, g: u32) -> bool {
        if g == 0 {
            return true;
        }
        if let Some(bgs) = self.backup_bgs {
            return bgs.contains(&g);
        }
        !self.sparse_super || crate::format::superblock::sparse_group(g)
    }
    /// The block holding the primary superblock (byte 1024): 1 with 1 KiB blocks, else 0.
    /// It is the first data block, except with bigalloc, where group 0 starts at block 0.
    pub fn sb_block(&self) -> u64 {
        (self.block_size == 1024) as u64
    }
    /// Blocks at the start of group `g` used by the superblock, GDT and reserved GDT (as the
    /// kernel's ext4_num_base_meta_blocks counts them), and in group 0 any block before the
    /// superblock's.
    pub fn group_overhead(&self, g: u32) -> u32 {
        let sup = self.group_has_super(g) as u32;
        let before_sb = if g == 0 {
            (self.sb_block() - self.first_data_block) as u32
        } else {
            0
        };
        before_sb
            + match self.first_meta_bg {
                Some(first) if g / self.descs_per_block >= first => {
                    let i = g % self.descs_per_block;
                    sup + (i == 0 || i == 1 || i == self.descs_per_block - 1) as u32
                }
                Some(first) if sup == 1 => 1 + first + self.reserved_gdt_blocks,
                None if sup == 1 => 1 + self.gdt_blocks + self.reserved_gdt_blocks,
                _ => 0,
            }
    }
    /// Block holding the descriptor of group `g` in the primary table.
    pub fn gdt_block_of(&self, g: u32) -> u64 {
        let n = g / self.descs_per_block;
        match self.first_meta_bg {
            Some(first) if n >= first => {
                let meta_first = n * self.descs_per_block;
                self.group_first_block(meta_first) + self.group_has_super(meta_first) as u64
            }
            _ => self.sb_block() + 1 + n as u64,
        }
    }
    /// The group holding inode `ino`.
    pub fn ino_group(&self, ino: u32) -> u32 {
        (ino - 1) / self.inodes_per_group
    }
    /// Size in bytes of the part of a block bitmap that is checksummed.
    pub fn block_bitmap_csum_len(&self) -> usize {
        (self.blocks_per_group >> self.cluster_bits) as usize / 8
    }
    /// How many bytes of an inode bitmap its checksum covers.
    pub fn inode_bitmap_csum_len(&self) -> usize {
        self.inodes_per_group as usize / 8
    }
}

impl Geometry {
    /// The geometry a superblock describes, checked against itself and the device size.
    pub fn from_superblock(sb: &Superblock, dev_size: u64) -> Result<Geometry> {
        let bad = |m: String| {
            Err(Error::corrupt(
                Corruption::Superblock,
                format!("superblock: {m}"),
            ))
        };
        if sb.log_block_size() > 6 {
            return bad(format!(
                "block size 2^(10+{}) is out of range",
                sb.log_block_size()
            ));
        }
        let block_size = sb.block_size();
        let cluster_bits = crate::bigalloc::cluster_bits(sb)?;
        let blocks_count = sb.blocks_count();
        let bpg = sb.blocks_per_group();
        let ipg = sb.inodes_per_group();
        // The block bitmap has a bit per cluster: a group is at most a bitmap block's bits of
        // clusters.
        let cpg = bpg >> cluster_bits;
        if cpg == 0 || cpg > block_size * 8 || !cpg.is_multiple_of(8) {
            return bad(format!(
                "blocks per group {bpg} is invalid for block size {block_size}"
            ));
        }
        if cluster_bits > 0 && sb.clusters_per_group() != cpg {
            return bad(format!(
                "clusters per group {} is not blocks per group {bpg} / {} blocks a cluster",
                sb.clusters_per_group(),
                1u32 << cluster_bits
            ));
        }
        if ipg == 0 || ipg > block_size * 8 || !ipg.is_multiple_of(8) {
            return bad(format!(
                "inodes per group {ipg} is invalid for block size {block_size}"
            ));
        }
        let first_data_block = sb.first_data_block() as u64;
        // With bigalloc group 0 starts at block 0 whatever the block size (mke2fs).
        if first_data_block != (block_size == 1024 && cluster_bits == 0) as u64 {
            return bad(format!(
                "first data block {first_data_block} is wrong for block size {block_size}"
            ));
        }
        if blocks_count <= first_data_block {
            return bad(format!("block count {blocks_count} is too small"));
        }
        if blocks_count.saturating_mul(block_size as u64) > dev_size {
            return bad(format!(
                "block count {blocks_count} x {block_size} bytes is larger than the device ({dev_size} bytes)"
            ));
        }
        let group_count = (blocks_count - first_data_block).div_ceil(bpg as u64) as u32;
        if group_count as u64 * ipg as u64 != sb.inodes_count() as u64 {
            return bad(format!(
                "inode count {} is not groups ({group_count}) x inodes per group ({ipg})",
                sb.inodes_count()
            ));
        }
        let inode_size = sb.inode_size() as u32;
        if inode_size < 128 || inode_size > block_size || !inode_size.is_power_of_two() {
            return bad(format!("inode size {inode_size} is invalid"));
        }
        let desc_size = sb.desc_size() as u32;
        if sb.is_64bit() && (!(64..=1024).contains(&desc_size) || !desc_size.is_power_of_two()) {
            return bad(format!("group descriptor size {desc_size} is invalid"));
        }
        let descs_per_block = block_size / desc_size;
        let gdt_blocks = group_count.div_ceil(descs_per_block);
        let first_meta_bg = sb
            .has_incompat(INCOMPAT_META_BG)
            .then(|| sb.first_meta_bg());
        if first_meta_bg.is_some_and(|f| f > gdt_blocks) {
            return bad(format!(
                "first meta block group {} is past the {gdt_blocks} descriptor blocks",
                sb.first_meta_bg()
            ));
        }
        let flex = if sb.has_incompat(INCOMPAT_FLEX_BG) {
            if sb.log_groups_per_flex() > 31 {
                return bad(format!(
                    "log groups per flex {} is invalid",
                    sb.log_groups_per_flex()
                ));
            }
            1u32 << sb.log_groups_per_flex()
        } else {
            1
        };
        let gd_csum = if sb.has_metadata_csum() {
            GdCsum::Crc32c {
                seed: sb.csum_seed(),
            }
        } else if sb.has_gdt_csum() {
            GdCsum::Crc16 { uuid: sb.uuid() }
        } else {
            GdCsum::None
        };
        let first_ino = sb.first_ino_checked();
        if first_ino < 11 || first_ino > sb.inodes_count() {
            return bad(format!("first inode {first_ino} is invalid"));
        }
        Ok(Geometry {
            block_size,
            log_block_size: sb.log_block_size() + 10,
            blocks_count,
            first_data_block,
            blocks_per_group: bpg,
            inodes_per_group: ipg,
            inodes_count: sb.inodes_count(),
            group_count,
            inode_size,
            desc_size,
            descs_per_block,
            gdt_blocks,
            reserved_gdt_blocks: if sb.has_compat(COMPAT_RESIZE_INODE) {
                sb.reserved_gdt_blocks() as u32
            } else {
                0
            },
            first_ino,
            csum_seed: sb.csum_seed(),
            metadata_csum: sb.has_metadata_csum(),
            gd_csum,
            sparse_super: sb.has_ro_compat(RO_COMPAT_SPARSE_SUPER),
            backup_bgs: sb
                .has_compat(COMPAT_SPARSE_SUPER2)
                .then(|| [sb.backup_bg0(), sb.backup_bg1()]),
            first_meta_bg,
            flex_bg_size: flex,
            has_64bit: sb.is_64bit(),
            filetype: sb.has_incompat(INCOMPAT_FILETYPE),
            dir_index: sb.has_compat(COMPAT_DIR_INDEX),
            huge_file: sb.has_ro_compat(RO_COMPAT_HUGE_FILE),
            dir_nlink: sb.has_ro_compat(RO_COMPAT_DIR_NLINK),
            extents: sb.has_incompat(INCOMPAT_EXTENTS),
            cluster_bits,
            hash_seed: sb.hash_seed(),
            def_hash_version: sb.def_hash_version(),
            unsigned_hash: sb.flags() & FLAGS_UNSIGNED_HASH != 0,
            casefold: sb.has_incompat(INCOMPAT_CASEFOLD),
            encrypt: sb.has_incompat(INCOMPAT_ENCRYPT),
            casefold_strict: sb.has_incompat(INCOMPAT_CASEFOLD)
                && sb.encoding_flags() & ENCODING_FLAG_STRICT != 0,
            uuid: sb.uuid(),
            quota_inums: quota_inums(sb),
        })
    }
}

/// The quota inodes the superblock names, with the `quota` feature (else none).
fn quota_inums(sb: &Superblock) -> [u32; 3] {
    if sb.has_ro_compat(RO_COMPAT_QUOTA) {
        [
            sb.usr_quota_inum(),
            sb.grp_quota_inum(),
            sb.prj_quota_inum(),
        ]
    } else {
        [0; 3]
    }
}
