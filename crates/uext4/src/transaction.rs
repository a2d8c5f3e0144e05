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

use crate::bcache::{Buffer, BufferCache};
use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::journal::{FcBlocks, Journal};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters exported through `uext4 stats`.
#[derive(Default, Debug)]
pub struct TxnStats {
    /// Handles started (one per metadata-changing operation).
    pub handles_started: AtomicU64,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Blocks written to the journal by commits.
    pub commit_blocks: AtomicU64,
    /// fsyncs that found their transaction committed already.
    pub fsync_already_committed: AtomicU64,
    /// Waits for a transaction's handles to finish before it commits.
    pub barrier_waits: AtomicU64,
    /// Transactions larger than the whole log, written home without the journal (not
    /// atomic: a crash during one needs e2fsck). Large removals and allocations are split
    /// into handles that fit, so this stays 0; it is counted to show it.
    pub unjournaled_commits: AtomicU64,
    /// fsyncs answered by a fast commit (fast_commit/commit.rs) instead of a full one.
    pub fast_commits: AtomicU64,
    /// Blocks of the journal's fast-commit area those wrote.
    pub fast_commit_blocks: AtomicU64,
    /// fsyncs on a filesystem with fast commits that needed a full commit: the transaction
    /// held an ineligible change, or its records did not fit the area.
    pub fast_commit_fallbacks: AtomicU64,
}

/// What a fast commit must carry of the running transaction (the kernel's per-inode
/// i_fc_lblk_start/len and its ext4_fc_mark_ineligible): the changes that handles declared
/// eligible since the last full or fast commit. A handle that changed metadata without
/// declaring its change makes the whole transaction ineligible until it commits in full, so
/// that a change no record describes can never be left out of a fast commit.
#[derive(Default, Debug)]
pub struct FcTrack {
    /// Why the transaction cannot be fast-committed (the first reason).
    pub ineligible: Option<&'static str>,
    /// Inodes to log, each with the logical blocks `(first, last)` whose mapping changed
    /// (None: only the inode's fields did).
    pub inodes: BTreeMap<u32, Option<(u32, u32)>>,
    /// Directory entries made, in order (the kernel's s_fc_dentry_q).
    pub dentries: Vec<FcDentry>,
    /// Filled for a fast commit only: the running transaction's lazy inodes (a timestamp
    /// changed, no handle) not among `inodes`. Those records describe are logged; others
    /// (a directory's atime) are left to the next full commit, as the kernel's
    /// ext4_fc_track_inode leaves directories out.
    pub lazy: Vec<u32>,
}

/// A directory entry change a fast commit records (format::fast_commit's dentry tags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FcDentry {
    /// The record's tag: TAG_CREAT for a new inode's first name.
    pub tag: u16,
    /// The directory.
    pub parent: u32,
    /// The inode named.
    pub ino: u32,
    /// The name.
    pub name: Vec<u8>,
}

impl FcTrack {
    /// Adds inode `ino`, widening its range by `range`.
    pub fn add(&mut self, ino: u32, range: Option<(u32, u32)>) {
        let e = self.inodes.entry(ino).or_insert(None);
        *e = match (*e, range) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, None) => x,
            (None, y) => y,
        };
    }
}

/// A handle's declaration for fast commits.
#[derive(Default, Debug)]
enum HandleFc {
    /// Nothing declared: if the handle changes metadata, the transaction is ineligible.
    #[default]
    Undeclared,
    /// Its changes are described by these inodes' records.
    Eligible(FcTrack),
    /// It made a change fast commits cannot describe.
    Ineligible(&'static str),
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
    /// What a fast commit would have to write (fast_commit/commit.rs).
    pub fc: FcTrack,
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
    /// Handles' fast-commit declarations are collected (`start_fc_tracking`): only where
    /// fsync may write fast commits, so that other filesystems pay nothing for them.
    fc_tracking: std::sync::atomic::AtomicBool,
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
            fc_tracking: std::sync::atomic::AtomicBool::new(false),
            stats: TxnStats::default(),
        }
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
            fc: HandleFc::Undeclared,
        }
    }

    /// From now on handles' fast-commit declarations are collected. The running
    /// transaction, whose earlier changes nobody declared, must commit in full.
    pub fn start_fc_tracking(&self) {
        let mut r = self.running.lock();
        r.fc.ineligible = Some("changes made before fast commits were tracked");
        self.fc_tracking.store(true, Ordering::Release);
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
    fc: HandleFc,
}

