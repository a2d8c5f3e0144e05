//! The one block-mapping dispatch point (the kernel's ext4_map_blocks): every question about
//! which physical block holds a file's logical block, and every change to that mapping, goes
//! through here, which answers from the extent cache and sends changes to the extent tree
//! (`tree`) or to the indirect block map (`indirect`), whichever the inode uses. Callers never
//! choose between the two themselves. Its methods keep the `ext_` names their callers know:
//! the extents they speak of are the cache's, whichever map stores them.

use super::{indirect, tree};
use crate::error::{Corruption, Error, Result};
use crate::extent_cache::ExtentCache;
use crate::format::extent::*;
use crate::format::inode::RawInode;
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

impl Fs {
    pub(super) fn sectors_per_block(&self) -> u64 {
        self.geo.block_size as u64 / 512
    }

    /// Whether a file maps its blocks with the old indirect block map (ext2/ext3).
    pub(crate) fn uses_blockmap(raw: &RawInode) -> bool {
        raw.flags() & crate::format::inode::FL_EXTENTS == 0
    }

    /// Sets up an empty map in a new inode's i_block: an extent tree on a filesystem with the
    /// extents feature, else (i_block left as it is) an indirect block map, as the kernel
    /// gives new files.
    pub(crate) fn init_block_map(&self, raw: &mut RawInode) {
        if self.geo.extents {
            tree::init_root(raw);
        }
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
        Ok(tree::depth(&st.raw))
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
        if Self::uses_blockmap(&st.raw) {
            cache.blockmap = true;
            self.load_blockmap(ino, &st.raw, &mut cache.map)?;
        } else {
            self.load_tree(ino, &st.raw, &mut cache.map)?;
        }
        st.extents = Some(cache);
        Ok(())
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
        self.check_file_block(Corruption::ExtentTree, ino, e.pblk, e.len as u64, &|| {
            format!("inode {ino}: new extent at logical block {}", e.lblk)
        })?;
        let cache = st.extents.as_ref().unwrap();
        if let Some(x) = cache.next(e.lblk) {
            if (x.lblk as u64) < e.end() {
                return Err(self.fail(
                    Error::corrupt(
                        Corruption::ExtentTree,
                        format!(
                            "inode {ino}: new extent at {} overlaps the one at {}",
                            e.lblk, x.lblk
                        ),
                    ),
                    ino,
                    0,
                    "ext_insert",
                ));
            }
        }
        if cache.blockmap {
            return self.blockmap_insert(h, ino, st, e);
        }
        self.tree_insert(h, ino, st, e)
    }

    /// Converts the unwritten extents in `[start, start+len)` to written. Only a tree has
    /// unwritten extents.
    pub(crate) fn ext_mark_written(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        len: u32,
    ) -> Result<()> {
        self.ext_load(ino, st)?;
        if st.extents.as_ref().unwrap().blockmap {
            return Err(Error::NotSupported(format!(
                "inode {ino}: unwritten blocks in a file with an indirect block map (not extents)"
            )));
        }
        self.tree_mark_written(h, ino, st, start, len)
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
        self.tree_remove(h, ino, st, start, end)
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
        let depth = tree::depth(&st.raw) as usize;
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

    /// The largest size inode `raw` may have: the filesystem's, or less with an indirect
    /// block map (the kernel's s_maxbytes and s_bitmap_maxbytes).
    pub(crate) fn max_size_of(&self, raw: &RawInode) -> u64 {
        if Self::uses_blockmap(raw) {
            self.blockmap_max_size().min(self.max_file_size())
        } else {
            self.max_file_size()
        }
    }

    /// Mapping blocks that writing back `maps` mapping-changing pages (`inner` of them inside
    /// the mapped range), the cached ones lying in `span` (first and last logical block), may
    /// allocate at worst (`tree::md_need`, `indirect::md_need`).
    pub(crate) fn map_md_need(
        &self,
        st: &InodeState,
        maps: u64,
        inner: u64,
        span: (u64, u64),
    ) -> u64 {
        if maps == 0 {
            return 0;
        }
        let blockmap =
            st.extents.as_ref().is_some_and(|c| c.blockmap) || Self::uses_blockmap(&st.raw);
        if blockmap {
            indirect::md_need(self.geo.block_size as u64, maps, span)
        } else {
            tree::md_need(self.geo.block_size as u64, st, maps, inner)
        }
    }

    /// A new block of the file's map (an extent tree node or an indirect block) near its data,
    /// counted in i_blocks.
    pub(super) fn alloc_tree_block(
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
        // With bigalloc a map block takes a cluster of its own.
        let (b, _) = self.alloc_blocks(h, goal, 1, st.writeback_claim())?;
        let v = st.raw.blocks_512(self.geo.block_size) + self.cluster_sectors();
        st.raw.set_blocks_512(v);
        h.extend(4);
        Ok(b)
    }

    pub(super) fn free_tree_block(
        &self,
        h: &mut Handle<'_>,
        st: &mut InodeState,
        blk: u64,
    ) -> Result<()> {
        self.free_blocks(h, blk, 1, true)?;
        let v = st
            .raw
            .blocks_512(self.geo.block_size)
            .saturating_sub(self.cluster_sectors());
        st.raw.set_blocks_512(v);
        Ok(())
    }
}
