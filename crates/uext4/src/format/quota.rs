//! The quota files' on-disk format: the kernel's "vfsv1" format (QFMT_VFS_V1, fs/quota/
//! quotaio_v2.h and quota_tree.h; e2fsprogs lib/support/quotaio_v2.h). A quota file is a
//! radix tree of 1 KiB quota blocks, whatever the filesystem's block size:
//!
//! - block 0: the header (magic, version) and the info (grace times, the tree's size and its
//!   two free lists);
//! - block 1 (`QT_TREEOFF`): the root of a four-level tree indexed by the id's bytes, high
//!   byte first; each tree block is 256 little-endian block numbers (0: no subtree);
//! - data blocks (the tree's leaves point to them): a 16-byte header and 14 entries of 72
//!   bytes, one per id (`struct v2r1_disk_dqblk`).
//!
//! Usage in an entry is in bytes (space) and inodes; block limits are in 1 KiB quota blocks.
//! Bytes only, no I/O: reading and updating a file's blocks is `crate::quota`.

use super::{le16, le32, le64, put16, put32, put64};

/// Size of a quota block (QT_BLKSIZE), whatever the filesystem's block size.
pub const QT_BLKSIZE: usize = 1024;
/// The tree's root block (QT_TREEOFF).
pub const QT_TREEOFF: u32 = 1;
/// Levels of tree blocks above the data blocks (QT_TREEDEPTH).
pub const QT_TREEDEPTH: u32 = 4;
/// Size of one entry (`struct v2r1_disk_dqblk`).
pub const ENTRY_SIZE: usize = 72;
/// Size of a data block's header (`struct qt_disk_dqdbheader`).
pub const DATA_HEADER: usize = 16;
/// Entries in one data block ((1024 - 16) / 72 = 14).
pub const ENTRIES_PER_BLOCK: usize = (QT_BLKSIZE - DATA_HEADER) / ENTRY_SIZE;
/// The format version of QFMT_VFS_V1 (64-bit limits and usage).
pub const V2_VERSION_R1: u32 = 1;
/// Byte offset of the info in block 0 (V2_DQINFOOFF: after the 8-byte header).
pub const INFO_OFFSET: usize = 8;
/// The default grace period, a week in seconds (MAX_DQ_TIME and MAX_IQ_TIME).
pub const DEFAULT_GRACE: u32 = 7 * 24 * 3600;
/// The unit of block limits on disk (QUOTABLOCK_SIZE).
pub const QUOTABLOCK_SIZE: u64 = 1024;

/// The three quota types, in the kernel's order (USRQUOTA, GRPQUOTA, PRJQUOTA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaType {
    /// Per user id (i_uid).
    User,
    /// Per group id (i_gid).
    Group,
    /// Per project id (i_projid).
    Project,
}

impl QuotaType {
    /// All three, in the kernel's order.
    pub const ALL: [QuotaType; 3] = [QuotaType::User, QuotaType::Group, QuotaType::Project];

    /// The index the kernel gives it (0, 1, 2).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The header magic of its file (V2_INITQMAGICS).
    pub fn magic(self) -> u32 {
        match self {
            QuotaType::User => 0xd9c0_1f11,
            QuotaType::Group => 0xd9c0_1927,
            QuotaType::Project => 0xd9c0_3f14,
        }
    }

    /// Its name, as repquota and debugfs's `lq` say it.
    pub fn name(self) -> &'static str {
        match self {
            QuotaType::User => "user",
            QuotaType::Group => "group",
            QuotaType::Project => "project",
        }
    }

    /// Parses "user", "group" or "project" (and the mke2fs quotatype spellings).
    pub fn parse(s: &str) -> Option<QuotaType> {
        match s {
            "user" | "usr" | "usrquota" | "u" => Some(QuotaType::User),
            "group" | "grp" | "grpquota" | "g" => Some(QuotaType::Group),
            "project" | "prj" | "prjquota" | "p" => Some(QuotaType::Project),
            _ => None,
        }
    }
}

/// The header of block 0 (`struct v2_disk_dqheader`): magic at 0x0, version at 0x4.
pub fn header_ok(b: &[u8], t: QuotaType) -> bool {
    b.len() >= 8 && le32(b, 0) == t.magic() && le32(b, 4) == V2_VERSION_R1
}

