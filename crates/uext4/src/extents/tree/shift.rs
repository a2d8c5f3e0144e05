//! fallocate's COLLAPSE_RANGE and INSERT_RANGE (the kernel's ext4_collapse_range,
//! ext4_insert_range and ext4_ext_shift_extents): a block-aligned range leaves the file and
//! everything after it moves down, or a hole opens and everything after it moves up. Only a
//! file with an extent tree can shift; an indirect block map cannot (EOPNOTSUPP, as ext4).
//!
//! The shift rewrites the logical block of every extent at or past the range and the keys
//! that index them, node by node, in the same handle as the removal (collapse) or split
//! (insert) and the new size, so a crash shows the file before or after, never between.

use super::{index_entry, key, leaf_entry, Node};
use crate::error::{Error, Result};
use crate::format::extent::{Extent, ExtentIdx};
use crate::format::inode::{S_IFDIR, S_IFREG};
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::{credits, Handle};
use std::sync::atomic::Ordering;

/// `fallocate` mode: remove a range, moving what follows down (`FALLOC_FL_COLLAPSE_RANGE`).
pub const FALLOC_FL_COLLAPSE_RANGE: i32 = 0x08;
/// `fallocate` mode: open a hole, moving what follows up (`FALLOC_FL_INSERT_RANGE`).
pub const FALLOC_FL_INSERT_RANGE: i32 = 0x20;

/// One past the largest logical block an extent may reach (`EXT_MAX_BLOCKS`).
const MAX_BLOCKS: u64 = 1 << 32;

impl Fs {
    /// COLLAPSE_RANGE or INSERT_RANGE (`mode` is exactly one of them) of `[off, off+len)`,
    /// with the kernel's checks: both block-aligned (EINVAL); a collapse ends before the end
    /// of the file and an insert starts inside it (EINVAL); the file does not outgrow the
    /// largest size (EFBIG); immutable or append-only files refuse (EPERM).
    pub(crate) fn fallocate_shift(&self, ino: u32, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        let collapse = mode == FALLOC_FL_COLLAPSE_RANGE;
        if !collapse && mode != FALLOC_FL_INSERT_RANGE {
            return Err(Error::NotSupported(format!(
                "fallocate mode {mode:#x}: COLLAPSE_RANGE and INSERT_RANGE take no other flag"
            )));
        }
        if len == 0 {
            return Err(Error::Invalid("fallocate: length 0".into()));
        }
        let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        {
            let st = inode.state.lock();
            if st.deleted {
                return Err(Error::NotFound);
            }
            crate::flags::may_fallocate(&st.raw, mode)?;
            match st.raw.file_type() {
                S_IFREG => {}
                S_IFDIR => return Err(Error::IsDir),
                _ => return Err(Error::NotSupported("fallocate of a special file".into())),
            }
        }
        self.inline_convert_file(&inode)?;
        // Buffered data goes down first: the shift moves the mapping.
        self.delalloc_writeback_locked(&inode)?;
        let bs = self.geo.block_size as u64;
        {
            let st = inode.state.lock();
            if Self::uses_blockmap(&st.raw) {
                return Err(Error::NotSupported(format!(
                    "inode {ino}: COLLAPSE_RANGE and INSERT_RANGE need an extent tree"
                )));
            }
            // With bigalloc the kernel asks for whole clusters (ext4_collapse_range), which
            // keeps every block at its offset in its cluster.
            if !(off | len).is_multiple_of(bs << self.geo.cluster_bits) {
                return Err(Error::Invalid(format!(
                    "COLLAPSE_RANGE and INSERT_RANGE take ranges aligned to {} bytes",
                    bs << self.geo.cluster_bits
                )));
            }
            let size = st.raw.size();
            if collapse && end >= size {
                return Err(Error::Invalid(
                    "COLLAPSE_RANGE must end before the end of the file".into(),
                ));
            }
            if !collapse && off >= size {
                return Err(Error::Invalid(
                    "INSERT_RANGE must start before the end of the file".into(),
                ));
            }
            if !collapse && len > self.max_size_of(&st.raw).saturating_sub(size) {
                return Err(Error::FileTooBig);
            }
        }
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let (start, n) = ((off / bs) as u32, (len / bs) as u32);
        let room = credits::UNLINK + self.shift_credits(&inode)?;
        if room > self.txn.max_blocks.load(Ordering::Relaxed) {
            // The kernel restarts its handle leaf by leaf; this shift is one handle, and a
            // handle may not outgrow the log.
            return Err(Error::NotSupported(format!(
                "inode {ino}: too many extents to shift in one transaction"
            )));
        }
        if collapse {
            // A range too large for one handle is emptied in pieces first, from its end.
            self.remove_in_pieces(&inode, start, start as u64 + n as u64)?;
        }
        let mut h = self.start_with_room(room)?;
        let mut st = inode.state.lock();
        if st.deleted {
            return Err(Error::NotFound);
        }
        self.ext_load(ino, &mut st)?;
        if collapse {
            self.ext_remove(&mut h, ino, &mut st, start, start as u64 + n as u64)?;
            self.tree_shift(&mut h, ino, &mut st, start + n, -(n as i64))?;
            let size = st.raw.size() - len;
            st.raw.set_size(size);
        } else {
            let last = st
                .extents
                .as_ref()
                .unwrap()
                .map
                .values()
                .next_back()
                .copied();
            if last.is_some_and(|x| x.end() + n as u64 > MAX_BLOCKS) {
                return Err(Error::FileTooBig);
            }
            self.tree_split_at(&mut h, ino, &mut st, start)?;
            self.tree_shift(&mut h, ino, &mut st, start, n as i64)?;
            let size = st.raw.size() + len;
            st.raw.set_size(size);
        }
        let now = self.now();
        st.raw.set_mtime(now);
        st.raw.set_ctime(now);
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(())
    }

