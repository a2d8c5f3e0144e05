//! Replaying fast commits: each record in order, as the kernel's ext4_fc_replay (the
//! e2fsck copy, e2fsck/journal.c, follows the same rules), through the engine's own
//! operations in ordinary transactions. The bitmaps are made right at the end, as the
//! kernel's ext4_fc_set_bitmaps_and_counters: every block an inode the records touched maps
//! (data and tree nodes) is marked in use, every block it mapped before or a record named and
//! none maps now is marked free.
//!
//! Records about an inode or directory that is not there are skipped (counted), as the
//! kernel skips them ("Inode not found").

use crate::error::{Error, Result};
use crate::format::extent::{
    Extent, ExtentHeader, ExtentIdx, ENTRY_SIZE, EXTENT_MAGIC, HEADER_SIZE,
};
use crate::format::fast_commit::{DentryInfo, FastCommits, FcRecord};
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INLINE_DATA, I_BLOCK_SIZE};
use crate::fs::Fs;
use std::collections::BTreeSet;

/// Byte offsets in the inode of i_block and of i_generation, the field after it: a record's
/// INODE copies everything but i_block (the tree stays the one on disk, which the ADD_RANGE
/// and DEL_RANGE records bring up to date), unless the inode holds inline data.
const I_BLOCK_OFF: usize = 0x28;
const I_GENERATION_OFF: usize = I_BLOCK_OFF + I_BLOCK_SIZE;

/// Credits of one record's handle: an inode, bitmaps and descriptors, a directory block or
/// an extent-tree path with a split.
const RECORD_CREDITS: usize = 64;

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FcReplayReport {
    /// Records applied (HEAD, PAD and TAIL included).
    pub records: u32,
    /// Records about an inode or directory that is not there, skipped as the kernel does.
    pub skipped: u32,
    /// Inodes the records changed.
    pub inodes: u32,
}

/// The replay's bookkeeping.
#[derive(Default)]
struct ReplayState {
    /// Inodes a record changed (ext4_fc_record_modified_inode).
    modified: BTreeSet<u32>,
    /// Block runs that may have lost their owner: what the modified inodes mapped before,
    /// and every ADD_RANGE's run.
    touched: Vec<(u64, u64)>,
    /// Modified inodes whose tree is their own: in use when a record first touched them, or
    /// made by a CREAT. One left with no link gives back what it maps at the end (a freed
    /// inode's stale tree may name blocks another file owns now).
    live: BTreeSet<u32>,
    report: FcReplayReport,
}

impl Fs {
    /// Replays `fc` (the scan's whole fast commits) on this writable filesystem and commits.
    pub(crate) fn replay_fast_commits(&self, fc: &FastCommits) -> Result<FcReplayReport> {
        let mut rs = ReplayState::default();
        // The runs ADD_RANGE records map are held first, so that no block the replay
        // allocates (a tree node, a directory block) lands on one a later record maps (the
        // kernel's replay allocator excludes them: ext4_fc_replay_check_excluded).
        {
            let mut h = self.start(RECORD_CREDITS)?;
            for r in &fc.records {
                if let FcRecord::AddRange { extent: e, .. } = r {
                    self.mark_blocks(&mut h, e.pblk, e.len as u64, true)?;
                    rs.touched.push((e.pblk, e.len as u64));
                }
            }
        }
        for r in &fc.records {
            let done = match r {
                r if !self.fc_names_valid_inodes(r) => Ok(false),
                FcRecord::Inode { ino, raw } => self.fc_replay_inode(&mut rs, *ino, raw),
                FcRecord::AddRange { ino, extent } => {
                    self.fc_replay_add_range(&mut rs, *ino, *extent)
                }
                FcRecord::DelRange { ino, lblk, len } => {
                    self.fc_replay_del_range(&mut rs, *ino, *lblk, *len)
                }
                FcRecord::Creat(d) => self.fc_replay_link(&mut rs, d, true),
                FcRecord::Link(d) => self.fc_replay_link(&mut rs, d, false),
                FcRecord::Unlink(d) => self.fc_replay_unlink(&mut rs, d),
                FcRecord::Head { .. } | FcRecord::Pad | FcRecord::Tail { .. } => Ok(true),
            };
            rs.report.records += 1;
            match done {
                Ok(true) => {}
                Ok(false) | Err(Error::NotFound) => rs.report.skipped += 1,
                Err(e) => {
                    tracing::error!(record = rs.report.records, tag = r.tag_name(), %e, "fast-commit replay failed");
                    return Err(e);
                }
            }
        }
        self.fc_set_bitmaps(&mut rs)?;
        self.commit()?;
        rs.report.inodes = rs.modified.len() as u32;
        Ok(rs.report)
    }

