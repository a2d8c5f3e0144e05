//! The fast-commit area's records (fs/ext4/fast_commit.h; e2fsprogs' lib/ext2fs/fast_commit.h
//! is the same file). Bytes only: parsing the tag-length-value records and the kernel's
//! scan rules (ext4_fc_replay_scan) that decide which of them are valid. Replaying them is
//! `fast_commit.rs`.
//!
//! A fast commit is written by ext4 (not jbd2) into the journal's fast-commit area, after
//! the last full commit of the running transaction: a run of records, each
//! `{le16 tag, le16 len, value[len]}`, never split across blocks (PAD fills a block's
//! end), the first fast commit of a transaction opening with HEAD, each ending with a TAIL
//! whose length runs to the end of its block. A TAIL carries the transaction id and a
//! crc32c (raw, seeded 0 after each TAIL) over every record since the previous TAIL, its own
//! tag, length and tid included.
//!
//! Which records count (as the kernel's scan, which e2fsck shares):
//! - the area's first record must be HEAD, with no unknown feature bits and the tid the log
//!   ends at (the first transaction not fully committed); otherwise there is nothing to
//!   replay (stale records of an earlier transaction);
//! - every record up to the last TAIL whose tid and crc hold is replayed; a TAIL that fails
//!   after a good one ends the scan (a torn fast commit), while a failing first TAIL, or an
//!   unknown tag before any good TAIL, is corruption and refuses recovery.

use super::csum::crc32c;
use super::extent::Extent;
use super::{le16, le32};
use crate::error::{Corruption, Error, Result};

/// EXT4_FC_TAG_ADD_RANGE: an extent mapped.
pub const TAG_ADD_RANGE: u16 = 0x0001;
/// EXT4_FC_TAG_DEL_RANGE: logical blocks unmapped.
pub const TAG_DEL_RANGE: u16 = 0x0002;
/// EXT4_FC_TAG_CREAT: a new inode's name.
pub const TAG_CREAT: u16 = 0x0003;
/// EXT4_FC_TAG_LINK: a further name.
pub const TAG_LINK: u16 = 0x0004;
/// EXT4_FC_TAG_UNLINK: a name removed.
pub const TAG_UNLINK: u16 = 0x0005;
/// EXT4_FC_TAG_INODE: an inode's fields.
pub const TAG_INODE: u16 = 0x0006;
/// EXT4_FC_TAG_PAD: filler to a block's end.
pub const TAG_PAD: u16 = 0x0007;
/// EXT4_FC_TAG_TAIL: the end of one fast commit, with its tid and crc.
pub const TAG_TAIL: u16 = 0x0008;
/// EXT4_FC_TAG_HEAD: the first record of a transaction's fast commits.
pub const TAG_HEAD: u16 = 0x0009;

/// Feature bits a HEAD may carry that a reader understands (EXT4_FC_SUPPORTED_FEATURES).
pub const SUPPORTED_FEATURES: u32 = 0;

/// Bytes of a record's tag and length (EXT4_FC_TAG_BASE_LEN).
pub const TL_SIZE: usize = 4;
/// Value bytes of HEAD (fc_features, fc_tid).
pub const HEAD_SIZE: usize = 8;
/// The first value bytes of TAIL (fc_tid, fc_crc); its length runs on to the block's end.
pub const TAIL_SIZE: usize = 8;
/// Value bytes of ADD_RANGE: fc_ino, then an on-disk extent (12 bytes).
pub const ADD_RANGE_SIZE: usize = 16;
/// Value bytes of DEL_RANGE: fc_ino, fc_lblk, fc_len.
pub const DEL_RANGE_SIZE: usize = 12;
/// Value bytes of a dentry record before the name: fc_parent_ino, fc_ino.
pub const DENTRY_INFO_SIZE: usize = 8;

/// A directory entry added or removed (CREAT, LINK, UNLINK).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DentryInfo {
    /// fc_parent_ino: the directory.
    pub parent: u32,
    /// fc_ino: the inode named.
    pub ino: u32,
    /// fc_dname: the name (the rest of the value).
    pub name: Vec<u8>,
}