impl Handle<'_> {
    /// Declares that this handle's change to inode `ino` is described by a fast commit of
    /// the inode's fields and of the mapping of logical blocks `range` (first, last; None
    /// when the mapping did not change). The caller has checked that the inode is one fast
    /// commits describe (fast_commit/commit.rs).
    pub fn fc_eligible(&mut self, ino: u32, range: Option<(u32, u32)>) {
        if !self.mgr.fc_tracking.load(Ordering::Relaxed) {
            return;
        }
        match &mut self.fc {
            HandleFc::Ineligible(_) => {}
            HandleFc::Eligible(t) => t.add(ino, range),
            f @ HandleFc::Undeclared => {
                let mut t = FcTrack::default();
                t.add(ino, range);
                *f = HandleFc::Eligible(t);
            }
        }
    }
    /// Whether fast-commit declarations are collected (`TxnManager::start_fc_tracking`).
    pub fn fc_tracked(&self) -> bool {
        self.mgr.fc_tracking.load(Ordering::Relaxed)
    }
    /// Declares that this handle made directory entry `d` (with `fc_eligible` for its inode).
    pub fn fc_dentry(&mut self, d: FcDentry) {
        if !self.mgr.fc_tracking.load(Ordering::Relaxed) {
            return;
        }
        match &mut self.fc {
            HandleFc::Ineligible(_) => {}
            HandleFc::Eligible(t) => t.dentries.push(d),
            f @ HandleFc::Undeclared => {
                *f = HandleFc::Eligible(FcTrack {
                    dentries: vec![d],
                    ..FcTrack::default()
                })
            }
        }
    }
    /// Declares that this handle's changes need no record of their own (freeing an inode
    /// whose last name an earlier record or the log already took: fast_commit/commit.rs's
    /// `fc_track_forget`). Changes nothing once the handle declared anything else.
    pub fn fc_no_record(&mut self) {
        if matches!(self.fc, HandleFc::Undeclared) && self.mgr.fc_tracking.load(Ordering::Relaxed) {
            self.fc = HandleFc::Eligible(FcTrack::default());
        }
    }
    /// Declares a change fast commits cannot describe: the running transaction must commit
    /// in full (the kernel's ext4_fc_mark_ineligible). Sticks, whatever is declared after.
    pub fn fc_ineligible(&mut self, why: &'static str) {
        if !matches!(self.fc, HandleFc::Ineligible(_)) {
            self.fc = HandleFc::Ineligible(why);
        }
    }
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
        let changed = !self.blocks.is_empty() || !self.revoked.is_empty();
        for b in self.blocks.drain(..) {
            r.revoked.remove(&b.blk);
            r.blocks.insert(b.blk, b);
        }
        for blk in self.revoked.drain(..) {
            r.blocks.remove(&blk);
            r.revoked.insert(blk);
        }
        if r.fc.ineligible.is_none() && self.mgr.fc_tracking.load(Ordering::Relaxed) {
            match std::mem::take(&mut self.fc) {
                HandleFc::Eligible(t) => {
                    for (ino, range) in t.inodes {
                        r.fc.add(ino, range);
                    }
                    r.fc.dentries.extend(t.dentries);
                }
                HandleFc::Ineligible(why) => r.fc.ineligible = Some(why),
                HandleFc::Undeclared if changed => {
                    r.fc.ineligible = Some("a change fast commits do not describe")
                }
                HandleFc::Undeclared => {}
            }
        }
    }
}

/// `commit_lock` held by the committing thread. Dropping it releases the lock, then wakes
/// every thread waiting for a commit: each finds its transaction committed and returns, or
/// tries the lock to commit the next one itself.
///
/// Why not queue on the mutex: its waiters were woken one at a time, each by the one before
/// as it let the lock go, so the hundreds of fsyncs that one commit had made durable returned
/// in a chain of hand-offs, one wake-up and context switch each (measurably slower on
/// fsync-randwrite-16k at 64 jobs and more).
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