    /// Whether every inode number a record names is one the filesystem has (a record naming
    /// another is skipped, as the kernel's iget fails on it).
    fn fc_names_valid_inodes(&self, r: &FcRecord) -> bool {
        let ok = |ino: u32| ino != 0 && ino <= self.geo.inodes_count;
        match r {
            FcRecord::Inode { ino, .. }
            | FcRecord::AddRange { ino, .. }
            | FcRecord::DelRange { ino, .. } => ok(*ino),
            FcRecord::Creat(d) | FcRecord::Link(d) | FcRecord::Unlink(d) => {
                ok(d.ino) && ok(d.parent)
            }
            FcRecord::Head { .. } | FcRecord::Pad | FcRecord::Tail { .. } => true,
        }
    }

    /// Notes that a record changes `ino`; the first time, what it maps now may lose its owner.
    /// Only an inode in use counts (the kernel clears the blocks of one its iget finds): the
    /// stale tree of a freed inode names blocks that may belong to another file now.
    fn fc_touch(&self, rs: &mut ReplayState, ino: u32) -> Result<()> {
        if rs.modified.insert(ino) && self.inode_in_use(ino)? {
            let raw = self.fc_raw_inode(ino)?;
            if raw.links_count() > 0 {
                rs.touched.extend(self.fc_inode_blocks(ino, &raw)?);
                rs.live.insert(ino);
            }
        }
        Ok(())
    }

    /// The inode as its table block holds it now (committed first, so no cached copy is newer).
    fn fc_raw_inode(&self, ino: u32) -> Result<RawInode> {
        self.commit()?;
        let (blk, off) = self.inode_location(ino)?;
        let buf = self.bcache.get(blk)?;
        let data = buf.read();
        Ok(RawInode(
            data[off..off + self.geo.inode_size as usize].to_vec(),
        ))
    }

    /// INODE: the inode's fields as the record has them, its tree as on disk (an empty root
    /// where there is none), marked in use while it has links (ext4_fc_replay_inode).
    fn fc_replay_inode(&self, rs: &mut ReplayState, ino: u32, fc_raw: &[u8]) -> Result<bool> {
        self.inode_location(ino)?;
        self.fc_touch(rs, ino)?;
        let mut disk = self.fc_raw_inode(ino)?;
        let n = fc_raw.len().min(disk.0.len());
        if n < I_GENERATION_OFF {
            return Ok(false);
        }
        disk.0[..I_BLOCK_OFF].copy_from_slice(&fc_raw[..I_BLOCK_OFF]);
        disk.0[I_GENERATION_OFF..n].copy_from_slice(&fc_raw[I_GENERATION_OFF..n]);
        if disk.flags() & FL_EXTENTS != 0 {
            if ExtentHeader::read(disk.i_block()).magic != EXTENT_MAGIC {
                let root = ExtentHeader {
                    magic: EXTENT_MAGIC,
                    entries: 0,
                    max: ((I_BLOCK_SIZE - HEADER_SIZE) / ENTRY_SIZE) as u16,
                    depth: 0,
                    generation: 0,
                };
                disk.i_block_mut().fill(0);
                root.write(disk.i_block_mut());
            }
        } else if disk.flags() & FL_INLINE_DATA != 0 {
            disk.i_block_mut()
                .copy_from_slice(&fc_raw[I_BLOCK_OFF..I_GENERATION_OFF]);
        }
        let mut h = self.start(RECORD_CREDITS)?;
        // Whatever the cache holds of the inode is older than the record.
        self.icache.remove(ino);
        self.write_inode(&mut h, ino, &mut disk)?;
        self.mark_inode(&mut h, ino, disk.is_dir(), disk.links_count() > 0)?;
        Ok(true)
    }

