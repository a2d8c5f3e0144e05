//! The inode allocator. New directories are spread over groups with free space (a simple form of
//! the kernel's Orlov allocator); other inodes go near their parent directory.

use crate::balloc::{clear_bit, find_zero, set_bit, test_bit};
use crate::bcache::Buffer;
use crate::error::{Corruption, Error, Result};
use crate::format::group_desc::{GdCsum, BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use crate::fs::Fs;
use crate::mballoc::GroupState;
use crate::transaction::Handle;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Fs {
    fn has_gd_csum(&self) -> bool {
        !matches!(self.geo.gd_csum, GdCsum::None)
    }

    /// A group's inode bitmap (initialised if it was never used). Caller holds the group lock.
    fn inode_bitmap(&self, h: &mut Handle<'_>, g: u32, st: &mut GroupState) -> Result<Arc<Buffer>> {
        let blk = st.desc.inode_bitmap();
        if self.has_gd_csum() && st.desc.flags() & BG_INODE_UNINIT != 0 {
            let buf = self.bcache.get_new(blk)?;
            {
                let mut data = buf.write();
                for i in self.geo.inodes_per_group as usize..data.len() * 8 {
                    set_bit(&mut data, i);
                }
                let v = st.desc.flags() & !BG_INODE_UNINIT;
                st.desc.set_flags(v);
                if self.geo.metadata_csum {
                    st.desc.set_inode_bitmap_csum(
                        self.geo.csum_seed,
                        &data[..self.geo.inode_bitmap_csum_len()],
                    );
                }
            }
            h.dirty(&buf);
            return Ok(buf);
        }
        self.read_inode_bitmap(g, st)
    }

    pub(crate) fn read_inode_bitmap(&self, g: u32, st: &GroupState) -> Result<Arc<Buffer>> {
        let blk = st.desc.inode_bitmap();
        let buf = self.bcache.get(blk)?;
        if self.geo.metadata_csum && !buf.dirty.load(Ordering::Acquire) {
            let data = buf.read();
            if !st.desc.verify_inode_bitmap_csum(
                self.geo.csum_seed,
                &data[..self.geo.inode_bitmap_csum_len()],
            ) {
                drop(data);
                return Err(self.fail(
                    Error::bad_checksum(
                        Corruption::InodeBitmap,
                        format!("inode bitmap of group {g} (block {blk})"),
                    ),
                    0,
                    blk,
                    "read_inode_bitmap",
                ));
            }
        }
        Ok(buf)
    }

    /// Picks groups to try, in order, for a new inode.
    fn inode_group_order(&self, parent_group: u32, is_dir: bool) -> Vec<u32> {
        let n = self.geo.group_count;
        let first = if is_dir && n > 1 {
            // Spread directories: start at a rotating group with at least average free inodes
            // and blocks.
            let avg_i = self.sb.free_inodes.load(Ordering::Relaxed) / n as u64;
            let avg_b = self.sb.free_blocks.load(Ordering::Relaxed) / n as u64;
            let start = self.balloc.dir_rotor.fetch_add(1, Ordering::Relaxed) as u32 % n;
            (0..n)
                .map(|i| (start + i) % n)
                .find(|&g| {
                    let d = &self.balloc.groups[g as usize].lock().desc;
                    d.free_inodes_count() >= avg_i.max(1) && d.free_blocks_count() >= avg_b
                })
                .unwrap_or(parent_group)
        } else {
            parent_group
        };
        (0..n).map(|i| (first + i) % n).collect()
    }

    /// Allocates an inode number and caches an in-memory inode for it with the fields `raw`,
    /// marked `creating` (iget answers "no such file" for it until the caller has written it
    /// and cleared the mark). `parent` is the directory it will live in.
    ///
    /// The bit is set and the inode cached in one hold of the group's lock, and free_inode
    /// clears the bit and uncaches in one hold, while iget checks the bit and caches in one:
    /// so a thread holding a stale number (looked up before the inode was freed) never caches
    /// the old contents over a new inode, nor reads a new one half made.
    pub(crate) fn alloc_inode(
        &self,
        h: &mut Handle<'_>,
        parent: u32,
        is_dir: bool,
        raw: crate::format::inode::RawInode,
    ) -> Result<crate::inode::InodeRef> {
        self.check_writable()?;
        self.quota_allow_inode(&raw)?;
        let ipg = self.geo.inodes_per_group as usize;
        let parent_group = self.geo.ino_group(parent.max(1));
        for g in self.inode_group_order(parent_group, is_dir) {
            let mut st = self.balloc.groups[g as usize].lock();
            if st.desc.free_inodes_count() == 0 {
                continue;
            }
            let buf = self.inode_bitmap(h, g, &mut st)?;
            let first = if g == 0 {
                self.geo.first_ino as usize - 1
            } else {
                0
            };
            let found = {
                let data = buf.read();
                let pinned = self.pinned.lock();
                let mut at = first;
                loop {
                    match find_zero(&data, at, ipg) {
                        Some(i) if pinned.contains(&(g * ipg as u32 + i as u32 + 1)) => at = i + 1,
                        other => break other,
                    }
                }
            };
            let Some(idx) = found else {
                continue;
            };
            {
                let mut data = buf.write();
                debug_assert!(!test_bit(&data, idx));
                set_bit(&mut data, idx);
                if self.geo.metadata_csum {
                    st.desc.set_inode_bitmap_csum(
                        self.geo.csum_seed,
                        &data[..self.geo.inode_bitmap_csum_len()],
                    );
                }
            }
            h.dirty(&buf);
            if self.has_gd_csum() {
                if st.desc.flags() & BG_BLOCK_UNINIT != 0 {
                    // The kernel initialises a group's block bitmap when it first puts an inode there.
                    let bb = st.desc.block_bitmap();
                    let bbuf = self.bcache.get_new(bb)?;
                    {
                        let mut data = bbuf.write();
                        self.init_block_bitmap(g, &mut data);
                        if self.geo.metadata_csum {
                            st.desc.set_block_bitmap_csum(
                                self.geo.csum_seed,
                                &data[..self.geo.block_bitmap_csum_len()],
                            );
                        }
                    }
                    let v = st.desc.flags() & !BG_BLOCK_UNINIT;
                    st.desc.set_flags(v);
                    h.dirty(&bbuf);
                }
                let unused = st.desc.itable_unused() as usize;
                if idx >= ipg - unused {
                    st.desc.set_itable_unused((ipg - idx - 1) as u64);
                }
            }
            let v = st.desc.free_inodes_count() - 1;
            st.desc.set_free_inodes_count(v);
            if is_dir {
                let v = st.desc.used_dirs_count() + 1;
                st.desc.set_used_dirs_count(v);
            }
            self.write_group_desc(h, g, &mut st)?;
            self.sb.free_inodes.fetch_sub(1, Ordering::Relaxed);
            let ino = g * ipg as u32 + idx as u32 + 1;
            // Nothing is mapped yet; without the extents flag (a filesystem without the
            // extents feature) blocks will go into an indirect block map.
            let extents = Some(crate::extent_cache::ExtentCache::unmapped(&raw));
            let inode = crate::inode::new_inode(ino, raw, extents, true);
            let committed = self.txn.committed.load(Ordering::Acquire);
            self.icache.insert(inode.clone(), committed);
            return Ok(inode);
        }
        Err(Error::NoInodes)
    }

    /// Marks inode `ino` free in its bitmap and group counts and drops it from the inode cache
    /// (the caller has marked it deleted).
    pub(crate) fn free_inode(&self, h: &mut Handle<'_>, ino: u32, was_dir: bool) -> Result<()> {
        let g = self.geo.ino_group(ino);
        let idx = ((ino - 1) % self.geo.inodes_per_group) as usize;
        let mut st = self.balloc.groups[g as usize].lock();
        let buf = self.inode_bitmap(h, g, &mut st)?;
        {
            let mut data = buf.write();
            if !test_bit(&data, idx) {
                drop(data);
                return Err(self.fail(
                    Error::corrupt(
                        Corruption::InodeBitmap,
                        format!("freeing inode {ino}, which is already free"),
                    ),
                    ino,
                    0,
                    "free_inode",
                ));
            }
            clear_bit(&mut data, idx);
            if self.geo.metadata_csum {
                st.desc.set_inode_bitmap_csum(
                    self.geo.csum_seed,
                    &data[..self.geo.inode_bitmap_csum_len()],
                );
            }
        }
        h.dirty(&buf);
        let v = st.desc.free_inodes_count() + 1;
        st.desc.set_free_inodes_count(v);
        if was_dir {
            let v = st.desc.used_dirs_count().saturating_sub(1);
            st.desc.set_used_dirs_count(v);
        }
        self.write_group_desc(h, g, &mut st)?;
        self.icache.remove(ino);
        drop(st);
        self.sb.free_inodes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sets (`used`) or clears inode `ino`'s bit whatever its state, keeping the group's
    /// free and directory counts and its unused-table mark right (only a change counts): the
    /// kernel's ext4_mark_inode_used, which fast-commit replay uses for the inodes it writes.
    /// Returns whether the bit changed.
    pub(crate) fn mark_inode(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        is_dir: bool,
        used: bool,
    ) -> Result<bool> {
        self.inode_location(ino)?;
        let ipg = self.geo.inodes_per_group as usize;
        let g = self.geo.ino_group(ino);
        let idx = ((ino - 1) % self.geo.inodes_per_group) as usize;
        let mut st = self.balloc.groups[g as usize].lock();
        let buf = self.inode_bitmap(h, g, &mut st)?;
        {
            let mut data = buf.write();
            if test_bit(&data, idx) == used {
                return Ok(false);
            }
            if used {
                set_bit(&mut data, idx);
            } else {
                clear_bit(&mut data, idx);
            }
            if self.geo.metadata_csum {
                st.desc.set_inode_bitmap_csum(
                    self.geo.csum_seed,
                    &data[..self.geo.inode_bitmap_csum_len()],
                );
            }
        }
        h.dirty(&buf);
        if used && self.has_gd_csum() {
            let unused = st.desc.itable_unused() as usize;
            if idx >= ipg - unused {
                st.desc.set_itable_unused((ipg - idx - 1) as u64);
            }
        }
        let (free, dirs) = (st.desc.free_inodes_count(), st.desc.used_dirs_count());
        if used {
            st.desc.set_free_inodes_count(free - 1);
            st.desc.set_used_dirs_count(dirs + is_dir as u64);
            self.sb.free_inodes.fetch_sub(1, Ordering::Relaxed);
        } else {
            st.desc.set_free_inodes_count(free + 1);
            st.desc
                .set_used_dirs_count(dirs.saturating_sub(is_dir as u64));
            self.sb.free_inodes.fetch_add(1, Ordering::Relaxed);
        }
        self.write_group_desc(h, g, &mut st)?;
        Ok(true)
    }

    /// Whether inode `ino` is marked in use (for checks and tests).
    pub fn inode_in_use(&self, ino: u32) -> Result<bool> {
        let g = self.geo.ino_group(ino);
        let st = self.balloc.groups[g as usize].lock();
        self.inode_bit(&st, ino)
    }

    /// Whether inode `ino`'s bit is set, with its group's lock held (`st`).
    pub(crate) fn inode_bit(&self, st: &GroupState, ino: u32) -> Result<bool> {
        if self.has_gd_csum() && st.desc.flags() & BG_INODE_UNINIT != 0 {
            return Ok(false);
        }
        let buf = self.read_inode_bitmap(self.geo.ino_group(ino), st)?;
        let r = test_bit(
            &buf.read(),
            ((ino - 1) % self.geo.inodes_per_group) as usize,
        );
        Ok(r)
    }
}
