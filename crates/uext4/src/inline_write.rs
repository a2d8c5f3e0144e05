//! Inline data made and grown by uext4, as fs/ext4/inline.c makes it (the format and the
//! reading side are inline.rs's).
//!
//! Which inodes may go inline: the kernel's EXT4_STATE_MAY_INLINE_DATA, an in-memory state
//! (`InodeState::may_inline`). ext4_new_inode sets it for every new inode on an inline_data
//! filesystem, but not for DAX files; an encryption context clears it (ext4_set_context), so
//! encrypted files and directories never go inline; and a symlink never uses it (ext4_symlink
//! writes a long target to a block). An inode read from disk has it only when it is inline
//! already, so a block-mapped file stays block-mapped: only a file created in this mount and
//! still empty starts inline, as with the kernel (`touch f; sync; drop caches; echo x >> f`
//! gives a block there too).
//!
//! How much fits: i_block's 60 bytes and the value of "system.data", which must stay in the
//! inode (never an xattr block): the space of the in-inode attribute area less the header, the
//! other in-inode attributes, the "system.data" entry and the list terminator
//! (get_max_inline_xattr_value_size). With 256-byte inodes and no other attribute that is 68
//! bytes, 128 in all; 128-byte inodes have no such area and nothing goes inline.
//!
//! Files (ext4_try_to_write_inline_data, ext4_write_inline_data_end): a write whose end fits
//! stays inline; "system.data" grows to cover it (never shrinks on a write), the bytes between
//! the old size and the write are zeros. A write past what fits converts the file to a block
//! first (inline.rs's `inline_convert`, all or nothing) and takes the block path. A truncate
//! keeps the file inline while the new size is within what the inode holds now (60 bytes plus
//! the value's length): shrinking cuts the value to the new size and zeroes i_block past it
//! (ext4_inline_data_truncate); growing past it converts, as the kernel's writeback of the
//! extended page does. fallocate (every mode) and verity convert, as ext4_fallocate's
//! ext4_convert_inline_data, which also ends EXT4_STATE_MAY_INLINE_DATA on a file not yet
//! inline.
//!
//! Directories (ext4_try_create_inline_dir, ext4_try_add_inline_entry): a new directory holds
//! its parent's number and one unused entry over the other 56 bytes of i_block, with an empty
//! "system.data", size 60. A name goes into the first run with room (ext4_find_dest_de: an
//! unused entry or the slack after a live one); when i_block is full and the value is still
//! empty, the value grows at once to all the inode holds, as one unused entry (only if that
//! is more than a one-byte name's 12 bytes: ext4_update_inline_dir), and the size with it;
//! when both runs are full the directory converts to a block (inline.rs) and the name goes
//! there. Every change is written through the operation's handle: the inode's table block is
//! journaled metadata, so a crash leaves the change whole or absent.

use crate::dir::block::NewEntry;
use crate::error::{Corruption, Error, Result};
use crate::fname::dirent_rec_len;
use crate::format::dir_entry::{put_dirent, set_rec_len};
use crate::format::features::INCOMPAT_INLINE_DATA;
use crate::format::inode::{RawInode, FL_EXTENTS, FL_INLINE_DATA, I_BLOCK_SIZE, S_IFREG};
use crate::format::put32;
use crate::format::xattr::{list_len, write_ibody, XattrEntry, IBODY_HEADER_LEN, INDEX_SYSTEM};
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::{credits, Handle};
use std::sync::atomic::Ordering;

/// The name of the attribute that holds the bytes past i_block ("system.data").
const DATA_NAME: &[u8] = b"data";
/// Where an inline directory's entries start in i_block (after the parent's number).
const DIR_START: usize = 4;

fn data_entry(value: Vec<u8>) -> XattrEntry {
    XattrEntry {
        index: INDEX_SYSTEM,
        name: DATA_NAME.to_vec(),
        value,
        ea: None,
    }
}

