//! The orphan list: inodes unlinked while open (and, after a crash, truncates in flight) are
//! chained from the superblock's s_last_orphan through their i_dtime, as the kernel does, so
//! that the next open after a crash frees them.
//!
//! The chain's order lives in memory (`Fs::orphans`, head first); an orphan's on-disk i_dtime is
//! set from it whenever the inode is written (`Fs::orphan_next`), and removing an orphan
//! rewrites its predecessor's i_dtime directly in the inode-table block, so no inode lock is
//! ever taken while another is held.

use crate::bcache::Buffer;
use crate::error::{Corruption, Error, Result};
use crate::format::inode::RawInode;
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::Handle;
use std::sync::Arc;

impl Fs {
    /// Puts an inode (whose state the caller holds) at the head of the orphan list.
    pub(crate) fn orphan_add(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        st: &mut InodeState,
    ) -> Result<()> {
        {
            let mut o = self.orphans.lock();
            o.insert(0, inode.ino);
            self.sb.lock().set_last_orphan(inode.ino);
        }
        st.orphaned = true;
        self.write_superblock_to_buffer(h)?;
        Ok(())
    }

    /// The on-disk i_dtime of an orphan: the next inode in the chain.
    pub(crate) fn orphan_next(&self, ino: u32) -> u32 {
        let o = self.orphans.lock();
        match o.iter().position(|&i| i == ino) {
            Some(p) => o.get(p + 1).copied().unwrap_or(0),
            None => 0,
        }
    }

    /// Takes an inode off the orphan list.
    pub(crate) fn orphan_del(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        st: &mut InodeState,
    ) -> Result<()> {
        let pred = {
            let mut o = self.orphans.lock();
            let Some(p) = o.iter().position(|&i| i == inode.ino) else {
                st.orphaned = false;
                return Ok(());
            };
            o.remove(p);
            if p == 0 {
                self.sb
                    .lock()
                    .set_last_orphan(o.first().copied().unwrap_or(0));
                None
            } else {
                Some(o[p - 1])
            }
        };
        st.orphaned = false;
        st.raw.set_dtime(0);
        match pred {
            None => self.write_superblock_to_buffer(h)?,
            Some(p) => {
                if let Some(buf) = self.link_past_removed(p)? {
                    h.dirty(&buf);
                }
                // A write of the predecessor racing with this (its `orphan_next` read before
                // the removal, its copy into the table after ours) would leave it naming the
                // removed inode: the commit writes it again with the chain as it is then.
                self.txn.dirty_inode_lazily(p);
            }
        }
        Ok(())
    }

    /// After an orphan's removal: rewrites the i_dtime of `pred`, the orphan that was before
    /// it, in its inode-table block to name the orphan after it now. Under the list's lock,
    /// so that of two removals of neighbours the later write carries the chain as it then is,
    /// and a predecessor that has meanwhile left the list (and may be freed, its i_dtime the
    /// time of deletion) is not written at all. Returns the block to dirty.
    fn link_past_removed(&self, pred: u32) -> Result<Option<Arc<Buffer>>> {
        let (blk, off) = self.inode_location(pred)?;
        let buf = self.bcache.get(blk)?;
        let o = self.orphans.lock();
        let Some(pos) = o.iter().position(|&i| i == pred) else {
            return Ok(None);
        };
        let next = o.get(pos + 1).copied().unwrap_or(0);
        self.set_dtime_in_block(&buf, off, pred, next);
        drop(o);
        Ok(Some(buf))
    }

    /// Rewrites one inode's i_dtime (and checksum) in its inode-table block.
    fn set_dtime_in_block(&self, buf: &Buffer, off: usize, ino: u32, dtime: u32) {
        {
            let mut data = buf.write();
            let size = self.geo.inode_size as usize;
            let mut raw = RawInode(data[off..off + size].to_vec());
            raw.set_dtime(dtime);
            if self.geo.metadata_csum {
                raw.set_csum(self.geo.csum_seed, ino);
            }
            data[off..off + size].copy_from_slice(&raw.0);
        }
    }

