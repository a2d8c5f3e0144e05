//! jbd2: the journal inside the filesystem (inode 8), as the kernel and e2fsck read it
//! (Documentation/filesystems/ext4/journal.rst). Big-endian on disk. It knows nothing of ext4:
//! it is given the journal's block map and a device.
//!
//! Writing: each transaction is appended to the circular log as revoke blocks, descriptor blocks
//! (one tag per logged block), the blocks themselves (escaped when they begin with the jbd2
//! magic), then a flush and the commit block and another flush. The engine writes the blocks home
//! and flushes right after each commit (`checkpointed`), so everything before the running
//! transaction is always checkpointed: the journal superblock is rewritten only when the log
//! wraps (to move s_start), at the first commit after an empty journal, and at unmount
//! (s_start = 0: empty).
//!
//! Recovery: the three passes of the kernel (scan for the end of the last whole transaction,
//! collect revokes, replay), checking every checksum; an incomplete last transaction is
//! discarded.

pub mod format;

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::csum::crc32c;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const JBD2_MAGIC: u32 = 0xC03B_3998;
const BT_DESCRIPTOR: u32 = 1;
const BT_COMMIT: u32 = 2;
const BT_SB_V1: u32 = 3;
const BT_SB_V2: u32 = 4;
const BT_REVOKE: u32 = 5;

const INCOMPAT_REVOKE: u32 = 0x1;
const INCOMPAT_64BIT: u32 = 0x2;
const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
const INCOMPAT_CSUM_V2: u32 = 0x8;
const INCOMPAT_CSUM_V3: u32 = 0x10;
const INCOMPAT_FAST_COMMIT: u32 = 0x20;
const INCOMPAT_KNOWN: u32 =
    INCOMPAT_REVOKE | INCOMPAT_64BIT | INCOMPAT_ASYNC_COMMIT | INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3;

const FLAG_ESCAPE: u32 = 1;
const FLAG_SAME_UUID: u32 = 2;
const FLAG_LAST_TAG: u32 = 8;

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}
fn put_be32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}

/// Where the journal's blocks are: runs of (journal block, device block, length).
#[derive(Clone, Debug, Default)]
pub struct JournalMap(pub Vec<(u32, u64, u32)>);