fn is_data(e: &XattrEntry) -> bool {
    e.index == INDEX_SYSTEM && e.name == DATA_NAME
}

/// Puts `new` into a run of directory entries (`entries` parsed from it) where there is room,
/// as ext4_find_dest_de and ext4_insert_dentry: the first unused entry big enough, or the
/// first live one with enough slack after its name. False when none has room.
fn run_insert(
    run: &mut [u8],
    entries: &[crate::dir::block::Dirent],
    new: &NewEntry<'_>,
    ft: u8,
) -> bool {
    let need = dirent_rec_len(new.name.len(), false);
    for e in entries {
        if e.inode == 0 && e.rec_len >= need {
            put_dirent(run, e.off, new.ino, e.rec_len, new.name, ft);
            return true;
        }
        let used = dirent_rec_len(e.name_len, false);
        if e.inode != 0 && e.rec_len >= used + need {
            set_rec_len(run, e.off, used);
            put_dirent(run, e.off + used, new.ino, e.rec_len - used, new.name, ft);
            return true;
        }
    }
    false
}

impl Fs {
    /// Whether the filesystem has the inline_data feature.
    pub(crate) fn has_inline_data(&self) -> bool {
        self.sb.lock().has_incompat(INCOMPAT_INLINE_DATA)
    }

    /// EXT4_STATE_MAY_INLINE_DATA for a new inode (see the module notes): regular files and
    /// directories, not DAX or encrypted, on an inline_data filesystem.
    pub(crate) fn may_inline_new(&self, raw: &RawInode) -> bool {
        let kind = raw.file_type();
        let no = crate::flags::FL_DAX | crate::flags::FL_ENCRYPT;
        (kind == S_IFREG || raw.is_dir()) && raw.flags() & no == 0 && self.has_inline_data()
    }

    /// The longest "system.data" value the inode can hold, beside its other in-inode
    /// attributes (see the module notes); None when not even an empty one fits.
    fn inline_max_value(&self, ino: u32, raw: &RawInode) -> Result<Option<usize>> {
        let Some(area) = raw.xattr_area() else {
            return Ok(None);
        };
        let others: usize = self
            .xattr_load_ibody(ino, raw)?
            .iter()
            .filter(|e| !is_data(e))
            .map(|e| e.cost())
            .sum();
        let fixed = IBODY_HEADER_LEN + others + data_entry(Vec::new()).entry_len() + 4;
        Ok(area.len().checked_sub(fixed).map(|room| room & !3))
    }

    /// Stores an inline inode's contents: `bytes[..60]` into i_block (zero padded) and the
    /// rest as the "system.data" value, rewriting the in-inode attribute area with the other
    /// in-inode attributes as they are; sets the inline flag (and clears the extent flag, as
    /// ext4_create_inline_data). In memory only: the caller writes the inode through its
    /// handle. NoSpace (nothing changed) when the value does not fit beside the others.
    fn inline_store(&self, ino: u32, raw: &mut RawInode, bytes: &[u8]) -> Result<()> {
        let value = bytes.get(I_BLOCK_SIZE..).unwrap_or(&[]).to_vec();
        let mut entries: Vec<XattrEntry> = self
            .xattr_load_ibody(ino, raw)?
            .into_iter()
            .filter(|e| !is_data(e))
            .collect();
        entries.push(data_entry(value));
        let Some(area) = raw.xattr_area() else {
            return Err(Error::NoSpace);
        };
        if IBODY_HEADER_LEN + list_len(&entries) > area.len() {
            return Err(Error::NoSpace);
        }
        write_ibody(&mut raw.0[area], &entries);
        let n = bytes.len().min(I_BLOCK_SIZE);
        let ib = raw.i_block_mut();
        ib.fill(0);
        ib[..n].copy_from_slice(&bytes[..n]);
        raw.set_flags((raw.flags() | FL_INLINE_DATA) & !FL_EXTENTS);
        Ok(())
    }

