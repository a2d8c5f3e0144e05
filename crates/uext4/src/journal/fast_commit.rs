//! The journal's side of fast commits (jbd2_fc_begin_commit, jbd2_fc_get_buf,
//! jbd2_fc_end_commit): where in the fast-commit area the next one goes. What the blocks
//! hold is ext4's business (format::fast_commit); the journal only places them after those
//! already written for the running transaction, and forgets them at its full commit (the
//! kernel's j_fc_off = 0): records of a transaction the log holds whole are never replayed.
//!
//! Each fast commit is followed by a zeroed block, and the area's last block is never used
//! for records. The kernel's recovery (and e2fsck's, the same recovery.c) reads area blocks
//! until its scan says stop, and its loop runs to j_fc_last = s_maxlen inclusive, one past
//! the journal: an area whose every block held good records of the transaction would make
//! it read that block and fail ("JBD2: corrupted journal superblock"), and a stale block of
//! an older fast commit without its TAIL would make it read on. A zero block stops its scan
//! (tag 0, after a good TAIL).

use super::Journal;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// Where a fast commit goes: the transaction it belongs to (the one the log will hold
/// next), and the free part of the area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FcSlot {
    /// The running transaction's jbd2 tid: every record of the fast commit carries it.
    pub tid: u32,
    /// The area block it starts at; 0 means it is the transaction's first (it opens with
    /// HEAD).
    pub first: u32,
    /// Area blocks left from `first`.
    pub room: u32,
}

/// A fast commit ready to write.
#[derive(Debug)]
pub struct FcBlocks {
    pub slot: FcSlot,
    /// Whole blocks, the last ending with TAIL.
    pub blocks: Vec<Vec<u8>>,
}

impl Journal {
    /// Where a fast commit would go now, or None when none may be written: no area, a
    /// journal aborted or not recovered, or a log that is empty on disk (s_start = 0:
    /// recovery would not look at the area, so the kernel requires a full commit first).
    pub fn fc_slot(&self) -> Option<FcSlot> {
        let area = self.fc.clone()?;
        if self.is_aborted() {
            return None;
        }
        let log = self.log.lock();
        if log.unrecovered || log.sb.start == 0 {
            return None;
        }
        let tid = log.next_tid;
        let used = self.fc_used.lock();
        let first = if used.0 == tid { used.1 } else { 0 };
        let len = area.end - area.start;
        Some(FcSlot {
            tid,
            first,
            // The block after the fast commit is its zeroed guard.
            room: len.saturating_sub(first + 1),
        })
    }

    /// Writes a fast commit where `fc_slot` said, after a flush (the data it maps must be on
    /// the device first), and flushes. Refused if a full commit happened since the slot was
    /// taken.
    pub fn fc_write(&self, fc: &FcBlocks) -> Result<()> {
        let area = self.fc.clone().ok_or_else(|| {
            Error::Invalid("journal: no fast-commit area to write a fast commit to".into())
        })?;
        self.check_aborted()?;
        let now = self.fc_slot();
        if now != Some(fc.slot) || fc.blocks.len() as u32 > fc.slot.room {
            return Err(Error::Invalid(format!(
                "journal: fast commit for {:?} no longer fits ({now:?})",
                fc.slot
            )));
        }
        self.dev.flush()?;
        let guard = vec![0u8; self.bs as usize];
        let at = area.start + fc.slot.first;
        for (i, b) in fc.blocks.iter().chain([&guard]).enumerate() {
            let p = self.phys(at + i as u32)?;
            self.dev.write_at(p * self.bs as u64, b)?;
        }
        self.dev.flush()?;
        *self.fc_used.lock() = (fc.slot.tid, fc.slot.first + fc.blocks.len() as u32);
        self.fc_blocks_written
            .fetch_add(fc.blocks.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