    /// After a crash with the orphan_file feature: processes the inodes listed in the orphan
    /// file (an array of le32 inode numbers per block, ending in an 8-byte tail: magic
    /// 0x0b10ca04 and a checksum), empties it, and clears RO_COMPAT_ORPHAN_PRESENT.
    fn process_orphan_file(&self) -> Result<u32> {
        use crate::format::features::RO_COMPAT_ORPHAN_PRESENT;
        let (ino, present) = {
            let sb = self.sb.lock();
            (
                sb.orphan_file_inum(),
                sb.has_ro_compat(RO_COMPAT_ORPHAN_PRESENT),
            )
        };
        if ino == 0 || !present {
            return Ok(0);
        }
        let of = self.iget(ino)?;
        let bs = self.geo.block_size as u64;
        let (nblocks, gen) = {
            let st = of.state.lock();
            (st.raw.size() / bs, st.raw.generation())
        };
        let per_block = (bs as usize - 8) / 4;
        let mut done = 0;
        for lblk in 0..nblocks.min(1 << 16) {
            let m = {
                let mut st = of.state.lock();
                self.ext_map(ino, &mut st, lblk as u32)?
            };
            let Some(e) = m else { continue };
            let pblk = e.pblk + (lblk - e.lblk as u64);
            let buf = self.bcache.get(pblk)?;
            let entries: Vec<(usize, u32)> = {
                let d = buf.read();
                (0..per_block)
                    .map(|i| (i, crate::format::le32(&d, 4 * i)))
                    .filter(|&(_, x)| x != 0)
                    .collect()
            };
            let slot_file = OrphanFileBlock {
                ino,
                gen,
                pblk,
                buf: &buf,
            };
            for (slot, victim) in entries {
                self.finish_orphan(victim, Some((&slot_file, slot)))?;
                done += 1;
            }
        }
        {
            let mut sb = self.sb.lock();
            let f = sb.feature_ro_compat() & !RO_COMPAT_ORPHAN_PRESENT;
            sb.set_feature_ro_compat(f);
        }
        Ok(done)
    }

    /// Finishes one orphan after a crash: deletes it if it has no links, else cuts its blocks
    /// past i_size (a truncate or extension that was in flight). `slot`: where the orphan
    /// file lists it, cleared in the same handle as its last change (a large removal goes in
    /// pieces, a transaction each: listed after it was freed, a crash would leave the next
    /// open, e2fsck and the kernel an entry naming a free inode). None: it is on the
    /// s_last_orphan chain, whose order `process_orphans` put in `Fs::orphans`, so every
    /// write of it keeps its place in the chain and the last one takes it out.
    fn finish_orphan(&self, ino: u32, slot: Option<(&OrphanFileBlock, usize)>) -> Result<()> {
        let in_chain = slot.is_none();
        if ino == 0 || ino > self.geo.inodes_count {
            return Err(Error::corrupt(
                Corruption::Orphan,
                format!("orphan inode number {ino} is out of range"),
            ));
        }
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        let bs = self.geo.block_size as u64;
        let keep = {
            let mut st = inode.state.lock();
            st.orphaned = in_chain;
            if st.raw.links_count() == 0 {
                0
            } else {
                st.raw.size().div_ceil(bs).min(1 << 32)
            }
        };
        if keep < 1 << 32 {
            self.remove_in_pieces(&inode, keep as u32, 1 << 32)?;
        }
        let mut h = self.start(crate::transaction::credits::UNLINK)?;
        let mut st = inode.state.lock();
        if !in_chain {
            st.raw.set_dtime(0);
        }
        if let Some((file, slot)) = slot {
            file.clear(self, &mut h, slot);
        }
        if st.raw.links_count() == 0 {
            self.delete_inode(&mut h, &inode, &mut st)
        } else {
            if Self::has_data_blocks(&st.raw) && keep < 1 << 32 {
                self.ext_remove(&mut h, ino, &mut st, keep as u32, 1u64 << 32)?;
                // As the kernel's truncate: the rest of the last block reads as zeros.
                let size = st.raw.size();
                self.zero_partial(ino, &mut st, size, keep * bs)?;
            }
            if st.orphaned {
                self.orphan_del(&mut h, &inode, &mut st)?;
            }
            self.mark_inode_dirty(&mut h, &inode, &mut st)
        }
    }

    /// Frees an unlinked inode that nobody has open (at its last close, or after the handle
    /// that dropped its last link found it too large to free inside it): its blocks in
    /// pieces, each its own transaction, then the inode in a last handle. It stays on the
    /// orphan list until then, so a crash in between leaves it for the next open to free.
    pub(crate) fn delete_orphan(&self, inode: &Inode) -> Result<()> {
        let _g = inode.io_lock.write();
        let unused = |st: &InodeState| {
            st.orphaned && !st.deleted && st.raw.links_count() == 0 && !self.held(inode)
        };
        {
            // In the same hold as the check: an open (which counts itself, then looks at
            // `dying` under this lock) either came first and keeps the inode, or backs out.
            let mut st = inode.state.lock();
            if !unused(&st) {
                return Ok(());
            }
            st.dying = true;
        }
        self.remove_in_pieces(inode, 0, 1 << 32)?;
        let mut h = self.start(crate::transaction::credits::UNLINK)?;
        let mut st = inode.state.lock();
        self.fc_track_forget(&mut h, &st);
        self.delete_inode(&mut h, inode, &mut st)
    }

