//! Directory blocks (Documentation/filesystems/ext4/directory.rst, "Linear (Classic)
//! Directories"): blocks of `ext4_dir_entry_2` mapped through the directory's extent tree (or
//! block map), each ending in a checksum tail with metadata_csum. Mapping, reading, checking
//! and writing one block, and putting an entry into one; the linear walks (dir.rs) and the
//! hashed index (htree.rs) are built on these.
//!
//! The caller holds the directory's `io_lock` and passes its `state` (as `st`), as in dir.rs.

use crate::error::{Corruption, Error, Result};
use crate::fname::{dirent_rec_len, is_dot, put_stored_hash, stored_hash, Fname};
use crate::format::dir_entry::*;
use crate::format::extent::Extent;
use crate::format::inode::RawInode;
use crate::format::{le16, le32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

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
    /// The bytes the entry uses (ext4_dir_rec_len; `hashed`: the directory stores hashes,
    /// counted for every live entry as ext4_find_dest_de does, dots included).
    fn used(&self, hashed: bool) -> usize {
        if self.inode == 0 {
            0
        } else {
            dirent_rec_len(self.name_len, hashed)
        }
    }
    pub(crate) fn name<'a>(&self, b: &'a [u8]) -> &'a [u8] {
        &b[self.off + DIRENT_HEADER..self.off + DIRENT_HEADER + self.name_len]
    }
}

/// readdir's callback: (next offset, inode, file type, name, the hash the entry stores in an
/// encrypted casefolded directory) -> continue?
pub(crate) type DirIterFn<'a> = dyn FnMut(u64, u32, u8, &[u8], Option<(u32, u32)>) -> bool + 'a;