/// Writes the header of block 0.
pub fn put_header(b: &mut [u8], t: QuotaType) {
    put32(b, 0, t.magic());
    put32(b, 4, V2_VERSION_R1);
}

/// The info in block 0 (`struct v2_disk_dqinfo`, at byte 8 of the block).
///
/// | offset | field |
/// |---|---|
/// | 0x08 | `dqi_bgrace` (seconds) |
/// | 0x0C | `dqi_igrace` (seconds) |
/// | 0x10 | `dqi_flags` |
/// | 0x14 | `dqi_blocks` (quota blocks in the file) |
/// | 0x18 | `dqi_free_blk` (first block of the free-block list) |
/// | 0x1C | `dqi_free_entry` (first data block with a free entry) |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaInfo {
    /// Grace period for space over the soft limit.
    pub bgrace: u32,
    /// Grace period for inodes over the soft limit.
    pub igrace: u32,
    /// Flags (none defined for ext4's files).
    pub flags: u32,
    /// Quota blocks in the file.
    pub blocks: u32,
    /// First free block (a list through the data-block headers' next_free).
    pub free_blk: u32,
    /// First data block with a free entry (a doubly linked list).
    pub free_entry: u32,
}

impl QuotaInfo {
    /// Reads it from block 0.
    pub fn decode(b: &[u8]) -> Self {
        let o = INFO_OFFSET;
        QuotaInfo {
            bgrace: le32(b, o),
            igrace: le32(b, o + 4),
            flags: le32(b, o + 8),
            blocks: le32(b, o + 12),
            free_blk: le32(b, o + 16),
            free_entry: le32(b, o + 20),
        }
    }

    /// Writes it into block 0.
    pub fn encode(&self, b: &mut [u8]) {
        let o = INFO_OFFSET;
        put32(b, o, self.bgrace);
        put32(b, o + 4, self.igrace);
        put32(b, o + 8, self.flags);
        put32(b, o + 12, self.blocks);
        put32(b, o + 16, self.free_blk);
        put32(b, o + 20, self.free_entry);
    }
}

/// One id's entry (`struct v2r1_disk_dqblk`, 72 bytes), with space in bytes.
///
/// | offset | field |
/// |---|---|
/// | 0x00 | `dqb_id` |
/// | 0x04 | `dqb_pad` |
/// | 0x08 | `dqb_ihardlimit` |
/// | 0x10 | `dqb_isoftlimit` |
/// | 0x18 | `dqb_curinodes` |
/// | 0x20 | `dqb_bhardlimit` (1 KiB blocks) |
/// | 0x28 | `dqb_bsoftlimit` (1 KiB blocks) |
/// | 0x30 | `dqb_curspace` (bytes) |
/// | 0x38 | `dqb_btime` (when the space grace period ends, 0: not running) |
/// | 0x40 | `dqb_itime` (when the inode grace period ends) |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dquot {
    /// The user, group or project id.
    pub id: u32,
    /// Inodes: the hard limit (0: none).
    pub ihardlimit: u64,
    /// Inodes: the soft limit (0: none).
    pub isoftlimit: u64,
    /// Inodes in use.
    pub curinodes: u64,
    /// Space: the hard limit in bytes (0: none); stored in 1 KiB blocks.
    pub bhardlimit: u64,
    /// Space: the soft limit in bytes (0: none); stored in 1 KiB blocks.
    pub bsoftlimit: u64,
    /// Space in use, in bytes.
    pub curspace: u64,
    /// When the space grace period ends (seconds since the epoch; 0: not running).
    pub btime: u64,
    /// When the inode grace period ends.
    pub itime: u64,
}

impl Dquot {
    /// Reads an entry. `None` for an unused (all-zero) slot.
    pub fn decode(b: &[u8]) -> Option<Dquot> {
        if b[..ENTRY_SIZE].iter().all(|&x| x == 0) {
            return None;
        }
        Some(Dquot {
            id: le32(b, 0),
            ihardlimit: le64(b, 0x08),
            isoftlimit: le64(b, 0x10),
            curinodes: le64(b, 0x18),
            bhardlimit: le64(b, 0x20) * QUOTABLOCK_SIZE,
            bsoftlimit: le64(b, 0x28) * QUOTABLOCK_SIZE,
            curspace: le64(b, 0x30),
            btime: le64(b, 0x38),
            itime: le64(b, 0x40),
        })
    }

