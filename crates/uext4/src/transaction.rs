//! Transactions and handles: every metadata change goes through one.
//!
//! A [`Handle`] is started before a metadata change and stopped (dropped) after it. While any
//! handle is open the running transaction cannot commit: handles hold `TxnManager::barrier`
//! shared, and a commit takes it exclusively only for as long as it needs to snapshot the
//! transaction's blocks (a memory copy), then lets the next transaction start while it writes
//! the snapshot to the journal and then to the blocks' home locations.
//!
//! Rules: a thread never starts a handle while it holds one (a commit waiting for the barrier
//! would deadlock it); buffers are changed under their own write lock and then passed to
//! `Handle::dirty`. Inodes whose only change is a timestamp (the overwrite path, DESIGN.md R1)
//! are not logged through a handle: they are put on the running transaction's dirty-inode list
//! with `TxnManager::dirty_inode_lazily` and copied into their inode-table block at commit.

use crate::bcache::Buffer;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters exported through `uext4 stats`.
#[derive(Default, Debug)]
pub struct TxnStats {
    pub handles_started: AtomicU64,
    pub commits: AtomicU64,
    pub commit_blocks: AtomicU64,
    pub fsync_already_committed: AtomicU64,
    pub barrier_waits: AtomicU64,
}

/// What a running transaction collects.
#[derive(Default)]
pub struct RunningTxn {
    pub tid: u64,
    /// Metadata blocks changed, by block number.
    pub blocks: HashMap<u64, Arc<Buffer>>,
    /// Metadata blocks freed in this transaction: the journal must not replay older copies.
    pub revoked: HashSet<u64>,
    /// Inodes whose in-memory copy is newer than their inode-table block (lazy timestamps).
    pub lazy_inodes: HashSet<u32>,
}

pub struct TxnManager {
    /// Shared by open handles; exclusive while a commit snapshots the running transaction.
    pub(crate) barrier: RwLock<()>,
    /// The running transaction. Lock rank: after the barrier, after any buffer lock.
    pub(crate) running: Mutex<RunningTxn>,
    /// Serialises commits; holds the tid of the last transaction fully committed.
    pub(crate) commit_lock: Mutex<u64>,
    /// The last committed tid, readable without the lock (fsync's fast path).
    pub(crate) committed: AtomicU64,
    /// The running transaction's tid, readable without a lock (the overwrite path's check).
    pub(crate) running_tid: AtomicU64,
    /// Commit when the running transaction holds this many blocks (a quarter of the journal).
    pub(crate) max_blocks: std::sync::atomic::AtomicUsize,
    pub stats: TxnStats,
}

impl TxnManager {
    pub fn new(first_tid: u64, max_blocks: usize) -> Self {
        TxnManager {
            barrier: RwLock::new(()),
            running: Mutex::new(RunningTxn {
                tid: first_tid,
                ..Default::default()
            }),
            commit_lock: Mutex::new(first_tid.saturating_sub(1)),
            committed: AtomicU64::new(first_tid.saturating_sub(1)),
            running_tid: AtomicU64::new(first_tid),
            max_blocks: std::sync::atomic::AtomicUsize::new(max_blocks.max(16)),
            stats: TxnStats::default(),
        }
    }

    pub fn running_tid(&self) -> u64 {
        self.running.lock().tid
    }
    pub fn committed_tid(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }
    pub fn running_len(&self) -> usize {
        self.running.lock().blocks.len()
    }

    /// Starts a handle. `credits` is the most blocks the operation may dirty.
    pub fn start(&self, credits: usize) -> Handle<'_> {
        self.stats.handles_started.fetch_add(1, Ordering::Relaxed);
        let guard = match self.barrier.try_read() {
            Some(g) => g,
            None => {
                self.stats.barrier_waits.fetch_add(1, Ordering::Relaxed);
                self.barrier.read()
            }
        };
        let tid = self.running.lock().tid;
        Handle {
            mgr: self,
            _guard: guard,
            tid,
            blocks: Vec::new(),
            revoked: Vec::new(),
            credits,
        }
    }

    /// Records that inode `ino` changed only in memory; it is written at the next commit.
    pub fn dirty_inode_lazily(&self, ino: u32) -> u64 {
        let mut r = self.running.lock();
        r.lazy_inodes.insert(ino);
        r.tid
    }

    /// Whether the running transaction has grown past its size threshold.
    pub fn wants_commit(&self) -> bool {
        self.running.lock().blocks.len() >= self.max_blocks.load(Ordering::Relaxed)
    }
}

