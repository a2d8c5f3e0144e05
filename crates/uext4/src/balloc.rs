//! The block allocator: goal-based, per-group locked, flex_bg aware.
//!
//! A request names a goal block (usually the block after the file's previous extent, so files stay
//! contiguous) and a length. The allocator looks for a free run starting at the goal, then for
//! the first run of the full length in the goal's group and the following groups, then takes the
//! longest shorter run it saw. Each group is locked on its own (`Fs::groups[g]`); no lock spans
//! groups. Blocks freed by a transaction that has not committed are not reused until it has
//! (so a crash can never leave an old file pointing at a new file's data).

use crate::bcache::Buffer;
use crate::error::{Corruption, Error, Result};
use crate::format::group_desc::BG_BLOCK_UNINIT;
use crate::fs::Fs;
use crate::mballoc::{Claim, GroupState};
use crate::transaction::Handle;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[inline]
pub(crate) fn test_bit(b: &[u8], i: usize) -> bool {
    b[i / 8] & (1 << (i % 8)) != 0
}
#[inline]
pub(crate) fn set_bit(b: &mut [u8], i: usize) {
    b[i / 8] |= 1 << (i % 8)
}
#[inline]
pub(crate) fn clear_bit(b: &mut [u8], i: usize) {
    b[i / 8] &= !(1 << (i % 8))
}

