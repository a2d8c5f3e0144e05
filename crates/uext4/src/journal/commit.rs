//! Appending a transaction to the log.

use super::format::{
    crc32_be, header, put_be32, put_be64, set_tail_csum, Tag, BT_COMMIT, BT_DESCRIPTOR,
    CHKSUM_TYPE_CRC32, COMMIT_CHKSUM, COMMIT_CHKSUM_SIZE, COMMIT_CHKSUM_TYPE, COMMIT_NSEC,
    COMMIT_SEC, FLAG_ESCAPE, FLAG_LAST_TAG, FLAG_SAME_UUID, HEADER_SIZE, JBD2_MAGIC,
};
use super::{revoke, Journal, LiveTxn};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

impl Journal {
    /// Log blocks a transaction of `nblocks` logged blocks and `nrevoked` revoked ones takes.
    pub fn blocks_needed(&self, nblocks: usize, nrevoked: usize) -> u64 {
        let bs = self.bs as usize;
        nblocks as u64
            + nblocks.div_ceil(self.fmt.tags_per_descriptor(bs)) as u64
            + nrevoked.div_ceil(self.fmt.revokes_per_block(bs)) as u64
            + 1
    }

    /// Whether a transaction of `nblocks` logged and `nrevoked` revoked blocks fits the log
    /// at all. A commit of one that does not is refused; the engine writes such a
    /// transaction home without the journal instead (see `write_transaction`).
    pub fn fits(&self, nblocks: usize, nrevoked: usize) -> bool {
        self.blocks_needed(nblocks, nrevoked) <= self.log_len() as u64
    }

    /// Appends one transaction (the new contents of `blocks`, by device block number, and
    /// the revoked block numbers) after the previous one and makes it durable: the log
    /// blocks, a flush, the commit block, a flush. Returns its sequence number. `tid_hint` is
    /// the caller's number for the transaction, used in messages only.
    ///
    /// The caller then writes the blocks home, flushes, and calls `checkpointed`.
    pub fn commit(&self, tid_hint: u64, blocks: &[(u64, Vec<u8>)], revoked: &[u64]) -> Result<u32> {
        let bs = self.bs as usize;
        let needed = self.commit_size(tid_hint, blocks, revoked)?;
        let mut log = self.log.lock();
        if log.unrecovered {
            return Err(Error::Invalid(
                "journal: the log holds transactions not yet recovered".into(),
            ));
        }
        self.wait_for_room(&mut log, needed)?;
        let tid = log.next_tid;
        let start = log.head;
        let result = (|| -> Result<u32> {
            self.prepare_sb(&mut log, tid, needed)?;
            let mut at = start;
            let mut put = |data: &[u8]| -> Result<()> {
                self.write_jblock(at, data)?;
                at = self.next(at);
                Ok(())
            };
            for b in revoke::revoke_blocks(&self.fmt, bs, self.seed, tid, revoked) {
                put(&b)?;
            }
            let mut crc_v1 = !0u32;
            let uuid = log.sb.uuid;
            self.write_descriptors(tid, &uuid, blocks, &mut put, &mut crc_v1)?;
            self.dev.flush()?;
            let c = self.commit_block(tid, crc_v1);
            put(&c)?;
            self.dev.flush()?;
            Ok(at)
        })();
        match result {
            Ok(end) => {
                debug_assert_eq!(
                    (end + self.log_len() - start) % self.log_len(),
                    needed % self.log_len()
                );
                log.head = end;
                log.next_tid = tid.wrapping_add(1);
                log.disk_used += needed;
                log.live.push_back(LiveTxn {
                    tid,
                    start,
                    len: needed,
                });
                self.update_free(&log);
                self.commits.fetch_add(1, Ordering::Relaxed);
                Ok(tid)
            }
            Err(e) => {
                self.abort_reason
                    .lock()
                    .get_or_insert_with(|| format!("writing transaction {tid} failed: {e}"));
                self.aborted.store(true, Ordering::Relaxed);
                tracing::error!(tid, tid_hint, "journal aborted: {e}");
                Err(e)
            }
        }
    }

