//! File I/O: read, write, truncate, fallocate, lseek, fsync (DESIGN.md R1-R4).
//!
//! - Reads and overwrites (the whole range already mapped to written blocks, inside i_size)
//!   take the inode's `io_lock` shared and start no handle: overwrite.rs (R1, R2).
//! - Everything that changes the mapping or the size takes `io_lock` exclusively. New blocks are
//!   allocated a whole run at a time, the data is written to them first, and only then does the
//!   extent pointing at them enter the tree, in the same handle as the size change (R4): no
//!   unwritten-to-written conversion and no window where a reader or a crash sees stale data.
//! - Only the parts of a new block that the write does not cover are zeroed (R3); the bytes
//!   zeroed are counted in `FsStats::zeroed_bytes`.

use crate::attr::{write_privs, write_privs_known};
use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::extents::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
use crate::flags::WriteAfter;
use crate::format::extent::{Extent, MAX_INIT_LEN, MAX_UNWRITTEN_LEN};
use crate::format::inode::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::credits;
use crate::xattr::may_have_cap;
use std::sync::atomic::Ordering;

/// `fallocate` mode: allocate without changing the size.
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
/// `fallocate` mode: free a range, leaving a hole (with `FALLOC_FL_KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
/// `fallocate` mode: make a range read as zeros.
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// Largest write chunk per handle, so one write cannot grow a transaction without bound.
const WRITE_CHUNK_BLOCKS: u64 = 8192;

impl Fs {
    fn bs(&self) -> u64 {
        self.geo.block_size as u64
    }

    /// Largest size of a file with an extent tree, as the kernel's ext4_max_size sets
    /// s_maxbytes: 2^32 - 1 blocks (one block short of what ee_block can name, so that an
    /// extent's length can reach the end), and without huge_file no more blocks than i_blocks
    /// can count in 2^32 - 1 sectors. Files with a block map end sooner
    /// (`blockmap_max_size`).
    pub fn max_file_size(&self) -> u64 {
        let bs = self.bs();
        let tree = ((1u64 << 32) - 1) * bs;
        if self.geo.huge_file {
            tree
        } else {
            tree.min(((1u64 << 32) - 1) / (bs / 512) * bs)
        }
    }

    /// Writes `data` at `off`. As pwrite(2), the count may be short: at the largest file
    /// size, or when space (or the device) fails after part of the data is written; the
    /// error then comes with the next call.
    pub fn write(&self, ino: u32, off: u64, data: &[u8]) -> Result<usize> {
        self.write_inner(None, ino, off, data).map(|(n, _)| n)
    }

    /// [`Fs::write`] for `cred`, as the kernel's write with file_remove_privs: first a regular
    /// file loses `security.capability`, and, unless `cred` is privileged, set-user-ID and
    /// set-group-ID (when group-executable, or of a group the caller is not in), in one
    /// handle. The count, and whether the mode changed. A file with no set-ID bits and no
    /// capability costs nothing more than `write` (the check uses the inode's mode and what
    /// is known of its attributes, under the lock the write takes anyway).
    pub fn write_as(&self, cred: &Cred, ino: u32, off: u64, data: &[u8]) -> Result<(usize, bool)> {
        let _limits = crate::quota::limits_for(cred);
        self.write_inner(Some(cred), ino, off, data)
    }

    /// [`Fs::write_all`] for `cred` (as [`Fs::write_as`]): whether the mode changed.
    pub fn write_all_as(&self, cred: &Cred, ino: u32, off: u64, data: &[u8]) -> Result<bool> {
        let _limits = crate::quota::limits_for(cred);
        let mut done = 0;
        let mut changed = false;
        while done < data.len() {
            match self.write_inner(Some(cred), ino, off + done as u64, &data[done..])? {
                (0, _) => return Err(Error::NoSpace),
                (n, c) => {
                    done += n;
                    changed |= c;
                }
            }
        }
        Ok(changed)
    }

    /// [`Fs::fallocate`] for `cred`: any mode changes the file as a write does (the kernel's
    /// ext4 calls file_modified for each), so it first takes away what [`Fs::write_as`]
    /// would. Whether the mode changed.
    pub fn fallocate_as(
        &self,
        cred: &Cred,
        ino: u32,
        mode: i32,
        off: u64,
        len: u64,
    ) -> Result<bool> {
        let _limits = crate::quota::limits_for(cred);
        let inode = self.iget(ino)?;
        let gid = inode.state.lock().raw.gid();
        let member = cred.in_group(gid);
        let changed = self.remove_privs_of(&inode, &write_privs_known(cred, gid, member))?;
        self.fallocate(ino, mode, off, len)?;
        Ok(changed)
    }

