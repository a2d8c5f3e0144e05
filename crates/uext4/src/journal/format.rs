//! jbd2 on-disk structures (Documentation/filesystems/ext4/journal.rst), all big-endian:
//! the journal superblock, block headers, descriptor-block tags, commit blocks and the
//! checksums of each. No I/O here.

use crate::error::{Corruption, Error, Result};
use crate::format::csum::crc32c;

pub const JBD2_MAGIC: u32 = 0xC03B_3998;

/// Block types (h_blocktype).
pub const BT_DESCRIPTOR: u32 = 1;
pub const BT_COMMIT: u32 = 2;
pub const BT_SB_V1: u32 = 3;
pub const BT_SB_V2: u32 = 4;
pub const BT_REVOKE: u32 = 5;

/// s_feature_compat: the old (v1) whole-transaction crc32_be checksum in the commit block.
pub const COMPAT_CHECKSUM: u32 = 0x1;

pub const INCOMPAT_REVOKE: u32 = 0x1;
pub const INCOMPAT_64BIT: u32 = 0x2;
pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const INCOMPAT_CSUM_V2: u32 = 0x8;
pub const INCOMPAT_CSUM_V3: u32 = 0x10;
pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
/// The incompat features this implementation reads and writes.
pub const INCOMPAT_KNOWN: u32 = INCOMPAT_REVOKE
    | INCOMPAT_64BIT
    | INCOMPAT_ASYNC_COMMIT
    | INCOMPAT_CSUM_V2
    | INCOMPAT_CSUM_V3
    | INCOMPAT_FAST_COMMIT;
/// Fast-commit blocks when s_num_fc_blks is 0 (jbd2.h's JBD2_DEFAULT_FAST_COMMIT_BLOCKS).
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;
/// The fewest log blocks a journal may have besides its fast-commit area
/// (JBD2_MIN_JOURNAL_BLOCKS: the kernel and e2fsck refuse a smaller remainder).
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;

/// s_checksum_type.
pub const CSUM_TYPE_CRC32C: u8 = 4;
/// h_chksum_type of a v1 (COMPAT_CHECKSUM) commit block.
pub const CHKSUM_TYPE_CRC32: u8 = 1;

/// Tag flags.
pub const FLAG_ESCAPE: u32 = 1;
pub const FLAG_SAME_UUID: u32 = 2;
pub const FLAG_DELETED: u32 = 4;
pub const FLAG_LAST_TAG: u32 = 8;

/// The size of a block header (magic, blocktype, sequence).
pub const HEADER_SIZE: usize = 12;
/// The size of a revoke block header (block header and r_count).
pub const REVOKE_HEADER_SIZE: usize = 16;
/// The size of the checksum tail of descriptor and revoke blocks (csum v2/v3).
pub const TAIL_SIZE: usize = 4;
/// The journal superblock's size on disk.
pub const SB_SIZE: usize = 1024;

/// Reads a big-endian u32 at `o` (the caller checks the bounds).
pub fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub fn put_be32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
pub fn be64(b: &[u8], o: usize) -> u64 {
    (be32(b, o) as u64) << 32 | be32(b, o + 4) as u64
}
pub fn put_be64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

/// `(a - b) as i32 > 0`: tid comparison that survives wrapping, as the kernel's tid_gt.
pub fn tid_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}
pub fn tid_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// The journal superblock (v1 or v2). The typed fields are the ones the journal uses; the
/// raw bytes keep everything else (s_users, fast-commit fields, padding) as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSuperblock {
    pub blocktype: u32,
    pub block_size: u32,
    pub maxlen: u32,
    pub first: u32,
    pub sequence: u32,
    pub start: u32,
    pub errno: i32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub nr_users: u32,
    pub max_transaction: u32,
    pub max_trans_data: u32,
    pub checksum_type: u8,
    /// s_num_fc_blks (0x54): the fast-commit area's length, 0 meaning the default.
    pub num_fc_blks: u32,
    raw: Vec<u8>,
}

