//! Log space and checkpointing, as jbd2's checkpoint.c: committed transactions are queued
//! with their blocks (`Journal::queue_checkpoint`), and the journal's own background thread
//! writes them home in commit order, flushes, and frees their log space. The engine hears of
//! it through the [`CheckpointHooks`] it registered at open (what the transactions freed may
//! be reused; a failure stops it); the journal never calls into anything else.
//!
//! The live part of the log runs from the oldest transaction not yet checkpointed (the tail)
//! to the head. The on-disk superblock's s_start is moved lazily: it may still point at
//! transactions already checkpointed (replaying them again is harmless, since every later
//! transaction is replayed after them), and it is rewritten only when the next write would
//! reach the block it points at, or when the journal was empty on disk (s_start = 0) and a
//! transaction is about to be committed.

use super::{Journal, Log};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a commit waits for the tail to move before it says so in the log. It waits on:
/// a checkpoint that fails aborts the journal, which wakes it with the failure, and a device
/// that is merely slow must not stop the filesystem (as a hung kernel task only warns).
const ROOM_WARN_AFTER: Duration = Duration::from_secs(60);

impl Journal {
    /// Log blocks in use by transactions not yet checkpointed.
    pub(super) fn used(&self, log: &Log) -> u32 {
        // Live transactions are contiguous, from the tail to the head.
        log.live.iter().map(|t| t.len).sum()
    }

    pub(super) fn update_free(&self, log: &Log) {
        self.free
            .store(self.log_len() - self.used(log), Ordering::Relaxed);
    }

    /// Log blocks free for new transactions.
    pub fn free_blocks(&self) -> u32 {
        self.free.load(Ordering::Relaxed)
    }

    /// Waits until `n` log blocks are free, hurrying the checkpointer first.
    pub(super) fn wait_for_room(
        &self,
        log: &mut parking_lot::MutexGuard<'_, Log>,
        n: u32,
    ) -> Result<()> {
        let mut since = Instant::now();
        let mut tail = log.live.front().map(|t| t.tid);
        let mut hurried = false;
        loop {
            self.check_aborted()?;
            if self.log_len() - self.used(log) >= n {
                return Ok(());
            }
            if !hurried {
                hurried = true;
                parking_lot::MutexGuard::unlocked(log, || self.ckpt.hurry());
                continue;
            }
            let now_tail = log.live.front().map(|t| t.tid);
            if now_tail != tail {
                (tail, since) = (now_tail, Instant::now());
            } else if since.elapsed() > ROOM_WARN_AFTER {
                tracing::warn!(
                    "journal full: transaction {} not checkpointed for {}s; still waiting",
                    tail.unwrap_or(0),
                    ROOM_WARN_AFTER.as_secs()
                );
                since = Instant::now();
            }
            self.checkpoint_waits.fetch_add(1, Ordering::Relaxed);
            self.space.wait_for(log, Duration::from_millis(500));
        }
    }

    /// Before `n` blocks are written at the head: makes sure the on-disk superblock names a
    /// live region that those writes do not overwrite.
    pub(super) fn prepare_sb(&self, log: &mut Log, tid: u32, n: u32) -> Result<()> {
        if log.sb.start == 0 {
            // Empty on disk: the transaction about to be written is the log's start. The
            // flush before its commit block orders this write ahead of it.
            let head = log.head;
            self.write_sb(log, head, tid)?;
            log.disk_used = 0;
            return Ok(());
        }
        if log.disk_used as u64 + n as u64 > self.log_len() as u64 {
            // The write would reach what the superblock still calls live: move s_start to
            // the tail (the engine flushed the checkpointed blocks before saying so).
            let (start, seq) = match log.live.front() {
                Some(t) => (t.start, t.tid),
                None => (log.head, tid),
            };
            self.write_sb(log, start, seq)?;
            self.dev.flush()?;
            log.disk_used = self.used(log);
        }
        Ok(())
    }

    /// Says that transaction `tid` (and every earlier one) has its blocks home and flushed:
    /// its log space may be reused.
    pub fn checkpointed(&self, tid: u32) {
        let mut log = self.log.lock();
        while let Some(t) = log.live.front() {
            if super::format::tid_gt(t.tid, tid) {
                break;
            }
            log.live.pop_front();
        }
        self.update_free(&log);
        drop(log);
        self.space.notify_all();
    }

    /// Stops the journal after a failure outside it (a checkpoint write failed): every later
    /// commit fails, and a commit waiting for log space wakes and fails, instead of waiting for
    /// a tail that will not move. What is already committed stays in the log for recovery.
    pub fn abort(&self, why: &str) {
        self.abort_reason
            .lock()
            .get_or_insert_with(|| why.to_string());
        if !self.aborted.swap(true, Ordering::Relaxed) {
            tracing::error!("journal aborted: {why}");
        }
        // Under the log lock, so a waiter between its check and its wait cannot miss it.
        drop(self.log.lock());
        self.space.notify_all();
    }

