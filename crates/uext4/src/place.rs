//! Placing a new file's data, for image builders: the engine allocates and maps the blocks on
//! the caller's thread, and the bytes are copied into them afterwards, from any thread, by the
//! kernel where it can (copy_file_range from the source file). A builder thus keeps the data
//! copy off the thread that makes entries, and the data never passes through user memory.
//!
//! The price is an ordering duty on the caller: the extents are written (not unwritten) at
//! once, so the data must be on the device before the transaction that maps it commits
//! (DESIGN.md R4). A builder copies everything placed before each [`Fs::commit`] or
//! [`Fs::sync`] it calls, and before it removes a file whose data is still on its way (freed
//! blocks are reused only after a commit). The engine may still commit on its own (a full
//! journal, the background committer) while data is on its way, so a crash can leave placed
//! blocks mapped with what they held before: a builder places data only on an image it made
//! afresh, whose free blocks read as zeros (the CLI: `mkfs -d` onto a new file), and writes
//! through [`Fs::write_all`] elsewhere.

use crate::error::{Error, Result};
use crate::format::inode::S_IFREG;
use crate::fs::Fs;
use crate::transaction::credits;
use std::fs::File;
use std::sync::atomic::Ordering;

/// Where a piece of a new file's data goes: file bytes `[file_off, file_off + len)`, in whole
/// blocks of which the bytes past `len` must read as zeros. From [`Fs::place_new_data`];
/// written with [`Fs::fill_placed`].
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// The first file byte of the piece.
    pub file_off: u64,
    /// Bytes of data in the piece.
    pub len: u64,
    /// Device byte of `file_off`.
    dev_off: u64,
    /// Bytes of the piece's blocks (`len` rounded up to the block size).
    space: u64,
}

impl Fs {
    /// Gives the empty regular file `ino` written blocks for its first `size` bytes, sets its
    /// size to `size`, and returns where each piece of data goes, in file order. Blocks are
    /// allocated exactly as a write of `size` bytes at offset 0 would allocate them. The caller
    /// must write every piece with [`Fs::fill_placed`] before the next commit (module docs).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a file that is not regular or not empty, or that a write of
    /// `size` bytes would keep inline (inline_data: write it instead);
    /// [`Error::FileTooBig`], [`Error::NoSpace`] and what a write reports. After an error the
    /// file is empty again (the blocks placed before it are freed), and the caller writes the
    /// whole file the ordinary way ([`Fs::write_all`]) instead.
    pub fn place_new_data(&self, ino: u32, size: u64) -> Result<Vec<Placed>> {
        self.check_writable()?;
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut began = false;
        let r = self.place_blocks(ino, size, &mut began);
        if r.is_err() && began {
            // No piece was handed out: nothing will write the blocks mapped so far.
            let _ = self.truncate(ino, 0);
        }
        r
    }

    /// `place_new_data`'s allocation, under the file's io_lock; `began` once the file was
    /// found new and blocks may be mapped.
    fn place_blocks(&self, ino: u32, size: u64, began: &mut bool) -> Result<Vec<Placed>> {
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        if self.inline_would_hold(&inode, size)? {
            // A new file this small goes inline (inline_write.rs), as mke2fs -d and the kernel
            // keep it: the caller writes it (the documented fallback of an error here).
            return Err(Error::Invalid(
                "a new file this small is kept inline".into(),
            ));
        }
        self.inline_convert_file(&inode)?;
        {
            let st = inode.state.lock();
            crate::file::check_live(&st)?;
            if st.raw.file_type() != S_IFREG || st.raw.size() != 0 || st.delalloc.is_some() {
                return Err(Error::Invalid("not a new regular file".into()));
            }
            if size > self.max_size_of(&st.raw) {
                return Err(Error::FileTooBig);
            }
        }
        *began = true;
        let bs = self.geo.block_size as u64;
        let last = (size - 1) / bs;
        let mut out = Vec::new();
        let mut lblk = 0u64;
        while lblk <= last {
            let mut h = self.start(credits::WRITE_PER_EXTENT + 4)?;
            let mut st = inode.state.lock();
            crate::file::check_live(&st)?;
            let first = lblk;
            let n = self.map_hole(&mut h, ino, &mut st, lblk, last, false, &mut |p, n| {
                let file_off = first * bs;
                let space = n as u64 * bs;
                out.push(Placed {
                    file_off,
                    len: space.min(size - file_off),
                    dev_off: p * bs,
                    space,
                });
                Ok(false)
            })?;
            lblk += n as u64;
            self.finish_write_step(&mut h, &inode, &mut st, size.min(lblk * bs), size)?;
        }
        self.stats.allocating_writes.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Writes the placed piece `p` from `src`, whose byte `src_off` is the piece's first, and
    /// zeros in the rest of its blocks. Safe from any thread. Returns how many bytes of data
    /// `src` gave: fewer than `p.len` where it ended sooner (the rest is zeros then).
    ///
    /// # Errors
    /// What the device or the source report.
    pub fn fill_placed(&self, p: &Placed, src: &File, src_off: u64) -> Result<u64> {
        self.check_writable()?;
        let got = self.dev.copy_new_from(p.dev_off, src, src_off, p.len)?;
        let mut at = got;
        while at < p.space {
            static Z: [u8; 65536] = [0; 65536];
            let n = (p.space - at).min(Z.len() as u64);
            self.dev.write_new_at(p.dev_off + at, &Z[..n as usize])?;
            at += n;
        }
        self.stats
            .user_bytes_written
            .fetch_add(got, Ordering::Relaxed);
        self.stats
            .zeroed_bytes
            .fetch_add(p.space - got, Ordering::Relaxed);
        Ok(got)
    }
}