    /// Whether a first write of `size` bytes to this new, empty file would keep it inline.
    pub(crate) fn inline_would_hold(&self, inode: &Inode, size: u64) -> Result<bool> {
        let st = inode.state.lock();
        if !st.may_inline || st.raw.size() != 0 || Self::is_inline(&st.raw) {
            return Ok(false);
        }
        let max = self.inline_max_value(inode.ino, &st.raw)?;
        Ok(max.is_some_and(|v| size <= (I_BLOCK_SIZE + v) as u64))
    }

    /// A write of `data` at `off` to an inline file, or to a new empty one that may go
    /// inline, the caller holding `io_lock` exclusively (see the module notes). True when
    /// written inline (size and times set, in a handle of its own); false when the caller must
    /// write through blocks: the file is then not inline (converted here if it was).
    pub(crate) fn inline_write(&self, inode: &Inode, off: u64, data: &[u8]) -> Result<bool> {
        let end = off.saturating_add(data.len() as u64);
        {
            let mut st = inode.state.lock();
            let inline = Self::is_inline(&st.raw);
            // Empty and mapping nothing (every path that maps a block ends `may_inline`; the
            // extent root is checked all the same).
            let unmapped = if st.raw.flags() & FL_EXTENTS != 0 {
                crate::format::le16(st.raw.i_block(), 2) == 0
            } else {
                st.raw.i_block().iter().all(|&b| b == 0) // a block map's pointers
            };
            let fresh =
                st.may_inline && st.raw.size() == 0 && st.raw.file_type() == S_IFREG && unmapped;
            if !inline && !fresh {
                st.may_inline = false;
                return Ok(false);
            }
            let max = self.inline_max_value(inode.ino, &st.raw)?;
            let fits = max.is_some_and(|v| end <= (I_BLOCK_SIZE + v) as u64);
            if !fits {
                st.may_inline = false;
                drop(st);
                self.inline_convert_file(inode)?;
                return Ok(false);
            }
        }
        self.check_writable()?;
        let mut h = self.start(credits::SETATTR)?;
        let mut st = inode.state.lock();
        crate::file::check_live(&st)?;
        let size = st.raw.size();
        let mut bytes = if Self::is_inline(&st.raw) {
            self.inline_bytes(inode.ino, &st.raw)?
        } else {
            Vec::new()
        };
        let cap = bytes.len().max(end as usize).max(I_BLOCK_SIZE);
        bytes.resize(cap, 0);
        // Nothing past the size shows: zeros there, whatever a careless writer left.
        bytes[(size as usize).min(cap)..].fill(0);
        bytes[off as usize..end as usize].copy_from_slice(data);
        self.inline_store(inode.ino, &mut st.raw, &bytes)?;
        let now = self.now();
        st.raw.set_size(size.max(end));
        st.raw.set_mtime(now);
        st.raw.set_ctime(now);
        st.extents = None;
        self.mark_inode_dirty(&mut h, inode, &mut st)?;
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(true)
    }

    /// A truncate of an inline file to `size`, the caller holding `io_lock` exclusively: true
    /// when done in place (within what the inode holds now; see the module notes), false when
    /// the caller truncates through blocks (the file converted here if it was inline).
    pub(crate) fn inline_truncate(&self, inode: &Inode, size: u64) -> Result<bool> {
        {
            let st = inode.state.lock();
            if !Self::is_inline(&st.raw) {
                return Ok(false);
            }
            if st.raw.file_type() != S_IFREG {
                return Ok(false); // refused by the caller's checks
            }
            crate::file::check_live(&st)?;
            crate::flags::may_truncate(&st.raw)?;
            let cap = self.inline_bytes(inode.ino, &st.raw)?.len();
            if size > cap as u64 {
                drop(st);
                self.inline_convert_file(inode)?;
                return Ok(false);
            }
        }
        let mut h = self.start(credits::SETATTR)?;
        let mut st = inode.state.lock();
        crate::file::check_live(&st)?;
        let old = st.raw.size();
        let mut bytes = self.inline_bytes(inode.ino, &st.raw)?;
        if size < old {
            bytes.truncate((size as usize).max(I_BLOCK_SIZE));
        }
        let keep = (size.min(old) as usize).min(bytes.len());
        bytes[keep..].fill(0);
        self.inline_store(inode.ino, &mut st.raw, &bytes)?;
        st.raw.set_size(size);
        let now = self.now();
        if size != old {
            st.raw.set_mtime(now);
        }
        st.raw.set_ctime(now);
        if st.orphaned && st.raw.links_count() > 0 {
            self.orphan_del(&mut h, inode, &mut st)?;
        }
        self.mark_inode_dirty(&mut h, inode, &mut st)?;
        inode.last_data_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(true)
    }