    fn write_inner(
        &self,
        cred: Option<&Cred>,
        ino: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(usize, bool)> {
        if self.crypt_enabled && !data.is_empty() {
            if let Some(key) = self.contents_key(ino)? {
                return self.write_encrypted(cred, &key, ino, off, data);
            }
        }
        self.write_inner_raw(cred, ino, off, data)
    }

    /// [`Fs::write`] of the bytes as they are to be stored (encrypted files: whole blocks of
    /// ciphertext, encrypt.rs).
    pub(crate) fn write_inner_raw(
        &self,
        cred: Option<&Cred>,
        ino: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(usize, bool)> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let mut after = WriteAfter::default();
        let n = self.retry_nospace(|| self.write_once(cred, &mut after, ino, off, data))?;
        if after.sync {
            self.fsync(ino, false)?;
        }
        let changed = after.mode_changed;
        if n == 0 || n == data.len() || self.balloc.pending_free.lock().is_empty() {
            return Ok((n, changed));
        }
        // Cut short, perhaps by space that blocks freed but not yet home still hold: the
        // rest once more after they are, as `retry_nospace` does for a write that could not
        // start.
        if self
            .commit()
            .and_then(|()| self.checkpoint_drain())
            .is_err()
        {
            return Ok((n, changed));
        }
        let more = self
            .write_once(None, &mut after, ino, off + n as u64, &data[n..])
            .unwrap_or(0);
        Ok((n + more, changed))
    }

    /// Writes all of `data` at `off`, or fails: `write` until done (image tools).
    pub fn write_all(&self, ino: u32, off: u64, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            match self.write(ino, off + done as u64, &data[done..])? {
                0 => return Err(Error::NoSpace),
                n => done += n,
            }
        }
        Ok(())
    }

    fn write_once(
        &self,
        cred: Option<&Cred>,
        after: &mut WriteAfter,
        ino: u32,
        off: u64,
        data: &[u8],
    ) -> Result<usize> {
        self.check_writable()?;
        if data.is_empty() {
            return Ok(0);
        }
        if off >= self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        let inode = self.iget_for_io(ino)?;
        if let Some(n) = self.write_in_place(cred, &inode, off, data)? {
            return Ok(n);
        }
        let inode = crate::inode::live(inode)?;
        // As the kernel's write checks: a write that starts at or past the largest size fails,
        // one that crosses it is cut short there. A file with an indirect block map ends
        // sooner (the kernel's s_bitmap_maxbytes).
        let (limit, ftype, mode, gid, cap) = {
            let st = inode.state.lock();
            let r = &st.raw;
            after.sync = crate::flags::may_write(r, off)?;
            (
                self.max_size_of(r),
                r.file_type(),
                r.mode(),
                r.gid(),
                may_have_cap(&st),
            )
        };
        // Whether set-ID bits or a capability go is decided outside the inode's lock: group
        // membership may have to be read from /proc.
        let privs = cred.filter(|c| {
            ftype == S_IFREG && (cap || mode & write_privs(mode, c, || c.in_group(gid)) != 0)
        });
        if let Some(c) = privs {
            let member = c.in_group(gid);
            after.mode_changed |=
                self.remove_privs_of(&inode, &write_privs_known(c, gid, member))?;
        }
        if off >= limit {
            return Err(Error::FileTooBig);
        }
        let mut data = data;
        let mut end = off.saturating_add(data.len() as u64);
        if end > limit {
            data = &data[..(limit - off) as usize];
            end = limit;
        }
        // Overwrite path: shared lock, no handle.
        if self.overwrite(&inode, off, data)? {
            return Ok(data.len());
        }
        let _g = inode.io_lock.write();
        if self.inline_write(&inode, off, data)? {
            self.stats
                .user_bytes_written
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(data.len());
        }
        if self.buffered() && self.delalloc_write(&inode, off, data)? {
            self.touch_lazily(&inode);
            self.stats
                .user_bytes_written
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(data.len());
        }
        {
            let st = inode.state.lock();
            match st.raw.file_type() {
                S_IFREG => {}
                S_IFDIR => return Err(Error::IsDir),
                // A symlink's target is written once, when it is made (namei's symlink).
                S_IFLNK => return Err(Error::Invalid("write to a symbolic link".into())),
                _ => return Err(Error::Invalid("write to a special file".into())),
            }
        }
        let size = {
            let st = inode.state.lock();
            check_live(&st)?;
            st.raw.size()
        };
        // A write cut short by an error after its first runs (ENOSPC) returns what it wrote,
        // as the kernel's does: the size covers exactly that, not the part that failed.
        let (n, r) = self.write_new_blocks_upto(&inode, off, data, size.max(end));
        if n == 0 {
            r?;
        }
        self.stats.allocating_writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .user_bytes_written
            .fetch_add(n, Ordering::Relaxed);
        Ok(n as usize)
    }

    /// The general write path, `io_lock` held exclusively: overwrites what is mapped, converts
    /// unwritten extents it covers, allocates holes (data first, then the extent), and sets
    /// i_size to at least `new_size` (clamped to what was written).
    pub(crate) fn write_new_blocks_locked(
        &self,
        inode: &Inode,
        off: u64,
        data: &[u8],
        new_size: u64,
    ) -> Result<()> {
        self.write_new_blocks_upto(inode, off, data, new_size).1
    }

    /// As `write_new_blocks_locked`, and how many bytes from `off` it wrote: on an error
    /// part-way (ENOSPC after the first runs), the bytes written before it, with the size
    /// raised to cover them as for a short write, and the error.
    fn write_new_blocks_upto(
        &self,
        inode: &Inode,
        off: u64,
        data: &[u8],
        new_size: u64,
    ) -> (u64, Result<()>) {
        let mut done = off;
        let r = self.write_new_blocks_steps(inode, off, data, new_size, &mut done);
        match r {
            Ok(()) => (data.len() as u64, Ok(())),
            Err(e) if done > off => {
                let sized = (|| {
                    let mut h = self.start(credits::SETATTR)?;
                    let mut st = inode.state.lock();
                    check_live(&st)?;
                    self.fc_track(&mut h, inode.ino, &st, None);
                    self.finish_write_step(&mut h, inode, &mut st, done, new_size)
                })();
                match sized {
                    Ok(()) => (done - off, Err(e)),
                    Err(e2) => (0, Err(e2)),
                }
            }
            Err(e) => (0, Err(e)),
        }
    }

