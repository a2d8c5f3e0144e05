//! FITRIM: discarding the free blocks of a range (the kernel's ext4_trim_fs in mballoc.c),
//! so that an image file gives their space back to the filesystem under it and a block
//! device learns they are unused. Each group's free runs are found in its block bitmap and
//! discarded while the group's lock is held, so no allocation takes a block meanwhile;
//! blocks freed by transactions not yet home are left alone (a crash before then would
//! still need their contents).

use crate::balloc::{test_bit, zero_run};
use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::format::group_desc::{GdCsum, BG_BLOCK_UNINIT};
use crate::fs::Fs;
use std::sync::atomic::Ordering;

impl Fs {
    /// FITRIM for `cred`: EPERM unless privileged (CAP_SYS_ADMIN); else [`Fs::trim`].
    pub fn trim_as(&self, cred: &Cred, start: u64, len: u64, minlen: u64) -> Result<u64> {
        if !cred.privileged {
            return Err(Error::Perm);
        }
        self.trim(start, len, minlen)
    }

    /// Discards every run of free blocks of at least `minlen` bytes inside bytes
    /// `[start, start + len)` of the filesystem; the bytes discarded (what FITRIM returns in
    /// `range.len`). EINVAL as the kernel's: `len` under a block, `start` past the end, or
    /// `minlen` over a group. A device that cannot discard leaves nothing discarded: 0.
    pub fn trim(&self, start: u64, len: u64, minlen: u64) -> Result<u64> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        let geo = &self.geo;
        let bs = geo.block_size as u64;
        let first = start / bs;
        let minlen = (minlen / bs).max(1);
        if minlen > geo.blocks_per_group as u64 || first >= geo.blocks_count || len < bs {
            return Err(Error::Invalid(format!(
                "FITRIM of {len} bytes at {start} (at least {minlen} blocks at a time) on a \
                 filesystem of {} blocks of {bs} bytes",
                geo.blocks_count
            )));
        }
        let last = (first + len / bs - 1).min(geo.blocks_count - 1);
        if last <= geo.first_data_block {
            return Ok(0);
        }
        let first = first.max(geo.first_data_block);
        let mut trimmed = 0;
        for g in geo.block_group(first)..=geo.block_group(last) {
            let base = geo.group_first_block(g);
            let lo = (first.max(base) - base) as usize;
            let hi = (last + 1).min(base + geo.blocks_in_group(g) as u64) - base;
            trimmed += self.trim_group(g, lo, hi as usize, minlen as usize)?;
        }
        Ok(trimmed * bs)
    }

    /// Discards the free runs of at least `minlen` blocks between offsets `lo` and `hi` of
    /// group `g`; how many blocks.
    fn trim_group(&self, g: u32, lo: usize, hi: usize, minlen: usize) -> Result<u64> {
        let geo = &self.geo;
        let st = self.balloc.groups[g as usize].lock();
        if st.desc.free_blocks_count() < minlen as u64 {
            return Ok(0);
        }
        // A group never used has no bitmap on disk yet: its bitmap is what it would be built
        // as, and building it here would dirty it with no handle to log it.
        let uninit = !matches!(geo.gd_csum, GdCsum::None) && st.desc.flags() & BG_BLOCK_UNINIT != 0;
        let bitmap = if uninit {
            let mut data = vec![0u8; geo.block_size as usize];
            self.init_block_bitmap(g, &mut data);
            data
        } else {
            self.read_block_bitmap(g, &st)?.read().to_vec()
        };
        let base = geo.group_first_block(g);
        let bs = geo.block_size as u64;
        let mut done = 0;
        let mut i = lo;
        while i < hi {
            if test_bit(&bitmap, i) {
                i += 1;
                continue;
            }
            let n = zero_run(&bitmap, i, hi - i, hi);
            let (mut at, end) = (base + i as u64, base + (i + n) as u64);
            i += n;
            // Pieces between the ranges held back for transactions not yet home.
            while at < end {
                let (upto, next) = match self.balloc.pending_overlap(at, end - at) {
                    Some((s, e)) => (s.max(at), e.min(end)),
                    None => (end, end),
                };
                if upto - at >= minlen as u64 && self.dev.discard(at * bs, (upto - at) * bs)? {
                    done += upto - at;
                }
                at = next.max(upto);
            }
        }
        Ok(done)
    }
}
