//! The extent tree (the kernel's extents.c; Documentation/filesystems/ext4/ifork.rst):
//! loading and validating it into the extent cache, and every change to it. Changes are made
//! to the cache and to the on-disk tree together, one leaf at a time: the path from the root
//! to the leaf is read, the leaf's entries are edited, and the change is pushed back up: a
//! full node splits (the root grows the tree by one level), an empty node is freed and its
//! index entry removed, and index keys follow the first key of their child.

use crate::error::{Corruption, Error, Result};
use crate::format::extent::*;
use crate::format::inode::{RawInode, FL_EXTENTS};
use crate::format::{le32, put32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;
use std::collections::BTreeMap;

pub(super) mod shift;

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

/// Sets up an empty extent tree in a new inode's i_block.
pub(crate) fn init_root(raw: &mut RawInode) {
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

/// Depth of the inode's tree (0: the extents are in i_block, or it has no tree).
pub(crate) fn depth(raw: &RawInode) -> u16 {
    if raw.flags() & FL_EXTENTS == 0 {
        return 0;
    }
    ExtentHeader::read(raw.i_block()).depth
}

/// How many tree blocks mapping `maps` new pages (`inner` of them inside the mapped
/// range) may allocate at worst. None while the extents fit in the inode. Else each page
/// adds at most two extents (one over an unwritten extent splits it in three). Past the
/// mapped end they all go into the last leaf, which splits off its last entry when full
/// and fills the new leaf: a leaf per half-full leaf of them, and one. Inside the mapped
/// range each may land in a different full leaf, which splits in half: a leaf per
/// half-full leaf of them and one per leaf they touch (no more than the pages, nor than
/// the extents there are). Each new block may split a full node on every level above,
/// and the root may move down twice.
pub(super) fn md_need(bs: u64, st: &InodeState, maps: u64, inner: u64) -> u64 {
    let have = st.extents.as_ref().map_or(0, |c| c.map.len() as u64);
    if have + 2 * maps <= 4 {
        return 0;
    }
    let half = ((bs - 12) / 12 / 2).max(1);
    let inner = inner.min(maps);
    let appended = 2 * (maps - inner);
    let mut leaves = appended.div_ceil(half) + 1;
    if inner > 0 {
        leaves += (2 * inner).min((2 * inner).div_ceil(half) + inner.min(have.max(1)));
    }
    let levels = depth(&st.raw) as u64 + 1;
    leaves * levels + leaves.div_ceil(half) + 2
}

impl Fs {
    /// Reads and validates the tree rooted in `raw`'s i_block into `out`.
    pub(super) fn load_tree(
        &self,
        ino: u32,
        raw: &RawInode,
        out: &mut BTreeMap<u32, Extent>,
    ) -> Result<()> {
        let root = raw.i_block().to_vec();
        let hdr = ExtentHeader::read(&root);
        let seed = RawInode::csum_seed(self.geo.csum_seed, ino, raw.generation());
        self.load_node(ino, seed, &root, None, hdr.depth, 0, u64::MAX >> 1, out)
    }

    fn corrupt(&self, ino: u32, blk: u64, what: String) -> Error {
        self.fail(
            Error::corrupt(
                Corruption::ExtentTree,
                format!("inode {ino}: {}: {what}", node_name(blk)),
            ),
            ino,
            blk,
            "ext_load",
        )
    }

    /// Validates a node's header (and its checksum, for a block) and returns it; `blk` is
    /// None for the root in i_block.
    fn check_extent_node(
        &self,
        ino: u32,
        seed: u32,
        data: &[u8],
        blk: Option<u64>,
        want_depth: u16,
    ) -> Result<ExtentHeader> {
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
                        Error::bad_checksum(
                            Corruption::ExtentTree,
                            format!(
                                "inode {ino}: extent block {blk}: checksum {have:#010x}, \
                                 computed {want:#010x}"
                            ),
                        ),
                        ino,
                        blk,
                        "ext_load",
                    ));
                }
            }
        }
        Ok(hdr)
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
        let hdr = self.check_extent_node(ino, seed, data, blk, want_depth)?;
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
                if let Err(err) = self.check_file_block(
                    Corruption::ExtentTree,
                    ino,
                    x.pblk,
                    x.len as u64,
                    &|| {
                        format!(
                            "inode {ino}: {}: extent {i} (logical {})",
                            node_name(b),
                            x.lblk
                        )
                    },
                ) {
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
                if let Err(err) =
                    self.check_file_block(Corruption::ExtentTree, ino, x.leaf, 1, &|| {
                        format!(
                            "inode {ino}: {}: index {i} (logical {})",
                            node_name(b),
                            x.lblk
                        )
                    })
                {
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

    /// Maps a hole in the tree (checked by `ext_insert`): inserts `e`, merging it with a
    /// contiguous neighbour.
    pub(super) fn tree_insert(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        e: Extent,
    ) -> Result<()> {
        let cache = st.extents.as_ref().unwrap();
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
        let delta = self.charge_for(cache, &e) * self.sectors_per_block();
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

    /// Unmaps logical blocks `[start, end)` of the tree (`end` at most 2^32) and frees their
    /// data blocks.
    pub(super) fn tree_remove(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        end: u64,
    ) -> Result<()> {
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
            let journaled = Self::journaled_data(&st.raw);
            let p = x.pblk + (cut_lo - x.lblk as u64);
            let freed = self.free_for(h, ino, st, cut_lo, p, cut_hi - cut_lo, journaled)?;
            let b = st
                .raw
                .blocks_512(self.geo.block_size)
                .saturating_sub(freed * self.sectors_per_block());
            st.raw.set_blocks_512(b);
        }
        self.shrink_root(h, ino, st)
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

    /// Converts the unwritten extents in `[start, start+len)` of the tree to written.
    pub(super) fn tree_mark_written(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        len: u32,
    ) -> Result<()> {
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
