//! Directories (Documentation/filesystems/ext4/directory.rst): linear blocks of
//! `ext4_dir_entry_2`, each block ending in a checksum tail with metadata_csum, and the hashed
//! index of htree.rs on top for directories of more than one block.
//!
//! Every function here runs with the caller holding the directory's `io_lock` (shared for
//! lookups and iteration, exclusive for changes) and its `state` mutex (passed as `st`).
//! Directory blocks are read and written through the buffer cache as metadata.
//!
//! readdir cookies: for a linear directory, the byte position of the next entry (entries never
//! move in a linear directory); for an indexed one, the entry's (major hash << 32 | minor hash),
//! so that a cookie stays meaningful when leaves split under a reader, as in the kernel.

use crate::error::{Error, Result};
use crate::format::extent::Extent;
use crate::format::inode::{RawInode, FL_INDEX};
use crate::format::{le16, le32, put16, put32};
use crate::fs::Fs;
use crate::htree::*;
use crate::inode::InodeState;
use crate::transaction::Handle;

const TAIL_SIZE: usize = 12;
const TAIL_FT: u8 = 0xDE;
const FT_DIR: u8 = 2;

/// The size a directory entry with a `name_len`-byte name needs.
pub fn rec_len_for(name_len: usize) -> usize {
    (8 + name_len + 3) & !3
}

/// One entry as parsed from a block.
#[derive(Clone, Debug)]
struct Dirent {
    off: usize,
    inode: u32,
    rec_len: usize,
    name_len: usize,
    ftype: u8,
}

impl Dirent {
    fn used(&self) -> usize {
        if self.inode == 0 {
            0
        } else {
            rec_len_for(self.name_len)
        }
    }
}

fn put_dirent(b: &mut [u8], off: usize, inode: u32, rec_len: usize, name: &[u8], ftype: u8) {
    put32(b, off, inode);
    put16(b, off + 4, rec_len as u16);
    b[off + 6] = name.len() as u8;
    b[off + 7] = ftype;
    b[off + 8..off + 8 + name.len()].copy_from_slice(name);
}

fn decode_rec_len(v: u16, bs: usize) -> usize {
    if v == 0 || v == 65535 {
        bs.min(65536)
    } else {
        v as usize
    }
}

impl Fs {
    fn dir_seed(&self, ino: u32, raw: &RawInode) -> u32 {
        RawInode::csum_seed(self.geo.csum_seed, ino, raw.generation())
    }

    /// Bytes of a leaf block available to entries (the tail takes the last 12 with checksums).
    fn leaf_space(&self) -> usize {
        self.geo.block_size as usize - if self.geo.metadata_csum { TAIL_SIZE } else { 0 }
    }

    fn dir_err(&self, dir: u32, lblk: u32, pblk: u64, what: String) -> Error {
        self.fail(
            Error::corrupt(format!("directory inode {dir}, block {lblk}: {what}")),
            dir,
            pblk,
            "dir",
        )
    }

    /// Physical block of directory block `lblk`.
    fn dir_pblk(&self, dir: u32, st: &mut InodeState, lblk: u32) -> Result<u64> {
        match self.ext_map(dir, st, lblk)? {
            Some(e) if !e.unwritten => Ok(e.pblk + (lblk - e.lblk) as u64),
            _ => Err(self.dir_err(dir, lblk, 0, "hole in directory".into())),
        }
    }

    fn dir_blocks(&self, st: &InodeState) -> u32 {
        (st.raw.size() / self.geo.block_size as u64) as u32
    }