    /// Writes the entry. An entry that would be all zeros (id 0, nothing used, no limits)
    /// gets itime 1, as the kernel's v2r1_mem2diskdqblk does, so it does not read as free.
    pub fn encode(&self, b: &mut [u8]) {
        put32(b, 0, self.id);
        put32(b, 4, 0);
        put64(b, 0x08, self.ihardlimit);
        put64(b, 0x10, self.isoftlimit);
        put64(b, 0x18, self.curinodes);
        put64(b, 0x20, self.bhardlimit.div_ceil(QUOTABLOCK_SIZE));
        put64(b, 0x28, self.bsoftlimit.div_ceil(QUOTABLOCK_SIZE));
        put64(b, 0x30, self.curspace);
        put64(b, 0x38, self.btime);
        put64(b, 0x40, self.itime);
        if b[..ENTRY_SIZE].iter().all(|&x| x == 0) {
            put64(b, 0x40, 1);
        }
    }

    /// Whether it has any limit.
    pub fn has_limits(&self) -> bool {
        self.ihardlimit | self.isoftlimit | self.bhardlimit | self.bsoftlimit != 0
    }
}

/// The slot of `id` in a tree block at `depth` (0: the root): one byte of the id, high first.
pub fn tree_index(id: u32, depth: u32) -> usize {
    ((id >> ((QT_TREEDEPTH - depth - 1) * 8)) & 0xff) as usize
}

/// Reference `i` of a tree block.
pub fn tree_ref(b: &[u8], i: usize) -> u32 {
    le32(b, i * 4)
}

/// Sets reference `i` of a tree block.
pub fn set_tree_ref(b: &mut [u8], i: usize, v: u32) {
    put32(b, i * 4, v)
}

/// A data block's header (`struct qt_disk_dqdbheader`): next_free at 0x0, prev_free at 0x4,
/// entries at 0x8 (u16), then padding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataHeader {
    /// Next block in its free list.
    pub next_free: u32,
    /// Previous block in the free-entry list.
    pub prev_free: u32,
    /// Entries in use.
    pub entries: u16,
}

impl DataHeader {
    /// Reads it from the start of a data block.
    pub fn decode(b: &[u8]) -> Self {
        DataHeader {
            next_free: le32(b, 0),
            prev_free: le32(b, 4),
            entries: le16(b, 8),
        }
    }
    /// Writes it at the start of a data block.
    pub fn encode(&self, b: &mut [u8]) {
        put32(b, 0, self.next_free);
        put32(b, 4, self.prev_free);
        put16(b, 8, self.entries);
        put16(b, 10, 0);
        put32(b, 12, 0);
    }
}

/// The byte offset in its data block of entry slot `i`.
pub fn entry_offset(i: usize) -> usize {
    DATA_HEADER + i * ENTRY_SIZE
}

/// A new quota file holding `entries` (in id order), as e2fsprogs writes one
/// (quota_file_create, then each dquot inserted in id order, lib/support/quotaio_tree.c):
/// the file's bytes (`dqi_blocks` quota blocks) and the order in which its quota blocks are
/// first written, which decides where mke2fs puts the filesystem blocks under them.
pub fn build_file(t: QuotaType, entries: &[Dquot]) -> (Vec<u8>, Vec<u32>) {
    let mut f = NewFile {
        blocks: vec![vec![0u8; QT_BLKSIZE]],
        order: Vec::new(),
        info: QuotaInfo {
            bgrace: DEFAULT_GRACE,
            igrace: DEFAULT_GRACE,
            flags: 0,
            blocks: QT_TREEOFF + 1,
            free_blk: 0,
            free_entry: 0,
        },
    };
    put_header(&mut f.blocks[0], t);
    f.touch(0);
    for q in entries {
        let off = f.insert(q.id, QT_TREEOFF, 0);
        let (n, at) = ((off / QT_BLKSIZE) as usize, off % QT_BLKSIZE);
        q.encode(&mut f.blocks[n][at..at + ENTRY_SIZE]);
    }
    let info = f.info;
    info.encode(&mut f.blocks[0]);
    f.blocks.resize(info.blocks as usize, vec![0u8; QT_BLKSIZE]);
    (f.blocks.concat(), f.order)
}

/// The file being built by [`build_file`].
struct NewFile {
    blocks: Vec<Vec<u8>>,
    order: Vec<u32>,
    info: QuotaInfo,
}

