//! Directories (Documentation/filesystems/ext4/directory.rst): linear blocks of
//! `ext4_dir_entry_2`, each block ending in a checksum tail with metadata_csum, and the hashed
//! index of htree.rs on top for directories of more than one block. This file is the dispatch:
//! each operation goes to the inline form (inline.rs), the index (htree.rs) or a linear walk
//! over the blocks; dir/block.rs holds the work on one block, which the index shares.
//!
//! Every function here runs with the caller holding the directory's `io_lock` (shared for
//! lookups and iteration, exclusive for changes) and its `state` mutex (passed as `st`).
//! Directory blocks are file blocks of the directory mapped through its extent tree, read and
//! written through the buffer cache as metadata.
//!
//! readdir cookies: for a linear directory, the byte position of the next entry (entries never
//! move in a linear directory); for an indexed one, the entry's ((major hash >> 1) << 32 | minor
//! hash), as the kernel's hash2pos for 64-bit readers (the major hash's low bit is always 0, and
//! the cookie stays below 2^63 for callers that keep offsets signed), so that a cookie stays
//! meaningful when leaves split under a reader, as in the kernel's ext4_dx_readdir. "." and ".." of an
//! indexed directory come first with cookies 1 and 2.

use crate::error::{Error, Result};
use crate::format::casefold;
use crate::format::dir_entry::*;
use crate::format::inode::FL_INDEX;
use crate::format::put32;
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

pub(crate) mod block;

pub(crate) use block::{DirIterFn, NewEntry};

impl Fs {
    /// Whether the directory uses its index (the flag, and dir_index on the filesystem).
    pub(crate) fn is_indexed(&self, st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0 && self.geo.dir_index
    }

    /// Whether block 0 is laid out as a dx root (whether or not we use the index).
    pub(crate) fn has_index_flag(st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0
    }

    /// Finds `name`: (inode, type, block, offset).
    fn dir_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<Option<(u32, u8, u32, usize)>> {
        let fname = self.fname(dir, st, name)?;
        if Self::is_inline(&st.raw) {
            // Lookups only: removals and repoints edit the entries in place (inline.rs).
            return Ok(self
                .inline_dir_find(dir, st, &fname)?
                .map(|(i, t)| (i, t, 0, 0)));
        }
        if Self::has_index_flag(st) && (name == b"." || name == b"..") {
            return Ok(self
                .root_dot(dir, st, name == b"..")?
                .map(|(i, t, o)| (i, t, 0, o)));
        }
        if self.is_indexed(st) {
            return self.dx_find(dir, st, &fname);
        }
        let skip_index = Self::has_index_flag(st);
        let n = self.dir_blocks(st);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(dir, st, next, n)? {
            next = lblk + 1;
            if skip_index && (lblk == 0 || self.is_dx_node(&self.bcache.get(pblk)?.read())) {
                continue;
            }
            if let Some((i, t, o)) = self.leaf_find(dir, st, lblk, pblk, &fname)? {
                return Ok(Some((i, t, lblk, o)));
            }
        }
        Ok(None)
    }

    pub(crate) fn dir_lookup(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<Option<(u32, u8)>> {
        Ok(self.dir_find(dir, st, name)?.map(|(i, t, _, _)| (i, t)))
    }

    pub(crate) fn dir_init(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        parent: u32,
    ) -> Result<()> {
        if self.inline_dir_create(dir, st, parent)? {
            return Ok(());
        }
        let (_, p) = self.dir_append_block(h, dir, st)?;
        let mut b = vec![0u8; self.geo.block_size as usize];
        let ft = self.ft(FT_DIR);
        put_dirent(&mut b, 0, dir, 12, b".", ft);
        put_dirent(&mut b, 12, parent, self.leaf_space() - 12, b"..", ft);
        self.put_leaf(h, dir, st, p, &mut b)
    }

    pub(crate) fn dir_add(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<()> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(Error::NameTooLong);
        }
        if self.geo.casefold_strict && self.is_casefolded(st) && !casefold::is_valid(name) {
            // ext4_add_entry: strict encoding refuses what it cannot fold.
            return Err(Error::Invalid(
                "name is not valid UTF-8 (the filesystem's encoding is strict)".into(),
            ));
        }
        // In an encrypted directory the entry stores the encrypted name (and, casefolded
        // too, the hash of the folded plaintext after it).
        let (disk, hash) = self.disk_name(dir, st, name)?;
        let new = NewEntry {
            name: &disk,
            ino,
            ftype,
            hash,
        };
        if Self::is_inline(&st.raw) && self.inline_dir_add(h, dir, st, &new)? {
            return Ok(());
        }
        self.inline_convert(h, dir, st)?;
        let (size0, flags0) = (st.raw.size(), st.raw.flags());
        let r = self.dir_add_inner(h, dir, st, &new);
        if r.is_err() && (st.raw.size(), st.raw.flags()) != (size0, flags0) {
            // The directory grew (blocks, index) before the failure: the caller does not write
            // the inode on an error, so write it here to keep the blocks reachable.
            let _ = self.write_inode(h, dir, &mut st.raw);
        }
        r
    }