impl JournalSuperblock {
    /// A v2 superblock for an empty internal journal of `maxlen` blocks (block 0 is this
    /// superblock, the log is blocks 1..maxlen), as mke2fs writes it: sequence 1, start 0,
    /// one user. `csum_v3` sets INCOMPAT_CSUM_V3 with a crc32c superblock checksum;
    /// `has_64bit` sets INCOMPAT_64BIT (tags with 64-bit block numbers).
    pub fn new_v2(
        block_size: u32,
        maxlen: u32,
        uuid: [u8; 16],
        csum_v3: bool,
        has_64bit: bool,
    ) -> Self {
        let mut incompat = 0;
        if csum_v3 {
            incompat |= INCOMPAT_CSUM_V3;
        }
        if has_64bit {
            incompat |= INCOMPAT_64BIT;
        }
        JournalSuperblock {
            blocktype: BT_SB_V2,
            block_size,
            maxlen,
            first: 1,
            sequence: 1,
            start: 0,
            errno: 0,
            feature_compat: 0,
            feature_incompat: incompat,
            feature_ro_compat: 0,
            uuid,
            nr_users: 1,
            max_transaction: 0,
            max_trans_data: 0,
            checksum_type: if csum_v3 { CSUM_TYPE_CRC32C } else { 0 },
            num_fc_blks: 0,
            raw: vec![0u8; SB_SIZE],
        }
    }

    /// Parses the first 1024 bytes of journal block 0. Checks the magic, the block type and
    /// (with csum v2/v3) the checksum; the geometry is checked by `Journal::open`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < SB_SIZE {
            return Err(Error::corrupt(
                Corruption::Journal,
                "journal superblock: short read",
            ));
        }
        let magic = be32(b, 0);
        if magic != JBD2_MAGIC {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!("journal superblock: bad magic {magic:#010x}"),
            ));
        }
        let blocktype = be32(b, 4);
        if blocktype != BT_SB_V1 && blocktype != BT_SB_V2 {
            return Err(Error::corrupt(
                Corruption::Journal,
                format!("journal superblock: unknown block type {blocktype}"),
            ));
        }
        let v2 = blocktype == BT_SB_V2;
        let sb = JournalSuperblock {
            blocktype,
            block_size: be32(b, 0x0C),
            maxlen: be32(b, 0x10),
            first: be32(b, 0x14),
            sequence: be32(b, 0x18),
            start: be32(b, 0x1C),
            errno: be32(b, 0x20) as i32,
            feature_compat: if v2 { be32(b, 0x24) } else { 0 },
            feature_incompat: if v2 { be32(b, 0x28) } else { 0 },
            feature_ro_compat: if v2 { be32(b, 0x2C) } else { 0 },
            uuid: b[0x30..0x40].try_into().unwrap(),
            nr_users: be32(b, 0x40),
            max_transaction: be32(b, 0x48),
            max_trans_data: be32(b, 0x4C),
            checksum_type: b[0x50],
            num_fc_blks: if v2 { be32(b, 0x54) } else { 0 },
            raw: b[..SB_SIZE].to_vec(),
        };
        if sb.has_csum_v2or3() {
            if sb.checksum_type != CSUM_TYPE_CRC32C {
                return Err(Error::corrupt(
                    Corruption::Journal,
                    format!(
                        "journal superblock: checksum type {} (only crc32c, 4, exists)",
                        sb.checksum_type
                    ),
                ));
            }
            if sb.compute_csum(&sb.raw) != be32(b, 0xFC) {
                return Err(Error::bad_checksum(
                    Corruption::Journal,
                    "journal superblock",
                ));
            }
        }
        Ok(sb)
    }

    /// The fast-commit area's length in blocks when INCOMPAT_FAST_COMMIT is set
    /// (jbd2_journal_get_num_fc_blks: s_num_fc_blks, or the default when it is 0).
    pub fn fc_blocks(&self) -> Option<u32> {
        (self.feature_incompat & INCOMPAT_FAST_COMMIT != 0).then_some(if self.num_fc_blks == 0 {
            DEFAULT_FAST_COMMIT_BLOCKS
        } else {
            self.num_fc_blks
        })
    }

    pub fn has_csum_v2or3(&self) -> bool {
        self.feature_incompat & (INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3) != 0
    }

    fn compute_csum(&self, bytes: &[u8]) -> u32 {
        let mut c = bytes[..SB_SIZE].to_vec();
        put_be32(&mut c, 0xFC, 0);
        crc32c(!0, &c)
    }

    /// The 1024 bytes on disk, with the checksum set when csum v2/v3 is on.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = self.raw.clone();
        b.resize(SB_SIZE, 0);
        put_be32(&mut b, 0, JBD2_MAGIC);
        put_be32(&mut b, 4, self.blocktype);
        put_be32(&mut b, 8, 0);
        put_be32(&mut b, 0x0C, self.block_size);
        put_be32(&mut b, 0x10, self.maxlen);
        put_be32(&mut b, 0x14, self.first);
        put_be32(&mut b, 0x18, self.sequence);
        put_be32(&mut b, 0x1C, self.start);
        put_be32(&mut b, 0x20, self.errno as u32);
        if self.blocktype == BT_SB_V2 {
            put_be32(&mut b, 0x24, self.feature_compat);
            put_be32(&mut b, 0x28, self.feature_incompat);
            put_be32(&mut b, 0x2C, self.feature_ro_compat);
            b[0x30..0x40].copy_from_slice(&self.uuid);
            put_be32(&mut b, 0x40, self.nr_users);
            put_be32(&mut b, 0x48, self.max_transaction);
            put_be32(&mut b, 0x4C, self.max_trans_data);
            b[0x50] = self.checksum_type;
            put_be32(&mut b, 0x54, self.num_fc_blks);
        }
        if self.has_csum_v2or3() {
            let c = self.compute_csum(&b);
            put_be32(&mut b, 0xFC, c);
        }
        b
    }

    /// The checksum seed of every other journal block: crc32c(~0, uuid).
    pub fn csum_seed(&self) -> u32 {
        crc32c(!0, &self.uuid)
    }
}

