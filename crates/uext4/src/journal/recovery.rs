//! Recovery: the kernel's three passes over the log (fs/jbd2/recovery.c, which e2fsck
//! shares).
//!
//! - PASS_SCAN walks the log from s_start with the expected sequence s_sequence and finds the
//!   end: the first block that is not a descriptor, revoke or commit block of the expected
//!   transaction. A transaction without its commit block, or whose commit block fails its
//!   checksum, is not replayed. A descriptor or revoke block that fails its checksum in a
//!   transaction whose commit block is present and newer than the previous one is
//!   corruption (the kernel refuses to mount); with an older commit time it is a stale block
//!   of an earlier lap, and the log ends there.
//! - PASS_REVOKE collects the revoke records of the whole transactions: block -> the latest
//!   transaction revoking it.
//! - PASS_REPLAY writes each logged block home unless a same-or-later transaction revoked
//!   it. A logged block failing its tag checksum is skipped (the others are replayed) and
//!   recovery then fails, leaving the log in place, as the kernel does.

use super::format::{
    be32, be64, commit_csum, crc32_be, tail_csum_ok, tid_geq, BT_COMMIT, BT_DESCRIPTOR, BT_REVOKE,
    CHKSUM_TYPE_CRC32, COMMIT_CHKSUM, COMMIT_CHKSUM_SIZE, COMMIT_CHKSUM_TYPE, COMMIT_SEC,
    FLAG_ESCAPE, JBD2_MAGIC,
};
use super::revoke::{scan_revoke_block, RevokeTable};
use super::{Journal, RecoveryReport};
use crate::error::{Corruption, Error, Result};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Revoke,
    Replay,
}

/// What went wrong with individual logged blocks during the replay.
#[derive(Default)]
struct BlockErrors {
    count: u64,
    first: Option<String>,
}

impl Journal {
    /// Replays the log (scan, revoke, replay), flushes, and marks the journal empty:
    /// s_start = 0 and s_sequence = the first transaction not replayed + 1 (as the kernel
    /// and e2fsck). A journal that is already empty is left as it is.
    pub fn recover(&self) -> Result<RecoveryReport> {
        let (start, seq) = {
            let log = self.log.lock();
            (log.sb.start, log.sb.sequence)
        };
        let mut report = RecoveryReport {
            last_tid: seq.wrapping_sub(1),
            ..Default::default()
        };
        if start == 0 {
            return Ok(report);
        }
        let end = self.scan(start, seq)?;
        let mut revokes = RevokeTable::default();
        let mut errs = BlockErrors::default();
        self.pass(
            start,
            seq,
            end,
            Pass::Revoke,
            &mut revokes,
            &mut report,
            &mut errs,
        )?;
        self.pass(
            start,
            seq,
            end,
            Pass::Replay,
            &mut revokes,
            &mut report,
            &mut errs,
        )?;
        self.dev.flush()?;
        if errs.count > 0 {
            return Err(Error::bad_checksum(Corruption::Journal, format!(
                "journal recovery: {} logged block(s) could not be replayed (bad checksum or past the device's end) (first: {}); the log is left in place",
                errs.count,
                errs.first.unwrap_or_default()
            )));
        }
        report.transactions = end.wrapping_sub(seq);
        report.last_tid = end.wrapping_sub(1);
        let next = end.wrapping_add(1);
        let mut log = self.log.lock();
        self.write_sb(&mut log, 0, next)?;
        self.dev.flush()?;
        log.head = self.first;
        log.next_tid = next;
        log.live.clear();
        log.disk_used = 0;
        log.unrecovered = false;
        self.update_free(&log);
        tracing::info!(?report, "journal replayed");
        Ok(report)
    }

    /// PASS_SCAN alone: the first transaction the log does not hold whole, or None when the
    /// log is empty (s_start = 0: nothing is replayed, and the kernel then ignores the
    /// fast-commit area too). Fast commits are valid only when they carry this tid
    /// (jbd2's fc_do_one_pass hands the area over with info->end_transaction).
    pub fn log_end_tid(&self) -> Result<Option<u32>> {
        let (start, seq) = {
            let log = self.log.lock();
            (log.sb.start, log.sb.sequence)
        };
        if start == 0 {
            return Ok(None);
        }
        self.scan(start, seq).map(Some)
    }

    /// The fast-commit area's blocks in order (empty without one). The kernel writes its
    /// fast commits there, after the last full commit, each ending on a block boundary;
    /// what they mean is ext4's business (format::fast_commit).
    pub fn read_fast_commit_area(&self) -> Result<Vec<Vec<u8>>> {
        let Some(area) = self.fast_commit_area() else {
            return Ok(Vec::new());
        };
        area.map(|b| self.read_jblock(b)).collect()
    }