/// An open handle. Dropping it stops it: its blocks join the running transaction.
pub struct Handle<'a> {
    mgr: &'a TxnManager,
    _guard: RwLockReadGuard<'a, ()>,
    tid: u64,
    blocks: Vec<Arc<Buffer>>,
    revoked: Vec<u64>,
    credits: usize,
}

impl Handle<'_> {
    /// The transaction this handle belongs to.
    pub fn tid(&self) -> u64 {
        self.tid
    }
    /// Marks a changed metadata block for logging.
    pub fn dirty(&mut self, buf: &Arc<Buffer>) {
        if !self.blocks.iter().any(|b| b.blk == buf.blk) {
            buf.dirty.store(true, Ordering::Release);
            self.blocks.push(buf.clone());
            if self.blocks.len() > self.credits {
                tracing::debug!(
                    credits = self.credits,
                    used = self.blocks.len(),
                    "handle exceeded its credits"
                );
            }
        }
    }
    /// A metadata block was freed: the journal must not replay an older copy of it over data.
    pub fn revoke(&mut self, blk: u64) {
        self.revoked.push(blk);
    }
    /// Adds credits when an operation learns it needs more (e.g. an extent split).
    pub fn extend(&mut self, credits: usize) {
        self.credits += credits;
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        let mut r = self.mgr.running.lock();
        debug_assert_eq!(r.tid, self.tid);
        for b in self.blocks.drain(..) {
            r.revoked.remove(&b.blk);
            r.blocks.insert(b.blk, b);
        }
        for blk in self.revoked.drain(..) {
            r.blocks.remove(&blk);
            r.revoked.insert(blk);
        }
    }
}

impl crate::fs::Fs {
    /// Commits the running transaction: snapshots its blocks (with the barrier held, so no
    /// handle is half-way through a change), then writes them to the journal and home.
    /// Concurrent callers share one commit: a caller that finds its transaction already
    /// committed by another returns at once.
    pub fn commit(&self) -> crate::Result<()> {
        self.commit_upto(u64::MAX)
    }

