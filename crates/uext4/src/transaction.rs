//! Transactions and handles: every metadata change goes through one.
//!
//! A [`Handle`] is started before a metadata change and stopped (dropped) after it. While any
//! handle is open the running transaction cannot commit: handles hold `TxnManager::barrier`
//! shared, and a commit takes it exclusively only for as long as it needs to snapshot the
//! transaction's blocks (a memory copy), then lets the next transaction start while it writes
//! the snapshot to the journal and then to the blocks' home locations.
//!
//! Rules: a thread never starts a handle while it holds one (a commit waiting for the barrier
//! would deadlock it), nor starts one or waits for a commit or a checkpoint while it holds an
//! inode `state` mutex, a group lock or any leaf lock (a commit takes the barrier, then inode
//! state for lazy timestamps: docs/ARCHITECTURE.md, Locking). Buffers are changed under their
//! own write lock and then passed to `Handle::dirty`. Inodes whose only change is a timestamp
//! (the overwrite path, DESIGN.md R1) are not logged through a handle: they are put on the
//! running transaction's dirty-inode list with `TxnManager::dirty_inode_lazily` and copied
//! into their inode-table block at commit.

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
    /// Transactions larger than the whole log, written home without the journal (not
    /// atomic: a crash during one needs e2fsck). Large removals and allocations are split
    /// into handles that fit, so this stays 0; it is counted to show it.
    pub unjournaled_commits: AtomicU64,
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
    /// Serialises commits; holds the tid of the last transaction fully committed. Taken only
    /// with `try_lock` (see `Fs::commit_upto`): a thread that finds it held waits on
    /// `commit_gen` instead of queueing on the mutex.
    pub(crate) commit_lock: Mutex<u64>,
    /// Raised each time `commit_lock` is released; the threads waiting for a commit park on
    /// its address and are all woken at once (`CommitLockGuard`'s drop).
    pub(crate) commit_gen: AtomicU64,
    /// The last committed tid, readable without the lock (fsync's fast path).
    pub(crate) committed: AtomicU64,
    /// The running transaction's tid, readable without a lock (the overwrite path's check).
    pub(crate) running_tid: AtomicU64,
    /// Commit when the running transaction holds this many blocks (a quarter of the journal).
    pub(crate) max_blocks: std::sync::atomic::AtomicUsize,
    /// Set when a transaction could not be committed (its changes were taken out of the
    /// running transaction and are not on disk): every later commit fails with it, so no
    /// fsync reports success for changes that may depend on the lost ones.
    pub(crate) lost: std::sync::OnceLock<String>,
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
            commit_gen: AtomicU64::new(0),
            committed: AtomicU64::new(first_tid.saturating_sub(1)),
            running_tid: AtomicU64::new(first_tid),
            max_blocks: std::sync::atomic::AtomicUsize::new(max_blocks.max(16)),
            lost: std::sync::OnceLock::new(),
            stats: TxnStats::default(),
        }
    }

    pub fn running_tid(&self) -> u64 {
        self.running.lock().tid
    }
    pub fn committed_tid(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Sleeps until `commit_lock` has been released since `commit_gen` read `seen` (at once if
    /// it already has).
    fn wait_commit_released(&self, seen: u64) {
        let key = &self.commit_gen as *const AtomicU64 as usize;
        // SAFETY: the key is this manager's own address, used only by this function and
        // `CommitLockGuard::drop`; the callbacks neither panic nor call into parking_lot.
        unsafe {
            parking_lot_core::park(
                key,
                || self.commit_gen.load(Ordering::Acquire) == seen,
                || {},
                |_, _| {},
                parking_lot_core::DEFAULT_PARK_TOKEN,
                None,
            );
        }
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

/// `commit_lock` held by the committing thread. Dropping it releases the lock, then wakes
/// every thread waiting for a commit: each finds its transaction committed and returns, or
/// tries the lock to commit the next one itself.
///
/// Why not queue on the mutex: its waiters were woken one at a time, each by the one before
/// as it let the lock go, so the hundreds of fsyncs that one commit had made durable returned
/// in a chain of hand-offs, one wake-up and context switch each. Seed 004 in-process on 2
/// cores, binaries alternated, two rounds: 64 jobs 185k/220k IOPS queued on the mutex
/// against 247k/277k woken at once, 256 jobs 177k/214k against 214k/252k.
struct CommitLockGuard<'a> {
    guard: Option<parking_lot::MutexGuard<'a, u64>>,
    txn: &'a TxnManager,
}

impl Drop for CommitLockGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.txn.commit_gen.fetch_add(1, Ordering::AcqRel);
        let key = &self.txn.commit_gen as *const AtomicU64 as usize;
        // SAFETY: as in `TxnManager::wait_commit_released`.
        unsafe {
            parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN);
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

    /// Commits if transaction `tid` (or an earlier one) is not yet committed. A caller that
    /// finds another thread committing waits for it, then returns if that commit covered
    /// `tid`, else commits (with every change made meanwhile: group commit).
    pub fn commit_upto(&self, tid: u64) -> crate::Result<()> {
        loop {
            if self.txn.committed_tid() >= tid {
                self.txn
                    .stats
                    .fsync_already_committed
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let seen = self.txn.commit_gen.load(Ordering::Acquire);
            if let Some(guard) = self.txn.commit_lock.try_lock() {
                let mut held = CommitLockGuard {
                    guard: Some(guard),
                    txn: &self.txn,
                };
                let committed = held.guard.as_mut().expect("held until dropped");
                return self.commit_locked(committed, tid);
            }
            self.txn.wait_commit_released(seen);
        }
    }

    /// `commit_upto` with the commit lock held (`committed`: the last committed tid).
    fn commit_locked(&self, committed: &mut u64, tid: u64) -> crate::Result<()> {
        if *committed >= tid {
            self.txn
                .stats
                .fsync_already_committed
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if let Some(why) = self.txn.lost.get() {
            return Err(crate::Error::Stopped(why.clone()));
        }
        if self.is_read_only() {
            return Ok(());
        }
        let guard;
        let (this_tid, snapshot, revoked, pins) = {
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
            let tid = old.tid;
            // From here until it is committed the transaction exists nowhere else: a panic
            // on the way loses it as surely as an error does.
            guard = LostOnPanic { fs: self, tid };
            self.snapshot_for_commit(old)
                .map_err(|e| self.commit_failed(tid, e))?
        };
        self.txn.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.txn
            .stats
            .commit_blocks
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
        let blks: Vec<u64> = snapshot.iter().map(|s| s.0).collect();
        let queued = self
            .write_transaction(this_tid, snapshot, &revoked, pins)
            .map_err(|e| self.commit_failed(this_tid, e))?;
        *committed = this_tid;
        self.txn.committed.store(this_tid, Ordering::Release);
        std::mem::forget(guard);
        if !queued {
            self.release_pending_frees(this_tid);
        }
        // A block whose checkpoint is queued stays in the cache: the job holds a reference.
        for blk in blks {
            self.bcache.mark_clean_if_not_running(blk, &self.txn);
        }
        Ok(())
    }

    /// The contents a commit writes for the transaction `old`, just taken out of `running`
    /// (barrier held): its blocks, the inodes it changed lazily and the superblock, copied;
    /// its revoked blocks; and the buffers, pinned until the blocks are home.
    #[allow(clippy::type_complexity)]
    fn snapshot_for_commit(
        &self,
        old: RunningTxn,
    ) -> crate::Result<(u64, Vec<(u64, Vec<u8>)>, Vec<u64>, Vec<Arc<Buffer>>)> {
        let mut blocks = old.blocks;
        for ino in old.lazy_inodes {
            if let Some(buf) = self.write_inode_at_commit(ino)? {
                blocks.insert(buf.blk, buf);
            }
        }
        // The superblock carries the free counts; it goes with every commit.
        let now = self.now().sec as u32;
        let sb_buf = self.superblock_to_buffer(|sb| sb.set_wtime(now))?;
        blocks.insert(sb_buf.blk, sb_buf);
        let mut snap: Vec<(u64, Vec<u8>)> = blocks
            .values()
            .map(|b| (b.blk, b.read().to_vec()))
            .collect();
        snap.sort_unstable_by_key(|s| s.0);
        let revoked: Vec<u64> = old.revoked.into_iter().collect();
        let pins: Vec<Arc<Buffer>> = blocks.into_values().collect();
        Ok((old.tid, snap, revoked, pins))
    }

    /// A transaction taken out of `running` could not be made durable: its changes are in the
    /// cache only. The filesystem stops (as the kernel aborts its journal), and every later
    /// commit, fsync included, fails rather than report success for changes that may build on
    /// the lost ones. What earlier commits put in the journal stays there for recovery.
    fn commit_failed(&self, tid: u64, e: crate::Error) -> crate::Error {
        let why = format!("transaction {tid} could not be committed: {e}");
        tracing::error!("{why}");
        let _ = self.txn.lost.set(why.clone());
        self.stop(&why);
        if let Some(j) = self.journal.get() {
            j.abort(&why);
        }
        e
    }

    /// Makes a committed transaction durable: through the journal when there is one (its
    /// blocks then go home in the background: returns true, the checkpoint is queued), else
    /// straight at the blocks' home locations (returns false).
    fn write_transaction(
        &self,
        tid: u64,
        blocks: Vec<(u64, Vec<u8>)>,
        revoked: &[u64],
        pins: Vec<Arc<Buffer>>,
    ) -> crate::Result<bool> {
        // Data written by the operations in this transaction reached the device before their
        // metadata: the journal's flushes (or the flush below) order it ahead of the metadata.
        if let Some(j) = self.journal.get() {
            if j.fits(blocks.len(), revoked.len()) {
                let jtid = j.commit(tid, &blocks, revoked)?;
                self.ckpt.queue(CheckpointJob {
                    tid,
                    jtid,
                    blocks,
                    _pins: pins,
                });
                return Ok(true);
            }
            // Larger than the log can hold (one handle changed more blocks than a small
            // journal takes): written home directly, not atomically. First every queued
            // checkpoint goes home, so no older copy lands on top of these blocks, and the
            // journal is emptied on disk, so no recovery replays an older copy over them.
            self.txn
                .stats
                .unjournaled_commits
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "transaction {tid} of {} blocks does not fit the journal ({} blocks): \
                 writing it without the journal",
                blocks.len(),
                j.log_len()
            );
            self.checkpoint_drain()?;
            j.set_clean()?;
        }
        self.dev.flush()?;
        let bs = self.geo.block_size as u64;
        for (blk, data) in &blocks {
            self.dev.write_at(blk * bs, data)?;
        }
        self.dev.flush()?;
        Ok(false)
    }

    /// Waits until every committed transaction is home (unmount, sync, a write that bypasses
    /// the journal). Fails if a background checkpoint failed.
    pub(crate) fn checkpoint_drain(&self) -> crate::Result<()> {
        let mut s = self.ckpt.state.lock();
        // After a failure nothing more goes home (and the thread may be gone): stop waiting.
        while (!s.jobs.is_empty() || s.busy) && s.error.is_none() {
            // Again each round: transactions committed meanwhile must not wait for a batch.
            s.urgent = true;
            self.ckpt.work.notify_one();
            self.ckpt.done.wait(&mut s);
        }
        match &s.error {
            Some(e) => Err(crate::Error::Stopped(e.clone())),
            None => Ok(()),
        }
    }

    /// Writes a batch of committed transactions home: the newest copy of each block once, one
    /// flush, then the log space and the blocks they freed are released.
    fn checkpoint_batch(&self, batch: &[CheckpointJob]) -> crate::Result<()> {
        let Some(last) = batch.last() else {
            return Ok(());
        };
        let mut newest: std::collections::BTreeMap<u64, &[u8]> = Default::default();
        for job in batch {
            for (blk, data) in &job.blocks {
                newest.insert(*blk, data);
            }
        }
        let bs = self.geo.block_size as u64;
        for (blk, data) in newest {
            self.dev.write_at(blk * bs, data)?;
        }
        self.dev.flush()?;
        if let Some(j) = self.journal.get() {
            j.checkpointed(last.jtid);
        }
        // Blocks freed by these transactions may be reused now: no queued checkpoint can still
        // write an old copy over them (the queue is in commit order).
        self.release_pending_frees(last.tid);
        self.ckpt.batches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits everything and marks the filesystem clean. The `Fs` stays usable.
    pub fn sync(&self) -> crate::Result<()> {
        self.delalloc_writeback_all()?;
        self.commit()?;
        self.checkpoint_drain()
    }

    /// Commits everything, marks the superblock clean and flushes. Call before dropping the last
    /// reference when the image is to be left clean.
    pub fn unmount(&self) -> crate::Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.delalloc_writeback_all()?;
        self.commit()?;
        self.checkpoint_drain()?;
        if let Some(j) = self.journal.get() {
            j.set_clean()?;
        }
        use crate::format::superblock::{STATE_VALID, SUPERBLOCK_OFFSET};
        let stopped = self.sb.is_stopped();
        let bytes = self.sb.encode(true, |sb| {
            let f = sb.feature_incompat() & !crate::format::features::INCOMPAT_RECOVER;
            sb.set_feature_incompat(f);
            if !stopped {
                let v = sb.state() | STATE_VALID;
                sb.set_state(v);
            }
        });
        self.dev.write_at(SUPERBLOCK_OFFSET, &bytes)?;
        self.dev.flush()?;
        let (blk, _) = crate::super_info::superblock_location(self.geo.block_size);
        self.bcache.forget(blk);
        if let Some(m) = &*self.mmp.lock() {
            m.release()?;
        }
        self.sb.set_read_only();
        // Nothing more is written: another writer may have the image now.
        self.claim.lock().take();
        Ok(())
    }
}

/// One committed transaction whose blocks are in the journal but not yet home.
pub(crate) struct CheckpointJob {
    tid: u64,
    /// Its jbd2 transaction id.
    jtid: u32,
    blocks: Vec<(u64, Vec<u8>)>,
    /// The buffers stay cached until their blocks are home, so a cache miss never reads an
    /// older copy from the device.
    _pins: Vec<Arc<Buffer>>,
}

#[derive(Default)]
struct CheckpointState {
    jobs: std::collections::VecDeque<CheckpointJob>,
    /// The thread is writing a batch it took from `jobs`.
    busy: bool,
    /// A checkpoint write failed: the filesystem stops, and drains report it.
    error: Option<String>,
    /// Someone waits for checkpoint progress (a drain, a commit short of log space): write
    /// home now instead of waiting for more commits to batch.
    urgent: bool,
    /// Batches not written home (a write failed, or the journal aborted): their buffers stay
    /// pinned in the cache, which holds the only current copy of those blocks until the
    /// filesystem goes (recovery then replays them from the log).
    abandoned: Vec<CheckpointJob>,
}

/// How long the checkpointer lets committed transactions gather before writing them home,
/// unless the log fills past `CHECKPOINT_LOG_FRACTION` or someone waits: a block that many
/// commits rewrite (an extent leaf, an inode table block) then goes home once per batch, with
/// one flush, instead of once per commit.
const CHECKPOINT_BATCH_DELAY: std::time::Duration = std::time::Duration::from_millis(50);
/// The share of the log (1/n) in use above which the checkpointer writes home at once.
const CHECKPOINT_LOG_FRACTION: u32 = 4;

/// Background checkpointing (issue: "checkpointing in the background, ahead of need"): a commit
/// queues its transaction and returns once it is in the journal; one thread per filesystem
/// writes queued transactions home in commit order and releases their log space. A commit that
/// finds the log full waits for this progress only (counted in `log_space_waits`).
#[derive(Default)]
pub(crate) struct Checkpointer {
    state: Mutex<CheckpointState>,
    work: parking_lot::Condvar,
    done: parking_lot::Condvar,
    /// Batches written home.
    pub(crate) batches: AtomicU64,
}

impl Checkpointer {
    fn queue(&self, job: CheckpointJob) {
        self.state.lock().jobs.push_back(job);
        self.work.notify_one();
    }

    /// Asks for queued transactions to go home now (a commit is waiting for log space).
    pub(crate) fn hurry(&self) {
        self.state.lock().urgent = true;
        self.work.notify_one();
    }
}

/// Whether `fs`'s log is filling: more than 1/`CHECKPOINT_LOG_FRACTION` of it in use.
fn log_filling(fs: &std::sync::Weak<crate::fs::Fs>) -> bool {
    let Some(fs) = fs.upgrade() else {
        return true;
    };
    match fs.journal.get() {
        Some(j) => {
            let len = j.log_len();
            len - j.free_blocks().min(len) > len / CHECKPOINT_LOG_FRACTION
        }
        None => true,
    }
}

/// Starts the checkpoint thread of `fs`. It holds the filesystem only while it writes a batch;
/// when the filesystem is dropped without unmount (a crash, in tests), queued checkpoints are
/// abandoned, as a crash would: recovery replays them from the journal.
pub(crate) fn spawn_checkpointer(
    fs: std::sync::Weak<crate::fs::Fs>,
    ckpt: Arc<Checkpointer>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("uext4-checkpoint".into())
        .spawn(move || {
            let _exit = CheckpointerExit {
                fs: fs.clone(),
                ckpt: ckpt.clone(),
            };
            checkpointer_loop(fs, ckpt)
        })
        .map(|_| ())
}

/// The checkpoint thread's work: batches of committed transactions written home, until the
/// filesystem goes.
fn checkpointer_loop(fs: std::sync::Weak<crate::fs::Fs>, ckpt: Arc<Checkpointer>) {
    loop {
        let batch: Vec<CheckpointJob> = {
            let mut s = ckpt.state.lock();
            while s.jobs.is_empty() {
                let idle = ckpt
                    .work
                    .wait_for(&mut s, std::time::Duration::from_millis(200))
                    .timed_out();
                if idle && fs.strong_count() == 0 {
                    return;
                }
            }
            // Let more commits join the batch, unless someone waits or the log fills.
            let until = std::time::Instant::now() + CHECKPOINT_BATCH_DELAY;
            while !s.urgent && fs.strong_count() > 0 {
                if parking_lot::MutexGuard::unlocked(&mut s, || log_filling(&fs)) {
                    break;
                }
                // A hurry() while the lock was let go above notified no one: look again.
                if s.urgent || ckpt.work.wait_until(&mut s, until).timed_out() {
                    break;
                }
            }
            s.urgent = false;
            s.busy = true;
            s.jobs.drain(..).collect()
        };
        let r = match fs.upgrade() {
            Some(f) if f.journal.get().is_some_and(|j| j.is_aborted()) => {
                // After an abort nothing more goes home: the log keeps every committed
                // transaction, and recovery replays them in order (as the kernel leaves
                // an aborted journal).
                Err(crate::Error::Stopped("journal aborted".into()))
            }
            Some(f) => {
                // A panic here must not leave `busy` set: drains would wait forever.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    f.checkpoint_batch(&batch)
                }))
                .unwrap_or_else(|_| {
                    Err(crate::Error::Stopped(
                        "the checkpoint thread panicked".into(),
                    ))
                });
                if let Err(e) = &r {
                    // Nothing more may be committed: a later transaction's blocks could
                    // go home while these did not, and the log cannot be freed.
                    let why = format!("checkpoint failed: {e}");
                    f.stop(&why);
                    if let Some(j) = f.journal.get() {
                        j.abort(&why);
                    }
                }
                r
            }
            None => Ok(()),
        };
        let mut s = ckpt.state.lock();
        s.busy = false;
        match r {
            Ok(()) => drop(batch),
            Err(e) => {
                s.error.get_or_insert(e.to_string());
                s.abandoned.extend(batch);
            }
        }
        ckpt.done.notify_all();
    }
}