    /// ADD_RANGE: logical blocks mapped to the record's physical ones, replacing whatever
    /// mapped them (ext4_fc_replay_add_range).
    fn fc_replay_add_range(&self, rs: &mut ReplayState, ino: u32, e: Extent) -> Result<bool> {
        if e.len == 0 {
            return Ok(true);
        }
        let inode = self.iget(ino)?;
        self.fc_touch(rs, ino)?;
        let mut st = inode.state.lock();
        self.ext_load(ino, &mut st)?;
        if self.ext_map(ino, &mut st, e.lblk)? == Some(e) {
            return Ok(true);
        }
        let mut h = self.start(RECORD_CREDITS)?;
        self.ext_remove(&mut h, ino, &mut st, e.lblk, e.end())?;
        self.ext_insert(&mut h, ino, &mut st, e)?;
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        Ok(true)
    }

    /// DEL_RANGE: logical blocks unmapped (ext4_fc_replay_del_range). The kernel writes
    /// lengths that run past 2^32 for a truncate; the range stops at the largest block.
    fn fc_replay_del_range(
        &self,
        rs: &mut ReplayState,
        ino: u32,
        lblk: u32,
        len: u32,
    ) -> Result<bool> {
        let inode = self.iget(ino)?;
        self.fc_touch(rs, ino)?;
        let mut st = inode.state.lock();
        let mut h = self.start(RECORD_CREDITS)?;
        self.ext_remove(&mut h, ino, &mut st, lblk, lblk as u64 + len as u64)?;
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        Ok(true)
    }

    /// CREAT and LINK: a name for the inode, unless the directory has it already; the inode
    /// gains a link, or for CREAT has one (and a new directory its "." and ".."), as the
    /// kernel's ext4_fc_replay_create and ext4_fc_replay_link. The INODE record after them
    /// sets the count the kernel had.
    fn fc_replay_link(&self, rs: &mut ReplayState, d: &DentryInfo, create: bool) -> Result<bool> {
        if create {
            let raw = self.fc_raw_inode(d.ino)?;
            let mut h = self.start(RECORD_CREDITS)?;
            self.mark_inode(&mut h, d.ino, raw.is_dir(), true)?;
            rs.live.insert(d.ino);
        }
        let inode = self.iget(d.ino)?;
        let dir = self.iget(d.parent)?;
        self.fc_touch(rs, d.ino)?;
        self.fc_touch(rs, d.parent)?;
        let mut dst = dir.state.lock();
        if !dst.raw.is_dir() {
            return Ok(false);
        }
        let mut h = self.start(RECORD_CREDITS)?;
        let mut st = inode.state.lock();
        if create && st.raw.is_dir() && st.raw.size() == 0 {
            self.dir_init(&mut h, d.ino, &mut st, d.parent)?;
        }
        if self.dir_lookup(d.parent, &mut dst, &d.name)?.is_some() {
            return Ok(true);
        }
        let ft = crate::namei::ftype_of(st.raw.mode());
        self.dir_add(&mut h, d.parent, &mut dst, &d.name, d.ino, ft)?;
        self.mark_inode_dirty(&mut h, &dir, &mut dst)?;
        let links = if create {
            1
        } else {
            st.raw.links_count().saturating_add(1)
        };
        st.raw.set_links_count(links);
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        Ok(true)
    }

    /// UNLINK: the name removed if it names the inode; the inode loses a link
    /// (ext4_fc_replay_unlink). One left with none is freed at the end.
    fn fc_replay_unlink(&self, rs: &mut ReplayState, d: &DentryInfo) -> Result<bool> {
        let dir = self.iget(d.parent)?;
        let mut dst = dir.state.lock();
        if !dst.raw.is_dir()
            || self.dir_lookup(d.parent, &mut dst, &d.name)?.map(|x| x.0) != Some(d.ino)
        {
            return Ok(false);
        }
        drop(dst);
        self.fc_touch(rs, d.parent)?;
        self.fc_touch(rs, d.ino)?;
        let mut dst = dir.state.lock();
        let mut h = self.start(RECORD_CREDITS)?;
        self.dir_remove(&mut h, d.parent, &mut dst, &d.name)?;
        self.mark_inode_dirty(&mut h, &dir, &mut dst)?;
        if let Ok(inode) = self.iget(d.ino) {
            let mut st = inode.state.lock();
            let links = st.raw.links_count().saturating_sub(1);
            st.raw.set_links_count(links);
            self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        }
        Ok(true)
    }

