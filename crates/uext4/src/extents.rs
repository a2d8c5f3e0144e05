//! The extent tree (Documentation/filesystems/ext4/ifork.rst) and the in-memory extent cache.
//!
//! Every file's extents are loaded once, on first use, into an [`ExtentCache`] (a sorted map
//! from first logical block to extent); lookups never read tree blocks again (DESIGN.md R1).
//! Changes are made to the cache and to the on-disk tree together, one leaf at a time: the path
//! from the root to the leaf is read, the leaf's entries are edited, and the change is pushed
//! back up: a full node splits (the root grows the tree by one level), an empty node is freed
//! and its index entry removed, and index keys follow the first key of their child.
//!
//! Files that use the old indirect block map (ext2/ext3 style: twelve direct pointers, then
//! single, double and triple indirect blocks) go through the same cache: they are loaded into
//! it as extents, and mapping or unmapping blocks edits the pointers and indirect blocks
//! instead of a tree. New files on a filesystem without the extents feature get such a map, as
//! the kernel gives them. Unwritten (preallocated) blocks have no place in a block map.

use crate::bcache::Buffer;
use crate::error::{Error, Result};
use crate::format::extent::*;
use crate::format::inode::{RawInode, FL_EXTENTS};
use crate::format::{le32, put32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every extent of one file, keyed by first logical block.
#[derive(Clone, Debug, Default)]
pub struct ExtentCache {
    pub map: BTreeMap<u32, Extent>,
    /// The file uses the indirect block map, not an extent tree.
    pub blockmap: bool,
}

impl ExtentCache {
    pub fn empty() -> Self {
        Self::default()
    }
    /// The extent containing `lblk`.
    pub fn lookup(&self, lblk: u32) -> Option<Extent> {
        let (_, e) = self.map.range(..=lblk).next_back()?;
        if (lblk as u64) < e.end() {
            Some(*e)
        } else {
            None
        }
    }
    /// The last extent that starts at or before `lblk` (containing it or before it).
    pub fn prev(&self, lblk: u32) -> Option<Extent> {
        self.map.range(..=lblk).next_back().map(|(_, e)| *e)
    }
    /// The first extent ending after `lblk`.
    pub fn next(&self, lblk: u32) -> Option<Extent> {
        if let Some(e) = self.lookup(lblk) {
            return Some(e);
        }
        self.map.range(lblk..).next().map(|(_, e)| *e)
    }
}

/// Removes logical blocks `[start, end)` from a cache, trimming and splitting extents.
fn cache_cut(map: &mut BTreeMap<u32, Extent>, start: u64, end: u64) {
    if start >= end {
        return;
    }
    // Only the extent holding `start` (if any) and those that begin before `end` can meet the
    // range: a walk of the whole map made every conversion of a fragmented file O(extents).
    let s = u32::try_from(start).unwrap_or(u32::MAX);
    let from = map.range(..=s).next_back().map_or(s, |(&k, _)| k);
    let hit: Vec<Extent> = map
        .range(from..)
        .take_while(|(&k, _)| (k as u64) < end)
        .map(|(_, e)| *e)
        .filter(|e| e.end() > start)
        .collect();
    for x in hit {
        map.remove(&x.lblk);
        if (x.lblk as u64) < start {
            let e = Extent {
                len: (start - x.lblk as u64) as u32,
                ..x
            };
            map.insert(e.lblk, e);
        }
        if x.end() > end {
            let e = Extent {
                lblk: end as u32,
                len: (x.end() - end) as u32,
                pblk: x.pblk + (end - x.lblk as u64),
                unwritten: x.unwritten,
            };
            map.insert(e.lblk, e);
        }
    }
}

/// Frees blocks in contiguous runs (data and metadata apart) and counts them.
#[derive(Default)]
struct Freer {
    run: Option<(u64, u64)>,
    count: u64,
    /// The "data" blocks are a directory's (or symlink's): journaled, so revoked when freed.
    journaled_data: bool,
}

impl Freer {
    fn data(&mut self, fs: &Fs, h: &mut Handle<'_>, p: u64) -> Result<()> {
        self.count += 1;
        if let Some((s, l)) = self.run.as_mut() {
            if *s + *l == p {
                *l += 1;
                return Ok(());
            }
        }
        self.flush(fs, h)?;
        self.run = Some((p, 1));
        Ok(())
    }
    fn meta(&mut self, fs: &Fs, h: &mut Handle<'_>, p: u64) -> Result<()> {
        self.count += 1;
        fs.free_blocks(h, p, 1, true)
    }
    fn flush(&mut self, fs: &Fs, h: &mut Handle<'_>) -> Result<()> {
        if let Some((s, l)) = self.run.take() {
            fs.free_blocks(h, s, l, self.journaled_data)?;
        }
        Ok(())
    }
}

/// A node of the tree: the root in i_block, or a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Block(u64),
}

type Entry = [u8; ENTRY_SIZE];

/// How errors name a tree node: block 0 is the root in i_block.
fn node_name(blk: u64) -> String {
    if blk == 0 {
        "extent root".to_string()
    } else {
        format!("extent block {blk}")
    }
}

fn key(e: &Entry) -> u32 {
    le32(e, 0)
}

fn leaf_entry(x: &Extent) -> Entry {
    let mut b = [0u8; ENTRY_SIZE];
    x.write(&mut b);
    b
}

fn index_entry(lblk: u32, leaf: u64) -> Entry {
    let mut b = [0u8; ENTRY_SIZE];
    ExtentIdx { lblk, leaf }.write(&mut b);
    b
}

/// One step of a root-to-leaf path: the node, its depth, its entries, and which entry the path
/// follows (for index nodes).
struct Step {
    node: Node,
    depth: u16,
    entries: Vec<Entry>,
    idx: usize,
}

impl Fs {
    fn sectors_per_block(&self) -> u64 {
        self.geo.block_size as u64 / 512
    }

