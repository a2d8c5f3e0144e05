//! The shared-lock data paths (DESIGN.md R1, R2): reads, and writes that overwrite blocks
//! already written inside i_size. As the kernel's ext4 takes the inode lock shared for such
//! overwrites (ext4_dio_write_checks with ext4_overwrite_io), these take the inode's
//! `io_lock` shared, start no handle, and leave the mtime/ctime change in memory for the next
//! commit.
//!
//! Many threads on one file meet here at once (seed 001: one file, random reads and writes
//! from every job), so a request takes the inode's state lock once for everything it must look
//! at (liveness, type, flags, size, the mapping, the times) and does its device I/O outside it.

use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::format::inode::{S_IFDIR, S_IFREG};
use crate::fs::Fs;
use crate::inode::{gone, Inode, InodeState};
use crate::xattr::may_have_cap;
use std::sync::atomic::Ordering;

impl Fs {
    /// Reads from `ino` at byte `off` into `buf`: how many bytes were read (short only at the end
    /// of the file).
    ///
    /// # Errors
    /// [`Error::IsDir`](crate::Error::IsDir) for a directory; I/O and corruption errors.
    pub fn read(&self, ino: u32, off: u64, buf: &mut [u8]) -> Result<usize> {
        if self.crypt_enabled {
            let inode = self.iget_for_io(ino)?;
            let key = {
                let mut st = inode.state.lock();
                if st.raw.file_type() == S_IFREG && crate::encrypt::is_encrypted(&st.raw) {
                    let key = self.crypt(ino, &mut st)?.require()?.cloned();
                    let size = st.raw.size();
                    key.map(|k| (k, size))
                } else {
                    None
                }
            };
            if let Some((key, size)) = key {
                if self.is_verity(ino)? {
                    // Decrypted, then checked against its tree (verity.rs).
                    return self.read_verity(&inode, off, buf);
                }
                if off >= size || buf.is_empty() {
                    return self.read_inner(ino, off, buf, false);
                }
                let len = (buf.len() as u64).min(size - off) as usize;
                return self.read_encrypted(
                    &key,
                    |o, b| self.read_inner_whole(ino, o, b),
                    off,
                    &mut buf[..len],
                );
            }
        }
        self.read_inner(ino, off, buf, false)
    }

    /// The stored bytes of whole blocks (encrypted files, encrypt.rs).
    pub(crate) fn read_inner_whole(&self, ino: u32, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_inner(ino, off, buf, true)
    }