/// How tags are laid out in this journal's descriptor blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagFormat {
    pub csum_v2: bool,
    pub csum_v3: bool,
    pub has_64bit: bool,
}

/// One descriptor-block tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub blocknr: u64,
    pub flags: u32,
    /// 32 bits with csum v3, the low 16 with csum v2, 0 otherwise.
    pub checksum: u32,
}

impl TagFormat {
    pub fn from_incompat(incompat: u32) -> Self {
        TagFormat {
            csum_v2: incompat & INCOMPAT_CSUM_V2 != 0,
            csum_v3: incompat & INCOMPAT_CSUM_V3 != 0,
            has_64bit: incompat & INCOMPAT_64BIT != 0,
        }
    }

    pub fn csum(&self) -> bool {
        self.csum_v2 || self.csum_v3
    }

    /// Bytes per tag, as the kernel's journal_tag_bytes.
    pub fn tag_bytes(&self) -> usize {
        if self.csum_v3 {
            return 16;
        }
        let sz = 12 + if self.csum_v2 { 2 } else { 0 };
        if self.has_64bit {
            sz
        } else {
            sz - 4
        }
    }

    /// Bytes at the end of descriptor and revoke blocks taken by the checksum tail.
    pub fn tail_bytes(&self) -> usize {
        if self.csum() {
            TAIL_SIZE
        } else {
            0
        }
    }

    /// How many tags always fit in one descriptor block (the first carries a UUID).
    pub fn tags_per_descriptor(&self, bs: usize) -> usize {
        (bs - HEADER_SIZE - self.tail_bytes() - 16) / self.tag_bytes()
    }

    /// Bytes per revoke record.
    pub fn revoke_record_bytes(&self) -> usize {
        if self.has_64bit {
            8
        } else {
            4
        }
    }

    pub fn revokes_per_block(&self, bs: usize) -> usize {
        (bs - REVOKE_HEADER_SIZE - self.tail_bytes()) / self.revoke_record_bytes()
    }

