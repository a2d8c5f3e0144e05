//! Making a new filesystem, with the features `mke2fs -t ext4` of e2fsprogs 1.47 sets by
//! default (less resize_inode, which uext4 does not create: online resize is not a goal, and
//! without the feature no blocks are reserved for it).
//!
//! Layout: groups of 8 x block-size blocks; superblock and descriptor-table copies in groups 0, 1
//! and powers of 3, 5 and 7 (sparse_super); with flex_bg, the bitmaps and inode tables of each 16
//! groups sit together at the start of the first of them; the journal is one contiguous run
//! (inode 8) after group 0's metadata; the root directory (inode 2) and lost+found (inode 11,
//! 16 KiB, so e2fsck has room to reconnect files).

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::csum::crc32c;
use crate::format::extent::{Extent, ExtentHeader, EXTENT_MAGIC};
use crate::format::features::*;
use crate::format::group_desc::{GdCsum, GroupDesc, BG_INODE_ZEROED};
use crate::format::inode::*;
use crate::format::superblock::*;
use crate::format::{put16, put32};

/// Which optional features to set.
#[derive(Clone, Debug)]
pub struct FeatureSet {
    pub metadata_csum: bool,
    pub metadata_csum_seed: bool,
    pub has_64bit: bool,
    pub flex_bg: bool,
    pub dir_index: bool,
    pub extents: bool,
}

impl Default for FeatureSet {
    fn default() -> Self {
        FeatureSet {
            metadata_csum: true,
            metadata_csum_seed: false,
            has_64bit: true,
            flex_bg: true,
            dir_index: true,
            extents: true,
        }
    }
}