    /// The blocks an inode maps, tree nodes included, as runs (none for inline data, a fast
    /// symlink or an indirect block map, which fast commits do not describe).
    fn fc_inode_blocks(&self, ino: u32, raw: &RawInode) -> Result<Vec<(u64, u64)>> {
        if raw.flags() & FL_EXTENTS == 0 || raw.flags() & FL_INLINE_DATA != 0 {
            return Ok(Vec::new());
        }
        let mut runs = Vec::new();
        self.fc_walk_tree(ino, raw.i_block(), 0, &mut runs)?;
        Ok(runs)
    }

    /// Collects the runs under one extent node (`node` holds its bytes).
    fn fc_walk_tree(
        &self,
        ino: u32,
        node: &[u8],
        level: u16,
        runs: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let h = ExtentHeader::read(node);
        if h.magic != EXTENT_MAGIC || level > crate::format::extent::MAX_DEPTH {
            return Err(Error::corrupt(
                crate::error::Corruption::ExtentTree,
                format!("inode {ino}: bad extent node during fast-commit replay"),
            ));
        }
        let max = (node.len() - HEADER_SIZE) / ENTRY_SIZE;
        for i in 0..(h.entries as usize).min(max) {
            let at = HEADER_SIZE + i * ENTRY_SIZE;
            if h.depth == 0 {
                let e = Extent::read(&node[at..]);
                runs.push((e.pblk, e.len as u64));
            } else {
                let idx = ExtentIdx::read(&node[at..]);
                runs.push((idx.leaf, 1));
                let child = self.bcache.get(idx.leaf)?.read().to_vec();
                self.fc_walk_tree(ino, &child, level + 1, runs)?;
            }
        }
        Ok(())
    }

    /// The end of the replay: bitmaps and block counts as the modified inodes now say
    /// (ext4_fc_set_bitmaps_and_counters, ext4_ext_replay_set_iblocks); an inode left with
    /// no link is freed.
    ///
    /// With bigalloc the bitmaps hold clusters: a cluster stays in use while a kept inode
    /// maps any block of it, and an inode's i_blocks counts whole clusters (its xattr block
    /// one too), as ext4_ext_replay_set_iblocks counts them.
    fn fc_set_bitmaps(&self, rs: &mut ReplayState) -> Result<()> {
        self.commit()?;
        let cbits = self.geo.cluster_bits;
        // Kept clusters (blocks, without bigalloc).
        let mut kept: BTreeSet<u64> = BTreeSet::new();
        let per_cluster = (self.geo.block_size as u64 / 512) << cbits;
        for &ino in &rs.modified {
            let mut raw = self.fc_raw_inode(ino)?;
            let mut h = self.start(RECORD_CREDITS)?;
            if raw.links_count() == 0 {
                // An UNLINK took its last name (a file created and removed among the
                // records, or one removed): what its tree maps now (a tree node replay
                // allocated among them) is freed unless another inode maps it.
                if rs.live.contains(&ino) {
                    let runs = self.fc_inode_blocks(ino, &raw)?;
                    rs.touched.extend(runs);
                }
                if raw.mode() != 0 {
                    self.icache.remove(ino);
                    if raw.dtime() == 0 {
                        raw.set_dtime(self.now().sec as u32);
                        self.write_inode(&mut h, ino, &mut raw)?;
                    }
                }
                self.mark_inode(&mut h, ino, raw.is_dir(), false)?;
                continue;
            }
            let runs = self.fc_inode_blocks(ino, &raw)?;
            if raw.flags() & FL_EXTENTS == 0 {
                continue;
            }
            let mut own: BTreeSet<u64> = BTreeSet::new();
            for &(p, n) in runs.iter().filter(|r| r.1 > 0) {
                self.mark_blocks(&mut h, p, n, true)?;
                own.extend((p >> cbits)..=((p + n - 1) >> cbits));
            }
            let mut count = own.len() as u64;
            kept.extend(own);
            if raw.file_acl() != 0 {
                count += 1;
            }
            if raw.blocks_512(self.geo.block_size) != count * per_cluster {
                self.icache.remove(ino);
                raw.set_blocks_512(count * per_cluster);
                self.write_inode(&mut h, ino, &mut raw)?;
            }
        }
        let mut h = self.start(RECORD_CREDITS)?;
        for &(p, n) in &rs.touched {
            for b in p..p + n {
                if !kept.contains(&(b >> cbits)) && self.geo.blocks_count > b {
                    self.mark_blocks(&mut h, b, 1, false)?;
                }
            }
        }
        Ok(())
    }
}
