//! The journal's history, for examiners: every transaction whose blocks are still readable in
//! the log, checkpointed or not (debugfs's `logdump -a`), what each logged block is, older
//! copies of an inode the log still holds, and the deleted files those copies can bring back
//! (extundelete's and ext4magic's method).
//!
//! jbd2 never erases its log: a checkpointed transaction stays readable until the circular
//! log comes round and overwrites it. The whole log is scanned, not only the part recovery
//! would replay. A block that begins with the jbd2 magic is a log header (data blocks that
//! began with it are stored escaped, with the magic zeroed), so every header is found by its
//! first four bytes wherever the log's head has moved. A transaction's blocks are intact
//! unless a later transaction's blocks lie over them, or their tag checksum (csum v2/v3)
//! fails.
//!
//! Nothing here writes, or goes through the journal object: the log is read through the
//! device, as it lies.

use crate::error::{Error, Result};
use crate::format::inode::RawInode;
use crate::fs::Fs;
use crate::inspect::MapEntry;
use crate::journal::format::{
    be32, be64, JournalSuperblock, TagFormat, BT_COMMIT, BT_DESCRIPTOR, BT_REVOKE, FLAG_ESCAPE,
    JBD2_MAGIC, REVOKE_HEADER_SIZE,
};
use crate::journal::JournalMap;
use std::collections::{BTreeMap, HashMap};

/// The state of one logged copy of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoggedState {
    /// Its log block still holds it.
    Intact,
    /// A later transaction's block lies over it in the log.
    Overwritten,
    /// Its tag's checksum does not match the log block (csum v2/v3 only).
    BadChecksum,
}

/// One filesystem block as a transaction logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedBlock {
    /// The filesystem block it is a copy of.
    pub fs_block: u64,
    /// Where the copy lies in the log (a journal block number).
    pub log_block: u32,
    /// Stored with its first four bytes zeroed (it began with the jbd2 magic).
    pub escaped: bool,
    /// Whether the copy can still be read.
    pub state: LoggedState,
}

/// One transaction found in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedTransaction {
    /// Its sequence number (tid).
    pub sequence: u32,
    /// The commit block's time (seconds, nanoseconds), None without a commit block.
    pub commit_time: Option<(u64, u32)>,
    /// Whether a commit block for it was found (a transaction without one never took
    /// effect).
    pub committed: bool,
    /// The log block of its first descriptor.
    pub first_log_block: u32,
    /// The blocks it logged, in log order.
    pub blocks: Vec<LoggedBlock>,
    /// The blocks it revoked (earlier copies of these are not to be replayed).
    pub revoked: Vec<u64>,
}

/// What the log holds.
#[derive(Debug, Clone)]
pub struct JournalHistory {
    /// The journal superblock's s_first: the log's first block.
    pub first: u32,
    /// The journal's length in blocks (s_maxlen).
    pub maxlen: u32,
    /// s_sequence: the first transaction recovery would look for.
    pub sequence: u32,
    /// s_start: where recovery would begin (0: nothing to replay).
    pub start: u32,
    /// The transactions found, by sequence.
    pub transactions: Vec<LoggedTransaction>,
    /// Where the journal's blocks are, for reading logged copies back.
    map: JournalMap,
}