    /// PASS_SCAN: returns the first transaction that is not whole (the end of the log).
    fn scan(&self, start: u32, seq: u32) -> Result<u32> {
        let mut at = start;
        let mut tid = seq;
        let mut need_check_commit_time = false;
        let mut last_commit_time = 0u64;
        let mut crc = !0u32;
        for _ in 0..2 * self.maxlen as u64 + 2 {
            let here = at;
            let b = self.read_jblock(at)?;
            at = self.next(at);
            if be32(&b, 0) != JBD2_MAGIC || be32(&b, 8) != tid {
                return Ok(tid);
            }
            match be32(&b, 4) {
                BT_DESCRIPTOR => {
                    if self.fmt.csum() && !tail_csum_ok(self.seed, &b) {
                        need_check_commit_time = true;
                        tracing::debug!(here, tid, "descriptor block fails its checksum");
                    }
                    let tags = self.fmt.tags(&b);
                    if self.compat_csum && !need_check_commit_time {
                        crc = crc32_be(crc, &b);
                        for _ in 0..tags.len() {
                            let d = self.read_jblock(at)?;
                            crc = crc32_be(crc, &d);
                            at = self.next(at);
                        }
                    } else {
                        for _ in 0..tags.len() {
                            at = self.next(at);
                        }
                    }
                }
                BT_COMMIT => {
                    let commit_time = be64(&b, COMMIT_SEC);
                    if need_check_commit_time {
                        if commit_time >= last_commit_time {
                            return Err(Error::bad_checksum(Corruption::Journal, format!(
                                "journal transaction {tid}: a descriptor or revoke block fails its checksum although the transaction committed (commit block at log block {here})"
                            )));
                        }
                        // A stale block of an earlier lap: the log ends here.
                        return Ok(tid);
                    }
                    let mut ok = true;
                    if self.compat_csum {
                        let found = be32(&b, COMMIT_CHKSUM);
                        let (ty, sz) = (b[COMMIT_CHKSUM_TYPE], b[COMMIT_CHKSUM_SIZE]);
                        ok = (crc == found && ty == CHKSUM_TYPE_CRC32 && sz == 4)
                            || (ty == 0 && sz == 0 && found == 0);
                        crc = !0;
                    }
                    if self.fmt.csum() && commit_csum(self.seed, &b) != be32(&b, COMMIT_CHKSUM) {
                        ok = false;
                    }
                    if !ok {
                        // A torn commit (or a stale one, older than the last): not replayed.
                        tracing::debug!(here, tid, "commit block fails its checksum");
                        return Ok(tid);
                    }
                    last_commit_time = commit_time;
                    tid = tid.wrapping_add(1);
                }
                BT_REVOKE => {
                    if self.fmt.csum() && !tail_csum_ok(self.seed, &b) {
                        need_check_commit_time = true;
                        tracing::debug!(here, tid, "revoke block fails its checksum");
                    }
                }
                _ => return Ok(tid),
            }
        }
        Err(Error::corrupt(
            Corruption::Journal,
            "journal: the log does not end (more transactions than the log holds)",
        ))
    }

    /// PASS_REVOKE and PASS_REPLAY over the whole transactions seq..end.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &self,
        start: u32,
        seq: u32,
        end: u32,
        pass: Pass,
        revokes: &mut RevokeTable,
        report: &mut RecoveryReport,
        errs: &mut BlockErrors,
    ) -> Result<()> {
        let bs = self.bs as u64;
        let mut at = start;
        let mut tid = seq;
        while !tid_geq(tid, end) {
            let here = at;
            let b = self.read_jblock(at)?;
            at = self.next(at);
            if be32(&b, 0) != JBD2_MAGIC || be32(&b, 8) != tid {
                return Err(Error::corrupt(
                    Corruption::Journal,
                    format!(
                        "journal: log block {here} changed during recovery (transaction {tid} expected)"
                    ),
                ));
            }
            match be32(&b, 4) {
                BT_DESCRIPTOR => {
                    if self.fmt.csum() && !tail_csum_ok(self.seed, &b) {
                        return Err(Error::bad_checksum(
                            Corruption::Journal,
                            format!("journal descriptor block {here} (transaction {tid})"),
                        ));
                    }
                    for tag in self.fmt.tags(&b) {
                        let io = at;
                        at = self.next(at);
                        if pass != Pass::Replay {
                            continue;
                        }
                        if revokes.revoked(tag.blocknr, tid) {
                            report.blocks_revoked += 1;
                            continue;
                        }
                        let mut data = self.read_jblock(io)?;
                        if self.fmt.csum()
                            && self.fmt.data_csum(self.seed, tid, &data) != tag.checksum
                        {
                            errs.count += 1;
                            errs.first.get_or_insert_with(|| {
                                format!(
                                    "block {} logged in journal block {io}, transaction {tid}",
                                    tag.blocknr
                                )
                            });
                            continue;
                        }
                        if tag.flags & FLAG_ESCAPE != 0 {
                            data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                        }
                        let off = tag
                            .blocknr
                            .checked_mul(bs)
                            .filter(|o| o.checked_add(bs).is_some_and(|e| e <= self.dev.size()));
                        let Some(off) = off else {
                            errs.count += 1;
                            errs.first.get_or_insert_with(|| {
                                format!(
                                    "block {} (past the end of the device) logged in journal block {io}, transaction {tid}",
                                    tag.blocknr
                                )
                            });
                            continue;
                        };
                        self.dev.write_at(off, &data)?;
                        report.blocks_replayed += 1;
                    }
                }
                BT_COMMIT => tid = tid.wrapping_add(1),
                BT_REVOKE => {
                    if pass == Pass::Revoke {
                        scan_revoke_block(&self.fmt, &b, tid, here, revokes)?;
                    }
                }
                other => {
                    return Err(Error::corrupt(
                        Corruption::Journal,
                        format!("journal: log block {here} has unknown block type {other}"),
                    ))
                }
            }
        }
        Ok(())
    }
}
