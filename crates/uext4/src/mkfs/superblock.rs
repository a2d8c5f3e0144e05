//! Step 4 and the last step of mkfs: the filesystem's identity (UUID, hash seed, time), the
//! superblock that describes it, and its copies (with the descriptor table) in group 0 and in
//! the groups sparse_super keeps them in. Also the journal's own superblock.

use super::layout::Layout;
use super::tables::FLEX_GROUPS;
use super::writer::Maker;
use super::MkfsOptions;
use crate::error::Result;
use crate::format::csum::crc32c;
use crate::format::features::*;
use crate::format::htree::DX_HASH_HALF_MD4;
use crate::format::inode::{
    Timestamp, EXTRA_ISIZE, GOOD_OLD_FIRST_INO, GOOD_OLD_INODE_SIZE, JOURNAL_INO,
};
use crate::format::superblock::*;

/// Who the new filesystem is: as asked, or random, and when it was made.
pub(super) struct Identity {
    pub uuid: [u8; 16],
    pub hash_seed: [u8; 16],
    pub now: Timestamp,
}

impl Identity {
    pub(super) fn new(opts: &MkfsOptions) -> Self {
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
        Identity {
            uuid,
            hash_seed,
            now,
        }
    }
}

/// The superblock of the new filesystem before its free counts and its copies' group
/// numbers: `jblocks` of journal, `overhead` blocks of fixed metadata.
pub(super) fn build_superblock(
    l: &Layout,
    opts: &MkfsOptions,
    id: &Identity,
    jblocks: u64,
    overhead: u64,
) -> Superblock {
    let f = &opts.features;
    let mut sb = Superblock::zeroed();
    sb.set_magic(EXT4_MAGIC);
    sb.set_rev_level(1);
    let flag = |on: bool, v: u32| if on { v } else { 0 };
    sb.set_feature_compat(
        flag(f.ext_attr, COMPAT_EXT_ATTR)
            | flag(f.dir_index, COMPAT_DIR_INDEX)
            | flag(jblocks > 0, COMPAT_HAS_JOURNAL)
            | flag(l.resize_inode, COMPAT_RESIZE_INODE)
            | flag(f.orphan_file, COMPAT_ORPHAN_FILE)
            | flag(f.fast_commit, COMPAT_FAST_COMMIT)
            | flag(f.stable_inodes, COMPAT_STABLE_INODES),
    );
    sb.set_feature_incompat(
        INCOMPAT_FILETYPE
            | flag(f.extents, INCOMPAT_EXTENTS)
            | flag(f.has_64bit, INCOMPAT_64BIT)
            | flag(f.flex_bg, INCOMPAT_FLEX_BG)
            | flag(f.metadata_csum && f.metadata_csum_seed, INCOMPAT_CSUM_SEED)
            | flag(f.casefold, INCOMPAT_CASEFOLD)
            | flag(f.encrypt, INCOMPAT_ENCRYPT)
            | flag(f.inline_data, INCOMPAT_INLINE_DATA)
            | flag(f.ea_inode, INCOMPAT_EA_INODE),
    );
    if f.casefold {
        sb.set_encoding(ENCODING_UTF8_12_1);
        sb.set_encoding_flags(if f.casefold_strict {
            ENCODING_FLAG_STRICT
        } else {
            0
        });
    }
    sb.set_feature_ro_compat(
        flag(f.sparse_super, RO_COMPAT_SPARSE_SUPER)
            | flag(f.large_file || l.resize_inode, RO_COMPAT_LARGE_FILE)
            | flag(f.huge_file, RO_COMPAT_HUGE_FILE)
            | flag(f.dir_nlink, RO_COMPAT_DIR_NLINK)
            | flag(f.extra_isize, RO_COMPAT_EXTRA_ISIZE)
            | flag(f.verity, RO_COMPAT_VERITY)
            | flag(f.quota, RO_COMPAT_QUOTA)
            | flag(f.project, RO_COMPAT_PROJECT)
            | flag(f.bigalloc, RO_COMPAT_BIGALLOC)
            | if f.metadata_csum {
                RO_COMPAT_METADATA_CSUM
            } else {
                flag(f.uninit_bg, RO_COMPAT_GDT_CSUM)
            },
    );
    sb.set_inodes_count(l.groups * l.inodes_per_group);
    sb.set_blocks_count(l.blocks);
    sb.set_r_blocks_count(l.r_blocks);
    sb.set_first_data_block(l.first_data_block as u32);
    let log = l.block_size.trailing_zeros() - 10;
    sb.set_log_block_size(log);
    sb.set_log_cluster_size(log + l.cluster_bits);
    sb.set_blocks_per_group(l.blocks_per_group);
    sb.set_clusters_per_group(l.blocks_per_group >> l.cluster_bits);
    sb.set_inodes_per_group(l.inodes_per_group);
    sb.set_mtime(0);
    sb.set_wtime(id.now.sec as u32);
    sb.set_mkfs_time(id.now.sec as u32);
    sb.set_lastcheck(id.now.sec as u32);
    sb.set_max_mnt_count(0xFFFF);
    sb.set_state(STATE_VALID);
    sb.set_errors(1);
    sb.set_first_ino(GOOD_OLD_FIRST_INO);
    sb.set_inode_size(opts.inode_size);
    sb.set_uuid(id.uuid);
    sb.set_volume_name(&opts.label);
    sb.set_reserved_gdt_blocks(l.reserved_gdt_blocks as u16);
    if f.has_64bit {
        sb.set_desc_size(64);
    }
    sb.set_def_hash_version(DX_HASH_HALF_MD4);
    let mut seed = [0u32; 4];
    for (i, s) in seed.iter_mut().enumerate() {
        *s = u32::from_le_bytes([
            id.hash_seed[4 * i],
            id.hash_seed[4 * i + 1],
            id.hash_seed[4 * i + 2],
            id.hash_seed[4 * i + 3],
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
    if opts.inode_size as usize > GOOD_OLD_INODE_SIZE {
        sb.set_min_extra_isize(EXTRA_ISIZE);
        sb.set_want_extra_isize(EXTRA_ISIZE);
    }
    if f.flex_bg {
        sb.set_log_groups_per_flex(FLEX_GROUPS.trailing_zeros() as u8);
    }
    if f.metadata_csum {
        sb.set_checksum_type(CRC32C_CHKSUM);
        if f.metadata_csum_seed {
            sb.set_checksum_seed(crc32c(!0, &id.uuid));
        }
    }
    if jblocks > 0 {
        sb.set_journal_inum(JOURNAL_INO);
        sb.set_jnl_backup_type(1);
    }
    let kinds = f.quota_kinds();
    if kinds[0] {
        sb.set_usr_quota_inum(3);
    }
    if kinds[1] {
        sb.set_grp_quota_inum(4);
    }
    if kinds[2] {
        sb.set_prj_quota_inum(super::place::PRJ_QUOTA_INO);
    }
    if f.orphan_file {
        sb.set_orphan_file_inum(super::place::orphan_ino(f));
    }
    sb.set_overhead_clusters(overhead as u32);
    sb
}

impl Maker<'_> {
    /// Writes the superblock (with the free counts and s_kbytes_written) and the descriptor
    /// table in group 0 and in every group that keeps copies.
    pub(super) fn write_superblocks(&mut self, mut sb: Superblock, table: &[u8]) -> Result<()> {
        let l = &self.l;
        let copies: Vec<u32> = (0..l.groups).filter(|&g| l.has_super(g)).collect();
        let kb = (self.w.written + (copies.len() as u64) * (1024 + table.len() as u64)) / 1024;
        sb.set_kbytes_written(kb);
        let bs = self.block_size();
        for g in copies {
            let mut s = sb.clone();
            s.set_block_group_nr(g as u16);
            s.set_csum();
            if g == 0 {
                // Block 0's first 1024 bytes are the boot sector area.
                let mut b0 = vec![0u8; 2048];
                b0[1024..].copy_from_slice(s.bytes());
                self.w.put(0, &b0)?;
            } else {
                let mut b = vec![0u8; bs];
                b[..1024].copy_from_slice(s.bytes());
                self.w.put_block(self.l.group_first(g), &b)?;
            }
            let gdt_at = self.l.super_at(g) + 1;
            self.w.put_block(gdt_at, table)?;
        }
        Ok(())
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

/// A jbd2 v2 superblock for an empty internal journal of `maxlen` blocks (1024 bytes): the
/// journal module's [`JournalSuperblock::new_v2`](crate::journal::format::JournalSuperblock)
/// with the filesystem as its one user (`s_users[0]` = the UUID), checksummed (crc32c from ~0
/// over the superblock with the checksum zeroed) when `csum_v3`.
/// `num_fc_blks` is s_num_fc_blks, the fast-commit area's length (0 without fast_commit; the
/// journal's fast_commit feature is the kernel's to set at mount, as mke2fs leaves it).
pub fn journal_superblock(
    block_size: u32,
    maxlen: u32,
    uuid: [u8; 16],
    csum_v3: bool,
    has_64bit: bool,
    num_fc_blks: u32,
) -> Vec<u8> {
    use crate::journal::format::{put_be32, JournalSuperblock};
    let mut jsb = JournalSuperblock::new_v2(block_size, maxlen, uuid, csum_v3, has_64bit);
    jsb.num_fc_blks = num_fc_blks;
    let mut j = jsb.to_bytes();
    j[0x100..0x110].copy_from_slice(&uuid);
    if jsb.has_csum_v2or3() {
        put_be32(&mut j, 0xFC, 0);
        let c = crc32c(!0, &j);
        put_be32(&mut j, 0xFC, c);
    }
    j
}