/// Should the checkpoint thread die of a panic outside a batch (inside one it is caught), the
/// journal aborts and drains fail, rather than commits waiting for log space forever.
struct CheckpointerExit {
    fs: std::sync::Weak<crate::fs::Fs>,
    ckpt: Arc<Checkpointer>,
}

impl Drop for CheckpointerExit {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let why = "the checkpoint thread panicked";
        if let Some(f) = self.fs.upgrade() {
            f.stop(why);
            if let Some(j) = f.journal.get() {
                j.abort(why);
            }
        }
        let mut s = self.ckpt.state.lock();
        s.busy = false;
        s.error.get_or_insert(why.to_string());
        drop(s);
        self.ckpt.done.notify_all();
    }
}

/// Marks a transaction lost if its commit unwinds (a panic) between taking it out of `running`
/// and recording it committed; forgotten once it is committed.
struct LostOnPanic<'a> {
    fs: &'a crate::fs::Fs,
    tid: u64,
}

impl Drop for LostOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let e = crate::Error::Stopped("the commit panicked".into());
            self.fs.commit_failed(self.tid, e);
        } else if self.fs.txn.lost.get().is_none() {
            // Dropped on an error return: commit_failed has already run for it.
            debug_assert!(false, "transaction {} neither committed nor lost", self.tid);
        }
    }
}
