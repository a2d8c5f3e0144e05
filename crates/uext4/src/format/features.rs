//! Feature flags: which the engine implements, and their names for error messages.

/// The compatible feature flag `dir_prealloc` (`s_feature_compat`).
pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
/// The compatible feature flag `imagic_inodes` (`s_feature_compat`).
pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
/// The compatible feature flag `has_journal` (`s_feature_compat`).
pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
/// The compatible feature flag `ext_attr` (`s_feature_compat`).
pub const COMPAT_EXT_ATTR: u32 = 0x8;
/// The compatible feature flag `resize_inode` (`s_feature_compat`).
pub const COMPAT_RESIZE_INODE: u32 = 0x10;
/// The compatible feature flag `dir_index` (`s_feature_compat`).
pub const COMPAT_DIR_INDEX: u32 = 0x20;
/// The compatible feature flag `sparse_super2` (`s_feature_compat`).
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
/// The compatible feature flag `fast_commit` (`s_feature_compat`).
pub const COMPAT_FAST_COMMIT: u32 = 0x400;
/// The compatible feature flag `stable_inodes` (`s_feature_compat`).
pub const COMPAT_STABLE_INODES: u32 = 0x800;
/// The compatible feature flag `orphan_file` (`s_feature_compat`).
pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

/// The read-only compatible feature flag `sparse_super` (`s_feature_ro_compat`).
pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
/// The read-only compatible feature flag `large_file` (`s_feature_ro_compat`).
pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
/// The read-only compatible feature flag `btree_dir` (`s_feature_ro_compat`).
pub const RO_COMPAT_BTREE_DIR: u32 = 0x4;
/// The read-only compatible feature flag `huge_file` (`s_feature_ro_compat`).
pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
/// The read-only compatible feature flag `gdt_csum` (`s_feature_ro_compat`).
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
/// The read-only compatible feature flag `dir_nlink` (`s_feature_ro_compat`).
pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
/// The read-only compatible feature flag `extra_isize` (`s_feature_ro_compat`).
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
/// The read-only compatible feature flag `has_snapshot` (`s_feature_ro_compat`).
pub const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x80;
/// The read-only compatible feature flag `quota` (`s_feature_ro_compat`).
pub const RO_COMPAT_QUOTA: u32 = 0x100;
/// The read-only compatible feature flag `bigalloc` (`s_feature_ro_compat`).
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
/// The read-only compatible feature flag `metadata_csum` (`s_feature_ro_compat`).
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
/// The read-only compatible feature flag `replica` (`s_feature_ro_compat`).
pub const RO_COMPAT_REPLICA: u32 = 0x800;
/// The read-only compatible feature flag `readonly` (`s_feature_ro_compat`).
pub const RO_COMPAT_READONLY: u32 = 0x1000;
/// The read-only compatible feature flag `project` (`s_feature_ro_compat`).
pub const RO_COMPAT_PROJECT: u32 = 0x2000;
/// The read-only compatible feature flag `shared_blocks` (`s_feature_ro_compat`).
pub const RO_COMPAT_SHARED_BLOCKS: u32 = 0x4000;
/// The read-only compatible feature flag `verity` (`s_feature_ro_compat`).
pub const RO_COMPAT_VERITY: u32 = 0x8000;
/// The read-only compatible feature flag `orphan_present` (`s_feature_ro_compat`).
pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

/// The incompatible feature flag `compression` (`s_feature_incompat`).
pub const INCOMPAT_COMPRESSION: u32 = 0x1;
/// The incompatible feature flag `filetype` (`s_feature_incompat`).
pub const INCOMPAT_FILETYPE: u32 = 0x2;
/// The incompatible feature flag `recover` (`s_feature_incompat`).
pub const INCOMPAT_RECOVER: u32 = 0x4;
/// The incompatible feature flag `journal_dev` (`s_feature_incompat`).
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
/// The incompatible feature flag `meta_bg` (`s_feature_incompat`).
pub const INCOMPAT_META_BG: u32 = 0x10;
/// The incompatible feature flag `extents` (`s_feature_incompat`).
pub const INCOMPAT_EXTENTS: u32 = 0x40;
/// The incompatible feature flag `64bit` (`s_feature_incompat`).
pub const INCOMPAT_64BIT: u32 = 0x80;
/// The incompatible feature flag `mmp` (`s_feature_incompat`).
pub const INCOMPAT_MMP: u32 = 0x100;
/// The incompatible feature flag `flex_bg` (`s_feature_incompat`).
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
/// The incompatible feature flag `ea_inode` (`s_feature_incompat`).
pub const INCOMPAT_EA_INODE: u32 = 0x400;
/// The incompatible feature flag `dirdata` (`s_feature_incompat`).
pub const INCOMPAT_DIRDATA: u32 = 0x1000;
/// The incompatible feature flag `csum_seed` (`s_feature_incompat`).
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
/// The incompatible feature flag `largedir` (`s_feature_incompat`).
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
/// The incompatible feature flag `inline_data` (`s_feature_incompat`).
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
/// The incompatible feature flag `encrypt` (`s_feature_incompat`).
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
/// The incompatible feature flag `casefold` (`s_feature_incompat`).
pub const INCOMPAT_CASEFOLD: u32 = 0x20000;

