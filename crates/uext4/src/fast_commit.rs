//! Fast commits (fs/ext4/fast_commit.c): the kernel's ext4 writes, on fsync, small logical
//! records of what changed (format::fast_commit) into the journal's fast-commit area instead
//! of a full jbd2 commit. After a crash they follow the log's last full commit; recovery
//! replays the log, then these records, as the kernel at mount and e2fsck do.
//!
//! uext4 itself does full commits only: it never writes the area, and its log stops short of
//! it (journal/mod.rs).

use crate::error::{Error, Result};
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
        let fc = scan(&journal.read_fast_commit_area()?, tid)?;
        if !fc.is_empty() {
            return Err(Error::Unsupported(format!(
                "the journal holds {} fast commit(s) of transaction {tid}, which uext4 cannot \
                 replay yet (mount it with the kernel or run e2fsck -fy first)",
                fc.commits
            )));
        }
        Ok(fc)
    }
}
