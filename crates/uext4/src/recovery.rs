//! ext4's side of recovery at open (the kernel's ext4_load_journal): the log is replayed,
//! then the fast commits that follow its last full commit, then the filesystem is opened
//! again over the result. A read-only open does all of it in memory, over an
//! `OverlayDevice`, and leaves the image as it was.
//!
//! Fast commits are replayed by a writable open (they go through the engine's own
//! operations): of the image itself for a read-write open, of the overlay for a read-only
//! one, which is then opened read-only again. On a read-write open the log is marked empty
//! before the fast commits are replayed and committed: a crash between the two loses them
//! (the kernel replays both before it writes anything new, and a crash in its fast-commit
//! replay leaves the filesystem marked with errors).

use crate::blockdev::BlockDevice;
use crate::error::Result;
use crate::format::features::INCOMPAT_RECOVER;
use crate::format::superblock::SUPERBLOCK_OFFSET;
use crate::fs::{read_superblock, FcPending, Fs, Reopen};
use crate::journal::Journal;
use crate::super_info::encode_superblock;
use std::sync::Arc;

impl Fs {
    /// Replays the journal of the filesystem `fs` has just opened on `dev` and opens it
    /// again (`in_memory`: this open is already over the overlay of a read-only open).
    pub(crate) fn recover_and_reopen(
        fs: Arc<Fs>,
        dev: Arc<dyn BlockDevice>,
        journal: Journal,
        in_memory: Option<Option<String>>,
    ) -> Result<Arc<Fs>> {
        if fs.is_read_only() && in_memory.is_none() {
            // Replay into memory laid over the device, which is never written.
            drop(journal);
            let opts = fs.opts.clone();
            let reason = fs.sb.read_only_reason().map(str::to_string);
            drop(fs);
            let overlay = Arc::new(crate::blockdev::OverlayDevice::new(dev));
            let reopen = Reopen {
                in_memory: Some(reason),
                ..Default::default()
            };
            return Fs::open_dev_again(overlay, opts, reopen);
        }
        // Scanned before anything is written: fast commits refused leave the image as it was.
        let fc = fs.pending_fast_commits(&journal)?;
        let report = journal.recover()?;
        let in_memory_replay = in_memory.is_some();
        tracing::info!(?report, in_memory_replay, "replayed the journal");
        // Clear needs_recovery in the superblock as replayed (not our stale copy), then open
        // again over the recovered image.
        let bytes = {
            let mut sb = read_superblock(&*dev)?;
            let f = sb.feature_incompat() & !INCOMPAT_RECOVER;
            sb.set_feature_incompat(f);
            encode_superblock(&mut sb)
        };
        dev.write_at(SUPERBLOCK_OFFSET, &bytes)?;
        dev.flush()?;
        drop(journal);
        let opts = fs.opts.clone();
        let mmp = fs.mmp.lock().take();
        drop(fs);
        if fc.is_empty() {
            let reopen = Reopen {
                in_memory,
                mmp,
                fast_commits: None,
            };
            return Fs::open_dev_again(dev, opts, reopen);
        }
        let then_read_only = in_memory.map(|reason| (opts.clone(), reason));
        let mut writable = opts;
        writable.read_only = false;
        let reopen = Reopen {
            in_memory: None,
            mmp,
            fast_commits: Some(FcPending { fc, then_read_only }),
        };
        Fs::open_dev_again(dev, writable, reopen)
    }

    /// Replays the fast commits a recovery found, on `fs` just opened writable on `dev`; for a
    /// read-only open, closes it and opens `dev` (the overlay) read-only again.
    pub(crate) fn finish_fast_commits(
        fs: Arc<Fs>,
        dev: Arc<dyn BlockDevice>,
        pending: FcPending,
    ) -> Result<Arc<Fs>> {
        let report = fs.replay_fast_commits(&pending.fc)?;
        tracing::info!(?report, tid = pending.fc.tid, "replayed the fast commits");
        let Some((opts, reason)) = pending.then_read_only else {
            return Ok(fs);
        };
        fs.unmount()?;
        drop(fs);
        let reopen = Reopen {
            in_memory: Some(reason),
            ..Default::default()
        };
        Fs::open_dev_again(dev, opts, reopen)
    }
}
