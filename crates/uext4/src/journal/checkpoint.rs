//! Log space and checkpointing.
//!
//! The live part of the log runs from the oldest transaction not yet checkpointed (the tail)
//! to the head. The on-disk superblock's s_start is moved lazily: it may still point at
//! transactions already checkpointed (replaying them again is harmless, since every later
//! transaction is replayed after them), and it is rewritten only when the next write would
//! reach the block it points at, or when the journal was empty on disk (s_start = 0) and a
//! transaction is about to be committed.

use super::{Journal, Log};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
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

    /// Waits until `n` log blocks are free, calling the checkpoint callback first.
    pub(super) fn wait_for_room(
        &self,
        log: &mut parking_lot::MutexGuard<'_, Log>,
        n: u32,
    ) -> Result<()> {
        let mut since = Instant::now();
        let mut tail = log.live.front().map(|t| t.tid);
        let mut called = false;
        loop {
            self.check_aborted()?;
            if self.log_len() - self.used(log) >= n {
                return Ok(());
            }
            if !called {
                called = true;
                let cb = self.callback.lock();
                if let Some(cb) = cb.as_ref() {
                    parking_lot::MutexGuard::unlocked(log, cb);
                    continue;
                }
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