    /// Sets up an empty extent tree in a new inode's i_block.
    pub(crate) fn ext_init_root(raw: &mut RawInode) {
        raw.set_flags(raw.flags() | FL_EXTENTS);
        let b = raw.i_block_mut();
        b.fill(0);
        ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: 0,
            max: 4,
            depth: 0,
            generation: 0,
        }
        .write(b);
    }

    /// Depth of the inode's tree (0: the extents are in i_block).
    pub(crate) fn ext_depth(&self, st: &InodeState) -> u16 {
        if st.raw.flags() & FL_EXTENTS == 0 {
            return 0;
        }
        ExtentHeader::read(st.raw.i_block()).depth
    }

    /// Every extent of an inode (tests and tools).
    pub fn ext_list(&self, ino: u32) -> Result<Vec<Extent>> {
        let inode = self.iget(ino)?;
        let mut st = inode.state.lock();
        self.ext_load(ino, &mut st)?;
        Ok(st
            .extents
            .as_ref()
            .map(|c| c.map.values().copied().collect())
            .unwrap_or_default())
    }

    /// Depth of an inode's extent tree (tests and tools).
    pub fn ext_tree_depth(&self, ino: u32) -> Result<u16> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        Ok(self.ext_depth(&st))
    }

    /// Loads the inode's extents into its cache if they are not there yet, validating every node.
    pub(crate) fn ext_load(&self, ino: u32, st: &mut InodeState) -> Result<()> {
        if st.extents.is_some() {
            return Ok(());
        }
        if Self::is_inline(&st.raw) {
            // Callers convert an inline inode first (inline.rs); its bytes are not a map.
            return Err(Error::Invalid(format!(
                "inode {ino} keeps its data inline: it has no block map"
            )));
        }
        let mut cache = ExtentCache::empty();
        if st.raw.flags() & FL_EXTENTS != 0 {
            let root = st.raw.i_block().to_vec();
            let hdr = ExtentHeader::read(&root);
            let seed = RawInode::csum_seed(self.geo.csum_seed, ino, st.raw.generation());
            self.load_node(
                ino,
                seed,
                &root,
                None,
                hdr.depth,
                0,
                u64::MAX >> 1,
                &mut cache.map,
            )?;
        } else {
            cache.blockmap = true;
            self.load_blockmap(ino, &st.raw, &mut cache.map)?;
        }
        st.extents = Some(cache);
        Ok(())
    }

    fn corrupt(&self, ino: u32, blk: u64, what: String) -> Error {
        self.fail(
            Error::corrupt(format!("inode {ino}: {}: {what}", node_name(blk))),
            ino,
            blk,
            "ext_load",
        )
    }

    /// Validates one node and loads its extents. `lo`/`hi` bound the logical blocks its parent
    /// said it covers (`lo` is the parent's key for this node).
    #[allow(clippy::too_many_arguments)]
    fn load_node(
        &self,
        ino: u32,
        seed: u32,
        data: &[u8],
        blk: Option<u64>,
        want_depth: u16,
        lo: u64,
        hi: u64,
        out: &mut BTreeMap<u32, Extent>,
    ) -> Result<()> {
        let b = blk.unwrap_or(0);
        let hdr = ExtentHeader::read(data);
        if hdr.magic != EXTENT_MAGIC {
            return Err(self.corrupt(ino, b, format!("bad magic {:#06x}", hdr.magic)));
        }
        // e2fsprogs accepts eh_max from capacity-2 to capacity; the kernel anything up to it.
        let cap = node_capacity(data.len(), blk.is_none());
        if hdr.max > cap || hdr.max + 2 < cap || hdr.entries > hdr.max {
            return Err(self.corrupt(
                ino,
                b,
                format!(
                    "{} entries, eh_max {} (node capacity {cap})",
                    hdr.entries, hdr.max
                ),
            ));
        }
        if hdr.depth != want_depth || hdr.depth > MAX_DEPTH {
            return Err(self.corrupt(
                ino,
                b,
                format!("depth {} where {} was expected", hdr.depth, want_depth),
            ));
        }
        if let Some(blk) = blk {
            if self.geo.metadata_csum {
                let t = tail_offset(hdr.max);
                let want = crate::format::csum::crc32c(seed, &data[..t]);
                let have = le32(data, t);
                if have != want {
                    return Err(self.fail(
                        Error::BadChecksum(format!(
                            "inode {ino}: extent block {blk}: checksum {have:#010x}, \
                             computed {want:#010x}"
                        )),
                        ino,
                        blk,
                        "ext_load",
                    ));
                }
            }
        }
        let n = hdr.entries as usize;
        let entry =
            |i: usize| &data[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE];
        let mut prev_end = lo;
        for i in 0..n {
            let e = entry(i);
            if hdr.depth == 0 {
                let x = Extent::read(e);
                if x.len == 0 || (x.lblk as u64) < prev_end || x.end() > hi.min(1 << 32) {
                    return Err(self.corrupt(
                        ino,
                        b,
                        format!(
                            "extent {i} (logical {} len {}) overlaps its neighbours or lies \
                             outside [{lo}, {hi})",
                            x.lblk, x.len
                        ),
                    ));
                }
                if let Err(err) = self.check_file_block(ino, x.pblk, x.len as u64, &|| {
                    format!(
                        "inode {ino}: {}: extent {i} (logical {})",
                        node_name(b),
                        x.lblk
                    )
                }) {
                    return Err(self.fail(err, ino, b, "ext_load"));
                }
                prev_end = x.end();
                out.insert(x.lblk, x);
            } else {
                if i == 0 {
                    // Every key first, so that a bad key is blamed on this node, not a child.
                    let mut prev = lo;
                    for j in 0..n {
                        let k = le32(entry(j), 0) as u64;
                        if (j == 0 && k < lo) || (j > 0 && k <= prev) || k >= hi {
                            return Err(self.corrupt(
                                ino,
                                b,
                                format!(
                                    "index {j} (logical {k}) is out of order or outside \
                                     [{lo}, {hi})"
                                ),
                            ));
                        }
                        prev = k;
                    }
                }
                let x = ExtentIdx::read(e);
                let first_ok = if i == 0 {
                    x.lblk as u64 >= lo
                } else {
                    x.lblk as u64 > prev_end
                };
                if !first_ok || x.lblk as u64 >= hi {
                    return Err(self.corrupt(
                        ino,
                        b,
                        format!(
                            "index {i} (logical {}) is out of order or outside [{lo}, {hi})",
                            x.lblk
                        ),
                    ));
                }
                let next_lo = if i + 1 < n {
                    (le32(entry(i + 1), 0) as u64).min(hi)
                } else {
                    hi
                };
                if let Err(err) = self.check_file_block(ino, x.leaf, 1, &|| {
                    format!(
                        "inode {ino}: {}: index {i} (logical {})",
                        node_name(b),
                        x.lblk
                    )
                }) {
                    return Err(self.fail(err, ino, b, "ext_load"));
                }
                let buf = self.bcache.get(x.leaf)?;
                let child = buf.read().to_vec();
                self.load_node(
                    ino,
                    seed,
                    &child,
                    Some(x.leaf),
                    hdr.depth - 1,
                    x.lblk as u64,
                    next_lo.max(x.lblk as u64 + 1),
                    out,
                )?;
                prev_end = x.lblk as u64;
            }
        }
        Ok(())
    }

    /// Reads the indirect block map of a non-extent file into extents.
    fn load_blockmap(
        &self,
        ino: u32,
        raw: &RawInode,
        out: &mut BTreeMap<u32, Extent>,
    ) -> Result<()> {
        let ib = raw.i_block();
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        for i in 0..12u64 {
            let p = le32(ib, 4 * i as usize) as u64;
            if p != 0 {
                self.bm_check(ino, 0, p, &|| format!("direct pointer {i}"))?;
                blocks.push((i, p));
            }
        }
        for (n, (start, level)) in self.bm_roots().into_iter().enumerate() {
            let b = le32(ib, 48 + 4 * n) as u64;
            if b != 0 {
                self.bm_check(ino, 0, b, &|| format!("indirect pointer {}", 12 + n))?;
                self.walk_indirect(ino, b, level, start, &mut blocks)?;
            }
        }
        // `blocks` is in logical order: join runs into extents.
        let mut cur: Option<Extent> = None;
        for (l, p) in blocks {
            if let Some(c) = cur.as_mut() {
                if c.end() == l && c.pblk + c.len as u64 == p && c.len < MAX_INIT_LEN {
                    c.len += 1;
                    continue;
                }
                out.insert(c.lblk, *c);
            }
            cur = Some(Extent {
                lblk: l as u32,
                len: 1,
                pblk: p,
                unwritten: false,
            });
        }
        if let Some(c) = cur {
            out.insert(c.lblk, c);
        }
        Ok(())
    }

    /// The three indirect trees of a block map: (first logical block, levels).
    fn bm_roots(&self) -> [(u64, u32); 3] {
        let per = self.geo.block_size as u64 / 4;
        [(12, 1), (12 + per, 2), (12 + per + per * per, 3)]
    }

    /// A block-map pointer must lie inside the filesystem; `parent` is the indirect block
    /// holding it (0: i_block).
    fn bm_check(&self, ino: u32, parent: u64, p: u64, what: &dyn Fn() -> String) -> Result<()> {
        let name = || {
            if parent == 0 {
                format!("inode {ino}: block map: {}", what())
            } else {
                format!("inode {ino}: indirect block {parent}: {}", what())
            }
        };
        self.check_file_block(ino, p, 1, &name)
            .map_err(|e| self.fail(e, ino, if parent == 0 { p } else { parent }, "ext_load"))
    }

    fn walk_indirect(
        &self,
        ino: u32,
        blk: u64,
        level: u32,
        start: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let per = self.geo.block_size as u64 / 4;
        let data = self.bcache.get(blk)?.read().to_vec();
        let span = per.pow(level - 1);
        for i in 0..per {
            let p = le32(&data, 4 * i as usize) as u64;
            if p == 0 {
                continue;
            }
            self.bm_check(ino, blk, p, &|| format!("entry {i}"))?;
            let l = start + i * span;
            if level == 1 {
                if l < 1 << 32 {
                    out.push((l, p));
                }
            } else {
                // `level` strictly decreases: at most three nested reads.
                self.walk_indirect(ino, p, level - 1, l, out)?;
            }
        }
        Ok(())
    }

    /// Unmaps `[start, end)` of a file with an indirect block map: frees its data blocks and
    /// every indirect block left empty, and clears their pointers (journaled like any metadata).
    fn blockmap_remove(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u64,
        end: u64,
    ) -> Result<()> {
        let mut fr = Freer {
            journaled_data: Self::journaled_data(&st.raw),
            ..Default::default()
        };
        let mut ib = st.raw.i_block().to_vec();
        for i in 0..12u64 {
            let p = le32(&ib, 4 * i as usize) as u64;
            if p != 0 && i >= start && i < end {
                self.bm_check(ino, 0, p, &|| format!("direct pointer {i}"))?;
                fr.data(self, h, p)?;
                put32(&mut ib, 4 * i as usize, 0);
            }
        }
        let per = self.geo.block_size as u64 / 4;
        for (n, (first, level)) in self.bm_roots().into_iter().enumerate() {
            let p = le32(&ib, 48 + 4 * n) as u64;
            let last = first + per.pow(level);
            if p == 0 || end <= first || start >= last {
                continue;
            }
            self.bm_check(ino, 0, p, &|| format!("indirect pointer {}", 12 + n))?;
            if self.trim_indirect(h, ino, p, level, first, start, end, &mut fr)? {
                fr.meta(self, h, p)?;
                put32(&mut ib, 48 + 4 * n, 0);
            }
        }
        fr.flush(self, h)?;
        st.raw.i_block_mut().copy_from_slice(&ib);
        let b = st
            .raw
            .blocks_512(self.geo.block_size)
            .saturating_sub(fr.count * self.sectors_per_block());
        st.raw.set_blocks_512(b);
        if let Some(c) = st.extents.as_mut() {
            cache_cut(&mut c.map, start, end);
        }
        Ok(())
    }

    /// Clears the pointers of `[start, end)` under indirect block `blk` (covering logical blocks
    /// from `base`, `level` levels above the data). Returns whether the block is now empty.
    #[allow(clippy::too_many_arguments)]
    fn trim_indirect(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        blk: u64,
        level: u32,
        base: u64,
        start: u64,
        end: u64,
        fr: &mut Freer,
    ) -> Result<bool> {
        let per = self.geo.block_size as u64 / 4;
        let span = per.pow(level - 1);
        let buf = self.bcache.get(blk)?;
        let mut data = buf.read().to_vec();
        let mut changed = false;
        for i in 0..per {
            let lo = base + i * span;
            let hi = lo + span;
            let off = 4 * i as usize;
            let p = le32(&data, off) as u64;
            if p == 0 || hi <= start || lo >= end {
                continue;
            }
            self.bm_check(ino, blk, p, &|| format!("entry {i}"))?;
            let gone = if level == 1 {
                fr.data(self, h, p)?;
                true
            } else if self.trim_indirect(h, ino, p, level - 1, lo, start, end, fr)? {
                fr.meta(self, h, p)?;
                true
            } else {
                false
            };
            if gone {
                put32(&mut data, off, 0);
                changed = true;
            }
        }
        if data.iter().all(|&x| x == 0) {
            return Ok(true);
        }
        if changed {
            buf.write().copy_from_slice(&data);
            h.dirty(&buf);
        }
        Ok(false)
    }

    /// The most logical blocks a file with an indirect block map may have, as the kernel's
    /// ext4_max_bitmap_size counts them: what the four levels of pointers reach, unless
    /// i_blocks (2^48 - 1 sectors with huge_file, else 2^32 - 1) cannot count that many
    /// blocks together with their indirect blocks; then as many as it can count less the
    /// indirect blocks that mapping them needs. Never past 2^32 - 1 (the kernel's s_maxbytes).
    pub(crate) fn blockmap_max_blocks(&self) -> u64 {
        let per = self.geo.block_size as u64 / 4;
        let reach = 12 + per + per * per + per * per * per;
        let meta = 1 + (1 + per) + (1 + per + per * per);
        let sectors: u64 = if self.geo.huge_file {
            (1 << 48) - 1
        } else {
            (1 << 32) - 1
        };
        let countable = sectors / self.sectors_per_block();
        let max = if reach + meta <= countable {
            reach
        } else {
            // What the indirect blocks for `countable` data blocks take (ext4_max_bitmap_size).
            let mut rest = countable - 12 - per;
            let mut meta = 1;
            if rest < per * per {
                meta += 1 + rest.div_ceil(per);
            } else {
                meta += 1 + per;
                rest -= per * per;
                meta += 1 + rest.div_ceil(per) + rest.div_ceil(per * per);
            }
            countable - meta
        };
        max.min((1 << 32) - 1)
    }

    /// The largest size of a file with an indirect block map (the kernel's s_bitmap_maxbytes).
    pub fn blockmap_max_size(&self) -> u64 {
        self.blockmap_max_blocks() * self.geo.block_size as u64
    }

    /// The largest size inode `raw` may have: the filesystem's, or less with an indirect
    /// block map (the kernel's s_maxbytes and s_bitmap_maxbytes).
    pub(crate) fn max_size_of(&self, raw: &crate::format::inode::RawInode) -> u64 {
        if Self::uses_blockmap(raw) {
            self.blockmap_max_size().min(self.max_file_size())
        } else {
            self.max_file_size()
        }
    }

    /// Maps `e` (written blocks, over a hole) in a file with an indirect block map. First every
    /// indirect block the range needs is found or made (zeroed, journaled, counted in
    /// i_blocks, near the data), then the pointers are set. If an allocation fails, the
    /// indirect blocks made are taken out again and no pointer names the data blocks, which
    /// the caller then frees.
    fn blockmap_insert(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        e: Extent,
    ) -> Result<()> {
        if e.unwritten {
            return Err(Error::NotSupported(format!(
                "inode {ino}: preallocated (unwritten) blocks in a file with an indirect block \
                 map (ext2/ext3 layout)"
            )));
        }
        if e.end() > self.blockmap_max_blocks() {
            return Err(Error::FileTooBig);
        }
        let per = self.geo.block_size as u64 / 4;
        // Pass 1: the leaf-level indirect blocks, each with the first logical block it maps and
        // how many of the range's blocks it takes. Indirect blocks made here are noted (with
        // where their pointer went) so that a failure can take them out again.
        let mut leaves: Vec<(Arc<Buffer>, u64, u64)> = Vec::new();
        let mut made: Vec<(Option<Arc<Buffer>>, usize, u64)> = Vec::new();
        let mut pass1 = || -> Result<()> {
            let mut l = (e.lblk as u64).max(12);
            while l < e.end() {
                let (n, (first, level)) = self
                    .bm_roots()
                    .into_iter()
                    .enumerate()
                    .find(|(_, (first, level))| l < first + per.pow(*level))
                    .expect("checked against blockmap_max_blocks");
                let mut blk = le32(st.raw.i_block(), 48 + 4 * n) as u64;
                if blk == 0 {
                    blk = self.blockmap_new_indirect(h, ino, st, e.pblk)?;
                    put32(st.raw.i_block_mut(), 48 + 4 * n, blk as u32);
                    made.push((None, 48 + 4 * n, blk));
                } else {
                    self.bm_check(ino, 0, blk, &|| format!("indirect pointer {}", 12 + n))?;
                }
                let mut base = first;
                for lev in (2..=level).rev() {
                    let span = per.pow(lev - 1);
                    let i = (l - base) / span;
                    let buf = self.bcache.get(blk)?;
                    let child = le32(&buf.read(), 4 * i as usize) as u64;
                    blk = if child == 0 {
                        let c = self.blockmap_new_indirect(h, ino, st, e.pblk)?;
                        put32(&mut buf.write(), 4 * i as usize, c as u32);
                        h.dirty(&buf);
                        made.push((Some(buf), 4 * i as usize, c));
                        c
                    } else {
                        self.bm_check(ino, blk, child, &|| format!("entry {i}"))?;
                        child
                    };
                    base += i * span;
                }
                let take = (base + per - l).min(e.end() - l);
                leaves.push((self.bcache.get(blk)?, l - base, take));
                l += take;
            }
            Ok(())
        };
        if let Err(err) = pass1() {
            for (parent, off, blk) in made.into_iter().rev() {
                match parent {
                    None => put32(st.raw.i_block_mut(), off, 0),
                    Some(buf) => put32(&mut buf.write(), off, 0),
                }
                let _ = self.free_tree_block(h, st, blk);
            }
            return Err(err);
        }
        // Pass 2: the pointers, which nothing can fail now.
        let mut p = e.pblk;
        for l in e.lblk as u64..e.end().min(12) {
            put32(st.raw.i_block_mut(), 4 * l as usize, p as u32);
            p += 1;
        }
        for (buf, first, take) in leaves {
            {
                let mut d = buf.write();
                for i in first..first + take {
                    put32(&mut d, 4 * i as usize, p as u32);
                    p += 1;
                }
            }
            h.dirty(&buf);
        }
        // The cache: one extent, joined with physically contiguous neighbours.
        let map = &mut st.extents.as_mut().unwrap().map;
        let mut x = e;
        if let Some(left) = x.lblk.checked_sub(1).and_then(|b| {
            let (_, l) = map.range(..=b).next_back()?;
            (l.end() == x.lblk as u64 && l.pblk + l.len as u64 == x.pblk).then_some(*l)
        }) {
            if left.len + x.len <= MAX_INIT_LEN {
                map.remove(&left.lblk);
                x = Extent {
                    len: left.len + x.len,
                    ..left
                };
            }
        }
        if let Some(right) = map.get(&(x.end() as u32)).copied() {
            if x.end() < 1 << 32
                && x.pblk + x.len as u64 == right.pblk
                && x.len + right.len <= MAX_INIT_LEN
            {
                map.remove(&right.lblk);
                x.len += right.len;
            }
        }
        map.insert(x.lblk, x);
        let b = st.raw.blocks_512(self.geo.block_size) + e.len as u64 * self.sectors_per_block();
        st.raw.set_blocks_512(b);
        Ok(())
    }

    /// A new, zeroed indirect block near `near`, counted in the inode's i_blocks.
    fn blockmap_new_indirect(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        near: u64,
    ) -> Result<u64> {
        let b = self.alloc_tree_block(h, ino, st, near)?;
        let buf = self.bcache.get_new(b)?;
        buf.write().fill(0);
        h.dirty(&buf);
        Ok(b)
    }

    /// Answers `ask` from the file's extent cache, loading it first.
    pub(crate) fn ext_cached<T>(
        &self,
        ino: u32,
        st: &mut InodeState,
        ask: impl FnOnce(&ExtentCache) -> T,
    ) -> Result<T> {
        self.ext_load(ino, st)?;
        Ok(ask(st.extents.as_ref().unwrap()))
    }

    /// The extent containing `lblk`, or None for a hole.
    pub(crate) fn ext_map(
        &self,
        ino: u32,
        st: &mut InodeState,
        lblk: u32,
    ) -> Result<Option<Extent>> {
        self.ext_cached(ino, st, |c| c.lookup(lblk))
    }

    /// The first extent that ends after `lblk` (containing it or after it).
    pub(crate) fn ext_next(
        &self,
        ino: u32,
        st: &mut InodeState,
        lblk: u32,
    ) -> Result<Option<Extent>> {
        self.ext_cached(ino, st, |c| c.next(lblk))
    }

    fn writable_tree(&self, ino: u32, st: &mut InodeState) -> Result<()> {
        self.ext_load(ino, st)?;
        if st.extents.as_ref().unwrap().blockmap {
            return Err(Error::NotSupported(format!(
                "inode {ino}: unwritten blocks in a file with an indirect block map (not extents)"
            )));
        }
        Ok(())
    }

    /// Maps a hole: inserts `e`, merging it with a contiguous neighbour.
    pub(crate) fn ext_insert(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        e: Extent,
    ) -> Result<()> {
        self.ext_load(ino, st)?;
        if e.len == 0 || e.len > Extent::max_len(e.unwritten) || e.end() > 1 << 32 {
            return Err(Error::Invalid(format!(
                "inode {ino}: cannot map {} blocks at logical block {}",
                e.len, e.lblk
            )));
        }
        self.check_file_block(ino, e.pblk, e.len as u64, &|| {
            format!("inode {ino}: new extent at logical block {}", e.lblk)
        })?;
        let cache = st.extents.as_ref().unwrap();
        if let Some(x) = cache.next(e.lblk) {
            if (x.lblk as u64) < e.end() {
                return Err(self.fail(
                    Error::corrupt(format!(
                        "inode {ino}: new extent at {} overlaps the one at {}",
                        e.lblk, x.lblk
                    )),
                    ino,
                    0,
                    "ext_insert",
                ));
            }
        }
        if cache.blockmap {
            return self.blockmap_insert(h, ino, st, e);
        }
        let left = e.lblk.checked_sub(1).and_then(|l| cache.lookup(l));
        let right = cache
            .map
            .get(&(e.end() as u32))
            .copied()
            .filter(|_| e.end() < 1 << 32);
        let max = Extent::max_len(e.unwritten);
        let joins = |a: &Extent, b: &Extent| {
            a.unwritten == b.unwritten
                && a.end() == b.lblk as u64
                && a.pblk + a.len as u64 == b.pblk
                && a.len + b.len <= max
        };
        let delta = e.len as u64 * self.sectors_per_block();
        match (
            left.filter(|l| joins(l, &e)),
            right.filter(|r| joins(&e, r)),
        ) {
            (Some(l), Some(r)) if l.len + e.len + r.len <= max => {
                let merged = Extent {
                    len: l.len + e.len + r.len,
                    ..l
                };
                self.leaf_edit(h, ino, st, r.lblk, Some(r.lblk), vec![])?;
                self.leaf_edit(h, ino, st, l.lblk, Some(l.lblk), vec![merged])?;
            }
            (Some(l), _) => {
                let merged = Extent {
                    len: l.len + e.len,
                    ..l
                };
                self.leaf_edit(h, ino, st, l.lblk, Some(l.lblk), vec![merged])?;
            }
            (None, Some(r)) => {
                let merged = Extent {
                    lblk: e.lblk,
                    len: e.len + r.len,
                    pblk: e.pblk,
                    unwritten: e.unwritten,
                };
                self.leaf_edit(h, ino, st, r.lblk, Some(r.lblk), vec![merged])?;
            }
            (None, None) => self.leaf_edit(h, ino, st, e.lblk, None, vec![e])?,
        }
        let b = st.raw.blocks_512(self.geo.block_size) + delta;
        st.raw.set_blocks_512(b);
        Ok(())
    }

    /// Whether an inode's data blocks go through the journal (a directory's blocks are
    /// metadata; a symlink's target block too, as the kernel counts it): freeing them must
    /// revoke them, or a crash before the journal's tail moves past their last logged copy
    /// would replay it over whatever file reuses the block (as the kernel's ext4_remove_blocks
    /// frees directory and symlink blocks with EXT4_FREE_BLOCKS_METADATA).
    pub(crate) fn journaled_data(raw: &RawInode) -> bool {
        raw.is_dir() || raw.is_symlink()
    }

    /// Unmaps logical blocks `[start, end)` and frees their data blocks.
    pub(crate) fn ext_remove(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        end: u64,
    ) -> Result<()> {
        self.ext_load(ino, st)?;
        let end = end.min(1 << 32);
        if st.extents.as_ref().unwrap().map.is_empty() || end <= start as u64 {
            return Ok(());
        }
        if st.extents.as_ref().unwrap().blockmap {
            // Truncating and deleting old (ext2/ext3) files works; mapping new blocks does not.
            return self.blockmap_remove(h, ino, st, start as u64, end);
        }
        loop {
            let victim = st
                .extents
                .as_ref()
                .unwrap()
                .next(start)
                .filter(|x| (x.lblk as u64) < end);
            let Some(x) = victim else { break };
            let cut_lo = (start as u64).max(x.lblk as u64);
            let cut_hi = end.min(x.end());
            let mut keep = Vec::new();
            if (x.lblk as u64) < cut_lo {
                keep.push(Extent {
                    len: (cut_lo - x.lblk as u64) as u32,
                    ..x
                });
            }
            if cut_hi < x.end() {
                let off = cut_hi - x.lblk as u64;
                keep.push(Extent {
                    lblk: cut_hi as u32,
                    len: (x.end() - cut_hi) as u32,
                    pblk: x.pblk + off,
                    unwritten: x.unwritten,
                });
            }
            self.leaf_edit(h, ino, st, x.lblk, Some(x.lblk), keep)?;
            let freed = cut_hi - cut_lo;
            let journaled = Self::journaled_data(&st.raw);
            self.free_blocks(h, x.pblk + (cut_lo - x.lblk as u64), freed, journaled)?;
            let b = st
                .raw
                .blocks_512(self.geo.block_size)
                .saturating_sub(freed * self.sectors_per_block());
            st.raw.set_blocks_512(b);
        }
        self.shrink_root(h, ino, st)
    }

    /// Where the last piece of `[start, end)` begins whose removal in one handle dirties at
    /// most `budget` metadata blocks, or None when the whole range fits the budget. Estimated
    /// from the extent cache: the block bitmap and descriptor block of every group the
    /// range's blocks lie in, the leaves that map them (taken as half full) and the freed
    /// leaves' own bitmaps, or for a block map the revoke records of its indirect blocks,
    /// and the index path. A piece holds at least one group's blocks, however small the
    /// budget. The kernel bounds its truncates the same way, restarting the handle when its
    /// credits run low (ext4_ext_rm_leaf); here the caller removes the piece and asks again.
    pub(crate) fn ext_removal_piece(
        &self,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        end: u64,
        budget: usize,
    ) -> Result<Option<u32>> {
        self.ext_load(ino, st)?;
        let depth = self.ext_depth(st) as usize;
        let c = st.extents.as_ref().unwrap();
        let geo = &self.geo;
        let bs = geo.block_size as u64;
        let end = end.min(1 << 32);
        // Extents per leaf, at half fill; for a block map, pointers per indirect block.
        let per_leaf = if c.blockmap {
            bs / 4
        } else {
            (node_capacity(bs as usize, false) as u64 / 2).max(1)
        };
        // A directory's blocks are revoked as they are freed: a record each (8 bytes at most).
        let revokes_per_block = if Self::journaled_data(&st.raw) {
            bs / 8
        } else {
            0
        };
        let mut groups = std::collections::HashSet::new();
        let mut desc_blocks = std::collections::HashSet::new();
        let (mut extents, mut mapped) = (0u64, 0u64);
        let cost = |groups: usize, descs: usize, extents: u64, mapped: u64| -> usize {
            // The inode's block, the superblock, the root path (two per level: a leaf
            // emptied frees its block and edits its parent), and the edge blocks of a block
            // map's three levels.
            let fixed = 8 + 2 * depth as u64;
            let tree = if c.blockmap {
                mapped / per_leaf / 100
            } else {
                2 * (extents / per_leaf + 1)
            };
            let revoked = mapped
                .checked_div(revokes_per_block)
                .map_or(0, |blocks| blocks + 1);
            groups + descs + (fixed + tree + revoked) as usize
        };
        let mut taken = false;
        if end == 0 {
            return Ok(None);
        }
        let last = (end - 1).min(u32::MAX as u64) as u32;
        for (_, e) in c.map.range(..=last).rev() {
            if e.end() <= start as u64 {
                break;
            }
            let lo = (start as u64).max(e.lblk as u64);
            let mut cut = end.min(e.end());
            extents += 1;
            // Group by group from the top of the extent down.
            while cut > lo {
                let p_last = e.pblk + (cut - 1 - e.lblk as u64);
                let g = geo.block_group(p_last);
                let g_first = geo.group_first_block(g);
                let seg = (p_last + 1 - g_first).min(cut - lo);
                groups.insert(g);
                desc_blocks.insert(g / geo.descs_per_block.max(1));
                mapped += seg;
                if taken && cost(groups.len(), desc_blocks.len(), extents, mapped) > budget {
                    return Ok(Some(cut as u32));
                }
                taken = true;
                cut -= seg;
            }
        }
        Ok(None)
    }

    /// Pulls the root's only child into i_block while its entries fit there (the tree gets
    /// shallower after removals), freeing the child.
    fn shrink_root(&self, h: &mut Handle<'_>, ino: u32, st: &mut InodeState) -> Result<()> {
        loop {
            let (hdr, entries) = self.read_node(st, Node::Root)?;
            if hdr.depth == 0 || entries.len() != 1 {
                return Ok(());
            }
            let child = ExtentIdx::read(&entries[0]).leaf;
            let (ch, ce) = self.read_node(st, Node::Block(child))?;
            if ch.magic != EXTENT_MAGIC || ch.depth + 1 != hdr.depth {
                return Err(self.corrupt(
                    ino,
                    child,
                    format!(
                        "magic {:#06x} depth {} under a root of depth {}",
                        ch.magic, ch.depth, hdr.depth
                    ),
                ));
            }
            if ce.len() > self.node_cap(Node::Root) {
                return Ok(());
            }
            self.write_node(h, ino, st, Node::Root, ch.depth, &ce, false)?;
            self.free_tree_block(h, st, child)?;
        }
    }

    /// Converts the unwritten extents in `[start, start+len)` to written.
    pub(crate) fn ext_mark_written(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        len: u32,
    ) -> Result<()> {
        self.writable_tree(ino, st)?;
        let end = start as u64 + len as u64;
        let mut pos = start;
        while (pos as u64) < end {
            let Some(x) = st
                .extents
                .as_ref()
                .unwrap()
                .next(pos)
                .filter(|x| (x.lblk as u64) < end)
            else {
                break;
            };
            if !x.unwritten {
                pos = x.end() as u32;
                continue;
            }
            let lo = (pos as u64).max(x.lblk as u64);
            let hi = end.min(x.end());
            let mut w = Extent {
                lblk: lo as u32,
                len: (hi - lo) as u32,
                pblk: x.pblk + (lo - x.lblk as u64),
                unwritten: false,
            };
            // The converted piece joins written, physically contiguous neighbours (as the
            // kernel's merge after conversion does), so that writes into preallocated space
            // do not leave one extent per write.
            let cache = st.extents.as_ref().unwrap();
            let joins = |a: &Extent, b: &Extent| {
                !a.unwritten
                    && !b.unwritten
                    && a.end() == b.lblk as u64
                    && a.pblk + a.len as u64 == b.pblk
                    && a.len + b.len <= MAX_INIT_LEN
            };
            let left = (lo == x.lblk as u64)
                .then(|| lo.checked_sub(1).and_then(|l| cache.lookup(l as u32)))
                .flatten()
                .filter(|l| joins(l, &w));
            let right = (hi == x.end() && hi < 1 << 32)
                .then(|| cache.map.get(&(hi as u32)).copied())
                .flatten()
                .filter(|r| {
                    joins(&w, r) && left.map_or(0, |l| l.len) + w.len + r.len <= MAX_INIT_LEN
                });
            if let Some(r) = right {
                w.len += r.len;
                self.leaf_edit(h, ino, st, r.lblk, Some(r.lblk), vec![])?;
            }
            let mut parts = Vec::new();
            if (x.lblk as u64) < lo {
                parts.push(Extent {
                    len: (lo - x.lblk as u64) as u32,
                    ..x
                });
            }
            if left.is_none() {
                parts.push(w);
            }
            if hi < x.end() {
                parts.push(Extent {
                    lblk: hi as u32,
                    len: (x.end() - hi) as u32,
                    pblk: x.pblk + (hi - x.lblk as u64),
                    unwritten: true,
                });
            }
            // The pieces replace `x` in its leaf in one edit (they lie inside `x`'s range,
            // so they belong to the same leaf): one leaf rewrite and checksum per conversion
            // instead of one per piece.
            self.leaf_edit(h, ino, st, x.lblk, Some(x.lblk), parts)?;
            if let Some(l) = left {
                let merged = Extent {
                    len: l.len + w.len,
                    ..l
                };
                self.leaf_edit(h, ino, st, l.lblk, Some(l.lblk), vec![merged])?;
            }
            pos = hi as u32;
        }
        Ok(())
    }

    // ---- on-disk tree edits ----

    fn read_node(&self, st: &InodeState, node: Node) -> Result<(ExtentHeader, Vec<Entry>)> {
        let data: Vec<u8> = match node {
            Node::Root => st.raw.i_block().to_vec(),
            Node::Block(b) => self.bcache.get(b)?.read().to_vec(),
        };
        let hdr = ExtentHeader::read(&data);
        let n = (hdr.entries as usize).min((data.len() - HEADER_SIZE) / ENTRY_SIZE);
        let entries = (0..n)
            .map(|i| {
                data[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE]
                    .try_into()
                    .unwrap()
            })
            .collect();
        Ok((hdr, entries))
    }

    fn node_cap(&self, node: Node) -> usize {
        match node {
            Node::Root => 4,
            Node::Block(_) => node_capacity(self.geo.block_size as usize, false) as usize,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write_node(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        node: Node,
        depth: u16,
        entries: &[Entry],
        fresh: bool,
    ) -> Result<()> {
        let max = self.node_cap(node) as u16;
        let hdr = ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: entries.len() as u16,
            max,
            depth,
            generation: 0,
        };
        match node {
            Node::Root => {
                let b = st.raw.i_block_mut();
                b.fill(0);
                hdr.write(b);
                for (i, e) in entries.iter().enumerate() {
                    b[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE]
                        .copy_from_slice(e);
                }
            }
            Node::Block(blk) => {
                let buf = if fresh {
                    self.bcache.get_new(blk)?
                } else {
                    self.bcache.get(blk)?
                };
                {
                    let mut d = buf.write();
                    d.fill(0);
                    hdr.write(&mut d);
                    for (i, e) in entries.iter().enumerate() {
                        d[HEADER_SIZE + i * ENTRY_SIZE..HEADER_SIZE + (i + 1) * ENTRY_SIZE]
                            .copy_from_slice(e);
                    }
                    if self.geo.metadata_csum {
                        let seed =
                            RawInode::csum_seed(self.geo.csum_seed, ino, st.raw.generation());
                        let t = tail_offset(max);
                        let c = crate::format::csum::crc32c(seed, &d[..t]);
                        put32(&mut d, t, c);
                    }
                }
                h.dirty(&buf);
            }
        }
        Ok(())
    }

    /// A new block of the file's map (an extent tree node or an indirect block) near its data,
    /// counted in i_blocks.
    fn alloc_tree_block(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        near: u64,
    ) -> Result<u64> {
        let goal = if near != 0 {
            near
        } else {
            self.geo.group_first_block(self.geo.ino_group(ino))
        };
        let (b, _) = self.alloc_blocks(h, goal, 1, st.writeback_claim())?;
        let v = st.raw.blocks_512(self.geo.block_size) + self.sectors_per_block();
        st.raw.set_blocks_512(v);
        h.extend(4);
        Ok(b)
    }

    fn free_tree_block(&self, h: &mut Handle<'_>, st: &mut InodeState, blk: u64) -> Result<()> {
        self.free_blocks(h, blk, 1, true)?;
        let v = st
            .raw
            .blocks_512(self.geo.block_size)
            .saturating_sub(self.sectors_per_block());
        st.raw.set_blocks_512(v);
        Ok(())
    }

    /// Edits the leaf that holds logical block `at`: removes the extent keyed `remove` (if any),
    /// adds `add`, and pushes the change up the tree. Keeps the cache in step.
    fn leaf_edit(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        at: u32,
        remove: Option<u32>,
        add: Vec<Extent>,
    ) -> Result<()> {
        // Descend.
        let mut path: Vec<Step> = Vec::new();
        let mut node = Node::Root;
        let mut guard = 0;
        loop {
            let (hdr, entries) = self.read_node(st, node)?;
            if hdr.magic != EXTENT_MAGIC {
                return Err(self.corrupt(
                    ino,
                    if let Node::Block(b) = node { b } else { 0 },
                    "bad magic".into(),
                ));
            }
            if hdr.depth == 0 {
                path.push(Step {
                    node,
                    depth: 0,
                    entries,
                    idx: 0,
                });
                break;
            }
            if entries.is_empty() {
                return Err(self.corrupt(
                    ino,
                    if let Node::Block(b) = node { b } else { 0 },
                    "empty index node".into(),
                ));
            }
            let idx = entries.iter().rposition(|e| key(e) <= at).unwrap_or(0);
            let child = ExtentIdx::read(&entries[idx]).leaf;
            path.push(Step {
                node,
                depth: hdr.depth,
                entries,
                idx,
            });
            node = Node::Block(child);
            guard += 1;
            if guard > MAX_DEPTH as usize {
                return Err(self.corrupt(ino, child, "tree deeper than the maximum".into()));
            }
        }
        // Edit the leaf (a copy of its entries: nothing on disk or in the cache changes yet).
        let mut leaf = path.pop().unwrap();
        let mut appended_last = false;
        if let Some(k) = remove {
            let Some(p) = leaf.entries.iter().position(|e| key(e) == k) else {
                return Err(self.corrupt(
                    ino,
                    0,
                    format!("extent at logical block {k} is not in its leaf"),
                ));
            };
            leaf.entries.remove(p);
        }
        for x in &add {
            let pos = leaf.entries.partition_point(|e| key(e) < x.lblk);
            appended_last = pos == leaf.entries.len();
            leaf.entries.insert(pos, leaf_entry(x));
        }
        // Every block the splits will need is allocated before any node changes, as the
        // kernel's ext4_ext_split allocates its blocks first: an allocation failing half-way
        // up (ENOSPC) would leave a leaf split whose parent never learnt of the new half, and
        // entries lost from the tree.
        let near = add.first().map(|x| x.pblk).unwrap_or(0);
        let mut spare = Vec::new();
        for _ in 0..self.split_blocks_needed(&path, &leaf) {
            match self.alloc_tree_block(h, ino, st, near) {
                Ok(b) => spare.push(b),
                Err(e) => {
                    for b in spare {
                        self.free_tree_block(h, st, b)?;
                    }
                    return Err(e);
                }
            }
        }
        self.push_up(h, ino, st, path, leaf, near, appended_last, &mut spare)?;
        for b in spare {
            self.free_tree_block(h, st, b)?;
        }
        // The cache follows the tree only once the tree has changed: a failed edit leaves
        // both as they were (a cached extent the tree lacks would send later writes to
        // blocks the failed insertion freed).
        let cache = &mut st.extents.as_mut().unwrap().map;
        if let Some(k) = remove {
            cache.remove(&k);
        }
        for x in &add {
            cache.insert(x.lblk, *x);
        }
        Ok(())
    }

    /// How many new tree blocks `push_up` will need for an edited leaf: one per full node
    /// from the leaf up that overflows (a split adds an entry to the parent), and one more
    /// where the root itself overflows (the tree grows a level).
    fn split_blocks_needed(&self, path: &[Step], leaf: &Step) -> usize {
        let mut need = 0;
        let mut len = leaf.entries.len();
        let mut node = leaf.node;
        let mut up = path.len();
        while len > self.node_cap(node) {
            need += 1;
            if matches!(node, Node::Root) || up == 0 {
                break;
            }
            up -= 1;
            len = path[up].entries.len() + 1;
            node = path[up].node;
        }
        need
    }

    /// Writes back an edited node and propagates splits, frees and key changes to its parents.
    #[allow(clippy::too_many_arguments)]
    fn push_up(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        mut path: Vec<Step>,
        mut cur: Step,
        near: u64,
        appended: bool,
        spare: &mut Vec<u64>,
    ) -> Result<()> {
        loop {
            let cap = self.node_cap(cur.node);
            if cur.entries.is_empty() {
                match cur.node {
                    Node::Root => {
                        // The tree is empty: back to a depth-0 root.
                        return self.write_node(h, ino, st, Node::Root, 0, &[], false);
                    }
                    Node::Block(b) => {
                        self.free_tree_block(h, st, b)?;
                        let mut parent = path.pop().unwrap();
                        parent.entries.remove(parent.idx);
                        cur = parent;
                        continue;
                    }
                }
            }
            if cur.entries.len() <= cap {
                self.write_node(h, ino, st, cur.node, cur.depth, &cur.entries, false)?;
                // Keep the parent's key equal to this node's first key.
                if let Some(mut parent) = path.pop() {
                    let first = key(&cur.entries[0]);
                    if key(&parent.entries[parent.idx]) != first {
                        let child = ExtentIdx::read(&parent.entries[parent.idx]).leaf;
                        parent.entries[parent.idx] = index_entry(first, child);
                        cur = parent;
                        continue;
                    }
                }
                return Ok(());
            }
            // Overflow.
            match cur.node {
                Node::Root => {
                    // Grow the tree: the root's entries move to a new block, the root indexes it.
                    let b = match spare.pop() {
                        Some(b) => b,
                        None => self.alloc_tree_block(h, ino, st, near)?,
                    };
                    self.write_node(h, ino, st, Node::Block(b), cur.depth, &cur.entries, true)?;
                    let first = key(&cur.entries[0]);
                    return self.write_node(
                        h,
                        ino,
                        st,
                        Node::Root,
                        cur.depth + 1,
                        &[index_entry(first, b)],
                        false,
                    );
                }
                Node::Block(_) => {
                    let n = cur.entries.len();
                    // A leaf filled by appends splits off only its last entry (the next
                    // appends fill the new block); otherwise in half. An edit adds at most a
                    // few entries, so either half fits.
                    let at = if appended && n == cap + 1 {
                        n - 1
                    } else {
                        n / 2
                    };
                    let right: Vec<Entry> = cur.entries.split_off(at);
                    let nb = match spare.pop() {
                        Some(b) => b,
                        None => self.alloc_tree_block(h, ino, st, near)?,
                    };
                    self.write_node(h, ino, st, Node::Block(nb), cur.depth, &right, true)?;
                    self.write_node(h, ino, st, cur.node, cur.depth, &cur.entries, false)?;
                    let mut parent = path.pop().unwrap();
                    let first = key(&cur.entries[0]);
                    let child = ExtentIdx::read(&parent.entries[parent.idx]).leaf;
                    parent.entries[parent.idx] = index_entry(first, child);
                    parent
                        .entries
                        .insert(parent.idx + 1, index_entry(key(&right[0]), nb));
                    cur = parent;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lookup_and_next() {
        let mut c = ExtentCache::empty();
        c.map.insert(
            10,
            Extent {
                lblk: 10,
                len: 5,
                pblk: 100,
                unwritten: false,
            },
        );
        c.map.insert(
            20,
            Extent {
                lblk: 20,
                len: 1,
                pblk: 200,
                unwritten: true,
            },
        );
        assert_eq!(c.lookup(9), None);
        assert_eq!(c.lookup(10).unwrap().pblk, 100);
        assert_eq!(c.lookup(14).unwrap().pblk, 100);
        assert_eq!(c.lookup(15), None);
        assert_eq!(c.next(15).unwrap().lblk, 20);
        assert_eq!(c.next(21), None);
    }
}

#[cfg(test)]
mod image_tests {
    use crate::format::inode::{Timestamp, S_IFREG};
    use crate::fs::{Fs, MountOptions};
    use std::process::Command;

    fn mkimg(tag: &str, extra: &[&str]) -> std::path::PathBuf {
        let p = std::path::PathBuf::from(format!(
            "/dev/shm/uext4-ext-{tag}-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        let st = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .args(extra)
            .arg(&p)
            .arg("256M")
            .status()
            .unwrap();
        assert!(st.success());
        p
    }

    /// A file written at scattered offsets (thousands of extents: a depth-2 tree with 1 KiB
    /// blocks) reads back as written; punching and truncating keep the tree and the cache in
    /// step; freeing the inode leaves an e2fsck-clean image.
    fn scattered(tag: &str, extra: &[&str], n: u64) {
        let p = mkimg(tag, extra);
        let fs = Fs::open_path(
            &p,
            MountOptions {
                commit_interval_secs: 0,
                ..Default::default()
            },
        )
        .unwrap();
        let bs = fs.geo.block_size as u64;
        let ino = {
            let mut h = fs.start(16).unwrap();
            let mut raw = fs.new_raw_inode();
            raw.set_mode(S_IFREG | 0o644);
            raw.set_links_count(1);
            raw.set_mtime(Timestamp::now());
            Fs::ext_init_root(&mut raw);
            let inode = fs.alloc_inode(&mut h, 2, false, raw).unwrap();
            let ino = inode.ino;
            let mut st = inode.state.lock();
            st.creating = false;
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
            ino
        };
        let mut model = std::collections::BTreeMap::new();
        // Every other block in a permuted order, so inserts land all over the tree.
        let mut order: Vec<u64> = (0..n).collect();
        let mut s = 12345u64;
        for i in (1..order.len()).rev() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        for &i in &order {
            let data = vec![(i % 251) as u8 + 1; 16];
            fs.write(ino, i * 2 * bs, &data).unwrap();
            model.insert(i * 2, data);
        }
        let depth = fs.ext_tree_depth(ino).unwrap();
        assert!(depth >= if n > 1000 { 2 } else { 1 }, "depth {depth}");
        // Drop the cache: reload from disk must give the same extents.
        let before = fs.ext_list(ino).unwrap();
        assert_eq!(before.len() as u64, n);
        fs.icache.get_cached(ino).unwrap().state.lock().extents = None;
        assert_eq!(fs.ext_list(ino).unwrap(), before);
        for (&b, data) in model.iter().step_by(7) {
            let mut buf = vec![0u8; 16];
            fs.read(ino, b * bs, &mut buf).unwrap();
            assert_eq!(&buf, data);
        }
        // Punch a range in the middle, truncate the tail.
        fs.fallocate(ino, 0x3, 10 * bs, 400 * bs).unwrap();
        assert!(fs
            .ext_list(ino)
            .unwrap()
            .iter()
            .all(|e| e.lblk < 10 || e.lblk >= 410));
        fs.truncate(ino, (n / 2) * 2 * bs).unwrap();
        fs.icache.get_cached(ino).unwrap().state.lock().extents = None;
        assert!(fs
            .ext_list(ino)
            .unwrap()
            .iter()
            .all(|e| (e.lblk as u64) < n));
        // Free everything.
        {
            let inode = fs.iget(ino).unwrap();
            let mut h = fs.start(64).unwrap();
            let mut st = inode.state.lock();
            st.raw.set_links_count(0);
            fs.evict_blocks(&mut h, &inode, &mut st).unwrap();
            assert_eq!(
                st.raw.blocks_512(fs.geo.block_size),
                0,
                "i_blocks after freeing everything"
            );
            st.raw.set_dtime(Timestamp::now().sec as u32);
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
            st.deleted = true;
            fs.free_inode(&mut h, ino, false).unwrap();
        }
        fs.unmount().unwrap();
        let out = Command::new("e2fsck").arg("-fn").arg(&p).output().unwrap();
        assert!(
            out.status.success(),
            "e2fsck: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn scattered_1k_depth2() {
        scattered("1k", &["-b", "1024"], 3000);
    }

    #[test]
    fn scattered_4k_no_csum() {
        scattered("4k", &["-b", "4096", "-O", "^metadata_csum"], 1500);
    }
}

/// The tree against a model: random inserts, removes, truncations and unwritten conversions
/// through the tree API itself, compared block by block with a map; then the image is
/// committed, checked by e2fsck, reopened and compared again.
#[cfg(test)]
mod model_tests {
    use super::*;
    use crate::fs::MountOptions;
    use proptest::prelude::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;

    pub(super) struct Img(pub PathBuf);
    impl Drop for Img {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub(super) fn mkimg(tag: &str, size: &str, extra: &[&str]) -> Img {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = dir.join(format!("uext4-extm-{tag}-{}-{n}.img", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let st = Command::new("mke2fs")
            .args(["-q", "-F"])
            .args(extra)
            .arg(&p)
            .arg(size)
            .status()
            .expect("mke2fs (e2fsprogs) must be installed");
        assert!(st.success(), "mke2fs {extra:?}");
        Img(p)
    }

    pub(super) fn e2fsck_clean(p: &Path) {
        let out = Command::new("e2fsck").arg("-fn").arg(p).output().unwrap();
        assert!(
            out.status.success(),
            "e2fsck -fn complains:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(super) fn open(p: &Path, read_only: bool) -> Arc<Fs> {
        Fs::open_path(
            p,
            MountOptions {
                commit_interval_secs: 0,
                read_only,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// The leaf extents of an inode as e2fsprogs reads them (`debugfs -R "ex -l <ino>"`).
    pub(super) fn debugfs_extents(p: &Path, ino: u32) -> Vec<Extent> {
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("ex -l <{ino}>"))
            .arg(p)
            .output()
            .expect("debugfs (e2fsprogs) must be installed");
        let mut text = String::from_utf8_lossy(&out.stdout).to_string();
        while text.contains("/ ") {
            text = text.replace("/ ", "/");
        }
        let mut v = Vec::new();
        for line in text.lines().skip(1) {
            let toks: Vec<&str> = line.split_whitespace().skip(2).collect();
            let nums: Vec<u64> = toks.iter().filter_map(|t| t.parse().ok()).collect();
            let (l, p, len) = match nums.len() {
                5 => (nums[0], nums[2], nums[4]),
                4 => (nums[0], nums[2], nums[3]),
                3 => (nums[0], nums[1], nums[2]),
                _ => panic!("debugfs line {line:?}"),
            };
            v.push(Extent {
                lblk: l as u32,
                len: len as u32,
                pblk: p,
                unwritten: toks.contains(&"Uninit"),
            });
        }
        v
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Map the hole at `lblk` (clipped to the hole), physically after the left neighbour
        /// when `contiguous`, else near `goal` (a fraction of the disk).
        Insert {
            lblk: u32,
            len: u32,
            unwritten: bool,
            contiguous: bool,
            goal: u16,
        },
        Remove {
            start: u32,
            len: u32,
        },
        Truncate {
            start: u32,
        },
        Written {
            start: u32,
            len: u32,
        },
    }

    type Model = BTreeMap<u32, (u64, bool)>;

    fn op_strategy(span: u32) -> impl Strategy<Value = Op> {
        let len = prop_oneof![6 => Just(1u32), 3 => 1u32..16, 1 => 1u32..400];
        prop_oneof![
            12 => (0..span, len.clone(), any::<bool>(), any::<bool>(), any::<u16>()).prop_map(
                |(lblk, len, unwritten, contiguous, goal)| Op::Insert {
                    lblk,
                    len,
                    unwritten,
                    contiguous,
                    goal
                }
            ),
            4 => (0..span, len.clone()).prop_map(|(start, len)| Op::Remove { start, len }),
            1 => (0..span * 2).prop_map(|start| Op::Truncate { start }),
            3 => (0..span, len).prop_map(|(start, len)| Op::Written { start, len }),
        ]
    }

    fn apply(fs: &Fs, ino: u32, op: &Op, model: &mut Model) {
        let inode = fs.iget(ino).unwrap();
        let mut h = fs.start(64).unwrap();
        let mut st = inode.state.lock();
        fs.ext_load(ino, &mut st).unwrap();
        match *op {
            Op::Insert {
                lblk,
                len,
                unwritten,
                contiguous,
                goal,
            } => {
                let cache = st.extents.as_ref().unwrap();
                if cache.lookup(lblk).is_some() {
                    return;
                }
                let room = cache
                    .next(lblk)
                    .map(|e| e.lblk as u64 - lblk as u64)
                    .unwrap_or(u64::MAX);
                let len = (len as u64).min(room) as u32;
                let left = lblk.checked_sub(1).and_then(|l| cache.lookup(l));
                let goal = match left {
                    Some(l) if contiguous => l.pblk + (lblk - l.lblk) as u64,
                    _ => {
                        fs.geo.first_data_block
                            + goal as u64 * (fs.geo.blocks_count - fs.geo.first_data_block) / 65536
                    }
                };
                let (p, got) = fs.alloc_blocks(&mut h, goal, len, None).unwrap();
                let e = Extent {
                    lblk,
                    len: got,
                    pblk: p,
                    unwritten,
                };
                fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
                for i in 0..got {
                    assert!(model.insert(lblk + i, (p + i as u64, unwritten)).is_none());
                }
            }
            Op::Remove { start, len } => {
                let end = start as u64 + len as u64;
                fs.ext_remove(&mut h, ino, &mut st, start, end).unwrap();
                let gone: Vec<u32> = model.range(start..).map(|(&k, _)| k).collect();
                for k in gone.into_iter().filter(|&k| (k as u64) < end) {
                    model.remove(&k);
                }
            }
            Op::Truncate { start } => {
                fs.ext_remove(&mut h, ino, &mut st, start, 1 << 32).unwrap();
                model.retain(|&k, _| k < start);
            }
            Op::Written { start, len } => {
                fs.ext_mark_written(&mut h, ino, &mut st, start, len)
                    .unwrap();
                for (_, v) in model
                    .range_mut(start..)
                    .take_while(|(&k, _)| (k as u64) < start as u64 + len as u64)
                {
                    v.1 = false;
                }
            }
        }
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
    }

    fn expand(list: &[Extent]) -> Model {
        let mut m = Model::new();
        for e in list {
            for i in 0..e.len {
                m.insert(e.lblk + i, (e.pblk + i as u64, e.unwritten));
            }
        }
        m
    }

    /// Blocks of the on-disk tree below the root, counted by walking it.
    pub(super) fn tree_blocks(fs: &Fs, root: &[u8]) -> u64 {
        let hdr = ExtentHeader::read(root);
        if hdr.depth == 0 {
            return 0;
        }
        let mut n = 0;
        for i in 0..hdr.entries as usize {
            let x = ExtentIdx::read(&root[HEADER_SIZE + i * ENTRY_SIZE..]);
            let child = fs.bcache.get(x.leaf).unwrap().read().to_vec();
            n += 1 + tree_blocks(fs, &child);
        }
        n
    }

    /// The list is sorted, disjoint, within the length limits; the cache equals a fresh load
    /// of the on-disk tree; i_blocks counts data and tree blocks. Returns the list.
    fn check(fs: &Fs, ino: u32, model: &Model) -> Vec<Extent> {
        let list = fs.ext_list(ino).unwrap();
        for w in list.windows(2) {
            assert!(w[0].end() <= w[1].lblk as u64, "overlap: {w:?}");
        }
        for e in &list {
            assert!(e.len >= 1 && e.len <= Extent::max_len(e.unwritten), "{e:?}");
        }
        assert!(expand(&list) == *model, "extents differ from the model");
        let inode = fs.iget(ino).unwrap();
        let mut st = inode.state.lock();
        st.extents = None;
        fs.ext_load(ino, &mut st).unwrap();
        let reloaded: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
        assert_eq!(reloaded, list, "the cache differs from the on-disk tree");
        let tree = tree_blocks(fs, st.raw.i_block());
        let spb = fs.geo.block_size as u64 / 512;
        assert_eq!(
            st.raw.blocks_512(fs.geo.block_size),
            (model.len() as u64 + tree) * spb,
            "i_blocks ({} data blocks, {tree} tree blocks)",
            model.len()
        );
        list
    }

    /// Runs `ops` on a new file of a new image, checks against the model, then commits, runs
    /// e2fsck, reopens, compares, deletes the file and checks that every block came back.
    fn run_case(extra: &[&str], ops: &[Op], check_every: usize) -> (u16, u16) {
        let img = mkimg("model", "64M", extra);
        let fs = open(&img.0, false);
        let free0 = fs.statfs().blocks_free;
        let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
        let mut model = Model::new();
        let mut peak = 0;
        for (i, op) in ops.iter().enumerate() {
            apply(&fs, ino, op, &mut model);
            peak = peak.max(fs.ext_tree_depth(ino).unwrap());
            if check_every > 0 && i % check_every == 0 {
                check(&fs, ino, &model);
            }
        }
        let list = check(&fs, ino, &model);
        let depth = fs.ext_tree_depth(ino).unwrap();
        // e2fsck wants i_size to cover every written block.
        {
            let inode = fs.iget(ino).unwrap();
            let mut h = fs.start(4).unwrap();
            let mut st = inode.state.lock();
            let end = list.last().map(|e| e.end()).unwrap_or(0);
            st.raw.set_size(end * fs.geo.block_size as u64);
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        }
        fs.commit().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        assert!(
            debugfs_extents(&img.0, ino) == list,
            "debugfs reads other extents"
        );
        let fs = open(&img.0, false);
        assert_eq!(fs.ext_list(ino).unwrap(), list, "after reopening");
        check(&fs, ino, &model);
        fs.unlink(2, b"f").unwrap();
        fs.unmount().unwrap();
        assert_eq!(fs.statfs().blocks_free, free0, "blocks leaked");
        drop(fs);
        e2fsck_clean(&img.0);
        (peak, depth)
    }

    const CONFIGS: [&[&str]; 3] = [
        &["-t", "ext4", "-b", "1024"],
        &["-t", "ext4", "-b", "4096"],
        &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
    ];

    proptest! {
        #![proptest_config(ProptestConfig {
            // UEXT4_EXTENT_CASES=500 for a longer run.
            cases: std::env::var("UEXT4_EXTENT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
            max_shrink_iters: 200,
            ..ProptestConfig::default()
        })]
        #[test]
        fn tree_matches_model(
            cfg in 0usize..3,
            ops in prop::collection::vec(op_strategy(3000), 1..600),
        ) {
            run_case(CONFIGS[cfg], &ops, 50);
        }
    }

    /// 2500 discontiguous one-block extents in a shuffled order: depth 2 with 1 KiB blocks;
    /// then random removals take it apart again.
    #[test]
    fn deep_tree_then_removals() {
        for cfg in [CONFIGS[0], CONFIGS[2]] {
            let mut ops = Vec::new();
            let mut order: Vec<u32> = (0..2500).collect();
            let mut s = 99u64;
            let mut rnd = |n: u64| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) % n
            };
            for i in (1..order.len()).rev() {
                order.swap(i, rnd(i as u64 + 1) as usize);
            }
            for &i in &order {
                ops.push(Op::Insert {
                    lblk: i * 2,
                    len: 1,
                    unwritten: i % 3 == 0,
                    contiguous: false,
                    goal: rnd(65536) as u16,
                });
            }
            for _ in 0..300 {
                let start = rnd(5000) as u32;
                ops.push(Op::Remove {
                    start,
                    len: 1 + rnd(40) as u32,
                });
                ops.push(Op::Written {
                    start: rnd(5000) as u32,
                    len: 1 + rnd(30) as u32,
                });
            }
            ops.push(Op::Truncate { start: 3000 });
            // Down to at most 3 extents: the tree folds back into i_block.
            ops.push(Op::Truncate { start: 6 });
            let (peak, depth) = run_case(cfg, &ops, 500);
            eprintln!("deep tree {cfg:?}: depth {peak}, then {depth}");
            assert_eq!((peak, depth), (2, 0));
        }
    }
}

/// Merging stops at the on-disk length limits (32768 written, 32767 unwritten).
#[cfg(test)]
mod merge_tests {
    use super::model_tests::*;
    use super::*;

    #[test]
    fn appends_merge_up_to_the_length_limits() {
        // 4 KiB blocks, 32768 per group; groups 2 and 6 have no superblock backup (and the
        // journal sits in group 4).
        let img = mkimg("merge", "1G", &["-t", "ext4", "-b", "4096"]);
        let fs = open(&img.0, false);
        // Group 2 (from block 65536) and group 6 (from 196608) are wholly free: chunks of 256
        // fill 32768 exactly, chunks of 151 fill 32767.
        for (name, unwritten, goal0, chunk) in [
            (&b"w"[..], false, 65536, 256),
            (&b"u"[..], true, 196608, 151),
        ] {
            let ino = fs.create(2, name, 0o100644, 0, 0).unwrap().ino;
            let inode = fs.iget(ino).unwrap();
            let mut lblk = 0u32;
            let mut goal = goal0;
            while lblk < 40000 {
                let mut h = fs.start(16).unwrap();
                let mut st = inode.state.lock();
                let (p, got) = fs.alloc_blocks(&mut h, goal, chunk, None).unwrap();
                let e = Extent {
                    lblk,
                    len: got,
                    pblk: p,
                    unwritten,
                };
                fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
                if !unwritten {
                    st.raw.set_size((lblk + got) as u64 * 4096);
                }
                fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
                lblk += got;
                goal = p + got as u64;
            }
            let list = fs.ext_list(ino).unwrap();
            let max = Extent::max_len(unwritten);
            assert!(list.iter().any(|e| e.len == max), "{list:?}");
            for w in list.windows(2) {
                let contiguous =
                    w[0].end() == w[1].lblk as u64 && w[0].pblk + w[0].len as u64 == w[1].pblk;
                assert!(
                    !contiguous || w[0].len + w[1].len > max,
                    "left unmerged: {w:?}"
                );
            }
            assert!(list
                .iter()
                .all(|e| e.len <= max && e.unwritten == unwritten));
            assert_eq!(list.iter().map(|e| e.len as u64).sum::<u64>(), lblk as u64);
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
    }

    /// Unwritten conversion in the middle of an extent splits it in three, and converting the
    /// rest merges nothing wrongly: the written pieces stay apart from unwritten neighbours.
    #[test]
    fn mark_written_splits() {
        let img = mkimg("split", "64M", &["-t", "ext4", "-b", "1024"]);
        let fs = open(&img.0, false);
        let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
        let inode = fs.iget(ino).unwrap();
        let p;
        {
            let mut h = fs.start(16).unwrap();
            let mut st = inode.state.lock();
            let (p0, got) = fs.alloc_blocks(&mut h, 0, 100, None).unwrap();
            assert_eq!(got, 100);
            p = p0;
            let e = Extent {
                lblk: 0,
                len: 100,
                pblk: p,
                unwritten: true,
            };
            fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
            fs.ext_mark_written(&mut h, ino, &mut st, 40, 10).unwrap();
            st.raw.set_size(100 * 1024);
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        }
        let ext = |lblk, len, pblk, unwritten| Extent {
            lblk,
            len,
            pblk,
            unwritten,
        };
        assert_eq!(
            fs.ext_list(ino).unwrap(),
            vec![
                ext(0, 40, p, true),
                ext(40, 10, p + 40, false),
                ext(50, 50, p + 50, true)
            ]
        );
        {
            let mut h = fs.start(16).unwrap();
            let mut st = inode.state.lock();
            fs.ext_mark_written(&mut h, ino, &mut st, 0, 1000).unwrap();
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
            let l: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
            assert!(l.iter().all(|e| !e.unwritten));
            assert_eq!(l.iter().map(|e| e.len).sum::<u32>(), 100);
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
    }

    /// Writing a preallocated (unwritten) range piece by piece, in any order, converges to
    /// one written extent: converted pieces join their written neighbours.
    #[test]
    fn conversions_merge_back() {
        let img = mkimg("conv", "64M", &["-t", "ext4", "-b", "1024"]);
        let fs = open(&img.0, false);
        let mut s = 5u64;
        for (name, order) in [(&b"fwd"[..], 0), (&b"back"[..], 1), (&b"random"[..], 2)] {
            let ino = fs.create(2, name, 0o100644, 0, 0).unwrap().ino;
            let inode = fs.iget(ino).unwrap();
            let n = 600u32;
            let mut h = fs.start(16).unwrap();
            let mut st = inode.state.lock();
            let (p, got) = fs.alloc_blocks(&mut h, 0, n, None).unwrap();
            assert_eq!(got, n);
            let e = Extent {
                lblk: 0,
                len: n,
                pblk: p,
                unwritten: true,
            };
            fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
            let mut idx: Vec<u32> = (0..n).collect();
            if order == 1 {
                idx.reverse();
            } else if order == 2 {
                for i in (1..idx.len()).rev() {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    idx.swap(i, (s >> 33) as usize % (i + 1));
                }
            }
            let mut peak = 0;
            for i in idx {
                fs.ext_mark_written(&mut h, ino, &mut st, i, 1).unwrap();
                peak = peak.max(st.extents.as_ref().unwrap().map.len());
            }
            let l: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
            assert_eq!(
                l,
                vec![Extent {
                    lblk: 0,
                    len: n,
                    pblk: p,
                    unwritten: false
                }],
                "order {order}"
            );
            if order < 2 {
                assert!(peak <= 2, "order {order}: {peak} extents at the peak");
            }
            st.raw.set_size(n as u64 * 1024);
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
    }
}

/// Corrupt trees are reported by inode and block, never with a panic.
#[cfg(test)]
mod corruption_tests {
    use super::model_tests::*;
    use super::*;
    use crate::format::{le16, put16};
    use std::os::unix::fs::FileExt;

    /// A file of `n` discontiguous one-block extents; returns (ino, its inode's byte offset in
    /// the image).
    fn build(fs: &Fs, n: u32) -> (u32, u64) {
        let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
        let inode = fs.iget(ino).unwrap();
        for i in 0..n {
            let mut h = fs.start(16).unwrap();
            let mut st = inode.state.lock();
            let (p, _) = fs.alloc_blocks(&mut h, 0, 1, None).unwrap();
            let e = Extent {
                lblk: i * 2,
                len: 1,
                pblk: p,
                unwritten: false,
            };
            fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
            st.raw
                .set_size((i as u64 * 2 + 1) * fs.geo.block_size as u64);
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        }
        let (blk, off) = fs.inode_location(ino).unwrap();
        (ino, blk * fs.geo.block_size as u64 + off as u64)
    }

    /// The first index entry's child of a node.
    fn child(node: &[u8], i: usize) -> u64 {
        ExtentIdx::read(&node[HEADER_SIZE + i * ENTRY_SIZE..]).leaf
    }

    fn message(r: Result<Vec<Extent>>) -> (Error, String) {
        let e = match r {
            Ok(l) => panic!("a corrupt tree loaded ({} extents)", l.len()),
            Err(e) => e,
        };
        let m = e.to_string();
        (e, m)
    }

    /// Magic and checksum damage written into the image file, found by a fresh open.
    #[test]
    fn bad_magic_and_bad_checksum_in_the_image() {
        let img = mkimg("corrupt", "64M", &["-t", "ext4", "-b", "1024"]);
        let fs = open(&img.0, false);
        let (ino, _) = build(&fs, 200);
        let root = fs.iget(ino).unwrap().state.lock().raw.i_block().to_vec();
        assert_eq!(ExtentHeader::read(&root).depth, 1);
        let leaf = child(&root, 1);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img.0)
            .unwrap();
        let at = leaf * 1024;
        let mut orig = [0u8; 32];
        f.read_exact_at(&mut orig, at).unwrap();

        // A byte of an entry: the checksum catches it.
        let mut b = orig;
        b[HEADER_SIZE + 3] ^= 0x40;
        f.write_all_at(&b, at).unwrap();
        let fs = open(&img.0, true);
        let (e, m) = message(fs.ext_list(ino));
        assert!(matches!(e, Error::BadChecksum(_)), "{m}");
        assert!(
            m.contains(&format!("inode {ino}")) && m.contains(&format!("extent block {leaf}")),
            "{m}"
        );
        drop(fs);

        // The magic: a structural error, recorded in the superblock on a writable mount.
        let mut b = orig;
        b[0] = 0;
        f.write_all_at(&b, at).unwrap();
        let fs = open(&img.0, false);
        let (e, m) = message(fs.ext_list(ino));
        assert!(matches!(e, Error::Corrupt(_)), "{m}");
        assert!(
            m.contains(&format!("inode {ino}"))
                && m.contains(&format!("extent block {leaf}"))
                && m.contains("magic"),
            "{m}"
        );
        let sb = fs.superblock();
        assert_eq!(sb.first_error_ino(), ino);
        assert_eq!(sb.first_error_block(), leaf);
        drop(fs);
        // e2fsck sees the same damage.
        let out = std::process::Command::new("e2fsck")
            .arg("-fn")
            .arg(&img.0)
            .output()
            .unwrap();
        assert!(!out.status.success(), "e2fsck missed the damage");
    }

    /// Structural damage to the root and to blocks (no metadata_csum, so only the structure
    /// checks can catch it), made in memory on a read-only mount.
    #[test]
    fn structural_damage_is_named() {
        let img = mkimg(
            "struct",
            "64M",
            &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
        );
        let fs = open(&img.0, false);
        let (ino, _) = build(&fs, 1000);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let fs = open(&img.0, true);
        let inode = fs.iget(ino).unwrap();
        let root = inode.state.lock().raw.i_block().to_vec();
        assert_eq!(ExtentHeader::read(&root).depth, 2);
        let mid = child(&root, 0);
        let mid_data = fs.bcache.get(mid).unwrap().read().to_vec();
        let leaf = child(&mid_data, 0);
        let leaf2 = child(&mid_data, 1);
        let leaf_data = fs.bcache.get(leaf).unwrap().read().to_vec();
        let count = fs.geo.blocks_count;

        // (what is damaged, the node the message must name, the damage)
        type Damage = Box<dyn Fn(&mut Vec<u8>, &mut Vec<u8>, &mut Vec<u8>)>;
        let cases: Vec<(&str, String, Damage)> = vec![
            (
                "root magic",
                "extent root".into(),
                Box::new(|r, _, _| r[0] = 0),
            ),
            (
                "root depth 6",
                "extent root".into(),
                Box::new(|r, _, _| r[6] = 6),
            ),
            (
                "root eh_max 5",
                "extent root".into(),
                Box::new(|r, _, _| r[4] = 5),
            ),
            (
                "root entries > max",
                "extent root".into(),
                Box::new(|r, _, _| r[2] = 5),
            ),
            (
                "root index outside the disk",
                "extent root".into(),
                Box::new(move |r, _, _| put32(r, HEADER_SIZE + 4, count as u32 + 7)),
            ),
            (
                "index keys out of order",
                format!("extent block {mid}"),
                Box::new(|_, m, _| {
                    let k = le32(m, HEADER_SIZE + ENTRY_SIZE);
                    put32(m, HEADER_SIZE, k + 1)
                }),
            ),
            (
                "index node points to itself",
                format!("extent block {mid}"),
                Box::new(move |_, m, _| put32(m, HEADER_SIZE + 4, mid as u32)),
            ),
            (
                "leaf magic",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| l[1] = 0),
            ),
            (
                "leaf depth",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| l[6] = 1),
            ),
            (
                "leaf eh_max",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| put16(l, 4, 300)),
            ),
            (
                "leaf entries > max",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| put16(l, 2, 85)),
            ),
            (
                "leaf extent outside the disk",
                format!("extent block {leaf}"),
                Box::new(move |_, _, l| put32(l, HEADER_SIZE + 8, count as u32 + 10)),
            ),
            (
                "leaf extent of length 0",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| put16(l, HEADER_SIZE + 4, 0)),
            ),
            (
                "leaf extents out of order",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| {
                    let k = le32(l, HEADER_SIZE + ENTRY_SIZE);
                    put32(l, HEADER_SIZE, k + 1)
                }),
            ),
            (
                "last extent of a leaf overlaps the next leaf",
                format!("extent block {leaf}"),
                Box::new(|_, _, l| {
                    let n = le16(l, 2) as usize;
                    put16(l, HEADER_SIZE + (n - 1) * ENTRY_SIZE + 4, 3)
                }),
            ),
            (
                "extent before its parent's key",
                format!("extent block {leaf2}"),
                Box::new(|_, _, _| {}),
            ),
        ];
        for (what, node, damage) in cases {
            let mut r = root.clone();
            let mut m = mid_data.clone();
            let mut l = leaf_data.clone();
            let mut l2 = None;
            if what == "extent before its parent's key" {
                let mut d = fs.bcache.get(leaf2).unwrap().read().to_vec();
                let k = le32(&d, HEADER_SIZE);
                put32(&mut d, HEADER_SIZE, k - 1);
                l2 = Some(d);
            } else {
                damage(&mut r, &mut m, &mut l);
            }
            let orig2 = fs.bcache.get(leaf2).unwrap().read().to_vec();
            {
                let mut st = inode.state.lock();
                st.raw.i_block_mut().copy_from_slice(&r);
                st.extents = None;
            }
            fs.bcache.get(mid).unwrap().write().copy_from_slice(&m);
            fs.bcache.get(leaf).unwrap().write().copy_from_slice(&l);
            if let Some(d) = &l2 {
                fs.bcache.get(leaf2).unwrap().write().copy_from_slice(d);
            }
            let (e, msg) = message(fs.ext_list(ino));
            assert!(matches!(e, Error::Corrupt(_)), "{what}: {msg}");
            assert!(
                msg.contains(&format!("inode {ino}:")) && msg.contains(&node),
                "{what}: {msg} (should name {node})"
            );
            // Put everything back: the undamaged tree loads again.
            {
                let mut st = inode.state.lock();
                st.raw.i_block_mut().copy_from_slice(&root);
                st.extents = None;
            }
            fs.bcache
                .get(mid)
                .unwrap()
                .write()
                .copy_from_slice(&mid_data);
            fs.bcache
                .get(leaf)
                .unwrap()
                .write()
                .copy_from_slice(&leaf_data);
            fs.bcache
                .get(leaf2)
                .unwrap()
                .write()
                .copy_from_slice(&orig2);
            assert_eq!(fs.ext_list(ino).unwrap().len(), 1000, "{what}: restore");
        }
    }

    /// Random byte damage in the root and the tree blocks: an error or a tree whose every
    /// extent is inside the disk, never a panic.
    #[test]
    fn random_damage_never_panics() {
        let img = mkimg(
            "fuzz",
            "64M",
            &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
        );
        let fs = open(&img.0, false);
        let (ino, _) = build(&fs, 1000);
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&img.0, true);
        let inode = fs.iget(ino).unwrap();
        let root = inode.state.lock().raw.i_block().to_vec();
        let mut blocks = vec![];
        let mut todo = vec![child(&root, 0), child(&root, 1)];
        while let Some(b) = todo.pop() {
            let d = fs.bcache.get(b).unwrap().read().to_vec();
            if ExtentHeader::read(&d).depth > 0 {
                for i in 0..le16(&d, 2) as usize {
                    todo.push(child(&d, i));
                }
            }
            blocks.push((b, d));
        }
        let mut s = 7u64;
        let mut rnd = |n: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % n
        };
        let (mut errors, mut loads) = (0, 0);
        for _ in 0..600 {
            let mut r = root.clone();
            let target = rnd(blocks.len() as u64 + 1) as usize;
            let hits = 1 + rnd(4);
            let mut damaged = None;
            if target == blocks.len() {
                for _ in 0..hits {
                    r[rnd(60) as usize] = rnd(256) as u8;
                }
            } else {
                let (b, d) = &blocks[target];
                let mut d = d.clone();
                for _ in 0..hits {
                    // Mostly the header and the first entries, where damage matters most.
                    let at = if rnd(2) == 0 { rnd(64) } else { rnd(1024) } as usize;
                    d[at] = rnd(256) as u8;
                }
                fs.bcache.get(*b).unwrap().write().copy_from_slice(&d);
                damaged = Some(*b);
            }
            {
                let mut st = inode.state.lock();
                st.raw.i_block_mut().copy_from_slice(&r);
                st.extents = None;
            }
            match fs.ext_list(ino) {
                Ok(list) => {
                    loads += 1;
                    for e in &list {
                        assert!(e.pblk > 0 && e.pblk + e.len as u64 <= fs.geo.blocks_count);
                    }
                    for w in list.windows(2) {
                        assert!(w[0].end() <= w[1].lblk as u64);
                    }
                }
                Err(e) => {
                    errors += 1;
                    assert!(e.to_string().contains(&format!("inode {ino}")), "{e}");
                }
            }
            if let Some(b) = damaged {
                let orig = &blocks.iter().find(|x| x.0 == b).unwrap().1;
                fs.bcache.get(b).unwrap().write().copy_from_slice(orig);
            }
        }
        assert!(errors > 100 && loads > 10, "{errors} errors, {loads} loads");
    }
}

/// Files with the old indirect block map (written by debugfs on an ext3 image): read through
/// the cache, refused for new mappings, truncated and deleted cleanly.
#[cfg(test)]
mod blockmap_tests {
    use super::model_tests::*;
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::process::Command;

    fn have(cmd: &str) -> bool {
        Command::new(cmd).arg("-V").output().is_ok()
    }

    /// A source file: nonzero 1 KiB blocks at `blocks` (a pattern naming the block), holes
    /// elsewhere, `size` bytes.
    fn source(path: &std::path::Path, blocks: &[u64], size: u64) {
        let _ = std::fs::remove_file(path);
        let f = std::fs::File::create(path).unwrap();
        f.set_len(size).unwrap();
        for &b in blocks {
            f.write_all_at(&pattern(b), b * 1024).unwrap();
        }
        f.set_len(size).unwrap();
    }

    fn pattern(b: u64) -> Vec<u8> {
        (0..1024u64)
            .map(|i| ((b * 7 + i * 13) % 251) as u8 + 1)
            .collect()
    }

    #[test]
    fn indirect_block_maps() {
        if !have("debugfs") {
            eprintln!("skipped: debugfs (e2fsprogs) is not installed");
            return;
        }
        let img = mkimg("ext3", "128M", &["-t", "ext3", "-b", "1024"]);
        let dir = img.0.parent().unwrap().to_path_buf();
        let tag = format!("{}", std::process::id());
        // Direct only; into the double-indirect tree (12 + 256 = 268 blocks); sparse, out to
        // the triple-indirect tree (from block 12 + 256 + 65536).
        let small: Vec<u64> = (0..5).collect();
        let medium: Vec<u64> = (0..1000).collect();
        let sparse: Vec<u64> = [0u64, 1, 11, 12, 13, 200, 267, 268, 269, 5000, 65803, 65804]
            .into_iter()
            .chain(66000..66100)
            .chain([70000, 100000])
            .collect();
        let files: [(&str, &Vec<u64>, u64); 3] = [
            ("small", &small, 5 * 1024 - 100),
            ("medium", &medium, 1000 * 1024),
            ("sparse", &sparse, 100001 * 1024),
        ];
        for (name, blocks, size) in files {
            let src = dir.join(format!("uext4-extm-src-{name}-{tag}"));
            source(&src, blocks, size);
            let out = Command::new("debugfs")
                .arg("-w")
                .arg("-R")
                .arg(format!("write {} {name}", src.display()))
                .arg(&img.0)
                .output()
                .unwrap();
            let _ = std::fs::remove_file(&src);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        e2fsck_clean(&img.0);

        let fs = open(&img.0, false);
        let free0 = fs.statfs().blocks_free;
        for (name, blocks, size) in files {
            let ino = fs.lookup(2, name.as_bytes()).unwrap().ino;
            let list = fs.ext_list(ino).unwrap();
            let mapped: Vec<u64> = list.iter().flat_map(|e| e.lblk as u64..e.end()).collect();
            assert_eq!(&mapped, blocks, "{name}: mapped blocks");
            // Runs of physically contiguous blocks became single extents.
            for w in list.windows(2) {
                assert!(
                    w[0].end() != w[1].lblk as u64 || w[0].pblk + w[0].len as u64 != w[1].pblk,
                    "{name}: unjoined run {w:?}"
                );
            }
            for &b in blocks.iter() {
                let mut buf = vec![0u8; 1024];
                let n = fs.read(ino, b * 1024, &mut buf).unwrap();
                let want = pattern(b);
                let n2 = (size - b * 1024).min(1024) as usize;
                assert_eq!(n, n2);
                assert_eq!(&buf[..n], &want[..n], "{name}: block {b}");
            }
            // A hole reads as zeros.
            if name == "sparse" {
                let mut buf = vec![1u8; 1024];
                fs.read(ino, 4000 * 1024, &mut buf).unwrap();
                assert!(buf.iter().all(|&x| x == 0));
            }
        }
        // Preallocation is refused by name (the kernel's EOPNOTSUPP); nothing changes.
        let sparse_ino = fs.lookup(2, b"sparse").unwrap().ino;
        let err = fs.fallocate(sparse_ino, 0, 3000 * 1024, 1024).unwrap_err();
        assert!(
            matches!(&err, Error::NotSupported(m) if m.contains("indirect block map")),
            "{err}"
        );
        // Writing maps new blocks through the indirect blocks, here into the double indirect
        // tree's hole at block 3000 (the punch below takes it out again).
        assert_eq!(fs.write(sparse_ino, 3000 * 1024 + 5, b"new").unwrap(), 3);
        let mut buf = vec![0u8; 8];
        fs.read(sparse_ino, 3000 * 1024 + 3, &mut buf).unwrap();
        assert_eq!(&buf, b"\0\0new\0\0\0");
        assert!(fs
            .ext_map(
                sparse_ino,
                &mut fs.iget(sparse_ino).unwrap().state.lock(),
                3000
            )
            .unwrap()
            .is_some());
        // Truncate the medium file into its single-indirect range, punch the sparse one,
        // delete the small one.
        let medium_ino = fs.lookup(2, b"medium").unwrap().ino;
        let blocks_before = fs.getattr(medium_ino).unwrap().blocks;
        fs.truncate(medium_ino, 100 * 1024 + 10).unwrap();
        let a = fs.getattr(medium_ino).unwrap();
        // 101 data blocks + the single-indirect block stay.
        assert_eq!(
            a.blocks,
            (101 + 1) * 2,
            "i_blocks after truncation (was {blocks_before})"
        );
        let mut buf = vec![0u8; 1024];
        fs.read(medium_ino, 99 * 1024, &mut buf).unwrap();
        assert_eq!(buf, pattern(99));
        assert_eq!(fs.ext_list(medium_ino).unwrap().last().unwrap().end(), 101);
        fs.fallocate(sparse_ino, 0x3, 13 * 1024, (66050 - 13) * 1024)
            .unwrap();
        let left: Vec<u64> = fs
            .ext_list(sparse_ino)
            .unwrap()
            .iter()
            .flat_map(|e| e.lblk as u64..e.end())
            .collect();
        let want: Vec<u64> = sparse
            .iter()
            .copied()
            .filter(|&b| !(13..66050).contains(&b))
            .collect();
        assert_eq!(left, want);
        fs.unlink(2, b"small").unwrap();
        fs.unmount().unwrap();
        let freed = fs.statfs().blocks_free - free0;
        assert!(freed > 900, "only {freed} blocks freed");
        drop(fs);
        e2fsck_clean(&img.0);
        // The survivors read back after a fresh open, from the tree on disk.
        let fs = open(&img.0, true);
        assert_eq!(
            fs.ext_list(sparse_ino)
                .unwrap()
                .iter()
                .flat_map(|e| e.lblk as u64..e.end())
                .collect::<Vec<_>>(),
            want
        );
        let mut buf = vec![0u8; 1024];
        fs.read(sparse_ino, 70000 * 1024, &mut buf).unwrap();
        assert_eq!(buf, pattern(70000));
        drop(fs);
        // Delete the rest: every block of the three files comes back.
        let fs = open(&img.0, false);
        fs.unlink(2, b"medium").unwrap();
        fs.unlink(2, b"sparse").unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let out = Command::new("debugfs")
            .arg("-R")
            .arg("ls -l /")
            .arg(&img.0)
            .output()
            .unwrap();
        let ls = String::from_utf8_lossy(&out.stdout);
        assert!(!ls.contains("sparse") && !ls.contains("medium"), "{ls}");
    }
}

/// The kernel reads a deep tree written by uext4, changes it (writes into holes and into
/// unwritten space, punches), and uext4 reads the kernel's tree back (equal to debugfs's
/// reading) and changes it again for the kernel. Needs root and loop devices; skips otherwise.
#[cfg(test)]
mod kernel_tests {
    use super::model_tests::*;

    use std::collections::BTreeMap;
    use std::os::unix::fs::FileExt;
    use std::process::Command;

    struct Mount(std::path::PathBuf);
    impl Mount {
        fn new(img: &std::path::Path) -> Mount {
            let dir = img.with_extension("mnt");
            std::fs::create_dir_all(&dir).unwrap();
            let out = Command::new("mount")
                .args(["-t", "ext4", "-o", "loop"])
                .arg(img)
                .arg(&dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "kernel mount: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Mount(dir)
        }
    }
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    fn can_loop_mount() -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root, so no kernel loop mount");
            return false;
        }
        if !std::path::Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: no /dev/loop-control, so no kernel loop mount");
            return false;
        }
        true
    }

    /// Every block of the file reads as the model says (a fill byte, or zeros).
    fn check_data(read: &dyn Fn(u64, &mut [u8]), blocks: u64, model: &BTreeMap<u64, u8>) {
        let mut buf = vec![0u8; 1024];
        for b in 0..blocks {
            read(b, &mut buf);
            let want = model.get(&b).copied().unwrap_or(0);
            assert!(buf.iter().all(|&x| x == want), "block {b}: want {want:#x}");
        }
    }

    #[test]
    fn kernel_and_uext4_edit_each_others_trees() {
        if !can_loop_mount() {
            return;
        }
        let img = mkimg("kernel", "64M", &["-t", "ext4", "-b", "1024"]);
        let mut model: BTreeMap<u64, u8> = BTreeMap::new();
        let fs = open(&img.0, false);
        let ino = fs.create(2, b"k", 0o100644, 0, 0).unwrap().ino;
        let mut order: Vec<u64> = (0..1500).collect();
        let mut s = 3u64;
        for i in (1..order.len()).rev() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        for &i in &order {
            let v = (i % 250) as u8 + 1;
            fs.write(ino, 2 * i * 1024, &[v; 1024]).unwrap();
            model.insert(2 * i, v);
        }
        fs.fallocate(ino, 1, 4000 * 1024, 200 * 1024).unwrap();
        assert_eq!(fs.ext_tree_depth(ino).unwrap(), 2);
        assert!(fs.ext_list(ino).unwrap().iter().any(|e| e.unwritten));
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);

        // The kernel reads it, then changes it.
        {
            let m = Mount::new(&img.0);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.0.join("k"))
                .unwrap();
            assert_eq!(f.metadata().unwrap().len(), 2999 * 1024);
            check_data(
                &|b, buf| f.read_exact_at(buf, b * 1024).unwrap(),
                2999,
                &model,
            );
            for (b, v) in [(1u64, 0xAAu8), (3, 0xAB), (4050, 0xAC)] {
                f.write_all_at(&[v; 1024], b * 1024).unwrap();
                model.insert(b, v);
            }
            // SAFETY: a valid descriptor; plain integer arguments.
            let r = unsafe {
                libc::fallocate(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    100 * 1024,
                    600 * 1024,
                )
            };
            assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
            model.retain(|&b, _| !(100..700).contains(&b));
            f.sync_all().unwrap();
        }
        e2fsck_clean(&img.0);

        // uext4 reads the kernel's tree: as debugfs does, with the kernel's data.
        let fs = open(&img.0, false);
        let list = fs.ext_list(ino).unwrap();
        assert!(
            list == debugfs_extents(&img.0, ino),
            "uext4 and debugfs disagree"
        );
        assert!(list.iter().any(|e| e.unwritten && e.lblk > 4000));
        check_data(
            &|b, buf| {
                fs.read(ino, b * 1024, buf).unwrap();
            },
            4051,
            &model,
        );
        // And changes it: truncate, punch.
        fs.truncate(ino, 2000 * 1024).unwrap();
        model.retain(|&b, _| b < 2000);
        fs.fallocate(ino, 0x3, 10 * 1024, 40 * 1024).unwrap();
        model.retain(|&b, _| !(10..50).contains(&b));
        let list = fs.ext_list(ino).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        assert!(
            list == debugfs_extents(&img.0, ino),
            "after uext4's changes"
        );
        {
            let m = Mount::new(&img.0);
            let f = std::fs::File::open(m.0.join("k")).unwrap();
            assert_eq!(f.metadata().unwrap().len(), 2000 * 1024);
            check_data(
                &|b, buf| f.read_exact_at(buf, b * 1024).unwrap(),
                2000,
                &model,
            );
        }
        e2fsck_clean(&img.0);
    }
}