/// An entry to write into a leaf: its name as stored, inode, file type, and the (hash, minor
/// hash) it stores after the name in an encrypted casefolded directory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewEntry<'a> {
    pub name: &'a [u8],
    pub ino: u32,
    pub ftype: u8,
    pub hash: Option<(u32, u32)>,
}

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
            Error::corrupt(
                Corruption::Directory,
                format!("directory inode {dir}, block {lblk}: {what}"),
            ),
            dir,
            pblk,
            "dir",
        )
    }

    pub(crate) fn dir_csum_err(&self, dir: u32, lblk: u32, pblk: u64, what: &str) -> Error {
        self.fail(
            Error::bad_checksum(
                Corruption::Directory,
                format!("directory inode {dir}, block {lblk} (physical {pblk}): {what}"),
            ),
            dir,
            pblk,
            "dir",
        )
    }

    /// Physical block of directory block `lblk`, None for a hole.
    pub(crate) fn dir_pblk_opt(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
    ) -> Result<Option<u64>> {
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
    /// block (a walk would look hung).
    pub(crate) fn dir_next_block(
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
        self.dir_leaf_entries(dir, st, (lblk, pblk), b, false)
    }

    /// As `dir_validate_block`; with `checked` (the cache saw these bytes match the checksum
    /// since they last changed) the checksum is not computed again.
    fn dir_leaf_entries(
        &self,
        dir: u32,
        st: &InodeState,
        at: (u32, u64),
        b: &[u8],
        checked: bool,
    ) -> Result<Vec<Dirent>> {
        let mut out = Vec::with_capacity(b.len() / 16);
        self.dir_leaf_each(dir, st, at, b, checked, &mut |e| {
            out.push(e);
            true
        })?;
        Ok(out)
    }

    /// As `dir_leaf_entries`, giving each entry to `f` (which returns whether to go on)
    /// instead of collecting them: the whole block is checked before the first (bytes the
    /// cache saw pass were checked whole then, or written whole by `put_leaf`).
    fn dir_leaf_each(
        &self,
        dir: u32,
        st: &InodeState,
        (lblk, pblk): (u32, u64),
        b: &[u8],
        checked: bool,
        f: &mut dyn FnMut(Dirent) -> bool,
    ) -> Result<()> {
        let bs = b.len();
        let mut end = bs;
        if self.geo.metadata_csum && checked {
            end = bs - DIRENT_TAIL_SIZE;
        } else if self.geo.metadata_csum {
            if !has_tail(b) {
                return Err(self.dir_csum_err(dir, lblk, pblk, "no directory checksum tail"));
            }
            end = bs - DIRENT_TAIL_SIZE;
            let want = crate::format::csum::crc32c(self.dir_seed(dir, &st.raw), &b[..end]);
            if tail_csum(b) != want {
                return Err(self.dir_csum_err(dir, lblk, pblk, "leaf checksum mismatch"));
            }
        }
        let err = |why| self.dir_err(dir, lblk, pblk, why);
        if !checked {
            let hashed = self.hash_in_dirent(st);
            let mut short = None;
            self.dir_each_entry(&b[..end], &err, &mut |e| {
                // __ext4_check_dir_entry: room for the stored hash (dots excepted).
                if hashed && e.inode != 0 && !is_dot(e.name(b)) && e.rec_len < e.used(true) {
                    short = Some(e);
                }
                short.is_none()
            })?;
            if let Some(e) = short {
                return Err(err(format!(
                    "bad entry at offset {}: rec_len {} has no room for the hash after a \
                     {}-byte name",
                    e.off, e.rec_len, e.name_len
                )));
            }
        }
        self.dir_each_entry(&b[..end], &err, f)
    }

    /// The hash entry `e` of block `b` stores, where directory `st` stores them (None for
    /// "." and "..", unused entries, and other directories).
    pub(crate) fn entry_stored_hash(
        &self,
        st: &InodeState,
        b: &[u8],
        e: &Dirent,
    ) -> Option<(u32, u32)> {
        if e.inode == 0 || !self.hash_in_dirent(st) || is_dot(e.name(b)) {
            return None;
        }
        stored_hash(b, e.off, e.rec_len)
    }

    /// Checks and returns the entries of one run of them (a leaf block up to its tail, or a
    /// part of an inline directory), the unused ones included; `err` names the place.
    pub(crate) fn dir_parse_entries(
        &self,
        b: &[u8],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Vec<Dirent>> {
        let mut out = Vec::with_capacity(b.len() / 16);
        self.dir_each_entry(b, err, &mut |e| {
            out.push(e);
            true
        })?;
        Ok(out)
    }

    /// As `dir_parse_entries`, giving each entry to `f` as it is checked, until `f` returns
    /// false.
    fn dir_each_entry(
        &self,
        b: &[u8],
        err: &dyn Fn(String) -> Error,
        f: &mut dyn FnMut(Dirent) -> bool,
    ) -> Result<()> {
        let end = b.len();
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
            let go_on = f(Dirent {
                off,
                inode,
                rec_len,
                name_len,
                ftype: self.ft(b[off + 7]),
            });
            if !go_on {
                break;
            }
            off += rec_len;
        }
        Ok(())
    }

    /// Writes the checksum tail of a leaf block.
    pub(crate) fn set_leaf_csum(&self, dir: u32, st: &InodeState, b: &mut [u8]) {
        if !self.geo.metadata_csum {
            return;
        }
        set_tail_csum(b, self.dir_seed(dir, &st.raw));
    }

    /// Searches one leaf block for `name`: (inode, type, offset).
    pub(crate) fn leaf_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
        pblk: u64,
        name: &Fname<'_>,
    ) -> Result<Option<(u32, u8, usize)>> {
        let buf = self.bcache.get(pblk)?;
        let data = buf.read();
        let checked = buf.checked_for(dir);
        let mut found = None;
        self.dir_leaf_each(dir, st, (lblk, pblk), &data, checked, &mut |e| {
            if e.inode != 0 && name.matches(e.name(&data), self.entry_stored_hash(st, &data, &e)) {
                found = Some((e.inode, e.ftype, e.off));
            }
            found.is_none()
        })?;
        buf.set_checked(dir);
        Ok(found)
    }

    /// A copy of the leaf at `pblk`, and whether its checksum is known to match (as
    /// `leaf_insert` takes them).
    pub(crate) fn leaf_copy(&self, dir: u32, pblk: u64) -> Result<(Vec<u8>, bool)> {
        let buf = self.bcache.get(pblk)?;
        let data = buf.read();
        Ok((data.to_vec(), buf.checked_for(dir)))
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
        let mut g = buf.write();
        g.copy_from_slice(data);
        buf.set_checked(dir);
        drop(g);
        h.dirty(&buf);
        Ok(())
    }

    /// Tries to put an entry into a leaf block in memory: an unused entry big enough, or the
    /// slack after a live one (ext4_find_dest_de, ext4_insert_dentry, the stored hash
    /// included). Returns false if there is no room. `checked`: the bytes are known to match
    /// their checksum (`leaf_copy`).
    pub(crate) fn leaf_insert(
        &self,
        dir: u32,
        st: &InodeState,
        (lblk, pblk): (u32, u64),
        (data, checked): (&mut [u8], bool),
        new: &NewEntry<'_>,
    ) -> Result<bool> {
        let hashed = self.hash_in_dirent(st);
        let need = dirent_rec_len(new.name.len(), new.hash.is_some());
        let ft = self.ft(new.ftype);
        let mut room = None;
        self.dir_leaf_each(dir, st, (lblk, pblk), data, checked, &mut |e| {
            if (e.inode == 0 && e.rec_len >= need)
                || (e.inode != 0 && e.rec_len >= e.used(hashed) + need)
            {
                room = Some(e);
            }
            room.is_none()
        })?;
        let Some(e) = room else {
            return Ok(false);
        };
        let at = if e.inode == 0 {
            put_dirent(data, e.off, new.ino, e.rec_len, new.name, ft);
            e.off
        } else {
            let used = e.used(hashed);
            set_rec_len(data, e.off, used);
            put_dirent(data, e.off + used, new.ino, e.rec_len - used, new.name, ft);
            e.off + used
        };
        if let Some(h) = new.hash {
            put_stored_hash(data, at, h);
        }
        Ok(true)
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
        let (p, _) = self.alloc_for(h, dir, st, lblk, 1, goal, false)?;
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
            let _ = self.free_for(h, dir, st, lblk as u64, p, 1, true);
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

    /// `entries` packed into a fresh leaf image (the last one takes the rest of the space),
    /// each with its stored hash where it has one.
    pub(crate) fn pack_leaf<'a>(&self, entries: impl IntoIterator<Item = NewEntry<'a>>) -> Vec<u8> {
        let mut b = self.empty_leaf();
        let space = self.leaf_space();
        let mut off = 0;
        let mut it = entries.into_iter().peekable();
        while let Some(e) = it.next() {
            let rl = if it.peek().is_none() {
                space - off
            } else {
                dirent_rec_len(e.name.len(), e.hash.is_some())
            };
            put_dirent(&mut b, off, e.ino, rl, e.name, self.ft(e.ftype));
            if let Some(h) = e.hash {
                put_stored_hash(&mut b, off, h);
            }
            off += rl;
        }
        b
    }
}