    /// [`Fs::read`] of the bytes as stored; `whole_blocks`: up to the end of the block that
    /// holds the last byte, not the size (encrypted files decrypt whole blocks).
    fn read_inner(&self, ino: u32, off: u64, buf: &mut [u8], whole_blocks: bool) -> Result<usize> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let inode = self.iget_for_io(ino)?;
        let _g = inode.io_lock.read();
        // What the one look under the state lock found: the read done (inline data), one
        // device range holding all of it, or a range to walk run by run.
        let touched;
        let (len, whole) = {
            let mut st = inode.state.lock();
            if gone(&st) {
                return Err(Error::NotFound);
            }
            if st.raw.file_type() == S_IFDIR {
                return Err(Error::IsDir);
            }
            if Self::is_fast_symlink(&st.raw) {
                // Its target is in the inode, not in blocks.
                return Err(Error::Invalid(
                    "read of a symbolic link: use readlink".into(),
                ));
            }
            if st.raw.flags() & crate::flags::FL_VERITY != 0 && !whole_blocks {
                // Checked against its Merkle tree (verity.rs).
                drop(st);
                drop(_g);
                return self.read_verity(&inode, off, buf);
            }
            // The access time, in the same hold of the lock (atime.rs).
            touched = self.atime_update_locked(&mut st);
            let mut size = st.raw.size();
            if whole_blocks {
                size = size.div_ceil(self.bs_u64()) * self.bs_u64();
            }
            if off >= size || buf.is_empty() {
                drop(st);
                if touched {
                    self.dirty_lazily(&inode);
                }
                return Ok(0);
            }
            let len = (buf.len() as u64).min(size - off) as usize;
            if Self::is_inline(&st.raw) {
                self.inline_read(ino, &st.raw, off, &mut buf[..len])?;
                (len, Some(None))
            } else {
                (
                    len,
                    self.one_run(inode.ino, &mut st, off, len as u64)?.map(Some),
                )
            }
        };
        if touched {
            self.dirty_lazily(&inode);
        }
        match whole {
            Some(None) => {}
            Some(Some(phys)) => self.dev.read_at(phys, &mut buf[..len])?,
            None => self.read_mapped(&inode, off, &mut buf[..len])?,
        }
        if self.buffered() {
            let st = inode.state.lock();
            Self::delalloc_overlay(&st, self.bs_u64(), off, &mut buf[..len]);
        }
        self.stats
            .user_bytes_read
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(len)
    }

    /// The device offset of `[off, off + len)` when one written extent holds all of it.
    fn one_run(&self, ino: u32, st: &mut InodeState, off: u64, len: u64) -> Result<Option<u64>> {
        if !Self::has_data_blocks(&st.raw) {
            return Err(Error::Invalid("inode has no data blocks".into()));
        }
        let bs = self.bs_u64();
        let lblk = off / bs;
        Ok(match self.ext_map(ino, st, lblk as u32)? {
            Some(e) if !e.unwritten && off + len <= (e.lblk as u64 + e.len as u64) * bs => {
                Some((e.pblk + (lblk - e.lblk as u64)) * bs + off % bs)
            }
            _ => None,
        })
    }

    /// Reads `buf.len()` bytes at `off` through the block mapping: holes and unwritten extents
    /// read as zeros without touching the device.
    pub(crate) fn read_mapped(&self, inode: &Inode, off: u64, buf: &mut [u8]) -> Result<()> {
        let bs = self.bs_u64();
        let end = off + buf.len() as u64;
        let mut pos = off;
        while pos < end {
            let lblk = pos / bs;
            let (m, next) = {
                let mut st = inode.state.lock();
                if !Self::has_data_blocks(&st.raw) {
                    return Err(Error::Invalid("inode has no data blocks".into()));
                }
                let m = self.ext_map(inode.ino, &mut st, lblk as u32)?;
                let next = if m.is_none() {
                    self.ext_next(inode.ino, &mut st, lblk as u32)?
                } else {
                    None
                };
                (m, next)
            };
            let b = (pos - off) as usize;
            match m {
                Some(e) => {
                    let run_end = (e.lblk as u64 + e.len as u64) * bs;
                    let chunk = (end.min(run_end) - pos) as usize;
                    if e.unwritten {
                        buf[b..b + chunk].fill(0);
                    } else {
                        let phys = (e.pblk + (lblk - e.lblk as u64)) * bs + pos % bs;
                        self.dev.read_at(phys, &mut buf[b..b + chunk])?;
                    }
                    pos += chunk as u64;
                }
                None => {
                    let hole_end = next
                        .map(|n| n.lblk as u64 * bs)
                        .unwrap_or(u64::MAX)
                        .max(pos + 1);
                    let chunk = (end.min(hole_end) - pos) as usize;
                    buf[b..b + chunk].fill(0);
                    pos += chunk as u64;
                }
            }
        }
        Ok(())
    }

    /// A write that only overwrites: `[off, off + len)` inside i_size on written blocks, on a
    /// regular file with nothing for the write to take away (no set-ID bit, no capability
    /// that may be there) and no SYNC flag, within the largest file size. Checked, mapped and
    /// timed in one look under the state lock, written under the shared `io_lock`:
    /// `Some(count)`. `None`: the write needs the general path (which also overwrites in
    /// place where it can, after its own checks).
    pub(crate) fn write_in_place(
        &self,
        cred: Option<&Cred>,
        inode: &Inode,
        off: u64,
        data: &[u8],
    ) -> Result<Option<usize>> {
        let len = data.len() as u64;
        let _g = inode.io_lock.read();
        let runs = {
            let mut st = inode.state.lock();
            if gone(&st) {
                return Err(Error::NotFound);
            }
            let r = &st.raw;
            let privs = cred.is_some() && (r.mode() & 0o6000 != 0 || may_have_cap(&st));
            if privs || off + len > self.max_size_of(r) || crate::flags::may_write(r, off)? {
                return Ok(None);
            }
            match self.overwrite_runs_locked(inode.ino, &mut st, off, len)? {
                Some(runs) => runs,
                None => return Ok(None),
            }
        };
        self.write_runs(inode, &runs, data)?;
        Ok(Some(data.len()))
    }

    /// [`Fs::write_in_place`]'s writing, for the general path once it has made its checks:
    /// whether the write was an overwrite and is done.
    pub(crate) fn overwrite(&self, inode: &Inode, off: u64, data: &[u8]) -> Result<bool> {
        let _g = inode.io_lock.read();
        let runs = {
            let mut st = inode.state.lock();
            match self.overwrite_runs_locked(inode.ino, &mut st, off, data.len() as u64)? {
                Some(runs) => runs,
                None => return Ok(false),
            }
        };
        self.write_runs(inode, &runs, data)?;
        Ok(true)
    }

    /// Writes `data` to the device ranges `runs` cover, in order, and counts the overwrite.
    fn write_runs(&self, inode: &Inode, runs: &[(u64, u64)], data: &[u8]) -> Result<()> {
        let mut b = 0usize;
        for &(phys, len) in runs {
            self.dev.write_at(phys, &data[b..b + len as usize])?;
            b += len as usize;
        }
        self.dirty_lazily(inode);
        self.stats.overwrites.fetch_add(1, Ordering::Relaxed);
        self.stats
            .user_bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// If `[off, off+len)` lies inside i_size on written blocks, the device byte ranges to
    /// write, with mtime and ctime set to now in memory (the overwrite is then certain).
    fn overwrite_runs_locked(
        &self,
        ino: u32,
        st: &mut InodeState,
        off: u64,
        len: u64,
    ) -> Result<Option<Vec<(u64, u64)>>> {
        let bs = self.bs_u64();
        if st.raw.file_type() != S_IFREG || off + len > st.raw.size() || Self::is_inline(&st.raw) {
            return Ok(None);
        }
        // Buffered data in the range, or past what the device backs: the cache takes it.
        if let Some(d) = &st.delalloc {
            if off + len > d.disk_size || d.overlaps(off / bs, (off + len - 1) / bs) {
                return Ok(None);
            }
        }
        let mut runs = Vec::new();
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let lblk = pos / bs;
            match self.ext_map(ino, st, lblk as u32)? {
                Some(e) if !e.unwritten => {
                    let run_end = (e.lblk as u64 + e.len as u64) * bs;
                    let chunk = end.min(run_end) - pos;
                    let phys = (e.pblk + (lblk - e.lblk as u64)) * bs + pos % bs;
                    match runs.last_mut() {
                        Some((p, l)) if *p + *l == phys => *l += chunk,
                        _ => runs.push((phys, chunk)),
                    }
                    pos += chunk;
                }
                _ => return Ok(None),
            }
        }
        let now = self.now();
        st.raw.set_mtime(now);
        st.raw.set_ctime(now);
        Ok(Some(runs))
    }

    /// Updates mtime and ctime in memory only; the inode is written at the next commit (R1).
    pub(crate) fn touch_lazily(&self, inode: &Inode) {
        let now = self.now();
        {
            let mut st = inode.state.lock();
            st.raw.set_mtime(now);
            st.raw.set_ctime(now);
        }
        self.dirty_lazily(inode);
    }

    /// Puts the inode on the running transaction's list of inodes written at its commit, once
    /// per transaction.
    pub(crate) fn dirty_lazily(&self, inode: &Inode) {
        let running = self.txn.running_tid.load(Ordering::Acquire);
        if inode.lazy_tid.load(Ordering::Acquire) != running {
            let tid = self.txn.dirty_inode_lazily(inode.ino);
            inode.lazy_tid.store(tid, Ordering::Release);
            inode.last_tid.fetch_max(tid, Ordering::AcqRel);
        }
    }

    fn bs_u64(&self) -> u64 {
        self.geo.block_size as u64
    }
}