/// One record, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FcRecord {
    /// Logical blocks mapped to physical ones (one extent, maybe unwritten).
    AddRange {
        /// fc_ino.
        ino: u32,
        /// fc_ex, an on-disk leaf extent.
        extent: Extent,
    },
    /// Logical blocks `lblk..lblk+len` unmapped.
    DelRange {
        /// fc_ino.
        ino: u32,
        /// fc_lblk.
        lblk: u32,
        /// fc_len.
        len: u32,
    },
    /// A new inode's first name (its INODE record comes before it).
    Creat(DentryInfo),
    /// A further name of an existing inode.
    Link(DentryInfo),
    /// A name removed.
    Unlink(DentryInfo),
    /// The inode as it was at the fast commit: its first 128 bytes and extra fields, the
    /// block map (i_block) excepted unless the inode holds inline data.
    Inode {
        /// fc_ino.
        ino: u32,
        /// fc_raw_inode: 128 bytes plus i_extra_isize, as the inode table holds them.
        raw: Vec<u8>,
    },
    /// Filler.
    Pad,
    /// The end of a fast commit.
    Tail {
        /// fc_tid: the transaction.
        tid: u32,
        /// fc_crc: crc32c over the records since the previous TAIL.
        crc: u32,
    },
    /// The start of a transaction's fast commits.
    Head {
        /// fc_features: none are defined.
        features: u32,
        /// fc_tid: the transaction.
        tid: u32,
    },
}

impl FcRecord {
    /// The kernel's name for the tag (debugfs logdump's words).
    pub fn tag_name(&self) -> &'static str {
        match self {
            FcRecord::AddRange { .. } => "ADD_RANGE",
            FcRecord::DelRange { .. } => "DEL_RANGE",
            FcRecord::Creat(_) => "CREAT_DENTRY",
            FcRecord::Link(_) => "ADD_ENTRY",
            FcRecord::Unlink(_) => "DEL_ENTRY",
            FcRecord::Inode { .. } => "INODE",
            FcRecord::Pad => "PAD",
            FcRecord::Tail { .. } => "TAIL",
            FcRecord::Head { .. } => "HEAD",
        }
    }
}

/// Decodes one record's value, or None for an unknown tag or a length the tag cannot have
/// (the kernel's ext4_fc_value_len_isvalid).
pub fn decode(tag: u16, v: &[u8]) -> Option<FcRecord> {
    let dentry = |v: &[u8]| {
        (v.len() > DENTRY_INFO_SIZE).then(|| DentryInfo {
            parent: le32(v, 0),
            ino: le32(v, 4),
            name: v[DENTRY_INFO_SIZE..].to_vec(),
        })
    };
    Some(match tag {
        TAG_ADD_RANGE if v.len() == ADD_RANGE_SIZE => FcRecord::AddRange {
            ino: le32(v, 0),
            extent: Extent::read(&v[4..16]),
        },
        TAG_DEL_RANGE if v.len() == DEL_RANGE_SIZE => FcRecord::DelRange {
            ino: le32(v, 0),
            lblk: le32(v, 4),
            len: le32(v, 8),
        },
        TAG_CREAT => FcRecord::Creat(dentry(v)?),
        TAG_LINK => FcRecord::Link(dentry(v)?),
        TAG_UNLINK => FcRecord::Unlink(dentry(v)?),
        TAG_INODE if v.len() > 4 + 128 => FcRecord::Inode {
            ino: le32(v, 0),
            raw: v[4..].to_vec(),
        },
        TAG_PAD => FcRecord::Pad,
        TAG_TAIL if v.len() >= TAIL_SIZE => FcRecord::Tail {
            tid: le32(v, 0),
            crc: le32(v, 4),
        },
        TAG_HEAD if v.len() == HEAD_SIZE => FcRecord::Head {
            features: le32(v, 0),
            tid: le32(v, 4),
        },
        _ => return None,
    })
}

