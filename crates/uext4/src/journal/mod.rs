//! jbd2: the journal inside the filesystem (inode 8), as the kernel and e2fsck read it
//! (Documentation/filesystems/ext4/journal.rst). Big-endian on disk. It knows nothing of ext4:
//! it is given the journal's block map and a device.
//!
//! - [`format`]: the on-disk structures (superblock, tags, checksums);
//! - `commit.rs`: appending a transaction to the circular log (revoke blocks, descriptor
//!   blocks with one tag per logged block, the blocks themselves, escaped when they begin with
//!   the jbd2 magic, then a flush, the commit block and another flush);
//! - `checkpoint.rs`: log space and checkpointing. Committed transactions are queued with
//!   their blocks (`queue_checkpoint`) and stay live until the journal's checkpoint thread
//!   has written them home (`checkpointed`); the journal superblock's s_start/s_sequence is moved
//!   lazily, only before the log would overwrite a block the on-disk superblock still claims;
//! - `recovery.rs`: the kernel's three passes (scan, revoke, replay);
//! - `revoke.rs`: revoke records (the table of recovery, the blocks of commit);
//! - `fast_commit.rs`: where ext4's fast commits go in the area after the log.
//!
//! Recovery follows the kernel's fs/jbd2/recovery.c and e2fsck: after a replay the superblock
//! says s_start = 0 and s_sequence = (the first transaction not replayed) + 1, so that no
//! commit record left in the log can match again; images replayed by us and by e2fsck are
//! identical.
//!
//! If a write to the log or a checkpoint write fails the journal is aborted (as jbd2 does;
//! the engine may abort it too: `Journal::abort`): every later commit fails, and `set_clean`
//! refuses, leaving the log to recovery.

pub mod format;

mod checkpoint;
mod commit;
mod fast_commit;
mod recovery;
mod revoke;

use crate::blockdev::BlockDevice;
use crate::error::{Corruption, Error, Result};
use format::{JournalSuperblock, TagFormat, COMPAT_CHECKSUM, INCOMPAT_KNOWN};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub use checkpoint::CheckpointHooks;
pub use fast_commit::{FcBlocks, FcSlot};
pub use format::JBD2_MAGIC;

/// Where the journal's blocks are: runs of (journal block, device block, length).
#[derive(Clone, Debug, Default)]
pub struct JournalMap(pub Vec<(u32, u64, u32)>);

impl JournalMap {
    pub fn new(mut runs: Vec<(u32, u64, u32)>) -> Self {
        runs.retain(|r| r.2 > 0);
        runs.sort_unstable_by_key(|r| r.0);
        JournalMap(runs)
    }

    /// The device block of journal block `jblk`.
    pub fn phys(&self, jblk: u32) -> Option<u64> {
        let i = self.0.partition_point(|r| r.0 <= jblk);
        let (l, p, n) = *self.0.get(i.checked_sub(1)?)?;
        (jblk - l < n).then(|| p + (jblk - l) as u64)
    }

    /// Whether journal blocks 0..n are all mapped.
    fn covers(&self, n: u32) -> bool {
        let mut next = 0u32;
        for &(l, _, len) in &self.0 {
            if l > next {
                return false;
            }
            next = next.max(l.saturating_add(len));
            if next >= n {
                return true;
            }
        }
        next >= n
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Whole transactions replayed.
    pub transactions: u32,
    /// Logged blocks written to their home locations.
    pub blocks_replayed: u64,
    /// Logged blocks not written because a same-or-later transaction revoked them.
    pub blocks_revoked: u64,
    /// The last transaction replayed (s_sequence - 1 when there was none).
    pub last_tid: u32,
}

/// A committed transaction whose blocks may not yet be home.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveTxn {
    tid: u32,
    /// Its first log block.
    start: u32,
    /// Log blocks it takes.
    len: u32,
}

/// The mutable state of the log.
pub(crate) struct Log {
    /// The journal superblock as last written.
    sb: JournalSuperblock,
    /// Next log block to write.
    head: u32,
    /// Sequence number of the next transaction.
    next_tid: u32,
    /// Committed transactions not yet checkpointed, oldest first.
    live: VecDeque<LiveTxn>,
    /// Log blocks written since the on-disk superblock's s_start (what it claims is live).
    disk_used: u32,
    /// The log held transactions at open and `recover` has not replayed them yet.
    unrecovered: bool,
}

