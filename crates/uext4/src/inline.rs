//! Inline data (Documentation/filesystems/ext4/inlinedata.rst). With the inline_data feature a
//! small file keeps its bytes in its inode: the first 60 in i_block, the rest in the value of
//! the in-inode attribute "system.data" (present, maybe empty, on every inline inode; flag
//! `FL_INLINE_DATA`). A small directory keeps its parent's number in i_block's first 4 bytes
//! and its entries in the next 56 and in "system.data": two separate runs of entries, no "."
//! or "..", no checksum tail (the inode's checksum covers them).
//!
//! uext4 reads inline files, symlinks and directories where they are, and makes and grows
//! inline files and directories as the kernel does (inline_write.rs). A name removed from an
//! inline directory, or repointed by a rename (".." included), is changed where it lies, as the
//! kernel changes it: those allocate nothing, so they work on a full filesystem. Attributes
//! set or removed leave the inode inline ("system.data" keeps its place in the inode: xattr.rs's
//! layout pins it). When a change outgrows the inode (a write or truncate past what it holds,
//! any fallocate, verity, a name that fits neither run), `inline_convert` moves the contents
//! into a newly allocated block inside the changing operation's handle, as the
//! kernel does when an inline inode outgrows its inode: a file's bytes as block 0, a
//! directory as one leaf block with ".", ".." and its entries; the flag and "system.data" go.
//! The data reaches the device before the commit that maps it (the block is new), so a crash
//! leaves the inline form or the converted one, never a mix. Every other path therefore sees
//! only block-mapped inodes, and `ext_load` refuses an inline inode rather than take its bytes
//! for a block map.
//!
//! A directory's entries are converted as the kernel converts them: "." and ".." (12 bytes
//! each), then the inline entries copied verbatim (i_block's, then the attribute's, unused
//! ones included), the last stretched to the end of the block. So an entry at inline byte
//! position p (4 to 59 in i_block, 60 on in the attribute) lands at block offset p + 20, and
//! the readdir cookies of an inline directory are those block offsets ("." 0, ".." 12, then
//! p + 20, as the kernel's): a readdir resumed after a conversion goes on at the same entry.

