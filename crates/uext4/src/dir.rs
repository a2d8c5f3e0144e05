//! Directories (Documentation/filesystems/ext4/directory.rst): linear blocks of
//! `ext4_dir_entry_2`, each block ending in a checksum tail with metadata_csum, and the hashed
//! index of htree.rs on top for directories of more than one block.
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
//! meaningful when leaves split under a reader, as in the kernel's ext4_dx_readdir. "." and ".." of an indexed directory come first with cookies 1 and 2.

use crate::error::{Error, Result};
use crate::format::dir_entry::*;
use crate::format::extent::Extent;
use crate::format::features::INCOMPAT_LARGEDIR;
use crate::format::inode::{RawInode, FL_INDEX};
use crate::format::{le16, le32, put32};
use crate::fs::Fs;
use crate::htree::*;
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
    fn name<'a>(&self, b: &'a [u8]) -> &'a [u8] {
        &b[self.off + DIRENT_HEADER..self.off + DIRENT_HEADER + self.name_len]
    }
}

/// readdir's callback: (next offset, inode, file type, name) -> continue?
pub(crate) type DirIterFn<'a> = dyn FnMut(u64, u32, u8, &[u8]) -> bool + 'a;

/// A live entry with its hash: (major, minor, name, inode, type).
type Hashed = (u32, u32, Vec<u8>, u32, u8);

/// One level of a walk down the index: (logical block of the index block, its entries, the
/// position taken).
type PathStep = (u32, DxNode, usize);

