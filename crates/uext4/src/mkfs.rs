//! Making a new filesystem: our own mkfs, laid out the way `mke2fs -t ext4` of e2fsprogs 1.47
//! lays it out (the same geometry, the same placement of every structure), so that `dumpe2fs`
//! of the two differs only in times, UUIDs and hash seeds.
//!
//! Steps, as mke2fs takes them:
//! 1. geometry (as ext2fs_initialize): blocks per group, groups, inodes per group rounded to
//!    fill the inode table blocks, reserved GDT blocks so the filesystem can grow 1024-fold
//!    (resize_inode), and a last group too small for its own metadata dropped;
//! 2. superblock and descriptor-table copies in groups 0, 1 and powers of 3, 5 and 7
//!    (sparse_super), each followed by the reserved GDT blocks;
//! 3. bitmaps and inode tables: with flex_bg, the block bitmaps of 16 groups together, then
//!    their inode bitmaps, then their inode tables, at the first free blocks of the flex group
//!    (as ext2fs_allocate_group_table);
//! 4. the root directory (inode 2), lost+found (inode 11: 16 KiB, at least 2 blocks, at most 12
//!    blocks), the resize inode (7: a double-indirect map whose indirect blocks are the primary
//!    reserved GDT blocks, each listing its backups), the journal (inode 8, at the start of the
//!    group that mke2fs picks in the middle of the filesystem), and the orphan file (inode 12)
//!    when asked;
//! 5. descriptors with BLOCK_UNINIT / INODE_UNINIT / ITABLE_ZEROED and bg_itable_unused, bitmap
//!    checksums (none for uninitialised bitmaps, as mke2fs), descriptor checksums (crc32c with
//!    metadata_csum, crc16 with uninit_bg).

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::csum::crc32c;
use crate::format::extent::{Extent, ExtentHeader, EXTENT_MAGIC, MAX_INIT_LEN};
use crate::format::features::*;
use crate::format::group_desc::{
    GdCsum, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED,
};
use crate::format::inode::*;
use crate::format::superblock::*;
use crate::format::{put16, put32};

/// Which features to set. `Default` (and [`FeatureSet::ext4`]) is what `mke2fs -t ext4` of
/// e2fsprogs 1.47 sets: has_journal ext_attr resize_inode dir_index filetype extent 64bit
/// flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureSet {
    /// A journal (inode 8); also needs `MkfsOptions::journal_blocks` other than `Some(0)`.
    pub has_journal: bool,
    pub ext_attr: bool,
    /// Reserved GDT blocks and the resize inode (7), for online growth.
    pub resize_inode: bool,
    pub dir_index: bool,
    /// Always on (uext4 writes directory entries with file types).
    pub filetype: bool,
    /// Extent trees; without it, files map their blocks with indirect blocks (ext2/ext3).
    pub extents: bool,
    pub has_64bit: bool,
    /// flex_bg with 16 groups per flex group.
    pub flex_bg: bool,
    pub sparse_super: bool,
    pub large_file: bool,
    pub huge_file: bool,
    pub dir_nlink: bool,
    pub extra_isize: bool,
    pub metadata_csum: bool,
    /// gdt_csum (crc16 group descriptor checksums and uninitialised groups); used only without
    /// metadata_csum, which supersedes it.
    pub uninit_bg: bool,
    /// The checksum seed stored in the superblock (the UUID can then change).
    pub metadata_csum_seed: bool,
    /// An orphan file (inode 12) for the kernel's orphan list.
    pub orphan_file: bool,
}

impl Default for FeatureSet {
    fn default() -> Self {
        FeatureSet::ext4()
    }
}

/// Feature names `FeatureSet::apply` knows.
const FEATURE_NAMES: &str = "has_journal, ext_attr, resize_inode, dir_index, filetype, extent, \
     64bit, flex_bg, sparse_super, large_file, huge_file, dir_nlink, extra_isize, metadata_csum, \
     uninit_bg (gdt_csum), metadata_csum_seed, orphan_file";

impl FeatureSet {
    /// `mke2fs -t ext4` of e2fsprogs 1.47.
    pub fn ext4() -> Self {
        FeatureSet {
            has_journal: true,
            ext_attr: true,
            resize_inode: true,
            dir_index: true,
            filetype: true,
            extents: true,
            has_64bit: true,
            flex_bg: true,
            sparse_super: true,
            large_file: true,
            huge_file: true,
            dir_nlink: true,
            extra_isize: true,
            metadata_csum: true,
            uninit_bg: true,
            metadata_csum_seed: false,
            orphan_file: false,
        }
    }

    /// `mke2fs -t ext3`: the base features of mke2fs.conf and a journal; block maps.
    pub fn ext3() -> Self {
        FeatureSet {
            has_journal: true,
            extents: false,
            has_64bit: false,
            flex_bg: false,
            huge_file: false,
            dir_nlink: false,
            extra_isize: false,
            metadata_csum: false,
            uninit_bg: false,
            ..FeatureSet::ext4()
        }
    }

    /// `mke2fs -t ext2`: as ext3 without the journal.
    pub fn ext2() -> Self {
        FeatureSet {
            has_journal: false,
            ..FeatureSet::ext3()
        }
    }

    /// The preset for a filesystem type name (`mke2fs -t`).
    pub fn for_type(name: &str) -> Result<Self> {
        match name {
            "ext2" => Ok(FeatureSet::ext2()),
            "ext3" => Ok(FeatureSet::ext3()),
            "ext4" => Ok(FeatureSet::ext4()),
            _ => Err(Error::Unsupported(format!(
                "filesystem type {name:?} (uext4 mkfs makes ext2, ext3 and ext4)"
            ))),
        }
    }

    /// The name a filesystem with these features goes by: ext4 with any of ext4's own
    /// features, else ext3 with a journal, else ext2.
    pub fn type_name(&self) -> &'static str {
        if self.extents
            || self.flex_bg
            || self.has_64bit
            || self.huge_file
            || self.dir_nlink
            || self.extra_isize
            || self.metadata_csum
            || self.uninit_bg
            || self.orphan_file
        {
            "ext4"
        } else if self.has_journal {
            "ext3"
        } else {
            "ext2"
        }
    }

    /// Applies a mke2fs-style list: `feature` to set, `^feature` to clear.
    pub fn apply(&mut self, list: &str) -> Result<()> {
        for f in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match f.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, f),
            };
            let slot = match name {
                "has_journal" => &mut self.has_journal,
                "ext_attr" => &mut self.ext_attr,
                "resize_inode" => &mut self.resize_inode,
                "dir_index" => &mut self.dir_index,
                "filetype" => &mut self.filetype,
                "extent" | "extents" => &mut self.extents,
                "64bit" => &mut self.has_64bit,
                "flex_bg" => &mut self.flex_bg,
                "sparse_super" => &mut self.sparse_super,
                "large_file" => &mut self.large_file,
                "huge_file" => &mut self.huge_file,
                "dir_nlink" => &mut self.dir_nlink,
                "extra_isize" => &mut self.extra_isize,
                "metadata_csum" => &mut self.metadata_csum,
                "uninit_bg" | "gdt_csum" => &mut self.uninit_bg,
                "metadata_csum_seed" => &mut self.metadata_csum_seed,
                "orphan_file" => &mut self.orphan_file,
                _ => {
                    return Err(Error::Unsupported(format!(
                        "mkfs feature {f:?} (uext4 mkfs knows: {FEATURE_NAMES})"
                    )))
                }
            };
            *slot = on;
        }
        self.check()
    }

    /// Refuses combinations uext4 cannot make.
    pub fn check(&self) -> Result<()> {
        if !self.extents && self.has_64bit {
            return Err(Error::Invalid(
                "64bit needs the extent feature (block maps hold 32-bit block numbers)".into(),
            ));
        }
        if !self.filetype {
            return Err(Error::Unsupported(
                "mkfs without the filetype feature (uext4 writes typed directory entries)".into(),
            ));
        }
        if self.metadata_csum_seed && !self.metadata_csum {
            return Err(Error::Invalid(
                "metadata_csum_seed needs metadata_csum".into(),
            ));
        }
        if self.orphan_file && !self.has_journal {
            return Err(Error::Invalid("orphan_file needs has_journal".into()));
        }
        Ok(())
    }

    /// Group descriptors carry checksums (and groups may be left uninitialised).
    fn gd_csum(&self) -> bool {
        self.metadata_csum || self.uninit_bg
    }
}

