//! Directories (Documentation/filesystems/ext4/directory.rst): linear blocks of
//! `ext4_dir_entry_2`, each block ending in a checksum tail with metadata_csum, and the hashed
//! index of htree.rs on top for directories of more than one block. This file holds the linear
//! blocks and the dispatch: each operation goes to the inline form (inline.rs), the index
//! (htree.rs) or the linear walk.
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
use crate::format::dir_entry::*;
use crate::format::extent::Extent;
use crate::format::inode::{RawInode, FL_INDEX};
use crate::format::{le16, le32, put32};
use crate::fs::Fs;
use crate::htree::Hashed;
use crate::inode::InodeState;
use crate::transaction::Handle;

pub use crate::format::dir_entry::rec_len_for;

/// One entry as parsed (and checked) from a block.
#[derive(Clone, Debug)]
pub(crate) struct Dirent {
    pub off: usize,
    pub inode: u32,
    pub rec_len: usize,
    pub name_len: usize,
    pub ftype: u8,
}

impl Dirent {
    fn used(&self) -> usize {
        if self.inode == 0 {
            0
        } else {
            rec_len_for(self.name_len)
        }
    }
    pub(crate) fn name<'a>(&self, b: &'a [u8]) -> &'a [u8] {
        &b[self.off + DIRENT_HEADER..self.off + DIRENT_HEADER + self.name_len]
    }
}

/// readdir's callback: (next offset, inode, file type, name) -> continue?
pub(crate) type DirIterFn<'a> = dyn FnMut(u64, u32, u8, &[u8]) -> bool + 'a;

impl Fs {
    pub(crate) fn dir_seed(&self, ino: u32, raw: &RawInode) -> u32 {
        RawInode::csum_seed(self.geo.csum_seed, ino, raw.generation())
    }

    /// Bytes of a leaf block available to entries (the tail takes the last 12 with checksums).
    pub(crate) fn leaf_space(&self) -> usize {
        self.geo.block_size as usize
            - if self.geo.metadata_csum {
                DIRENT_TAIL_SIZE
            } else {
                0
            }
    }

    pub(crate) fn ft(&self, ftype: u8) -> u8 {
        if self.geo.filetype {
            ftype
        } else {
            0
        }
    }

    pub(crate) fn dir_err(&self, dir: u32, lblk: u32, pblk: u64, what: String) -> Error {
        self.fail(
            Error::corrupt(format!("directory inode {dir}, block {lblk}: {what}")),
            dir,
            pblk,
            "dir",
        )
    }

    pub(crate) fn dir_csum_err(&self, dir: u32, lblk: u32, pblk: u64, what: &str) -> Error {
        self.fail(
            Error::BadChecksum(format!(
                "directory inode {dir}, block {lblk} (physical {pblk}): {what}"
            )),
            dir,
            pblk,
            "dir",
        )
    }