    /// The steps of `write_new_blocks_upto`; `done` follows the end of what is written.
    fn write_new_blocks_steps(
        &self,
        inode: &Inode,
        off: u64,
        data: &[u8],
        new_size: u64,
        done: &mut u64,
    ) -> Result<()> {
        let bs = self.bs();
        let ino = inode.ino;
        let end = off + data.len() as u64;
        let last = (end - 1) / bs;
        let mut lblk = off / bs;
        // Whether size and times still need a handle of their own after the loop: not when
        // the last step logged them up to `end` with its extent.
        let mut need_final = true;
        while lblk <= last {
            // Written blocks are overwritten without a handle; the mapping cannot change
            // meanwhile (io_lock is held exclusively), so it is looked up again under one.
            let m = self.ext_map(ino, &mut inode.state.lock(), lblk as u32)?;
            if let Some(e) = m.filter(|e| !e.unwritten) {
                let run_last = (e.lblk as u64 + e.len as u64 - 1).min(last);
                let p = e.pblk + (lblk - e.lblk as u64);
                self.write_range(p, lblk, run_last - lblk + 1, off, data, false)?;
                lblk = run_last + 1;
                *done = end.min(lblk * bs);
                need_final = true;
                continue;
            }
            let mut h = self.start(credits::WRITE_PER_EXTENT + 4)?;
            let mut st = inode.state.lock();
            check_live(&st)?;
            let step_first = lblk as u32;
            let upto = match self.ext_map(ino, &mut st, lblk as u32)? {
                Some(e) => {
                    // Preallocated: write the data (zeroing what the write does not cover in
                    // the edge blocks), then mark written within this handle.
                    let run_last = (e.lblk as u64 + e.len as u64 - 1).min(last);
                    let n = run_last - lblk + 1;
                    let p = e.pblk + (lblk - e.lblk as u64);
                    self.write_range(p, lblk, n, off, data, true)?;
                    self.ext_mark_written(&mut h, ino, &mut st, lblk as u32, n as u32)?;
                    lblk = run_last + 1;
                    end.min(lblk * bs)
                }
                None => {
                    let n =
                        self.map_hole(&mut h, ino, &mut st, lblk, last, false, &mut |p, n| {
                            self.write_range(p, lblk, n as u64, off, data, true)
                                .map(|()| false)
                        })?;
                    lblk += n as u64;
                    end.min(lblk * bs)
                }
            };
            self.fc_track(&mut h, ino, &st, Some((step_first, (lblk - 1) as u32)));
            self.finish_write_step(&mut h, inode, &mut st, upto, new_size)?;
            *done = upto;
            need_final = upto < end;
        }
        if !need_final {
            return Ok(());
        }
        // The loop only overwrote at the end: still update size and times.
        let mut h = self.start(credits::SETATTR)?;
        let mut st = inode.state.lock();
        check_live(&st)?;
        self.fc_track(&mut h, ino, &st, None);
        self.finish_write_step(&mut h, inode, &mut st, end, new_size)
    }

    /// Writes `data` (at most a block) as the first block of a new, empty inode, within the
    /// creating handle: a slow symlink's target. The block goes to the device before the
    /// handle's transaction commits, as any newly allocated data does.
    pub(crate) fn write_first_block(
        &self,
        h: &mut crate::transaction::Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        data: &[u8],
    ) -> Result<()> {
        self.map_hole(h, ino, st, 0, 0, false, &mut |p, _| {
            self.write_range(p, 0, 1, 0, data, true).map(|()| false)
        })
        .map(drop)
    }

    /// Size and times after part of a write, logged in the same handle as its extent.
    pub(crate) fn finish_write_step(
        &self,
        h: &mut crate::transaction::Handle<'_>,
        inode: &Inode,
        st: &mut InodeState,
        written_to: u64,
        new_size: u64,
    ) -> Result<()> {
        let now = self.now();
        let size = st.raw.size();
        let target = written_to.min(new_size);
        if target > size {
            st.raw.set_size(target);
        }
        // Writeback of buffered data: the device now backs the file up to here; the times
        // are those of the writes that filled the cache.
        let writeback = match st.delalloc.as_mut() {
            Some(d) => {
                d.disk_size = d.disk_size.max(target.min(st.raw.size()));
                d.in_writeback
            }
            None => false,
        };
        if !writeback {
            st.raw.set_mtime(now);
            st.raw.set_ctime(now);
        }
        self.mark_inode_dirty(h, inode, st)?;
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(())
    }