#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Bytes; 0: the whole device.
    pub size: u64,
    /// 1024, 2048 or 4096.
    pub block_size: u32,
    /// Journal size in blocks: None for mke2fs's default for the size, Some(0) for no journal.
    pub journal_blocks: Option<u32>,
    /// Bytes per inode: 128, 256, ... up to the block size.
    pub inode_size: u16,
    /// Bytes of filesystem per inode.
    pub inode_ratio: u32,
    pub label: String,
    /// None: a random (version 4) UUID (mke2fs -U).
    pub uuid: Option<[u8; 16]>,
    /// The directory hash seed; None: random (mke2fs -E hash_seed=).
    pub hash_seed: Option<[u8; 16]>,
    /// The time to record as the creation time and on the first inodes (seconds since the
    /// epoch; SOURCE_DATE_EPOCH for reproducible builds); None: now.
    pub time: Option<i64>,
    /// How many inodes (mke2fs -N; rounded up to fill the groups' inode table blocks);
    /// None: one per `inode_ratio` bytes.
    pub inodes: Option<u64>,
    /// Per cent of the blocks reserved for the superuser (mke2fs -m).
    pub reserved_percent: f64,
    /// Owner of the root directory (mke2fs -E root_owner=UID:GID).
    pub root_owner: (u32, u32),
    pub features: FeatureSet,
    /// The device reads as zeros already (a new sparse file): skip zeroing inode tables, the
    /// journal and the backup reserved GDT blocks.
    pub assume_zeroed: bool,
}

impl MkfsOptions {
    /// Defaults like `mke2fs -t ext4 -b 4096 -i 16384` for a filesystem of `size` bytes (see
    /// `like_mke2fs` for mke2fs's own choice by size).
    pub fn default_for(size: u64) -> Self {
        MkfsOptions {
            size,
            block_size: 4096,
            journal_blocks: None,
            inode_size: 256,
            inode_ratio: 16384,
            label: String::new(),
            uuid: None,
            hash_seed: None,
            time: None,
            inodes: None,
            reserved_percent: 5.0,
            root_owner: (0, 0),
            features: FeatureSet::ext4(),
            assume_zeroed: false,
        }
    }

    /// What `mke2fs -t ext4` picks for `size` bytes by its usage type (mke2fs.conf): floppy
    /// below 3 MiB (1 KiB blocks, an inode per 8 KiB), small below 512 MiB (1 KiB blocks, an
    /// inode per 4 KiB), default below 4 TiB (4 KiB blocks, an inode per 16 KiB), big below
    /// 16 TiB (per 32 KiB), huge above (per 64 KiB). `block_size` overrides the type's.
    pub fn like_mke2fs(size: u64, block_size: Option<u32>) -> Self {
        const MIB: u64 = 1 << 20;
        let (bs, ratio) = match size {
            s if s < 3 * MIB => (1024, 8192),
            s if s < 512 * MIB => (1024, 4096),
            s if s < 4 << 40 => (4096, 16384),
            s if s < 16 << 40 => (4096, 32768),
            _ => (4096, 65536),
        };
        MkfsOptions {
            block_size: block_size.unwrap_or(bs),
            inode_ratio: ratio,
            ..MkfsOptions::default_for(size)
        }
    }
}

/// mke2fs's default journal size (in blocks) for a filesystem of `blocks` blocks
/// (ext2fs_default_journal_size); 0: too small for a journal.
pub fn default_journal_blocks(blocks: u64) -> u32 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    }
}

/// mke2fs's default orphan file size in blocks (ext2fs_default_orphan_file_blocks).
pub fn default_orphan_file_blocks(blocks: u64) -> u32 {
    if blocks < 128 * 1024 {
        32
    } else if blocks < 2 * 1024 * 1024 {
        (blocks / 4096) as u32
    } else {
        512
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut b).is_ok() {
            return b;
        }
    }
    // Fall back to time-derived bytes.
    let t = Timestamp::now();
    let mut x = (t.sec as u64) ^ ((t.nsec as u64) << 32) ^ 0x9E37_79B9_7F4A_7C15;
    for v in b.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = x as u8;
    }
    b
}