/// First zero bit in `b` at or after `from`, below `limit`.
pub(crate) fn find_zero(b: &[u8], from: usize, limit: usize) -> Option<usize> {
    let mut i = from;
    while i < limit {
        if i.is_multiple_of(64) && i + 64 <= limit {
            let w = u64::from_le_bytes(b[i / 8..i / 8 + 8].try_into().unwrap());
            if w == u64::MAX {
                i += 64;
                continue;
            }
            return Some(i + (!w).trailing_zeros() as usize);
        }
        if !test_bit(b, i) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Length of the run of zero bits starting at `from`, at most `max`, below `limit`.
pub(crate) fn zero_run(b: &[u8], from: usize, max: usize, limit: usize) -> usize {
    let mut n = 0;
    let mut i = from;
    while i < limit && n < max {
        if i.is_multiple_of(64) && i + 64 <= limit && max - n >= 64 {
            let w = u64::from_le_bytes(b[i / 8..i / 8 + 8].try_into().unwrap());
            if w == 0 {
                n += 64;
                i += 64;
                continue;
            }
            let z = w.trailing_zeros() as usize;
            return n + z;
        }
        if test_bit(b, i) {
            break;
        }
        n += 1;
        i += 1;
    }
    n
}

impl Fs {
    /// The block bitmap of group `g`, initialised (and its uninit flag cleared) if needed.
    /// The caller holds the group lock.
    fn block_bitmap(&self, h: &mut Handle<'_>, g: u32, st: &mut GroupState) -> Result<Arc<Buffer>> {
        let blk = st.desc.block_bitmap();
        if self.uninit_block_bitmap(st) {
            let buf = self.bcache.get_new(blk)?;
            {
                let mut data = buf.write();
                self.init_block_bitmap(g, &mut data);
                let v = st.desc.flags() & !BG_BLOCK_UNINIT;
                st.desc.set_flags(v);
                if self.geo.metadata_csum {
                    st.desc.set_block_bitmap_csum(
                        self.geo.csum_seed,
                        &data[..self.geo.block_bitmap_csum_len()],
                    );
                }
            }
            h.dirty(&buf);
            self.write_group_desc(h, g, st)?;
            return Ok(buf);
        }
        self.read_block_bitmap(g, st)
    }

    pub(crate) fn uninit_block_bitmap(&self, st: &GroupState) -> bool {
        !matches!(self.geo.gd_csum, crate::format::group_desc::GdCsum::None)
            && st.desc.flags() & BG_BLOCK_UNINIT != 0
    }

    /// Reads (and on first read verifies) a group's block bitmap. Caller holds the group lock.
    pub(crate) fn read_block_bitmap(&self, g: u32, st: &GroupState) -> Result<Arc<Buffer>> {
        let blk = st.desc.block_bitmap();
        let cached = self.bcache.get(blk)?;
        if !st.bitmap_valid.load(Ordering::Acquire) {
            self.validate_block_bitmap(g, blk, &cached.read())?;
            st.bitmap_valid.store(true, Ordering::Release);
        }
        if self.geo.metadata_csum && !cached.dirty.load(Ordering::Acquire) {
            let data = cached.read();
            if !st.desc.verify_block_bitmap_csum(
                self.geo.csum_seed,
                &data[..self.geo.block_bitmap_csum_len()],
            ) {
                drop(data);
                return Err(self.fail(
                    Error::bad_checksum(
                        Corruption::BlockBitmap,
                        format!("block bitmap of group {g} (block {blk})"),
                    ),
                    0,
                    blk,
                    "read_block_bitmap",
                ));
            }
        }
        Ok(cached)
    }

    /// Checks, as the kernel's ext4_validate_block_bitmap, that a group's bitmap marks in use
    /// every block of the filesystem's own structures in the group (its superblock copy and
    /// descriptors, the bitmaps and inode tables flex_bg placed there, the journal) and the
    /// padding past the group's last block. A zeroed or damaged bitmap would hand those
    /// blocks out: one mkdir overwrote the inode table that held the root.
    fn validate_block_bitmap(&self, g: u32, blk: u64, data: &[u8]) -> Result<()> {
        let first = self.geo.group_first_block(g);
        let n = self.geo.blocks_in_group(g) as u64;
        let units = self.geo.clusters_in_group(g);
        let bad = {
            let zone = self.balloc.system_zone.read();
            let found = zone
                .within(first, first + n)
                .find(|&(s, e)| (s..e).any(|b| !test_bit(data, self.geo.bitmap_bit(g, b))));
            found
        };
        let what = match bad {
            Some((s, e)) => format!("marks system blocks {s}..{e} free"),
            None if (units..data.len() * 8).any(|i| !test_bit(data, i)) => {
                "has free bits past the group's last block".to_string()
            }
            None => return Ok(()),
        };
        Err(self.fail(
            Error::corrupt(
                Corruption::BlockBitmap,
                format!("block bitmap of group {g} (block {blk}) {what}"),
            ),
            0,
            blk,
            "validate_block_bitmap",
        ))
    }

    /// Builds the bitmap of a group that was never used: its own fixed metadata (superblock
    /// backup, GDT, reserved GDT, and any group's bitmaps and inode table that flex_bg placed
    /// here) is in use, and so are the bits past the end of the last group. The caller holds
    /// group `g`'s lock; the other groups' table locations come from `group_tables`, without
    /// their locks (two groups initialising at once would otherwise wait for each other).
    pub(crate) fn init_block_bitmap(&self, g: u32, data: &mut [u8]) {
        data.fill(0);
        let geo = &self.geo;
        let first = geo.group_first_block(g);
        let n = geo.blocks_in_group(g) as u64;
        for i in 0..geo.group_overhead(g) as u64 {
            set_bit(data, (i >> geo.cluster_bits) as usize);
        }
        let itb =
            (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size as u64);
        let mut mark = |b: u64, len: u64| {
            for x in b.max(first)..(b + len).min(first + n) {
                set_bit(data, geo.bitmap_bit(g, x));
            }
        };
        for &[block_bitmap, inode_bitmap, inode_table] in &self.balloc.tables {
            mark(block_bitmap, 1);
            mark(inode_bitmap, 1);
            mark(inode_table, itb);
        }
        for i in geo.clusters_in_group(g)..data.len() * 8 {
            set_bit(data, i);
        }
    }

    /// Allocates up to `want` contiguous blocks near `goal`. Returns (first block, count).
    /// With bigalloc the bitmap's bits are clusters and whole clusters are taken: the run
    /// starts on a cluster and its length is a multiple of the cluster (`want` rounded up),
    /// so a caller mapping a file's blocks goes through `alloc_for` (extents/cluster.rs),
    /// which puts each logical block at its own offset in its cluster.
    /// `claim`: the reservation of the buffered writeback the blocks are for, which they may
    /// use and are taken out of; without one, buffered writes' reservations are kept.
    /// Running out of space is returned (`Error::NoSpace`): committing to free what pending
    /// frees hold and retrying is the caller's (`Fs::retry_nospace`), which owns no handle.
    pub(crate) fn alloc_blocks(
        &self,
        h: &mut Handle<'_>,
        goal: u64,
        want: u32,
        claim: Option<&Claim>,
    ) -> Result<(u64, u32)> {
        self.check_writable()?;
        let room = match claim {
            Some(_) => u64::MAX,
            None => self.unreserved_blocks(),
        };
        let geo = &self.geo;
        let cb = geo.cluster_bits;
        // Counted in bitmap bits (clusters) from here on: only whole clusters of room count.
        let room = room >> cb;
        if room == 0 {
            return Err(Error::NoSpace);
        }
        // A run never spans groups here: asking for more than a group holds would only make
        // the first pass look at every group in vain (callers loop for the rest).
        let want = (want.max(1) as u64)
            .div_ceil(1 << cb)
            .min(room)
            .min((geo.blocks_per_group >> cb) as u64) as u32;
        let goal = if goal < geo.first_data_block || goal >= geo.blocks_count {
            geo.first_data_block
        } else {
            goal
        };
        let start_group = geo.block_group(goal);
        // The longest run seen: (group, offset, len); no offset for a never-used group's free
        // blocks, whose bitmap is built only if it is chosen.
        let mut best: Option<(u32, Option<usize>, usize)> = None;
        for pass in 0..2 {
            for i in 0..geo.group_count {
                let g = (start_group + i) % geo.group_count;
                let mut st = self.balloc.groups[g as usize].lock();
                let free = st.desc.free_blocks_count();
                if free == 0 {
                    continue;
                }
                // The first pass looks for a whole run of `want`. A group whose bitmap was
                // never used (BLOCK_UNINIT) cannot hold one with fewer free blocks, and
                // building its bitmap only to look would dirty it (and its descriptor) in this
                // handle: a search across a thousand small groups made one handle larger than
                // a small journal. Its free blocks (usually one run after its own metadata)
                // stay a candidate for the longest run.
                if pass == 0 && (free as u32) < want && self.uninit_block_bitmap(&st) {
                    if best.is_none_or(|b| b.2 < free as usize) {
                        best = Some((g, None, free as usize));
                    }
                    continue;
                }
                let from = if g == start_group && i == 0 {
                    geo.bitmap_bit(g, goal)
                } else {
                    0
                };
                let buf = self.block_bitmap(h, g, &mut st)?;
                let limit = geo.clusters_in_group(g);
                let found = {
                    let data = buf.read();
                    self.search_run(g, &data, from, want as usize, limit, pass == 1)
                };
                if let Some((off, len)) = found {
                    if len >= want as usize || pass == 1 {
                        let len = len.min(want as usize);
                        return self.take_run(h, g, &mut st, &buf, off, len, claim);
                    }
                    if best.is_none_or(|b| b.2 < len) {
                        best = Some((g, Some(off), len));
                    }
                }
            }
            if let Some((g, off, len)) = best.take() {
                let mut st = self.balloc.groups[g as usize].lock();
                let buf = self.block_bitmap(h, g, &mut st)?;
                let limit = geo.clusters_in_group(g);
                let Some((off, len)) = off
                    .map(|o| (o, len))
                    .or_else(|| self.search_run(g, &buf.read(), 0, want as usize, limit, false))
                else {
                    continue;
                };
                // Re-check under the lock: another thread may have taken it meanwhile.
                let at = geo.group_first_block(g) + ((off as u64) << cb);
                let mut still = zero_run(&buf.read(), off, len, limit) as u64;
                if let Some((s, _)) = self.balloc.pending_overlap(at, still << cb) {
                    still = s.saturating_sub(at) >> cb;
                }
                if still > 0 {
                    return self.take_run(h, g, &mut st, &buf, off, still as usize, claim);
                }
            }
        }
        Err(Error::NoSpace)
    }

    /// Finds a free run in one bitmap: the first of `want` bits (blocks, or clusters with
    /// bigalloc) from bit `from` (then from the group's start); or with `any`, the first free
    /// run at all. Returns (bit, length in bits).
    fn search_run(
        &self,
        g: u32,
        b: &[u8],
        from: usize,
        want: usize,
        limit: usize,
        any: bool,
    ) -> Option<(usize, usize)> {
        let base = self.geo.group_first_block(g);
        let cb = self.geo.cluster_bits;
        let from = from.min(limit);
        let mut best: Option<(usize, usize)> = None;
        for (lo, hi) in [(from, limit), (0, from)] {
            let mut pos = lo;
            while let Some(z) = find_zero(b, pos, hi) {
                let mut len = zero_run(b, z, want, limit);
                let at = base + ((z as u64) << cb);
                if let Some((s, e)) = self.balloc.pending_overlap(at, (len as u64) << cb) {
                    if s <= at {
                        // z is free in the bitmap but freed by an uncommitted transaction:
                        // jump past that whole range (not block by block: a deleted 1 GiB
                        // file is one range of 262,144 blocks).
                        pos = (((e - base) >> cb) as usize).max(z + 1);
                        continue;
                    }
                    // Keep only the prefix that no uncommitted free covers.
                    len = ((s - at) >> cb) as usize;
                }
                if len >= want || (any && len > 0) {
                    return Some((z, len));
                }
                if len > 0 && best.is_none_or(|bb| bb.1 < len) {
                    best = Some((z, len));
                }
                pos = z + len.max(1);
            }
        }
        best
    }

    #[allow(clippy::too_many_arguments)]
    fn take_run(
        &self,
        h: &mut Handle<'_>,
        g: u32,
        st: &mut GroupState,
        buf: &Arc<Buffer>,
        off: usize,
        len: usize,
        claim: Option<&Claim>,
    ) -> Result<(u64, u32)> {
        // A run a damaged bitmap showed free over the filesystem's own blocks is refused
        // before anything is written there (the kernel's ext4_mb_mark_diskspace_used check).
        // `off` and `len` count bits: clusters with bigalloc.
        let cb = self.geo.cluster_bits;
        let at = self.geo.group_first_block(g) + ((off as u64) << cb);
        let blocks = (len as u64) << cb;
        if let Some((s, e)) = self.balloc.system_zone.read().overlap(at, at + blocks) {
            return Err(self.fail(
                Error::corrupt(
                    Corruption::BlockBitmap,
                    format!(
                        "group {g}: the block bitmap shows blocks {at}..{} free, which hold the \
                         filesystem's own structures (blocks {s}..{e})",
                        at + blocks
                    ),
                ),
                0,
                at,
                "take_run",
            ));
        }
        // Nor a run longer than the group's free count: the bitmap and the descriptor
        // disagree (the kernel's mballoc marks such a group's bitmap corrupt).
        let free = st.desc.free_blocks_count();
        if free < len as u64 {
            return Err(self.fail(
                Error::corrupt(
                    Corruption::BlockBitmap,
                    format!(
                        "group {g}: the block bitmap shows {len} clusters free at {off}, more \
                         than the group descriptor's free count ({free})"
                    ),
                ),
                0,
                at,
                "take_run",
            ));
        }
        {
            let mut data = buf.write();
            for i in off..off + len {
                debug_assert!(!test_bit(&data, i));
                set_bit(&mut data, i);
            }
            if self.geo.metadata_csum {
                st.desc.set_block_bitmap_csum(
                    self.geo.csum_seed,
                    &data[..self.geo.block_bitmap_csum_len()],
                );
            }
        }
        h.dirty(buf);
        st.desc.set_free_blocks_count(free - len as u64);
        self.write_group_desc(h, g, st)?;
        self.sb.free_blocks.fetch_sub(blocks, Ordering::Relaxed);
        if let Some(c) = claim {
            c.take(blocks);
        }
        Ok((at, blocks as u32))
    }

    /// Frees `len` blocks from `start`. With `metadata`, they were metadata blocks: dropped from
    /// the buffer cache and revoked in the journal.
    pub(crate) fn free_blocks(
        &self,
        h: &mut Handle<'_>,
        start: u64,
        len: u64,
        metadata: bool,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check_block(Corruption::BlockReference, start, len, &|| {
            "freeing blocks".to_string()
        })?;
        let end = start + len;
        // With bigalloc the bits are clusters: the whole clusters holding the range are freed
        // (their callers know no other block of them is in use: `free_for`).
        let (cstart, cend) = self.cluster_span(start, end);
        // Before any bit is cleared: the moment a bit is clear (and its group lock released)
        // another thread may look for free blocks, and it must find these held back until this
        // transaction is home. Done after, an allocation in between took a block that is still
        // in use, and the forget and revoke below then dropped its new owner's buffer.
        self.balloc
            .pending_free
            .insert(cstart, cend - cstart, h.tid());
        if metadata {
            for b in start..end {
                self.bcache.forget(b);
                h.revoke(b);
            }
        }
        let geo = &self.geo;
        let mut blk = cstart;
        while blk < cend {
            let g = geo.block_group(blk);
            let gend = self.group_span_end(g).min(cend);
            let mut st = self.balloc.groups[g as usize].lock();
            let buf = self.block_bitmap(h, g, &mut st)?;
            let bits = geo.bitmap_bit(g, blk)..geo.bitmap_bit(g, gend - 1) + 1;
            let n = bits.len() as u64;
            {
                let mut data = buf.write();
                for i in bits {
                    if !test_bit(&data, i) {
                        let b = geo.group_first_block(g) + ((i as u64) << geo.cluster_bits);
                        drop(data);
                        return Err(self.fail(
                            Error::corrupt(
                                Corruption::BlockBitmap,
                                format!("freeing block {b}, which is already free (group {g})"),
                            ),
                            0,
                            b,
                            "free_blocks",
                        ));
                    }
                    clear_bit(&mut data, i);
                }
                if self.geo.metadata_csum {
                    st.desc.set_block_bitmap_csum(
                        self.geo.csum_seed,
                        &data[..self.geo.block_bitmap_csum_len()],
                    );
                }
            }
            h.dirty(&buf);
            let v = st.desc.free_blocks_count() + n;
            st.desc.set_free_blocks_count(v);
            self.write_group_desc(h, g, &mut st)?;
            drop(st);
            self.sb
                .free_blocks
                .fetch_add(n << geo.cluster_bits, Ordering::Relaxed);
            blk = gend;
        }
        Ok(())
    }

    /// Sets (`used`) or clears the bits of blocks `start..start+len` whatever their state,
    /// keeping the group and superblock counts right: only bits that change count. The
    /// kernel's ext4_mb_mark_bb, which fast-commit replay uses to make the bitmaps say what
    /// the replayed inodes map (it may mark a block twice or free one never marked).
    /// Returns how many bits changed.
    pub(crate) fn mark_blocks(
        &self,
        h: &mut Handle<'_>,
        start: u64,
        len: u64,
        used: bool,
    ) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        self.check_block(Corruption::BlockReference, start, len, &|| {
            "marking blocks".to_string()
        })?;
        let geo = &self.geo;
        let (cstart, cend) = self.cluster_span(start, start + len);
        let (mut blk, mut changed) = (cstart, 0u64);
        while blk < cend {
            let g = geo.block_group(blk);
            let gend = self.group_span_end(g).min(cend);
            let mut st = self.balloc.groups[g as usize].lock();
            let buf = self.block_bitmap(h, g, &mut st)?;
            let mut n = 0u64;
            {
                let mut data = buf.write();
                for i in geo.bitmap_bit(g, blk)..geo.bitmap_bit(g, gend - 1) + 1 {
                    if test_bit(&data, i) != used {
                        if used {
                            set_bit(&mut data, i)
                        } else {
                            clear_bit(&mut data, i)
                        }
                        n += 1;
                    }
                }
                if n > 0 && self.geo.metadata_csum {
                    st.desc.set_block_bitmap_csum(
                        self.geo.csum_seed,
                        &data[..self.geo.block_bitmap_csum_len()],
                    );
                }
            }
            if n > 0 {
                h.dirty(&buf);
                let free = st.desc.free_blocks_count();
                st.desc
                    .set_free_blocks_count(if used { free - n } else { free + n });
                self.write_group_desc(h, g, &mut st)?;
                let blocks = n << geo.cluster_bits;
                if used {
                    self.sb.free_blocks.fetch_sub(blocks, Ordering::Relaxed);
                } else {
                    self.sb.free_blocks.fetch_add(blocks, Ordering::Relaxed);
                }
            }
            changed += n << geo.cluster_bits;
            blk = gend;
        }
        Ok(changed)
    }

    /// The blocks of the clusters holding `[start, end)`: the range itself without bigalloc.
    pub(crate) fn cluster_span(&self, start: u64, end: u64) -> (u64, u64) {
        let mask = (1u64 << self.geo.cluster_bits) - 1;
        (start & !mask, (end + mask) & !mask)
    }

    /// Where group `g`'s last bitmap bit's cluster ends (its last block's end without
    /// bigalloc).
    fn group_span_end(&self, g: u32) -> u64 {
        let geo = &self.geo;
        geo.group_first_block(g) + ((geo.clusters_in_group(g) as u64) << geo.cluster_bits)
    }

    /// Forgets pending frees of transactions up to `tid` (called after they commit).
    pub(crate) fn release_pending_frees(&self, tid: u64) {
        self.balloc.pending_free.release(tid);
    }

    /// Whether block `blk` is marked in use in its group's bitmap (for checks and tests).
    pub fn block_in_use(&self, blk: u64) -> Result<bool> {
        let g = self.geo.block_group(blk);
        let st = self.balloc.groups[g as usize].lock();
        if self.uninit_block_bitmap(&st) {
            let mut data = vec![0u8; self.geo.block_size as usize];
            self.init_block_bitmap(g, &mut data);
            return Ok(test_bit(&data, self.geo.bitmap_bit(g, blk)));
        }
        let buf = self.read_block_bitmap(g, &st)?;
        let r = test_bit(&buf.read(), self.geo.bitmap_bit(g, blk));
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn bit_search() {
        let mut b = vec![0xFFu8; 32];
        clear_bit(&mut b, 70);
        clear_bit(&mut b, 71);
        clear_bit(&mut b, 72);
        assert_eq!(find_zero(&b, 0, 256), Some(70));
        assert_eq!(zero_run(&b, 70, 10, 256), 3);
        assert_eq!(find_zero(&b, 73, 256), None);
        let z = vec![0u8; 32];
        assert_eq!(zero_run(&z, 0, 1000, 256), 256);
        assert_eq!(zero_run(&z, 3, 100, 256), 100);
    }
}

#[cfg(test)]
mod image_tests {
    use crate::fs::{Fs, MountOptions};
    use std::process::Command;

    fn mkimg(tag: &str, size: &str, extra: &[&str]) -> std::path::PathBuf {
        let p = std::path::PathBuf::from(format!(
            "/dev/shm/uext4-balloc-{tag}-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        let st = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .args(extra)
            .arg(&p)
            .arg(size)
            .status()
            .unwrap();
        assert!(st.success());
        p
    }

    fn fsck(p: &std::path::Path) {
        let out = Command::new("e2fsck").arg("-fn").arg(p).output().unwrap();
        assert!(
            out.status.success(),
            "e2fsck: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// Opens a test image with no timed commits: transactions commit when the test says.
    fn open(p: &std::path::Path) -> std::sync::Arc<Fs> {
        Fs::open_path(
            p,
            MountOptions {
                commit_interval_secs: 0,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// Two groups build their first block bitmaps at once, each under its own lock (as
    /// alloc_inode and the allocator do): neither may wait for the other's lock. If a
    /// builder took every other group's lock to read where their tables are, two such
    /// builders would wait for each other.
    #[test]
    fn first_bitmaps_build_under_their_own_locks_only() {
        let p = mkimg("initlock", "256M", &["-b", "1024"]);
        let fs = open(&p);
        let uninit: Vec<u32> = (0..fs.geo.group_count)
            .filter(|&g| fs.uninit_block_bitmap(&fs.balloc.groups[g as usize].lock()))
            .collect();
        assert!(uninit.len() >= 2, "groups with BLOCK_UNINIT: {uninit:?}");
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        for g in [uninit[0], uninit[uninit.len() - 1]] {
            let (fs, both, tx) = (fs.clone(), both.clone(), tx.clone());
            std::thread::spawn(move || {
                let _own = fs.balloc.groups[g as usize].lock();
                both.wait();
                let mut data = vec![0u8; fs.geo.block_size as usize];
                fs.init_block_bitmap(g, &mut data);
                // Both hold their locks until both have built.
                both.wait();
                tx.send(()).unwrap();
            });
        }
        for _ in 0..2 {
            rx.recv_timeout(std::time::Duration::from_secs(20))
                .expect("a group waited for another group's lock");
        }
        drop(fs);
        let _ = std::fs::remove_file(&p);
    }

    /// Allocates across groups (including never-used BLOCK_UNINIT groups, whose bitmaps must be
    /// built exactly as e2fsck expects), frees everything, and checks the image and counts.
    fn alloc_free_roundtrip(extra: &[&str]) {
        let p = mkimg(&extra.join("").replace(['^', ',', '-'], ""), "600M", extra);
        let fs = open(&p);
        let before = fs.statfs();
        let mut got = Vec::new();
        {
            let mut h = fs.start(64).unwrap();
            for (i, want) in [1u32, 7, 100, 5000, 40000, 3].iter().enumerate() {
                let g = (i as u32 * 3) % fs.geo.group_count;
                let goal = fs.geo.group_first_block(g) + 10;
                let (s, n) = fs.alloc_blocks(&mut h, goal, *want, None).unwrap();
                assert!(n >= 1 && n <= *want);
                for b in s..s + n as u64 {
                    assert!(fs.block_in_use(b).unwrap());
                }
                for &(s2, n2) in &got {
                    let (s2, n2): (u64, u32) = (s2, n2);
                    assert!(
                        s + n as u64 <= s2 || s2 + n2 as u64 <= s,
                        "overlapping allocations"
                    );
                }
                got.push((s, n));
            }
            let ino = fs
                .alloc_inode(&mut h, 2, false, fs.new_raw_inode())
                .unwrap()
                .ino;
            let dir = fs
                .alloc_inode(&mut h, 2, true, fs.new_raw_inode())
                .unwrap()
                .ino;
            fs.free_inode(&mut h, ino, false).unwrap();
            fs.free_inode(&mut h, dir, true).unwrap();
            for &(s, n) in &got {
                fs.free_blocks(&mut h, s, n as u64, false).unwrap();
            }
        }
        fs.commit().unwrap();
        let after = fs.statfs();
        assert_eq!(before.blocks_free, after.blocks_free);
        assert_eq!(before.files_free, after.files_free);
        // Blocks freed by a committed transaction are reusable again.
        {
            let mut h = fs.start(8).unwrap();
            let (s, n) = fs.alloc_blocks(&mut h, got[0].0, 1, None).unwrap();
            fs.free_blocks(&mut h, s, n as u64, false).unwrap();
        }
        fs.unmount().unwrap();
        fsck(&p);
        let _ = std::fs::remove_file(&p);
    }

    /// Blocks freed by a transaction that is not home yet are skipped whole, and the free
    /// blocks before them are still used.
    #[test]
    fn uncommitted_frees_are_not_reused() {
        let p = mkimg("pending", "600M", &["-b", "4096"]);
        let fs = open(&p);
        let goal = fs.geo.group_first_block(1) + 10;
        let (pa, qa, ra) = {
            let mut h = fs.start(16).unwrap();
            let pa = fs.alloc_blocks(&mut h, goal, 100, None).unwrap();
            let qa = fs.alloc_blocks(&mut h, pa.0 + 100, 20_000, None).unwrap();
            let ra = fs
                .alloc_blocks(&mut h, qa.0 + qa.1 as u64, 100, None)
                .unwrap();
            (pa, qa, ra)
        };
        assert_eq!(
            (pa.1, qa.0, qa.1, ra.0),
            (100, pa.0 + 100, 20_000, qa.0 + 20_000)
        );
        {
            let mut h = fs.start(16).unwrap();
            fs.free_blocks(&mut h, pa.0, 100, false).unwrap();
        }
        fs.sync().unwrap();
        // Q is freed but stays uncommitted: P (home) is free before it, R in use after it.
        let mut h = fs.start(16).unwrap();
        fs.free_blocks(&mut h, qa.0, qa.1 as u64, false).unwrap();
        let overlaps_q = |(s, n): (u64, u32)| s < qa.0 + qa.1 as u64 && qa.0 < s + n as u64;
        // Blocks still held at the end (freed before unmount so that e2fsck finds no leak).
        let mut held = vec![ra];
        // The free run before Q is used, up to where Q begins ...
        let got = fs.alloc_blocks(&mut h, pa.0, 100, None).unwrap();
        assert_eq!(got, (pa.0, 100));
        held.push(got);
        // ... and a larger one is found past Q.
        let got = fs.alloc_blocks(&mut h, pa.0, 300, None).unwrap();
        assert!(!overlaps_q(got), "{got:?} reuses uncommitted frees {qa:?}");
        assert_eq!(got.1, 300);
        held.push(got);
        for _ in 0..50 {
            let got = fs.alloc_blocks(&mut h, qa.0 + 5, 64, None).unwrap();
            assert!(!overlaps_q(got), "{got:?} reuses uncommitted frees {qa:?}");
            held.push(got);
        }
        drop(h);
        fs.sync().unwrap();
        // Home now: Q's blocks may be reused.
        let mut h = fs.start(16).unwrap();
        let got = fs.alloc_blocks(&mut h, qa.0, 64, None).unwrap();
        assert_eq!(got, (qa.0, 64));
        held.push(got);
        for (s, n) in held {
            fs.free_blocks(&mut h, s, n as u64, false).unwrap();
        }
        drop(h);
        fs.unmount().unwrap();
        fsck(&p);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn alloc_free_roundtrip_default() {
        alloc_free_roundtrip(&["-b", "4096"]);
    }

    #[test]
    fn alloc_free_roundtrip_1k_uninit_bg() {
        alloc_free_roundtrip(&["-b", "1024", "-O", "^metadata_csum,uninit_bg"]);
    }

    /// sparse_super2: superblock and GDT copies only in the groups s_backup_bgs names (here 1
    /// and the last), so groups 3 and 9, which sparse_super would give copies, have none and
    /// their first bitmaps must not reserve room for them.
    #[test]
    fn alloc_free_roundtrip_1k_sparse_super2() {
        alloc_free_roundtrip(&["-b", "1024", "-O", "sparse_super2"]);
    }

    #[test]
    fn alloc_free_roundtrip_no_flex_no_64bit() {
        alloc_free_roundtrip(&[
            "-b",
            "4096",
            "-O",
            "^flex_bg,^64bit,^metadata_csum,^uninit_bg",
        ]);
    }
}