    /// Physical block of directory block `lblk`, None for a hole.
    fn dir_pblk_opt(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<Option<u64>> {
        match self.ext_map(dir, st, lblk)? {
            Some(e) if !e.unwritten && lblk >= e.lblk && lblk - e.lblk < e.len => {
                Ok(Some(e.pblk + (lblk - e.lblk) as u64))
            }
            _ => Ok(None),
        }
    }

    /// The first mapped directory block at or after `lblk` and before `end`, with its physical
    /// block. Holes (and unwritten extents) are skipped in one step, as the kernel's readdir
    /// does: a corrupted i_size far past the last block must not cost a lookup per missing
    /// block (found by fuzzing: a walk that looked hung).
    fn dir_next_block(
        &self,
        dir: u32,
        st: &mut InodeState,
        mut lblk: u32,
        end: u32,
    ) -> Result<Option<(u32, u64)>> {
        while lblk < end {
            let Some(e) = self.ext_next(dir, st, lblk)? else {
                return Ok(None);
            };
            if e.unwritten {
                lblk = e.end().min(u32::MAX as u64) as u32;
                continue;
            }
            let at = lblk.max(e.lblk);
            if at >= end {
                return Ok(None);
            }
            return Ok(Some((at, e.pblk + (at - e.lblk) as u64)));
        }
        Ok(None)
    }

    /// Physical block of directory block `lblk`; a hole is corruption.
    pub(crate) fn dir_pblk(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<u64> {
        match self.dir_pblk_opt(dir, st, lblk)? {
            Some(p) => Ok(p),
            None => Err(self.dir_err(dir, lblk, 0, "hole in directory".into())),
        }
    }

    pub(crate) fn dir_blocks(&self, st: &InodeState) -> u32 {
        (st.raw.size() / self.geo.block_size as u64).min(u32::MAX as u64) as u32
    }

    /// A copy of directory block `lblk`: (physical block, bytes).
    pub(crate) fn dir_read(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
    ) -> Result<(u64, Vec<u8>)> {
        let pblk = self.dir_pblk(dir, st, lblk)?;
        let data = self.bcache.get(pblk)?.read().to_vec();
        Ok((pblk, data))
    }

    /// Checks a leaf block (every entry's rec_len, name_len and inode; the checksum tail with
    /// metadata_csum) and returns its entries, the unused ones included.
    pub(crate) fn dir_validate_block(
        &self,
        dir: u32,
        st: &InodeState,
        lblk: u32,
        pblk: u64,
        b: &[u8],
    ) -> Result<Vec<Dirent>> {
        let bs = b.len();
        let mut end = bs;
        if self.geo.metadata_csum {
            if !has_tail(b) {
                return Err(self.dir_csum_err(dir, lblk, pblk, "no directory checksum tail"));
            }
            end = bs - DIRENT_TAIL_SIZE;
            let want = crate::format::csum::crc32c(self.dir_seed(dir, &st.raw), &b[..end]);
            if tail_csum(b) != want {
                return Err(self.dir_csum_err(dir, lblk, pblk, "leaf checksum mismatch"));
            }
        }
        self.dir_parse_entries(&b[..end], &|why| self.dir_err(dir, lblk, pblk, why))
    }

    /// Checks and returns the entries of one run of them (a leaf block up to its tail, or a
    /// part of an inline directory), the unused ones included; `err` names the place.
    pub(crate) fn dir_parse_entries(
        &self,
        b: &[u8],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Vec<Dirent>> {
        let end = b.len();
        let mut out = Vec::new();
        let mut off = 0;
        while off < end {
            if off + DIRENT_HEADER > end {
                return Err(err(format!("entry at offset {off} overruns the block")));
            }
            let rec_len = rec_len_from_disk(le16(b, off + 4), self.geo.block_size as usize);
            let name_len = b[off + 6] as usize;
            let inode = le32(b, off);
            let bad = if rec_len < MIN_REC_LEN {
                Some("rec_len is smaller than minimal")
            } else if !rec_len.is_multiple_of(4) {
                Some("rec_len % 4 != 0")
            } else if off + rec_len > end {
                Some("directory entry overrun")
            } else if rec_len < rec_len_for(name_len) {
                Some("rec_len is too small for name_len")
            } else if inode != 0 && name_len == 0 {
                Some("empty name")
            } else if inode > self.geo.inodes_count {
                Some("inode out of bounds")
            } else {
                None
            };
            if let Some(why) = bad {
                return Err(err(format!(
                    "bad entry at offset {off}: {why} (inode {inode}, rec_len {rec_len}, \
                     name_len {name_len})"
                )));
            }
            out.push(Dirent {
                off,
                inode,
                rec_len,
                name_len,
                ftype: self.ft(b[off + 7]),
            });
            off += rec_len;
        }
        Ok(out)
    }

    /// Writes the checksum tail of a leaf block.
    fn set_leaf_csum(&self, dir: u32, st: &InodeState, b: &mut [u8]) {
        if !self.geo.metadata_csum {
            return;
        }
        set_tail_csum(b, self.dir_seed(dir, &st.raw));
    }

    /// Whether the directory uses its index (the flag, and dir_index on the filesystem).
    pub(crate) fn is_indexed(&self, st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0 && self.geo.dir_index
    }

    /// Whether block 0 is laid out as a dx root (whether or not we use the index).
    pub(crate) fn has_index_flag(st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0
    }

    /// Searches one leaf block for `name`: (inode, type, offset).
    pub(crate) fn leaf_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
        pblk: u64,
        name: &[u8],
    ) -> Result<Option<(u32, u8, usize)>> {
        let buf = self.bcache.get(pblk)?;
        let data = buf.read();
        for e in self.dir_validate_block(dir, st, lblk, pblk, &data)? {
            if e.inode != 0 && e.name_len == name.len() && e.name(&data) == name {
                return Ok(Some((e.inode, e.ftype, e.off)));
            }
        }
        Ok(None)
    }

    /// Finds `name`: (inode, type, block, offset).
    fn dir_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<Option<(u32, u8, u32, usize)>> {
        if Self::is_inline(&st.raw) {
            // Only lookups get here: changes convert the directory first.
            return Ok(self
                .inline_dir_find(dir, st, name)?
                .map(|(i, t)| (i, t, 0, 0)));
        }
        if Self::has_index_flag(st) && (name == b"." || name == b"..") {
            return Ok(self
                .root_dot(dir, st, name == b"..")?
                .map(|(i, t, o)| (i, t, 0, o)));
        }
        if self.is_indexed(st) {
            return self.dx_find(dir, st, name);
        }
        let skip_index = Self::has_index_flag(st);
        let n = self.dir_blocks(st);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(dir, st, next, n)? {
            next = lblk + 1;
            if skip_index && (lblk == 0 || self.is_dx_node(&self.bcache.get(pblk)?.read())) {
                continue;
            }
            if let Some((i, t, o)) = self.leaf_find(dir, st, lblk, pblk, name)? {
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

    /// Writes a changed leaf block through the handle (checksum tail first).
    pub(crate) fn put_leaf(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &InodeState,
        pblk: u64,
        data: &mut [u8],
    ) -> Result<()> {
        self.set_leaf_csum(dir, st, data);
        let buf = self.bcache.get(pblk)?;
        buf.write().copy_from_slice(data);
        h.dirty(&buf);
        Ok(())
    }

    /// Tries to put an entry into a leaf block in memory: an unused entry big enough, or the
    /// slack after a live one. Returns false if there is no room.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn leaf_insert(
        &self,
        dir: u32,
        st: &InodeState,
        lblk: u32,
        pblk: u64,
        data: &mut [u8],
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<bool> {
        let need = rec_len_for(name.len());
        let ft = self.ft(ftype);
        for e in self.dir_validate_block(dir, st, lblk, pblk, data)? {
            if e.inode == 0 && e.rec_len >= need {
                put_dirent(data, e.off, ino, e.rec_len, name, ft);
                return Ok(true);
            }
            let used = e.used();
            if e.inode != 0 && e.rec_len >= used + need {
                set_rec_len(data, e.off, used);
                put_dirent(data, e.off + used, ino, e.rec_len - used, name, ft);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Appends a block to the directory (allocated near its last block, or near the inode
    /// table of its group); grows i_size. Returns (lblk, pblk); the caller fills the block.
    pub(crate) fn dir_append_block(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
    ) -> Result<(u32, u64)> {
        let lblk = self.dir_blocks(st);
        if lblk >= u32::MAX - 1 {
            return Err(Error::NoSpace);
        }
        let last = match lblk.checked_sub(1) {
            Some(l) => self.dir_pblk_opt(dir, st, l)?,
            None => None,
        };
        let goal = match last {
            Some(p) => p + 1,
            None => self.group_desc(self.geo.ino_group(dir)).inode_table(),
        };
        h.extend(4);
        let (p, _) = self.alloc_blocks(h, goal, 1)?;
        if let Err(e) = self.ext_insert(
            h,
            dir,
            st,
            Extent {
                lblk,
                len: 1,
                pblk: p,
                unwritten: false,
            },
        ) {
            let _ = self.free_blocks(h, p, 1, true);
            return Err(e);
        }
        st.raw
            .set_size((lblk as u64 + 1) * self.geo.block_size as u64);
        self.bcache.get_new(p)?;
        Ok((lblk, p))
    }

    /// An empty leaf block image (one unused entry over the whole space, and the tail).
    pub(crate) fn empty_leaf(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.geo.block_size as usize];
        set_rec_len(&mut b, 0, self.leaf_space());
        if self.geo.metadata_csum {
            put_tail(&mut b, 0);
        }
        b
    }

    pub(crate) fn dir_init(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        parent: u32,
    ) -> Result<()> {
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
        self.inline_convert(h, dir, st)?;
        let (size0, flags0) = (st.raw.size(), st.raw.flags());
        let r = self.dir_add_inner(h, dir, st, name, ino, ftype);
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
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<()> {
        if self.is_indexed(st) {
            return self.dx_add(h, dir, st, name, ino, ftype);
        }
        let skip_index = Self::has_index_flag(st);
        let n = self.dir_blocks(st);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(dir, st, next, n)? {
            next = lblk + 1;
            let mut data = self.bcache.get(pblk)?.read().to_vec();
            if skip_index && (lblk == 0 || self.is_dx_node(&data)) {
                continue;
            }
            if self.leaf_insert(dir, st, lblk, pblk, &mut data, name, ino, ftype)? {
                return self.put_leaf(h, dir, st, pblk, &mut data);
            }
        }
        if n == 1 && self.geo.dir_index && !skip_index {
            self.make_indexed(h, dir, st)?;
            return self.dx_add(h, dir, st, name, ino, ftype);
        }
        let (_, pblk) = self.dir_append_block(h, dir, st)?;
        let mut data = self.pack_leaf(&[(0, 0, name.to_vec(), ino, ftype)]);
        self.put_leaf(h, dir, st, pblk, &mut data)
    }

    /// `entries` packed into a fresh leaf image (the last one takes the rest of the space).
    pub(crate) fn pack_leaf(&self, entries: &[Hashed]) -> Vec<u8> {
        let mut b = self.empty_leaf();
        let space = self.leaf_space();
        let mut off = 0;
        for (i, (_, _, name, ino, ft)) in entries.iter().enumerate() {
            let rl = if i + 1 == entries.len() {
                space - off
            } else {
                rec_len_for(name.len())
            };
            put_dirent(&mut b, off, *ino, rl, name, self.ft(*ft));
            off += rl;
        }
        b
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
        self.inline_convert(h, dir, st)?;
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
        self.inline_convert(h, dir, st)?;
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
                    if !f(next, ino, ft, nm) {
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
                if !f(pos + e.rec_len as u64, e.inode, e.ftype, e.name(&data)) {
                    return Ok(());
                }
            }
            lblk += 1;
        }
        Ok(())
    }
}