/// Whether `g` is 0, 1 or a power of 3, 5 or 7 (the groups sparse_super keeps copies in).
fn sparse_group(g: u32) -> bool {
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

/// Groups holding backups, in ext2fs_list_backups order (1, 3, 5, 7, 9, 25, 27, 49, ...).
fn backup_groups(groups: u32, sparse: bool) -> Vec<u32> {
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

/// A jbd2 v2 superblock for an empty internal journal of `maxlen` blocks (1024 bytes): the
/// journal module's [`JournalSuperblock::new_v2`](crate::journal::format::JournalSuperblock)
/// with the filesystem as its one user (s_users[0] = the UUID), checksummed (crc32c from ~0
/// over the superblock with the checksum zeroed) when `csum_v3`.
pub fn journal_superblock(
    block_size: u32,
    maxlen: u32,
    uuid: [u8; 16],
    csum_v3: bool,
    has_64bit: bool,
) -> Vec<u8> {
    use crate::journal::format::{put_be32, JournalSuperblock};
    let jsb = JournalSuperblock::new_v2(block_size, maxlen, uuid, csum_v3, has_64bit);
    let mut j = jsb.to_bytes();
    j[0x100..0x110].copy_from_slice(&uuid);
    if jsb.has_csum_v2or3() {
        put_be32(&mut j, 0xFC, 0);
        let c = crc32c(!0, &j);
        put_be32(&mut j, 0xFC, c);
    }
    j
}

/// The filesystem's shape, as ext2fs_initialize computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub blocks: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub groups: u32,
    pub inodes_per_group: u32,
    pub inode_table_blocks: u32,
    pub desc_size: u32,
    pub desc_blocks: u32,
    pub reserved_gdt_blocks: u32,
    /// The resize inode is made (even with no reserved GDT blocks, as mke2fs).
    pub resize_inode: bool,
    pub r_blocks: u64,
}

/// Computes the geometry mke2fs would for these options (without writing anything).
pub fn geometry(dev_size: u64, opts: &MkfsOptions) -> Result<Geometry> {
    let f = &opts.features;
    let bs = opts.block_size;
    if !matches!(bs, 1024 | 2048 | 4096) {
        return Err(Error::Invalid(format!(
            "block size {bs}: use 1024, 2048 or 4096"
        )));
    }
    let bs64 = bs as u64;
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
    let param_blocks = size / bs64;
    if !f.has_64bit && param_blocks > u32::MAX as u64 {
        return Err(Error::Invalid(format!(
            "{param_blocks} blocks need the 64bit feature"
        )));
    }
    if param_blocks >= 1 << 48 {
        return Err(Error::Invalid(format!("{param_blocks} blocks is too many")));
    }
    let fdb: u64 = (bs == 1024) as u64;
    let desc_size: u32 = if f.has_64bit { 64 } else { 32 };
    let descs_per_block = bs / desc_size;
    let apb = bs / 4;
    // mke2fs: inodes for the requested size (or as asked), and the reserved share (as
    // doubles, as mke2fs).
    if !(0.0..=50.0).contains(&opts.reserved_percent) {
        return Err(Error::Invalid(format!(
            "reserved blocks {}%: from 0 to 50",
            opts.reserved_percent
        )));
    }
    let mut inodes_count: u64 = opts
        .inodes
        .unwrap_or(param_blocks * bs64 / opts.inode_ratio as u64)
        .min(u32::MAX as u64);
    let param_r = (opts.reserved_percent * param_blocks as f64 / 100.0) as u64;
    let mut blocks = param_blocks;
    let mut r_blocks = param_r;
    let mut bpg = bs * 8;
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
            if bpg >= 256 {
                bpg -= 8;
                blocks = param_blocks;
                continue;
            }
            return Err(Error::Invalid(
                "too many inodes for the filesystem size".into(),
            ));
        }
        let mut ipg = (ipg_wanted as u32).min(65536 - bs / isz);
        let itb = loop {
            let mut itb = (ipg * isz).div_ceil(bs);
            let mut p = itb * bs / isz;
            p = p.max(8) & !7;
            itb = (p * isz).div_ceil(bs);
            if p as u64 * groups as u64 > u32::MAX as u64 {
                ipg -= 1;
                continue;
            }
            ipg = p;
            break itb;
        };
        inodes_count = ipg as u64 * groups as u64;
        let mut rsv = 0u32;
        let mut resize_inode = f.resize_inode;
        if f.resize_inode {
            let max_blocks: u64 = if blocks < 0xFFFF_FFFFu64 / 1024 {
                blocks * 1024
            } else {
                0xFFFF_FFFF
            };
            let rsv_groups = (max_blocks - fdb).div_ceil(bpg as u64);
            let want = rsv_groups.div_ceil(descs_per_block as u64) as i64 - desc_blocks as i64;
            // ext2fs computes this unsigned: a negative result wraps and is clamped.
            rsv = if want < 0 || want > apb as i64 {
                apb
            } else {
                want as u32
            };
        }
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
        return Ok(Geometry {
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
        });
    }
    Err(Error::Invalid(format!(
        "{size} bytes is too small for a filesystem"
    )))
}

/// The in-memory block bitmap of the whole filesystem while it is laid out, with the
/// allocation searches of libext2fs.
struct Blocks {
    bits: Vec<u64>,
    total: u64,
    fdb: u64,
    bpg: u64,
    /// Groups whose blocks were allocated into (their BLOCK_UNINIT flag goes).
    touched: Vec<bool>,
}

impl Blocks {
    fn test(&self, b: u64) -> bool {
        self.bits[(b / 64) as usize] & (1 << (b % 64)) != 0
    }
    fn set(&mut self, b: u64) {
        self.bits[(b / 64) as usize] |= 1 << (b % 64);
    }
    fn group_of(&self, b: u64) -> u32 {
        ((b.max(self.fdb) - self.fdb) / self.bpg) as u32
    }
    fn range_free(&self, start: u64, n: u64) -> bool {
        (start..start + n).all(|b| !self.test(b))
    }
    /// Marks a range used; `touch`: it counts as an allocation in its groups.
    fn mark(&mut self, start: u64, n: u64, touch: bool) {
        for b in start..start + n {
            self.set(b);
        }
        if touch && n > 0 {
            for g in self.group_of(start)..=self.group_of(start + n - 1) {
                self.touched[g as usize] = true;
            }
        }
    }
    /// ext2fs_get_free_blocks2: the first `num` free blocks starting in [start, finish).
    fn get_free(&self, start: u64, finish: u64, num: u64) -> Option<u64> {
        let mut b = if start == 0 { self.fdb } else { start };
        let finish = if finish == 0 { b } else { finish };
        let num = num.max(1);
        let mut steps = 0u64;
        loop {
            if b + num > self.total {
                if finish > start {
                    return None;
                }
                b = self.fdb;
            }
            if self.range_free(b, num) {
                return Some(b);
            }
            b += 1;
            steps += 1;
            if b == finish || steps > self.total {
                return None;
            }
        }
    }
    /// The first free block at or after `goal`, wrapping around (ext2fs_new_block2).
    fn new_block(&self, goal: u64) -> Option<u64> {
        let goal = if goal < self.fdb || goal >= self.total {
            self.fdb
        } else {
            goal
        };
        (goal..self.total)
            .chain(self.fdb..goal)
            .find(|&b| !self.test(b))
    }
    /// Allocates `n` blocks from `goal` on, in as few runs as the free space allows; returns
    /// the runs (each at most MAX_INIT_LEN long).
    fn alloc_runs(&mut self, goal: u64, n: u64) -> Option<Vec<(u64, u64)>> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut got = 0u64;
        let mut at = goal;
        while got < n {
            let start = self.new_block(at)?;
            let mut len = 0u64;
            while got + len < n
                && start + len < self.total
                && !self.test(start + len)
                && len < MAX_INIT_LEN as u64
            {
                len += 1;
            }
            self.mark(start, len, true);
            runs.push((start, len));
            got += len;
            at = start + len;
        }
        Some(runs)
    }
}

/// A file's block map (no extent feature) as mke2fs lays one out: data and indirect blocks
/// allocated in one pass from a goal, each indirect block just before the first data block
/// it maps (the order ext2fs_bmap allocates them in).
struct BlockMap {
    i_block: [u32; 15],
    /// The indirect blocks and their contents.
    nodes: Vec<(u64, Vec<u8>)>,
    /// The data blocks, as runs.
    runs: Vec<(u64, u64)>,
}

impl Blocks {
    /// The next free block after `cur`, taken; `cur` moves to it.
    fn take_next(&mut self, cur: &mut u64) -> Option<u64> {
        let b = self.new_block(*cur)?;
        self.mark(b, 1, true);
        *cur = b;
        Some(b)
    }

