//! The examiner's view below the namespace (debugfs's `stat`, the Sleuth Kit's `istat`): an
//! inode's record read straight from its table, whatever its state (in use, deleted, never
//! used, damaged), where it lives, whether its checksum holds, and the blocks its extent tree
//! or block map points at.
//!
//! Nothing here goes through the inode cache or changes anything: a deleted inode is read as
//! it lies, and a damaged one is shown as far as it can be (a bad checksum is reported, not
//! refused; a map that points outside the filesystem or loops ends the walk with a note).

use crate::error::Result;
use crate::format::extent::{ExtentHeader, EXTENT_MAGIC};
use crate::format::inode::RawInode;
use crate::format::le32;
use crate::fs::Fs;

/// One inode as its table holds it.
#[derive(Debug, Clone)]
pub struct InodeRecord {
    /// The inode number.
    pub ino: u32,
    /// The on-disk bytes (the inode size of the filesystem).
    pub raw: RawInode,
    /// Its block group.
    pub group: u32,
    /// The inode-table block holding it.
    pub table_block: u64,
    /// Its byte offset in that block.
    pub offset: usize,
    /// Whether its checksum holds (None without metadata_csum, or for an all-zero record).
    pub checksum_ok: Option<bool>,
    /// Whether the inode bitmap has it in use.
    pub allocated: bool,
}

/// A run of blocks an inode maps: logical `lblk..lblk + len` at physical `pblk..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRun {
    /// First logical block.
    pub lblk: u64,
    /// First physical block.
    pub pblk: u64,
    /// Number of blocks.
    pub len: u64,
    /// Preallocated, reading as zeros.
    pub unwritten: bool,
}

/// One thing an inode's map points at, in the order of a depth-first walk (debugfs's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapEntry {
    /// A run of data blocks.
    Data(BlockRun),
    /// A block of the map itself: an extent tree node `level` below the inode's root
    /// (debugfs's ETB0, ETB1, ...), or an indirect block (`level` 1, 2, 3: IND, DIND, TIND).
    Map {
        /// The level, as above.
        level: u8,
        /// The block.
        pblk: u64,
    },
}

/// An inode's mapping, and what stopped the walk early, if anything.
#[derive(Debug, Clone, Default)]
pub struct BlockMap {
    /// Data runs and map blocks, in walk order.
    pub entries: Vec<MapEntry>,
    /// Extents (true) or a block map (false).
    pub extents: bool,
    /// Where the walk stopped on damage (a bad header, a block out of range, a loop).
    pub damage: Option<String>,
    seen: std::collections::HashSet<u64>,
}

impl BlockMap {
    /// The data runs, in walk order.
    pub fn runs(&self) -> impl Iterator<Item = &BlockRun> {
        self.entries.iter().filter_map(|e| match e {
            MapEntry::Data(r) => Some(r),
            MapEntry::Map { .. } => None,
        })
    }
}

/// More map blocks than this in one inode's map is taken for a loop.
const MAP_BLOCKS_MAX: usize = 1 << 20;

impl Fs {
    /// Inode `ino` as its table holds it, used or not.
    pub fn inode_record(&self, ino: u32) -> Result<InodeRecord> {
        let (blk, off) = self.inode_location(ino)?;
        let buf = self.bcache.get(blk)?;
        let raw = RawInode(buf.read()[off..off + self.geo.inode_size as usize].to_vec());
        let checksum_ok = (self.geo.metadata_csum && raw.0.iter().any(|&b| b != 0))
            .then(|| raw.verify_csum(self.geo.csum_seed, ino));
        Ok(InodeRecord {
            ino,
            group: self.geo.ino_group(ino),
            table_block: blk,
            offset: off,
            checksum_ok,
            allocated: self.inode_in_use(ino)?,
            raw,
        })
    }

    /// The blocks `raw` maps (an extent tree or a block map; nothing for inline data, fast
    /// symlinks and devices). The walk is bounded: it stops, saying why, at a block outside
    /// the filesystem, a bad node, or more map blocks than any inode can have.
    pub fn block_map(&self, raw: &RawInode) -> Result<BlockMap> {
        let mut m = BlockMap::default();
        let flags = raw.flags();
        if flags & crate::flags::FL_INLINE_DATA != 0 || !maps_blocks(raw) {
            return Ok(m);
        }
        if flags & crate::flags::FL_EXTENTS != 0 {
            m.extents = true;
            self.inspect_extents(raw.i_block(), 0, &mut m)?;
        } else {
            let ib = raw.i_block();
            for i in 0..12u64 {
                let p = le32(ib, i as usize * 4) as u64;
                self.push_run(&mut m, i, p);
            }
            let per = self.geo.block_size as u64 / 4;
            let mut base = 12u64;
            for (level, span) in [(1u32, per), (2, per * per), (3, per * per * per)] {
                let p = le32(ib, (11 + level as usize) * 4) as u64;
                self.inspect_indirect(p, level, base, &mut m)?;
                base += span;
            }
        }
        Ok(m)
    }

