//! The hashed directory index (htree, "dx"), as the kernel's namei.c dx_* code: lookups walk
//! the index from the root to the leaf for a name's hash, readdir goes through the leaves in
//! hash order, and adding a name to a full leaf splits it (and full index nodes above it).
//!
//! Block 0 of an indexed directory is the dx root: fake "." and ".." entries, `dx_root_info`
//! (hash version, indirect levels), then a count/limit header and (hash, block) entries. Interior
//! nodes are a fake empty directory entry followed by the same count/limit and entries. With
//! metadata_csum every index block ends in an 8-byte `dx_tail` holding its checksum. The byte
//! layout is format/htree.rs, the name hashes format/dx_hash.rs; leaves are the linear blocks of
//! dir.rs.
//!
//! Every function here runs with the caller holding the directory's `io_lock` and its `state`
//! mutex (passed as `st`), as in dir.rs.

use crate::dir::block::{DirIterFn, NewEntry};
use crate::error::{Error, Result};
use crate::fname::{dirent_rec_len, Fname};
use crate::format::dir_entry::*;
use crate::format::features::INCOMPAT_LARGEDIR;
use crate::format::inode::FL_INDEX;
use crate::format::{le16, le32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

pub use crate::format::dx_hash::{dirhash, hash_version_known};
pub use crate::format::htree::*;

/// A live entry with its hash: (major, minor, name, inode, type).
type Hashed = (u32, u32, Vec<u8>, u32, u8);

/// One level of a walk down the index: (logical block of the index block, its entries, the
/// position taken).
type PathStep = (u32, DxNode, usize);

#[cfg(test)]
pub(crate) type TestHashFn = fn(&[u8]) -> (u32, u32);

#[cfg(test)]
thread_local! {
    /// Unit tests only: replaces the name hash of the index on this thread (to force
    /// collisions through the whole filesystem's create, lookup and readdir).
    pub(crate) static TEST_HASH: std::cell::Cell<Option<TestHashFn>> =
        const { std::cell::Cell::new(None) };
}

impl Fs {
    /// Whether a block of an indexed directory is an interior index node (a fake empty entry
    /// covering the whole block, no leaf tail).
    pub(crate) fn is_dx_node(&self, b: &[u8]) -> bool {
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
    pub(crate) fn dir_hash_version(&self, root: &[u8]) -> u8 {
        let v = root[ROOT_HASH_VERSION];
        if v <= DX_HASH_TEA && self.geo.unsigned_hash {
            v + 3
        } else {
            v
        }
    }

    /// The hash of `name` as given (already folded where its directory folds names: see
    /// fname.rs).
    pub(crate) fn name_hash(&self, name: &[u8], version: u8) -> (u32, u32) {
        #[cfg(test)]
        if let Some(f) = TEST_HASH.with(|c| c.get()) {
            return f(name);
        }
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
            // dx_probe: SipHash exactly where the entries store their hashes.
            let hashed = self.hash_in_dirent(st);
            if hashed != (v == DX_HASH_SIPHASH) && (hashed || hash_version_known(v)) {
                let why = if hashed {
                    "hash in dirent, but hash is not SIPHASH"
                } else {
                    "hash code is SIPHASH, but hash not in dirent"
                };
                return Err(self.dir_err(dir, lblk, pblk, why.into()));
            }
            if !hash_version_known(v) && !hashed {
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

    /// "." and ".." of a directory whose block 0 is a dx root: (inode, type, offset).
    pub(crate) fn root_dot(
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

    /// Finds `name` through the index: (inode, type, block, offset).
    pub(crate) fn dx_find(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &Fname<'_>,
    ) -> Result<Option<(u32, u8, u32, usize)>> {
        let p0 = self.dir_pblk(dir, st, 0)?;
        let version = self.dir_hash_version(&self.bcache.get(p0)?.read());
        let hash0 = match name.given_hash() {
            Some((h, _)) => h,
            None => self.name_hash(name.hash_bytes(), version).0,
        };
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

    /// Writes a changed index block through the handle (dx checksum first).
    pub(crate) fn put_dx(
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

    /// Live entries of a leaf with their hashes (the stored ones where the directory stores
    /// them, as htree_dirblock_to_tree and dx_make_map).
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
        let hashed = self.hash_in_dirent(st);
        for e in self.dir_validate_block(dir, st, lblk, pblk, data)? {
            if e.inode == 0 {
                continue;
            }
            let name = e.name(data).to_vec();
            let (hh, mm) = if hashed && !crate::fname::is_dot(&name) {
                self.entry_stored_hash(st, data, &e).ok_or_else(|| {
                    self.dir_err(dir, lblk, pblk, format!("no hash in entry at {}", e.off))
                })?
            } else {
                self.name_hash(&self.entry_hash_bytes(st, &name), version)
            };
            v.push((hh, mm, name, e.inode, e.ftype));
        }
        Ok(v)
    }

    /// Hashed entries packed into a fresh leaf image (`stored`: each keeps its hash after its
    /// name, in an encrypted casefolded directory).
    fn pack_hashed(&self, entries: &[Hashed], stored: bool) -> Vec<u8> {
        self.pack_leaf(entries.iter().map(|e| NewEntry {
            name: &e.2,
            ino: e.3,
            ftype: e.4,
            hash: stored.then_some((e.0, e.1)),
        }))
    }

    /// Converts a full one-block directory into an indexed one, as the kernel's make_indexed_dir:
    /// block 0 becomes the dx root, its entries are split by hash into two new leaves.
    pub(crate) fn make_indexed(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
    ) -> Result<()> {
        let (p0, data) = self.dir_read(dir, st, 0)?;
        let hashed = self.hash_in_dirent(st);
        let mut def = self.geo.def_hash_version;
        if def > DX_HASH_TEA {
            def = DX_HASH_HALF_MD4;
        }
        let version = if self.geo.unsigned_hash { def + 3 } else { def };
        if hashed {
            def = DX_HASH_SIPHASH;
        }
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
        let (left, right, split_hash) = Self::split_sorted(entries, hashed);
        self.put_leaf(h, dir, st, p1, &mut self.pack_hashed(&left, hashed))?;
        self.put_leaf(h, dir, st, p2, &mut self.pack_hashed(&right, hashed))?;
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
    /// the collision bit when the split falls inside a run of equal hashes. `stored`: the
    /// entries keep their hashes after their names.
    fn split_sorted(mut entries: Vec<Hashed>, stored: bool) -> (Vec<Hashed>, Vec<Hashed>, u32) {
        let size = |e: &Hashed| dirent_rec_len(e.2.len(), stored);
        let total: usize = entries.iter().map(size).sum();
        let mut acc = 0;
        let mut at = entries.len();
        for (i, e) in entries.iter().enumerate() {
            if acc + size(e) > total / 2 && i > 0 {
                at = i;
                break;
            }
            acc += size(e);
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
    pub(crate) fn dx_add(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        st: &mut InodeState,
        new: &NewEntry<'_>,
    ) -> Result<()> {
        let p0 = self.dir_pblk(dir, st, 0)?;
        let version = self.dir_hash_version(&self.bcache.get(p0)?.read());
        let hashed = self.hash_in_dirent(st);
        let (hash, _) = match new.hash {
            Some(h) => h,
            None => self.name_hash(&self.entry_hash_bytes(st, new.name), version),
        };
        for _attempt in 0..8 {
            let (mut path, _) = self.dx_probe(dir, st, hash)?;
            let leaf = Self::path_leaf(&path);
            let pblk = self.dir_pblk(dir, st, leaf)?;
            let (mut data, checked) = self.leaf_copy(dir, pblk)?;
            if self.leaf_insert(dir, st, (leaf, pblk), (&mut data, checked), new)? {
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
            let (left, right, split_hash) = Self::split_sorted(entries, hashed);
            self.put_leaf(h, dir, st, pblk, &mut self.pack_hashed(&left, hashed))?;
            self.put_leaf(h, dir, st, np, &mut self.pack_hashed(&right, hashed))?;
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

    /// readdir of an indexed directory, in hash order with hash cookies. Leaves continuing a
    /// run of equal hashes are read together and sorted as one.
    pub(crate) fn dx_iter(
        &self,
        dir: u32,
        st: &mut InodeState,
        offset: u64,
        f: &mut DirIterFn<'_>,
    ) -> Result<()> {
        if offset < 1 {
            let (ino, ft, _) = self.root_dot(dir, st, false)?.unwrap_or((dir, FT_DIR, 0));
            if !f(1, ino, ft, b".", None) {
                return Ok(());
            }
        }
        if offset < 2 {
            let (ino, ft, _) = self.root_dot(dir, st, true)?.unwrap_or((dir, FT_DIR, 0));
            if !f(2, ino, ft, b"..", None) {
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
        let stored = self.hash_in_dirent(st);
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
                        if !f(next, e.3, e.4, &e.2, stored.then_some((e.0, e.1))) {
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
mod tests;