impl Fs {
    fn dir_seed(&self, ino: u32, raw: &RawInode) -> u32 {
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

    fn ft(&self, ftype: u8) -> u8 {
        if self.geo.filetype {
            ftype
        } else {
            0
        }
    }

    fn dir_err(&self, dir: u32, lblk: u32, pblk: u64, what: String) -> Error {
        self.fail(
            Error::corrupt(format!("directory inode {dir}, block {lblk}: {what}")),
            dir,
            pblk,
            "dir",
        )
    }

    fn dir_csum_err(&self, dir: u32, lblk: u32, pblk: u64, what: &str) -> Error {
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
    fn dir_pblk(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<u64> {
        match self.dir_pblk_opt(dir, st, lblk)? {
            Some(p) => Ok(p),
            None => Err(self.dir_err(dir, lblk, 0, "hole in directory".into())),
        }
    }

    fn dir_blocks(&self, st: &InodeState) -> u32 {
        (st.raw.size() / self.geo.block_size as u64).min(u32::MAX as u64) as u32
    }

    /// A copy of directory block `lblk`: (physical block, bytes).
    fn dir_read(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<(u64, Vec<u8>)> {
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
        let t = b.len() - DIRENT_TAIL_SIZE;
        put_tail(b, 0);
        let c = crate::format::csum::crc32c(self.dir_seed(dir, &st.raw), &b[..t]);
        put_tail(b, c);
    }

    /// Whether the directory uses its index (the flag, and dir_index on the filesystem).
    fn is_indexed(&self, st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0 && self.geo.dir_index
    }

    /// Whether block 0 is laid out as a dx root (whether or not we use the index).
    fn has_index_flag(st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0
    }

    /// Whether a block of an indexed directory is an interior index node (a fake empty entry
    /// covering the whole block, no leaf tail).
    fn is_dx_node(&self, b: &[u8]) -> bool {
        le32(b, 0) == 0
            && rec_len_from_disk(le16(b, 4), b.len()) == b.len()
            && !(self.geo.metadata_csum && has_tail(b))
    }

    fn max_index_levels(&self) -> u8 {
        if self.sb.lock().has_incompat(INCOMPAT_LARGEDIR) {
            2
        } else {
            1
        }
    }

    /// Hash version of an indexed directory from its root, with the unsigned adjustment.
    fn dir_hash_version(&self, root: &[u8]) -> u8 {
        let v = root[ROOT_HASH_VERSION];
        if v <= DX_HASH_TEA && self.geo.unsigned_hash {
            v + 3
        } else {
            v
        }
    }

    fn name_hash(&self, name: &[u8], version: u8) -> (u32, u32) {
        dirhash(name, version, &self.geo.hash_seed)
    }

    /// Reads an index block (the root when `lblk` is 0) and checks it: layout, limit, order,
    /// pointers and checksum.
    fn read_dx(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<(u64, Vec<u8>, DxNode)> {
        let root = lblk == 0;
        let (pblk, data) = self.dir_read(dir, st, lblk)?;
        let bs = data.len();
        let off = if root {
            if data[ROOT_INFO_LENGTH] != 8
                || data[ROOT_UNUSED_FLAGS] & 1 != 0
                || le16(&data, 4) != 12
                || data[6] != 1
                || data[8] != b'.'
                || data[12 + 6] != 2
                || &data[12 + 8..12 + 10] != b".."
            {
                return Err(self.dir_err(dir, lblk, pblk, "bad htree root".into()));
            }
            let v = self.dir_hash_version(&data);
            if !hash_version_known(v) {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!(
                        "unrecognised htree hash version {}",
                        data[ROOT_HASH_VERSION]
                    ),
                ));
            }
            if data[ROOT_INDIRECT_LEVELS] > self.max_index_levels() {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("htree depth {} too large", data[ROOT_INDIRECT_LEVELS]),
                ));
            }
            ROOT_COUNT
        } else {
            if !self.is_dx_node(&data) {
                return Err(self.dir_err(dir, lblk, pblk, "expected an htree index block".into()));
            }
            NODE_COUNT
        };
        let node = DxNode::parse(&data, off)
            .ok_or_else(|| self.dir_err(dir, lblk, pblk, "bad htree count/limit".into()))?;
        let want = dx_limit(bs, root, self.geo.metadata_csum);
        if node.limit != want {
            return Err(self.dir_err(
                dir,
                lblk,
                pblk,
                format!("htree limit {} should be {want}", node.limit),
            ));
        }
        if self.geo.metadata_csum && !verify_dx_csum(self.dir_seed(dir, &st.raw), &data, off) {
            return Err(self.dir_csum_err(dir, lblk, pblk, "htree index checksum mismatch"));
        }
        let nblocks = self.dir_blocks(st);
        let mut prev = 0u32;
        for (i, &(hash, b)) in node.entries.iter().enumerate() {
            if b == 0 || b >= nblocks || b == lblk {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("htree entry {i} points at block {b} (directory has {nblocks})"),
                ));
            }
            if hash < prev {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("htree entry {i} hash {hash:#x} out of order"),
                ));
            }
            prev = hash;
        }
        Ok((pblk, data, node))
    }

    /// Walks the index to the leaf for `hash`. Returns the path (root first) and the hash
    /// version.
    fn dx_probe(&self, dir: u32, st: &mut InodeState, hash: u32) -> Result<(Vec<PathStep>, u8)> {
        let (_, root, node) = self.read_dx(dir, st, 0)?;
        let levels = root[ROOT_INDIRECT_LEVELS] as usize;
        let version = self.dir_hash_version(&root);
        let mut path: Vec<PathStep> = Vec::with_capacity(levels + 1);
        let mut cur = (0u32, node);
        for level in 0..=levels {
            let pos = cur.1.find(hash);
            let child = cur.1.entries[pos].1;
            path.push((cur.0, cur.1, pos));
            if level == levels {
                break;
            }
            if path.iter().any(|p| p.0 == child) {
                return Err(self.dir_err(dir, child, 0, "htree index loops".into()));
            }
            let (_, _, n) = self.read_dx(dir, st, child)?;
            cur = (child, n);
        }
        let leaf = Self::path_leaf(&path);
        if path.iter().any(|p| p.0 == leaf) {
            return Err(self.dir_err(dir, leaf, 0, "htree leaf is an index block".into()));
        }
        Ok((path, version))
    }

    /// Leaf block number at the bottom of a probe path.
    fn path_leaf(path: &[PathStep]) -> u32 {
        let (_, n, p) = &path[path.len() - 1];
        n.entries[*p].1
    }

    /// The starting hash of the leaf after the path's, without moving; None at the end.
    fn dx_peek_next(path: &[PathStep]) -> Option<u32> {
        path.iter()
            .rev()
            .find(|(_, n, p)| p + 1 < n.entries.len())
            .map(|(_, n, p)| n.entries[p + 1].0)
    }

    /// Moves a probe path to the next leaf in hash order; returns that leaf's starting hash.
    fn dx_next_leaf(
        &self,
        dir: u32,
        st: &mut InodeState,
        path: &mut [PathStep],
    ) -> Result<Option<u32>> {
        let mut level = path.len();
        loop {
            if level == 0 {
                return Ok(None);
            }
            level -= 1;
            let (_, n, p) = &mut path[level];
            if *p + 1 < n.entries.len() {
                *p += 1;
                break;
            }
        }
        let hash = path[level].1.entries[path[level].2].0;
        // Descend to the leftmost leaf under the new position.
        for l in level + 1..path.len() {
            let child = path[l - 1].1.entries[path[l - 1].2].1;
            let (_, _, n) = self.read_dx(dir, st, child)?;
            path[l] = (child, n, 0);
        }
        Ok(Some(hash))
    }

    /// Searches one leaf block for `name`: (inode, type, offset).
    fn leaf_find(
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

    /// "." and ".." of a directory whose block 0 is a dx root: (inode, type, offset).
    fn root_dot(
        &self,
        dir: u32,
        st: &mut InodeState,
        dotdot: bool,
    ) -> Result<Option<(u32, u8, usize)>> {
        let (pblk, b) = self.dir_read(dir, st, 0)?;
        let off = if dotdot { 12 } else { 0 };
        let want: &[u8] = if dotdot { b".." } else { b"." };
        let rl = rec_len_from_disk(le16(&b, off + 4), b.len());
        if b[off + 6] as usize != want.len()
            || &b[off + 8..off + 8 + want.len()] != want
            || rl < 12
            || off + rl > b.len()
        {
            return Err(self.dir_err(
                dir,
                0,
                pblk,
                format!("bad {:?} entry", String::from_utf8_lossy(want)),
            ));
        }
        let ino = le32(&b, off);
        if ino == 0 || ino > self.geo.inodes_count {
            return Err(self.dir_err(dir, 0, pblk, format!("bad inode {ino} in dot entry")));
        }
        Ok(Some((ino, self.ft(b[off + 7]), off)))
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
            let p0 = self.dir_pblk(dir, st, 0)?;
            let version = self.dir_hash_version(&self.bcache.get(p0)?.read());
            let hash0 = self.name_hash(name, version).0;
            let (mut path, _) = self.dx_probe(dir, st, hash0)?;
            let nblocks = self.dir_blocks(st);
            let mut visited = 0u32;
            loop {
                let leaf = Self::path_leaf(&path);
                let pblk = self.dir_pblk(dir, st, leaf)?;
                if let Some((i, t, o)) = self.leaf_find(dir, st, leaf, pblk, name)? {
                    return Ok(Some((i, t, leaf, o)));
                }
                // A run of equal hashes may continue in the next leaf (collision bit on its
                // index entry).
                match Self::dx_peek_next(&path) {
                    Some(h) if h & 1 == 1 && h & !1 == hash0 => {
                        self.dx_next_leaf(dir, st, &mut path)?;
                    }
                    _ => return Ok(None),
                }
                visited += 1;
                if visited > nblocks {
                    return Err(self.dir_err(dir, 0, p0, "htree walk does not end".into()));
                }
            }
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

    /// Writes a changed index block through the handle (dx checksum first).
    fn put_dx(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &InodeState,
        pblk: u64,
        data: &mut [u8],
        root: bool,
    ) -> Result<()> {
        if self.geo.metadata_csum {
            set_dx_csum(
                self.dir_seed(dir, &st.raw),
                data,
                if root { ROOT_COUNT } else { NODE_COUNT },
            );
        }
        let buf = self.bcache.get(pblk)?;
        buf.write().copy_from_slice(data);
        h.dirty(&buf);
        Ok(())
    }

    /// Stores `node` into index block `lblk` (read, change, checksum, write).
    fn store_dx(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
        node: &DxNode,
    ) -> Result<()> {
        let (pblk, mut data) = self.dir_read(dir, st, lblk)?;
        node.store(&mut data);
        self.put_dx(h, dir, st, pblk, &mut data, lblk == 0)
    }

    /// Tries to put an entry into a leaf block in memory: an unused entry big enough, or the
    /// slack after a live one. Returns false if there is no room.
    #[allow(clippy::too_many_arguments)]
    fn leaf_insert(
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
        let (p, _) = self.alloc_blocks(h, goal, 1, None)?;
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
    fn empty_leaf(&self) -> Vec<u8> {
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

    /// Live entries of a leaf with their hashes.
    fn leaf_entries(
        &self,
        dir: u32,
        st: &InodeState,
        lblk: u32,
        pblk: u64,
        data: &[u8],
        version: u8,
    ) -> Result<Vec<Hashed>> {
        let mut v = Vec::new();
        for e in self.dir_validate_block(dir, st, lblk, pblk, data)? {
            if e.inode == 0 {
                continue;
            }
            let name = e.name(data).to_vec();
            let (hh, mm) = self.name_hash(&name, version);
            v.push((hh, mm, name, e.inode, e.ftype));
        }
        Ok(v)
    }

    /// `entries` packed into a fresh leaf image (the last one takes the rest of the space).
    fn pack_leaf(&self, entries: &[Hashed]) -> Vec<u8> {
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

    /// Converts a full one-block directory into an indexed one, as the kernel's make_indexed_dir:
    /// block 0 becomes the dx root, its entries are split by hash into two new leaves.
    fn make_indexed(&self, h: &mut Handle<'_>, dir: u32, st: &mut InodeState) -> Result<()> {
        let (p0, data) = self.dir_read(dir, st, 0)?;
        let mut def = self.geo.def_hash_version;
        if def > DX_HASH_TEA {
            def = DX_HASH_HALF_MD4;
        }
        let version = if self.geo.unsigned_hash { def + 3 } else { def };
        let all = self.leaf_entries(dir, st, 0, p0, &data, version)?;
        let (Some(dot), Some(dotdot)) = (all.first(), all.get(1)) else {
            return Err(self.dir_err(dir, 0, p0, "no \".\" and \"..\" entries".into()));
        };
        if dot.2 != b"." || dotdot.2 != b".." {
            return Err(self.dir_err(dir, 0, p0, "first entries are not \".\" and \"..\"".into()));
        }
        let parent = dotdot.3;
        let mut entries: Vec<Hashed> = all[2..].to_vec();
        entries.sort_by_key(|a| (a.0, a.1));
        h.extend(8);
        let (l1, p1) = self.dir_append_block(h, dir, st)?;
        let (l2, p2) = self.dir_append_block(h, dir, st)?;
        let (left, right, split_hash) = Self::split_sorted(entries);
        self.put_leaf(h, dir, st, p1, &mut self.pack_leaf(&left))?;
        self.put_leaf(h, dir, st, p2, &mut self.pack_leaf(&right))?;
        // The root: "." and "..", dx_root_info, then the two leaves.
        let bs = self.geo.block_size as usize;
        let mut root = vec![0u8; bs];
        let ft = self.ft(FT_DIR);
        put_dirent(&mut root, 0, dir, 12, b".", ft);
        put_dirent(&mut root, 12, parent, bs - 12, b"..", ft);
        root[ROOT_HASH_VERSION] = def;
        root[ROOT_INFO_LENGTH] = 8;
        root[ROOT_INDIRECT_LEVELS] = 0;
        let node = DxNode {
            count_off: ROOT_COUNT,
            limit: dx_limit(bs, true, self.geo.metadata_csum),
            entries: vec![(0, l1), (split_hash, l2)],
        };
        node.store(&mut root);
        self.put_dx(h, dir, st, p0, &mut root, true)?;
        st.raw.set_flags(st.raw.flags() | FL_INDEX);
        Ok(())
    }

    /// Splits hash-sorted entries into two halves by size; the second half's index hash gets
    /// the collision bit when the split falls inside a run of equal hashes.
    fn split_sorted(mut entries: Vec<Hashed>) -> (Vec<Hashed>, Vec<Hashed>, u32) {
        let total: usize = entries.iter().map(|e| rec_len_for(e.2.len())).sum();
        let mut acc = 0;
        let mut at = entries.len();
        for (i, e) in entries.iter().enumerate() {
            if acc + rec_len_for(e.2.len()) > total / 2 && i > 0 {
                at = i;
                break;
            }
            acc += rec_len_for(e.2.len());
        }
        let at = at
            .clamp(1, entries.len().saturating_sub(1).max(1))
            .min(entries.len());
        let right = entries.split_off(at);
        let split = right.first().map(|e| e.0).unwrap_or(0);
        let continued = entries.last().map(|e| e.0 == split).unwrap_or(false);
        (entries, right, split | continued as u32)
    }

    /// Adds an entry to an indexed directory, splitting the leaf (and index nodes) when full.
    fn dx_add(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
        ino: u32,
        ftype: u8,
    ) -> Result<()> {
        let p0 = self.dir_pblk(dir, st, 0)?;
        let version = self.dir_hash_version(&self.bcache.get(p0)?.read());
        let (hash, _) = self.name_hash(name, version);
        for _attempt in 0..8 {
            let (mut path, _) = self.dx_probe(dir, st, hash)?;
            let leaf = Self::path_leaf(&path);
            let (pblk, mut data) = self.dir_read(dir, st, leaf)?;
            if self.leaf_insert(dir, st, leaf, pblk, &mut data, name, ino, ftype)? {
                return self.put_leaf(h, dir, st, pblk, &mut data);
            }
            // Split the leaf: make room for one more index entry first.
            let mut entries = self.leaf_entries(dir, st, leaf, pblk, &data, version)?;
            if entries.len() < 2 {
                return Err(self.dir_err(dir, leaf, pblk, "full leaf with one entry".into()));
            }
            entries.sort_by_key(|a| (a.0, a.1));
            h.extend(4);
            self.dx_make_room(h, dir, st, &mut path)?;
            let (nl, np) = self.dir_append_block(h, dir, st)?;
            let (left, right, split_hash) = Self::split_sorted(entries);
            self.put_leaf(h, dir, st, pblk, &mut self.pack_leaf(&left))?;
            self.put_leaf(h, dir, st, np, &mut self.pack_leaf(&right))?;
            let bottom = path.len() - 1;
            let (blblk, bnode, bpos) = &mut path[bottom];
            if bnode.entries.get(*bpos).map(|e| e.1) != Some(leaf) {
                return Err(self.dir_err(dir, *blblk, 0, "htree lost a leaf in a split".into()));
            }
            bnode.entries.insert(*bpos + 1, (split_hash, nl));
            let (blblk, bnode) = (*blblk, bnode.clone());
            self.store_dx(h, dir, st, blblk, &bnode)?;
            // The next pass finds the half that now has room.
        }
        Err(self.dir_err(
            dir,
            0,
            p0,
            "could not insert into the htree after splitting".into(),
        ))
    }

    /// Makes sure the bottom index node on `path` has room for one more entry: splits full
    /// nodes (from the lowest level that has room downwards) and adds a level when the root is
    /// full. `path` is kept pointing at the same leaf.
    fn dx_make_room(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        path: &mut Vec<PathStep>,
    ) -> Result<()> {
        let bs = self.geo.block_size as usize;
        let csum = self.geo.metadata_csum;
        if !path[path.len() - 1].1.is_full() {
            return Ok(());
        }
        let mut level = path.len() - 1;
        while level > 0 && path[level].1.is_full() {
            level -= 1;
        }
        if path[level].1.is_full() {
            // The root is full: its entries move into a new node under a one-entry root.
            let (p0, mut root) = self.dir_read(dir, st, 0)?;
            let levels = root[ROOT_INDIRECT_LEVELS];
            if levels >= self.max_index_levels() {
                return Err(Error::NoSpace);
            }
            h.extend(4);
            let (nl, np) = self.dir_append_block(h, dir, st)?;
            let mut nb = vec![0u8; bs];
            set_rec_len(&mut nb, 0, bs);
            let node = DxNode {
                count_off: NODE_COUNT,
                limit: dx_limit(bs, false, csum),
                entries: path[0].1.entries.clone(),
            };
            node.store(&mut nb);
            self.put_dx(h, dir, st, np, &mut nb, false)?;
            let rnode = DxNode {
                count_off: ROOT_COUNT,
                limit: path[0].1.limit,
                entries: vec![(0, nl)],
            };
            rnode.store(&mut root);
            root[ROOT_INDIRECT_LEVELS] = levels + 1;
            self.put_dx(h, dir, st, p0, &mut root, true)?;
            let pos = path[0].2;
            path[0] = (0, rnode, 0);
            path.insert(1, (nl, node, pos));
            level = 1;
        }
        // path[level] has room; split every full node below it, top down.
        for l in level + 1..path.len() {
            if !path[l].1.is_full() {
                continue;
            }
            h.extend(4);
            let (nlblk, node, pos) = path[l].clone();
            let half = node.entries.len() / 2;
            let (rl, rp) = self.dir_append_block(h, dir, st)?;
            let mut right = DxNode {
                count_off: NODE_COUNT,
                limit: node.limit,
                entries: node.entries[half..].to_vec(),
            };
            let rhash = right.entries[0].0;
            right.entries[0].0 = 0;
            let left = DxNode {
                count_off: NODE_COUNT,
                limit: node.limit,
                entries: node.entries[..half].to_vec(),
            };
            let mut rb = vec![0u8; bs];
            set_rec_len(&mut rb, 0, bs);
            right.store(&mut rb);
            self.put_dx(h, dir, st, rp, &mut rb, false)?;
            self.store_dx(h, dir, st, nlblk, &left)?;
            // The parent gets the new node after the old one.
            let (plblk, pnode, ppos) = &mut path[l - 1];
            pnode.entries.insert(*ppos + 1, (rhash, rl));
            let (plblk, pnode_c) = (*plblk, pnode.clone());
            if pos >= half {
                *ppos += 1;
                path[l] = (rl, right, pos - half);
            } else {
                path[l] = (nlblk, left, pos);
            }
            self.store_dx(h, dir, st, plblk, &pnode_c)?;
        }
        Ok(())
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

    /// readdir of an indexed directory, in hash order with hash cookies. Leaves continuing a
    /// run of equal hashes are read together and sorted as one.
    fn dx_iter(
        &self,
        dir: u32,
        st: &mut InodeState,
        offset: u64,
        f: &mut DirIterFn<'_>,
    ) -> Result<()> {
        if offset < 1 {
            let (ino, ft, _) = self.root_dot(dir, st, false)?.unwrap_or((dir, FT_DIR, 0));
            if !f(1, ino, ft, b".") {
                return Ok(());
            }
        }
        if offset < 2 {
            let (ino, ft, _) = self.root_dot(dir, st, true)?.unwrap_or((dir, FT_DIR, 0));
            if !f(2, ino, ft, b"..") {
                return Ok(());
            }
        }
        let cookie = |e: &Hashed| (((e.0 >> 1) as u64) << 32 | e.1 as u64).max(3);
        let start_hash = if offset <= 2 {
            0
        } else {
            ((offset >> 32) as u32) << 1
        };
        let (mut path, version) = self.dx_probe(dir, st, start_hash)?;
        let nblocks = self.dir_blocks(st) as u64;
        let mut visited = 0u64;
        loop {
            let mut entries = Vec::new();
            loop {
                let leaf = Self::path_leaf(&path);
                let (pblk, data) = self.dir_read(dir, st, leaf)?;
                entries.extend(self.leaf_entries(dir, st, leaf, pblk, &data, version)?);
                visited += 1;
                if visited > nblocks {
                    return Err(self.dir_err(dir, 0, 0, "htree leaves form a cycle".into()));
                }
                match Self::dx_peek_next(&path) {
                    Some(h) if h & 1 == 1 => {
                        self.dx_next_leaf(dir, st, &mut path)?;
                    }
                    _ => break,
                }
            }
            entries.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
            let mut i = 0;
            while i < entries.len() {
                let c = cookie(&entries[i]);
                let mut j = i + 1;
                while j < entries.len() && cookie(&entries[j]) == c {
                    j += 1;
                }
                if c > offset {
                    // Entries sharing a cookie go out together: all but the last resume
                    // before the run, so none is lost if the caller stops inside it.
                    for (k, e) in entries[i..j].iter().enumerate() {
                        let next = if i + k + 1 < j { c - 1 } else { c };
                        if !f(next, e.3, e.4, &e.2) {
                            return Ok(());
                        }
                    }
                }
                i = j;
            }
            if self.dx_next_leaf(dir, st, &mut path)?.is_none() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(hash: u32, len: usize) -> Hashed {
        (hash, 0, vec![b'n'; len], 11, FT_REG)
    }

    /// A filesystem in memory (1 KiB blocks, metadata_csum) with an empty directory "d".
    fn mem_fs() -> (std::sync::Arc<Fs>, u32) {
        let dev = crate::blockdev::MemDevice::new(32 << 20);
        let mut o = crate::mkfs::MkfsOptions::default_for(0);
        o.block_size = 1024;
        o.inode_ratio = 4096;
        crate::mkfs::mkfs(&dev, &o).unwrap();
        let fs = Fs::open_dev(std::sync::Arc::new(dev), Default::default()).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        (fs, d)
    }

    /// Only 6 distinct major hashes (minor hashes distinct): runs of equal hashes span many
    /// leaves, so splits set the collision bit, lookups follow continued leaves, readdir merges
    /// them, and index nodes split inside runs.
    #[test]
    fn hash_collisions_span_leaves() {
        fn weak(name: &[u8]) -> (u32, u32) {
            let c = crate::format::csum::crc32c(0, name);
            ((c % 6) << 20, c | 1)
        }
        TEST_HASH.with(|c| c.set(Some(weak)));
        let (fs, d) = mem_fs();
        let name = |i: usize| format!("collide-{i}-{}", "x".repeat(i % 30)).into_bytes();
        let n = 6000;
        let mut inos = Vec::new();
        for i in 0..n {
            inos.push(fs.create(d, &name(i), 0o644, 0, 0).unwrap().ino);
        }
        for i in (0..n).step_by(5) {
            fs.unlink(d, &name(i)).unwrap();
        }
        let dir = fs.iget(d).unwrap();
        let mut st = dir.state.lock();
        assert!(st.raw.flags() & FL_INDEX != 0);
        // Continued leaves exist: some index entry has the collision bit.
        let (_, root, node) = fs.read_dx(d, &mut st, 0).unwrap();
        let mut bits = node.entries.iter().filter(|e| e.0 & 1 == 1).count();
        for &(_, b) in &node.entries {
            if root[ROOT_INDIRECT_LEVELS] > 0 {
                let (_, _, n2) = fs.read_dx(d, &mut st, b).unwrap();
                bits += n2.entries.iter().filter(|e| e.0 & 1 == 1).count();
            }
        }
        assert!(bits > 0, "no collision bits set");
        assert_eq!(root[ROOT_INDIRECT_LEVELS], 1, "two index levels");
        for (i, &ino) in inos.iter().enumerate() {
            let want = if i % 5 == 0 {
                None
            } else {
                Some((ino, FT_REG))
            };
            assert_eq!(fs.dir_lookup(d, &mut st, &name(i)).unwrap(), want, "{i}");
        }
        // readdir in batches of 7 returns every name once, in cookie order.
        let mut seen = std::collections::BTreeMap::new();
        let mut off = 0u64;
        loop {
            let mut got = 0;
            let mut last = off;
            fs.dir_iter(d, &mut st, off, &mut |next, _, _, nm| {
                if got == 7 {
                    return false;
                }
                got += 1;
                assert!(next >= last, "cookies go backwards");
                last = next;
                *seen.entry(nm.to_vec()).or_insert(0) += 1;
                true
            })
            .unwrap();
            if got == 0 {
                break;
            }
            off = last;
        }
        assert_eq!(seen.len(), n - n / 5 + 2);
        assert!(seen.values().all(|&c| c == 1));
        assert!(fs.dir_is_empty(d, &mut st).is_ok_and(|e| !e));
        drop(st);
        TEST_HASH.with(|c| c.set(None));
    }

    #[test]
    fn split_by_size_with_collision_bit() {
        // Distinct hashes: the halves split by bytes, the index hash is the right's first.
        let v: Vec<Hashed> = (0..10).map(|i| e(i * 16, 4)).collect();
        let (l, r, h) = Fs::split_sorted(v);
        assert_eq!((l.len(), r.len(), h), (5, 5, 80));
        // A run of one hash across the split point: the collision bit is set.
        let v: Vec<Hashed> = vec![e(2, 4), e(8, 4), e(8, 4), e(8, 4), e(8, 4), e(10, 4)];
        let (l, r, h) = Fs::split_sorted(v);
        assert_eq!(l.last().unwrap().0, 8);
        assert_eq!(r.first().unwrap().0, 8);
        assert_eq!(h, 8 | 1);
        // Sizes matter: one big entry balances several small ones; never an empty half.
        let v = vec![e(2, 200), e(4, 4), e(6, 4), e(8, 4)];
        let (l, r, h) = Fs::split_sorted(v);
        assert_eq!((l.len(), r.len(), h), (1, 3, 4));
        let (l, r, _) = Fs::split_sorted(vec![e(2, 4), e(4, 200)]);
        assert_eq!((l.len(), r.len()), (1, 1));
    }
}