    /// Allocates `n` data blocks from `goal` on with the indirect blocks that map them (twelve
    /// direct pointers, then single, double and triple indirect blocks of `bs / 4` pointers).
    /// None when the space (or the triple indirect block's reach) runs out.
    fn alloc_block_mapped(&mut self, goal: u64, n: u64, bs: u32) -> Option<BlockMap> {
        let apb = bs as u64 / 4;
        let mut m = BlockMap {
            i_block: [0; 15],
            nodes: Vec::new(),
            runs: Vec::new(),
        };
        let mut cur = goal;
        // The indirect blocks being filled, top first (indices into `m.nodes`).
        let mut path: Vec<usize> = Vec::new();
        for l in 0..n {
            // Where block l's pointer goes: an i_block slot, then an index at each level.
            let (slot, idx): (usize, Vec<u64>) = match l.checked_sub(12) {
                None => (l as usize, vec![]),
                Some(r) if r < apb => (12, vec![r]),
                Some(r) if r - apb < apb * apb => {
                    let r = r - apb;
                    (13, vec![r / apb, r % apb])
                }
                Some(r) => {
                    let r = r - apb - apb * apb;
                    if r >= apb * apb * apb {
                        return None;
                    }
                    (14, vec![r / (apb * apb), r / apb % apb, r % apb])
                }
            };
            // An indirect block starts where every index from its level down is zero.
            for k in 0..idx.len() {
                if idx[k..].iter().all(|&i| i == 0) {
                    let b = self.take_next(&mut cur)?;
                    m.nodes.push((b, vec![0u8; bs as usize]));
                    match k.checked_sub(1) {
                        None => m.i_block[slot] = b as u32,
                        Some(up) => put32(&mut m.nodes[path[up]].1, 4 * idx[up] as usize, b as u32),
                    }
                    path.truncate(k);
                    path.push(m.nodes.len() - 1);
                }
            }
            let d = self.take_next(&mut cur)?;
            match idx.last() {
                None => m.i_block[slot] = d as u32,
                Some(&i) => put32(
                    &mut m.nodes[path[idx.len() - 1]].1,
                    4 * i as usize,
                    d as u32,
                ),
            }
            match m.runs.last_mut() {
                Some((s, len)) if *s + *len == d => *len += 1,
                _ => m.runs.push((d, 1)),
            }
        }
        Some(m)
    }
}

/// Offsets of fields the superblock module has no accessor for.
const SB_OVERHEAD_CLUSTERS: usize = 0x248;

