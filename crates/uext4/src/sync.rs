//! Filesystem-level commit, sync and unmount: the transaction manager commits
//! (transaction.rs), given what it needs from the filesystem ([`CommitEnv`]); the journal
//! writes committed blocks home itself (journal/checkpoint.rs).

use crate::bcache::{Buffer, BufferCache};
use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::features::INCOMPAT_RECOVER;
use crate::format::superblock::{STATE_VALID, SUPERBLOCK_OFFSET};
use crate::fs::Fs;
use crate::journal::Journal;
use crate::super_info::superblock_location;
use crate::transaction::CommitEnv;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

impl CommitEnv for Fs {
    fn read_only(&self) -> bool {
        self.is_read_only()
    }

    fn add_unlogged(
        &self,
        lazy_inodes: HashSet<u32>,
        blocks: &mut HashMap<u64, Arc<Buffer>>,
    ) -> Result<()> {
        for ino in lazy_inodes {
            if let Some(buf) = self.write_inode_at_commit(ino)? {
                blocks.insert(buf.blk, buf);
            }
        }
        // The superblock carries the free counts; it goes with every commit.
        let now = self.now().sec as u32;
        let sb_buf = self.superblock_to_buffer(|sb| sb.set_wtime(now))?;
        blocks.insert(sb_buf.blk, sb_buf);
        Ok(())
    }

    fn journal(&self) -> Option<&Journal> {
        self.journal.get().map(|j| &**j)
    }

    fn device(&self) -> &dyn BlockDevice {
        &*self.dev
    }

    fn bcache(&self) -> &BufferCache {
        &self.bcache
    }

    fn release_frees(&self, tid: u64) {
        self.release_pending_frees(tid);
    }

    fn stop(&self, why: &str) {
        self.sb.stop(why);
    }
}

impl Fs {
    /// Commits the running transaction. Concurrent callers share one commit: a caller that
    /// finds its transaction already committed by another returns at once.
    pub fn commit(&self) -> Result<()> {
        self.commit_upto(u64::MAX)
    }

    /// Commits if transaction `tid` (or an earlier one) is not yet committed (group commit:
    /// `TxnManager::commit_upto`).
    pub fn commit_upto(&self, tid: u64) -> Result<()> {
        self.txn.commit_upto(tid, self)
    }

    /// Waits until every committed transaction is home (unmount, sync, a write that bypasses
    /// the journal). Fails if a background checkpoint failed.
    pub(crate) fn checkpoint_drain(&self) -> Result<()> {
        match self.journal.get() {
            Some(j) => j.checkpoint_drain(),
            None => Ok(()),
        }
    }

    /// Commits everything and marks the filesystem clean. The `Fs` stays usable.
    pub fn sync(&self) -> Result<()> {
        self.delalloc_writeback_all()?;
        self.commit()?;
        self.checkpoint_drain()
    }

    /// Commits everything, marks the superblock clean and flushes. Call before dropping the last
    /// reference when the image is to be left clean: a read-write `Fs` dropped without it
    /// leaves the image as a crash would, and the drop logs a warning (see [`Fs`]'s
    /// "Closing"). Afterwards the `Fs` is read-only, and the image's writer claim and MMP
    /// hold are released. A read-only filesystem has nothing to do.
    ///
    /// # Errors
    /// What writing back, committing or checkpointing reports; the image is then left as
    /// a crash would leave it.
    pub fn unmount(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        self.close_orphans();
        self.delalloc_writeback_all()?;
        self.commit()?;
        self.checkpoint_drain()?;
        if let Some(j) = self.journal.get() {
            j.set_clean()?;
        }
        let stopped = self.sb.is_stopped();
        let bytes = self.sb.encode(true, |sb| {
            let f = sb.feature_incompat() & !INCOMPAT_RECOVER;
            sb.set_feature_incompat(f);
            if !stopped {
                let v = sb.state() | STATE_VALID;
                sb.set_state(v);
            }
        });
        self.dev.write_at(SUPERBLOCK_OFFSET, &bytes)?;
        self.dev.flush()?;
        let (blk, _) = superblock_location(self.geo.block_size);
        self.bcache.forget(blk);
        if let Some(m) = &*self.mmp.lock() {
            m.release()?;
        }
        self.sb.set_read_only();
        // Nothing more is written: another writer may have the image now.
        self.claim.lock().take();
        Ok(())
    }

    /// An operation on inode `ino` failed with `e` after a change it cannot undo: the running
    /// transaction is abandoned (`TxnManager::abandon`), so the half-done change never reaches
    /// the disk. Returns `e`.
    pub(crate) fn abandon_txn(&self, e: Error, ino: u32, func: &str) -> Error {
        let why = format!("{func}: inode {ino}: failed half-way, transaction abandoned: {e}");
        self.txn.abandon(&why, self);
        e
    }

    /// Runs `op`, and once more if it ran out of space while blocks freed by transactions not
    /// yet home were held back: after committing and waiting for those to go home, so that
    /// deleting a file on a full filesystem makes its space usable at once (the kernel's
    /// ext4_should_retry_alloc forces a commit likewise). The allocator only reports the
    /// condition; the commit is the caller's. Call with no handle open.
    pub(crate) fn retry_nospace<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        match op() {
            Err(Error::NoSpace) if self.balloc.pending_free.has_any() => {
                self.commit()?;
                self.checkpoint_drain()?;
                op()
            }
            r => r,
        }
    }
}