impl JournalMap {
    fn phys(&self, jblk: u32) -> Option<u64> {
        self.0
            .iter()
            .find(|(l, _, n)| jblk >= *l && jblk < l + n)
            .map(|(l, p, _)| p + (jblk - l) as u64)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct RecoveryReport {
    pub transactions: u32,
    pub blocks_replayed: u64,
    pub blocks_revoked: u64,
    pub last_tid: u32,
}

struct Log {
    /// The journal superblock as on disk (1024 bytes).
    sb: Vec<u8>,
    /// Next log block to write.
    head: u32,
    /// Sequence number of the next transaction.
    next_tid: u32,
    /// Whether the on-disk superblock says the log is empty (s_start == 0).
    empty_on_disk: bool,
}

pub struct Journal {
    dev: Arc<dyn BlockDevice>,
    bs: u32,
    map: JournalMap,
    first: u32,
    maxlen: u32,
    csum_v3: bool,
    csum_v2: bool,
    has_64bit: bool,
    seed: u32,
    log: Mutex<Log>,
    pub log_blocks_written: AtomicU64,
    pub commits: AtomicU64,
}

impl Journal {
    /// Opens the journal whose blocks `map` describes, validating its superblock.
    pub fn open(dev: Arc<dyn BlockDevice>, fs_block_size: u32, map: JournalMap) -> Result<Journal> {
        let bs = fs_block_size;
        let p0 = map
            .phys(0)
            .ok_or_else(|| Error::corrupt("journal inode maps no block 0"))?;
        let mut sb = vec![0u8; 1024];
        dev.read_at(p0 * bs as u64, &mut sb)?;
        if be32(&sb, 0) != JBD2_MAGIC {
            return Err(Error::corrupt(format!(
                "journal superblock: bad magic {:#010x}",
                be32(&sb, 0)
            )));
        }
        let bt = be32(&sb, 4);
        if bt != BT_SB_V1 && bt != BT_SB_V2 {
            return Err(Error::corrupt(format!(
                "journal superblock: unknown block type {bt}"
            )));
        }
        if be32(&sb, 0xC) != bs {
            return Err(Error::corrupt(format!(
                "journal block size {} differs from the filesystem's {bs}",
                be32(&sb, 0xC)
            )));
        }
        let maxlen = be32(&sb, 0x10);
        let first = be32(&sb, 0x14);
        let mapped: u32 = map.0.iter().map(|r| r.2).sum();
        if maxlen < 64 || maxlen > mapped || first == 0 || first >= maxlen {
            return Err(Error::corrupt(format!("journal superblock: length {maxlen} / first block {first} do not fit the journal inode ({mapped} blocks)")));
        }
        let incompat = if bt == BT_SB_V2 { be32(&sb, 0x28) } else { 0 };
        if incompat & INCOMPAT_FAST_COMMIT != 0 {
            return Err(Error::Unsupported("journal feature fast_commit".into()));
        }
        if incompat & !INCOMPAT_KNOWN != 0 {
            return Err(Error::Unsupported(format!(
                "journal incompatible features {:#x}",
                incompat & !INCOMPAT_KNOWN
            )));
        }
        if bt == BT_SB_V2 && be32(&sb, 0x40) > 1 {
            return Err(Error::Unsupported(
                "a journal shared by several filesystems (external journal device)".into(),
            ));
        }
        let csum_v3 = incompat & INCOMPAT_CSUM_V3 != 0;
        let csum_v2 = incompat & INCOMPAT_CSUM_V2 != 0;
        let uuid: [u8; 16] = sb[0x30..0x40].try_into().unwrap();
        if (csum_v2 || csum_v3) && sb[0x50] == 4 {
            let mut c = sb.clone();
            put_be32(&mut c, 0xFC, 0);
            if crc32c(!0, &c) != be32(&sb, 0xFC) {
                return Err(Error::BadChecksum("journal superblock".into()));
            }
        }
        let start = be32(&sb, 0x1C);
        let seq = be32(&sb, 0x18);
        Ok(Journal {
            dev,
            bs,
            map,
            first,
            maxlen,
            csum_v3,
            csum_v2,
            has_64bit: incompat & INCOMPAT_64BIT != 0,
            seed: crc32c(!0, &uuid),
            log: Mutex::new(Log {
                sb,
                head: first,
                next_tid: seq,
                empty_on_disk: start == 0,
            }),
            log_blocks_written: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        })
    }

    pub fn needs_recovery(&self) -> bool {
        be32(&self.log.lock().sb, 0x1C) != 0
    }

    /// Blocks a transaction may use (a quarter of the log, as the kernel's default).
    pub fn max_transaction_blocks(&self) -> usize {
        ((self.maxlen - self.first) / 4) as usize
    }

    fn csum(&self) -> bool {
        self.csum_v2 || self.csum_v3
    }

    fn tag_bytes(&self) -> usize {
        if self.csum_v3 {
            16
        } else {
            let sz = 12 + if self.csum_v2 { 2 } else { 0 };
            if self.has_64bit {
                sz
            } else {
                sz - 4
            }
        }
    }

    fn read_jblock(&self, jblk: u32) -> Result<Vec<u8>> {
        let p = self
            .map
            .phys(jblk)
            .ok_or_else(|| Error::corrupt(format!("journal block {jblk} is not mapped")))?;
        let mut b = vec![0u8; self.bs as usize];
        self.dev.read_at(p * self.bs as u64, &mut b)?;
        Ok(b)
    }

    fn write_jblock(&self, jblk: u32, data: &[u8]) -> Result<()> {
        let p = self
            .map
            .phys(jblk)
            .ok_or_else(|| Error::corrupt(format!("journal block {jblk} is not mapped")))?;
        self.dev.write_at(p * self.bs as u64, data)?;
        self.log_blocks_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn next(&self, b: u32) -> u32 {
        if b + 1 >= self.maxlen {
            self.first
        } else {
            b + 1
        }
    }

    fn write_sb(&self, log: &mut Log, start: u32, seq: u32) -> Result<()> {
        put_be32(&mut log.sb, 0x1C, start);
        put_be32(&mut log.sb, 0x18, seq);
        if self.csum() && log.sb[0x50] == 4 {
            put_be32(&mut log.sb, 0xFC, 0);
            let c = crc32c(!0, &log.sb);
            put_be32(&mut log.sb, 0xFC, c);
        }
        let p0 = self.map.phys(0).unwrap();
        self.dev.write_at(p0 * self.bs as u64, &log.sb)?;
        log.empty_on_disk = start == 0;
        Ok(())
    }

    fn block_tail_csum(&self, b: &mut [u8]) {
        if self.csum() {
            let n = b.len();
            put_be32(b, n - 4, 0);
            let c = crc32c(self.seed, b);
            put_be32(b, n - 4, c);
        }
    }

    /// Appends one transaction and makes it durable. Returns its sequence number. The caller
    /// writes the blocks home afterwards and then calls `checkpointed`.
    pub fn commit(&self, blocks: &[(u64, Vec<u8>)], revoked: &[u64]) -> Result<u32> {
        let bs = self.bs as usize;
        let tag = self.tag_bytes();
        let tail = if self.csum() { 4 } else { 0 };
        let per_desc = (bs - 12 - tail - 16) / tag;
        let rec = if self.has_64bit { 8 } else { 4 };
        let per_revoke = (bs - 16 - tail) / rec;
        let needed = blocks.len()
            + blocks.len().div_ceil(per_desc.max(1))
            + revoked.len().div_ceil(per_revoke)
            + 1;
        if needed as u32 + 2 > self.maxlen - self.first {
            return Err(Error::Invalid(format!(
                "transaction of {needed} blocks does not fit the journal ({} blocks)",
                self.maxlen
            )));
        }
        let mut log = self.log.lock();
        let tid = log.next_tid;
        // Everything before is checkpointed: if the write would wrap, restart at the beginning.
        if log.head + needed as u32 >= self.maxlen || log.empty_on_disk {
            log.head = self.first;
            let first = self.first;
            self.write_sb(&mut log, first, tid)?;
            self.dev.flush()?;
        }
        let mut at = log.head;
        // Revoke blocks.
        for chunk in revoked.chunks(per_revoke.max(1)) {
            let mut b = vec![0u8; bs];
            put_be32(&mut b, 0, JBD2_MAGIC);
            put_be32(&mut b, 4, BT_REVOKE);
            put_be32(&mut b, 8, tid);
            let mut off = 16;
            for &r in chunk {
                if rec == 8 {
                    b[off..off + 8].copy_from_slice(&r.to_be_bytes());
                } else {
                    put_be32(&mut b, off, r as u32);
                }
                off += rec;
            }
            put_be32(&mut b, 12, off as u32);
            self.block_tail_csum(&mut b);
            self.write_jblock(at, &b)?;
            at = self.next(at);
        }
        // Descriptor blocks, each followed by its data blocks.
        for chunk in blocks.chunks(per_desc.max(1)) {
            let mut d = vec![0u8; bs];
            put_be32(&mut d, 0, JBD2_MAGIC);
            put_be32(&mut d, 4, BT_DESCRIPTOR);
            put_be32(&mut d, 8, tid);
            let mut off = 12;
            let mut datas = Vec::with_capacity(chunk.len());
            for (i, (blk, data)) in chunk.iter().enumerate() {
                let mut copy = data.clone();
                let mut flags = 0u32;
                if be32(&copy, 0) == JBD2_MAGIC {
                    copy[..4].fill(0);
                    flags |= FLAG_ESCAPE;
                }
                if i > 0 {
                    flags |= FLAG_SAME_UUID;
                }
                if i + 1 == chunk.len() {
                    flags |= FLAG_LAST_TAG;
                }
                let csum = if self.csum() {
                    let c = crc32c(self.seed, &tid.to_be_bytes());
                    crc32c(c, data)
                } else {
                    0
                };
                put_be32(&mut d, off, *blk as u32);
                if self.csum_v3 {
                    put_be32(&mut d, off + 4, flags);
                    put_be32(&mut d, off + 8, (*blk >> 32) as u32);
                    put_be32(&mut d, off + 12, csum);
                } else {
                    d[off + 4..off + 6].copy_from_slice(&(csum as u16).to_be_bytes());
                    d[off + 6..off + 8].copy_from_slice(&(flags as u16).to_be_bytes());
                    if self.has_64bit {
                        put_be32(&mut d, off + 8, (*blk >> 32) as u32);
                    }
                }
                off += tag;
                if i == 0 {
                    // The UUID after the first tag: the engine's journals are internal, any
                    // 16 bytes do; use the journal superblock's.
                    let uuid = log.sb[0x30..0x40].to_vec();
                    d[off..off + 16].copy_from_slice(&uuid);
                    off += 16;
                }
                datas.push(copy);
            }
            self.block_tail_csum(&mut d);
            self.write_jblock(at, &d)?;
            at = self.next(at);
            for data in datas {
                self.write_jblock(at, &data)?;
                at = self.next(at);
            }
        }
        self.dev.flush()?;
        // The commit block.
        let mut c = vec![0u8; bs];
        put_be32(&mut c, 0, JBD2_MAGIC);
        put_be32(&mut c, 4, BT_COMMIT);
        put_be32(&mut c, 8, tid);
        let now = crate::format::inode::Timestamp::now();
        c[0x30..0x38].copy_from_slice(&(now.sec as u64).to_be_bytes());
        put_be32(&mut c, 0x38, now.nsec);
        if self.csum() {
            let sum = crc32c(self.seed, &c);
            put_be32(&mut c, 0x10, sum);
        }
        self.write_jblock(at, &c)?;
        at = self.next(at);
        self.dev.flush()?;
        log.head = at;
        log.next_tid = tid.wrapping_add(1);
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(tid)
    }

    /// The transaction's blocks are home and flushed. (Everything before the head is
    /// checkpointed; nothing to do until the log wraps.)
    pub fn checkpointed(&self, _tid: u32) {}

    /// Marks the journal empty (clean unmount).
    pub fn set_clean(&self) -> Result<()> {
        let mut log = self.log.lock();
        let seq = log.next_tid;
        self.write_sb(&mut log, 0, seq)?;
        self.dev.flush()?;
        log.head = self.first;
        Ok(())
    }

    /// Replays the log (scan, revoke, replay) and marks it empty.
    pub fn recover(&self) -> Result<RecoveryReport> {
        let (start, seq) = {
            let log = self.log.lock();
            (be32(&log.sb, 0x1C), be32(&log.sb, 0x18))
        };
        let mut report = RecoveryReport::default();
        if start == 0 {
            return Ok(report);
        }
        if start < self.first || start >= self.maxlen {
            return Err(Error::corrupt(format!(
                "journal superblock: log start {start} is outside the log"
            )));
        }
        // PASS_SCAN: find the end of the last whole transaction.
        let end_tid = self.pass(
            start,
            seq,
            None,
            &mut HashMap::new(),
            &mut report,
            Pass::Scan,
        )?;
        // PASS_REVOKE.
        let mut revoked: HashMap<u64, u32> = HashMap::new();
        self.pass(
            start,
            seq,
            Some(end_tid),
            &mut revoked,
            &mut report,
            Pass::Revoke,
        )?;
        // PASS_REPLAY.
        self.pass(
            start,
            seq,
            Some(end_tid),
            &mut revoked,
            &mut report,
            Pass::Replay,
        )?;
        self.dev.flush()?;
        report.transactions = end_tid.wrapping_sub(seq);
        report.last_tid = end_tid.wrapping_sub(1);
        let mut log = self.log.lock();
        log.next_tid = end_tid;
        log.head = self.first;
        self.write_sb(&mut log, 0, end_tid)?;
        self.dev.flush()?;
        Ok(report)
    }

    fn pass(
        &self,
        start: u32,
        seq: u32,
        end: Option<u32>,
        revoked: &mut HashMap<u64, u32>,
        report: &mut RecoveryReport,
        pass: Pass,
    ) -> Result<u32> {
        let bs = self.bs as usize;
        let tag = self.tag_bytes();
        let mut at = start;
        let mut tid = seq;
        let mut steps = 0u64;
        loop {
            if end == Some(tid) {
                return Ok(tid);
            }
            steps += 1;
            if steps > 4 * self.maxlen as u64 {
                return Err(Error::corrupt("journal: the log does not end (a cycle)"));
            }
            let b = self.read_jblock(at)?;
            if be32(&b, 0) != JBD2_MAGIC || be32(&b, 8) != tid {
                return Ok(tid);
            }
            match be32(&b, 4) {
                BT_DESCRIPTOR => {
                    if self.csum() && !self.tail_ok(&b) {
                        if pass == Pass::Scan {
                            return Ok(tid);
                        }
                        return Err(Error::BadChecksum(format!("journal descriptor block {at}")));
                    }
                    let tail = if self.csum() { 4 } else { 0 };
                    let mut off = 12;
                    let mut first = true;
                    at = self.next(at);
                    loop {
                        if off + tag > bs - tail {
                            break;
                        }
                        let lo = be32(&b, off) as u64;
                        let (flags, hi, csum) = if self.csum_v3 {
                            (
                                be32(&b, off + 4),
                                if self.has_64bit {
                                    be32(&b, off + 8) as u64
                                } else {
                                    0
                                },
                                be32(&b, off + 12),
                            )
                        } else {
                            let f = u16::from_be_bytes([b[off + 6], b[off + 7]]) as u32;
                            let h = if self.has_64bit {
                                be32(&b, off + 8) as u64
                            } else {
                                0
                            };
                            (f, h, u16::from_be_bytes([b[off + 4], b[off + 5]]) as u32)
                        };
                        off += tag;
                        if first && flags & FLAG_SAME_UUID == 0 {
                            off += 16;
                        }
                        first = false;
                        let home = hi << 32 | lo;
                        if pass == Pass::Replay {
                            let mut data = self.read_jblock(at)?;
                            if flags & FLAG_ESCAPE != 0 {
                                put_be32(&mut data, 0, JBD2_MAGIC);
                            }
                            if self.csum() {
                                let c = crc32c(crc32c(self.seed, &tid.to_be_bytes()), &data);
                                let ok = if self.csum_v3 {
                                    c == csum
                                } else {
                                    (c & 0xFFFF) == csum
                                };
                                if !ok {
                                    return Err(Error::BadChecksum(format!("journal data block {at} (for block {home}, transaction {tid})")));
                                }
                            }
                            if revoked
                                .get(&home)
                                .is_some_and(|&r| r.wrapping_sub(tid) as i32 >= 0)
                            {
                                report.blocks_revoked += 1;
                            } else {
                                if home * self.bs as u64 + bs as u64 > self.dev.size() {
                                    return Err(Error::corrupt(format!("journal: logged block {home} is past the end of the device")));
                                }
                                self.dev.write_at(home * self.bs as u64, &data)?;
                                report.blocks_replayed += 1;
                            }
                        }
                        at = self.next(at);
                        if flags & FLAG_LAST_TAG != 0 {
                            break;
                        }
                    }
                }
                BT_COMMIT => {
                    if self.csum() {
                        let mut c = b.clone();
                        let stored = be32(&c, 0x10);
                        c[0x10..0x14].fill(0);
                        if crc32c(self.seed, &c) != stored {
                            return Ok(tid);
                        }
                    }
                    at = self.next(at);
                    tid = tid.wrapping_add(1);
                }
                BT_REVOKE => {
                    if self.csum() && !self.tail_ok(&b) {
                        if pass == Pass::Scan {
                            return Ok(tid);
                        }
                        return Err(Error::BadChecksum(format!("journal revoke block {at}")));
                    }
                    if pass == Pass::Revoke {
                        let count = (be32(&b, 12) as usize).min(bs);
                        let rec = if self.has_64bit { 8 } else { 4 };
                        let mut off = 16;
                        while off + rec <= count {
                            let r = if rec == 8 {
                                u64::from_be_bytes(b[off..off + 8].try_into().unwrap())
                            } else {
                                be32(&b, off) as u64
                            };
                            let e = revoked.entry(r).or_insert(tid);
                            if tid.wrapping_sub(*e) as i32 > 0 {
                                *e = tid;
                            }
                            off += rec;
                        }
                    }
                    at = self.next(at);
                }
                _ => return Ok(tid),
            }
        }
    }

    fn tail_ok(&self, b: &[u8]) -> bool {
        let n = b.len();
        let mut c = b.to_vec();
        let stored = be32(&c, n - 4);
        put_be32(&mut c, n - 4, 0);
        crc32c(self.seed, &c) == stored
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Scan,
    Revoke,
    Replay,
}