/// The fast commits of one transaction that the scan found whole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FastCommits {
    /// The transaction they belong to.
    pub tid: u32,
    /// Every record to replay, in order (HEAD, PAD and TAIL included, as the kernel counts).
    pub records: Vec<FcRecord>,
    /// Whole fast commits (good TAILs).
    pub commits: u32,
    /// Area blocks they take.
    pub blocks: u32,
}

impl FastCommits {
    /// Whether there is anything to replay.
    pub fn is_empty(&self) -> bool {
        self.commits == 0
    }
}

/// The scan's verdict on a record.
enum Step {
    Continue,
    Stop,
}

/// Scans the area's blocks (in order) for the fast commits of transaction `tid`, as the
/// kernel's ext4_fc_replay_scan: see the module comment for the rules.
pub fn scan(blocks: &[Vec<u8>], tid: u32) -> Result<FastCommits> {
    let mut out = FastCommits {
        tid,
        ..Default::default()
    };
    let Some(first) = blocks.first() else {
        return Ok(out);
    };
    if first.len() < TL_SIZE || le16(first, 0) != TAG_HEAD {
        return Ok(out);
    }
    let mut pending: Vec<FcRecord> = Vec::new();
    let mut crc = 0u32;
    for (bi, b) in blocks.iter().enumerate() {
        let end = b.len().saturating_sub(1);
        let mut cur = 0usize;
        while cur < end {
            let step = scan_record(b, &mut cur, bi, tid, &mut crc, &mut pending, &mut out)?;
            if let Step::Stop = step {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

/// One record of the scan at `*cur` in block `bi`, moving `*cur` past it.
fn scan_record(
    b: &[u8],
    cur: &mut usize,
    bi: usize,
    tid: u32,
    crc: &mut u32,
    pending: &mut Vec<FcRecord>,
    out: &mut FastCommits,
) -> Result<Step> {
    let at = *cur;
    // Past a good TAIL a bad record is a torn or stale fast commit; before one, corruption.
    let fail = |what: String| -> Result<Step> {
        if out.commits > 0 {
            Ok(Step::Stop)
        } else {
            Err(Error::corrupt(
                Corruption::Journal,
                format!("fast-commit area block {bi}, byte {at}: {what}"),
            ))
        }
    };
    if at + TL_SIZE > b.len() {
        return fail("a record header runs past the block".into());
    }
    let (tag, len) = (le16(b, at), le16(b, at + 2) as usize);
    let vend = at + TL_SIZE + len;
    if vend > b.len() {
        return fail(format!(
            "record (tag {tag}) of {len} bytes runs past the block"
        ));
    }
    *cur = vend;
    let Some(rec) = decode(tag, &b[at + TL_SIZE..vend]) else {
        return fail(format!("unknown tag {tag} or bad length {len}"));
    };
    match rec {
        FcRecord::Head { features, tid: t } => {
            if features & !SUPPORTED_FEATURES != 0 {
                return Err(Error::Unsupported(format!(
                    "fast-commit features {features:#x} of transaction {t}"
                )));
            }
            if t != tid {
                return Ok(Step::Stop);
            }
            *crc = crc32c(*crc, &b[at..vend]);
        }
        FcRecord::Tail { tid: t, crc: found } => {
            *crc = crc32c(*crc, &b[at..at + TL_SIZE + 4]);
            let good = t == tid && found == *crc;
            *crc = 0;
            pending.push(rec);
            if !good {
                if out.commits > 0 {
                    return Ok(Step::Stop);
                }
                return Err(Error::bad_checksum(
                    Corruption::Journal,
                    format!(
                        "fast-commit area block {bi}: the first fast commit's tail (transaction {t}, \
                         expected {tid}) fails its checksum"
                    ),
                ));
            }
            out.records.append(pending);
            out.commits += 1;
            out.blocks = bi as u32 + 1;
            return Ok(Step::Continue);
        }
        _ => *crc = crc32c(*crc, &b[at..vend]),
    }
    pending.push(rec);
    Ok(Step::Continue)
}

/// Writes fast commits as the kernel's ext4_fc_add_tlv, ext4_fc_reserve_space and
/// ext4_fc_write_tail lay them out, the inverse of `scan`: records one after another in a
/// block, each leaving room after it for a further record header and one byte; one that
/// does not fit is preceded by a PAD of zeros to the block's last byte and starts the next
/// block; a TAIL ends each fast commit, its value running to its block's end, its crc32c
/// (seeded 0) over every byte from the previous TAIL to its own tid.
pub struct FcEncoder {
    bs: usize,
    done: Vec<Vec<u8>>,
    cur: Vec<u8>,
    crc: u32,
}

impl FcEncoder {
    /// An encoder for blocks of `bs` bytes.
    pub fn new(bs: usize) -> Self {
        FcEncoder {
            bs,
            done: Vec::new(),
            cur: Vec::with_capacity(bs),
            crc: 0,
        }
    }

    /// Makes room for a record of `total` bytes (header included) in the current block,
    /// padding it and starting the next if it does not fit. False if no block can hold it.
    fn reserve(&mut self, total: usize) -> bool {
        if total + TL_SIZE + 2 > self.bs {
            return false;
        }
        let off = self.cur.len();
        if self.bs - off - 1 > total + TL_SIZE {
            return true;
        }
        let pad = self.bs - off - 1 - TL_SIZE;
        let start = self.cur.len();
        encode(&mut self.cur, TAG_PAD, &vec![0u8; pad]);
        self.crc = crc32c(self.crc, &self.cur[start..]);
        self.cur.resize(self.bs, 0);
        self.done.push(std::mem::replace(
            &mut self.cur,
            Vec::with_capacity(self.bs),
        ));
        true
    }

    /// Adds one record. False (nothing added) if its value is too long for a block.
    pub fn add(&mut self, tag: u16, value: &[u8]) -> bool {
        if !self.reserve(TL_SIZE + value.len()) {
            return false;
        }
        let start = self.cur.len();
        encode(&mut self.cur, tag, value);
        self.crc = crc32c(self.crc, &self.cur[start..]);
        true
    }

    /// Adds HEAD: the first fast commit of transaction `tid`.
    pub fn head(&mut self, tid: u32) {
        let mut v = [0u8; HEAD_SIZE];
        v[..4].copy_from_slice(&SUPPORTED_FEATURES.to_le_bytes());
        v[4..].copy_from_slice(&tid.to_le_bytes());
        self.add(TAG_HEAD, &v);
    }

    /// Ends a fast commit of transaction `tid` with its TAIL, closing the block.
    pub fn tail(&mut self, tid: u32) {
        self.reserve(TL_SIZE + TAIL_SIZE);
        let start = self.cur.len();
        let len = (self.bs - start - TL_SIZE) as u16;
        self.cur.extend_from_slice(&TAG_TAIL.to_le_bytes());
        self.cur.extend_from_slice(&len.to_le_bytes());
        self.cur.extend_from_slice(&tid.to_le_bytes());
        let crc = crc32c(self.crc, &self.cur[start..]);
        self.cur.extend_from_slice(&crc.to_le_bytes());
        self.cur.resize(self.bs, 0);
        self.crc = 0;
        self.done.push(std::mem::replace(
            &mut self.cur,
            Vec::with_capacity(self.bs),
        ));
    }

    /// Whole blocks so far (a fast commit ended with `tail` is all in them).
    pub fn blocks(&self) -> usize {
        self.done.len() + usize::from(!self.cur.is_empty())
    }

    /// The blocks written; anything after the last TAIL is dropped.
    pub fn finish(self) -> Vec<Vec<u8>> {
        self.done
    }
}

/// Encodes one record (tag, length, value) at the end of `out`.
pub fn encode(out: &mut Vec<u8>, tag: u16, value: &[u8]) {
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests;
