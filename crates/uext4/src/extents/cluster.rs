//! bigalloc's rules for a file's blocks, as the kernel keeps them in extents.c
//! (ext4_ext_map_blocks with get_implied_cluster_alloc, and ext4_ext_rm_leaf's partial
//! clusters) and e2fsck checks them (pass1's has_unaligned_cluster_map, check_blocks):
//!
//! - a logical cluster of a file (its blocks `c*ratio .. (c+1)*ratio`) lives in one physical
//!   cluster, each block at its own offset in it: the first block mapped in a logical cluster
//!   allocates a whole cluster, and later blocks of the same logical cluster take their place
//!   in it without allocating (the "implied" cluster);
//! - a physical cluster is freed only when no extent of the file maps any block of its
//!   logical cluster any more (a truncate or punch into the middle of a cluster frees
//!   nothing of it);
//! - i_blocks counts each cluster in use once, whole, in 512-byte units; a map block and an
//!   xattr block take a cluster each.
//!
//! Without bigalloc (a cluster of one block) each rule is the plain block rule, so callers
//! use these functions whatever the filesystem.

use crate::error::Result;
use crate::extent_cache::ExtentCache;
use crate::format::extent::Extent;
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

/// The physical cluster's first block that logical cluster `c_lo..c_lo+ratio` lives in, if
/// any extent of the file maps a block of it.
fn implied_cluster(cache: &ExtentCache, c_lo: u64, cluster_bits: u32) -> Option<u64> {
    let c_hi = c_lo + (1 << cluster_bits);
    let e = cache.next(c_lo as u32).filter(|e| (e.lblk as u64) < c_hi)?;
    let inside = c_lo.max(e.lblk as u64);
    Some((e.pblk + (inside - e.lblk as u64)) >> cluster_bits << cluster_bits)
}

impl Fs {
    /// Bytes a cluster holds (a block's without bigalloc): what one map block, xattr block
    /// or newly used cluster of data adds to i_blocks.
    pub(crate) fn cluster_sectors(&self) -> u64 {
        (self.geo.block_size as u64 / 512) << self.geo.cluster_bits
    }

    /// Physical blocks for logical blocks `lblk..lblk+want` of inode `ino`, none of which is
    /// mapped: a run starting at the returned block, of the returned length (at least 1, at
    /// most `want`). With bigalloc a logical cluster some extent already uses gives its own
    /// cluster's blocks (nothing allocated, at most to the cluster's end); otherwise whole
    /// clusters are allocated near `goal`, the run starting at `lblk`'s offset in the first,
    /// and stopping before a logical cluster the file uses further on. `claimed`: take the
    /// inode's buffered writeback reservation (`Fs::alloc_blocks`). Undo with `free_for`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn alloc_for(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        lblk: u32,
        want: u32,
        goal: u64,
        claimed: bool,
    ) -> Result<(u64, u32)> {
        let cb = self.geo.cluster_bits;
        let want = want.max(1) as u64;
        if cb > 0 {
            self.ext_load(ino, st)?;
            let mask = (1u64 << cb) - 1;
            let (l, c_lo) = (lblk as u64, lblk as u64 & !mask);
            let cache = st.extents.as_ref().unwrap();
            if let Some(p) = implied_cluster(cache, c_lo, cb) {
                let n = (c_lo + mask + 1 - l).min(want);
                return Ok((p + (l & mask), n as u32));
            }
            let last = (l + want - 1) & !mask;
            let want = if last != c_lo && implied_cluster(cache, last, cb).is_some() {
                last - l
            } else {
                want
            };
            let claim = if claimed { st.writeback_claim() } else { None };
            let ask = ((l & mask) + want).min(u32::MAX as u64) as u32;
            let (p, got) = self.alloc_blocks(h, goal & !mask, ask, claim)?;
            let n = (got as u64 - (l & mask)).min(want);
            return Ok((p + (l & mask), n as u32));
        }
        let claim = if claimed { st.writeback_claim() } else { None };
        self.alloc_blocks(h, goal, want.min(u32::MAX as u64) as u32, claim)
    }

    /// Gives back the physical blocks `pblk..pblk+n` that held (or were to hold) logical
    /// blocks `lblk..lblk+n` of the inode, which its extent cache no longer maps: with
    /// bigalloc, the clusters of the logical clusters no other extent of the file still
    /// uses (a partial cluster stays with the blocks that use it). `metadata`: the blocks
    /// went through the journal (a directory's), so a freed cluster is revoked whole.
    /// Returns the blocks given back, for i_blocks.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn free_for(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        lblk: u64,
        pblk: u64,
        n: u64,
        metadata: bool,
    ) -> Result<u64> {
        let cb = self.geo.cluster_bits;
        if n == 0 {
            return Ok(0);
        }
        if cb == 0 {
            self.free_blocks(h, pblk, n, metadata)?;
            return Ok(n);
        }
        self.ext_load(ino, st)?;
        let mask = (1u64 << cb) - 1;
        // Runs of whole clusters to free, as (first block, blocks): contiguous, since one
        // run of physical blocks maps one run of logical ones.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let cache = st.extents.as_ref().unwrap();
        let mut c = lblk & !mask;
        while c < lblk + n {
            if implied_cluster(cache, c, cb).is_none() {
                let p = (pblk + (c.max(lblk) - lblk)) & !mask;
                match runs.last_mut() {
                    Some((s, len)) if *s + *len == p => *len += mask + 1,
                    _ => runs.push((p, mask + 1)),
                }
            }
            c += mask + 1;
        }
        let mut freed = 0;
        for (s, len) in runs {
            self.free_blocks(h, s, len, metadata)?;
            freed += len;
        }
        Ok(freed)
    }

    /// Gives back the tail `keep..n` of a run `alloc_for` gave for `lblk`, before anything
    /// maps it: with bigalloc only the clusters past the one holding the kept part's last
    /// block (those hold nothing the file will map).
    pub(crate) fn free_tail(&self, h: &mut Handle<'_>, pblk: u64, n: u32, keep: u32) -> Result<()> {
        let mask = (1u64 << self.geo.cluster_bits) - 1;
        let (end, from) = (pblk + n as u64, (pblk + keep as u64 + mask) & !mask);
        if from < end {
            self.free_blocks(h, from, end - from, false)?;
        }
        Ok(())
    }

    /// Blocks (whole clusters) that mapping `e` adds to i_blocks: with bigalloc, the clusters
    /// of the logical clusters no extent of the file used before (read before `e` enters
    /// the cache).
    pub(crate) fn charge_for(&self, cache: &ExtentCache, e: &Extent) -> u64 {
        let cb = self.geo.cluster_bits;
        if cb == 0 {
            return e.len as u64;
        }
        let mask = (1u64 << cb) - 1;
        let mut c = e.lblk as u64 & !mask;
        let mut fresh = 0;
        while c < e.end() {
            if implied_cluster(cache, c, cb).is_none() {
                fresh += mask + 1;
            }
            c += mask + 1;
        }
        fresh
    }
}