    /// Commits if transaction `tid` (or an earlier one) is not yet committed.
    pub fn commit_upto(&self, tid: u64) -> crate::Result<()> {
        if self.txn.committed_tid() >= tid {
            self.txn
                .stats
                .fsync_already_committed
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let mut committed = self.txn.commit_lock.lock();
        if *committed >= tid {
            self.txn
                .stats
                .fsync_already_committed
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if self.is_read_only() {
            return Ok(());
        }
        let (this_tid, snapshot, revoked) = {
            let _barrier = self.txn.barrier.write();
            let old = {
                let mut r = self.txn.running.lock();
                if r.blocks.is_empty() && r.lazy_inodes.is_empty() && r.revoked.is_empty() {
                    return Ok(());
                }
                let next = RunningTxn {
                    tid: r.tid + 1,
                    ..Default::default()
                };
                self.txn.running_tid.store(r.tid + 1, Ordering::Release);
                std::mem::replace(&mut *r, next)
            };
            let mut blocks = old.blocks;
            for ino in old.lazy_inodes {
                if let Some(buf) = self.write_inode_at_commit(ino)? {
                    blocks.insert(buf.blk, buf);
                }
            }
            // The superblock carries the free counts; it goes with every commit.
            let sb_buf = self.superblock_buffer_for_commit()?;
            blocks.insert(sb_buf.blk, sb_buf);
            let mut snap: Vec<(u64, Vec<u8>)> = blocks
                .values()
                .map(|b| (b.blk, b.read().to_vec()))
                .collect();
            snap.sort_unstable_by_key(|s| s.0);
            let revoked: Vec<u64> = old.revoked.into_iter().collect();
            (old.tid, snap, revoked)
        };
        self.txn.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.txn
            .stats
            .commit_blocks
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
        self.write_transaction(this_tid, &snapshot, &revoked)?;
        *committed = this_tid;
        self.txn.committed.store(this_tid, Ordering::Release);
        self.release_pending_frees(this_tid);
        for (blk, _) in &snapshot {
            self.bcache.mark_clean_if_not_running(*blk, &self.txn);
        }
        Ok(())
    }

    /// Puts the superblock, with the current free counts, into its buffer (barrier held).
    fn superblock_buffer_for_commit(&self) -> crate::Result<std::sync::Arc<Buffer>> {
        use crate::format::superblock::SUPERBLOCK_SIZE;
        let bytes = {
            let mut sb = self.sb.lock();
            sb.set_free_blocks_count(self.free_blocks.load(Ordering::Relaxed));
            sb.set_free_inodes_count(self.free_inodes.load(Ordering::Relaxed) as u32);
            sb.set_wtime(crate::format::inode::Timestamp::now().sec as u32);
            sb.set_csum();
            sb.bytes().to_vec()
        };
        let (blk, off) = if self.geo.block_size == 1024 {
            (1u64, 0usize)
        } else {
            (0u64, 1024usize)
        };
        let buf = self.bcache.get(blk)?;
        buf.write()[off..off + SUPERBLOCK_SIZE].copy_from_slice(&bytes);
        Ok(buf)
    }

    /// Makes a committed transaction durable: through the journal when there is one, then at
    /// the blocks' home locations.
    fn write_transaction(
        &self,
        tid: u64,
        blocks: &[(u64, Vec<u8>)],
        revoked: &[u64],
    ) -> crate::Result<()> {
        // Data written by the operations in this transaction reached the device before their
        // metadata: the journal's flushes (or the flush below) order it ahead of the metadata.
        if let Some(j) = self.journal.get() {
            match j.commit(tid, blocks, revoked) {
                Ok(jtid) => {
                    let bs = self.geo.block_size as u64;
                    for (blk, data) in blocks {
                        self.dev.write_at(blk * bs, data)?;
                    }
                    self.dev.flush()?;
                    j.checkpointed(jtid);
                    return Ok(());
                }
                Err(crate::Error::Invalid(why)) => {
                    // Larger than the log can hold: written home directly (not atomic).
                    tracing::warn!("{why}: writing it without the journal");
                }
                Err(e) => return Err(e),
            }
        }
        self.dev.flush()?;
        let bs = self.geo.block_size as u64;
        for (blk, data) in blocks {
            self.dev.write_at(blk * bs, data)?;
        }
        self.dev.flush()?;
        Ok(())
    }

    /// Commits everything and marks the filesystem clean. The `Fs` stays usable.
    pub fn sync(&self) -> crate::Result<()> {
        self.delalloc_writeback_all()?;
        self.commit()
    }

    /// Commits everything, marks the superblock clean and flushes. Call before dropping the last
    /// reference when the image is to be left clean.
    pub fn unmount(&self) -> crate::Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.delalloc_writeback_all()?;
        self.commit()?;
        if let Some(j) = self.journal.get() {
            j.set_clean()?;
        }
        use crate::format::superblock::{STATE_VALID, SUPERBLOCK_OFFSET};
        let bytes = {
            let mut sb = self.sb.lock();
            let f = sb.feature_incompat() & !crate::format::features::INCOMPAT_RECOVER;
            sb.set_feature_incompat(f);
            if self.stopped.lock().is_none() {
                let v = sb.state() | STATE_VALID;
                sb.set_state(v);
            }
            sb.set_free_blocks_count(self.free_blocks.load(Ordering::Relaxed));
            sb.set_free_inodes_count(self.free_inodes.load(Ordering::Relaxed) as u32);
            sb.set_csum();
            sb.bytes().to_vec()
        };
        self.dev.write_at(SUPERBLOCK_OFFSET, &bytes)?;
        self.dev.flush()?;
        let (blk, _) = if self.geo.block_size == 1024 {
            (1u64, 0usize)
        } else {
            (0u64, 1024usize)
        };
        self.bcache.forget(blk);
        self.read_only.store(true, Ordering::Relaxed);
        Ok(())
    }
}
