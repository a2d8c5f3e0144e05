//! The orphan list: inodes unlinked while open (and, after a crash, truncates in flight) are
//! chained from the superblock's s_last_orphan through their i_dtime, as the kernel does, so
//! that the next open after a crash frees them.
//!
//! The chain's order lives in memory (`Fs::orphans`, head first); an orphan's on-disk i_dtime is
//! set from it whenever the inode is written (`Fs::orphan_next`), and removing an orphan
//! rewrites its predecessor's i_dtime directly in the inode-table block, so no inode lock is
//! ever taken while another is held.

use crate::error::{Error, Result};
use crate::format::inode::RawInode;
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::Handle;

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
        let (pred, next) = {
            let mut o = self.orphans.lock();
            let Some(p) = o.iter().position(|&i| i == inode.ino) else {
                st.orphaned = false;
                return Ok(());
            };
            o.remove(p);
            let next = o.get(p).copied().unwrap_or(0);
            let pred = if p == 0 { None } else { Some(o[p - 1]) };
            if pred.is_none() {
                self.sb.lock().set_last_orphan(next);
            }
            (pred, next)
        };
        st.orphaned = false;
        st.raw.set_dtime(0);
        match pred {
            None => self.write_superblock_to_buffer(h)?,
            Some(p) => {
                self.set_dtime_in_table(h, p, next)?;
                // A write of the predecessor racing with this (its `orphan_next` read before
                // the removal, its copy into the table after ours) would leave it naming the
                // removed inode: the commit writes it again with the chain as it is then.
                self.txn.dirty_inode_lazily(p);
            }
        }
        Ok(())
    }

    /// Rewrites one inode's i_dtime (and checksum) in its inode-table block.
    fn set_dtime_in_table(&self, h: &mut Handle<'_>, ino: u32, dtime: u32) -> Result<()> {
        let (blk, off) = self.inode_location(ino)?;
        let buf = self.bcache.get(blk)?;
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
        h.dirty(&buf);
        Ok(())
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
            let entries: Vec<u32> = {
                let d = buf.read();
                (0..per_block)
                    .map(|i| crate::format::le32(&d, 4 * i))
                    .filter(|&x| x != 0)
                    .collect()
            };
            if entries.is_empty() {
                continue;
            }
            for victim in &entries {
                self.finish_orphan(*victim)?;
                done += 1;
            }
            let mut h = self.start(2)?;
            {
                let mut d = buf.write();
                d[..per_block * 4].fill(0);
                if self.geo.metadata_csum {
                    let seed = RawInode::csum_seed(self.geo.csum_seed, ino, gen);
                    let c = crate::format::csum::crc32c(seed, &pblk.to_le_bytes());
                    let c = crate::format::csum::crc32c(c, &d[..per_block * 4]);
                    crate::format::put32(&mut d, bs as usize - 4, c);
                }
            }
            h.dirty(&buf);
        }
        {
            let mut sb = self.sb.lock();
            let f = sb.feature_ro_compat() & !RO_COMPAT_ORPHAN_PRESENT;
            sb.set_feature_ro_compat(f);
        }
        Ok(done)
    }

    /// Finishes one orphan after a crash: deletes it if it has no links, else cuts its blocks
    /// past i_size (a truncate or extension that was in flight).
    fn finish_orphan(&self, ino: u32) -> Result<()> {
        if ino == 0 || ino > self.geo.inodes_count {
            return Err(Error::corrupt(format!(
                "orphan inode number {ino} is out of range"
            )));
        }
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        let mut h = self.start(crate::namei::credits::UNLINK)?;
        let mut st = inode.state.lock();
        st.raw.set_dtime(0);
        if st.raw.links_count() == 0 {
            self.delete_inode(&mut h, &inode, &mut st)
        } else {
            let size = st.raw.size();
            let bs = self.geo.block_size as u64;
            if Self::has_data_blocks(&st.raw) {
                self.ext_remove(&mut h, ino, &mut st, size.div_ceil(bs) as u32, 1u64 << 32)?;
            }
            self.mark_inode_dirty(&mut h, &inode, &mut st)
        }
    }

    /// After a crash: frees every inode on the orphan list (or truncates it to its size when it
    /// still has links), and empties the list. Called once at open, read-write only.
    pub(crate) fn process_orphans(&self) -> Result<u32> {
        let mut ino = self.sb.lock().last_orphan();
        let mut done = 0u32;
        let mut seen = std::collections::HashSet::new();
        while ino != 0 {
            if !seen.insert(ino) || ino > self.geo.inodes_count {
                return Err(Error::corrupt(format!(
                    "orphan list: inode {ino} is out of range or repeats (a cycle)"
                )));
            }
            let raw = self.read_raw_inode(ino)?;
            let next = raw.dtime();
            self.finish_orphan(ino)?;
            {
                let mut sb = self.sb.lock();
                sb.set_last_orphan(next);
            }
            ino = next;
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