    /// Reads the tag at `off` (the caller checks `off + tag_bytes()` fits).
    pub fn read_tag(&self, b: &[u8], off: usize) -> Tag {
        let lo = be32(b, off) as u64;
        if self.csum_v3 {
            let hi = if self.has_64bit {
                be32(b, off + 8) as u64
            } else {
                0
            };
            Tag {
                blocknr: hi << 32 | lo,
                flags: be32(b, off + 4),
                checksum: be32(b, off + 12),
            }
        } else {
            let hi = if self.has_64bit {
                be32(b, off + 8) as u64
            } else {
                0
            };
            Tag {
                blocknr: hi << 32 | lo,
                flags: u16::from_be_bytes([b[off + 6], b[off + 7]]) as u32,
                checksum: u16::from_be_bytes([b[off + 4], b[off + 5]]) as u32,
            }
        }
    }

    pub fn write_tag(&self, b: &mut [u8], off: usize, t: &Tag) {
        put_be32(b, off, t.blocknr as u32);
        if self.csum_v3 {
            put_be32(b, off + 4, t.flags);
            put_be32(b, off + 8, (t.blocknr >> 32) as u32);
            put_be32(b, off + 12, t.checksum);
        } else {
            b[off + 4..off + 6].copy_from_slice(&(t.checksum as u16).to_be_bytes());
            b[off + 6..off + 8].copy_from_slice(&(t.flags as u16).to_be_bytes());
            if self.has_64bit {
                put_be32(b, off + 8, (t.blocknr >> 32) as u32);
            }
        }
    }

    /// The tags of a descriptor block, as the kernel walks them: from the header to the
    /// LAST_TAG flag or the end of the usable space; a UUID follows every tag without
    /// SAME_UUID.
    pub fn tags(&self, b: &[u8]) -> Vec<Tag> {
        let end = b.len() - self.tail_bytes();
        let tb = self.tag_bytes();
        let mut off = HEADER_SIZE;
        let mut out = Vec::new();
        while off + tb <= end {
            let t = self.read_tag(b, off);
            out.push(t);
            off += tb;
            if t.flags & FLAG_SAME_UUID == 0 {
                off += 16;
            }
            if t.flags & FLAG_LAST_TAG != 0 {
                break;
            }
        }
        out
    }

    /// The checksum a tag carries for the log block `data` (as stored in the log, escaped)
    /// of transaction `tid`: crc32c(seed, be32 tid, data), truncated to 16 bits for v2.
    pub fn data_csum(&self, seed: u32, tid: u32, data: &[u8]) -> u32 {
        let c = crc32c(crc32c(seed, &tid.to_be_bytes()), data);
        if self.csum_v3 {
            c
        } else {
            c & 0xFFFF
        }
    }
}

/// A block header.
pub fn header(b: &mut [u8], blocktype: u32, tid: u32) {
    put_be32(b, 0, JBD2_MAGIC);
    put_be32(b, 4, blocktype);
    put_be32(b, 8, tid);
}

/// Sets the checksum tail of a descriptor or revoke block: crc32c(seed, block with tail 0).
pub fn set_tail_csum(seed: u32, b: &mut [u8]) {
    let n = b.len();
    put_be32(b, n - TAIL_SIZE, 0);
    let c = crc32c(seed, b);
    put_be32(b, n - TAIL_SIZE, c);
}

pub fn tail_csum_ok(seed: u32, b: &[u8]) -> bool {
    let n = b.len();
    let stored = be32(b, n - TAIL_SIZE);
    let c = crc32c(seed, &b[..n - TAIL_SIZE]);
    crc32c(c, &[0u8; TAIL_SIZE]) == stored
}

/// Offsets in a commit block.
pub const COMMIT_CHKSUM_TYPE: usize = 12;
pub const COMMIT_CHKSUM_SIZE: usize = 13;
pub const COMMIT_CHKSUM: usize = 16;
pub const COMMIT_SEC: usize = 0x30;
pub const COMMIT_NSEC: usize = 0x38;

/// The csum v2/v3 checksum of a commit block: crc32c(seed, block with `h_chksum[0]` zero).
pub fn commit_csum(seed: u32, b: &[u8]) -> u32 {
    let c = crc32c(seed, &b[..COMMIT_CHKSUM]);
    let c = crc32c(c, &[0u8; 4]);
    crc32c(c, &b[COMMIT_CHKSUM + 4..])
}

