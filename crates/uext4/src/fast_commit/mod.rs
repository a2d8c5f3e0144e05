//! Fast commits (fs/ext4/fast_commit.c): the kernel's ext4 writes, on fsync, small logical
//! records of what changed (format::fast_commit) into the journal's fast-commit area instead
//! of a full jbd2 commit. After a crash they follow the log's last full commit; recovery
//! replays the log, then these records, as the kernel at mount and e2fsck do.
//!
//! uext4 writes them too, for fsyncs whose changes fit them (`commit.rs`; its own log stops
//! short of the area: journal/mod.rs). `replay.rs` applies the records; recovery.rs calls it.

mod commit;
mod replay;

use crate::error::Result;
use crate::format::fast_commit::{scan, FastCommits};
use crate::fs::Fs;
use crate::journal::Journal;

impl Fs {
    /// The fast commits recovery would replay after the log: those of the first transaction
    /// the log does not hold whole, when the log needs recovery and the journal has a
    /// fast-commit area (empty otherwise).
    pub(crate) fn pending_fast_commits(&self, journal: &Journal) -> Result<FastCommits> {
        let Some(tid) = journal.log_end_tid()? else {
            return Ok(FastCommits::default());
        };
        if journal.fast_commit_area().is_none() {
            return Ok(FastCommits::default());
        }
        scan(&journal.read_fast_commit_area()?, tid)
    }
}
