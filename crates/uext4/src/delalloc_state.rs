//! Buffered mode's state (the write-back cache, delalloc.rs): an inode's dirty pages and
//! the filesystem-wide registry of the inodes that hold them, with their memory and space.

use crate::mballoc::Claim;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One cached block of file data.
pub struct Page {
    pub data: Box<[u8]>,
    /// This page holds one block of the space reservation (it lies over a hole).
    pub(crate) reserved: bool,
    /// Its writeback changes the mapping (it lies over a hole or an unwritten extent).
    pub(crate) maps: bool,
    /// It changes the mapping inside the mapped range, not past its end: its extents may go
    /// into any existing leaf, not only the last.
    pub(crate) inner: bool,
}

/// An inode's dirty pages and the size its on-disk data backs.
pub struct Dirty {
    /// Logical block number -> page.
    pub pages: BTreeMap<u64, Page>,
    /// i_size as stored on disk: the in-memory size less what only the pages hold.
    pub disk_size: u64,
    /// Writeback is running: the ordinary write path it calls keeps the file's times.
    pub(crate) in_writeback: bool,
    /// While a run is written back: its reservation, which the allocations for this inode
    /// (its data and its mapping blocks) take from (`InodeState::writeback_claim`).
    pub(crate) claim: Option<Claim>,
    /// Pages whose writeback changes the mapping (`Page::maps`), and of them those inside the
    /// mapped range (`Page::inner`).
    pub(crate) maps: u64,
    pub(crate) inner: u64,
    /// Pages that hold a block of the space reservation (`Page::reserved`): counted in the
    /// file's st_blocks, as the kernel's ext4 counts its delayed-allocation reservations.
    pub(crate) reserved: u64,
    /// Mapping blocks reserved for this inode's writeback (in `Registry::md_reserved`).
    pub(crate) md: u64,
}

impl Dirty {
    pub(crate) fn overlaps(&self, first: u64, last: u64) -> bool {
        self.pages.range(first..=last).next().is_some()
    }

    /// Counts a page coming into the cache.
    pub(crate) fn count_in(&mut self, p: &Page) {
        self.maps += p.maps as u64;
        self.inner += p.inner as u64;
        self.reserved += p.reserved as u64;
    }

    /// Blocks the cached pages will take when written back (over holes), not yet allocated.
    pub(crate) fn reserved_blocks(&self) -> u64 {
        self.reserved
    }

    /// Counts a page leaving the cache.
    pub(crate) fn count_out(&mut self, p: &Page) {
        self.maps -= p.maps as u64;
        self.inner -= p.inner as u64;
        self.reserved -= p.reserved as u64;
    }

    /// The first and last logical block that has a page ((0, 0) when none has).
    pub(crate) fn span(&self) -> (u64, u64) {
        let first = self.pages.first_key_value().map_or(0, |(&l, _)| l);
        let last = self.pages.last_key_value().map_or(0, |(&l, _)| l);
        (first, last)
    }
}

/// The filesystem-wide side: which inodes hold pages, how much memory and space they take.
/// Generic over the inode reference it keeps (`InodeRef`), so that this state knows nothing
/// of the inode cache.
pub struct Registry<I> {
    pub(crate) inodes: parking_lot::Mutex<HashMap<u32, I>>,
    /// Bytes held in pages, all inodes.
    pub bytes: AtomicU64,
    /// Blocks reserved by pages over holes, all inodes (shared with writeback `Claim`s).
    pub reserved: Arc<AtomicU64>,
    /// Extent-tree or indirect blocks reserved for writeback, all inodes.
    pub md_reserved: AtomicU64,
    /// Runs written back (each one allocation and one handle at most).
    pub writeback_runs: AtomicU64,
    /// Blocks held back for the kernel's cached writes (a FUSE mount with writeback_cache).
    pub cache_reserve: AtomicU64,
}

impl<I> Default for Registry<I> {
    fn default() -> Self {
        Registry {
            inodes: Default::default(),
            bytes: Default::default(),
            reserved: Default::default(),
            md_reserved: Default::default(),
            writeback_runs: Default::default(),
            cache_reserve: Default::default(),
        }
    }
}

impl<I> Registry<I> {
    /// Gives back the memory and the space reservation of pages leaving the cache (`per_page`
    /// blocks each reserved one holds), less `claimed` reserved blocks that their writeback's
    /// allocations took already.
    pub(crate) fn release<'a>(
        &self,
        pages: impl Iterator<Item = &'a Page>,
        bs: u64,
        per_page: u64,
        claimed: u64,
    ) {
        let (mut n, mut reserved) = (0u64, 0u64);
        for p in pages {
            n += 1;
            reserved += p.reserved as u64 * per_page;
        }
        self.bytes.fetch_sub(n * bs, Ordering::Relaxed);
        self.reserved
            .fetch_sub(reserved - claimed.min(reserved), Ordering::Relaxed);
    }
}
