//! Buffered mode: a write-back cache of file data with delayed allocation (ext4's "delalloc"),
//! for library users who write in small pieces (`MountOptions::buffered`).
//!
//! A write that is not a pure overwrite (it extends the file, fills a hole or an unwritten
//! extent, or touches a block already cached) copies its bytes into 1-block pages kept per
//! inode in [`Dirty`], and returns without allocating or starting a handle. Writeback (fsync,
//! the background committer before each periodic commit, the memory limit, truncate, fallocate,
//! lseek, sync, unmount) turns each run of consecutive dirty pages into one call of the ordinary
//! write path, which allocates the whole run at once, writes the data, and only then inserts
//! the extent (R4): a file written 4 KiB at a time gets one extent per run, not one per write.
//! Pure overwrites of written blocks still go straight to the device (R1), never through the
//! cache.
//!
//! Sizes: `raw.size()` in memory is the size users see; [`Dirty::disk_size`] is the size the
//! data on the device backs. An inode goes to the journal with the smaller one (see
//! `Fs::write_inode`), and writeback raises `disk_size` in the same handle as the extent of each
//! run. A crash therefore loses unflushed writes but never shows a file longer than its data.
//!
//! Space: every cached page over a hole reserves one block (a cluster with bigalloc:
//! `Fs::reserve_per_page`), and each inode with pages that
//! change its mapping (over holes or unwritten extents) reserves the extent-tree blocks (or,
//! for an indirect-mapped file, the indirect blocks) their writeback may need, counted for the
//! worst case (`Fs::map_md_need`). A write whose pages would reserve more than the free
//! blocks (less a small margin) first writes back, then fails with `Error::NoSpace`; rewriting
//! cached pages or mapped blocks needs no space. Allocations other than writeback's may not
//! take reserved blocks (`Fs::unreserved_blocks`), as the kernel keeps delalloc reservations
//! from other allocations, so writeback never finds the space it promised gone. Reservations
//! are released as writeback allocates: each run's reservation is a `mballoc::Claim`, kept on
//! the inode's dirty state while the run is written and handed to the allocator by the
//! allocations for that inode.
//!
//! Locking: pages change only with the inode's `io_lock` held exclusively (writes, writeback,
//! truncate); reads hold it shared and copy from the pages under `inode.state`. Writeback of
//! other inodes from inside a write only takes their `io_lock` with `try_write`, so two writers
//! never wait on each other's inode.

pub use crate::delalloc_state::{Dirty, Page};
use crate::error::{Error, Result};
use crate::format::inode::S_IFREG;
use crate::fs::Fs;
use crate::inode::{Inode, InodeRef, InodeState};
use crate::mballoc::Claim;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// Blocks kept free beyond the reservations (slack for the estimates).
const RESERVE_MARGIN_BLOCKS: u64 = 64;

/// Longest run of pages written back as one write (one allocation, one handle).
const WRITEBACK_RUN_BLOCKS: u64 = 8192;

impl Fs {
    /// Runs of cached pages written back so far (each one allocation and one handle at most).
    pub fn delalloc_writeback_runs(&self) -> u64 {
        self.delalloc.writeback_runs.load(Ordering::Relaxed)
    }

    /// Blocks a cached page over a hole reserves: one, or with bigalloc a whole cluster (its
    /// writeback may allocate one for it). The kernel reserves a cluster only for the first
    /// delayed block in each (ext4_insert_delayed_block); reserving per page promises more,
    /// never less, and a write that cannot reserve goes straight to the device instead.
    fn reserve_per_page(&self) -> u64 {
        1 << self.geo.cluster_bits
    }

    /// Whether writes go through the page cache (buffered mode, and not DAX).
    pub(crate) fn buffered(&self) -> bool {
        self.opts.buffered && !self.opts.dax
    }

    /// Blocks that cached pages hold for their writeback: data blocks for pages over holes
    /// and the mapping blocks their writeback may need.
    pub(crate) fn delalloc_held_blocks(&self) -> u64 {
        self.delalloc.reserved.load(Ordering::Relaxed)
            + self.delalloc.md_reserved.load(Ordering::Relaxed)
    }