    pub(super) fn check_aborted(&self) -> Result<()> {
        if self.is_aborted() {
            let why = self.abort_reason.lock().clone().unwrap_or_default();
            return Err(Error::Stopped(format!(
                "the journal was aborted ({why}); what it holds is left for recovery"
            )));
        }
        Ok(())
    }
}

/// What the engine is told by the checkpointer. Registered once, at open
/// (`Journal::start_checkpointer`); the journal owns it.
pub trait CheckpointHooks: Send + Sync {
    /// Every transaction up to the engine's `tid` is home: the blocks those transactions
    /// freed may be reused (no queued checkpoint can write an old copy over them now).
    fn checkpointed(&self, tid: u64);
    /// A checkpoint failed (the journal is aborted already): nothing more may be written.
    fn failed(&self, why: &str);
}

/// One committed transaction whose blocks are in the log but not yet home.
struct CheckpointJob {
    /// The engine's transaction id.
    tid: u64,
    /// Its jbd2 transaction id.
    jtid: u32,
    blocks: Vec<(u64, Vec<u8>)>,
    /// Whatever the engine keeps alive until the blocks are home (its cached buffers, so a
    /// cache miss never reads an older copy from the device).
    _pins: Box<dyn std::any::Any + Send + Sync>,
}

#[derive(Default)]
struct CheckpointState {
    jobs: VecDeque<CheckpointJob>,
    /// The thread is writing a batch it took from `jobs`.
    busy: bool,
    /// A checkpoint write failed: drains report it.
    error: Option<String>,
    /// Someone waits for checkpoint progress (a drain, a commit short of log space): write
    /// home now instead of waiting for more commits to batch.
    urgent: bool,
    /// The thread runs (else nothing is queued: a journal opened without it is checkpointed
    /// by whoever calls `checkpointed`).
    running: bool,
    /// Batches not written home (a write failed, or the journal aborted): what they pin
    /// stays alive, the only current copy of those blocks until the filesystem goes
    /// (recovery then replays them from the log).
    abandoned: Vec<CheckpointJob>,
}

/// How long the checkpointer lets committed transactions gather before writing them home,
/// unless the log fills past `CHECKPOINT_LOG_FRACTION` or someone waits: a block that many
/// commits rewrite (an extent leaf, an inode table block) then goes home once per batch, with
/// one flush, instead of once per commit.
const CHECKPOINT_BATCH_DELAY: Duration = Duration::from_millis(50);
/// The share of the log (1/n) in use above which the checkpointer writes home at once.
const CHECKPOINT_LOG_FRACTION: u32 = 4;

/// Background checkpointing, ahead of need: a commit queues its transaction and returns once
/// it is in the log; one thread per journal writes queued transactions home in commit order
/// and releases their log space. A commit that finds the log full waits for this progress
/// only (counted in `checkpoint_waits`).
#[derive(Default)]
pub(super) struct Checkpointer {
    state: Mutex<CheckpointState>,
    work: Condvar,
    done: Condvar,
    /// Batches written home.
    batches: AtomicU64,
    /// Times a commit woke the thread (`queue_checkpoint`).
    wakes: AtomicU64,
}

impl Checkpointer {
    /// Asks for queued transactions to go home now.
    fn hurry(&self) {
        self.state.lock().urgent = true;
        self.work.notify_one();
    }
}

impl Journal {
    /// Starts the journal's checkpoint thread. It holds the journal only while it writes a
    /// batch; when the journal is dropped (its filesystem dropped without unmount: a crash,
    /// in tests), queued checkpoints are abandoned, as a crash would: recovery replays them.
    pub fn start_checkpointer(
        self: &Arc<Self>,
        hooks: Box<dyn CheckpointHooks>,
    ) -> std::io::Result<()> {
        let ckpt = self.ckpt.clone();
        let journal = Arc::downgrade(self);
        ckpt.state.lock().running = true;
        let hooks: Arc<dyn CheckpointHooks> = Arc::from(hooks);
        std::thread::Builder::new()
            .name("uext4-checkpoint".into())
            .spawn(move || {
                let _exit = CheckpointerExit {
                    journal: journal.clone(),
                    ckpt: ckpt.clone(),
                    hooks: hooks.clone(),
                };
                checkpointer_loop(journal, ckpt, &*hooks)
            })
            .map(|_| ())
            .inspect_err(|_| self.ckpt.state.lock().running = false)
    }