    /// The tree blocks a shift may rewrite, at most: every leaf (taken as half full) and the
    /// index blocks above them.
    fn shift_credits(&self, inode: &Inode) -> Result<usize> {
        let mut st = inode.state.lock();
        self.ext_load(inode.ino, &mut st)?;
        let extents = st.extents.as_ref().map_or(0, |c| c.map.len());
        let half = ((self.geo.block_size as usize - 12) / 12 / 2).max(1);
        let leaves = extents / half + 1;
        Ok(leaves + super::depth(&st.raw) as usize * (leaves / half + 1) + 4)
    }

    /// Splits the extent that covers logical block `at` (and starts before it) in two at `at`,
    /// so that no extent straddles the point an insert opens.
    fn tree_split_at(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        at: u32,
    ) -> Result<()> {
        let Some(x) = st.extents.as_ref().unwrap().lookup(at) else {
            return Ok(());
        };
        if x.lblk == at {
            return Ok(());
        }
        let head = (at - x.lblk) as u64;
        let parts = vec![
            Extent {
                len: head as u32,
                ..x
            },
            Extent {
                lblk: at,
                len: x.len - head as u32,
                pblk: x.pblk + head,
                unwritten: x.unwritten,
            },
        ];
        self.leaf_edit(h, ino, st, x.lblk, Some(x.lblk), parts)
    }

    /// Moves every extent that starts at or past logical block `from` by `delta` blocks,
    /// in the tree and the cache. Moving down (a collapse), `[from + delta, from)` is
    /// empty; moving up (an insert), no extent straddles `from`.
    fn tree_shift(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        from: u32,
        delta: i64,
    ) -> Result<()> {
        self.shift_node(h, ino, st, Node::Root, from, delta, 0)?;
        let cache = &mut st.extents.as_mut().unwrap().map;
        let moved: Vec<Extent> = cache.range(from..).map(|(_, x)| *x).collect();
        for x in &moved {
            cache.remove(&x.lblk);
        }
        for x in moved {
            let lblk = (x.lblk as i64 + delta) as u32;
            cache.insert(lblk, Extent { lblk, ..x });
        }
        Ok(())
    }

    /// Shifts one node's entries and, below an index entry, its child's. An index key in
    /// the emptied range of a collapse becomes the range's start: its subtree holds only
    /// extents past the range, so any key between the previous subtree's and theirs is
    /// right.
    #[allow(clippy::too_many_arguments)]
    fn shift_node(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        node: Node,
        from: u32,
        delta: i64,
        level: usize,
    ) -> Result<()> {
        if level > crate::format::extent::MAX_DEPTH as usize {
            let b = if let Node::Block(b) = node { b } else { 0 };
            return Err(self.corrupt(ino, b, "tree deeper than the maximum".into()));
        }
        let (hdr, mut entries) = self.read_node(st, node)?;
        let dest = (from as i64 + delta) as u32;
        let moved = |k: u32| (k as i64 + delta) as u32;
        let mut changed = false;
        for i in 0..entries.len() {
            let k = key(&entries[i]);
            if hdr.depth == 0 {
                if k >= from {
                    let x = Extent::read(&entries[i]);
                    entries[i] = leaf_entry(&Extent {
                        lblk: moved(k),
                        ..x
                    });
                    changed = true;
                }
                continue;
            }
            let next = entries.get(i + 1).map_or(MAX_BLOCKS, |e| key(e) as u64);
            let child = ExtentIdx::read(&entries[i]).leaf;
            if next > from as u64 {
                self.shift_node(h, ino, st, Node::Block(child), from, delta, level + 1)?;
            }
            let nk = if k >= from {
                moved(k)
            } else if delta < 0 && k > dest {
                dest
            } else {
                k
            };
            if nk != k {
                entries[i] = index_entry(nk, child);
                changed = true;
            }
        }
        if changed {
            if let Node::Block(_) = node {
                h.extend(1);
            }
            self.write_node(h, ino, st, node, hdr.depth, &entries, false)?;
        }
        Ok(())
    }
}