pub struct Journal {
    dev: Arc<dyn BlockDevice>,
    bs: u32,
    map: JournalMap,
    first: u32,
    maxlen: u32,
    /// One past the log's last block: `maxlen`, or with fast commits the start of the
    /// fast-commit area less one (the kernel's j_last). Commits and recovery wrap here.
    last: u32,
    /// The fast-commit area, journal blocks `fc.start..fc.end` (the kernel's
    /// j_fc_first..j_fc_last), when the journal has INCOMPAT_FAST_COMMIT. Never log space.
    fc: Option<std::ops::Range<u32>>,
    /// The transaction whose fast commits the area holds, and the area blocks they take
    /// (fast_commit.rs); stale once the log holds that transaction whole.
    fc_used: Mutex<(u32, u32)>,
    /// Blocks written to the fast-commit area.
    pub fc_blocks_written: AtomicU64,
    fmt: TagFormat,
    /// The old whole-transaction crc32_be checksum (COMPAT_CHECKSUM).
    compat_csum: bool,
    seed: u32,
    log: Mutex<Log>,
    /// Signalled by `checkpointed`.
    space: Condvar,
    /// Background checkpointing (checkpoint.rs).
    ckpt: Arc<checkpoint::Checkpointer>,
    aborted: AtomicBool,
    /// Why it was aborted (the first reason), for the errors of later commits.
    abort_reason: Mutex<Option<String>>,
    free: AtomicU32,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Blocks written to the log (descriptors, data, revoke and commit blocks).
    pub log_blocks_written: AtomicU64,
    /// Times a commit had to wait for the log's tail to advance.
    pub checkpoint_waits: AtomicU64,
    /// Commit blocks record no time later than this (reproducible builds).
    time_clamp: Option<i64>,
}

