//! Step 1 of mkfs: the filesystem's shape from the options, as ext2fs_initialize: blocks per
//! group, groups, inodes per group rounded to fill the inode table blocks, reserved GDT blocks
//! so the filesystem can grow 1024-fold (resize_inode), and a last group too small for its own
//! metadata dropped. Also which groups hold superblock copies (sparse_super).

use super::MkfsOptions;
use crate::error::{Error, Result};
use crate::format::inode::GOOD_OLD_FIRST_INO;
use crate::format::superblock::sparse_group;

/// Groups holding backups, in ext2fs_list_backups order (1, 3, 5, 7, 9, 25, 27, 49, ...).
pub(super) fn backup_groups(groups: u32, sparse: bool) -> Vec<u32> {
    if !sparse {
        return (1..groups).collect();
    }
    let mut out = Vec::new();
    if groups > 1 {
        out.push(1);
    }
    let (mut three, mut five, mut seven) = (3u64, 5u64, 7u64);
    loop {
        let m = three.min(five).min(seven);
        if m >= groups as u64 {
            break;
        }
        out.push(m as u32);
        if m == three {
            three *= 3;
        } else if m == five {
            five *= 5;
        } else {
            seven *= 7;
        }
    }
    out
}

/// The plan of a new filesystem's shape, as ext2fs_initialize computes it from the options
/// (sizes and counts only; where each structure goes is decided while laying it out). The
/// engine's `Geometry` is the shape of an existing filesystem, read from its superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Block size in bytes.
    pub block_size: u32,
    /// Blocks in the filesystem.
    pub blocks: u64,
    /// The first block of group 0.
    pub first_data_block: u64,
    /// Blocks per group.
    pub blocks_per_group: u32,
    /// Block groups.
    pub groups: u32,
    /// Inodes per group.
    pub inodes_per_group: u32,
    /// Inode table blocks per group.
    pub inode_table_blocks: u32,
    /// Group descriptor size in bytes.
    pub desc_size: u32,
    /// Blocks of one group descriptor table copy.
    pub desc_blocks: u32,
    /// Reserved GDT blocks after each descriptor table copy.
    pub reserved_gdt_blocks: u32,
    /// The resize inode is made (even with no reserved GDT blocks, as mke2fs).
    pub resize_inode: bool,
    /// Blocks reserved for root.
    pub r_blocks: u64,
    /// Superblock copies only in groups 0, 1 and powers of 3, 5 and 7 (sparse_super).
    pub sparse_super: bool,
    /// log2 of blocks per cluster (bigalloc; 0 without it).
    pub cluster_bits: u32,
}

impl Layout {
    /// Whether group `g` holds a superblock copy (and descriptor table and reserved GDT).
    pub fn has_super(&self, g: u32) -> bool {
        !self.sparse_super || sparse_group(g)
    }

    /// The first block of group `g`.
    pub fn group_first(&self, g: u32) -> u64 {
        self.first_data_block + g as u64 * self.blocks_per_group as u64
    }

    /// The last block of group `g` (the last group may be short).
    pub fn group_last(&self, g: u32) -> u64 {
        (self.group_first(g) + self.blocks_per_group as u64 - 1).min(self.blocks - 1)
    }

    /// The block holding group `g`'s superblock copy: its first, except the primary
    /// superblock, at byte 1024, which is block 1 with 1 KiB blocks even where group 0 starts
    /// at block 0 (bigalloc).
    pub fn super_at(&self, g: u32) -> u64 {
        if g == 0 {
            (self.block_size == 1024) as u64
        } else {
            self.group_first(g)
        }
    }