/// What a filesystem block is used for (a logged block's meaning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockUse {
    /// The superblock (primary in group 0, or a backup) of `group`.
    Superblock {
        /// The group holding it.
        group: u32,
    },
    /// Group descriptors or reserved descriptor blocks (the copy in `group`).
    GroupDescriptors {
        /// The group holding the copy.
        group: u32,
    },
    /// A group's block bitmap.
    BlockBitmap {
        /// The group it describes.
        group: u32,
    },
    /// A group's inode bitmap.
    InodeBitmap {
        /// The group it describes.
        group: u32,
    },
    /// A block of a group's inode table.
    InodeTable {
        /// The group whose table it is.
        group: u32,
        /// The first inode it holds.
        first: u32,
        /// The last inode it holds.
        last: u32,
    },
    /// A block of the journal itself.
    Journal,
    /// A data or directory block of an inode.
    Data {
        /// The inode.
        ino: u32,
        /// Its logical block there.
        lblk: u64,
        /// Whether the inode is a directory.
        dir: bool,
    },
    /// A block of an inode's extent tree or block map.
    Map {
        /// The inode.
        ino: u32,
        /// The level, as in [`MapEntry::Map`].
        level: u8,
    },
    /// An inode's extended attribute block.
    Xattr {
        /// The (first) inode that uses it.
        ino: u32,
    },
    /// No live inode or structure claims it now.
    Unowned,
}

/// An older copy of an inode found in a logged inode-table block.
#[derive(Debug, Clone)]
pub struct LoggedInode {
    /// The transaction that logged it.
    pub sequence: u32,
    /// That transaction's commit time.
    pub commit_time: Option<(u64, u32)>,
    /// The copy's bytes (the filesystem's inode size).
    pub raw: RawInode,
}

/// The most blocks read while scanning a log (a journal is at most 2^32 blocks; the kernel
/// makes them at most 1 GiB, 2^18 4-KiB blocks). A log claiming more is read this far.
const LOG_SCAN_MAX: u32 = 1 << 22;

impl Fs {
    fn journal_map_and_sb(&self) -> Result<(JournalMap, JournalSuperblock)> {
        let jino = self.sb.lock().journal_inum();
        if jino == 0 {
            return Err(Error::NotFound);
        }
        let rec = self.inode_record(jino)?;
        let map = self.block_map(&rec.raw)?;
        let bs = self.geo.block_size as u64;
        let nblocks = (rec.raw.size() / bs).min(u32::MAX as u64) as u32;
        let runs = map
            .runs()
            .filter(|r| !r.unwritten && r.lblk < nblocks as u64)
            .map(|r| {
                let len = r.len.min(nblocks as u64 - r.lblk) as u32;
                (r.lblk as u32, r.pblk, len)
            })
            .collect();
        let jmap = JournalMap::new(runs);
        let sb_blk = jmap.phys(0).ok_or_else(|| {
            Error::corrupt(
                crate::error::Corruption::Journal,
                "journal: the journal inode maps no first block",
            )
        })?;
        let b = self.read_log_block(sb_blk)?;
        Ok((jmap, JournalSuperblock::parse(&b)?))
    }

    /// A block of the log as the device holds it, past a journal replayed in memory (which
    /// rewrites the journal's superblock).
    fn read_log_block(&self, blk: u64) -> Result<Vec<u8>> {
        let bs = self.geo.block_size as usize;
        let mut b = vec![0u8; bs];
        self.dev.read_beneath_at(blk * bs as u64, &mut b)?;
        Ok(b)
    }

    fn read_raw_block(&self, blk: u64) -> Result<Vec<u8>> {
        let bs = self.geo.block_size as usize;
        let mut b = vec![0u8; bs];
        self.dev.read_at(blk * bs as u64, &mut b)?;
        Ok(b)
    }