/// Writes a new filesystem on `dev`.
pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
    let f = &opts.features;
    f.check()?;
    let geo = geometry(dev.size(), opts)?;
    let bs = geo.block_size;
    let bs64 = bs as u64;
    let blocks = geo.blocks;
    let fdb = geo.first_data_block;
    let bpg = geo.blocks_per_group;
    let groups = geo.groups;
    let ipg = geo.inodes_per_group;
    let itb = geo.inode_table_blocks;
    let isz = opts.inode_size as u64;
    let desc_size = geo.desc_size as usize;
    let gdtb = geo.desc_blocks;
    let rsv = geo.reserved_gdt_blocks;
    let gd_csum = f.gd_csum();
    let has_super = |g: u32| !f.sparse_super || sparse_group(g);
    let gfirst = |g: u32| fdb + g as u64 * bpg as u64;
    let glast = |g: u32| (gfirst(g) + bpg as u64 - 1).min(blocks - 1);

    let mut bm = Blocks {
        bits: vec![0u64; blocks.div_ceil(64) as usize],
        total: blocks,
        fdb,
        bpg: bpg as u64,
        touched: vec![false; groups as usize],
    };
    if fdb == 1 {
        bm.set(0);
    }
    // Superblock, descriptor table and reserved GDT copies.
    for g in 0..groups {
        if has_super(g) {
            bm.mark(gfirst(g), 1 + gdtb as u64 + rsv as u64, false);
        }
    }
    // The last group is never left BLOCK_UNINIT (its bitmap needs padding).
    bm.touched[groups as usize - 1] = true;

    // Bitmaps and inode tables (ext2fs_allocate_group_table).
    let flex: u32 = if f.flex_bg { 16 } else { 0 };
    let mut bb = vec![0u64; groups as usize];
    let mut ib = vec![0u64; groups as usize];
    let mut it = vec![0u64; groups as usize];
    let no_room = || Error::Invalid("filesystem too small for its metadata".into());
    // flexbg_offset: where the next table of a flex group goes.
    let flexbg_offset = |bm: &Blocks, group: u32, prev: u64, rem: u32, elem: u64| -> u64 {
        let size = (rem as u64 * elem).min(bpg as u64 / 4);
        if prev != 0 && prev < blocks {
            if let Some(b) = bm.get_free(prev, prev + size, elem) {
                return b;
            }
        }
        let first_g = group / flex * flex;
        let start = gfirst(first_g);
        let last_grp = (group | (flex - 1)).min(groups - 1);
        let last_blk = glast(last_grp);
        bm.get_free(start, last_blk, size)
            .or_else(|| bm.get_free(start, last_blk, elem))
            .or_else(|| bm.get_free(0, last_blk, elem))
            .unwrap_or(0)
    };
    for g in 0..groups {
        let group_blk = gfirst(g);
        let mut last_blk = glast(g);
        let mut start_blk = group_blk;
        let mut table_offset = 0u64;
        let mut rem = 1;
        if flex > 0 {
            let last_grp = (g | (flex - 1)).min(groups - 1);
            rem = last_grp - g + 1;
            // As mke2fs: the last flex group keeps its tables contiguous, except when it
            // has a single group.
            table_offset = match last_grp % flex {
                r if g % flex == 0 && last_grp == groups - 1 && r != 0 => r as u64 + 1,
                _ => flex as u64,
            };
            let prev = if g % flex != 0 {
                bb[g as usize - 1] + 1
            } else {
                0
            };
            start_blk = flexbg_offset(&bm, g, prev, rem, 1);
            last_blk = glast(last_grp);
        }
        let b = bm
            .get_free(start_blk, last_blk, 1)
            .or_else(|| bm.get_free(group_blk, last_blk, 1))
            .ok_or_else(no_room)?;
        bm.mark(b, 1, flex > 0);
        bb[g as usize] = b;

        if flex > 0 {
            let prev = if g % flex != 0 {
                ib[g as usize - 1] + 1
            } else {
                bb[g as usize] + table_offset
            };
            start_blk = flexbg_offset(&bm, g, prev, rem, 1);
        }
        let b = bm
            .get_free(start_blk, last_blk, 1)
            .or_else(|| bm.get_free(group_blk, last_blk, 1))
            .ok_or_else(no_room)?;
        bm.mark(b, 1, flex > 0);
        ib[g as usize] = b;

        let mut itable_start = group_blk;
        if flex > 0 {
            let prev = if g % flex != 0 {
                it[g as usize - 1] + itb as u64
            } else {
                ib[g as usize] + table_offset
            };
            itable_start = flexbg_offset(&bm, g, prev, rem, itb as u64);
        }
        let b = bm
            .get_free(itable_start, last_blk, itb as u64)
            .ok_or_else(no_room)?;
        bm.mark(b, itb as u64, flex > 0);
        it[g as usize] = b;
    }
    // Everything so far is fixed overhead.
    let mut overhead: u64 = (0..blocks).filter(|&b| bm.test(b)).count() as u64;

    // Inodes in use: the reserved ones, lost+found, and the orphan file.
    let orphan_ino: u32 = if f.orphan_file { 12 } else { 0 };
    let used_inodes: u32 = if f.orphan_file { 12 } else { 11 };
    if used_inodes > ipg {
        return Err(Error::Invalid("too few inodes per group".into()));
    }

    // Root directory, lost+found, resize inode (as mke2fs: in this order, first free blocks).
    let too_small = || {
        Error::Invalid(
            "filesystem too small for its metadata and journal; use a smaller journal".into(),
        )
    };
    let root_blk = bm.new_block(fdb).ok_or_else(too_small)?;
    bm.mark(root_blk, 1, true);
    let lpf_n: u64 = {
        let mut n = 1u64;
        while n < 12 && !(n * bs64 >= 16384 && n >= 2) {
            n += 1;
        }
        n
    };
    let mut lpf_blks = Vec::new();
    let mut goal = root_blk;
    for _ in 0..lpf_n {
        let b = bm.new_block(goal).ok_or_else(too_small)?;
        bm.mark(b, 1, true);
        lpf_blks.push(b);
        goal = b;
    }
    let backups = backup_groups(groups, f.sparse_super);
    let resize_dind = if geo.resize_inode {
        let goal = fdb + gdtb as u64 + rsv as u64 + 2 + itb as u64;
        let b = bm.new_block(goal).ok_or_else(too_small)?;
        bm.mark(b, 1, true);
        Some(b)
    } else {
        None
    };

    // Journal: at the start of a group in the middle of the filesystem.
    let jblocks: u64 = if f.has_journal {
        match opts.journal_blocks {
            Some(n) => n as u64,
            None => default_journal_blocks(blocks) as u64,
        }
    } else {
        0
    };
    if jblocks > 0 && jblocks < 1024 {
        return Err(Error::Invalid(format!(
            "journal of {jblocks} blocks: the least is 1024"
        )));
    }
    if jblocks > (1 << 30) / bs64 * 10 {
        return Err(Error::Invalid(format!(
            "journal of {jblocks} blocks: the most is 10 GiB"
        )));
    }
    let free_now = |bm: &Blocks, g: u32| -> u64 {
        (gfirst(g)..=glast(g)).filter(|&b| !bm.test(b)).count() as u64
    };
    let mut jmap = None;
    let jruns = if jblocks > 0 {
        let free_total = blocks - (0..blocks).filter(|&b| bm.test(b)).count() as u64;
        // mke2fs checks only a size it was given.
        if opts.journal_blocks.is_some() && jblocks > free_total / 2 {
            return Err(too_small());
        }
        let mut group = bm.group_of((blocks - fdb) / 2);
        let start;
        if flex > 0 && group > flex {
            group &= !(flex - 1);
            while group < groups && free_now(&bm, group) == 0 {
                group += 1;
            }
            if group == groups {
                group = 0;
            }
            start = group;
        } else {
            start = group.saturating_sub(1);
        }
        let end = if group + 1 < groups { group + 1 } else { group };
        let mut best = start;
        for g in start + 1..=end {
            if free_now(&bm, g) > free_now(&bm, best) {
                best = g;
            }
        }
        if f.extents {
            bm.alloc_runs(gfirst(best), jblocks).ok_or_else(too_small)?
        } else {
            // mke2fs maps it block by block from inode 8's group, the first.
            let map = bm
                .alloc_block_mapped(fdb, jblocks, bs)
                .ok_or_else(too_small)?;
            let runs = map.runs.clone();
            jmap = Some(map);
            runs
        }
    } else {
        Vec::new()
    };
    overhead += jblocks;

    let orphan_blocks: u64 = if f.orphan_file {
        default_orphan_file_blocks(blocks) as u64
    } else {
        0
    };
    let mut omap = None;
    let oruns = if orphan_blocks == 0 {
        Vec::new()
    } else if f.extents {
        bm.alloc_runs(fdb, orphan_blocks).ok_or_else(too_small)?
    } else {
        let map = bm
            .alloc_block_mapped(fdb, orphan_blocks, bs)
            .ok_or_else(too_small)?;
        let runs = map.runs.clone();
        omap = Some(map);
        runs
    };

    let uuid = opts.uuid.unwrap_or_else(|| {
        let mut u: [u8; 16] = random_bytes();
        u[6] = (u[6] & 0x0f) | 0x40;
        u[8] = (u[8] & 0x3f) | 0x80;
        u
    });
    let hash_seed: [u8; 16] = opts.hash_seed.unwrap_or_else(random_bytes);
    let now = match opts.time {
        Some(sec) => Timestamp { sec, nsec: 0 },
        None => Timestamp::now(),
    };

    // Superblock.
    let mut sb = Superblock::zeroed();
    sb.set_magic(EXT4_MAGIC);
    sb.set_rev_level(1);
    let flag = |on: bool, v: u32| if on { v } else { 0 };
    sb.set_feature_compat(
        flag(f.ext_attr, COMPAT_EXT_ATTR)
            | flag(f.dir_index, COMPAT_DIR_INDEX)
            | flag(jblocks > 0, COMPAT_HAS_JOURNAL)
            | flag(geo.resize_inode, COMPAT_RESIZE_INODE)
            | flag(f.orphan_file, COMPAT_ORPHAN_FILE),
    );
    sb.set_feature_incompat(
        INCOMPAT_FILETYPE
            | flag(f.extents, INCOMPAT_EXTENTS)
            | flag(f.has_64bit, INCOMPAT_64BIT)
            | flag(f.flex_bg, INCOMPAT_FLEX_BG)
            | flag(f.metadata_csum && f.metadata_csum_seed, INCOMPAT_CSUM_SEED),
    );
    sb.set_feature_ro_compat(
        flag(f.sparse_super, RO_COMPAT_SPARSE_SUPER)
            | flag(f.large_file || geo.resize_inode, RO_COMPAT_LARGE_FILE)
            | flag(f.huge_file, RO_COMPAT_HUGE_FILE)
            | flag(f.dir_nlink, RO_COMPAT_DIR_NLINK)
            | flag(f.extra_isize, RO_COMPAT_EXTRA_ISIZE)
            | if f.metadata_csum {
                RO_COMPAT_METADATA_CSUM
            } else {
                flag(f.uninit_bg, RO_COMPAT_GDT_CSUM)
            },
    );
    sb.set_inodes_count(groups * ipg);
    sb.set_blocks_count(blocks);
    sb.set_r_blocks_count(geo.r_blocks);
    sb.set_first_data_block(fdb as u32);
    let log = bs.trailing_zeros() - 10;
    sb.set_log_block_size(log);
    sb.set_log_cluster_size(log);
    sb.set_blocks_per_group(bpg);
    sb.set_clusters_per_group(bpg);
    sb.set_inodes_per_group(ipg);
    sb.set_mtime(0);
    sb.set_wtime(now.sec as u32);
    sb.set_mkfs_time(now.sec as u32);
    sb.set_lastcheck(now.sec as u32);
    sb.set_max_mnt_count(0xFFFF);
    sb.set_state(STATE_VALID);
    sb.set_errors(1);
    sb.set_first_ino(GOOD_OLD_FIRST_INO);
    sb.set_inode_size(opts.inode_size);
    sb.set_uuid(uuid);
    sb.set_volume_name(&opts.label);
    sb.set_reserved_gdt_blocks(rsv as u16);
    if f.has_64bit {
        sb.set_desc_size(64);
    }
    sb.set_def_hash_version(crate::htree::DX_HASH_HALF_MD4);
    let mut seed = [0u32; 4];
    for (i, s) in seed.iter_mut().enumerate() {
        *s = u32::from_le_bytes([
            hash_seed[4 * i],
            hash_seed[4 * i + 1],
            hash_seed[4 * i + 2],
            hash_seed[4 * i + 3],
        ]);
    }
    sb.set_hash_seed(seed);
    // mke2fs records how this platform's `char` hashes: signed on x86.
    sb.set_flags(if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
        FLAGS_SIGNED_HASH
    } else {
        FLAGS_UNSIGNED_HASH
    });
    sb.set_default_mount_opts(0x000C); // user_xattr, acl
                                       // mke2fs records the extra size whenever the inodes have room, feature or not.
    if isz > GOOD_OLD_INODE_SIZE as u64 {
        sb.set_min_extra_isize(EXTRA_ISIZE);
        sb.set_want_extra_isize(EXTRA_ISIZE);
    }
    if f.flex_bg {
        sb.set_log_groups_per_flex(4);
    }
    if f.metadata_csum {
        sb.set_checksum_type(CRC32C_CHKSUM);
        if f.metadata_csum_seed {
            sb.set_checksum_seed(crc32c(!0, &uuid));
        }
    }
    if jblocks > 0 {
        sb.set_journal_inum(JOURNAL_INO);
        sb.set_jnl_backup_type(1);
    }
    if f.orphan_file {
        sb.set_orphan_file_inum(orphan_ino);
    }
    put32(sb.bytes_mut(), SB_OVERHEAD_CLUSTERS, overhead as u32);
    let csum_seed = sb.csum_seed();
    let gd_kind = if f.metadata_csum {
        GdCsum::Crc32c { seed: csum_seed }
    } else if f.uninit_bg {
        GdCsum::Crc16 { uuid }
    } else {
        GdCsum::None
    };

    // Everything below writes; count it for s_kbytes_written.
    let written = std::cell::Cell::new(0u64);
    let put = |off: u64, data: &[u8]| -> Result<()> {
        dev.write_at(off, data)?;
        written.set(written.get() + data.len() as u64);
        Ok(())
    };
    let zero_range = |start_blk: u64, nblocks: u64| -> Result<()> {
        let zero = vec![0u8; (nblocks * bs64).min(1 << 20) as usize];
        let total = nblocks * bs64;
        let mut off = 0u64;
        while off < total {
            let n = (total - off).min(zero.len() as u64) as usize;
            dev.write_at(start_blk * bs64 + off, &zero[..n])?;
            off += n as u64;
        }
        Ok(())
    };

    if !opts.assume_zeroed {
        for &t in &it {
            zero_range(t, itb as u64)?;
        }
    }

    // Inodes.
    let write_inode = |ino: u32, raw: &mut RawInode| -> Result<()> {
        if f.metadata_csum {
            raw.set_csum(csum_seed, ino);
        }
        let g = (ino - 1) / ipg;
        let idx = ((ino - 1) % ipg) as u64;
        put(it[g as usize] * bs64 + idx * isz, &raw.0)
    };
    let new_inode = |mode: u16, links: u16| {
        let mut r = RawInode::new(isz as usize);
        r.set_mode(mode);
        r.set_links_count(links);
        r.set_atime(now);
        r.set_mtime(now);
        r.set_ctime(now);
        r.set_crtime(now);
        r
    };
    let inode_seed = |ino: u32| RawInode::csum_seed(csum_seed, ino, 0);
    // An extent tree over `runs`: in i_block if it fits, else one leaf block below it.
    let extent_tree =
        |bm: &mut Blocks, ino: u32, raw: &mut RawInode, runs: &[(u64, u64)]| -> Result<u64> {
            raw.set_flags(raw.flags() | FL_EXTENTS);
            let mut exts = Vec::new();
            let mut lblk = 0u64;
            for &(s, l) in runs {
                exts.push(Extent {
                    lblk: lblk as u32,
                    len: l as u32,
                    pblk: s,
                    unwritten: false,
                });
                lblk += l;
            }
            let root = raw.i_block_mut();
            root.fill(0);
            if exts.len() <= 4 {
                for (i, e) in exts.iter().enumerate() {
                    e.write(&mut root[12 + 12 * i..24 + 12 * i]);
                }
                ExtentHeader {
                    magic: EXTENT_MAGIC,
                    entries: exts.len() as u16,
                    max: 4,
                    depth: 0,
                    generation: 0,
                }
                .write(root);
                return Ok(0);
            }
            let max = (bs as usize - 12) / 12;
            if exts.len() > max {
                return Err(Error::Invalid(
                    "free space too fragmented for the journal".into(),
                ));
            }
            // As libext2fs: the leaf goes after the data it maps.
            let (ls, ll) = runs[runs.len() - 1];
            let leaf = bm.new_block(ls + ll).ok_or_else(too_small)?;
            bm.mark(leaf, 1, true);
            let mut b = vec![0u8; bs as usize];
            ExtentHeader {
                magic: EXTENT_MAGIC,
                entries: exts.len() as u16,
                max: max as u16,
                depth: 0,
                generation: 0,
            }
            .write(&mut b);
            for (i, e) in exts.iter().enumerate() {
                e.write(&mut b[12 + 12 * i..24 + 12 * i]);
            }
            let tail = 12 + 12 * max;
            if f.metadata_csum {
                let c = crc32c(inode_seed(ino), &b[..tail]);
                put32(&mut b, tail, c);
            }
            put(leaf * bs64, &b)?;
            ExtentHeader {
                magic: EXTENT_MAGIC,
                entries: 1,
                max: 4,
                depth: 1,
                generation: 0,
            }
            .write(root);
            // Index entry: ei_block 0, ei_leaf_lo, ei_leaf_hi.
            put32(root, 12, 0);
            put32(root, 16, leaf as u32);
            put16(root, 20, (leaf >> 32) as u16);
            Ok(1)
        };

    // Without the extent feature: the block map allocated with the data (journal, orphan
    // file), or direct pointers alone (the directories' twelve blocks at most).
    let block_map = |raw: &mut RawInode, runs: &[(u64, u64)], map: Option<&BlockMap>| {
        let root = raw.i_block_mut();
        root.fill(0);
        if let Some(m) = map {
            for (i, &p) in m.i_block.iter().enumerate() {
                put32(root, 4 * i, p);
            }
            for (blk, data) in &m.nodes {
                put(blk * bs64, data)?;
            }
            return Ok(m.nodes.len() as u64);
        }
        let blocks = runs.iter().flat_map(|&(s, l)| s..s + l);
        for (i, b) in blocks.enumerate() {
            if i >= 12 {
                return Err(Error::Invalid("directory of more than 12 blocks".into()));
            }
            put32(root, 4 * i, b as u32);
        }
        Ok(0)
    };
    let map_blocks = |bm: &mut Blocks,
                      ino: u32,
                      raw: &mut RawInode,
                      runs: &[(u64, u64)],
                      map: Option<&BlockMap>|
     -> Result<u64> {
        if f.extents {
            extent_tree(bm, ino, raw, runs)
        } else {
            block_map(raw, runs, map)
        }
    };

    for ino in 1..GOOD_OLD_FIRST_INO {
        if ino == ROOT_INO
            || (ino == JOURNAL_INO && jblocks > 0)
            || (ino == RESIZE_INO && geo.resize_inode)
        {
            continue;
        }
        let mut r = RawInode::new(isz as usize);
        if ino == 1 {
            // The bad blocks inode: empty, with times (ext2fs_update_bb_inode).
            r.set_atime(now);
            r.set_mtime(now);
            r.set_ctime(now);
        }
        write_inode(ino, &mut r)?;
    }
    let sectors = bs64 / 512;
    let mut root = new_inode(S_IFDIR | 0o755, 3);
    root.set_uid(opts.root_owner.0);
    root.set_gid(opts.root_owner.1);
    map_blocks(&mut bm, ROOT_INO, &mut root, &[(root_blk, 1)], None)?;
    root.set_size(bs64);
    root.set_blocks_512(sectors);
    write_inode(ROOT_INO, &mut root)?;
    let mut lpf = new_inode(S_IFDIR | 0o700, 2);
    let lpf_runs: Vec<(u64, u64)> = {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &b in &lpf_blks {
            match runs.last_mut() {
                Some((s, l)) if *s + *l == b => *l += 1,
                _ => runs.push((b, 1)),
            }
        }
        runs
    };
    let extra = map_blocks(&mut bm, GOOD_OLD_FIRST_INO, &mut lpf, &lpf_runs, None)?;
    lpf.set_size(lpf_n * bs64);
    lpf.set_blocks_512((lpf_n + extra) * sectors);
    write_inode(GOOD_OLD_FIRST_INO, &mut lpf)?;

    // Resize inode: i_block[13] (double indirect) -> the primary reserved GDT blocks -> their
    // backups (ext2fs_create_resize_inode).
    if let Some(dind) = resize_dind {
        let apb = (bs / 4) as u64;
        let mut r = new_inode(S_IFREG | 0o600, 1);
        let mut dbuf = vec![0u8; bs as usize];
        let mut nblocks = 1u64;
        let sb_blk = fdb;
        for k in 0..rsv as u64 {
            let grp_blk = sb_blk + 1 + gdtb as u64 + k;
            let slot = ((gdtb as u64 + k) % apb) as usize;
            put32(&mut dbuf, 4 * slot, grp_blk as u32);
            nblocks += 1;
            let mut ind = vec![0u8; bs as usize];
            for (i, &g) in backups.iter().enumerate().take(apb as usize) {
                put32(&mut ind, 4 * i, (grp_blk + g as u64 * bpg as u64) as u32);
                nblocks += 1;
            }
            put(grp_blk * bs64, &ind)?;
        }
        put(dind * bs64, &dbuf)?;
        put32(r.i_block_mut(), 4 * 13, dind as u32);
        r.set_size((apb * apb + apb + 12) * bs64);
        r.set_blocks_512(nblocks * sectors);
        write_inode(RESIZE_INO, &mut r)?;
        if !opts.assume_zeroed {
            for &g in &backups {
                zero_range(gfirst(g) + 1 + gdtb as u64, rsv as u64)?;
            }
        }
    }

    if jblocks > 0 {
        let mut j = new_inode(S_IFREG | 0o600, 1);
        let extra = map_blocks(&mut bm, JOURNAL_INO, &mut j, &jruns, jmap.as_ref())?;
        j.set_size(jblocks * bs64);
        j.set_blocks_512((jblocks + extra) * sectors);
        let mut ib60 = [0u8; 60];
        ib60.copy_from_slice(j.i_block());
        sb.set_jnl_blocks(&ib60, j.size_high(), j.size_lo());
        write_inode(JOURNAL_INO, &mut j)?;
        if !opts.assume_zeroed {
            for &(s, l) in &jruns {
                zero_range(s, l)?;
            }
        }
        let mut blk0 = vec![0u8; bs as usize];
        blk0[..1024].copy_from_slice(&journal_superblock(
            bs,
            jblocks as u32,
            uuid,
            f.metadata_csum,
            f.has_64bit,
        ));
        put(jruns[0].0 * bs64, &blk0)?;
    }

    if orphan_blocks > 0 {
        let mut o = new_inode(S_IFREG | 0o600, 1);
        let extra = map_blocks(&mut bm, orphan_ino, &mut o, &oruns, omap.as_ref())?;
        o.set_size(orphan_blocks * bs64);
        o.set_blocks_512((orphan_blocks + extra) * sectors);
        write_inode(orphan_ino, &mut o)?;
        let per_block = (bs as usize - 8) / 4;
        for &(s, l) in &oruns {
            for i in 0..l {
                let mut b = vec![0u8; bs as usize];
                put32(&mut b, bs as usize - 8, 0x0B10_CA04);
                if f.metadata_csum {
                    // Seeded with the physical block number, as the kernel.
                    let c = crc32c(inode_seed(orphan_ino), &(s + i).to_le_bytes());
                    let c = crc32c(c, &b[..per_block * 4]);
                    put32(&mut b, bs as usize - 4, c);
                }
                put((s + i) * bs64, &b)?;
            }
        }
    }

    // Directory blocks.
    let tail = if f.metadata_csum { 12 } else { 0 };
    let finish_leaf = |b: &mut [u8], ino: u32| {
        if f.metadata_csum {
            let t = b.len() - 12;
            put32(b, t, 0);
            put16(b, t + 4, 12);
            b[t + 6] = 0;
            b[t + 7] = 0xDE;
            let c = crc32c(inode_seed(ino), &b[..t]);
            put32(b, t + 8, c);
        }
    };
    let dirent = |b: &mut [u8], off: usize, ino: u32, rec: usize, name: &[u8], ft: u8| {
        put32(b, off, ino);
        put16(b, off + 4, rec as u16);
        b[off + 6] = name.len() as u8;
        b[off + 7] = ft;
        b[off + 8..off + 8 + name.len()].copy_from_slice(name);
    };
    let space = bs as usize - tail;
    let mut rb = vec![0u8; bs as usize];
    dirent(&mut rb, 0, ROOT_INO, 12, b".", 2);
    dirent(&mut rb, 12, ROOT_INO, 12, b"..", 2);
    dirent(
        &mut rb,
        24,
        GOOD_OLD_FIRST_INO,
        space - 24,
        b"lost+found",
        2,
    );
    finish_leaf(&mut rb, ROOT_INO);
    put(root_blk * bs64, &rb)?;
    for (i, &blk) in lpf_blks.iter().enumerate() {
        let mut b = vec![0u8; bs as usize];
        if i == 0 {
            dirent(&mut b, 0, GOOD_OLD_FIRST_INO, 12, b".", 2);
            dirent(&mut b, 12, ROOT_INO, space - 12, b"..", 2);
        } else {
            put16(&mut b, 4, space as u16);
        }
        finish_leaf(&mut b, GOOD_OLD_FIRST_INO);
        put(blk * bs64, &b)?;
    }

    // Bitmaps and descriptors.
    let mut descs = Vec::with_capacity(groups as usize);
    let mut free_total = 0u64;
    let mut free_inodes_total = 0u64;
    let own_tables = |g: u32, b: u64| {
        b == bb[g as usize]
            || b == ib[g as usize]
            || (it[g as usize]..it[g as usize] + itb as u64).contains(&b)
    };
    for g in 0..groups {
        let first = gfirst(g);
        let n = glast(g) - first + 1;
        let mut bmp = vec![0u8; bs as usize];
        let mut used_n = 0u64;
        // A group may stay BLOCK_UNINIT only if the kernel would rebuild its bitmap exactly:
        // its superblock copy, descriptors, reserved GDT and own tables.
        let mut plain = true;
        for i in 0..n {
            let b = first + i;
            if bm.test(b) {
                bmp[(i / 8) as usize] |= 1 << (i % 8);
                used_n += 1;
                let fixed = has_super(g) && i < 1 + gdtb as u64 + rsv as u64;
                if !fixed && !own_tables(g, b) {
                    plain = false;
                }
            }
        }
        if !plain {
            bm.touched[g as usize] = true;
        }
        for i in n as usize..bs as usize * 8 {
            bmp[i / 8] |= 1 << (i % 8);
        }
        let free = n - used_n;
        let block_uninit = gd_csum && !bm.touched[g as usize];
        put(bb[g as usize] * bs64, &bmp)?;

        let in_use = if g == 0 { used_inodes } else { 0 };
        let inode_uninit = gd_csum && in_use == 0;
        let mut ibmp = vec![0u8; bs as usize];
        for i in (0..in_use as usize).chain(ipg as usize..bs as usize * 8) {
            ibmp[i / 8] |= 1 << (i % 8);
        }
        put(ib[g as usize] * bs64, &ibmp)?;

        let mut d = GroupDesc::new(desc_size);
        d.set_block_bitmap(bb[g as usize]);
        d.set_inode_bitmap(ib[g as usize]);
        d.set_inode_table(it[g as usize]);
        d.set_free_blocks_count(free);
        d.set_free_inodes_count((ipg - in_use) as u64);
        d.set_used_dirs_count(if g == 0 { 2 } else { 0 });
        if gd_csum {
            d.set_itable_unused((ipg - in_use) as u64);
            let mut flags = BG_INODE_ZEROED;
            if block_uninit {
                flags |= BG_BLOCK_UNINIT;
            }
            if inode_uninit {
                flags |= BG_INODE_UNINIT;
            }
            d.set_flags(flags);
        }
        if f.metadata_csum {
            if !block_uninit {
                d.set_block_bitmap_csum(csum_seed, &bmp[..bpg as usize / 8]);
            }
            if !inode_uninit {
                d.set_inode_bitmap_csum(csum_seed, &ibmp[..ipg as usize / 8]);
            }
        }
        d.set_csum(gd_kind, g);
        free_total += free;
        free_inodes_total += (ipg - in_use) as u64;
        descs.push(d);
    }
    sb.set_free_blocks_count(free_total);
    sb.set_free_inodes_count(free_inodes_total as u32);
    let mut table = vec![0u8; gdtb as usize * bs as usize];
    for (g, d) in descs.iter().enumerate() {
        let off = g * desc_size;
        table[off..off + desc_size].copy_from_slice(d.as_bytes());
    }
    // Primary and backup superblocks and descriptor tables.
    let copies: Vec<u32> = (0..groups).filter(|&g| has_super(g)).collect();
    let kb = (written.get() + (copies.len() as u64) * (1024 + table.len() as u64)) / 1024;
    sb.set_kbytes_written(kb);
    for g in copies {
        let mut s = sb.clone();
        s.set_block_group_nr(g as u16);
        s.set_csum();
        if g == 0 {
            // Block 0's first 1024 bytes are the boot sector area.
            let mut b0 = vec![0u8; 2048];
            b0[1024..].copy_from_slice(s.bytes());
            put(0, &b0)?;
        } else {
            let mut b = vec![0u8; bs as usize];
            b[..1024].copy_from_slice(s.bytes());
            put(gfirst(g) * bs64, &b)?;
        }
        let gdt_at = if g == 0 { fdb + 1 } else { gfirst(g) + 1 };
        put(gdt_at * bs64, &table)?;
    }
    dev.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_groups_in_list_order() {
        assert_eq!(backup_groups(75, true), vec![1, 3, 5, 7, 9, 25, 27, 49]);
        assert_eq!(backup_groups(1, true), Vec::<u32>::new());
        assert_eq!(backup_groups(4, false), vec![1, 2, 3]);
        assert!(sparse_group(243) && sparse_group(343) && !sparse_group(16));
    }

    #[test]
    fn geometry_matches_mke2fs() {
        // mke2fs -t ext4 -b 1024 on 600 MiB: 614400 blocks, 75 groups, 512 inodes per group,
        // 128 inode table blocks, 5 descriptor blocks, 256 reserved GDT blocks, 30720 reserved.
        let mut o = MkfsOptions::default_for(600 << 20);
        o.block_size = 1024;
        let g = geometry(600 << 20, &o).unwrap();
        assert_eq!(
            (g.blocks, g.groups, g.inodes_per_group, g.inode_table_blocks),
            (614400, 75, 512, 128)
        );
        assert_eq!(
            (g.desc_blocks, g.reserved_gdt_blocks, g.r_blocks),
            (5, 256, 30720)
        );
        // Too small.
        assert!(geometry(32 << 10, &MkfsOptions::default_for(32 << 10)).is_err());
        // Bad options.
        let mut o = MkfsOptions::default_for(64 << 20);
        o.block_size = 512;
        assert!(geometry(64 << 20, &o).is_err());
        o.block_size = 4096;
        o.inode_size = 100;
        assert!(geometry(64 << 20, &o).is_err());
    }

    #[test]
    fn feature_lists() {
        let mut f = FeatureSet::ext4();
        f.apply("^metadata_csum,^resize_inode,orphan_file").unwrap();
        assert!(!f.metadata_csum && !f.resize_inode && f.orphan_file && f.uninit_bg);
        assert!(f.clone().apply("^extent").is_err(), "64bit needs extents");
        assert!(f.clone().apply("^extent,^64bit").is_ok());
        assert!(f.clone().apply("bigalloc").is_err());
        // The presets are mke2fs.conf's: ext3 is ext4 less its own features, ext2 that less
        // the journal.
        let mut ext3 = FeatureSet::ext4();
        ext3.apply(
            "^extent,^64bit,^flex_bg,^huge_file,^dir_nlink,^extra_isize,^metadata_csum,^uninit_bg",
        )
        .unwrap();
        assert_eq!(FeatureSet::for_type("ext3").unwrap(), ext3);
        assert_eq!(ext3.type_name(), "ext3");
        ext3.apply("^has_journal").unwrap();
        assert_eq!(FeatureSet::for_type("ext2").unwrap(), ext3);
        assert_eq!(ext3.type_name(), "ext2");
        assert_eq!(FeatureSet::for_type("ext4").unwrap().type_name(), "ext4");
        assert!(FeatureSet::for_type("xfs").is_err());
        assert!(FeatureSet::ext4()
            .apply("^has_journal,orphan_file")
            .is_err());
    }

    #[test]
    fn journal_superblock_checksum() {
        let j = journal_superblock(4096, 1024, [7; 16], true, true);
        assert_eq!(&j[0..4], &[0xC0, 0x3B, 0x39, 0x98]);
        let mut z = j.clone();
        z[0xFC..0x100].fill(0);
        assert_eq!(
            u32::from_be_bytes(j[0xFC..0x100].try_into().unwrap()),
            crc32c(!0, &z)
        );
        let p = crate::journal::format::JournalSuperblock::parse(&j).unwrap();
        assert_eq!(
            (p.block_size, p.maxlen, p.first, p.sequence, p.start),
            (4096, 1024, 1, 1, 0)
        );
        assert_eq!(
            (p.feature_incompat, p.checksum_type, p.nr_users),
            (0x12, 4, 1)
        );
        assert_eq!((p.uuid, &j[0x100..0x110]), ([7; 16], &[7u8; 16][..]));
        let plain = journal_superblock(1024, 2048, [9; 16], false, false);
        let p = crate::journal::format::JournalSuperblock::parse(&plain).unwrap();
        assert_eq!((p.feature_incompat, p.checksum_type), (0, 0));
    }

    #[test]
    fn memdevice_layout_is_consistent() {
        let dev = crate::blockdev::MemDevice::new(16 << 20);
        let mut o = MkfsOptions::default_for(0);
        o.block_size = 1024;
        o.uuid = Some([1; 16]);
        mkfs(&dev, &o).unwrap();
        let img = dev.to_vec();
        let sb = Superblock::from_bytes(&img[1024..2048]);
        assert_eq!(sb.magic(), EXT4_MAGIC);
        assert!(sb.verify_csum());
        assert_eq!(sb.blocks_count(), 16384);
        // As mke2fs: room for 1024 times the size.
        assert_eq!(sb.reserved_gdt_blocks(), 127);
        assert_eq!(sb.inodes_count(), 1024);
    }
}