/// What a commit needs from the filesystem it commits for, lent for the call.
pub trait CommitEnv {
    /// Nothing may be written: a commit does nothing.
    fn read_only(&self) -> bool;
    /// With the barrier held: adds to `blocks` the buffers that carry what changed outside
    /// handles (the inodes `lazy_inodes` names, the superblock with its free counts).
    fn add_unlogged(
        &self,
        lazy_inodes: HashSet<u32>,
        blocks: &mut HashMap<u64, Arc<Buffer>>,
    ) -> Result<()>;
    /// The journal, when there is one.
    fn journal(&self) -> Option<&Journal>;
    /// Where blocks go home without a journal.
    fn device(&self) -> &dyn BlockDevice;
    /// The buffer cache holding the transaction's blocks.
    fn bcache(&self) -> &BufferCache;
    /// Blocks that transactions up to `tid` freed may be reused: those are home.
    fn release_frees(&self, tid: u64);
    /// Nothing more may be written (a transaction was lost).
    fn stop(&self, why: &str);
}

/// What a fast commit needs from the filesystem (fast_commit/commit.rs).
pub trait FastCommitEnv {
    /// Whether a fast commit can be written now (the journal has an area, and its log on
    /// disk is one recovery reads: the kernel's "at least one full commit" rule).
    fn fc_ready(&self) -> bool;
    /// With the barrier held: the records for `track` (its inodes and entries), in the
    /// area's blocks, or None when they cannot be fast-committed (an inode of a kind the
    /// records do not describe, more records than the area has room for).
    fn fc_prepare(&self, track: &FcTrack) -> Result<Option<FcBlocks>>;
    /// Makes the data durable, then writes the blocks and makes them durable.
    fn fc_write(&self, p: FcBlocks) -> Result<()>;
    /// Makes the data durable (nothing new to record).
    fn fc_flush(&self) -> Result<()>;
}

impl TxnManager {
    /// Commits if transaction `tid` (or an earlier one) is not yet committed: snapshots the
    /// running transaction's blocks (with the barrier held, so no handle is half-way through
    /// a change), then writes them to the journal and queues them to go home. A caller that
    /// finds another thread committing waits for it, then returns if that commit covered
    /// `tid`, else commits (with every change made meanwhile: group commit).
    pub fn commit_upto(&self, tid: u64, env: &dyn CommitEnv) -> Result<()> {
        self.commit_upto_with(tid, env, None)
    }

    /// As `commit_upto`, for an fsync on a filesystem that writes fast commits: with the
    /// commit lock held (so no full commit runs meanwhile, and the journal's next tid is the
    /// running transaction's), the running transaction's declared changes are written as a
    /// fast commit instead, unless it is ineligible (the kernel's ext4_fc_commit falls back
    /// to jbd2_complete_transaction the same way).
    pub fn fast_commit_upto(
        &self,
        tid: u64,
        env: &dyn CommitEnv,
        fc: &dyn FastCommitEnv,
    ) -> Result<()> {
        self.commit_upto_with(tid, env, Some(fc))
    }