    /// Every transaction whose blocks are still in the journal's log, by sequence.
    pub fn journal_history(&self) -> Result<JournalHistory> {
        let (jmap, jsb) = self.journal_map_and_sb()?;
        let fmt = TagFormat::from_incompat(jsb.feature_incompat);
        let seed = jsb.csum_seed();
        let first = jsb.first.max(1);
        let end = jsb.maxlen.min(first.saturating_add(LOG_SCAN_MAX));
        let len = end.saturating_sub(first);
        let next = |j: u32| if j + 1 >= end { first } else { j + 1 };
        let mut txns: BTreeMap<u32, LoggedTransaction> = BTreeMap::new();
        // Which transaction's block lies in each log block, by position (the newest wins).
        let mut claims: HashMap<u32, u32> = HashMap::new();
        for j in first..end {
            let Some(p) = jmap.phys(j) else { continue };
            let b = self.read_log_block(p)?;
            if be32(&b, 0) != JBD2_MAGIC {
                continue;
            }
            let (kind, tid) = (be32(&b, 4), be32(&b, 8));
            let t = txns.entry(tid).or_insert_with(|| LoggedTransaction {
                sequence: tid,
                commit_time: None,
                committed: false,
                first_log_block: j,
                blocks: Vec::new(),
                revoked: Vec::new(),
            });
            claim(&mut claims, j, tid);
            match kind {
                BT_DESCRIPTOR => {
                    let mut at = j;
                    for tag in fmt.tags(&b).into_iter().take(len as usize) {
                        at = next(at);
                        claim(&mut claims, at, tid);
                        let state = match jmap.phys(at) {
                            Some(q) if fmt.csum() => {
                                let data = self.read_log_block(q)?;
                                if fmt.data_csum(seed, tid, &data) == tag.checksum {
                                    LoggedState::Intact
                                } else {
                                    LoggedState::BadChecksum
                                }
                            }
                            Some(_) => LoggedState::Intact,
                            None => LoggedState::Overwritten,
                        };
                        t.blocks.push(LoggedBlock {
                            fs_block: tag.blocknr,
                            log_block: at,
                            escaped: tag.flags & FLAG_ESCAPE != 0,
                            state,
                        });
                    }
                }
                BT_COMMIT => {
                    t.committed = true;
                    let sec = be64(&b, 48);
                    let nsec = be32(&b, 56);
                    t.commit_time = (sec != 0 || nsec != 0).then_some((sec, nsec));
                }
                BT_REVOKE => {
                    let used = (be32(&b, 12) as usize).min(b.len() - fmt.tail_bytes());
                    let rb = fmt.revoke_record_bytes();
                    let mut o = REVOKE_HEADER_SIZE;
                    while o + rb <= used {
                        t.revoked.push(if rb == 8 {
                            be64(&b, o)
                        } else {
                            be32(&b, o) as u64
                        });
                        o += rb;
                    }
                }
                _ => {}
            }
        }
        // A log block claimed by a later transaction no longer holds an earlier one's copy.
        for t in txns.values_mut() {
            for lb in &mut t.blocks {
                if claims.get(&lb.log_block).is_some_and(|&w| w != t.sequence) {
                    lb.state = LoggedState::Overwritten;
                }
            }
        }
        Ok(JournalHistory {
            first: jsb.first,
            maxlen: jsb.maxlen,
            sequence: jsb.sequence,
            start: jsb.start,
            transactions: txns.into_values().collect(),
            map: jmap,
        })
    }

    /// The bytes a transaction logged for a block (unescaped), as the log holds them now.
    pub fn logged_block(&self, history: &JournalHistory, lb: &LoggedBlock) -> Result<Vec<u8>> {
        let p = history.map.phys(lb.log_block).ok_or(Error::NotFound)?;
        let mut b = self.read_log_block(p)?;
        if lb.escaped {
            b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        }
        Ok(b)
    }

    /// The copies of inode `ino` that intact logged inode-table blocks hold, oldest first.
    pub fn logged_inode_copies(
        &self,
        history: &JournalHistory,
        ino: u32,
    ) -> Result<Vec<LoggedInode>> {
        let (blk, off) = self.inode_location(ino)?;
        let isz = self.geo.inode_size as usize;
        let mut out = Vec::new();
        for t in history.transactions.iter().filter(|t| t.committed) {
            for lb in t.blocks.iter().filter(|b| b.fs_block == blk) {
                if lb.state != LoggedState::Intact {
                    continue;
                }
                let b = self.logged_block(history, lb)?;
                out.push(LoggedInode {
                    sequence: t.sequence,
                    commit_time: t.commit_time,
                    raw: RawInode(b[off..off + isz].to_vec()),
                });
            }
        }
        Ok(out)
    }