    /// A front end no longer refers to `ino` (after [`Fs::pin_ino`]`(ino, false)`): an
    /// unlinked inode that its pin kept alive is freed now, unless it is open or pinned
    /// again meanwhile. Call it after the unpin, outside the caller's own locks: it may
    /// free the inode's blocks.
    ///
    /// # Errors
    /// What freeing reports; the inode then stays on the orphan list, which the next open
    /// of the filesystem frees.
    pub fn forgotten(&self, ino: u32) -> Result<()> {
        // An orphan is never dropped from the inode cache, so one not cached is none.
        let Some(inode) = self.icache.get_cached(ino) else {
            return Ok(());
        };
        if !inode.state.lock().orphaned || self.is_read_only() {
            return Ok(());
        }
        self.delete_orphan(&inode)
    }

    /// At unmount: files still open are closed, and those unlinked are freed. Nothing can
    /// use them afterwards: a FUSE connection that ended (an unmount aborts it) drops the
    /// RELEASEs it had not yet sent, and a library caller's open inodes die with the
    /// filesystem. Left on the orphan list, they would be freed only by the next open, and
    /// the image would not pass e2fsck until then.
    pub(crate) fn close_orphans(&self) {
        // Nor can a front end ask for anything any more.
        self.pinned.lock().clear();
        let inos: Vec<u32> = self.orphans.lock().clone();
        for ino in inos {
            let Some(inode) = self.icache.get_cached(ino) else {
                continue;
            };
            inode
                .open_count
                .store(0, std::sync::atomic::Ordering::Release);
            if let Err(e) = self.delete_orphan(&inode) {
                tracing::error!(
                    ino,
                    "freeing an unlinked file at unmount: {e} (it stays on the orphan list; \
                     the next open frees it)"
                );
            }
        }
    }

    /// Frees the inodes `drop_link_finish` left on `deferred_deletes`. Called by the public
    /// operations that drop links, after their handle and locks are gone. A failure leaves
    /// the inode on the orphan list (the next open frees it) and does not fail the operation,
    /// whose name change is done.
    pub(crate) fn delete_deferred(&self) {
        loop {
            let Some(ino) = self.deferred_deletes.lock().pop() else {
                return;
            };
            // An orphan is never dropped from the inode cache.
            let Some(inode) = self.icache.get_cached(ino) else {
                continue;
            };
            if let Err(e) = self.delete_orphan(&inode) {
                tracing::error!(
                    ino,
                    "freeing an unlinked file: {e} (it stays on the orphan list; the next \
                     open frees it)"
                );
            }
        }
    }

    /// After a crash: frees every inode on the orphan list (or truncates it to its size when it
    /// still has links), and empties the list. Called once at open, read-write only.
    pub(crate) fn process_orphans(&self) -> Result<u32> {
        // The whole chain first: it becomes the in-memory orphan list, so that each inode
        // keeps its place while it is finished (in pieces, if large) and leaves it cleanly.
        let mut chain = Vec::new();
        let mut ino = self.sb.lock().last_orphan();
        let mut seen = std::collections::HashSet::new();
        while ino != 0 {
            if !seen.insert(ino) || ino > self.geo.inodes_count {
                return Err(Error::corrupt(
                    Corruption::Orphan,
                    format!("orphan list: inode {ino} is out of range or repeats (a cycle)"),
                ));
            }
            chain.push(ino);
            ino = self.read_raw_inode(ino)?.dtime();
        }
        *self.orphans.lock() = chain.clone();
        let mut done = 0u32;
        for ino in chain {
            self.finish_orphan(ino, None)?;
            done += 1;
        }
        done += self.process_orphan_file()?;
        if done > 0 {
            let mut h = self.start(4)?;
            self.write_superblock_to_buffer(&mut h)?;
            drop(h);
            self.commit()?;
        }
        Ok(done)
    }
}

/// One block of the orphan file (inode `ino`, generation `gen`, at `pblk`): an array of le32
/// inode numbers, then an 8-byte tail (magic 0x0b10ca04 and a checksum).
struct OrphanFileBlock<'a> {
    ino: u32,
    gen: u32,
    pblk: u64,
    buf: &'a std::sync::Arc<crate::bcache::Buffer>,
}

impl OrphanFileBlock<'_> {
    /// Clears entry `slot` and the block's checksum with it, in handle `h`.
    fn clear(&self, fs: &Fs, h: &mut Handle<'_>, slot: usize) {
        let bs = fs.geo.block_size as usize;
        let entries = (bs - 8) / 4;
        {
            let mut d = self.buf.write();
            crate::format::put32(&mut d, 4 * slot, 0);
            if fs.geo.metadata_csum {
                let seed = RawInode::csum_seed(fs.geo.csum_seed, self.ino, self.gen);
                let c = crate::format::csum::crc32c(seed, &self.pblk.to_le_bytes());
                let c = crate::format::csum::crc32c(c, &d[..entries * 4]);
                crate::format::put32(&mut d, bs - 4, c);
            }
        }
        h.dirty(self.buf);
    }
}