    /// Parses and validates a leaf block; verifies its checksum.
    fn parse_leaf(
        &self,
        dir: u32,
        st: &InodeState,
        lblk: u32,
        pblk: u64,
        b: &[u8],
    ) -> Result<Vec<Dirent>> {
        let bs = b.len();
        let end = if self.geo.metadata_csum && self.has_tail(b) {
            bs - TAIL_SIZE
        } else {
            bs
        };
        if self.geo.metadata_csum && end != bs {
            let want =
                crate::format::csum::crc32c(self.dir_seed(dir, &st.raw), &b[..bs - TAIL_SIZE]);
            if le32(b, bs - 4) != want {
                return Err(self.fail(
                    Error::BadChecksum(format!(
                        "directory inode {dir}, block {lblk} (physical {pblk})"
                    )),
                    dir,
                    pblk,
                    "dir",
                ));
            }
        }
        let mut out = Vec::new();
        let mut off = 0;
        while off < end {
            if off + 8 > end {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("entry at offset {off} overruns the block"),
                ));
            }
            let rec_len = decode_rec_len(le16(b, off + 4), bs);
            let name_len = b[off + 6] as usize;
            let inode = le32(b, off);
            if rec_len < 8
                || rec_len % 4 != 0
                || off + rec_len > end
                || (inode != 0 && 8 + name_len > rec_len)
            {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("bad entry at offset {off} (rec_len {rec_len}, name_len {name_len})"),
                ));
            }
            if inode > self.geo.inodes_count {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("entry at offset {off} points at inode {inode}, past the last"),
                ));
            }
            let ftype = if self.geo.filetype { b[off + 7] } else { 0 };
            out.push(Dirent {
                off,
                inode,
                rec_len,
                name_len,
                ftype,
            });
            off += rec_len;
        }
        Ok(out)
    }

    fn has_tail(&self, b: &[u8]) -> bool {
        let t = b.len() - TAIL_SIZE;
        le32(b, t) == 0
            && le16(b, t + 4) as usize == TAIL_SIZE
            && b[t + 6] == 0
            && b[t + 7] == TAIL_FT
    }

    /// Writes the checksum tail of a leaf block.
    fn set_leaf_csum(&self, dir: u32, st: &InodeState, b: &mut [u8]) {
        if !self.geo.metadata_csum {
            return;
        }
        let bs = b.len();
        let t = bs - TAIL_SIZE;
        put32(b, t, 0);
        put16(b, t + 4, TAIL_SIZE as u16);
        b[t + 6] = 0;
        b[t + 7] = TAIL_FT;
        let c = crate::format::csum::crc32c(self.dir_seed(dir, &st.raw), &b[..t]);
        put32(b, bs - 4, c);
    }

    fn is_indexed(&self, st: &InodeState) -> bool {
        st.raw.flags() & FL_INDEX != 0 && self.geo.dir_index
    }

    fn dir_hash_version(&self, root: &[u8]) -> u8 {
        let v = root[ROOT_INFO + 4];
        if v <= DX_HASH_TEA && self.geo.unsigned_hash {
            v + 3
        } else {
            v
        }
    }

    fn name_hash(&self, name: &[u8], version: u8) -> (u32, u32) {
        dirhash(name, version, &self.geo.hash_seed)
    }

    /// Reads an index block and checks it.
    fn read_dx(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
        root: bool,
    ) -> Result<(u64, Vec<u8>, DxNode)> {
        let pblk = self.dir_pblk(dir, st, lblk)?;
        let data = self.bcache.get(pblk)?.read().to_vec();
        let off = if root { ROOT_COUNT } else { NODE_COUNT };
        if root && (data[ROOT_INFO + 5] != 8 || data[ROOT_INFO + 6] > 2) {
            return Err(self.dir_err(dir, lblk, pblk, "bad htree root info".into()));
        }
        let node = DxNode::parse(&data, off)
            .ok_or_else(|| self.dir_err(dir, lblk, pblk, "bad htree count/limit".into()))?;
        if node.limit != dx_limit(data.len(), root, self.geo.metadata_csum) {
            return Err(self.dir_err(
                dir,
                lblk,
                pblk,
                format!("htree limit {} is wrong", node.limit),
            ));
        }
        if self.geo.metadata_csum && !verify_dx_csum(self.dir_seed(dir, &st.raw), &data, off) {
            return Err(self.fail(
                Error::BadChecksum(format!("directory inode {dir}, htree block {lblk}")),
                dir,
                pblk,
                "dir",
            ));
        }
        let nblocks = self.dir_blocks(st);
        for &(_, b) in &node.entries {
            if b == 0 || b >= nblocks {
                return Err(self.dir_err(
                    dir,
                    lblk,
                    pblk,
                    format!("htree points at block {b} (directory has {nblocks})"),
                ));
            }
        }
        Ok((pblk, data, node))
    }

    /// Walks the index to the leaf for `hash`. Returns the path: (lblk, node, position) per level.
    fn dx_probe(
        &self,
        dir: u32,
        st: &mut InodeState,
        hash: u32,
    ) -> Result<(Vec<(u32, DxNode, usize)>, u8)> {
        let (_, root, node) = self.read_dx(dir, st, 0, true)?;
        let levels = root[ROOT_INFO + 6] as usize;
        let version = self.dir_hash_version(&root);
        let mut path = Vec::new();
        let mut cur = (0u32, node);
        for level in 0..=levels {
            let pos = cur.1.find(hash);
            let child = cur.1.entries[pos].1;
            path.push((cur.0, cur.1.clone(), pos));
            if level == levels {
                break;
            }
            let (_, _, n) = self.read_dx(dir, st, child, false)?;
            cur = (child, n);
        }
        Ok((path, version))
    }

    /// Leaf block number at the bottom of a probe path.
    fn path_leaf(path: &[(u32, DxNode, usize)]) -> u32 {
        let (_, n, p) = path.last().unwrap();
        n.entries[*p].1
    }

    /// Searches one leaf block for `name`.
    fn leaf_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        lblk: u32,
        name: &[u8],
    ) -> Result<Option<(u32, u8, usize)>> {
        let pblk = self.dir_pblk(dir, st, lblk)?;
        let data = self.bcache.get(pblk)?.read().to_vec();
        for e in self.parse_leaf(dir, st, lblk, pblk, &data)? {
            if e.inode != 0
                && e.name_len == name.len()
                && &data[e.off + 8..e.off + 8 + e.name_len] == name
            {
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
        if self.is_indexed(st) && name != b"." && name != b".." {
            let hash0 = {
                let pblk = self.dir_pblk(dir, st, 0)?;
                let root = self.bcache.get(pblk)?.read().to_vec();
                self.name_hash(name, self.dir_hash_version(&root)).0
            };
            let (mut path, _) = self.dx_probe(dir, st, hash0)?;
            let mut guard = 0;
            loop {
                let leaf = Self::path_leaf(&path);
                if let Some((i, t, o)) = self.leaf_find(dir, st, leaf, name)? {
                    return Ok(Some((i, t, leaf, o)));
                }
                // A hash run may continue in the next leaf (collision bit on its index entry).
                match self.dx_next_leaf(dir, st, &mut path)? {
                    Some(h) if h & !1 == hash0 => {}
                    _ => return Ok(None),
                }
                guard += 1;
                if guard > 1 << 20 {
                    return Err(self.dir_err(dir, 0, 0, "htree walk does not end".into()));
                }
            }
        }
        for lblk in 0..self.dir_blocks(st) {
            if let Some((i, t, o)) = self.leaf_find(dir, st, lblk, name)? {
                return Ok(Some((i, t, lblk, o)));
            }
        }
        Ok(None)
    }

    /// Moves a probe path to the next leaf in hash order; returns that leaf's starting hash.
    fn dx_next_leaf(
        &self,
        dir: u32,
        st: &mut InodeState,
        path: &mut Vec<(u32, DxNode, usize)>,
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
            let (_, _, n) = self.read_dx(dir, st, child, false)?;
            path[l] = (child, n, 0);
        }
        Ok(Some(hash))
    }

    pub(crate) fn dir_lookup(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &[u8],
    ) -> Result<Option<(u32, u8)>> {
        Ok(self.dir_find(dir, st, name)?.map(|(i, t, _, _)| (i, t)))
    }

    /// Writes a changed leaf block through the handle.
    fn put_leaf(
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

    /// Tries to put an entry into a leaf block in memory. Returns false if there is no room.
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
        let ft = if self.geo.filetype { ftype } else { 0 };
        for e in self.parse_leaf(dir, st, lblk, pblk, data)? {
            if e.inode == 0 && e.rec_len >= need {
                put_dirent(data, e.off, ino, e.rec_len, name, ft);
                return Ok(true);
            }
            let used = e.used();
            if e.inode != 0 && e.rec_len >= used + need {
                put16(data, e.off + 4, used as u16);
                put_dirent(data, e.off + used, ino, e.rec_len - used, name, ft);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Appends an empty block to the directory; returns (lblk, pblk).
    fn dir_append_block(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
    ) -> Result<(u32, u64)> {
        let lblk = self.dir_blocks(st);
        let goal = match lblk.checked_sub(1) {
            Some(l) => self.dir_pblk(dir, st, l)? + 1,
            None => self.geo.group_first_block(self.geo.ino_group(dir)),
        };
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
            let _ = self.free_blocks(h, p, 1, false);
            return Err(e);
        }
        let size = (lblk as u64 + 1) * self.geo.block_size as u64;
        st.raw.set_size(size);
        self.bcache.get_new(p)?;
        Ok((lblk, p))
    }

    /// An empty leaf block image.
    fn empty_leaf(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.geo.block_size as usize];
        put16(&mut b, 4, self.leaf_space() as u16);
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
        let ft = if self.geo.filetype { FT_DIR } else { 0 };
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
        if self.is_indexed(st) {
            return self.dx_add(h, dir, st, name, ino, ftype);
        }
        let n = self.dir_blocks(st);
        for lblk in 0..n {
            let pblk = self.dir_pblk(dir, st, lblk)?;
            let mut data = self.bcache.get(pblk)?.read().to_vec();
            if self.leaf_insert(dir, st, lblk, pblk, &mut data, name, ino, ftype)? {
                return self.put_leaf(h, dir, st, pblk, &mut data);
            }
        }
        if n == 1 && self.geo.dir_index {
            self.make_indexed(h, dir, st)?;
            return self.dx_add(h, dir, st, name, ino, ftype);
        }
        let (lblk, pblk) = self.dir_append_block(h, dir, st)?;
        let mut data = self.empty_leaf();
        if !self.leaf_insert(dir, st, lblk, pblk, &mut data, name, ino, ftype)? {
            return Err(Error::NameTooLong);
        }
        self.put_leaf(h, dir, st, pblk, &mut data)
    }

    /// Live entries of a leaf as (hash, minor, name, inode, type).
    fn leaf_entries(
        &self,
        dir: u32,
        st: &InodeState,
        lblk: u32,
        pblk: u64,
        data: &[u8],
        version: u8,
    ) -> Result<Vec<(u32, u32, Vec<u8>, u32, u8)>> {
        let mut v = Vec::new();
        for e in self.parse_leaf(dir, st, lblk, pblk, data)? {
            if e.inode == 0 {
                continue;
            }
            let name = data[e.off + 8..e.off + 8 + e.name_len].to_vec();
            let (hh, mm) = self.name_hash(&name, version);
            v.push((hh, mm, name, e.inode, e.ftype));
        }
        Ok(v)
    }

    /// Writes `entries` packed into a fresh leaf image.
    fn pack_leaf(&self, entries: &[(u32, u32, Vec<u8>, u32, u8)]) -> Vec<u8> {
        let mut b = vec![0u8; self.geo.block_size as usize];
        let space = self.leaf_space();
        let mut off = 0;
        for (i, (_, _, name, ino, ft)) in entries.iter().enumerate() {
            let rl = if i + 1 == entries.len() {
                space - off
            } else {
                rec_len_for(name.len())
            };
            put_dirent(
                &mut b,
                off,
                *ino,
                rl,
                name,
                if self.geo.filetype { *ft } else { 0 },
            );
            off += rl;
        }
        if entries.is_empty() {
            put16(&mut b, 4, space as u16);
        }
        b
    }

    /// Converts a full one-block directory into an indexed one, as the kernel's make_indexed_dir:
    /// block 0 becomes the dx root, its entries are split by hash into two new leaves.
    fn make_indexed(&self, h: &mut Handle<'_>, dir: u32, st: &mut InodeState) -> Result<()> {
        let p0 = self.dir_pblk(dir, st, 0)?;
        let data = self.bcache.get(p0)?.read().to_vec();
        let version = {
            let v = self.sb.lock().def_hash_version();
            if v <= DX_HASH_TEA && self.geo.unsigned_hash {
                v + 3
            } else {
                v
            }
        };
        let mut parent = dir;
        let mut entries = Vec::new();
        for (i, e) in self
            .leaf_entries(dir, st, 0, p0, &data, version)?
            .into_iter()
            .enumerate()
        {
            if i == 0 && e.2 == b"." {
                continue;
            }
            if e.2 == b".." {
                parent = e.3;
                continue;
            }
            entries.push(e);
        }
        entries.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let (l1, p1) = self.dir_append_block(h, dir, st)?;
        let (l2, p2) = self.dir_append_block(h, dir, st)?;
        let (left, right, split_hash) = self.split_sorted(entries);
        self.put_leaf(h, dir, st, p1, &mut self.pack_leaf(&left))?;
        self.put_leaf(h, dir, st, p2, &mut self.pack_leaf(&right))?;
        // The root.
        let bs = self.geo.block_size as usize;
        let mut root = vec![0u8; bs];
        let ft = if self.geo.filetype { FT_DIR } else { 0 };
        put_dirent(&mut root, 0, dir, 12, b".", ft);
        put_dirent(&mut root, 12, parent, bs - 12, b"..", ft);
        root[ROOT_INFO + 4] = if version >= 3 { version - 3 } else { version };
        root[ROOT_INFO + 5] = 8;
        root[ROOT_INFO + 6] = 0;
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
    #[allow(clippy::type_complexity)]
    fn split_sorted(
        &self,
        mut entries: Vec<(u32, u32, Vec<u8>, u32, u8)>,
    ) -> (
        Vec<(u32, u32, Vec<u8>, u32, u8)>,
        Vec<(u32, u32, Vec<u8>, u32, u8)>,
        u32,
    ) {
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
        let at = at.clamp(1, entries.len().saturating_sub(1).max(1));
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
        for _attempt in 0..4 {
            let (path, _) = self.dx_probe(dir, st, hash)?;
            let leaf = Self::path_leaf(&path);
            let pblk = self.dir_pblk(dir, st, leaf)?;
            let mut data = self.bcache.get(pblk)?.read().to_vec();
            if self.leaf_insert(dir, st, leaf, pblk, &mut data, name, ino, ftype)? {
                return self.put_leaf(h, dir, st, pblk, &mut data);
            }
            // Split the leaf.
            let mut entries = self.leaf_entries(dir, st, leaf, pblk, &data, version)?;
            entries.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            if entries.len() < 2 {
                return Err(Error::NoSpace);
            }
            self.dx_make_room(h, dir, st, &path)?;
            let (nl, np) = self.dir_append_block(h, dir, st)?;
            let (left, right, split_hash) = self.split_sorted(entries);
            self.put_leaf(h, dir, st, pblk, &mut self.pack_leaf(&left))?;
            self.put_leaf(h, dir, st, np, &mut self.pack_leaf(&right))?;
            // Re-probe (the index may have changed shape) and insert the new index entry
            // after the one pointing at the old leaf.
            let (path, _) = self.dx_probe(dir, st, split_hash & !1)?;
            let (plblk, mut pnode, _) = path.last().unwrap().clone();
            let pos = pnode
                .entries
                .iter()
                .position(|e| e.1 == leaf)
                .ok_or_else(|| {
                    self.dir_err(dir, plblk, 0, "htree lost a leaf during a split".into())
                })?;
            pnode.entries.insert(pos + 1, (split_hash, nl));
            let root = path.len() == 1;
            let pp = self.dir_pblk(dir, st, plblk)?;
            let mut pdata = self.bcache.get(pp)?.read().to_vec();
            pnode.store(&mut pdata);
            self.put_dx(h, dir, st, pp, &mut pdata, root)?;
        }
        Err(self.dir_err(
            dir,
            0,
            0,
            "could not insert into the htree after splitting".into(),
        ))
    }

    /// Makes sure the bottom index node on `path` has room for one more entry: splits full
    /// nodes upwards, and adds a level when the root is full.
    fn dx_make_room(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        path: &[(u32, DxNode, usize)],
    ) -> Result<()> {
        let bs = self.geo.block_size as usize;
        let csum = self.geo.metadata_csum;
        // Find the lowest level with room.
        let mut level = path.len() - 1;
        while path[level].1.entries.len() >= path[level].1.limit {
            if level == 0 {
                break;
            }
            level -= 1;
        }
        let full_root = path[0].1.entries.len() >= path[0].1.limit;
        if level == 0 && full_root && path[level].1.entries.len() >= path[level].1.limit {
            // Add a level: the root's entries move into a new node.
            let p0 = self.dir_pblk(dir, st, 0)?;
            let mut root = self.bcache.get(p0)?.read().to_vec();
            let levels = root[ROOT_INFO + 6];
            let max_levels = if self
                .sb
                .lock()
                .has_incompat(crate::format::features::INCOMPAT_LARGEDIR)
            {
                2
            } else {
                1
            };
            if levels >= max_levels {
                return Err(Error::NoSpace);
            }
            let (nl, np) = self.dir_append_block(h, dir, st)?;
            let mut nb = vec![0u8; bs];
            put16(&mut nb, 4, bs as u16); // fake empty entry covering the block
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
            root[ROOT_INFO + 6] = levels + 1;
            self.put_dx(h, dir, st, p0, &mut root, true)?;
            // The new node is full (it holds what the root held): split it on the next pass.
            let (path2, _) = self.dx_probe(
                dir,
                st,
                path.last().map(|p| p.1.entries[p.2].0).unwrap_or(0),
            )?;
            return self.dx_make_room(h, dir, st, &path2);
        }
        // Split each full node below `level`, from the top down.
        for l in level + 1..path.len() {
            let parent_now = self.read_dx(dir, st, path[l - 1].0, l - 1 == 0)?.2;
            let nlblk = path[l].0;
            let node_now = self.read_dx(dir, st, nlblk, false)?.2;
            if node_now.entries.len() < node_now.limit {
                continue;
            }
            let half = node_now.entries.len() / 2;
            let right: Vec<(u32, u32)> = node_now.entries[half..].to_vec();
            let left: Vec<(u32, u32)> = node_now.entries[..half].to_vec();
            let (rl, rp) = self.dir_append_block(h, dir, st)?;
            let mut rb = vec![0u8; bs];
            put16(&mut rb, 4, bs as u16);
            let rhash = right[0].0;
            let mut right_node = DxNode {
                count_off: NODE_COUNT,
                limit: node_now.limit,
                entries: right,
            };
            right_node.entries[0].0 = 0;
            right_node.store(&mut rb);
            self.put_dx(h, dir, st, rp, &mut rb, false)?;
            let lp = self.dir_pblk(dir, st, nlblk)?;
            let mut lb = self.bcache.get(lp)?.read().to_vec();
            DxNode {
                count_off: NODE_COUNT,
                limit: node_now.limit,
                entries: left,
            }
            .store(&mut lb);
            self.put_dx(h, dir, st, lp, &mut lb, false)?;
            // Parent gets the new node after the old one.
            let mut parent = parent_now;
            let pos = parent
                .entries
                .iter()
                .position(|e| e.1 == nlblk)
                .ok_or_else(|| self.dir_err(dir, 0, 0, "htree parent lost a node".into()))?;
            parent.entries.insert(pos + 1, (rhash, rl));
            let plblk = path[l - 1].0;
            let pp = self.dir_pblk(dir, st, plblk)?;
            let mut pb = self.bcache.get(pp)?.read().to_vec();
            parent.store(&mut pb);
            self.put_dx(h, dir, st, pp, &mut pb, l - 1 == 0)?;
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
        let Some((ino, ft, lblk, off)) = self.dir_find(dir, st, name)? else {
            return Err(Error::NotFound);
        };
        let pblk = self.dir_pblk(dir, st, lblk)?;
        let mut data = self.bcache.get(pblk)?.read().to_vec();
        let entries = self.parse_leaf(dir, st, lblk, pblk, &data)?;
        let i = entries.iter().position(|e| e.off == off).unwrap();
        if i == 0 {
            put32(&mut data, off, 0);
        } else {
            let prev = &entries[i - 1];
            put16(
                &mut data,
                prev.off + 4,
                (prev.rec_len + entries[i].rec_len) as u16,
            );
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
        let Some((old, oft, lblk, off)) = self.dir_find(dir, st, name)? else {
            return Err(Error::NotFound);
        };
        let pblk = self.dir_pblk(dir, st, lblk)?;
        let mut data = self.bcache.get(pblk)?.read().to_vec();
        put32(&mut data, off, ino);
        if self.geo.filetype {
            data[off + 7] = ftype;
        }
        if lblk == 0 && self.is_indexed(st) {
            self.put_dx(h, dir, st, pblk, &mut data, true)?;
        } else {
            self.put_leaf(h, dir, st, pblk, &mut data)?;
        }
        Ok((old, oft))
    }

    pub(crate) fn dir_is_empty(&self, dir: u32, st: &mut InodeState) -> Result<bool> {
        let indexed = self.is_indexed(st);
        for lblk in 0..self.dir_blocks(st) {
            let pblk = self.dir_pblk(dir, st, lblk)?;
            let data = self.bcache.get(pblk)?.read().to_vec();
            if indexed && lblk == 0 {
                continue;
            }
            if indexed && self.is_dx_node(&data) {
                continue;
            }
            for e in self.parse_leaf(dir, st, lblk, pblk, &data)? {
                if e.inode == 0 {
                    continue;
                }
                let n = &data[e.off + 8..e.off + 8 + e.name_len];
                if n != b"." && n != b".." {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Whether a block of an indexed directory is an interior index node (a fake empty entry
    /// covering the whole block, followed by count/limit).
    fn is_dx_node(&self, b: &[u8]) -> bool {
        le32(b, 0) == 0 && decode_rec_len(le16(b, 4), b.len()) == b.len() && b[6] == 0
    }

    pub(crate) fn dir_iter(
        &self,
        dir: u32,
        st: &mut InodeState,
        offset: u64,
        f: &mut dyn FnMut(u64, u32, u8, &[u8]) -> bool,
    ) -> Result<()> {
        if self.is_indexed(st) {
            return self.dx_iter(dir, st, offset, f);
        }
        let bs = self.geo.block_size as u64;
        let mut lblk = (offset / bs) as u32;
        let n = self.dir_blocks(st);
        while lblk < n {
            let pblk = self.dir_pblk(dir, st, lblk)?;
            let data = self.bcache.get(pblk)?.read().to_vec();
            for e in self.parse_leaf(dir, st, lblk, pblk, &data)? {
                let pos = lblk as u64 * bs + e.off as u64;
                if pos < offset || e.inode == 0 {
                    continue;
                }
                let name = &data[e.off + 8..e.off + 8 + e.name_len];
                if !f(pos + e.rec_len as u64, e.inode, e.ftype, name) {
                    return Ok(());
                }
            }
            lblk += 1;
        }
        Ok(())
    }

    /// readdir of an indexed directory, in hash order with hash cookies.
    fn dx_iter(
        &self,
        dir: u32,
        st: &mut InodeState,
        offset: u64,
        f: &mut dyn FnMut(u64, u32, u8, &[u8]) -> bool,
    ) -> Result<()> {
        let p0 = self.dir_pblk(dir, st, 0)?;
        let root = self.bcache.get(p0)?.read().to_vec();
        let version = self.dir_hash_version(&root);
        if offset < 1 && !f(1, dir, FT_DIR, b".") {
            return Ok(());
        }
        if offset < 2 {
            let parent = le32(&root, 12);
            if !f(2, parent, FT_DIR, b"..") {
                return Ok(());
            }
        }
        let cookie = |hh: u32, mm: u32| ((hh as u64) << 32 | mm as u64).max(3);
        let start_hash = if offset <= 2 {
            0
        } else {
            (offset >> 32) as u32
        };
        let (mut path, _) = self.dx_probe(dir, st, start_hash)?;
        // Entries with the same major hash may sit in the previous leaf (a continued run).
        let mut guard = 0u64;
        loop {
            let leaf = Self::path_leaf(&path);
            let pblk = self.dir_pblk(dir, st, leaf)?;
            let data = self.bcache.get(pblk)?.read().to_vec();
            let mut entries = self.leaf_entries(dir, st, leaf, pblk, &data, version)?;
            entries.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
            for (hh, mm, name, ino, ft) in entries {
                let c = cookie(hh, mm);
                if c <= offset {
                    continue;
                }
                if !f(c, ino, ft, &name) {
                    return Ok(());
                }
            }
            if self.dx_next_leaf(dir, st, &mut path)?.is_none() {
                return Ok(());
            }
            guard += 1;
            if guard > self.dir_blocks(st) as u64 + 1 {
                return Err(self.dir_err(dir, 0, p0, "htree leaves form a cycle".into()));
            }
        }
    }
}