    /// What each of `blocks` is used for now: the layout's structures by the group
    /// descriptors, the rest by one pass over the inodes in use (the first that maps a block
    /// owns it, as debugfs's icheck).
    pub fn block_uses(&self, blocks: &[u64]) -> Result<Vec<BlockUse>> {
        let mut out: Vec<Option<BlockUse>> = blocks.iter().map(|&b| self.layout_use(b)).collect();
        let mut left: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, u) in out.iter().enumerate() {
            if u.is_none() {
                left.entry(blocks[i]).or_default().push(i);
            }
        }
        let jino = self.sb.lock().journal_inum();
        let mut ino = 1u32;
        while !left.is_empty() && ino <= self.geo.inodes_count {
            let this = ino;
            ino += 1;
            if !self.inode_in_use(this)? {
                continue;
            }
            let rec = self.inode_record(this)?;
            let r = &rec.raw;
            let mut put = |b: u64, u: BlockUse, left: &mut HashMap<u64, Vec<usize>>| {
                if let Some(ix) = left.remove(&b) {
                    for i in ix {
                        out[i] = Some(u.clone());
                    }
                }
            };
            if r.file_acl() != 0 {
                put(r.file_acl(), BlockUse::Xattr { ino: this }, &mut left);
            }
            let dir = r.is_dir();
            let Ok(map) = self.block_map(r) else { continue };
            for e in map.entries {
                match e {
                    MapEntry::Data(d) => {
                        for k in 0..d.len.min(1 << 32) {
                            if left.is_empty() {
                                break;
                            }
                            let u = if this == jino {
                                BlockUse::Journal
                            } else {
                                BlockUse::Data {
                                    ino: this,
                                    lblk: d.lblk + k,
                                    dir,
                                }
                            };
                            put(d.pblk + k, u, &mut left);
                        }
                    }
                    MapEntry::Map { level, pblk } => {
                        put(pblk, BlockUse::Map { ino: this, level }, &mut left)
                    }
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|u| u.unwrap_or(BlockUse::Unowned))
            .collect())
    }

    /// The fixed structure `blk` belongs to, if any.
    fn layout_use(&self, blk: u64) -> Option<BlockUse> {
        if blk < self.geo.first_data_block || blk >= self.geo.blocks_count {
            return None;
        }
        let g = self.geo.block_group(blk);
        let gfb = self.geo.group_first_block(g);
        let over = self.geo.group_overhead(g) as u64;
        if blk < gfb + over {
            return Some(if blk == gfb && self.geo.group_has_super(g) {
                BlockUse::Superblock { group: g }
            } else {
                BlockUse::GroupDescriptors { group: g }
            });
        }
        let bs = self.geo.block_size as u64;
        let per_block = (bs / self.geo.inode_size as u64) as u32;
        let table_blocks = (self.geo.inodes_per_group as u64).div_ceil(per_block as u64);
        // With flex_bg a group's bitmaps and table may lie in another group: look at all.
        for h in 0..self.geo.group_count {
            let d = self.group_desc(h);
            if d.block_bitmap() == blk {
                return Some(BlockUse::BlockBitmap { group: h });
            }
            if d.inode_bitmap() == blk {
                return Some(BlockUse::InodeBitmap { group: h });
            }
            let it = d.inode_table();
            if blk >= it && blk < it + table_blocks {
                let first = h * self.geo.inodes_per_group + 1 + (blk - it) as u32 * per_block;
                return Some(BlockUse::InodeTable {
                    group: h,
                    first,
                    last: first + per_block - 1,
                });
            }
        }
        None
    }
}

fn claim(claims: &mut HashMap<u32, u32>, j: u32, tid: u32) {
    let e = claims.entry(j).or_insert(tid);
    if crate::journal::format::tid_gt(tid, *e) {
        *e = tid;
    }
}

