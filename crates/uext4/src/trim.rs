//! FITRIM (fstrim): telling the device which blocks hold nothing, as the kernel's
//! ext4_trim_fs does, so that an image file gets holes where the filesystem's free blocks are
//! (and shrinks on its host) and an NBD server may drop their storage (`NBD_CMD_TRIM`).
//!
//! Each group is trimmed under its allocation lock, so no block is handed out while its range
//! is being discarded. Free means free in the bitmap and not freed by a transaction that is not
//! yet home (the allocator's pending frees): after a crash those blocks may still belong to
//! their file, so their contents stay.

use crate::balloc::{find_zero, zero_run};
use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::fs::Fs;

/// What [`Fs::trim`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Bytes the device was told it may drop.
    pub bytes: u64,
    /// Whether the device takes discards at all (false: nothing was done).
    pub supported: bool,
}

impl Fs {
    /// FITRIM as the kernel's ext4 answers it, for `cred`: EPERM without privilege
    /// (CAP_SYS_ADMIN), EINVAL for a range shorter than a block, starting past the end or a
    /// minimum longer than a group, EOPNOTSUPP where the device takes no discards; else the
    /// bytes discarded (what FITRIM writes back into `fstrim_range.len`).
    pub fn trim_as(&self, cred: &Cred, start: u64, len: u64, min_len: u64) -> Result<u64> {
        if !cred.privileged {
            return Err(Error::Perm);
        }
        let bs = self.geo.block_size as u64;
        if len < bs
            || start / bs >= self.geo.blocks_count
            || min_len / bs > self.geo.blocks_per_group as u64
        {
            return Err(Error::Invalid(
                "FITRIM: range shorter than a block, past the end, or minimum over a group".into(),
            ));
        }
        let t = self.trim(start, len, min_len)?;
        if !t.supported {
            return Err(Error::NotSupported(
                "the storage under the image takes no discards".into(),
            ));
        }
        Ok(t.bytes)
    }

    /// Discards the free blocks in the byte range `start..start + len` of the filesystem, in
    /// free runs of at least `min_len` bytes (FITRIM's `struct fstrim_range`). Needs a
    /// writable filesystem.
    pub fn trim(&self, start: u64, len: u64, min_len: u64) -> Result<Trimmed> {
        self.check_writable()?;
        let geo = &self.geo;
        let bs = geo.block_size as u64;
        let first = (start / bs).max(geo.first_data_block);
        let end = start.saturating_add(len).div_ceil(bs).min(geo.blocks_count);
        let min_blocks = min_len.div_ceil(bs).max(1) as usize;
        let mut done = Trimmed {
            bytes: 0,
            supported: true,
        };
        if first >= end {
            return Ok(done);
        }
        // Bitmap bits are clusters with bigalloc: only whole free clusters inside the range
        // are discarded.
        let (cb, ratio) = (geo.cluster_bits, geo.cluster_ratio() as u64);
        for g in geo.block_group(first)..=geo.block_group(end - 1) {
            let gfirst = geo.group_first_block(g);
            let n = geo.blocks_in_group(g) as u64;
            let from = (first.max(gfirst) - gfirst).div_ceil(ratio) as usize;
            let to = ((end.min(gfirst + n) - gfirst) >> cb) as usize;
            if from >= to {
                continue;
            }
            let st = self.balloc.groups[g as usize].lock();
            let bitmap = if self.uninit_block_bitmap(&st) {
                let mut data = vec![0u8; bs as usize];
                self.init_block_bitmap(g, &mut data);
                data
            } else {
                self.read_block_bitmap(g, &st)?.read().to_vec()
            };
            let mut pos = from;
            while let Some(z) = find_zero(&bitmap, pos, to) {
                let run = zero_run(&bitmap, z, to - z, to);
                pos = z + run.max(1);
                let mut at = gfirst + ((z as u64) << cb);
                let run_end = at + ((run as u64) << cb);
                // Split the run around blocks freed by transactions not yet home.
                while at < run_end {
                    match self.balloc.pending_overlap(at, run_end - at) {
                        // Held back from `at`: skip past it (it overlaps `at`, so it ends later).
                        Some((s, e)) if s <= at => at = e.min(run_end),
                        next => {
                            let piece_end = next.map_or(run_end, |(s, _)| s);
                            if piece_end - at >= min_blocks as u64 {
                                if !self.dev.discard(at * bs, (piece_end - at) * bs)? {
                                    done.supported = false;
                                    return Ok(done);
                                }
                                done.bytes += (piece_end - at) * bs;
                            }
                            at = piece_end;
                        }
                    }
                }
            }
            drop(st);
        }
        Ok(done)
    }
}