    fn in_range(&self, p: u64) -> bool {
        p >= self.geo.first_data_block && p < self.geo.blocks_count
    }

    fn push_run(&self, m: &mut BlockMap, lblk: u64, p: u64) {
        if p == 0 {
            return;
        }
        if let Some(MapEntry::Data(r)) = m.entries.last_mut() {
            if r.lblk + r.len == lblk && r.pblk + r.len == p {
                r.len += 1;
                return;
            }
        }
        m.entries.push(MapEntry::Data(BlockRun {
            lblk,
            pblk: p,
            len: 1,
            unwritten: false,
        }));
    }

    /// A map block at `p` of `level`, read, or the walk's end noted in `m`.
    fn map_block(&self, p: u64, level: u8, m: &mut BlockMap) -> Result<Option<Vec<u8>>> {
        if m.damage.is_some() {
            return Ok(None);
        }
        if !self.in_range(p) {
            m.damage = Some(format!("map block {p} is outside the filesystem"));
            return Ok(None);
        }
        if m.seen.len() >= MAP_BLOCKS_MAX || !m.seen.insert(p) {
            m.damage = Some(format!("map block {p} seen twice (a loop)"));
            return Ok(None);
        }
        m.entries.push(MapEntry::Map { level, pblk: p });
        Ok(Some(self.bcache.get(p)?.read().to_vec()))
    }

    fn inspect_indirect(&self, p: u64, level: u32, base: u64, m: &mut BlockMap) -> Result<()> {
        if p == 0 {
            return Ok(());
        }
        let Some(b) = self.map_block(p, level as u8, m)? else {
            return Ok(());
        };
        let per = self.geo.block_size as u64 / 4;
        let span = per.pow(level - 1);
        for i in 0..per {
            let q = le32(&b, i as usize * 4) as u64;
            if level == 1 {
                self.push_run(m, base + i, q);
            } else {
                self.inspect_indirect(q, level - 1, base + i * span, m)?;
            }
        }
        Ok(())
    }

    fn inspect_extents(&self, node: &[u8], depth_seen: u16, m: &mut BlockMap) -> Result<()> {
        let h = ExtentHeader::read(node);
        let max_entries = (node.len() - 12) / 12;
        if h.magic != EXTENT_MAGIC || h.entries as usize > max_entries || h.depth > 5 {
            m.damage = Some("an extent node with a bad header".into());
            return Ok(());
        }
        if depth_seen > 5 {
            m.damage = Some("an extent tree deeper than 5".into());
            return Ok(());
        }
        for i in 0..h.entries as usize {
            let e = &node[12 + i * 12..24 + i * 12];
            if h.depth == 0 {
                let x = crate::format::extent::Extent::read(e);
                m.entries.push(MapEntry::Data(BlockRun {
                    lblk: x.lblk as u64,
                    pblk: x.pblk,
                    len: x.len as u64,
                    unwritten: x.unwritten,
                }));
            } else {
                let idx = crate::format::extent::ExtentIdx::read(e);
                if let Some(b) = self.map_block(idx.leaf, depth_seen as u8, m)? {
                    self.inspect_extents(&b, depth_seen + 1, m)?;
                }
            }
        }
        Ok(())
    }
}

/// Whether an inode's i_block holds a map (not a fast symlink's target or a device number).
fn maps_blocks(raw: &RawInode) -> bool {
    use crate::format::inode::{S_IFDIR, S_IFLNK, S_IFREG};
    match raw.file_type() {
        S_IFREG | S_IFDIR => true,
        // A fast symlink keeps its target in i_block: no blocks, no extents flag.
        S_IFLNK => raw.blocks_512(1024) != 0 || raw.flags() & crate::flags::FL_EXTENTS != 0,
        _ => false,
    }
}

/// A directory entry as a directory's blocks hold it, live or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDirEntry {
    /// The inode it names.
    pub inode: u32,
    /// The name's bytes.
    pub name: Vec<u8>,
    /// The file type byte (`FT_*`; 0 without the filetype feature).
    pub file_type: u8,
    /// The directory's logical block holding it (None: in the inode, inline).
    pub lblk: Option<u64>,
    /// Its byte offset there.
    pub offset: usize,
    /// A removed entry still readable in the slack of the entry before it.
    pub removed: bool,
}