    /// Maps the hole that starts at `lblk` (up to `last`, the next extent and one chunk): allocates
    /// one run of blocks, lets `fill` write them (new data goes down before the extent that makes
    /// it visible, R4), then inserts the extent. On failure the blocks are freed. `fill` returns
    /// true when the blocks could not be given their contents after all and must be mapped
    /// unwritten (fallocate's zeroing, where the image has no storage for it). Returns how many
    /// blocks were mapped.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map_hole(
        &self,
        h: &mut crate::transaction::Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        lblk: u64,
        last: u64,
        unwritten: bool,
        fill: &mut dyn FnMut(u64, u32) -> Result<bool>,
    ) -> Result<u32> {
        let next = self
            .ext_next(ino, st, lblk as u32)?
            .map(|e| e.lblk as u64)
            .unwrap_or(u64::MAX);
        let hole_last = (next - 1).min(last).min(lblk + WRITE_CHUNK_BLOCKS - 1);
        let max = if unwritten {
            MAX_UNWRITTEN_LEN
        } else {
            MAX_INIT_LEN
        };
        let want = (hole_last - lblk + 1).min(max as u64) as u32;
        // Writeback of buffered pages takes what their writes were allowed (delalloc.rs).
        let want = match st.writeback_claim() {
            None => self.quota_allow_blocks(ino, &st.raw, want, 0)?,
            Some(_) => want,
        };
        let goal = self.alloc_goal(ino, st, lblk)?;
        let (p, mut n) = self.alloc_for(h, ino, st, lblk as u32, want, goal, true)?;
        let unwritten = match fill(p, n) {
            Ok(fell_back) => unwritten || fell_back,
            Err(e) => {
                let _ = self.free_for(h, ino, st, lblk, p, n as u64, false);
                return Err(e);
            }
        };
        if unwritten && n > MAX_UNWRITTEN_LEN {
            // Allocated for a written extent, one block longer than an unwritten one may be.
            let _ = self.free_tail(h, p, n, MAX_UNWRITTEN_LEN);
            n = MAX_UNWRITTEN_LEN;
        }
        let ext = Extent {
            lblk: lblk as u32,
            len: n,
            pblk: p,
            unwritten,
        };
        if let Err(e) = self.ext_insert(h, ino, st, ext) {
            let _ = self.free_for(h, ino, st, lblk, p, n as u64, false);
            return Err(e);
        }
        Ok(n)
    }

    /// Where to look for blocks for logical block `lblk`: where the nearest extent before it
    /// would put it if it continued that far (as the kernel's ext4_ext_find_goal does), else
    /// near the inode's group. Aiming at the block's own distance from that extent, not just
    /// past it, keeps the file contiguous when its pieces are allocated out of order (two
    /// threads writing back neighbouring 1 MiB ranges: the later range no longer takes the
    /// blocks right after the extent and pushes the earlier one behind it).
    fn alloc_goal(&self, ino: u32, st: &mut InodeState, lblk: u64) -> Result<u64> {
        if lblk > 0 {
            if let Some(e) = self.ext_cached(ino, st, |c| c.prev((lblk - 1) as u32))? {
                let at = e.pblk + (lblk - e.lblk as u64);
                // Past the end of the filesystem (a far-away block of a sparse file): just
                // after the extent instead.
                return Ok(if at < self.geo.blocks_count {
                    at
                } else {
                    e.pblk + e.len as u64
                });
            }
        }
        let g = self.geo.ino_group(ino);
        // Files in a flex group start after its metadata; the allocator skips used blocks.
        let flex_first = g - g % self.geo.flex_bg_size.max(1);
        Ok(self
            .geo
            .group_first_block(flex_first.max(g.min(flex_first + 1))))
    }

    /// Writes the part of `data` (which starts at file byte `off`) that falls in logical blocks
    /// `[lblk, lblk+n)`, mapped from physical block `p`. With `zero_uncovered`, the parts of those
    /// blocks the data does not cover are zeroed (new or unwritten blocks).
    fn write_range(
        &self,
        p: u64,
        lblk: u64,
        n: u64,
        off: u64,
        data: &[u8],
        zero_uncovered: bool,
    ) -> Result<()> {
        let bs = self.bs();
        let rs = lblk * bs;
        let re = (lblk + n) * bs;
        let ds = off.max(rs);
        let de = (off + data.len() as u64).min(re);
        let phys = |x: u64| p * bs + (x - rs);
        if zero_uncovered {
            if ds > rs {
                self.write_zeros(phys(rs), ds - rs)?;
            }
            if de < re {
                self.write_zeros(phys(de), re - de)?;
            }
        }
        if de > ds {
            let part = &data[(ds - off) as usize..(de - off) as usize];
            if zero_uncovered {
                self.dev.write_new_at(phys(ds), part)?;
            } else {
                self.dev.write_at(phys(ds), part)?;
            }
        }
        Ok(())
    }

    fn write_zeros(&self, at: u64, len: u64) -> Result<()> {
        static Z: [u8; 65536] = [0; 65536];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(Z.len() as u64) as usize;
            self.dev.write_at(at + done, &Z[..n])?;
            done += n as u64;
        }
        self.stats.zeroed_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Zeroes the written blocks' bytes in `[from, to)` (within one block), if mapped.
    pub(crate) fn zero_partial(
        &self,
        ino: u32,
        st: &mut InodeState,
        from: u64,
        to: u64,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let bs = self.bs();
        let lblk = from / bs;
        if let Some(e) = self.ext_map(ino, st, lblk as u32)? {
            if !e.unwritten {
                let phys = (e.pblk + (lblk - e.lblk as u64)) * bs + from % bs;
                self.write_zeros(phys, to - from)?;
            }
        }
        Ok(())
    }

    /// Sets the size of `ino` to `size`, freeing the blocks past it or extending with a hole.
    ///
    /// # Errors
    /// [`Error::FileTooBig`](crate::Error::FileTooBig) past the largest file;
    /// [`Error::NoSpace`](crate::Error::NoSpace); read-only and stopped filesystems.
    pub fn truncate(&self, ino: u32, size: u64) -> Result<()> {
        if self.crypt_enabled {
            if let Some(key) = self.contents_key(ino)? {
                return self.truncate_encrypted(&key, ino, size);
            }
        }
        self.truncate_raw(ino, size)
    }

    /// [`Fs::truncate`] of the stored bytes (the zeroed tail of a partial last block is
    /// zeroed ciphertext: encrypted files re-encrypt it afterwards, encrypt.rs).
    pub(crate) fn truncate_raw(&self, ino: u32, size: u64) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        if size > self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        if self.inline_truncate(&inode, size)? {
            return Ok(());
        }
        let mut mem_size = None;
        if inode.state.lock().delalloc.is_some() {
            // Buffered data past the new size is dropped; the rest goes down first, never
            // logging a size beyond the new one.
            let mut st = inode.state.lock();
            mem_size = Some(st.raw.size());
            self.delalloc_discard(ino, &mut st, size);
            if size < st.raw.size() {
                st.raw.set_size(size);
            }
            drop(st);
            self.delalloc_writeback_locked(&inode)?;
        }
        let old = {
            let st = inode.state.lock();
            check_live(&st)?;
            crate::flags::may_truncate(&st.raw)?;
            match st.raw.file_type() {
                S_IFREG => {}
                S_IFDIR => return Err(Error::IsDir),
                _ => {
                    return Err(Error::Invalid(
                        "truncate of a file that is not regular".into(),
                    ))
                }
            }
            if size > self.max_size_of(&st.raw) {
                return Err(Error::FileTooBig);
            }
            st.raw.size().max(mem_size.unwrap_or(0))
        };
        let bs = self.bs();
        let first = size.div_ceil(bs) as u32;
        if size < old {
            self.truncate_in_pieces(&inode, size, first)?;
        }
        let mut h = self.start(credits::UNLINK)?;
        let mut st = inode.state.lock();
        check_live(&st)?;
        if size < old {
            self.ext_remove(&mut h, ino, &mut st, first, 1u64 << 32)?;
            if !size.is_multiple_of(bs) {
                self.zero_partial(ino, &mut st, size, (size / bs + 1) * bs)?;
            }
        }
        st.raw.set_size(size);
        let now = self.now();
        if size != old {
            st.raw.set_mtime(now);
        }
        st.raw.set_ctime(now);
        // Only a truncate puts an inode that has links on the orphan list (this one, or one
        // that failed half-way): it is whole now.
        if st.orphaned && st.raw.links_count() > 0 {
            self.orphan_del(&mut h, &inode, &mut st)?;
        }
        // A fast commit unmaps everything past the new end (DEL_RANGE to the last block, as
        // the kernel's ext4_fc_track_range for a truncate), or logs the new size only.
        let cut = (size < old).then_some((first, u32::MAX - 1));
        self.fc_track(&mut h, ino, &st, cut);
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(())
    }

    /// A truncate whose removal is too large for one handle: the new size is logged first
    /// with the inode on the orphan list, then the blocks past it go in pieces, each its own
    /// transaction, from the end down, as the kernel's ext4_truncate does. A crash in between
    /// leaves an orphan whose blocks past its size the next open (or e2fsck, or the kernel's
    /// mount) cuts. The caller's last handle takes the inode off the list. Does nothing when
    /// one handle is enough.
    fn truncate_in_pieces(&self, inode: &Inode, size: u64, first: u32) -> Result<()> {
        if !self.removal_is_large(inode.ino, &mut inode.state.lock(), first, 1 << 32)? {
            return Ok(());
        }
        let mut h = self.start(credits::SETATTR)?;
        {
            let mut st = inode.state.lock();
            check_live(&st)?;
            // The rest of the last block is zeroed first (ordered ahead of the new size, as
            // data), as the kernel's ext4_block_truncate_page: after a crash, recovery only
            // cuts whole blocks, and bytes past the size would show again if it grew.
            let bs = self.bs();
            if !size.is_multiple_of(bs) {
                self.zero_partial(inode.ino, &mut st, size, (size / bs + 1) * bs)?;
            }
            st.raw.set_size(size);
            if !st.orphaned {
                self.orphan_add(&mut h, inode, &mut st)?;
            }
            self.mark_inode_dirty(&mut h, inode, &mut st)?;
        }
        drop(h);
        self.remove_in_pieces(inode, first, 1 << 32)
    }

    /// Most metadata blocks one handle of a removal may dirty: half the size at which the
    /// running transaction commits, so that a removal of any size is a series of
    /// transactions that each fit the log, and none is written home without the journal.
    pub(crate) fn removal_budget(&self) -> usize {
        (self.txn.max_blocks.load(Ordering::Relaxed) / 2).max(16)
    }

    /// Whether unmapping `[start, end)` of an inode (whose state the caller holds) needs more
    /// than one handle's worth of metadata blocks.
    pub(crate) fn removal_is_large(
        &self,
        ino: u32,
        st: &mut InodeState,
        start: u32,
        end: u64,
    ) -> Result<bool> {
        if !Self::has_data_blocks(&st.raw) {
            return Ok(false);
        }
        Ok(self
            .ext_removal_piece(ino, st, start, end, self.removal_budget())?
            .is_some())
    }

    /// Unmaps and frees `[start, end)` of an inode from the end down, one handle of at most
    /// `removal_budget` blocks per piece, until what is left fits one handle: the caller's
    /// own last handle removes that. Each piece leaves a consistent file (a hole, or a tail
    /// cut short). The caller holds the inode's io_lock exclusively and no other lock.
    pub(crate) fn remove_in_pieces(&self, inode: &Inode, start: u32, end: u64) -> Result<()> {
        let budget = self.removal_budget();
        let piece = |st: &mut InodeState, end: u64| -> Result<Option<u32>> {
            if !Self::has_data_blocks(&st.raw) {
                return Ok(None);
            }
            self.ext_removal_piece(inode.ino, st, start, end, budget)
        };
        let mut end = end;
        // Decided before a handle is started: most removals fit one, and need none here.
        while piece(&mut inode.state.lock(), end)?.is_some() {
            let _one = self.removal_lock.lock();
            let mut h = self.start_with_room(budget)?;
            let mut st = inode.state.lock();
            let Some(lo) = piece(&mut st, end)? else {
                break;
            };
            self.ext_remove(&mut h, inode.ino, &mut st, lo, end)?;
            self.mark_inode_dirty(&mut h, inode, &mut st)?;
            if st.dying {
                // Freeing an unlinked inode (orphan.rs's delete_orphan), piece by piece.
                self.fc_track_forget(&mut h, &st);
            } else {
                // A piece of a truncate or a punched hole: DEL_RANGE for the blocks cut.
                let last = (end - 1).min(u32::MAX as u64) as u32;
                self.fc_track(&mut h, inode.ino, &st, Some((lo, last)));
            }
            end = lo as u64;
        }
        Ok(())
    }

    /// `fallocate(2)` on `ino`: allocates (unwritten extents), punches a hole or zeroes a range, by
    /// `mode` ([`FALLOC_FL_KEEP_SIZE`](crate::FALLOC_FL_KEEP_SIZE) and the others).
    ///
    /// # Errors
    /// [`Error::NotSupported`](crate::Error::NotSupported) for a mode it does not implement;
    /// [`Error::NoSpace`](crate::Error::NoSpace).
    pub fn fallocate(&self, ino: u32, mode: i32, off: u64, len: u64) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.retry_nospace(|| self.fallocate_once(ino, mode, off, len))?;
        self.sync_if_flagged(ino, false)
    }

    fn fallocate_once(&self, ino: u32, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        if self.crypt_enabled
            && mode & !FALLOC_FL_KEEP_SIZE != 0
            && crate::encrypt::is_encrypted(&self.iget(ino)?.state.lock().raw)
        {
            if mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE) != 0 {
                // ext4_fallocate: the blocks would move under IVs made for other offsets.
                return Err(Error::NotSupported(
                    "collapsing or inserting a range of an encrypted file".into(),
                ));
            }
            if len == 0 {
                return Err(Error::Invalid("fallocate: length 0".into()));
            }
            if let Some(key) = self.contents_key(ino)? {
                let keeps_size = mode & (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE) != 0;
                return self.fallocate_encrypted(&key, ino, (mode, keeps_size), off, len);
            }
        }
        self.fallocate_plain(ino, mode, off, len)
    }

    /// [`Fs::fallocate`] of the stored blocks.
    pub(crate) fn fallocate_plain(&self, ino: u32, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        if len == 0 {
            return Err(Error::Invalid("fallocate: length 0".into()));
        }
        let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        if mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE) != 0 {
            return self.fallocate_shift(ino, mode, off, len);
        }
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(Error::NotSupported(format!("fallocate mode {mode:#x}")));
        }
        let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & FALLOC_FL_ZERO_RANGE != 0;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        if punch && (zero || !keep) {
            return Err(Error::NotSupported(
                "PUNCH_HOLE needs KEEP_SIZE and excludes ZERO_RANGE".into(),
            ));
        }
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        self.inline_convert_file(&inode)?;
        // Buffered data goes down first: the range operations below work on the mapping.
        self.delalloc_writeback_locked(&inode)?;
        {
            let st = inode.state.lock();
            check_live(&st)?;
            crate::flags::may_fallocate(&st.raw, mode)?;
            match st.raw.file_type() {
                S_IFREG => {}
                S_IFDIR => return Err(Error::IsDir),
                _ => {
                    return Err(Error::NotSupported(
                        "fallocate of a file that is not regular".into(),
                    ))
                }
            }
            // As the kernel's ext4: an indirect block map can punch holes, but has no place
            // for unwritten blocks, so preallocation and ZERO_RANGE are refused.
            if !punch && Self::uses_blockmap(&st.raw) {
                return Err(Error::NotSupported(format!(
                    "inode {ino}: fallocate in a file with an indirect block map (ext2/ext3 \
                     layout); only hole punching is supported"
                )));
            }
        }
        if punch || zero {
            self.fallocate_empty_range(&inode, off, end, punch)?;
            if punch {
                return Ok(());
            }
        }
        self.fallocate_prealloc(&inode, off, end, keep)?;
        let mut h = self.start(credits::SETATTR)?;
        let mut st = inode.state.lock();
        if !keep && end > st.raw.size() {
            st.raw.set_size(end);
        }
        st.raw.set_ctime(self.now());
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        self.fc_track(&mut h, ino, &st, None);
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(())
    }

    /// PUNCH_HOLE and the first half of ZERO_RANGE: the range's full blocks are unmapped
    /// (a hole too large for one handle in pieces, from its end first) and its partial blocks
    /// zeroed.
    fn fallocate_empty_range(&self, inode: &Inode, off: u64, end: u64, punch: bool) -> Result<()> {
        let ino = inode.ino;
        let bs = self.bs();
        // A hole too large for one handle is punched in pieces from its end first.
        let pend = {
            let st = inode.state.lock();
            if punch {
                end.min(st.raw.size().div_ceil(bs) * bs)
            } else {
                end
            }
        };
        if off.div_ceil(bs) < pend / bs {
            self.remove_in_pieces(inode, off.div_ceil(bs) as u32, pend / bs)?;
        }
        let mut h = self.start(credits::UNLINK)?;
        let mut st = inode.state.lock();
        check_live(&st)?;
        let size = st.raw.size();
        let pend = if punch {
            end.min(size.div_ceil(bs) * bs)
        } else {
            end
        };
        let mut cut = None;
        if off < pend {
            let first_full = off.div_ceil(bs);
            let last_full = pend / bs; // exclusive
            if first_full >= last_full {
                // Inside one block (or two partial ones without a full block between).
                self.zero_partial(ino, &mut st, off, pend.min((off / bs + 1) * bs))?;
                if pend > (off / bs + 1) * bs {
                    self.zero_partial(ino, &mut st, (pend / bs) * bs, pend)?;
                }
            } else {
                self.zero_partial(ino, &mut st, off, first_full * bs)?;
                self.zero_partial(ino, &mut st, last_full * bs, pend)?;
                self.ext_remove(&mut h, ino, &mut st, first_full as u32, last_full)?;
                cut = Some((first_full as u32, (last_full - 1) as u32));
            }
        }
        let now = self.now();
        st.raw.set_mtime(now);
        st.raw.set_ctime(now);
        self.mark_inode_dirty(&mut h, inode, &mut st)?;
        // DEL_RANGE for the blocks unmapped, as ext4_punch_hole tracks its range (the
        // partial blocks' zeros are data, on the device before the records).
        self.fc_track(&mut h, ino, &st, cut);
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        drop(st);
        drop(h);
        Ok(())
    }

    /// Preallocates over the holes in the range (also the second half of ZERO_RANGE, which
    /// just emptied its full blocks): unwritten extents, or, where the device zeroes for
    /// free (MountOptions::prealloc_zeroed), written extents over blocks zeroed before the
    /// extent points at them (never for encrypted files). Only blocks that start inside the file's size (after this
    /// call) may be written: e2fsck wants the blocks past the size unwritten.
    fn fallocate_prealloc(&self, inode: &Inode, off: u64, end: u64, keep: bool) -> Result<()> {
        let ino = inode.ino;
        let bs = self.bs();
        // Not under an encrypted file: stored zeros are no ciphertext of zeros, and the
        // kernel would decrypt them into noise.
        let mut zeroed = self.opts.prealloc_zeroed
            && self.dev.zeroes_cheaply()
            && !crate::encrypt::is_encrypted(&inode.state.lock().raw);
        let first = off / bs;
        let last = (end - 1) / bs;
        let mut lblk = first;
        while lblk <= last {
            let mut h = self.start(credits::WRITE_PER_EXTENT + 4)?;
            let mut st = inode.state.lock();
            check_live(&st)?;
            if let Some(e) = self.ext_map(ino, &mut st, lblk as u32)? {
                lblk = e.lblk as u64 + e.len as u64;
                continue;
            }
            let size = if keep {
                st.raw.size()
            } else {
                st.raw.size().max(end)
            };
            let written = zeroed && lblk * bs < size;
            let upto = if written {
                last.min((size - 1) / bs)
            } else {
                last
            };
            let dev = &self.dev;
            let n = self.map_hole(&mut h, ino, &mut st, lblk, upto, !written, &mut |p, n| {
                if !written {
                    return Ok(false);
                }
                match dev.zero_range(p * bs, n as u64 * bs) {
                    Ok(()) => Ok(false),
                    // The filesystem under the image has no room for the zeroed pages (a
                    // sparse image on a small tmpfs): these blocks and the rest of the range
                    // get unwritten extents, which need no storage until written, as on the
                    // kernel's ext4. Reporting success over blocks with nothing under them let
                    // the first writes into them fail, and the journal's with them (the
                    // filesystem stopped, losing everything since the last commit).
                    Err(e) if crate::blockdev::is_backing_full(&e) => {
                        tracing::info!("{e}: preallocating unwritten extents instead");
                        zeroed = false;
                        Ok(true)
                    }
                    Err(e) => Err(e.into()),
                }
            })?;
            if !keep {
                let upto = end.min((lblk + n as u64) * bs);
                if upto > st.raw.size() {
                    st.raw.set_size(upto);
                }
            }
            self.mark_inode_dirty(&mut h, inode, &mut st)?;
            // ADD_RANGE for the new (unwritten) extents, as ext4_map_blocks tracks them.
            if n > 0 {
                self.fc_track(
                    &mut h,
                    ino,
                    &st,
                    Some((lblk as u32, (lblk + n as u64 - 1) as u32)),
                );
            }
            inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
            lblk += n as u64;
        }
        Ok(())
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`. Unwritten extents count as holes.
    pub fn lseek_data_hole(&self, ino: u32, off: u64, data: bool) -> Result<u64> {
        let inode = self.iget(ino)?;
        // Buffered data is mapped first, so its blocks count as data.
        self.retry_nospace(|| self.delalloc_writeback(&inode))?;
        let _g = inode.io_lock.read();
        let mut st = inode.state.lock();
        let size = st.raw.size();
        if off >= size {
            return Err(Error::Nxio);
        }
        if !Self::has_data_blocks(&st.raw) || st.raw.file_type() & S_IFMT != S_IFREG {
            return if data { Ok(off) } else { Ok(size) };
        }
        let bs = self.bs();
        let mut pos = off;
        if data {
            loop {
                let lblk = pos / bs;
                match self.ext_map(ino, &mut st, lblk as u32)? {
                    Some(e) if !e.unwritten => return Ok(pos),
                    Some(e) => pos = (e.lblk as u64 + e.len as u64) * bs,
                    None => match self.ext_next(ino, &mut st, lblk as u32)? {
                        Some(n) => pos = pos.max(n.lblk as u64 * bs),
                        None => return Err(Error::Nxio),
                    },
                }
                if pos >= size {
                    return Err(Error::Nxio);
                }
            }
        }
        loop {
            let lblk = pos / bs;
            match self.ext_map(ino, &mut st, lblk as u32)? {
                Some(e) if !e.unwritten => pos = (e.lblk as u64 + e.len as u64) * bs,
                _ => return Ok(pos.min(size)),
            }
            if pos >= size {
                return Ok(size);
            }
        }
    }

    /// The engine's counters as a JSON object.
    pub fn stats_json(&self) -> String {
        let t = &self.txn.stats;
        let io = &self.io;
        let s = &self.stats;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let user = l(&s.user_bytes_written).max(1);
        format!(
            concat!(
                "{{\"ops\":{},\"overwrites\":{},\"allocating_writes\":{},\"handles_started\":{},",
                "\"commits\":{},\"commit_blocks\":{},\"log_blocks\":{},\"fsync_already_committed\":{},",
                "\"lock_waits\":{},\"device_bytes_read\":{},\"device_bytes_written\":{},\"device_writes\":{},",
                "\"device_flushes\":{},\"user_bytes_read\":{},\"user_bytes_written\":{},\"zeroed_bytes\":{},",
                "\"device_bytes_per_user_byte\":{:.3},\"free_blocks\":{},\"free_inodes\":{},",
                "\"delalloc_bytes\":{},\"delalloc_writeback_runs\":{},\"checkpoints\":{},",
                "\"log_space_waits\":{},\"unjournaled_commits\":{},\"cached_inodes\":{},",
                "\"fast_commits\":{},\"fast_commit_blocks\":{},\"fast_commit_fallbacks\":{}}}"
            ),
            l(&s.ops),
            l(&s.overwrites),
            l(&s.allocating_writes),
            l(&t.handles_started),
            l(&t.commits),
            l(&t.commit_blocks),
            self.journal_log_blocks(),
            l(&t.fsync_already_committed),
            l(&t.barrier_waits),
            l(&io.bytes_read),
            l(&io.bytes_written),
            l(&io.writes),
            l(&io.flushes),
            l(&s.user_bytes_read),
            l(&s.user_bytes_written),
            l(&s.zeroed_bytes),
            l(&io.bytes_written) as f64 / user as f64,
            self.sb.free_blocks.load(Ordering::Relaxed),
            self.sb.free_inodes.load(Ordering::Relaxed),
            l(&self.delalloc.bytes),
            l(&self.delalloc.writeback_runs),
            self.journal.get().map_or(0, |j| j.checkpoint_batches()),
            self.journal
                .get()
                .map_or(0, |j| j.checkpoint_waits.load(Ordering::Relaxed)),
            l(&t.unjournaled_commits),
            self.icache.len(),
            l(&t.fast_commits),
            l(&t.fast_commit_blocks),
            l(&t.fast_commit_fallbacks),
        )
    }

    /// Log blocks written by the journal so far (0 without a journal).
    pub(crate) fn journal_log_blocks(&self) -> u64 {
        self.journal
            .get()
            .map(|j| j.log_blocks_written.load(Ordering::Relaxed))
            .unwrap_or(0)
    }
}

/// Fails with NotFound once the inode has been freed. Every path that changes an inode
/// checks this under its state lock. Unlink and a replacing rename hold the victim's io_lock,
/// so they cannot free an inode under a writer holding it; the allocating paths still re-check
/// each time they retake the state lock, because not every path that frees an inode holds its
/// io_lock (link's undo after it failed to add the entry, for one), and mapping blocks into a
/// freed inode leaks them.
pub(crate) fn check_live(st: &InodeState) -> Result<()> {
    if st.deleted {
        return Err(Error::NotFound);
    }
    Ok(())
}