    /// Queues committed transaction `tid` (jbd2 id `jtid`) to be written home: `blocks` are
    /// its contents, `pins` whatever must live until they are home. Returns true when queued;
    /// without a checkpoint thread they are written home at once (false).
    pub fn queue_checkpoint(
        &self,
        tid: u64,
        jtid: u32,
        blocks: Vec<(u64, Vec<u8>)>,
        pins: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<bool> {
        let job = CheckpointJob {
            tid,
            jtid,
            blocks,
            _pins: pins,
        };
        let mut s = self.ckpt.state.lock();
        if !s.running {
            drop(s);
            return self.checkpoint_batch(&[job]).map(|()| false);
        }
        // The thread needs waking only when it waits for work (no job queued before this
        // one) or the log fills. With jobs queued it is gathering a batch and looks again
        // at its deadline: a wake-up per commit would be a context switch per fsync.
        let first = s.jobs.is_empty();
        s.jobs.push_back(job);
        drop(s);
        if first || self.log_filling() {
            self.ckpt.wakes.fetch_add(1, Ordering::Relaxed);
            self.ckpt.work.notify_one();
        }
        Ok(true)
    }

    /// Waits until every queued transaction is home (unmount, sync, a write that bypasses
    /// the journal). Fails if a background checkpoint failed.
    pub fn checkpoint_drain(&self) -> Result<()> {
        let mut s = self.ckpt.state.lock();
        // After a failure nothing more goes home (and the thread may be gone): stop waiting.
        while (!s.jobs.is_empty() || s.busy) && s.error.is_none() {
            // Again each round: transactions committed meanwhile must not wait for a batch.
            s.urgent = true;
            self.ckpt.work.notify_one();
            self.ckpt.done.wait(&mut s);
        }
        match &s.error {
            Some(e) => Err(Error::Stopped(e.clone())),
            None => Ok(()),
        }
    }

    /// Batches of transactions the checkpointer has written home.
    pub fn checkpoint_batches(&self) -> u64 {
        self.ckpt.batches.load(Ordering::Relaxed)
    }

    /// Times a commit woke the checkpointer.
    pub fn checkpoint_wakes(&self) -> u64 {
        self.ckpt.wakes.load(Ordering::Relaxed)
    }

    /// Whether more than 1/`CHECKPOINT_LOG_FRACTION` of the log is in use.
    fn log_filling(&self) -> bool {
        let len = self.log_len();
        len - self.free_blocks().min(len) > len / CHECKPOINT_LOG_FRACTION
    }

    /// Writes a batch of committed transactions home: the newest copy of each block once, one
    /// flush, then their log space is released.
    fn checkpoint_batch(&self, batch: &[CheckpointJob]) -> Result<()> {
        let Some(last) = batch.last() else {
            return Ok(());
        };
        let mut newest: std::collections::BTreeMap<u64, &[u8]> = Default::default();
        for job in batch {
            for (blk, data) in &job.blocks {
                newest.insert(*blk, data);
            }
        }
        let bs = self.bs as u64;
        for (blk, data) in newest {
            self.dev.write_at(blk * bs, data)?;
        }
        self.dev.flush()?;
        self.checkpointed(last.jtid);
        self.ckpt.batches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The checkpoint thread's work: batches of committed transactions written home, until the
/// journal goes.
fn checkpointer_loop(journal: Weak<Journal>, ckpt: Arc<Checkpointer>, hooks: &dyn CheckpointHooks) {
    loop {
        let batch: Vec<CheckpointJob> = {
            let mut s = ckpt.state.lock();
            while s.jobs.is_empty() {
                let idle = ckpt
                    .work
                    .wait_for(&mut s, Duration::from_millis(200))
                    .timed_out();
                if idle && journal.strong_count() == 0 {
                    return;
                }
            }
            // Let more commits join the batch, unless someone waits or the log fills.
            let until = Instant::now() + CHECKPOINT_BATCH_DELAY;
            while !s.urgent && journal.strong_count() > 0 {
                let filling = || journal.upgrade().is_none_or(|j| j.log_filling());
                if parking_lot::MutexGuard::unlocked(&mut s, filling) {
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
        let r = match journal.upgrade() {
            // After an abort nothing more goes home: the log keeps every committed
            // transaction, and recovery replays them in order (as the kernel leaves an
            // aborted journal).
            Some(j) if j.is_aborted() => Err(Error::Stopped("journal aborted".into())),
            Some(j) => {
                // A panic here must not leave `busy` set: drains would wait forever.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    j.checkpoint_batch(&batch)
                }))
                .unwrap_or_else(|_| Err(Error::Stopped("the checkpoint thread panicked".into())));
                match &r {
                    // Blocks freed by these transactions may be reused now: no queued
                    // checkpoint can still write an old copy over them (commit order).
                    Ok(()) => hooks.checkpointed(batch.last().map_or(0, |b| b.tid)),
                    Err(e) => {
                        // Nothing more may be committed: a later transaction's blocks could
                        // go home while these did not, and the log cannot be freed.
                        let why = format!("checkpoint failed: {e}");
                        j.abort(&why);
                        hooks.failed(&why);
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
    journal: Weak<Journal>,
    ckpt: Arc<Checkpointer>,
    hooks: Arc<dyn CheckpointHooks>,
}

impl Drop for CheckpointerExit {
    fn drop(&mut self) {
        let mut s = self.ckpt.state.lock();
        s.running = false;
        if !std::thread::panicking() {
            return;
        }
        drop(s);
        let why = "the checkpoint thread panicked";
        if let Some(j) = self.journal.upgrade() {
            j.abort(why);
        }
        self.hooks.failed(why);
        let mut s = self.ckpt.state.lock();
        s.busy = false;
        s.error.get_or_insert(why.to_string());
        drop(s);
        self.ckpt.done.notify_all();
    }
}
