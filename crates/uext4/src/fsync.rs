//! fsync: making a file's changes durable with one commit for many callers. [`Fs::fsync`]
//! blocks its caller until the commit that covers the file (`Fs::commit_upto` shares one
//! among concurrent callers). [`FsyncQueue`] is the same for a server whose threads must not
//! wait on each other: it queues requests and has one caller commit for all of them.

use crate::error::{Error, Result};
use crate::fs::Fs;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;

impl Fs {
    /// Makes the file's data and metadata durable. Concurrent fsyncs share one commit; one that
    /// finds its changes committed only flushes the device; fdatasync does not commit for a
    /// timestamp-only change.
    pub fn fsync(&self, ino: u32, datasync: bool) -> Result<()> {
        self.fsync_many(&[(ino, datasync)])?.pop().unwrap_or(Ok(()))
    }

    /// fsync of many files at once (a server's queued requests): each file's buffered data is
    /// written back (its own result), then one commit covers every file that needs one, or one
    /// device flush if none does. The outer error is that commit's or flush's, for all of them.
    pub fn fsync_many(&self, files: &[(u32, bool)]) -> Result<Vec<Result<()>>> {
        let mut need = 0u64;
        let results: Vec<Result<()>> = files
            .iter()
            .map(|&(ino, datasync)| {
                self.stats.ops.fetch_add(1, Ordering::Relaxed);
                let inode = self.iget(ino)?;
                self.retry_nospace(|| self.delalloc_writeback(&inode))?;
                let tid = if datasync {
                    inode.last_data_tid.load(Ordering::Acquire)
                } else {
                    inode.last_tid.load(Ordering::Acquire)
                };
                need = need.max(tid);
                Ok(())
            })
            .collect();
        if self.is_read_only() {
            return Ok(results);
        }
        if need > self.txn.committed_tid() {
            if self.fc_enabled() {
                // A fast commit where the changes fit one (fast_commit/commit.rs).
                self.txn.fast_commit_upto(need, self, self)?;
            } else {
                self.commit_upto(need)?;
            }
        } else {
            self.txn
                .stats
                .fsync_already_committed
                .fetch_add(files.len() as u64, Ordering::Relaxed);
            self.dev.flush()?;
        }
        Ok(results)
    }
}

/// Group commit for a server's fsync requests, without blocking its request threads on each
/// other: a thread that submits an fsync queues it; if no thread is committing, it becomes
/// the leader and makes every queued fsync durable with one commit (`Fs::fsync_many`),
/// answers each, and repeats until the queue is empty. A thread that finds a leader at work
/// returns at once to serve other requests; its fsync is answered by the leader's next round.
/// (With the commit inline per request, a second fsync held its thread until the first one's
/// commit ended, and no thread was left to take the writes that the next commit would carry.)
/// `R` is where an answer goes (a FUSE reply).
pub struct FsyncQueue<R> {
    /// Queued fsyncs, and whether a leader is draining them.
    state: Mutex<(Vec<Queued<R>>, bool)>,
}

/// An fsync waiting for a commit: inode, datasync, and where its answer goes.
type Queued<R> = (u32, bool, R);

impl<R> Default for FsyncQueue<R> {
    fn default() -> Self {
        FsyncQueue {
            state: Mutex::new((Vec::new(), false)),
        }
    }
}

impl<R> FsyncQueue<R> {
    /// Queues an fsync of `ino` and, unless another caller leads, commits every queued one,
    /// calling `answer` with each reply and its result.
    pub fn submit(
        &self,
        fs: &Fs,
        ino: u32,
        datasync: bool,
        reply: R,
        answer: &dyn Fn(R, std::result::Result<(), &Error>),
    ) {
        {
            let mut s = self.state.lock();
            s.0.push((ino, datasync, reply));
            if s.1 {
                return;
            }
            s.1 = true;
        }
        // A panic in the engine below must not leave the queue marked as led: every later
        // fsync would wait for a leader that is gone. The batch it held, and the fsyncs
        // queued meanwhile, are dropped unanswered (a FUSE reply answers EIO as it drops).
        struct Leading<'a, R>(&'a FsyncQueue<R>);
        impl<R> Drop for Leading<'_, R> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let stranded = {
                        let mut s = self.0.state.lock();
                        s.1 = false;
                        std::mem::take(&mut s.0)
                    };
                    drop(stranded);
                }
            }
        }
        let _leading = Leading(self);
        loop {
            let batch = {
                let mut s = self.state.lock();
                if s.0.is_empty() {
                    // Given up in the same hold that saw the queue empty: an fsync queued
                    // after this finds no leader and leads.
                    s.1 = false;
                    return;
                }
                std::mem::take(&mut s.0)
            };
            let files: Vec<(u32, bool)> = batch.iter().map(|b| (b.0, b.1)).collect();
            match fs.fsync_many(&files) {
                Ok(results) => {
                    for ((_, _, reply), r) in batch.into_iter().zip(results) {
                        answer(reply, r.as_ref().map(|_| ()));
                    }
                }
                Err(e) => {
                    for (_, _, reply) in batch {
                        answer(reply, Err(&e));
                    }
                }
            }
        }
    }
}