/// A deleted regular file that an older copy of its inode in the log still describes.
#[derive(Debug, Clone)]
pub struct DeletedFile {
    /// The inode number.
    pub ino: u32,
    /// The newest logged copy from before the deletion (links and a map still in place).
    pub copy: LoggedInode,
    /// Names found for it: (directory inode, name), from removed entries in the directories'
    /// blocks now and from directory blocks the log holds. Empty when none survives.
    pub names: Vec<(u32, Vec<u8>)>,
    /// Data blocks the copy maps (written ones; preallocated ones read as zeros).
    pub blocks: u64,
    /// Of those, how many are in use again now: their contents may be another file's.
    pub reused: u64,
}

impl Fs {
    /// The deleted regular files the log can bring back: inodes not in use now whose newest
    /// intact logged copy with a link still maps data (or holds it inline). As extundelete
    /// and ext4magic do, the data is read from the blocks that copy names; blocks in use
    /// again since are counted, not skipped, so the caller can say what may be stale.
    pub fn deleted_files(&self, history: &JournalHistory) -> Result<Vec<DeletedFile>> {
        let per_block = self.geo.block_size / self.geo.inode_size;
        let mut newest: BTreeMap<u32, LoggedInode> = BTreeMap::new();
        for t in history.transactions.iter().filter(|t| t.committed) {
            for lb in t.blocks.iter().filter(|b| b.state == LoggedState::Intact) {
                let Some(BlockUse::InodeTable { first, .. }) = self.layout_use(lb.fs_block) else {
                    continue;
                };
                let b = self.logged_block(history, lb)?;
                for i in 0..per_block {
                    let ino = first + i;
                    let off = (i * self.geo.inode_size) as usize;
                    let raw = RawInode(b[off..off + self.geo.inode_size as usize].to_vec());
                    if !raw.is_reg() || raw.links_count() == 0 || !holds_data(&raw) {
                        continue;
                    }
                    let copy = LoggedInode {
                        sequence: t.sequence,
                        commit_time: t.commit_time,
                        raw,
                    };
                    // Transactions are in sequence order: a later copy replaces an earlier.
                    newest.insert(ino, copy);
                }
            }
        }
        let mut out = Vec::new();
        for (ino, copy) in newest {
            if ino > self.geo.inodes_count || self.inode_in_use(ino)? {
                continue;
            }
            let (mut blocks, mut reused) = (0, 0);
            if let Ok(map) = self.block_map(&copy.raw) {
                for r in map.runs().filter(|r| !r.unwritten) {
                    for k in 0..r.len {
                        let p = r.pblk + k;
                        blocks += 1;
                        let inside = p >= self.geo.first_data_block && p < self.geo.blocks_count;
                        if !inside || self.block_in_use(p)? {
                            reused += 1;
                        }
                    }
                }
            }
            out.push(DeletedFile {
                ino,
                copy,
                names: Vec::new(),
                blocks,
                reused,
            });
        }
        self.name_deleted(history, &mut out)?;
        Ok(out)
    }

