//! ext4's side of recovery at open (the kernel's ext4_load_journal): the log is replayed,
//! then the fast commits that follow its last full commit, then the filesystem is opened
//! again over the result. A read-only open does all of it in memory, over an
//! `OverlayDevice`, and leaves the image as it was.
//!
//! Fast commits are replayed by a writable open of the overlay (they go through the engine's
//! own operations and its journal), which is then opened read-only again; a read-write open
//! replays that way too, then writes the overlay to the image (`replay_over_overlay`), so a
//! crash in between leaves the log and the fast commits to replay again, as the kernel's
//! replay does.

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
        if !fc.is_empty() && in_memory.is_none() {
            return Fs::replay_over_overlay(fs, dev, journal);
        }
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

    /// A read-write open whose journal holds fast commits: the log and the fast commits are
    /// replayed in memory over the device, as a read-only open replays them, then written
    /// to it in an order a crash cannot spoil: the filesystem's blocks first (never the log,
    /// which stays as it was), a flush, then the journal's superblock (now empty) and the
    /// filesystem's (needs_recovery cleared). A crash before the last two leaves the log and
    /// the fast commits to replay again. Then the image is opened read-write.
    fn replay_over_overlay(
        fs: Arc<Fs>,
        dev: Arc<dyn BlockDevice>,
        journal: Journal,
    ) -> Result<Arc<Fs>> {
        let bs = fs.geo.block_size as u64;
        let jmap = journal.map().clone();
        let jsb = jmap.phys(0).expect("checked at open");
        drop(journal);
        let opts = fs.opts.clone();
        let mmp = fs.mmp.lock().take();
        drop(fs);
        let overlay = Arc::new(crate::blockdev::OverlayDevice::new(dev.clone()));
        let mut ro = opts.clone();
        ro.read_only = true;
        let reopen = Reopen {
            in_memory: Some(None),
            ..Default::default()
        };
        drop(Fs::open_dev_again(overlay.clone(), ro, reopen)?);
        let sb_block = SUPERBLOCK_OFFSET / bs;
        let in_journal = |b: u64| jmap.0.iter().any(|&(_, p, n)| b >= p && b < p + n as u64);
        let mut last = Vec::new();
        let pages = overlay.overlaid_pages();
        for (off, page) in &pages {
            let off = *off;
            // In pieces of a block, or of the page where a block is larger.
            let step = bs.min(page.len() as u64) as usize;
            for (i, piece) in page.chunks(step).enumerate() {
                let at = off + (i * step) as u64;
                let b = at / bs;
                if b == jsb || b == sb_block {
                    last.push((at, piece));
                } else if !in_journal(b) {
                    dev.write_at(at, piece)?;
                }
            }
        }
        dev.flush()?;
        for (at, piece) in last {
            dev.write_at(at, piece)?;
        }
        dev.flush()?;
        // Opened again only once the journal is empty on the device: one that still held the
        // log would be replayed over and over.
        let mut raw = vec![0u8; crate::journal::format::SB_SIZE];
        dev.read_at(jsb * bs, &mut raw)?;
        if crate::journal::format::JournalSuperblock::parse(&raw)?.start != 0 {
            return Err(crate::error::Error::corrupt(
                crate::error::Corruption::Journal,
                "the journal's superblock on the device still holds the log after the replay \
                 was written back",
            ));
        }
        let reopen = Reopen {
            in_memory: None,
            mmp,
            fast_commits: None,
        };
        Fs::open_dev_again(dev, opts, reopen)
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