    /// The commit loop of both: a fast commit first where `fc` is given and the transaction
    /// is eligible, a full commit otherwise.
    fn commit_upto_with(
        &self,
        tid: u64,
        env: &dyn CommitEnv,
        fc: Option<&dyn FastCommitEnv>,
    ) -> Result<()> {
        loop {
            if self.committed_tid() >= tid {
                self.stats
                    .fsync_already_committed
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let seen = self.commit_gen.load(Ordering::Acquire);
            if let Some(guard) = self.commit_lock.try_lock() {
                let mut held = CommitLockGuard {
                    guard: Some(guard),
                    txn: self,
                };
                let committed = held.guard.as_mut().expect("held until dropped");
                if let Some(fc) = fc {
                    if **committed < tid && self.lost.get().is_none() && !env.read_only() {
                        match self.try_fast_commit(fc) {
                            Ok(true) => return Ok(()),
                            Ok(false) => {}
                            Err(e) => {
                                tracing::warn!("fast commit failed, committing in full: {e}")
                            }
                        }
                        self.stats
                            .fast_commit_fallbacks
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
                return self.commit_locked(committed, tid, env);
            }
            self.wait_commit_released(seen);
        }
    }

    /// One fast commit, commit lock held: takes the declared changes out of the running
    /// transaction (barrier held, so no handle is half-way), has `fc` encode them, then write
    /// them. Returns false when the transaction must commit in full; the changes taken out
    /// are then marked ineligible, so that the full commit is what covers them.
    fn try_fast_commit(&self, fc: &dyn FastCommitEnv) -> Result<bool> {
        if !fc.fc_ready() {
            return Ok(false);
        }
        let prepared = {
            let _barrier = self.barrier.write();
            let track = {
                let mut r = self.running.lock();
                if r.fc.ineligible.is_some() || !r.revoked.is_empty() {
                    let why = r.fc.ineligible.unwrap_or("revoked blocks");
                    tracing::debug!(why, "no fast commit: the transaction commits in full");
                    return Ok(false);
                }
                let mut track = std::mem::take(&mut r.fc);
                // Lazy timestamps are not declared by a handle: each fast commit carries them.
                track.lazy = r
                    .lazy_inodes
                    .iter()
                    .copied()
                    .filter(|i| !track.inodes.contains_key(i))
                    .collect();
                track.lazy.sort_unstable();
                track
            };
            if track.inodes.is_empty() && track.dentries.is_empty() && track.lazy.is_empty() {
                // Every declared change is in the area already: only the data must be durable.
                drop(_barrier);
                fc.fc_flush()?;
                return Ok(true);
            }
            match fc.fc_prepare(&track) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    self.running.lock().fc.ineligible = Some("records the area cannot take");
                    return Ok(false);
                }
                Err(e) => {
                    self.running.lock().fc.ineligible = Some("records that failed to encode");
                    return Err(e);
                }
            }
        };
        let n = prepared.blocks.len() as u64;
        if let Err(e) = fc.fc_write(prepared) {
            self.running.lock().fc.ineligible = Some("a fast commit that failed to write");
            return Err(e);
        }
        self.stats.fast_commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .fast_commit_blocks
            .fetch_add(n, Ordering::Relaxed);
        Ok(true)
    }

    /// `commit_upto` with the commit lock held (`committed`: the last committed tid).
    fn commit_locked(&self, committed: &mut u64, tid: u64, env: &dyn CommitEnv) -> Result<()> {
        if *committed >= tid {
            self.stats
                .fsync_already_committed
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if let Some(why) = self.lost.get() {
            return Err(Error::Stopped(why.clone()));
        }
        if env.read_only() {
            return Ok(());
        }
        let guard;
        let (this_tid, snapshot, revoked, pins) = {
            let _barrier = self.barrier.write();
            let old = {
                let mut r = self.running.lock();
                if r.blocks.is_empty() && r.lazy_inodes.is_empty() && r.revoked.is_empty() {
                    return Ok(());
                }
                let next = RunningTxn {
                    tid: r.tid + 1,
                    ..Default::default()
                };
                self.running_tid.store(r.tid + 1, Ordering::Release);
                std::mem::replace(&mut *r, next)
            };
            let tid = old.tid;
            // From here until it is committed the transaction exists nowhere else: a panic
            // on the way loses it as surely as an error does.
            guard = LostOnPanic {
                txn: self,
                env,
                tid,
            };
            snapshot_for_commit(old, env).map_err(|e| self.commit_failed(tid, e, env))?
        };
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .commit_blocks
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
        let blks: Vec<u64> = snapshot.iter().map(|s| s.0).collect();
        let queued = self
            .write_transaction(this_tid, snapshot, &revoked, pins, env)
            .map_err(|e| self.commit_failed(this_tid, e, env))?;
        *committed = this_tid;
        self.committed.store(this_tid, Ordering::Release);
        std::mem::forget(guard);
        if !queued {
            env.release_frees(this_tid);
        }
        // The blocks the next transaction has not changed again are clean. A block whose
        // checkpoint is queued stays in the cache: the queued job holds a reference.
        let clean: Vec<u64> = {
            let r = self.running.lock();
            blks.into_iter()
                .filter(|b| !r.blocks.contains_key(b))
                .collect()
        };
        for blk in clean {
            env.bcache().mark_clean(blk);
        }
        Ok(())
    }

    /// A transaction taken out of `running` could not be made durable: its changes are in the
    /// cache only. The filesystem stops (as the kernel aborts its journal), and every later
    /// commit, fsync included, fails rather than report success for changes that may build on
    /// the lost ones. What earlier commits put in the journal stays there for recovery.
    fn commit_failed(&self, tid: u64, e: Error, env: &dyn CommitEnv) -> Error {
        self.abandon(
            &format!("transaction {tid} could not be committed: {e}"),
            env,
        );
        e
    }

    /// The running transaction holds a change left half-done (an operation failed after a
    /// step it cannot undo, such as a freed block): it must never commit, as the kernel
    /// aborts its journal (jbd2_journal_abort from ext4_abort) rather than let a half-done
    /// change reach the disk. The filesystem stops; every later commit fails with `why`; the
    /// disk keeps what earlier commits made, consistent.
    pub fn abandon(&self, why: &str, env: &dyn CommitEnv) {
        tracing::error!("{why}");
        let _ = self.lost.set(why.to_string());
        env.stop(why);
        if let Some(j) = env.journal() {
            j.abort(why);
        }
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
        env: &dyn CommitEnv,
    ) -> Result<bool> {
        // Data written by the operations in this transaction reached the device before their
        // metadata: the journal's flushes (or the flush below) order it ahead of the metadata.
        let dev = env.device();
        if let Some(j) = env.journal() {
            if j.fits(blocks.len(), revoked.len()) {
                let jtid = j.commit(tid, &blocks, revoked)?;
                return j.queue_checkpoint(tid, jtid, blocks, Box::new(pins));
            }
            // Larger than the log can hold (one handle changed more blocks than a small
            // journal takes): written home directly, not atomically. First every queued
            // checkpoint goes home, so no older copy lands on top of these blocks, and the
            // journal is emptied on disk, so no recovery replays an older copy over them.
            self.stats
                .unjournaled_commits
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "transaction {tid} of {} blocks does not fit the journal ({} blocks): \
                 writing it without the journal",
                blocks.len(),
                j.log_len()
            );
            j.checkpoint_drain()?;
            j.set_clean()?;
        }
        dev.flush()?;
        let bs = env.bcache().block_size() as u64;
        for (blk, data) in &blocks {
            dev.write_at(blk * bs, data)?;
        }
        dev.flush()?;
        Ok(false)
    }
}

/// The contents a commit writes for the transaction `old`, just taken out of `running`
/// (barrier held): its blocks, the inodes it changed lazily and the superblock, copied; its
/// revoked blocks; and the buffers, pinned until the blocks are home.
#[allow(clippy::type_complexity)]
fn snapshot_for_commit(
    old: RunningTxn,
    env: &dyn CommitEnv,
) -> Result<(u64, Vec<(u64, Vec<u8>)>, Vec<u64>, Vec<Arc<Buffer>>)> {
    let mut blocks = old.blocks;
    env.add_unlogged(old.lazy_inodes, &mut blocks)?;
    let mut snap: Vec<(u64, Vec<u8>)> = blocks
        .values()
        .map(|b| (b.blk, b.read().to_vec()))
        .collect();
    snap.sort_unstable_by_key(|s| s.0);
    let revoked: Vec<u64> = old.revoked.into_iter().collect();
    let pins: Vec<Arc<Buffer>> = blocks.into_values().collect();
    Ok((old.tid, snap, revoked, pins))
}

/// Marks a transaction lost if its commit unwinds (a panic) between taking it out of `running`
/// and recording it committed; forgotten once it is committed.
struct LostOnPanic<'a> {
    txn: &'a TxnManager,
    env: &'a dyn CommitEnv,
    tid: u64,
}