    /// Fills in the names of `files`: removed entries in the directories in use now, then
    /// entries in logged directory blocks (the block's directory is its `.` entry, or the
    /// directory that owns the block now).
    fn name_deleted(&self, history: &JournalHistory, files: &mut [DeletedFile]) -> Result<()> {
        let want: HashMap<u32, usize> = files.iter().enumerate().map(|(i, f)| (f.ino, i)).collect();
        if want.is_empty() {
            return Ok(());
        }
        let add = |dir: u32, ino: u32, name: &[u8], files: &mut [DeletedFile]| {
            if let Some(&i) = want.get(&ino) {
                let n = (dir, name.to_vec());
                if !files[i].names.contains(&n) {
                    files[i].names.push(n);
                }
            }
        };
        for d in 1..=self.geo.inodes_count {
            if !self.inode_in_use(d)? {
                continue;
            }
            let rec = self.inode_record(d)?;
            if !rec.raw.is_dir() {
                continue;
            }
            if let Ok((ents, _)) = self.dir_entries_raw(d, &rec.raw, true) {
                for e in ents.iter().filter(|e| e.removed) {
                    add(d, e.inode, &e.name, files);
                }
            }
        }
        let mut logged: Vec<(u64, Vec<crate::inspect::RawDirEntry>)> = Vec::new();
        for t in history.transactions.iter().filter(|t| t.committed) {
            for lb in t.blocks.iter().filter(|b| b.state == LoggedState::Intact) {
                if self.layout_use(lb.fs_block).is_some() {
                    continue;
                }
                let b = self.logged_block(history, lb)?;
                let (mut ents, mut damage) = (Vec::new(), None);
                crate::inspect::scan_block(&b, Some(0), 0, true, &mut ents, &mut damage);
                let plausible = damage.is_none()
                    && !ents.is_empty()
                    && ents
                        .iter()
                        .all(|e| e.inode <= self.geo.inodes_count && !e.name.is_empty());
                if plausible {
                    logged.push((lb.fs_block, ents));
                }
            }
        }
        let owners = self.block_uses(&logged.iter().map(|l| l.0).collect::<Vec<_>>())?;
        for ((_, ents), owner) in logged.iter().zip(owners) {
            let dot = ents.iter().find(|e| e.name == b".").map(|e| e.inode);
            let dir = match (dot, owner) {
                (Some(d), _) => d,
                (None, BlockUse::Data { ino, dir: true, .. }) => ino,
                _ => 0,
            };
            for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
                add(dir, e.inode, &e.name, files);
            }
        }
        Ok(())
    }

    /// The data of a logged inode copy, as its map (or inline data) describes it: `put` is
    /// given (offset, bytes) pieces in file order, holes and preallocated ranges left out,
    /// the last cut at the copy's size. Returns the size.
    pub fn read_logged_copy(
        &self,
        ino: u32,
        raw: &RawInode,
        put: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<u64> {
        let size = raw.size();
        if raw.flags() & crate::flags::FL_INLINE_DATA != 0 {
            let mut data = raw.i_block().to_vec();
            if let Ok(l) = self.xattr_load(ino, raw) {
                if let Some(e) = l.ibody.iter().find(|e| e.index == 7 && e.name == b"data") {
                    data.extend_from_slice(&e.value);
                }
            }
            data.truncate(size.min(data.len() as u64) as usize);
            put(0, &data)?;
            return Ok(size);
        }
        let bs = self.geo.block_size as u64;
        let map = self.block_map(raw)?;
        for r in map.runs().filter(|r| !r.unwritten) {
            for k in 0..r.len {
                let off = (r.lblk + k) * bs;
                if off >= size {
                    break;
                }
                if r.pblk + k >= self.geo.blocks_count {
                    continue; // a damaged copy's block outside the filesystem: a hole
                }
                let b = self.read_raw_block(r.pblk + k)?;
                let n = (size - off).min(bs) as usize;
                put(off, &b[..n])?;
            }
        }
        Ok(size)
    }
}

/// Whether a regular file's copy still maps or holds data: a deletion's truncate clears the
/// map in the copies it logs, so only earlier ones pass.
fn holds_data(raw: &RawInode) -> bool {
    if raw.size() == 0 {
        return false;
    }
    if raw.flags() & crate::flags::FL_INLINE_DATA != 0 {
        return true;
    }
    let ib = raw.i_block();
    if raw.flags() & crate::flags::FL_EXTENTS != 0 {
        let h = crate::format::extent::ExtentHeader::read(ib);
        return h.magic == crate::format::extent::EXTENT_MAGIC && h.entries > 0;
    }
    ib.chunks(4).take(15).any(|c| c != [0, 0, 0, 0])
}
