//! Feature flags: which the engine implements, and their names for error messages.

pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub const COMPAT_EXT_ATTR: u32 = 0x8;
pub const COMPAT_RESIZE_INODE: u32 = 0x10;
pub const COMPAT_DIR_INDEX: u32 = 0x20;
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
pub const COMPAT_FAST_COMMIT: u32 = 0x400;
pub const COMPAT_STABLE_INODES: u32 = 0x800;
pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
pub const RO_COMPAT_BTREE_DIR: u32 = 0x4;
pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
pub const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x80;
pub const RO_COMPAT_QUOTA: u32 = 0x100;
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
pub const RO_COMPAT_REPLICA: u32 = 0x800;
pub const RO_COMPAT_READONLY: u32 = 0x1000;
pub const RO_COMPAT_PROJECT: u32 = 0x2000;
pub const RO_COMPAT_SHARED_BLOCKS: u32 = 0x4000;
pub const RO_COMPAT_VERITY: u32 = 0x8000;
pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

pub const INCOMPAT_COMPRESSION: u32 = 0x1;
pub const INCOMPAT_FILETYPE: u32 = 0x2;
pub const INCOMPAT_RECOVER: u32 = 0x4;
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub const INCOMPAT_META_BG: u32 = 0x10;
pub const INCOMPAT_EXTENTS: u32 = 0x40;
pub const INCOMPAT_64BIT: u32 = 0x80;
pub const INCOMPAT_MMP: u32 = 0x100;
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
pub const INCOMPAT_EA_INODE: u32 = 0x400;
pub const INCOMPAT_DIRDATA: u32 = 0x1000;
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
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
    | INCOMPAT_LARGEDIR;

/// Ro-compat features the engine maintains when writing. Anything else: open read-only.
pub const RO_COMPAT_SUPPORTED: u32 = RO_COMPAT_SPARSE_SUPER
    | RO_COMPAT_LARGE_FILE
    | RO_COMPAT_HUGE_FILE
    | RO_COMPAT_GDT_CSUM
    | RO_COMPAT_DIR_NLINK
    | RO_COMPAT_EXTRA_ISIZE
    | RO_COMPAT_METADATA_CSUM
    | RO_COMPAT_ORPHAN_PRESENT;

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