    /// Blocks an allocation that is not a writeback's (which has a `Claim`) may take: the free
    /// ones less what cached pages hold and, while they hold any, the margin kept for the
    /// estimates, and less the kernel's write-cache reserve outside its writeback
    /// (`cache_reserve`; `u64::MAX` when neither applies).
    pub(crate) fn unreserved_blocks(&self) -> u64 {
        let cache = self.cache_reserve_held();
        if !self.buffered() && cache == 0 {
            return u64::MAX;
        }
        let held = match self.delalloc_held_blocks() {
            0 => 0,
            n => n + RESERVE_MARGIN_BLOCKS,
        };
        self.sb
            .free_blocks
            .load(Ordering::Relaxed)
            .saturating_sub(held + cache)
    }

    /// Sets the inode's mapping-block reservation to what its pages need now.
    fn delalloc_md_update(&self, st: &mut InodeState) {
        let (maps, inner, span, old) = match st.delalloc.as_ref() {
            Some(d) => (d.maps, d.inner, d.span(), d.md),
            None => return,
        };
        let need = self.map_md_need(st, maps, inner, span);
        if need >= old {
            self.delalloc
                .md_reserved
                .fetch_add(need - old, Ordering::Relaxed);
        } else {
            self.delalloc
                .md_reserved
                .fetch_sub(old - need, Ordering::Relaxed);
        }
        st.delalloc.as_mut().expect("checked above").md = need;
    }

    /// The inode has no pages left: its reservation goes, and it leaves the registry.
    fn delalloc_forget(&self, ino: u32, st: &mut InodeState) {
        if let Some(d) = st.delalloc.take() {
            self.delalloc.md_reserved.fetch_sub(d.md, Ordering::Relaxed);
        }
        self.delalloc.inodes.lock().remove(&ino);
    }

    /// The buffered write of `data` at `off`, `io_lock` held exclusively. Returns false, having
    /// done nothing, where the write is a pure overwrite that the direct path should take.
    pub(crate) fn delalloc_write(&self, inode: &InodeRef, off: u64, data: &[u8]) -> Result<bool> {
        let bs = self.geo.block_size as u64;
        let end = off + data.len() as u64;
        let (first, last) = (off / bs, (end - 1) / bs);
        // Room for the pages this write adds (memory) and the holes they cover (space); writing
        // back makes room and maps blocks, so the need is counted again after it.
        let mut wrote_back = false;
        loop {
            let (pages, holes, md_more) = {
                let mut st = inode.state.lock();
                if st.deleted {
                    return Err(Error::NotFound);
                }
                if st.raw.file_type() != S_IFREG {
                    return Ok(false);
                }
                let cached = st
                    .delalloc
                    .as_ref()
                    .is_some_and(|d| d.overlaps(first, last));
                if !cached && self.is_overwrite(inode.ino, &mut st, off, end)? {
                    return Ok(false);
                }
                let (pages, holes, maps, inner) =
                    self.new_pages(inode.ino, &mut st, first, last)?;
                if holes > 0 {
                    // The kernel reserves quota for delayed blocks at write time
                    // (dquot_reserve_block): the blocks this inode's pages already promised
                    // count as used.
                    let promised = st.delalloc.as_ref().map_or(0, |d| d.reserved) * bs;
                    let got =
                        self.quota_allow_blocks(inode.ino, &st.raw, holes as u32, promised)?;
                    if (got as u64) < holes {
                        return Err(Error::QuotaExceeded(format!("inode {}: space", inode.ino)));
                    }
                }
                // Only pages that change the mapping change the reservation.
                let md_more = if maps == 0 {
                    0
                } else {
                    let (had, had_inner, md, span) =
                        st.delalloc.as_ref().map_or((0, 0, 0, (first, last)), |d| {
                            (d.maps, d.inner, d.md, d.span())
                        });
                    let span = (span.0.min(first), span.1.max(last));
                    self.map_md_need(&st, had + maps, had_inner + inner, span)
                        .saturating_sub(md)
                };
                (pages, holes, md_more)
            };
            let (space_short, memory_over) =
                self.room_for(pages, holes * self.reserve_per_page() + md_more);
            if !space_short && (!memory_over || wrote_back) {
                break;
            }
            if wrote_back {
                return self.delalloc_no_room();
            }
            self.delalloc_writeback_locked(inode)?;
            self.delalloc_writeback_others(inode.ino);
            wrote_back = true;
        }
        let mut st = inode.state.lock();
        let st = &mut *st;
        let disk_size = st
            .delalloc
            .as_ref()
            .map(|d| d.disk_size)
            .unwrap_or(st.raw.size());
        // First the fallible part (mapping look-ups, device reads of partly covered blocks),
        // then the insertion, which cannot fail: an error leaves the cache and its counters as
        // they were.
        let mut fresh = Vec::new();
        let mapped_end = Self::mapped_end(st);
        for lblk in first..=last {
            if st
                .delalloc
                .as_ref()
                .is_some_and(|d| d.pages.contains_key(&lblk))
            {
                continue;
            }
            let bstart = lblk * bs;
            let whole = off <= bstart && end >= bstart + bs;
            let mut page = vec![0u8; bs as usize].into_boxed_slice();
            let m = self.ext_map(inode.ino, st, lblk as u32)?;
            if let Some(e) = m.filter(|e| !e.unwritten) {
                if !whole && bstart < disk_size {
                    let phys = (e.pblk + (lblk - e.lblk as u64)) * bs;
                    let n = bs.min(disk_size - bstart) as usize;
                    self.dev.read_at(phys, &mut page[..n])?;
                }
            }
            let maps = m.is_none_or(|e| e.unwritten);
            fresh.push((
                lblk,
                Page {
                    data: page,
                    reserved: m.is_none(),
                    maps,
                    inner: maps && lblk < mapped_end,
                },
            ));
        }
        let added = fresh.len() as u64 * bs;
        let reserved = fresh.iter().filter(|(_, p)| p.reserved).count() as u64;
        let maps = fresh.iter().filter(|(_, p)| p.maps).count() as u64;
        let d = st.delalloc.get_or_insert_with(|| {
            Box::new(Dirty {
                pages: BTreeMap::new(),
                disk_size,
                in_writeback: false,
                claim: None,
                maps: 0,
                inner: 0,
                reserved: 0,
                md: 0,
            })
        });
        for (lblk, p) in fresh {
            d.count_in(&p);
            d.pages.insert(lblk, p);
        }
        for lblk in first..=last {
            let bstart = lblk * bs;
            let from = off.max(bstart);
            let to = end.min(bstart + bs);
            let page = d.pages.get_mut(&lblk).expect("inserted above");
            page.data[(from - bstart) as usize..(to - bstart) as usize]
                .copy_from_slice(&data[(from - off) as usize..(to - off) as usize]);
        }
        if end > st.raw.size() {
            st.raw.set_size(end);
        }
        if maps > 0 {
            self.delalloc_md_update(st);
        }
        self.delalloc.bytes.fetch_add(added, Ordering::Relaxed);
        self.delalloc
            .reserved
            .fetch_add(reserved * self.reserve_per_page(), Ordering::Relaxed);
        if added > 0 {
            self.delalloc.inodes.lock().insert(inode.ino, inode.clone());
        }
        Ok(true)
    }