use crate::dir::block::Dirent;
use crate::error::{Corruption, Error, Result};
use crate::extent_cache::ExtentCache;
use crate::fname::Fname;
use crate::format::dir_entry::{put_dirent, set_rec_len, FT_DIR};
use crate::format::extent::Extent;
use crate::format::inode::{RawInode, FL_INLINE_DATA, I_BLOCK_SIZE};
use crate::format::xattr::put_ibody_value;
use crate::format::xattr::INDEX_SYSTEM;
use crate::format::{le32, put32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

/// One live entry of an inline directory.
pub(crate) struct InlineEntry {
    /// readdir cookie of this entry and of the next.
    pub pos: u64,
    pub next: u64,
    pub ino: u32,
    pub ftype: u8,
    pub name: Vec<u8>,
}

/// An edit of one run of inline entries: (run, its entries, the index of the one named).
type EntryEdit<'a> = dyn FnMut(&mut [u8], &[Dirent], usize) + 'a;

/// Where an inline directory's entries start in i_block (after the parent's number).
const DIR_IBLOCK_START: usize = 4;
/// Where they start in the block a conversion makes: after "." and ".." (12 bytes each).
const DIR_BLOCK_START: usize = 24;
/// Inline byte position to converted block offset (the readdir cookie).
const DIR_SHIFT: usize = DIR_BLOCK_START - DIR_IBLOCK_START;

fn is_system_data(e: &crate::format::xattr::XattrEntry) -> bool {
    e.index == INDEX_SYSTEM && e.name == b"data"
}

impl Fs {
    /// Whether the inode keeps its contents inline.
    pub(crate) fn is_inline(raw: &RawInode) -> bool {
        raw.flags() & FL_INLINE_DATA != 0
    }

    /// An inline inode's contents: i_block's 60 bytes, then the "system.data" value.
    pub(crate) fn inline_bytes(&self, ino: u32, raw: &RawInode) -> Result<Vec<u8>> {
        let mut all = raw.i_block().to_vec();
        // Only ever in the inode (the kernel reads it nowhere else): no xattr block read.
        if let Some(e) = self
            .xattr_load_ibody(ino, raw)?
            .into_iter()
            .find(is_system_data)
        {
            all.extend_from_slice(&e.value);
        }
        Ok(all)
    }

    /// Reads `buf.len()` bytes at `off` of an inline file (zeros past its inline bytes).
    pub(crate) fn inline_read(
        &self,
        ino: u32,
        raw: &RawInode,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let all = self.inline_bytes(ino, raw)?;
        buf.fill(0);
        if let Some(src) = usize::try_from(off).ok().and_then(|o| all.get(o..)) {
            let n = src.len().min(buf.len());
            buf[..n].copy_from_slice(&src[..n]);
        }
        Ok(())
    }

    /// An inline directory's parent and live entries, checked as a leaf block's are.
    pub(crate) fn inline_dir(&self, dir: u32, raw: &RawInode) -> Result<(u32, Vec<InlineEntry>)> {
        let all = self.inline_bytes(dir, raw)?;
        let parent = le32(&all, 0);
        let mut out = Vec::new();
        for (start, end) in [(DIR_IBLOCK_START, I_BLOCK_SIZE), (I_BLOCK_SIZE, all.len())] {
            let part = &all[start..end];
            let err = |why: String| {
                self.fail(
                    Error::corrupt(
                        Corruption::InlineData,
                        format!("directory inode {dir}, inline data: {why}"),
                    ),
                    dir,
                    0,
                    "inline_dir",
                )
            };
            for e in self.dir_parse_entries(part, &err)? {
                if e.inode == 0 {
                    continue;
                }
                let at = e.off + crate::format::dir_entry::DIRENT_HEADER;
                out.push(InlineEntry {
                    pos: (start + e.off + DIR_SHIFT) as u64,
                    next: (start + e.off + e.rec_len + DIR_SHIFT) as u64,
                    ino: e.inode,
                    ftype: e.ftype,
                    name: part[at..at + e.name_len].to_vec(),
                });
            }
        }
        Ok((parent, out))
    }

    /// Lookup in an inline directory, "." and ".." included: (inode, file type).
    pub(crate) fn inline_dir_find(
        &self,
        dir: u32,
        st: &InodeState,
        name: &Fname<'_>,
    ) -> Result<Option<(u32, u8)>> {
        let (parent, entries) = self.inline_dir(dir, &st.raw)?;
        Ok(match name.usr() {
            b"." => Some((dir, self.geo.filetype as u8 * FT_DIR)),
            b".." => Some((parent, self.geo.filetype as u8 * FT_DIR)),
            _ => entries
                .into_iter()
                .find(|e| name.matches(&e.name, None))
                .map(|e| (e.ino, e.ftype)),
        })
    }

    /// readdir of an inline directory from cookie `offset` (see the module notes).
    pub(crate) fn inline_dir_iter(
        &self,
        dir: u32,
        st: &InodeState,
        offset: u64,
        f: &mut crate::dir::block::DirIterFn<'_>,
    ) -> Result<()> {
        let (parent, entries) = self.inline_dir(dir, &st.raw)?;
        let ft = self.geo.filetype as u8 * FT_DIR;
        let dots = [
            (0u64, 12u64, dir, &b"."[..]),
            (12, DIR_BLOCK_START as u64, parent, b".."),
        ];
        for (pos, next, ino, name) in dots {
            if pos >= offset && !f(next, ino, ft, name, None) {
                return Ok(());
            }
        }
        for e in entries.iter().filter(|e| e.pos >= offset) {
            if !f(e.next, e.ino, e.ftype, &e.name, None) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Finds the live entry `name` of an inline directory and lets `edit` change the run of
    /// entries holding it, where it lies: `edit(run, entries, i)` with `entries[i]` the entry.
    /// The run goes back into the inode (i_block's part, or the "system.data" value rewritten
    /// in place, the same length), which is written through `h`. Nothing is allocated or freed,
    /// as in the kernel's ext4_delete_inline_entry and its inline ext4_find_entry + ext4_setent:
    /// a removal or repoint never needs a block, even on a full filesystem. The entry's (inode,
    /// file type) before the edit, or None when there is no such name (nothing changed).
    fn inline_dir_edit(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
        edit: &mut EntryEdit<'_>,
    ) -> Result<Option<(u32, u8)>> {
        self.check_writable()?;
        let fname = self.fname(dir, st, name)?;
        self.inline_dir(dir, &st.raw)?; // checks every entry of both runs
        let mut all = self.inline_bytes(dir, &st.raw)?;
        let noerr = |why: String| Error::corrupt(Corruption::InlineData, why);
        for (start, end) in [(DIR_IBLOCK_START, I_BLOCK_SIZE), (I_BLOCK_SIZE, all.len())] {
            let run = &mut all[start..end];
            let entries = self.dir_parse_entries(run, &noerr)?;
            let Some(i) = entries.iter().position(|e| {
                let at = e.off + crate::format::dir_entry::DIRENT_HEADER;
                e.inode != 0 && fname.matches(&run[at..at + e.name_len], None)
            }) else {
                continue;
            };
            let found = (entries[i].inode, entries[i].ftype);
            edit(run, &entries, i);
            if start == I_BLOCK_SIZE {
                let area = st.raw.xattr_area();
                let ok = area.is_some_and(|r| {
                    put_ibody_value(&mut st.raw.0[r], INDEX_SYSTEM, b"data", &all[start..end])
                });
                if !ok {
                    return Err(self.fail(
                        Error::corrupt(
                            Corruption::InlineData,
                            format!("directory inode {dir}: \"system.data\" is not in the inode"),
                        ),
                        dir,
                        0,
                        "inline_dir_edit",
                    ));
                }
            } else {
                st.raw.i_block_mut()[start..end].copy_from_slice(&all[start..end]);
            }
            self.write_inode(h, dir, &mut st.raw)?;
            return Ok(Some(found));
        }
        Ok(None)
    }

    /// Removes `name` from an inline directory in place (ext4_delete_inline_entry, through
    /// ext4_generic_delete_entry): the entry joins the one before it in its run, or, first of
    /// its run, is marked unused. (inode, file type) of the entry removed, None if absent.
    pub(crate) fn inline_dir_remove(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<Option<(u32, u8)>> {
        self.inline_dir_edit(h, dir, st, name, &mut |run, entries, i| {
            if i == 0 {
                put32(run, entries[i].off, 0);
            } else {
                let prev = &entries[i - 1];
                set_rec_len(run, prev.off, prev.rec_len + entries[i].rec_len);
            }
        })
    }

    /// Points `name` of an inline directory at `ino` (type `ftype`) in place, as a rename does
    /// (ext4_setent; ".." is i_block's first four bytes, ext4_rename_dir_finish). The old
    /// (inode, file type), None if absent.
    pub(crate) fn inline_dir_set(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<Option<(u32, u8)>> {
        if name == b".." {
            self.check_writable()?;
            let old = le32(st.raw.i_block(), 0);
            put32(st.raw.i_block_mut(), 0, ino);
            self.write_inode(h, dir, &mut st.raw)?;
            return Ok(Some((old, self.ft(FT_DIR))));
        }
        let ft = self.ft(ftype);
        self.inline_dir_edit(h, dir, st, name, &mut |run, entries, i| {
            put32(run, entries[i].off, ino);
            run[entries[i].off + 7] = ft;
        })
    }

    /// The leaf block an inline directory converts to (see the module notes).
    fn inline_dir_block(&self, ino: u32, raw: &RawInode) -> Result<Vec<u8>> {
        use crate::format::dir_entry::set_rec_len;
        let (parent, _) = self.inline_dir(ino, raw)?; // checks every entry
        let all = self.inline_bytes(ino, raw)?;
        let stream = &all[DIR_IBLOCK_START..];
        let end = DIR_BLOCK_START + stream.len();
        if end > self.leaf_space() {
            return Err(self.fail(
                Error::corrupt(
                    Corruption::InlineData,
                    format!(
                        "directory inode {ino}, inline data: {} bytes of entries do not fit a block",
                        stream.len()
                    ),
                ),
                ino,
                0,
                "inline_convert",
            ));
        }
        let mut b = vec![0u8; self.geo.block_size as usize];
        let ft = self.geo.filetype as u8 * FT_DIR;
        put_dirent(&mut b, 0, ino, 12, b".", ft);
        put_dirent(&mut b, 12, parent, 12, b"..", ft);
        b[DIR_BLOCK_START..end].copy_from_slice(stream);
        // The last entry (of the attribute's run, or of i_block's if that run is empty) takes
        // the rest of the block. Both runs parsed whole in inline_dir above.
        let noerr = |why: String| Error::corrupt(Corruption::InlineData, why);
        let mut last = 12; // "..", were there no entries
        for (start, stop) in [(DIR_IBLOCK_START, I_BLOCK_SIZE), (I_BLOCK_SIZE, all.len())] {
            if let Some(e) = self.dir_parse_entries(&all[start..stop], &noerr)?.last() {
                last = start + e.off + DIR_SHIFT;
            }
        }
        set_rec_len(&mut b, last, self.leaf_space() - last);
        Ok(b)
    }

    /// Moves an inline inode's contents into a new block, within `h` (see the module notes).
    /// Does nothing for an inode that is not inline. The caller holds the inode's `io_lock`
    /// exclusively and passes its `state`; the inode is written through `h`.
    ///
    /// All or nothing: everything that can fail for want of space (the new block, a copy of a
    /// shared xattr block) is done before anything the inode refers to changes, and is undone
    /// on failure, so an error leaves the inode inline and every bitmap agreeing with it (a
    /// full filesystem gives ENOSPC here, as the kernel's ext4_convert_inline_data does). The
    /// attributes are laid out again last of the fallible steps; what follows cannot run out
    /// of space, and a failure there (a corrupt extent root) abandons the transaction rather
    /// than commit a half-converted inode.
    pub(crate) fn inline_convert(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
    ) -> Result<()> {
        if !Self::is_inline(&st.raw) {
            return Ok(());
        }
        // The inline bytes leave the in-inode xattr area, which no INODE record carries.
        h.fc_ineligible("an inline file converted to blocks");
        self.check_writable()?;
        let bs = self.geo.block_size as usize;
        // The new block's contents, read before anything changes.
        let block = if st.raw.is_dir() {
            Some(self.inline_dir_block(ino, &st.raw)?)
        } else {
            let size = st.raw.size().min(bs as u64) as usize;
            let mut b = vec![0u8; size];
            self.inline_read(ino, &st.raw, 0, &mut b)?;
            (size > 0).then_some(b)
        };
        let l = self.xattr_load(ino, &st.raw)?;
        h.extend(16);
        // 1. The block, filled: nothing refers to it yet.
        let new = match block {
            Some(b) => Some(self.inline_fill_new_block(h, ino, st, b)?),
            None => None,
        };
        // 2. "system.data" goes; the other attributes are laid out again without it. On
        //    failure (no room for a copy of a shared block) nothing of the inode changed.
        let old_block = l.block.clone();
        let rest: Vec<_> = l
            .ibody
            .into_iter()
            .chain(l.block)
            .filter(|e| !is_system_data(e))
            .collect();
        if let Err(e) = self.xattr_store(h, ino, st, rest, l.blk, &old_block) {
            if let Some((p, is_dir)) = new {
                let _ = self.free_blocks(h, p, 1, is_dir);
            }
            return Err(e);
        }
        // 3. The inode maps the block instead of holding the bytes.
        st.raw.set_flags(st.raw.flags() & !FL_INLINE_DATA);
        st.raw.i_block_mut().fill(0);
        self.init_block_map(&mut st.raw);
        st.extents = Some(ExtentCache::unmapped(&st.raw));
        if let Some((p, is_dir)) = new {
            let e = Extent {
                lblk: 0,
                len: 1,
                pblk: p,
                unwritten: false,
            };
            if let Err(e) = self.ext_insert(h, ino, st, e) {
                return Err(self.abandon_txn(e, ino, "inline_convert"));
            }
            if is_dir {
                st.raw.set_size(bs as u64);
            }
        }
        self.write_inode(h, ino, &mut st.raw)
    }

    /// Allocates the block an inline inode converts to (near its inode table) and fills it: a
    /// directory's leaf through `h` (metadata), a file's bytes straight to the device (data,
    /// which reaches it before the commit that maps it). (block, is_dir). On failure nothing
    /// is left allocated.
    fn inline_fill_new_block(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &InodeState,
        mut b: Vec<u8>,
    ) -> Result<(u64, bool)> {
        let is_dir = st.raw.is_dir();
        let goal = self.group_desc(self.geo.ino_group(ino)).inode_table();
        let (p, _) = self.alloc_blocks(h, goal, 1, None)?;
        let filled = if is_dir {
            (self.bcache.get_new(p).map(drop)).and_then(|()| self.put_leaf(h, ino, st, p, &mut b))
        } else {
            b.resize(self.geo.block_size as usize, 0);
            (self.dev.write_new_at(p * self.geo.block_size as u64, &b)).map_err(Error::from)
        };
        match filled {
            Ok(()) => Ok((p, is_dir)),
            Err(e) => {
                let _ = self.free_blocks(h, p, 1, is_dir);
                Err(e)
            }
        }
    }

    /// `inline_convert` in a handle of its own, for file operations that start theirs later
    /// (write, truncate, fallocate). The caller holds the inode's `io_lock` exclusively.
    /// Ends `may_inline` (ext4_convert_inline_data): the file maps blocks from now on.
    pub(crate) fn inline_convert_file(&self, inode: &crate::inode::Inode) -> Result<()> {
        {
            let mut st = inode.state.lock();
            st.may_inline = false;
            if !Self::is_inline(&st.raw) {
                return Ok(());
            }
        }
        let mut h = self.start(crate::transaction::credits::WRITE_PER_EXTENT + 16)?;
        let mut st = inode.state.lock();
        crate::file::check_live(&st)?;
        self.inline_convert(&mut h, inode.ino, &mut st)?;
        self.mark_inode_dirty(&mut h, inode, &mut st)
    }
}