    /// Blocks per cluster (1 without bigalloc).
    pub fn cluster_ratio(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Blocks of each superblock copy with its descriptor table and reserved GDT blocks.
    pub fn super_blocks(&self) -> u64 {
        1 + self.desc_blocks as u64 + self.reserved_gdt_blocks as u64
    }
}

/// Computes the layout mke2fs would for these options (without writing anything).
pub fn layout(dev_size: u64, opts: &MkfsOptions) -> Result<Layout> {
    let f = &opts.features;
    let (size, param_blocks) = checked_size(dev_size, opts)?;
    let bs = opts.block_size;
    let bs64 = bs as u64;
    let isz = opts.inode_size as u32;
    let cb = cluster_bits(opts)?;
    // With bigalloc group 0 starts at block 0 and the count is whole clusters
    // (ext2fs_initialize).
    let fdb: u64 = (bs == 1024 && cb == 0) as u64;
    // mke2fs counts inodes and reserved blocks on the size asked; ext2fs_initialize then
    // drops a partial cluster at the end.
    let inode_ratio = opts.inode_ratio as u64;
    let asked_blocks = param_blocks;
    let param_blocks = param_blocks >> cb << cb;
    let desc_size: u32 = if f.has_64bit { 64 } else { 32 };
    let descs_per_block = bs / desc_size;
    // mke2fs: inodes for the requested size (or as asked), and the reserved share (as
    // doubles, as mke2fs).
    let mut inodes_count: u64 = opts
        .inodes
        .unwrap_or(asked_blocks * bs64 / inode_ratio)
        .min(u32::MAX as u64);
    let param_r = (opts.reserved_percent * asked_blocks as f64 / 100.0) as u64;
    let mut blocks = param_blocks;
    let mut r_blocks = param_r;
    // With bigalloc a group is a bitmap block's bits of clusters.
    let mut bpg = (bs * 8) << cb;
    let has_super = |g: u32| !f.sparse_super || sparse_group(g);
    for _ in 0..64 {
        if blocks <= fdb {
            break;
        }
        let groups64 = (blocks - fdb).div_ceil(bpg as u64);
        if groups64 > u32::MAX as u64 {
            return Err(Error::Invalid("too many block groups".into()));
        }
        let groups = groups64 as u32;
        let desc_blocks = groups.div_ceil(descs_per_block);
        inodes_count = inodes_count.max(GOOD_OLD_FIRST_INO as u64 + 1);
        let ipg_wanted = inodes_count.div_ceil(groups as u64);
        if ipg_wanted > bs64 * 8 {
            if bpg >= 256 && cb == 0 {
                bpg -= 8;
                blocks = param_blocks;
                continue;
            }
            return Err(Error::Invalid(
                "too many inodes for the filesystem size".into(),
            ));
        }
        let (ipg, itb) = inode_table_size(ipg_wanted as u32, groups, isz, bs);
        inodes_count = ipg as u64 * groups as u64;
        let mut resize_inode = f.resize_inode;
        let mut rsv = if f.resize_inode {
            reserved_gdt_blocks(blocks, fdb, bpg, descs_per_block, desc_blocks, bs / 4)
        } else {
            0
        };
        if rsv + desc_blocks > bpg * 3 / 4 {
            if desc_blocks > bpg * 3 / 4 {
                return Err(Error::Unsupported(
                    "a filesystem this large needs meta_bg, which uext4 mkfs does not make".into(),
                ));
            }
            // mke2fs would switch to meta_bg; uext4 drops the reserved GDT blocks instead.
            rsv = 0;
            resize_inode = false;
        }
        if 3 + itb + rsv > bpg {
            return Err(Error::Invalid(
                "too many inodes per group (inode tables larger than a group)".into(),
            ));
        }
        let last = groups - 1;
        let mut overhead = 2 + itb as u64;
        if has_super(last) {
            overhead += 1 + desc_blocks as u64 + rsv as u64;
        }
        let rem = (blocks - fdb) % bpg as u64;
        if groups == 1 && rem != 0 && rem < overhead {
            return Err(Error::Invalid(format!(
                "{size} bytes is too small for a filesystem"
            )));
        }
        if rem != 0 && rem < overhead + 50 {
            let ratio = 100.0f64 * r_blocks as f64 / blocks as f64;
            blocks -= rem;
            r_blocks = (ratio * blocks as f64 / 100.0) as u64;
            continue;
        }
        return Ok(Layout {
            block_size: bs,
            blocks,
            first_data_block: fdb,
            blocks_per_group: bpg,
            groups,
            inodes_per_group: ipg,
            inode_table_blocks: itb,
            desc_size,
            desc_blocks,
            reserved_gdt_blocks: rsv,
            resize_inode,
            r_blocks,
            sparse_super: f.sparse_super,
            cluster_bits: cb,
        });
    }
    Err(Error::Invalid(format!(
        "{size} bytes is too small for a filesystem"
    )))
}

/// log2 of blocks per cluster: 0 without bigalloc, else from the cluster size asked (16
/// blocks by default, as mke2fs's profile).
fn cluster_bits(opts: &MkfsOptions) -> Result<u32> {
    if !opts.features.bigalloc {
        return Ok(0);
    }
    let bs = opts.block_size;
    let c = opts.cluster_size.unwrap_or(bs * 16);
    if !c.is_power_of_two() || c < bs || c > 1 << 30 {
        return Err(Error::Invalid(format!(
            "cluster size {c}: a power of two from the block size ({bs}) to 1 GiB"
        )));
    }
    let cb = (c / bs).trailing_zeros();
    if ((bs as u64 * 8) << cb) >= 1 << 32 {
        return Err(Error::Invalid(format!(
            "cluster size {c}: a group of {} clusters would hold 2^32 blocks or more",
            bs * 8
        )));
    }
    Ok(cb)
}

/// Checks the sizes asked for; returns the filesystem's size in bytes and in blocks.
fn checked_size(dev_size: u64, opts: &MkfsOptions) -> Result<(u64, u64)> {
    let bs = opts.block_size;
    if !matches!(bs, 1024 | 2048 | 4096) {
        return Err(Error::Invalid(format!(
            "block size {bs}: use 1024, 2048 or 4096"
        )));
    }
    let isz = opts.inode_size as u32;
    if isz < 128 || !isz.is_power_of_two() || isz > bs {
        return Err(Error::Invalid(format!(
            "inode size {isz}: a power of two from 128 to the block size"
        )));
    }
    if opts.inode_ratio < 1024 || opts.inode_ratio > 64 << 20 {
        return Err(Error::Invalid(format!(
            "inode ratio {}: from 1024 to 67108864 bytes per inode",
            opts.inode_ratio
        )));
    }
    let size = if opts.size == 0 { dev_size } else { opts.size };
    if size > dev_size {
        return Err(Error::Invalid(format!(
            "filesystem size {size} is larger than the device ({dev_size} bytes)"
        )));
    }
    let param_blocks = size / bs as u64;
    if !opts.features.has_64bit && param_blocks > u32::MAX as u64 {
        return Err(Error::Invalid(format!(
            "{param_blocks} blocks need the 64bit feature"
        )));
    }
    if param_blocks >= 1 << 48 {
        return Err(Error::Invalid(format!("{param_blocks} blocks is too many")));
    }
    if !(0.0..=50.0).contains(&opts.reserved_percent) {
        return Err(Error::Invalid(format!(
            "reserved blocks {}%: from 0 to 50",
            opts.reserved_percent
        )));
    }
    Ok((size, param_blocks))
}

/// Inodes per group (at least 8, a multiple of 8, filling whole inode table blocks) and the
/// inode table's blocks, from the inodes wanted per group.
fn inode_table_size(ipg_wanted: u32, groups: u32, isz: u32, bs: u32) -> (u32, u32) {
    let mut ipg = ipg_wanted.min(65536 - bs / isz);
    loop {
        let itb = (ipg * isz).div_ceil(bs);
        let p = (itb * bs / isz).max(8) & !7;
        let itb = (p * isz).div_ceil(bs);
        if p as u64 * groups as u64 > u32::MAX as u64 {
            ipg -= 1;
            continue;
        }
        return (p, itb);
    }
}

/// Reserved GDT blocks for growing the filesystem 1024-fold (at most `apb`, the pointers of
/// one indirect block), as ext2fs calc_reserved_gdt_blocks.
fn reserved_gdt_blocks(
    blocks: u64,
    fdb: u64,
    bpg: u32,
    descs_per_block: u32,
    desc_blocks: u32,
    apb: u32,
) -> u32 {
    let max_blocks: u64 = if blocks < 0xFFFF_FFFFu64 / 1024 {
        blocks * 1024
    } else {
        0xFFFF_FFFF
    };
    let rsv_groups = (max_blocks - fdb).div_ceil(bpg as u64);
    let want = rsv_groups.div_ceil(descs_per_block as u64) as i64 - desc_blocks as i64;
    // ext2fs computes this unsigned: a negative result wraps and is clamped.
    if want < 0 || want > apb as i64 {
        apb
    } else {
        want as u32
    }
}