    /// What a buffered write does when its reservation does not fit even after the cache
    /// was written back: fails with NoSpace, or with bigalloc (where a cluster reserved per
    /// page over a hole promises more than writeback takes) goes straight to the device
    /// (Ok(false); the inode's pages are all written back now), which fails only when the
    /// space is really gone, as the kernel's ext4 stops delaying allocation when space runs
    /// low (ext4_nonda_switch).
    fn delalloc_no_room(&self) -> Result<bool> {
        if self.geo.cluster_bits > 0 {
            return Ok(false);
        }
        Err(Error::NoSpace)
    }

    /// Whether `[off, end)` lies inside the on-disk size on written blocks.
    fn is_overwrite(&self, ino: u32, st: &mut InodeState, off: u64, end: u64) -> Result<bool> {
        let bs = self.geo.block_size as u64;
        let disk_size = st
            .delalloc
            .as_ref()
            .map(|d| d.disk_size)
            .unwrap_or(st.raw.size());
        if end > disk_size {
            return Ok(false);
        }
        let mut lblk = off / bs;
        while lblk * bs < end {
            match self.ext_map(ino, st, lblk as u32)? {
                Some(e) if !e.unwritten => lblk = e.lblk as u64 + e.len as u64,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Where the file's mapping ends: past its last extent (0 without a cached mapping).
    fn mapped_end(st: &InodeState) -> u64 {
        st.extents
            .as_ref()
            .and_then(|c| c.map.last_key_value())
            .map_or(0, |(_, e)| e.end())
    }

    /// Of logical blocks `first..=last`, how many have no page yet, how many of those lie over
    /// a hole (each needs a block reserved), how many change the mapping when written back
    /// (over a hole or an unwritten extent), and how many of those lie inside the mapped range.
    fn new_pages(
        &self,
        ino: u32,
        st: &mut InodeState,
        first: u64,
        last: u64,
    ) -> Result<(u64, u64, u64, u64)> {
        let (mut pages, mut holes, mut maps, mut inner) = (0, 0, 0, 0);
        for lblk in first..=last {
            if st
                .delalloc
                .as_ref()
                .is_some_and(|d| d.pages.contains_key(&lblk))
            {
                continue;
            }
            pages += 1;
            let m = self.ext_map(ino, st, lblk as u32)?;
            holes += m.is_none() as u64;
            let changes = m.is_none_or(|e| e.unwritten);
            maps += changes as u64;
            // (ext_map has loaded the mapping.)
            inner += (changes && lblk < Self::mapped_end(st)) as u64;
        }
        Ok((pages, holes, maps, inner))
    }

    /// Whether `more` more reserved blocks would leave too little free space, and whether
    /// `pages` more pages would pass the memory limit.
    fn room_for(&self, pages: u64, more: u64) -> (bool, bool) {
        let bs = self.geo.block_size as u64;
        let free = self.sb.free_blocks.load(Ordering::Relaxed);
        // The kernel's cached writes keep their reserve from buffered writes too.
        let reserved = self.delalloc_held_blocks() + self.cache_reserve_held();
        let memory = self.delalloc.bytes.load(Ordering::Relaxed) + pages * bs;
        (
            more > 0 && free < reserved + more + RESERVE_MARGIN_BLOCKS,
            memory > self.opts.buffered_limit_bytes,
        )
    }

    /// Writes back every inode's pages but `skip`'s, skipping inodes whose lock is taken.
    fn delalloc_writeback_others(&self, skip: u32) {
        let list: Vec<InodeRef> = self.delalloc.inodes.lock().values().cloned().collect();
        for i in list.into_iter().filter(|i| i.ino != skip) {
            if let Some(_g) = i.io_lock.try_write() {
                if let Err(e) = self.delalloc_writeback_locked(&i) {
                    tracing::error!(ino = i.ino, "writeback: {e}");
                }
            }
        }
    }

    /// Writes back all pages of all inodes (sync, unmount, the background committer).
    pub fn delalloc_writeback_all(&self) -> Result<()> {
        let list: Vec<InodeRef> = self.delalloc.inodes.lock().values().cloned().collect();
        let mut first_err = None;
        for i in list {
            // Blocks freed by the running transaction count as free but are not allocatable
            // until it commits: a writeback that runs short commits and tries once more.
            let r = self.retry_nospace(|| {
                let _g = i.io_lock.write();
                self.delalloc_writeback_locked(&i)
            });
            if let Err(e) = r {
                tracing::error!(ino = i.ino, "writeback: {e}");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes back one inode's pages (fsync, fallocate, lseek), taking its `io_lock`.
    pub(crate) fn delalloc_writeback(&self, inode: &Inode) -> Result<()> {
        if inode.state.lock().delalloc.is_none() {
            return Ok(());
        }
        let _g = inode.io_lock.write();
        self.delalloc_writeback_locked(inode)
    }

    /// Writes back one inode's pages, `io_lock` held exclusively: each run of consecutive pages
    /// becomes one ordinary write (one allocation, extent and size change in its handle).
    pub(crate) fn delalloc_writeback_locked(&self, inode: &Inode) -> Result<()> {
        let bs = self.geo.block_size as u64;
        loop {
            let (start, buf, pages, mem_size) = {
                let mut st = inode.state.lock();
                let mem_size = st.raw.size();
                let Some(d) = st.delalloc.as_mut() else {
                    return Ok(());
                };
                let Some(&start) = d.pages.keys().next() else {
                    self.delalloc_forget(inode.ino, &mut st);
                    return Ok(());
                };
                let mut n = 0u64;
                while n < WRITEBACK_RUN_BLOCKS && d.pages.contains_key(&(start + n)) {
                    n += 1;
                }
                let mut buf = Vec::with_capacity((n * bs) as usize);
                let mut pages = Vec::with_capacity(n as usize);
                for l in start..start + n {
                    let p = d.pages.remove(&l).expect("counted above");
                    buf.extend_from_slice(&p.data);
                    d.count_out(&p);
                    pages.push((l, p));
                }
                d.in_writeback = true;
                (start, buf, pages, mem_size)
            };
            // The run may end past i_size (the last block is zero beyond it): the size is
            // clamped to i_size by the write path.
            let budget =
                pages.iter().filter(|(_, p)| p.reserved).count() as u64 * self.reserve_per_page();
            if let Some(d) = inode.state.lock().delalloc.as_mut() {
                d.claim = Some(Claim::new(budget, self.delalloc.reserved.clone()));
            }
            let r = self.write_new_blocks_locked(inode, start * bs, &buf, mem_size);
            let mut st = inode.state.lock();
            let mut claimed = 0;
            if let Some(d) = st.delalloc.as_mut() {
                d.in_writeback = false;
                claimed = d.claim.take().map_or(0, |c| c.claimed());
            }
            match r {
                Ok(()) => {
                    self.delalloc.release(
                        pages.iter().map(|(_, p)| p),
                        bs,
                        self.reserve_per_page(),
                        claimed,
                    );
                    self.delalloc_md_update(&mut st);
                    self.delalloc.writeback_runs.fetch_add(1, Ordering::Relaxed);
                    if self.delalloc_settle(inode, &mut st) {
                        // The handle comes before the inode's state lock (the lock ranking, docs/ARCHITECTURE.md).
                        drop(st);
                        let mut h = self.start(crate::transaction::credits::SETATTR)?;
                        let mut st = inode.state.lock();
                        self.fc_track(&mut h, inode.ino, &st, None);
                        self.mark_inode_dirty(&mut h, inode, &mut st)?;
                        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
                    }
                }
                Err(e) => {
                    // Keep the data for a later attempt (fsync reports the error now); its
                    // pages hold their reservation again.
                    self.delalloc.reserved.fetch_add(claimed, Ordering::Relaxed);
                    if let Some(d) = st.delalloc.as_mut() {
                        for (l, p) in pages {
                            d.count_in(&p);
                            d.pages.insert(l, p);
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// After a run: when no pages are left, the on-disk size becomes the in-memory one and the
    /// inode leaves the registry. Returns whether the inode must be logged (writeback left the
    /// on-disk size behind).
    fn delalloc_settle(&self, inode: &Inode, st: &mut InodeState) -> bool {
        let Some(d) = st.delalloc.as_ref() else {
            return false;
        };
        if !d.pages.is_empty() {
            return false;
        }
        let behind = d.disk_size < st.raw.size();
        self.delalloc_forget(inode.ino, st);
        behind
    }

    /// Drops the pages at or beyond byte `from` (truncate; all of them at deletion), releasing
    /// their memory and reservation. The block holding `from` keeps its bytes before `from`
    /// and is zeroed after. `io_lock` held exclusively (or the inode is being freed).
    pub(crate) fn delalloc_discard(&self, ino: u32, st: &mut InodeState, from: u64) {
        let bs = self.geo.block_size as u64;
        let Some(d) = st.delalloc.as_mut() else {
            return;
        };
        let first_whole = from.div_ceil(bs);
        let gone = d.pages.split_off(&first_whole);
        for p in gone.values() {
            d.count_out(p);
        }
        self.delalloc
            .release(gone.values(), bs, self.reserve_per_page(), 0);
        if !from.is_multiple_of(bs) {
            if let Some(p) = d.pages.get_mut(&(from / bs)) {
                p.data[(from % bs) as usize..].fill(0);
            }
        }
        d.disk_size = d.disk_size.min(from);
        if d.pages.is_empty() {
            self.delalloc_forget(ino, st);
        } else {
            self.delalloc_md_update(st);
        }
    }

    /// Copies the cached pages that overlap `[off, off+buf.len())` over `buf` (a read).
    pub(crate) fn delalloc_overlay(st: &InodeState, bs: u64, off: u64, buf: &mut [u8]) {
        let Some(d) = st.delalloc.as_ref() else {
            return;
        };
        let end = off + buf.len() as u64;
        for (&lblk, p) in d.pages.range(off / bs..=(end - 1) / bs) {
            let bstart = lblk * bs;
            let from = off.max(bstart);
            let to = end.min(bstart + bs);
            buf[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&p.data[(from - bstart) as usize..(to - bstart) as usize]);
        }
    }
}