impl NewFile {
    /// Block `n` is written: grows the file to hold it and notes its first write.
    fn touch(&mut self, n: u32) {
        if self.blocks.len() <= n as usize {
            self.blocks.resize(n as usize + 1, vec![0u8; QT_BLKSIZE]);
        }
        if !self.order.contains(&n) {
            self.order.push(n);
        }
    }

    /// A new block at the end of the file (get_free_dqblk: nothing is freed while building).
    fn new_block(&mut self) -> u32 {
        let b = self.info.blocks;
        self.info.blocks += 1;
        self.touch(b);
        b
    }

    /// do_insert_tree: the entry's byte offset in the file.
    fn insert(&mut self, id: u32, blk: u32, depth: u32) -> usize {
        let i = tree_index(id, depth);
        let child = self.blocks.get(blk as usize).map_or(0, |b| tree_ref(b, i));
        let (newblk, off) = if depth == QT_TREEDEPTH - 1 {
            self.free_entry(id)
        } else {
            let c = if child == 0 { self.new_block() } else { child };
            (c, self.insert(id, c, depth + 1))
        };
        if child == 0 {
            self.touch(blk);
            set_tree_ref(&mut self.blocks[blk as usize], i, newblk);
        }
        off
    }

    /// find_free_dqentry: a slot in the first data block with room.
    fn free_entry(&mut self, id: u32) -> (u32, usize) {
        let d = if self.info.free_entry != 0 {
            self.info.free_entry
        } else {
            let d = self.new_block();
            self.info.free_entry = d;
            d
        };
        let mut hd = DataHeader::decode(&self.blocks[d as usize]);
        if hd.entries as usize + 1 >= ENTRIES_PER_BLOCK {
            // Full now: off the free-entry list (its neighbours: none while building).
            self.info.free_entry = hd.next_free;
            hd.next_free = 0;
            hd.prev_free = 0;
        }
        hd.entries += 1;
        self.touch(d);
        let b = &mut self.blocks[d as usize];
        hd.encode(b);
        let slot = (0..ENTRIES_PER_BLOCK)
            .find(|&s| Dquot::decode(&b[entry_offset(s)..entry_offset(s) + ENTRY_SIZE]).is_none())
            .expect("a listed data block has a free slot");
        // Taken, so that the next insertion does not find it free.
        Dquot {
            id,
            itime: 1,
            ..Default::default()
        }
        .encode(&mut b[entry_offset(slot)..entry_offset(slot) + ENTRY_SIZE]);
        (d, d as usize * QT_BLKSIZE + entry_offset(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip_and_the_id_zero_marker() {
        let d = Dquot {
            id: 1000,
            curspace: 4096,
            curinodes: 2,
            bhardlimit: 2048,
            ..Default::default()
        };
        let mut b = [0u8; ENTRY_SIZE];
        d.encode(&mut b);
        assert_eq!(le64(&b, 0x20), 2);
        assert_eq!(Dquot::decode(&b), Some(d));
        let mut z = [0u8; ENTRY_SIZE];
        Dquot::default().encode(&mut z);
        assert_eq!(
            le64(&z, 0x40),
            1,
            "an empty id-0 entry must not read as free"
        );
        assert_eq!(ENTRIES_PER_BLOCK, 14);
    }

    #[test]
    fn tree_index_takes_the_high_byte_first() {
        assert_eq!(tree_index(0x0102_0304, 0), 1);
        assert_eq!(tree_index(0x0102_0304, 3), 4);
    }

    #[test]
    fn a_new_file_is_laid_out_as_e2fsprogs_writes_it() {
        let q = Dquot {
            id: 0,
            curspace: 13312,
            curinodes: 2,
            ..Default::default()
        };
        let (bytes, order) = build_file(QuotaType::User, &[q]);
        assert_eq!(bytes.len(), 6 * QT_BLKSIZE);
        assert_eq!(order, [0, 2, 3, 4, 5, 1]);
        let info = QuotaInfo::decode(&bytes);
        assert_eq!((info.blocks, info.free_blk, info.free_entry), (6, 0, 5));
        assert_eq!(tree_ref(&bytes[QT_BLKSIZE..], 0), 2);
        assert_eq!(
            Dquot::decode(&bytes[5 * QT_BLKSIZE + DATA_HEADER..]),
            Some(q)
        );
    }
}
