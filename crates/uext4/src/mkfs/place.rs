//! Step 3 of mkfs: the blocks of the first files, allocated as mke2fs allocates them and in its
//! order: the root directory and lost+found (16 KiB: at least 2 blocks, at most 12) at the first
//! free blocks, the resize inode's double-indirect block after the group 0 tables, the journal at
//! the start of the group mke2fs picks in the middle of the filesystem, and the orphan file.

use super::alloc::{BlockMap, Blocks};
use super::layout::Layout;
use super::options::{default_journal_blocks, default_orphan_file_blocks, fast_commit_blocks};
use super::tables::FLEX_GROUPS;
use super::MkfsOptions;
use crate::error::{Error, Result};
use crate::format::inode::GOOD_OLD_FIRST_INO;
use crate::format::quota::{build_file, Dquot, QuotaType, QT_BLKSIZE};
use std::collections::BTreeMap;

/// The orphan file's inode: the first free one after lost+found, once the quota files are
/// made (mke2fs makes them first; the project quota file takes the first).
pub(super) fn orphan_ino(f: &super::FeatureSet) -> u32 {
    if f.quota_kinds()[2] {
        PRJ_QUOTA_INO + 1
    } else {
        GOOD_OLD_FIRST_INO + 1
    }
}

/// The blocks of a file: its data as runs, and its block map when files have no extents.
#[derive(Default)]
pub(super) struct FileBlocks {
    pub blocks: u64,
    pub runs: Vec<(u64, u64)>,
    pub map: Option<BlockMap>,
}

/// A quota file mkfs makes: its inode, contents and blocks (runs in logical order).
pub(super) struct QuotaFileBlocks {
    pub ino: u32,
    pub bytes: Vec<u8>,
    pub runs: Vec<(u64, u64)>,
}

/// The project quota file's inode: the first free one after lost+found, as mke2fs's
/// ext2fs_new_inode finds it.
pub(super) const PRJ_QUOTA_INO: u32 = GOOD_OLD_FIRST_INO + 1;

/// Where the first files' blocks went.
pub(super) struct Placement {
    pub root: u64,
    pub lost_found: Vec<u64>,
    pub resize_dind: Option<u64>,
    pub journal: FileBlocks,
    pub orphan: FileBlocks,
    /// The quota files, in the order mke2fs makes them (user, group, project).
    pub quotas: Vec<QuotaFileBlocks>,
    /// Inodes in use in group 0: the reserved ones, lost+found and the orphan file or the
    /// project quota file.
    pub used_inodes: u32,
}

pub(super) fn too_small() -> Error {
    Error::Invalid(
        "filesystem too small for its metadata and journal; use a smaller journal".into(),
    )
}

/// Allocates the first files' blocks in `bm`.
pub(super) fn place_files(bm: &mut Blocks, l: &Layout, opts: &MkfsOptions) -> Result<Placement> {
    let f = &opts.features;
    let used_inodes = if f.orphan_file {
        orphan_ino(f)
    } else if f.quota_kinds()[2] {
        PRJ_QUOTA_INO
    } else {
        GOOD_OLD_FIRST_INO
    };
    if used_inodes > l.inodes_per_group {
        return Err(Error::Invalid("too few inodes per group".into()));
    }
    let fdb = l.first_data_block;
    let root = bm.new_block(fdb).ok_or_else(too_small)?;
    bm.mark(root, 1, true);
    let bs = l.block_size as u64;
    let mut lpf_n = 1u64;
    while lpf_n < 12 && !(lpf_n * bs >= 16384 && lpf_n >= 2) {
        lpf_n += 1;
    }
    if opts.features.inline_data {
        // mke2fs makes lost+found inline there, and its first expansion only moves it to a
        // block: it ends one block short of the count above.
        lpf_n -= 1;
    }
    let mut lost_found: Vec<u64> = Vec::new();
    let mut goal = root;
    for i in 0..lpf_n {
        // With bigalloc a block inside a logical cluster already mapped takes its place in
        // that cluster (ext2fs_bmap2's implied cluster allocation).
        let b = match lost_found.last() {
            Some(&prev) if i % l.cluster_ratio() != 0 => prev + 1,
            _ => bm.new_block(goal).ok_or_else(too_small)?,
        };
        bm.mark(b, 1, true);
        lost_found.push(b);
        goal = b;
    }
    let resize_dind = if l.resize_inode {
        let goal = fdb + l.super_blocks() + 1 + l.inode_table_blocks as u64;
        let b = bm.new_block(goal).ok_or_else(too_small)?;
        bm.mark(b, 1, true);
        Some(b)
    } else {
        None
    };
    let journal = place_journal(bm, l, opts)?;
    let quotas = place_quota_files(bm, l, opts, lost_found.len() as u64)?;
    let orphan = if f.orphan_file {
        let n = default_orphan_file_blocks(l.blocks) as u64;
        alloc_file(bm, l, opts, fdb, n)?
    } else {
        FileBlocks::default()
    };
    Ok(Placement {
        root,
        lost_found,
        resize_dind,
        journal,
        orphan,
        quotas,
        used_inodes,
    })
}