    /// The log blocks a commit of `blocks` and `revoked` takes, after checking that the
    /// journal can hold them: whole blocks, block numbers the tags can carry, a transaction
    /// that fits the log.
    fn commit_size(
        &self,
        tid_hint: u64,
        blocks: &[(u64, Vec<u8>)],
        revoked: &[u64],
    ) -> Result<u32> {
        let bs = self.bs as usize;
        for (blk, data) in blocks {
            if data.len() != bs {
                return Err(Error::Invalid(format!(
                    "journal: block {blk} of transaction {tid_hint} has {} bytes, not {bs}",
                    data.len()
                )));
            }
        }
        if !self.fmt.has_64bit {
            if let Some(b) = blocks
                .iter()
                .map(|b| b.0)
                .chain(revoked.iter().copied())
                .find(|&b| b > u32::MAX as u64)
            {
                return Err(Error::Invalid(format!(
                    "journal: block {b} needs 64-bit block numbers, which this journal lacks"
                )));
            }
        }
        let needed = self.blocks_needed(blocks.len(), revoked.len());
        if needed > self.log_len() as u64 {
            return Err(Error::Invalid(format!(
                "transaction {tid_hint} of {needed} log blocks does not fit the journal ({} blocks)",
                self.log_len()
            )));
        }
        Ok(needed as u32)
    }

    /// The descriptor blocks of a transaction, each followed by the blocks its tags describe
    /// (a block that starts with the journal's magic number escaped), through `put`;
    /// `crc_v1` takes in each block for the v1 commit checksum.
    fn write_descriptors(
        &self,
        tid: u32,
        uuid: &[u8; 16],
        blocks: &[(u64, Vec<u8>)],
        put: &mut impl FnMut(&[u8]) -> Result<()>,
        crc_v1: &mut u32,
    ) -> Result<()> {
        let bs = self.bs as usize;
        for chunk in blocks.chunks(self.fmt.tags_per_descriptor(bs)) {
            let mut d = vec![0u8; bs];
            header(&mut d, BT_DESCRIPTOR, tid);
            let mut off = HEADER_SIZE;
            let mut copies = Vec::with_capacity(chunk.len());
            for (i, (blk, data)) in chunk.iter().enumerate() {
                let mut flags = 0;
                let escaped;
                let stored: &[u8] = if super::format::be32(data, 0) == JBD2_MAGIC {
                    let mut c = data.clone();
                    c[..4].fill(0);
                    flags |= FLAG_ESCAPE;
                    escaped = c;
                    &escaped
                } else {
                    data
                };
                if i > 0 {
                    flags |= FLAG_SAME_UUID;
                }
                if i + 1 == chunk.len() {
                    flags |= FLAG_LAST_TAG;
                }
                // The tag checksum covers the block as it is in the log (escaped).
                let checksum = if self.fmt.csum() {
                    self.fmt.data_csum(self.seed, tid, stored)
                } else {
                    0
                };
                let t = Tag {
                    blocknr: *blk,
                    flags,
                    checksum,
                };
                self.fmt.write_tag(&mut d, off, &t);
                off += self.fmt.tag_bytes();
                if i == 0 {
                    d[off..off + 16].copy_from_slice(uuid);
                    off += 16;
                }
                copies.push(if flags & FLAG_ESCAPE != 0 {
                    std::borrow::Cow::Owned(stored.to_vec())
                } else {
                    std::borrow::Cow::Borrowed(&data[..])
                });
            }
            if self.fmt.csum() {
                set_tail_csum(self.seed, &mut d);
            }
            put(&d)?;
            if self.compat_csum {
                *crc_v1 = crc32_be(*crc_v1, &d);
            }
            for c in copies {
                put(&c)?;
                if self.compat_csum {
                    *crc_v1 = crc32_be(*crc_v1, &c);
                }
            }
        }
        Ok(())
    }

    /// The commit block of transaction `tid`, with its time and checksum.
    fn commit_block(&self, tid: u32, crc_v1: u32) -> Vec<u8> {
        let bs = self.bs as usize;
        let mut c = vec![0u8; bs];
        header(&mut c, BT_COMMIT, tid);
        let now = crate::format::inode::Timestamp::now().at_most(self.time_clamp);
        put_be64(&mut c, COMMIT_SEC, now.sec as u64);
        put_be32(&mut c, COMMIT_NSEC, now.nsec);
        if self.compat_csum {
            c[COMMIT_CHKSUM_TYPE] = CHKSUM_TYPE_CRC32;
            c[COMMIT_CHKSUM_SIZE] = 4;
            put_be32(&mut c, COMMIT_CHKSUM, crc_v1);
        } else if self.fmt.csum() {
            let sum = super::format::commit_csum(self.seed, &c);
            put_be32(&mut c, COMMIT_CHKSUM, sum);
        }
        c
    }
}