impl Drop for LostOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let e = Error::Stopped("the commit panicked".into());
            self.txn.commit_failed(self.tid, e, self.env);
        } else if self.txn.lost.get().is_none() {
            // Dropped on an error return: commit_failed has already run for it.
            debug_assert!(false, "transaction {} neither committed nor lost", self.tid);
        }
    }
}

/// Credit estimates: the most metadata blocks each operation can dirty, before an extent split
/// or htree split asks for more (`Handle::extend`). They bound the running transaction's size
/// against the journal (a transaction must fit in a quarter of the log).
pub mod credits {
    /// Inode bitmap, group descriptor, inode table block, parent inode block, directory block
    /// (or an htree split: two leaves and up to three index blocks), block bitmap and
    /// descriptor for a new directory's (or slow symlink's) first block, superblock.
    pub const CREATE: usize = 16;
    pub const LINK: usize = 8;
    /// As create, plus freeing: block bitmaps, descriptors and extent blocks of the victim.
    pub const UNLINK: usize = 32;
    pub const RENAME: usize = 24;
    pub const SETATTR: usize = 4;
    /// Per extent inserted: the leaf, a split (new leaf and the index), a depth increase, and
    /// the block bitmap and descriptor of the data.
    pub const WRITE_PER_EXTENT: usize = 8;
    /// One attribute change: the inode's table block, a new block with its bitmap and
    /// descriptor, the old block (refcount) or its bitmap and descriptor, the superblock.
    pub const XATTR: usize = 10;
}