/// The quota files, as mke2fs's create_quota_inodes makes them after the journal: usage of
/// the root directory (its owner's) and lost+found (root's), then each file's blocks, one
/// filesystem block when a quota block in it is first written, at the first free block of
/// group 0 (ext2fs_find_inode_goal for an inode with no blocks yet).
fn place_quota_files(
    bm: &mut Blocks,
    l: &Layout,
    opts: &MkfsOptions,
    lpf_blocks: u64,
) -> Result<Vec<QuotaFileBlocks>> {
    let kinds = opts.features.quota_kinds();
    let bs = l.block_size as u64;
    let (ru, rg) = opts.root_owner;
    // Space is charged in whole clusters with bigalloc, as i_blocks counts it.
    let ratio = l.cluster_ratio();
    let space = |blocks: u64| blocks.div_ceil(ratio) * ratio * bs;
    let charged = [([ru, rg, 0], space(1)), ([0, 0, 0], space(lpf_blocks))];
    let mut out = Vec::new();
    for t in QuotaType::ALL {
        if !kinds[t.index()] {
            continue;
        }
        let mut by_id: BTreeMap<u32, Dquot> = BTreeMap::new();
        for (ids, space) in charged {
            let id = ids[t.index()];
            let q = by_id.entry(id).or_insert(Dquot {
                id,
                ..Default::default()
            });
            q.curspace += space;
            q.curinodes += 1;
        }
        let entries: Vec<Dquot> = by_id.into_values().collect();
        let (bytes, order) = build_file(t, &entries);
        let mut lmap: BTreeMap<u64, u64> = BTreeMap::new();
        for qb in order {
            let lb = qb as u64 * QT_BLKSIZE as u64 / bs;
            if lmap.contains_key(&lb) {
                continue;
            }
            // With bigalloc a block whose logical cluster is mapped goes into the same
            // physical cluster (ext2fs_bmap2's implied cluster allocation).
            let sibling = lmap.iter().find(|(k, _)| **k / ratio == lb / ratio);
            let b = match sibling {
                Some((&k, &p)) => p - k % ratio + lb % ratio,
                None => bm.new_block(l.first_data_block).ok_or_else(too_small)?,
            };
            bm.mark(b, 1, true);
            lmap.insert(lb, b);
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &b in lmap.values() {
            match runs.last_mut() {
                Some((s, n)) if *s + *n == b => *n += 1,
                _ => runs.push((b, 1)),
            }
        }
        let ino = match t {
            QuotaType::User => 3,
            QuotaType::Group => 4,
            QuotaType::Project => PRJ_QUOTA_INO,
        };
        out.push(QuotaFileBlocks { ino, bytes, runs });
    }
    Ok(out)
}

/// The journal's size (as asked, or mke2fs's default for the size; 0 without has_journal) and
/// its blocks, at the start of a group in the middle of the filesystem (ext2fs_mkjournal's
/// get_midpoint_journal_block).
fn place_journal(bm: &mut Blocks, l: &Layout, opts: &MkfsOptions) -> Result<FileBlocks> {
    let f = &opts.features;
    let jblocks: u64 = if f.has_journal {
        match opts.journal_blocks {
            Some(n) => n as u64,
            None => default_journal_blocks(l.blocks) as u64,
        }
    } else {
        0
    };
    if jblocks > 0 && jblocks < 1024 {
        return Err(Error::Invalid(format!(
            "journal of {jblocks} blocks: the least is 1024"
        )));
    }
    if jblocks > (1 << 30) / l.block_size as u64 * 10 {
        return Err(Error::Invalid(format!(
            "journal of {jblocks} blocks: the most is 10 GiB"
        )));
    }
    if jblocks == 0 {
        return Ok(FileBlocks::default());
    }
    // The fast-commit area comes after the log, in the same journal inode.
    let jblocks = jblocks
        + if f.fast_commit {
            fast_commit_blocks(l.blocks) as u64
        } else {
            0
        };
    let free_total = l.blocks - bm.used();
    // mke2fs checks only a size it was given.
    if opts.journal_blocks.is_some() && jblocks > free_total / 2 {
        return Err(too_small());
    }
    let (fdb, groups) = (l.first_data_block, l.groups);
    let flex = if f.flex_bg { FLEX_GROUPS } else { 0 };
    let mut group = bm.group_of((l.blocks - fdb) / 2);
    let start;
    if flex > 0 && group > flex {
        group &= !(flex - 1);
        while group < groups && bm.free_in(l, group) == 0 {
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
        if bm.free_in(l, g) > bm.free_in(l, best) {
            best = g;
        }
    }
    // Without extents mke2fs maps it block by block from the journal inode's group, the first.
    let goal = if f.extents { l.group_first(best) } else { fdb };
    alloc_file(bm, l, opts, goal, jblocks)
}

/// Allocates `n` data blocks from `goal` on: in runs with extents, else with the indirect
/// blocks that map them.
fn alloc_file(
    bm: &mut Blocks,
    l: &Layout,
    opts: &MkfsOptions,
    goal: u64,
    n: u64,
) -> Result<FileBlocks> {
    if opts.features.extents {
        let runs = bm.alloc_runs(goal, n).ok_or_else(too_small)?;
        return Ok(FileBlocks {
            blocks: n,
            runs,
            map: None,
        });
    }
    let map = bm
        .alloc_block_mapped(goal, n, l.block_size)
        .ok_or_else(too_small)?;
    Ok(FileBlocks {
        blocks: n,
        runs: map.runs.clone(),
        map: Some(map),
    })
}