impl Fs {
    /// The entries of a directory in the order its blocks hold them (not the hash order a
    /// readdir of an indexed directory follows), with `.` and `..`; with `removed`, also the
    /// entries a removal left in the slack of their neighbours, found as e2fsprogs finds them
    /// (ext2fs_process_dir_block with DIRENT_FLAG_INCLUDE_REMOVED: a candidate counts when
    /// the record lengths from it reach the end of the slack exactly). Works on any directory
    /// record, deleted ones too; damage ends the walk of a block and is noted.
    pub fn dir_entries_raw(
        &self,
        ino: u32,
        raw: &RawInode,
        removed: bool,
    ) -> Result<(Vec<RawDirEntry>, Option<String>)> {
        let mut out = Vec::new();
        let mut damage = None;
        if raw.flags() & crate::flags::FL_INLINE_DATA != 0 {
            let ib = raw.i_block();
            let parent = le32(ib, 0);
            for (name, inode) in [(&b"."[..], ino), (b"..", parent)] {
                out.push(RawDirEntry {
                    inode,
                    name: name.to_vec(),
                    file_type: crate::format::dir_entry::FT_DIR,
                    lblk: None,
                    offset: 0,
                    removed: false,
                });
            }
            let mut area = ib[4..].to_vec();
            if let Ok(l) = self.xattr_load(ino, raw) {
                if let Some(e) = l.ibody.iter().find(|e| e.index == 7 && e.name == b"data") {
                    // The two runs are parsed apart, as the kernel keeps them.
                    scan_block(&area, None, 4, removed, &mut out, &mut damage);
                    area = e.value.clone();
                    scan_block(&area, None, 60, removed, &mut out, &mut damage);
                    return Ok((out, damage));
                }
            }
            scan_block(&area, None, 4, removed, &mut out, &mut damage);
            return Ok((out, damage));
        }
        let map = self.block_map(raw)?;
        let bs = self.geo.block_size as u64;
        let indexed = raw.flags() & crate::flags::FL_INDEX != 0;
        for r in map.runs() {
            if r.unwritten {
                continue;
            }
            for i in 0..r.len {
                let lblk = r.lblk + i;
                if lblk * bs >= raw.size() {
                    break;
                }
                let b = self.bcache.get(r.pblk + i)?.read().to_vec();
                // An index node holds no entries (one empty record over the block); the
                // index root's slack after `..` holds the index, not removed entries.
                let dx_node = indexed && lblk > 0 && le32(&b, 0) == 0 && {
                    let rl = crate::format::dir_entry::DirEntryRef { block: &b, off: 0 };
                    rl.rec_len() == b.len()
                };
                if dx_node {
                    continue;
                }
                let scan_removed = removed && !(indexed && lblk == 0);
                scan_block(&b, Some(lblk), 0, scan_removed, &mut out, &mut damage);
            }
        }
        if damage.is_none() {
            damage = map.damage;
        }
        Ok((out, damage))
    }
}

/// Whether the records from `off` reach `end` exactly, each well-formed
/// (ext2fs_validate_entry).
fn chain_reaches(b: &[u8], mut off: usize, end: usize) -> bool {
    while off < end {
        if off + 8 > b.len() {
            return false;
        }
        let e = crate::format::dir_entry::DirEntryRef { block: b, off };
        let rl = e.rec_len();
        if rl < 8 || !rl.is_multiple_of(4) || e.name_len() + 8 > rl {
            return false;
        }
        off += rl;
    }
    off == end
}

/// The entries of one directory block (or inline run) `b`; `shift` is added to offsets (an
/// inline run's place in the inode).
pub(crate) fn scan_block(
    b: &[u8],
    lblk: Option<u64>,
    shift: usize,
    removed: bool,
    out: &mut Vec<RawDirEntry>,
    damage: &mut Option<String>,
) {
    let mut off = 0;
    let mut next_real = 0;
    while off + 8 <= b.len() {
        let e = crate::format::dir_entry::DirEntryRef { block: b, off };
        let rl = e.rec_len();
        if off + rl > b.len() || rl < 8 || !rl.is_multiple_of(4) || e.name_len() + 8 > rl {
            if damage.is_none() {
                let at = lblk.map_or("inline".to_string(), |l| format!("block {l}"));
                *damage = Some(format!("directory {at}: a bad record at offset {off}"));
            }
            return;
        }
        let is_removed = off != next_real;
        if e.inode() != 0 && e.file_type() != crate::format::dir_entry::FT_DIR_CSUM {
            out.push(RawDirEntry {
                inode: e.inode(),
                name: e.name().to_vec(),
                file_type: e.file_type(),
                lblk,
                offset: off + shift,
                removed: is_removed,
            });
        }
        if next_real == off {
            next_real += rl;
        }
        let size = (e.name_len() + 11) & !3;
        if removed && rl != size {
            let end = off + rl;
            off += size;
            while off < end && !chain_reaches(b, off, end) {
                off += 4;
            }
            continue;
        }
        off += rl;
    }
}