    /// Makes a new directory inline (ext4_try_create_inline_dir): the parent's number, one
    /// unused entry over the rest of i_block, an empty "system.data", size 60. False, nothing
    /// changed, when the directory may not go inline or the attribute does not fit. In
    /// memory: the creator writes the inode through its handle.
    pub(crate) fn inline_dir_create(
        &self,
        dir: u32,
        st: &mut InodeState,
        parent: u32,
    ) -> Result<bool> {
        if !st.may_inline || !st.raw.is_dir() {
            return Ok(false);
        }
        let mut b = vec![0u8; I_BLOCK_SIZE];
        put32(&mut b, 0, parent);
        put_dirent(&mut b, DIR_START, 0, I_BLOCK_SIZE - DIR_START, b"", 0);
        match self.inline_store(dir, &mut st.raw, &b) {
            Ok(()) => {}
            Err(Error::NoSpace) => {
                st.may_inline = false;
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        st.raw.set_size(I_BLOCK_SIZE as u64);
        st.extents = None;
        Ok(true)
    }

    /// Adds `new` to an inline directory where it fits (see the module notes), writing the
    /// inode through `h`. False when neither run has room: the caller converts the directory
    /// (which may have grown its value meanwhile, written too) and adds the name to the block.
    pub(crate) fn inline_dir_add(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        new: &NewEntry<'_>,
    ) -> Result<bool> {
        self.inline_dir(dir, &st.raw)?; // checks every entry of both runs
        let mut all = self.inline_bytes(dir, &st.raw)?;
        let ft = self.ft(new.ftype);
        let noerr = |why: String| Error::corrupt(Corruption::InlineData, why);
        let first = self.dir_parse_entries(&all[DIR_START..I_BLOCK_SIZE], &noerr)?;
        if run_insert(&mut all[DIR_START..I_BLOCK_SIZE], &first, new, ft) {
            self.inline_store(dir, &mut st.raw, &all)?;
            self.write_inode(h, dir, &mut st.raw)?;
            return Ok(true);
        }
        if all.len() == I_BLOCK_SIZE {
            // ext4_update_inline_dir: the value grows to all there is, one unused entry.
            let max = self.inline_max_value(dir, &st.raw)?.unwrap_or(0);
            if max <= crate::format::dir_entry::MIN_REC_LEN {
                return Ok(false);
            }
            all.resize(I_BLOCK_SIZE + max, 0);
            put_dirent(&mut all[I_BLOCK_SIZE..], 0, 0, max, b"", 0);
            self.inline_store(dir, &mut st.raw, &all)?;
            st.raw.set_size(all.len() as u64);
            self.write_inode(h, dir, &mut st.raw)?;
        }
        let second = self.dir_parse_entries(&all[I_BLOCK_SIZE..], &noerr)?;
        if run_insert(&mut all[I_BLOCK_SIZE..], &second, new, ft) {
            self.inline_store(dir, &mut st.raw, &all)?;
            self.write_inode(h, dir, &mut st.raw)?;
            return Ok(true);
        }
        Ok(false)
    }
}