    fn dir_add_inner(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        new: &NewEntry<'_>,
    ) -> Result<()> {
        if self.is_indexed(st) {
            return self.dx_add(h, dir, st, new);
        }
        let skip_index = Self::has_index_flag(st);
        let n = self.dir_blocks(st);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(dir, st, next, n)? {
            next = lblk + 1;
            let (mut data, checked) = self.leaf_copy(dir, pblk)?;
            if skip_index && (lblk == 0 || self.is_dx_node(&data)) {
                continue;
            }
            if self.leaf_insert(dir, st, (lblk, pblk), (&mut data, checked), new)? {
                return self.put_leaf(h, dir, st, pblk, &mut data);
            }
        }
        if n == 1 && self.geo.dir_index && !skip_index {
            self.make_indexed(h, dir, st)?;
            return self.dx_add(h, dir, st, new);
        }
        let (_, pblk) = self.dir_append_block(h, dir, st)?;
        let mut data = self.pack_leaf([*new]);
        self.put_leaf(h, dir, st, pblk, &mut data)
    }

    pub(crate) fn dir_remove(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<(u32, u8)> {
        if name == b"." || name == b".." {
            return Err(Error::Invalid("cannot remove \".\" or \"..\"".into()));
        }
        if Self::is_inline(&st.raw) {
            return self
                .inline_dir_remove(h, dir, st, name)?
                .ok_or(Error::NotFound);
        }
        let Some((ino, ft, lblk, off)) = self.dir_find(dir, st, name)? else {
            return Err(Error::NotFound);
        };
        let (pblk, mut data) = self.dir_read(dir, st, lblk)?;
        let entries = self.dir_validate_block(dir, st, lblk, pblk, &data)?;
        let Some(i) = entries.iter().position(|e| e.off == off) else {
            return Err(self.dir_err(dir, lblk, pblk, "entry moved under a lock".into()));
        };
        if i == 0 {
            put32(&mut data, off, 0);
        } else {
            let prev = &entries[i - 1];
            set_rec_len(&mut data, prev.off, prev.rec_len + entries[i].rec_len);
        }
        self.put_leaf(h, dir, st, pblk, &mut data)?;
        Ok((ino, ft))
    }

    pub(crate) fn dir_set(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<(u32, u8)> {
        if Self::is_inline(&st.raw) {
            return self
                .inline_dir_set(h, dir, st, name, ino, ftype)?
                .ok_or(Error::NotFound);
        }
        let Some((old, oft, lblk, off)) = self.dir_find(dir, st, name)? else {
            return Err(Error::NotFound);
        };
        let (pblk, mut data) = self.dir_read(dir, st, lblk)?;
        put32(&mut data, off, ino);
        data[off + 7] = self.ft(ftype);
        if lblk == 0 && Self::has_index_flag(st) {
            self.put_dx(h, dir, st, pblk, &mut data, true)?;
        } else {
            self.put_leaf(h, dir, st, pblk, &mut data)?;
        }
        Ok((old, oft))
    }

    pub(crate) fn dir_is_empty(&self, dir: u32, st: &mut InodeState) -> Result<bool> {
        if Self::is_inline(&st.raw) {
            return Ok(self.inline_dir(dir, &st.raw)?.1.is_empty());
        }
        let skip_index = Self::has_index_flag(st);
        let n = self.dir_blocks(st);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(dir, st, next, n)? {
            next = lblk + 1;
            let buf = self.bcache.get(pblk)?;
            let data = buf.read();
            if skip_index && (lblk == 0 || self.is_dx_node(&data)) {
                continue;
            }
            for e in self.dir_validate_block(dir, st, lblk, pblk, &data)? {
                if e.inode == 0 {
                    continue;
                }
                let n = e.name(&data);
                if !(lblk == 0 && (n == b"." || n == b"..")) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    pub(crate) fn dir_iter(
        &self,
        dir: u32,
        st: &mut InodeState,
        offset: u64,
        f: &mut DirIterFn<'_>,
    ) -> Result<()> {
        if Self::is_inline(&st.raw) {
            return self.inline_dir_iter(dir, st, offset, f);
        }
        if self.is_indexed(st) {
            return self.dx_iter(dir, st, offset, f);
        }
        let bs = self.geo.block_size as u64;
        let skip_index = Self::has_index_flag(st);
        let mut lblk = (offset / bs).min(u32::MAX as u64) as u32;
        let n = self.dir_blocks(st);
        while let Some((at, pblk)) = self.dir_next_block(dir, st, lblk, n)? {
            lblk = at;
            let data = self.bcache.get(pblk)?.read().to_vec();
            let base = lblk as u64 * bs;
            if skip_index && lblk == 0 {
                // A dx root read linearly (dir_index off): only "." and "..".
                for (dotdot, next) in [(false, 12u64), (true, bs)] {
                    let (ino, ft, off) = self.root_dot(dir, st, dotdot)?.unwrap_or((0, 0, 0));
                    if (off as u64) < offset || ino == 0 {
                        continue;
                    }
                    let nm: &[u8] = if dotdot { b".." } else { b"." };
                    if !f(next, ino, ft, nm, None) {
                        return Ok(());
                    }
                }
                lblk += 1;
                continue;
            }
            if skip_index && self.is_dx_node(&data) {
                lblk += 1;
                continue;
            }
            for e in self.dir_validate_block(dir, st, lblk, pblk, &data)? {
                let pos = base + e.off as u64;
                if pos < offset || e.inode == 0 {
                    continue;
                }
                let stored = self.entry_stored_hash(st, &data, &e);
                if !f(
                    pos + e.rec_len as u64,
                    e.inode,
                    e.ftype,
                    e.name(&data),
                    stored,
                ) {
                    return Ok(());
                }
            }
            lblk += 1;
        }
        Ok(())
    }
}