impl Journal {
    /// Opens the journal whose blocks `map` describes, validating its superblock.
    pub fn open(dev: Arc<dyn BlockDevice>, fs_block_size: u32, map: JournalMap) -> Result<Journal> {
        let map = JournalMap::new(map.0);
        let bs = fs_block_size;
        if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
            return Err(Error::Invalid(format!("journal: block size {bs}")));
        }
        let p0 = map.phys(0).ok_or_else(|| {
            Error::corrupt(
                Corruption::Journal,
                "journal: the journal inode maps no block 0",
            )
        })?;
        if (p0 + 1) * bs as u64 > dev.size() {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!("journal: superblock block {p0} is past the end of the device"),
            ));
        }
        let mut raw = vec![0u8; format::SB_SIZE];
        dev.read_at(p0 * bs as u64, &mut raw)?;
        let sb = JournalSuperblock::parse(&raw).map_err(|e| match e {
            Error::Corrupt { kind, detail: m } => Error::Corrupt {
                kind,
                detail: format!("{m} (journal block 0, device block {p0})"),
            },
            Error::BadChecksum { kind, detail: m } => Error::BadChecksum {
                kind,
                detail: format!("{m} (journal block 0, device block {p0})"),
            },
            e => e,
        })?;
        if sb.block_size != bs {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!(
                    "journal superblock: block size {} differs from the filesystem's {bs}",
                    sb.block_size
                ),
            ));
        }
        let mapped: u64 = map.0.iter().map(|r| r.2 as u64).sum();
        if sb.maxlen < 32 || !map.covers(sb.maxlen) {
            return Err(Error::corrupt(Corruption::Journal, format!(
                "journal superblock: length {} does not fit the journal inode ({mapped} blocks mapped)",
                sb.maxlen
            )));
        }
        if sb.first == 0 || sb.first >= sb.maxlen {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!(
                    "journal superblock: first log block {} outside 1..{}",
                    sb.first, sb.maxlen
                ),
            ));
        }
        let (last, fc) = log_end(&sb)?;
        if sb.start != 0 && (sb.start < sb.first || sb.start >= last) {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!(
                    "journal superblock: log start {} outside {}..{last}",
                    sb.start, sb.first
                ),
            ));
        }
        for r in &map.0 {
            if (r.1 + r.2 as u64) * bs as u64 > dev.size() {
                return Err(Error::corrupt(
                    Corruption::Journal,
                    format!(
                        "journal: blocks {}..{} are past the end of the device",
                        r.1,
                        r.1 + r.2 as u64
                    ),
                ));
            }
        }
        if sb.nr_users > 1 {
            // Only an external journal device is shared, and this one is the journal inode's
            // (an external journal is refused before this): users past one mean its v2 fields
            // are damaged, as e2fsck's e2fsck_journal_load reads it (a v2 internal journal
            // with s_nr_users > 1 has them cleared). Corrupt, not "shared".
            return Err(Error::corrupt(
                Corruption::Journal,
                format!(
                    "journal superblock: {} users (s_nr_users) in the journal inode's \
                     superblock, where an internal journal has one: its v2 fields are corrupt",
                    sb.nr_users
                ),
            ));
        }
        let unknown = sb.feature_incompat & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(Error::Unsupported(format!(
                "journal incompatible features {unknown:#x}"
            )));
        }
        let fmt = TagFormat::from_incompat(sb.feature_incompat);
        let compat_csum = sb.feature_compat & COMPAT_CHECKSUM != 0;
        if compat_csum && fmt.csum() {
            return Err(Error::corrupt(
                Corruption::Journal,
                "journal superblock: both the v1 and the v2/v3 checksum features are set",
            ));
        }
        let seed = sb.csum_seed();
        let unrecovered = sb.start != 0;
        let j = Journal {
            dev,
            bs,
            map,
            first: sb.first,
            maxlen: sb.maxlen,
            last,
            fc,
            fc_used: Mutex::new((0, 0)),
            fc_blocks_written: AtomicU64::new(0),
            fmt,
            compat_csum,
            seed,
            log: Mutex::new(Log {
                head: if sb.start == 0 { sb.first } else { sb.start },
                next_tid: sb.sequence,
                sb,
                live: VecDeque::new(),
                disk_used: 0,
                unrecovered,
            }),
            space: Condvar::new(),
            ckpt: Default::default(),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            free: AtomicU32::new(0),
            commits: AtomicU64::new(0),
            log_blocks_written: AtomicU64::new(0),
            checkpoint_waits: AtomicU64::new(0),
            time_clamp: None,
        };
        j.update_free(&j.log.lock());
        Ok(j)
    }

    /// Whether the log holds transactions (s_start != 0): recovery must run before the
    /// filesystem is used.
    pub fn needs_recovery(&self) -> bool {
        self.log.lock().sb.start != 0
    }

    /// The journal superblock as last read or written.
    pub fn superblock(&self) -> JournalSuperblock {
        self.log.lock().sb.clone()
    }

    /// Log blocks, the superblock and the fast-commit area excluded.
    pub fn log_len(&self) -> u32 {
        self.last - self.first
    }

    /// Where the journal's blocks are on the device.
    pub fn map(&self) -> &JournalMap {
        &self.map
    }

    /// The fast-commit area (journal blocks), when the journal has one.
    pub fn fast_commit_area(&self) -> Option<std::ops::Range<u32>> {
        self.fc.clone()
    }

    /// Blocks a transaction may use (a quarter of the log, as the kernel's default).
    pub fn max_transaction_blocks(&self) -> usize {
        (self.log_len() / 4) as usize
    }

    /// Whether a log write failed (the journal then refuses commits).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }

    /// Turns on checksum v3 and 64-bit block numbers in an empty journal, as the kernel does
    /// at mount for filesystems with metadata_csum and 64bit. Does nothing when the features
    /// are already set; refused while the log holds transactions.
    /// Commit blocks record no time later than `clamp` (`MountOptions::time_clamp`).
    pub fn set_time_clamp(&mut self, clamp: Option<i64>) {
        self.time_clamp = clamp;
    }

    /// Sets INCOMPAT_FAST_COMMIT in an empty journal, as the kernel does at mount of a
    /// filesystem with the fast_commit feature (jbd2_journal_set_features): from then on the
    /// journal's last s_num_fc_blks blocks are its fast-commit area and the log stops before
    /// them, for uext4 and for the kernel alike. Does nothing when it is set already, or when
    /// the area would leave too short a log (the kernel then refuses fast commits too);
    /// refused while the log holds transactions. Returns whether the journal has the area.
    pub fn enable_fast_commit(&mut self) -> Result<bool> {
        let log = self.log.get_mut();
        if self.fc.is_some() {
            return Ok(true);
        }
        let mut sb = log.sb.clone();
        if sb.blocktype != format::BT_SB_V2 {
            return Ok(false);
        }
        sb.feature_incompat |= format::INCOMPAT_FAST_COMMIT;
        let Ok((last, fc)) = log_end(&sb) else {
            return Ok(false);
        };
        if log.sb.start != 0 || !log.live.is_empty() {
            return Err(Error::Invalid(
                "journal: features change only while the log is empty".into(),
            ));
        }
        let p0 = self.map.phys(0).expect("checked at open");
        self.dev.write_at(p0 * self.bs as u64, &sb.to_bytes())?;
        self.dev.flush()?;
        log.sb = sb;
        log.head = self.first;
        self.last = last;
        self.fc = fc;
        self.update_free(&self.log.lock());
        Ok(true)
    }

    pub fn set_features(&mut self, csum_v3: bool, has_64bit: bool) -> Result<()> {
        let log = self.log.get_mut();
        let mut want = log.sb.feature_incompat;
        if csum_v3 && !self.fmt.csum_v3 {
            want = (want | format::INCOMPAT_CSUM_V3) & !format::INCOMPAT_CSUM_V2;
        }
        if has_64bit {
            want |= format::INCOMPAT_64BIT;
        }
        if want == log.sb.feature_incompat {
            return Ok(());
        }
        if log.sb.start != 0 || !log.live.is_empty() {
            return Err(Error::Invalid(
                "journal: features change only while the log is empty".into(),
            ));
        }
        if log.sb.blocktype != format::BT_SB_V2 {
            return Err(Error::Unsupported(
                "features of a v1 journal superblock".into(),
            ));
        }
        let mut sb = log.sb.clone();
        sb.feature_incompat = want;
        if csum_v3 {
            sb.feature_compat &= !COMPAT_CHECKSUM;
            sb.checksum_type = format::CSUM_TYPE_CRC32C;
        }
        let p0 = self.map.phys(0).expect("checked at open");
        self.dev.write_at(p0 * self.bs as u64, &sb.to_bytes())?;
        self.dev.flush()?;
        log.sb = sb;
        self.fmt = TagFormat::from_incompat(want);
        self.compat_csum = log.sb.feature_compat & COMPAT_CHECKSUM != 0;
        Ok(())
    }

    /// Marks the journal empty (s_start = 0), as at a clean unmount. Every committed
    /// transaction must have been checkpointed.
    pub fn set_clean(&self) -> Result<()> {
        self.check_aborted()?;
        let mut log = self.log.lock();
        if let Some(t) = log.live.front() {
            return Err(Error::Invalid(format!(
                "journal: transaction {} is not checkpointed yet",
                t.tid
            )));
        }
        let seq = log.next_tid;
        self.write_sb(&mut log, 0, seq)?;
        self.dev.flush()?;
        log.head = self.first;
        self.update_free(&log);
        Ok(())
    }

    fn phys(&self, jblk: u32) -> Result<u64> {
        if jblk >= self.maxlen {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!(
                    "journal block {jblk} is past the log's end ({})",
                    self.maxlen
                ),
            ));
        }
        self.map.phys(jblk).ok_or_else(|| {
            Error::corrupt(
                Corruption::Journal,
                format!("journal block {jblk} is not mapped"),
            )
        })
    }

    fn read_jblock(&self, jblk: u32) -> Result<Vec<u8>> {
        let p = self.phys(jblk)?;
        let mut b = vec![0u8; self.bs as usize];
        self.dev.read_at(p * self.bs as u64, &mut b)?;
        Ok(b)
    }

    fn write_jblock(&self, jblk: u32, data: &[u8]) -> Result<()> {
        let p = self.phys(jblk)?;
        self.dev.write_at(p * self.bs as u64, data)?;
        self.log_blocks_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The log block after `b`, wrapping from the end of the log to its first block. With
    /// fast commits the log ends before the fast-commit area, as the kernel writes it
    /// (jbd2_journal_next_log_block wraps at j_last). Some kernels' recovery wraps at the
    /// area's end instead (recovery.c's `wrap` with j_fc_last), a mismatch with their own
    /// writer; we follow the writer, whose logs never enter the area.
    fn next(&self, b: u32) -> u32 {
        if b + 1 >= self.last {
            self.first
        } else {
            b + 1
        }
    }

    /// Writes the superblock with `start` and `seq` (no flush).
    fn write_sb(&self, log: &mut Log, start: u32, seq: u32) -> Result<()> {
        let mut sb = log.sb.clone();
        sb.start = start;
        sb.sequence = seq;
        let p0 = self.phys(0)?;
        self.dev.write_at(p0 * self.bs as u64, &sb.to_bytes())?;
        log.sb = sb;
        Ok(())
    }
}

/// Where the log ends and the fast-commit area lies, as e2fsck's e2fsck_get_journal and the
/// kernel's jbd2_journal_initialize_fast_commit compute them: the area is the journal's last
/// s_num_fc_blks blocks, the log ends one block before it (j_fc_first = j_last + 1), and the
/// log keeps at least MIN_JOURNAL_BLOCKS.
fn log_end(sb: &JournalSuperblock) -> Result<(u32, Option<std::ops::Range<u32>>)> {
    let Some(n) = sb.fc_blocks() else {
        return Ok((sb.maxlen, None));
    };
    match sb.maxlen.checked_sub(n) {
        Some(last) if last >= format::MIN_JOURNAL_BLOCKS && last > sb.first => {
            Ok((last, Some(last + 1..sb.maxlen)))
        }
        _ => Err(Error::corrupt(
            Corruption::Journal,
            format!(
                "journal superblock: a fast-commit area of {n} blocks leaves too short a log \
                 in {} blocks (at least {} are needed)",
                sb.maxlen,
                format::MIN_JOURNAL_BLOCKS
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