/// The big-endian CRC-32 (polynomial 0x04C11DB7, not reflected, no final inversion) of the
/// v1 COMPAT_CHECKSUM feature, as the kernel's crc32_be.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        crc ^= (byte as u32) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_checksum() {
        let uuid = [7u8; 16];
        let sb = JournalSuperblock::new_v2(4096, 1024, uuid, true, true);
        let b = sb.to_bytes();
        assert_eq!(b.len(), 1024);
        assert_eq!(be32(&b, 0), JBD2_MAGIC);
        assert_eq!(be32(&b, 4), BT_SB_V2);
        assert_eq!(be32(&b, 0x0C), 4096);
        assert_eq!(be32(&b, 0x10), 1024);
        assert_eq!(be32(&b, 0x14), 1);
        assert_eq!(be32(&b, 0x18), 1);
        assert_eq!(be32(&b, 0x28), INCOMPAT_CSUM_V3 | INCOMPAT_64BIT);
        assert_eq!(b[0x50], 4);
        let p = JournalSuperblock::parse(&b).unwrap();
        assert_eq!(p, JournalSuperblock::parse(&p.to_bytes()).unwrap());
        assert_eq!(p.to_bytes(), b);
        let mut bad = b.clone();
        bad[0x1C] ^= 1;
        assert!(matches!(
            JournalSuperblock::parse(&bad),
            Err(Error::BadChecksum {
                kind: Corruption::Journal,
                ..
            })
        ));
        let mut bad = b;
        bad[0] = 0;
        assert!(matches!(
            JournalSuperblock::parse(&bad),
            Err(Error::Corrupt {
                kind: Corruption::Journal,
                ..
            })
        ));
        // Without checksums, no checksum is written or checked.
        let plain = JournalSuperblock::new_v2(1024, 256, uuid, false, false).to_bytes();
        assert_eq!(be32(&plain, 0xFC), 0);
        assert_eq!(be32(&plain, 0x28), 0);
        JournalSuperblock::parse(&plain).unwrap();
    }

    #[test]
    fn tag_sizes_as_the_kernel() {
        let f = |v2, v3, b64| TagFormat {
            csum_v2: v2,
            csum_v3: v3,
            has_64bit: b64,
        };
        assert_eq!(f(false, false, false).tag_bytes(), 8);
        assert_eq!(f(false, false, true).tag_bytes(), 12);
        assert_eq!(f(true, false, false).tag_bytes(), 10);
        assert_eq!(f(true, false, true).tag_bytes(), 14);
        assert_eq!(f(false, true, false).tag_bytes(), 16);
        assert_eq!(f(false, true, true).tag_bytes(), 16);
        for fmt in [
            f(false, false, false),
            f(true, false, true),
            f(false, true, true),
        ] {
            let mut b = vec![0u8; 1024];
            let t = Tag {
                blocknr: if fmt.has_64bit {
                    0x1_2345_6789
                } else {
                    0x2345_6789
                },
                flags: FLAG_ESCAPE | FLAG_LAST_TAG,
                checksum: if fmt.csum() { 0xBEEF } else { 0 },
            };
            fmt.write_tag(&mut b, HEADER_SIZE, &t);
            assert_eq!(fmt.read_tag(&b, HEADER_SIZE), t);
            assert_eq!(fmt.tags(&b), vec![t]);
        }
    }

    #[test]
    fn crc32_be_known_value() {
        // CRC-32/MPEG-2 of "123456789" (initial ~0, no final inversion) is 0x0376E6E7.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }

    #[test]
    fn tail_and_commit_checksums() {
        let mut b = vec![0u8; 1024];
        header(&mut b, BT_DESCRIPTOR, 5);
        set_tail_csum(3, &mut b);
        assert!(tail_csum_ok(3, &b));
        b[100] = 1;
        assert!(!tail_csum_ok(3, &b));
        let mut c = vec![0u8; 1024];
        header(&mut c, BT_COMMIT, 5);
        let s = commit_csum(9, &c);
        put_be32(&mut c, COMMIT_CHKSUM, s);
        assert_eq!(commit_csum(9, &c), s);
        assert!(tid_gt(1, u32::MAX));
        assert!(tid_geq(5, 5));
        assert!(!tid_gt(5, 6));
    }
}
