//! The indirect block map of ext2/ext3 files (the kernel's indirect.c): twelve direct
//! pointers, then single, double and triple indirect blocks. Such files go through the same
//! extent cache as extent-mapped ones: they are loaded into it as extents, and mapping or
//! unmapping blocks edits the pointers and indirect blocks instead of a tree. New files on a
//! filesystem without the extents feature get such a map, as the kernel gives them. Unwritten
//! (preallocated) blocks have no place in a block map.

use crate::bcache::Buffer;
use crate::error::{Corruption, Error, Result};
use crate::format::extent::*;
use crate::format::inode::RawInode;
use crate::format::{le32, put32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// How many indirect blocks mapping `maps` new pages, the cached ones lying in `span`
/// (first and last logical block), may allocate at worst: past the twelve direct blocks, a
/// single indirect block per `bs / 4` blocks of the span, and a double indirect one per
/// `(bs / 4)^2`, but never more than one per page on either level; and the triple
/// indirect block.
pub(super) fn md_need(bs: u64, maps: u64, span: (u64, u64)) -> u64 {
    let (first, last) = span;
    if last < 12 {
        return 0;
    }
    let per = bs / 4;
    let width = last - first.min(last);
    maps.min(width / per + 2) + maps.min(width / (per * per) + 2) + 1
}

impl Fs {
    /// Reads the indirect block map of a non-extent file into extents.
    pub(super) fn load_blockmap(
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
        self.check_file_block(Corruption::BlockMap, ino, p, 1, &name)
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
    pub(super) fn blockmap_remove(
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
            c.cut(start, end);
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

    /// Maps `e` (written blocks, over a hole) in a file with an indirect block map. First every
    /// indirect block the range needs is found or made (zeroed, journaled, counted in
    /// i_blocks, near the data), then the pointers are set. If an allocation fails, the
    /// indirect blocks made are taken out again and no pointer names the data blocks, which
    /// the caller then frees.
    pub(super) fn blockmap_insert(
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
        st.extents.as_mut().unwrap().insert_joined(e);
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
}