impl FeatureSet {
    /// Applies a mke2fs-style list: `feature` to set, `^feature` to clear.
    pub fn apply(&mut self, list: &str) -> Result<()> {
        for f in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match f.strip_prefix('^') {
                Some(n) => (false, n),
                None => (true, f),
            };
            match name {
                "metadata_csum" => self.metadata_csum = on,
                "metadata_csum_seed" => self.metadata_csum_seed = on,
                "64bit" => self.has_64bit = on,
                "flex_bg" => self.flex_bg = on,
                "dir_index" => self.dir_index = on,
                "extent" | "extents" => self.extents = on,
                "has_journal" | "ext_attr" | "filetype" | "sparse_super" | "large_file" | "huge_file" | "dir_nlink"
                | "extra_isize" | "uninit_bg"
                    if on => {}
                "resize_inode" if !on => {}
                _ => {
                    return Err(Error::Unsupported(format!(
                        "mkfs feature {f:?} (uext4 mkfs sets: metadata_csum, metadata_csum_seed, 64bit, flex_bg, dir_index, extent; use --journal-size 0 for no journal)"
                    )))
                }
            }
        }
        if !self.extents {
            return Err(Error::Unsupported(
                "mkfs without the extent feature (uext4 writes extent trees only)".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Bytes; 0: the whole device.
    pub size: u64,
    /// 1024 or 4096.
    pub block_size: u32,
    /// Journal size in blocks: None for mke2fs's default for the size, Some(0) for no journal.
    pub journal_blocks: Option<u32>,
    pub inode_size: u16,
    pub inode_ratio: u32,
    pub label: String,
    pub uuid: Option<[u8; 16]>,
    pub features: FeatureSet,
    /// The device reads as zeros already (a new sparse file): skip zeroing inode tables.
    pub assume_zeroed: bool,
}

impl MkfsOptions {
    /// Defaults like `mke2fs -t ext4` for a filesystem of `size` bytes.
    pub fn default_for(size: u64) -> Self {
        MkfsOptions {
            size,
            block_size: 4096,
            journal_blocks: None,
            inode_size: 256,
            inode_ratio: 16384,
            label: String::new(),
            uuid: None,
            features: FeatureSet::default(),
            assume_zeroed: false,
        }
    }
}

/// mke2fs's default journal size (in blocks) for a filesystem of `blocks` blocks.
pub fn default_journal_blocks(blocks: u64) -> u32 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        _ => 131072,
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

fn group_has_super(g: u32) -> bool {
    if g <= 1 {
        return true;
    }
    for base in [3u32, 5, 7] {
        let mut p = base;
        while p < g {
            p = p.saturating_mul(base);
        }
        if p == g {
            return true;
        }
    }
    false
}

/// Big-endian helpers for the journal superblock.
fn be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// A jbd2 v2 superblock for an empty internal journal of `maxlen` blocks.
pub fn journal_superblock(
    block_size: u32,
    maxlen: u32,
    uuid: [u8; 16],
    csum_v3: bool,
    has_64bit: bool,
) -> Vec<u8> {
    let mut j = vec![0u8; 1024];
    be32(&mut j, 0x0, 0xC03B_3998);
    be32(&mut j, 0x4, 4); // superblock v2
    be32(&mut j, 0xC, block_size);
    be32(&mut j, 0x10, maxlen);
    be32(&mut j, 0x14, 1); // s_first
    be32(&mut j, 0x18, 1); // s_sequence
    let mut incompat = 0;
    if has_64bit {
        incompat |= 0x2;
    }
    if csum_v3 {
        incompat |= 0x10;
    }
    be32(&mut j, 0x28, incompat);
    j[0x30..0x40].copy_from_slice(&uuid);
    be32(&mut j, 0x40, 1); // s_nr_users
    j[0x100..0x110].copy_from_slice(&uuid);
    if csum_v3 {
        j[0x50] = 4; // crc32c
        let c = crc32c(!0, &j);
        be32(&mut j, 0xFC, c);
    }
    j
}

/// Writes a new filesystem on `dev`.
pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
    let bs = opts.block_size;
    if bs != 1024 && bs != 4096 {
        return Err(Error::Invalid(format!("block size {bs}: use 1024 or 4096")));
    }
    let f = &opts.features;
    let size = if opts.size == 0 {
        dev.size()
    } else {
        opts.size.min(dev.size())
    };
    let bs64 = bs as u64;
    let mut blocks = size / bs64;
    let fdb: u64 = (bs == 1024) as u64;
    let bpg = bs * 8;
    if !f.has_64bit && blocks > u32::MAX as u64 {
        blocks = u32::MAX as u64;
    }
    let isz = opts.inode_size as u64;
    if isz < 128 || !isz.is_power_of_two() || isz > bs64 {
        return Err(Error::Invalid(format!("inode size {isz}")));
    }
    let desc_size: u64 = if f.has_64bit { 64 } else { 32 };
    // Groups; drop a last group too small to hold its own metadata.
    let mut groups = ((blocks - fdb).div_ceil(bpg as u64)) as u32;
    let inodes_wanted = (blocks * bs64 / opts.inode_ratio as u64).max(16);
    let per_block = (bs64 / isz) as u32;
    let mut ipg = (inodes_wanted.div_ceil(groups as u64) as u32).div_ceil(per_block) * per_block;
    ipg = ipg.div_ceil(8) * 8;
    ipg = ipg.clamp(16, bpg);
    let itb = ((ipg as u64 * isz).div_ceil(bs64)) as u32;
    let gdt_blocks = |groups: u32| (groups as u64 * desc_size).div_ceil(bs64) as u32;
    let last = blocks - fdb - (groups as u64 - 1) * bpg as u64;
    if groups > 1 && last < (itb + 2 + 1 + gdt_blocks(groups) + 50) as u64 {
        groups -= 1;
        blocks = fdb + groups as u64 * bpg as u64;
    }
    if blocks < 64 || groups == 0 {
        return Err(Error::Invalid(format!(
            "{size} bytes is too small for a filesystem"
        )));
    }
    let gdtb = gdt_blocks(groups);
    let flex: u32 = if f.flex_bg { 16 } else { 1 };
    let gfirst = |g: u32| fdb + g as u64 * bpg as u64;
    let gblocks = |g: u32| ((blocks - gfirst(g)).min(bpg as u64)) as u32;
    let overhead = |g: u32| if group_has_super(g) { 1 + gdtb } else { 0 };
    if (overhead(0) + flex.min(groups) * (2 + itb)) as u64 > bpg as u64 {
        return Err(Error::Invalid(
            "filesystem geometry does not fit (inode tables too large for a group)".into(),
        ));
    }

    // Placement of bitmaps and inode tables.
    let mut bb = vec![0u64; groups as usize];
    let mut ib = vec![0u64; groups as usize];
    let mut it = vec![0u64; groups as usize];
    let mut g0 = 0;
    while g0 < groups {
        let n = flex.min(groups - g0);
        let start = gfirst(g0) + overhead(g0) as u64;
        for i in 0..n {
            let g = (g0 + i) as usize;
            bb[g] = start + i as u64;
            ib[g] = start + n as u64 + i as u64;
            it[g] = start + 2 * n as u64 + i as u64 * itb as u64;
        }
        g0 += n;
    }

    // Used blocks, as ranges.
    let mut used: Vec<(u64, u64)> = Vec::new();
    for g in 0..groups {
        if group_has_super(g) {
            used.push((gfirst(g), overhead(g) as u64));
        }
        used.push((bb[g as usize], 1));
        used.push((ib[g as usize], 1));
        used.push((it[g as usize], itb as u64));
    }
    if fdb == 1 {
        used.push((0, 1));
    }
    let meta_end = it[(flex.min(groups) - 1) as usize] + itb as u64;
    // Journal, root directory block, lost+found blocks.
    let jblocks = match opts.journal_blocks {
        Some(n) => n,
        None => default_journal_blocks(blocks),
    }
    .min(4 * 32768);
    // A first-fit run of free blocks (outside every fixed structure) from `from`.
    let find_run = |used: &[(u64, u64)], from: u64, n: u64| -> Option<u64> {
        let mut at = from;
        'outer: while at + n <= blocks {
            for &(s, l) in used {
                if at < s + l && s < at + n {
                    at = s + l;
                    continue 'outer;
                }
            }
            return Some(at);
        }
        None
    };
    let too_small = || {
        Error::Invalid(
            "filesystem too small for its metadata and journal; use a smaller --journal-size"
                .into(),
        )
    };
    let lpf_n: u64 = (16384 / bs64).max(1);
    let root_blk = find_run(&used, meta_end, 1).ok_or_else(too_small)?;
    used.push((root_blk, 1));
    let lpf_blk = find_run(&used, root_blk + 1, lpf_n).ok_or_else(too_small)?;
    used.push((lpf_blk, lpf_n));
    let jstart = if jblocks > 0 {
        let j = find_run(&used, lpf_blk + lpf_n, jblocks as u64).ok_or_else(too_small)?;
        used.push((j, jblocks as u64));
        j
    } else {
        0
    };
    for &(s, n) in &used {
        if s + n > blocks {
            return Err(Error::Invalid("filesystem too small".into()));
        }
    }

    let uuid = opts.uuid.unwrap_or_else(|| {
        let mut u: [u8; 16] = random_bytes();
        u[6] = (u[6] & 0x0f) | 0x40;
        u[8] = (u[8] & 0x3f) | 0x80;
        u
    });
    let hash_seed: [u8; 16] = random_bytes();
    let now = Timestamp::now();

    // Superblock.
    let mut sb = Superblock::zeroed();
    sb.set_magic(EXT4_MAGIC);
    sb.set_rev_level(1);
    let compat = COMPAT_EXT_ATTR
        | if f.dir_index { COMPAT_DIR_INDEX } else { 0 }
        | if jblocks > 0 { COMPAT_HAS_JOURNAL } else { 0 };
    let incompat = INCOMPAT_FILETYPE
        | INCOMPAT_EXTENTS
        | if f.has_64bit { INCOMPAT_64BIT } else { 0 }
        | if f.flex_bg { INCOMPAT_FLEX_BG } else { 0 }
        | if f.metadata_csum && f.metadata_csum_seed {
            INCOMPAT_CSUM_SEED
        } else {
            0
        };
    let ro = RO_COMPAT_SPARSE_SUPER
        | RO_COMPAT_LARGE_FILE
        | RO_COMPAT_HUGE_FILE
        | RO_COMPAT_DIR_NLINK
        | RO_COMPAT_EXTRA_ISIZE
        | if f.metadata_csum {
            RO_COMPAT_METADATA_CSUM
        } else {
            RO_COMPAT_GDT_CSUM
        };
    sb.set_feature_compat(compat);
    sb.set_feature_incompat(incompat);
    sb.set_feature_ro_compat(ro);
    sb.set_inodes_count(groups * ipg);
    sb.set_blocks_count(blocks);
    sb.set_r_blocks_count(blocks / 20);
    sb.set_first_data_block(fdb as u32);
    sb.set_log_block_size(if bs == 1024 { 0 } else { 2 });
    sb.set_log_cluster_size(if bs == 1024 { 0 } else { 2 });
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
    sb.set_first_ino(11);
    sb.set_inode_size(opts.inode_size);
    sb.set_uuid(uuid);
    sb.set_volume_name(&opts.label);
    if f.has_64bit {
        sb.set_desc_size(64);
    }
    sb.set_def_hash_version(crate::htree::DX_HASH_HALF_MD4);
    let mut seed = [0u32; 4];
    for (i, s) in seed.iter_mut().enumerate() {
        *s = u32::from_le_bytes(hash_seed[4 * i..4 * i + 4].try_into().unwrap());
    }
    sb.set_hash_seed(seed);
    sb.set_flags(FLAGS_SIGNED_HASH);
    sb.set_default_mount_opts(0x000C);
    sb.set_min_extra_isize(EXTRA_ISIZE);
    sb.set_want_extra_isize(EXTRA_ISIZE);
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
    let csum_seed = sb.csum_seed();
    let gd_kind = if f.metadata_csum {
        GdCsum::Crc32c { seed: csum_seed }
    } else {
        GdCsum::Crc16 { uuid }
    };

    // Inodes: root, lost+found, journal, and the reserved ones (zero, checksummed).
    let write_inode = |ino: u32, raw: &mut RawInode| -> Result<()> {
        if f.metadata_csum {
            raw.set_csum(csum_seed, ino);
        }
        let g = (ino - 1) / ipg;
        let idx = ((ino - 1) % ipg) as u64;
        dev.write_at(it[g as usize] * bs64 + idx * isz, &raw.0)?;
        Ok(())
    };
    if !opts.assume_zeroed {
        let zero = vec![0u8; (itb as usize * bs as usize).min(4 << 20)];
        for g in 0..groups as usize {
            let mut off = 0u64;
            let total = itb as u64 * bs64;
            while off < total {
                let n = (total - off).min(zero.len() as u64) as usize;
                dev.write_at(it[g] * bs64 + off, &zero[..n])?;
                off += n as u64;
            }
        }
    }
    let extent_root = |raw: &mut RawInode, start: u64, len: u64| {
        raw.set_flags(raw.flags() | FL_EXTENTS);
        let b = raw.i_block_mut();
        b.fill(0);
        let mut n = 0u16;
        let mut done = 0u64;
        while done < len {
            let l = (len - done).min(32768);
            Extent {
                lblk: done as u32,
                len: l as u32,
                pblk: start + done,
                unwritten: false,
            }
            .write(&mut b[12 + 12 * n as usize..24 + 12 * n as usize]);
            done += l;
            n += 1;
        }
        ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: n,
            max: 4,
            depth: 0,
            generation: 0,
        }
        .write(b);
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
    for ino in 1..11u32 {
        if ino == ROOT_INO || (ino == JOURNAL_INO && jblocks > 0) {
            continue;
        }
        let mut r = RawInode::new(isz as usize);
        if ino == 1 {
            r.set_atime(now);
            r.set_mtime(now);
            r.set_ctime(now);
        }
        write_inode(ino, &mut r)?;
    }
    let sectors = bs64 / 512;
    let mut root = new_inode(S_IFDIR | 0o755, 3);
    extent_root(&mut root, root_blk, 1);
    root.set_size(bs64);
    root.set_blocks_512(sectors);
    write_inode(ROOT_INO, &mut root)?;
    let mut lpf = new_inode(S_IFDIR | 0o700, 2);
    extent_root(&mut lpf, lpf_blk, lpf_n);
    lpf.set_size(lpf_n * bs64);
    lpf.set_blocks_512(lpf_n * sectors);
    write_inode(11, &mut lpf)?;
    if jblocks > 0 {
        let mut j = new_inode(S_IFREG | 0o600, 1);
        extent_root(&mut j, jstart, jblocks as u64);
        j.set_size(jblocks as u64 * bs64);
        j.set_blocks_512(jblocks as u64 * sectors);
        let ib: [u8; 60] = j.i_block().try_into().unwrap();
        sb.set_jnl_blocks(&ib, 0, (jblocks as u64 * bs64) as u32);
        write_inode(JOURNAL_INO, &mut j)?;
        // The journal: superblock, the rest zeroed.
        let mut blk0 = vec![0u8; bs as usize];
        blk0[..1024].copy_from_slice(&journal_superblock(
            bs,
            jblocks,
            uuid,
            f.metadata_csum,
            f.has_64bit,
        ));
        dev.write_at(jstart * bs64, &blk0)?;
        if !opts.assume_zeroed {
            let zero = vec![0u8; 1 << 20];
            let mut off = bs64;
            let total = jblocks as u64 * bs64;
            while off < total {
                let n = (total - off).min(zero.len() as u64) as usize;
                dev.write_at(jstart * bs64 + off, &zero[..n])?;
                off += n as u64;
            }
        }
    }

    // Directory blocks.
    let inode_seed = |ino: u32, r: &RawInode| RawInode::csum_seed(csum_seed, ino, r.generation());
    let tail = if f.metadata_csum { 12 } else { 0 };
    let finish_leaf = |b: &mut [u8], ino: u32, r: &RawInode| {
        if f.metadata_csum {
            let t = b.len() - 12;
            put32(b, t, 0);
            put16(b, t + 4, 12);
            b[t + 6] = 0;
            b[t + 7] = 0xDE;
            let c = crc32c(inode_seed(ino, r), &b[..t]);
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
    dirent(&mut rb, 24, 11, space - 24, b"lost+found", 2);
    finish_leaf(&mut rb, ROOT_INO, &root);
    dev.write_at(root_blk * bs64, &rb)?;
    for i in 0..lpf_n {
        let mut b = vec![0u8; bs as usize];
        if i == 0 {
            dirent(&mut b, 0, 11, 12, b".", 2);
            dirent(&mut b, 12, ROOT_INO, space - 12, b"..", 2);
        } else {
            put16(&mut b, 4, space as u16);
        }
        finish_leaf(&mut b, 11, &lpf);
        dev.write_at((lpf_blk + i) * bs64, &b)?;
    }

    // Bitmaps and descriptors.
    let mut descs = Vec::with_capacity(groups as usize);
    let mut free_total = 0u64;
    let mut free_inodes_total = 0u64;
    for g in 0..groups {
        let first = gfirst(g);
        let n = gblocks(g) as u64;
        let mut bmp = vec![0u8; bs as usize];
        for &(s, len) in &used {
            for b in s.max(first)..(s + len).min(first + n) {
                let i = (b - first) as usize;
                bmp[i / 8] |= 1 << (i % 8);
            }
        }
        for i in n as usize..bs as usize * 8 {
            bmp[i / 8] |= 1 << (i % 8);
        }
        let used_n = (0..n as usize)
            .filter(|&i| bmp[i / 8] & (1 << (i % 8)) != 0)
            .count() as u64;
        let free = n - used_n;
        dev.write_at(bb[g as usize] * bs64, &bmp)?;
        let mut ibmp = vec![0u8; bs as usize];
        let used_inodes = if g == 0 { 11 } else { 0 };
        for i in (0..used_inodes).chain(ipg as usize..bs as usize * 8) {
            ibmp[i / 8] |= 1 << (i % 8);
        }
        dev.write_at(ib[g as usize] * bs64, &ibmp)?;
        let mut d = GroupDesc::new(desc_size as usize);
        d.set_block_bitmap(bb[g as usize]);
        d.set_inode_bitmap(ib[g as usize]);
        d.set_inode_table(it[g as usize]);
        d.set_free_blocks_count(free);
        d.set_free_inodes_count((ipg as usize - used_inodes) as u64);
        d.set_used_dirs_count(if g == 0 { 2 } else { 0 });
        d.set_itable_unused((ipg as usize - used_inodes) as u64);
        d.set_flags(BG_INODE_ZEROED);
        if f.metadata_csum {
            d.set_block_bitmap_csum(csum_seed, &bmp[..bpg as usize / 8]);
            d.set_inode_bitmap_csum(csum_seed, &ibmp[..ipg as usize / 8]);
        }
        d.set_csum(gd_kind, g);
        free_total += free;
        free_inodes_total += (ipg as usize - used_inodes) as u64;
        descs.push(d);
    }
    sb.set_free_blocks_count(free_total);
    sb.set_free_inodes_count(free_inodes_total as u32);
    let mut table = vec![0u8; gdtb as usize * bs as usize];
    for (g, d) in descs.iter().enumerate() {
        let off = g * desc_size as usize;
        table[off..off + desc_size as usize].copy_from_slice(d.as_bytes());
    }
    // Primary and backup superblocks and descriptor tables.
    for g in 0..groups {
        if !group_has_super(g) {
            continue;
        }
        let mut s = sb.clone();
        s.set_block_group_nr(g as u16);
        s.set_csum();
        let first = gfirst(g);
        if g == 0 {
            if fdb == 0 {
                // Block 0 holds the boot sector area and the superblock at byte 1024.
                let mut b0 = vec![0u8; bs as usize];
                b0[1024..2048].copy_from_slice(s.bytes());
                dev.write_at(0, &b0)?;
            } else {
                dev.write_at(0, &[0u8; 1024])?;
                dev.write_at(1024, s.bytes())?;
            }
        } else {
            let mut b = vec![0u8; bs as usize];
            b[..1024].copy_from_slice(s.bytes());
            dev.write_at(first * bs64, &b)?;
        }
        let gdt_at = if g == 0 { fdb + 1 } else { first + 1 };
        dev.write_at(gdt_at * bs64, &table)?;
    }
    dev.flush()?;
    Ok(())
}
