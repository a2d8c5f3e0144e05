//! What to make: the feature set (mke2fs -t and -O) and the sizes and identities (the rest of
//! mke2fs's command line), with mke2fs's defaults.

use crate::error::{Error, Result};

/// Which features to set. `Default` (and [`FeatureSet::ext4`]) is what `mke2fs -t ext4` of
/// e2fsprogs 1.47 sets: has_journal ext_attr resize_inode dir_index filetype extent 64bit
/// flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureSet {
    /// A journal (inode 8); also needs `MkfsOptions::journal_blocks` other than `Some(0)`.
    pub has_journal: bool,
    /// Extended attribute blocks.
    pub ext_attr: bool,
    /// Reserved GDT blocks and the resize inode (7), for online growth.
    pub resize_inode: bool,
    /// Hashed directory indexes.
    pub dir_index: bool,
    /// Always on (uext4 writes directory entries with file types).
    pub filetype: bool,
    /// Extent trees; without it, files map their blocks with indirect blocks (ext2/ext3).
    pub extents: bool,
    /// 64-bit block numbers and 64-byte group descriptors.
    pub has_64bit: bool,
    /// flex_bg with 16 groups per flex group.
    pub flex_bg: bool,
    /// Superblock copies only in some groups.
    pub sparse_super: bool,
    /// Files over 2 GiB.
    pub large_file: bool,
    /// Files over 2 TiB (block counts in filesystem blocks).
    pub huge_file: bool,
    /// Directories with more than 65000 subdirectories.
    pub dir_nlink: bool,
    /// Room for extra inode fields (nanosecond and creation times).
    pub extra_isize: bool,
    /// crc32c checksums on all metadata.
    pub metadata_csum: bool,
    /// gdt_csum (crc16 group descriptor checksums and uninitialised groups); used only without
    /// metadata_csum, which supersedes it.
    pub uninit_bg: bool,
    /// The checksum seed stored in the superblock (the UUID can then change).
    pub metadata_csum_seed: bool,
    /// An orphan file (inode 12) for the kernel's orphan list.
    pub orphan_file: bool,
    /// Casefolded directories possible (`chattr +F`), names folded with utf8-12.1.
    pub casefold: bool,
    /// With casefold: names that are not valid UTF-8 are refused in casefolded directories
    /// (mke2fs -E encoding_flags=strict).
    pub casefold_strict: bool,
    /// Encrypted directories possible (fscrypt policies, `uext4 fscrypt set-policy`).
    pub encrypt: bool,
    /// Inode numbers never change (no shrinking): what fscrypt's IV_INO_LBLK_* policies need.
    pub stable_inodes: bool,
    /// fs-verity files possible (`uext4 verity enable`, FS_IOC_ENABLE_VERITY).
    pub verity: bool,
    /// Small files and directories may keep their data in the inode (the kernel makes them
    /// so; mke2fs's own root and lost+found stay in blocks, as uext4 makes them).
    pub inline_data: bool,
    /// Attribute values too large for the inode and one block kept in inodes of their own
    /// (xattr_inode.rs).
    pub ea_inode: bool,
    /// Quota files kept in hidden inodes (3, 4 and a new one for projects), usage updated
    /// with every change (quota.rs).
    pub quota: bool,
    /// Project ids in the inodes (i_projid), for project quotas and PROJINHERIT.
    pub project: bool,
    /// With quota: which types get a file (user, group, project; mke2fs -E quotatype=).
    /// None: mke2fs's default, user and group, and project with the project feature.
    pub quota_types: Option<[bool; 3]>,
    /// A fast-commit area after the journal's log (`fast_commit_blocks` more journal blocks,
    /// s_num_fc_blks), for the kernel's fast commits on fsync; uext4 itself writes none.
    pub fast_commit: bool,
    /// Allocation in clusters of several blocks (`MkfsOptions::cluster_size`, mke2fs -C).
    pub bigalloc: bool,
}

impl Default for FeatureSet {
    fn default() -> Self {
        FeatureSet::ext4()
    }
}

/// Feature names `FeatureSet::apply` knows.
const FEATURE_NAMES: &str = "has_journal, ext_attr, resize_inode, dir_index, filetype, extent, \
     64bit, flex_bg, sparse_super, large_file, huge_file, dir_nlink, extra_isize, metadata_csum, \
     uninit_bg (gdt_csum), metadata_csum_seed, orphan_file, casefold, encrypt, stable_inodes, verity, inline_data, ea_inode, quota, project, fast_commit, bigalloc";

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
            casefold: false,
            casefold_strict: false,
            encrypt: false,
            stable_inodes: false,
            verity: false,
            inline_data: false,
            ea_inode: false,
            quota: false,
            project: false,
            quota_types: None,
            fast_commit: false,
            bigalloc: false,
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
            || self.casefold
            || self.encrypt
            || self.verity
            || self.inline_data
            || self.ea_inode
            || self.quota
            || self.project
            || self.bigalloc
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
                "casefold" => &mut self.casefold,
                "encrypt" => &mut self.encrypt,
                "stable_inodes" => &mut self.stable_inodes,
                "verity" => &mut self.verity,
                "inline_data" => &mut self.inline_data,
                "ea_inode" => &mut self.ea_inode,
                "quota" => &mut self.quota,
                "project" => &mut self.project,
                "fast_commit" => &mut self.fast_commit,
                "bigalloc" => &mut self.bigalloc,
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
        if self.fast_commit && !self.has_journal {
            return Err(Error::Invalid("fast_commit needs has_journal".into()));
        }
        if self.orphan_file && !self.has_journal {
            return Err(Error::Invalid("orphan_file needs has_journal".into()));
        }
        if self.quota_kinds()[2] && !self.project {
            return Err(Error::Invalid(
                "project quotas need the project feature (-O project)".into(),
            ));
        }
        if self.bigalloc && !self.extents {
            return Err(Error::Invalid(
                "bigalloc needs the extent feature (as mke2fs)".into(),
            ));
        }
        if self.inline_data && !self.ext_attr {
            // Inline data past i_block lives in the "system.data" attribute.
            return Err(Error::Invalid("inline_data needs ext_attr".into()));
        }
        Ok(())
    }

    /// Which quota files mkfs makes (user, group, project): none without quota.
    pub fn quota_kinds(&self) -> [bool; 3] {
        match (self.quota, self.quota_types) {
            (false, _) => [false; 3],
            (true, Some(t)) => t,
            (true, None) => [true, true, self.project],
        }
    }

    /// Group descriptors carry checksums (and groups may be left uninitialised).
    pub(super) fn gd_csum(&self) -> bool {
        self.metadata_csum || self.uninit_bg
    }
}

/// Everything `mkfs` needs to know: the size, the shape and the features (see
/// [`MkfsOptions::like_mke2fs`] for mke2fs's defaults).
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
    /// The volume label (up to 16 bytes).
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
    /// The features.
    pub features: FeatureSet,
    /// With bigalloc: bytes per cluster, a power of two from the block size to 1 GiB
    /// (mke2fs -C); None: 16 blocks, mke2fs's default. Ignored without bigalloc.
    pub cluster_size: Option<u32>,
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
            cluster_size: None,
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

/// The fast-commit area's blocks with fast_commit, as ext2fs_get_journal_params sets
/// them: a 64th of the default journal for the size (even when the journal's size is given).
pub fn fast_commit_blocks(blocks: u64) -> u32 {
    default_journal_blocks(blocks) / 64
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
