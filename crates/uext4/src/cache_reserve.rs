//! The space a FUSE mount keeps for the kernel's write-back cache.
//!
//! With FUSE_WRITEBACK_CACHE the kernel answers write(2) from its page cache and sends the
//! data later, as WRITE requests flagged FUSE_WRITE_CACHE; an allocation failing then could
//! only be reported at fsync or close. The server therefore holds back a reserve at least as
//! large as the dirty data the kernel may hold for the mount (its FUSE bdi is capped; see
//! docs/DESIGN.md), counts it as used in statfs, and lets only those cached writes' writeback
//! allocate from it. Every other allocation (a direct or write-through write, fallocate, a new
//! directory block, an xattr block) sees the free space less the reserve, as allocations
//! other than writeback's already see it less delayed-allocation reservations. The adapter
//! refuses new cached writes once the space outside the reserve is gone
//! (`cache_reserve_exhausted`), so the data the kernel already cached always fits.

use crate::fs::Fs;
use std::cell::Cell;
use std::sync::atomic::Ordering;

thread_local! {
    /// This thread is writing back data the kernel cached: its allocations may take the
    /// reserve.
    static IN_CACHE_WRITEBACK: Cell<bool> = const { Cell::new(false) };
}

impl Fs {
    /// Holds back `blocks` for the kernel's cached writes (0: none).
    pub fn set_cache_reserve(&self, blocks: u64) {
        self.delalloc.cache_reserve.store(blocks, Ordering::Relaxed);
    }

    /// The blocks held back for the kernel's cached writes.
    pub fn cache_reserve(&self) -> u64 {
        self.delalloc.cache_reserve.load(Ordering::Relaxed)
    }

    /// Runs `f` (the writeback of data the kernel cached) with the reserve open to its
    /// allocations.
    pub fn cache_writeback<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Puts the flag back however `f` ends: a request's panic is caught and its thread
        /// serves on, and must not keep the reserve open.
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                IN_CACHE_WRITEBACK.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(IN_CACHE_WRITEBACK.with(|c| c.replace(true)));
        f()
    }

    /// Free blocks outside the reserve (and outside delayed-allocation reservations): what a
    /// new cached write may still count on.
    pub fn free_beyond_cache_reserve(&self) -> u64 {
        self.sb
            .free_blocks
            .load(Ordering::Relaxed)
            .saturating_sub(self.delalloc_held_blocks() + self.cache_reserve())
    }

    /// The reserve this thread's allocations must leave alone: none inside
    /// `cache_writeback`.
    pub(crate) fn cache_reserve_held(&self) -> u64 {
        if IN_CACHE_WRITEBACK.with(|c| c.get()) {
            0
        } else {
            self.cache_reserve()
        }
    }
}