/// Compat features: any is safe to open; these we also maintain.
pub const COMPAT_NAMES: &[(u32, &str)] = &[
    (COMPAT_DIR_PREALLOC, "dir_prealloc"),
    (COMPAT_IMAGIC_INODES, "imagic_inodes"),
    (COMPAT_HAS_JOURNAL, "has_journal"),
    (COMPAT_EXT_ATTR, "ext_attr"),
    (COMPAT_RESIZE_INODE, "resize_inode"),
    (COMPAT_DIR_INDEX, "dir_index"),
    (COMPAT_SPARSE_SUPER2, "sparse_super2"),
    (COMPAT_FAST_COMMIT, "fast_commit"),
    (COMPAT_STABLE_INODES, "stable_inodes"),
    (COMPAT_ORPHAN_FILE, "orphan_file"),
];

/// Read-only compatible feature flags with their names, as `dumpe2fs` prints them.
pub const RO_COMPAT_NAMES: &[(u32, &str)] = &[
    (RO_COMPAT_SPARSE_SUPER, "sparse_super"),
    (RO_COMPAT_LARGE_FILE, "large_file"),
    (RO_COMPAT_BTREE_DIR, "btree_dir"),
    (RO_COMPAT_HUGE_FILE, "huge_file"),
    (RO_COMPAT_GDT_CSUM, "uninit_bg"),
    (RO_COMPAT_DIR_NLINK, "dir_nlink"),
    (RO_COMPAT_EXTRA_ISIZE, "extra_isize"),
    (RO_COMPAT_HAS_SNAPSHOT, "snapshot"),
    (RO_COMPAT_QUOTA, "quota"),
    (RO_COMPAT_BIGALLOC, "bigalloc"),
    (RO_COMPAT_METADATA_CSUM, "metadata_csum"),
    (RO_COMPAT_REPLICA, "replica"),
    (RO_COMPAT_READONLY, "read-only"),
    (RO_COMPAT_PROJECT, "project"),
    (RO_COMPAT_SHARED_BLOCKS, "shared_blocks"),
    (RO_COMPAT_VERITY, "verity"),
    (RO_COMPAT_ORPHAN_PRESENT, "orphan_present"),
];

/// Incompatible feature flags with their names, as `dumpe2fs` prints them.
pub const INCOMPAT_NAMES: &[(u32, &str)] = &[
    (INCOMPAT_COMPRESSION, "compression"),
    (INCOMPAT_FILETYPE, "filetype"),
    (INCOMPAT_RECOVER, "needs_recovery"),
    (INCOMPAT_JOURNAL_DEV, "journal_dev"),
    (INCOMPAT_META_BG, "meta_bg"),
    (INCOMPAT_EXTENTS, "extent"),
    (INCOMPAT_64BIT, "64bit"),
    (INCOMPAT_MMP, "mmp"),
    (INCOMPAT_FLEX_BG, "flex_bg"),
    (INCOMPAT_EA_INODE, "ea_inode"),
    (INCOMPAT_DIRDATA, "dirdata"),
    (INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
    (INCOMPAT_LARGEDIR, "large_dir"),
    (INCOMPAT_INLINE_DATA, "inline_data"),
    (INCOMPAT_ENCRYPT, "encrypt"),
    (INCOMPAT_CASEFOLD, "casefold"),
];

/// Incompat features the engine reads and writes. Anything else: refuse to open.
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_FLEX_BG
    | INCOMPAT_META_BG
    | INCOMPAT_MMP
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_CASEFOLD
    | INCOMPAT_ENCRYPT
    | INCOMPAT_EA_INODE;

/// Ro-compat features the engine maintains when writing. Anything else: open read-only.
pub const RO_COMPAT_SUPPORTED: u32 = RO_COMPAT_SPARSE_SUPER
    | RO_COMPAT_LARGE_FILE
    | RO_COMPAT_HUGE_FILE
    | RO_COMPAT_GDT_CSUM
    | RO_COMPAT_DIR_NLINK
    | RO_COMPAT_EXTRA_ISIZE
    | RO_COMPAT_METADATA_CSUM
    | RO_COMPAT_ORPHAN_PRESENT
    | RO_COMPAT_VERITY
    | RO_COMPAT_QUOTA
    | RO_COMPAT_PROJECT
    | RO_COMPAT_BIGALLOC;

/// Names of the bits set in `flags`, with unknown bits as hex.
pub fn names(flags: u32, table: &[(u32, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    for bit in 0..32 {
        let m = 1u32 << bit;
        if flags & m == 0 {
            continue;
        }
        match table.iter().find(|(f, _)| *f == m) {
            Some((_, n)) => out.push((*n).to_string()),
            None => out.push(format!("unknown_{m:#x}")),
        }
    }
    out
}
