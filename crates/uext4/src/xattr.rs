//! Extended attributes: get, list, set, remove, and release at inode deletion.
//!
//! The on-disk layout is in [`crate::format::xattr`]. Every change reads the inode's whole
//! attribute set (in-inode area and block), edits it, and lays it out again: the smallest
//! attributes go into the inode while they fit, the rest into the block, sorted as the kernel
//! sorts block entries. The block is written only when its contents change; a block shared with
//! other inodes (refcount > 1, made by the kernel's mbcache) is never written in place: this
//! inode gets a fresh copy and the shared block loses one reference.
//!
//! Locking: the inode's `io_lock` (shared to read, exclusive to change), then the handle, then
//! `inode.state`, then group locks (allocation) and buffer locks, per the ranking in docs/ARCHITECTURE.md.

use crate::cred::Cred;
use crate::error::{Corruption, Error, Result};
use crate::format::features::COMPAT_EXT_ATTR;
use crate::format::inode::RawInode;
use crate::format::xattr::*;
use crate::format::{le32, put32};
use crate::fs::Fs;
use crate::inode::{Inode, InodeState};
use crate::transaction::Handle;
use crate::xattr_inode::count_refs;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// How setxattr treats an existing attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrFlags {
    /// Create or replace.
    Any,
    /// Fail with `Error::Exists` if the attribute exists.
    Create,
    /// Fail with `Error::NoAttr` if the attribute does not exist.
    Replace,
}

const S_ISGID: u16 = 0o2000;
/// The name of `security.capability` after its prefix.
const CAPABILITY: &[u8] = b"capability";

/// An inode's attributes as read: in-inode entries, block entries, the block number (0: none).
pub(crate) struct Loaded {
    pub ibody: Vec<XattrEntry>,
    pub block: Vec<XattrEntry>,
    pub blk: u64,
}

/// Whether the inode has any extended attribute (in the inode or a block): known from its
/// on-disk fields in memory, without I/O.
pub(crate) fn has_xattrs(raw: &RawInode) -> bool {
    raw.xattr_area()
        .is_some_and(|r| le32(&raw.0[r], 0) == XATTR_MAGIC)
        || raw.file_acl() != 0
}

/// Whether the inode may have `security.capability`: not when it has no attributes, or a
/// look found none since (the cached knowledge a write checks before any lock or I/O).
pub(crate) fn may_have_cap(st: &InodeState) -> bool {
    !st.no_capability && has_xattrs(&st.raw)
}

fn is_acl(index: u8) -> bool {
    index == INDEX_POSIX_ACL_ACCESS || index == INDEX_POSIX_ACL_DEFAULT
}

/// Whether `user.` attributes may be read or changed on this inode: on regular files and
/// directories only, as the kernel's xattr_permission rules (elsewhere a read finds none and
/// a change is EPERM). Through FUSE the kernel's VFS applies this before asking us.
fn user_attrs_allowed(raw: &RawInode) -> bool {
    raw.is_dir() || raw.file_type() == crate::format::inode::S_IFREG
}

impl Fs {
    fn xattr_csum_seed(&self) -> Option<u32> {
        self.geo.metadata_csum.then_some(self.geo.csum_seed)
    }

    /// Reads and validates all attributes of inode `ino` (whose on-disk fields are `raw`).
    pub(crate) fn xattr_load(&self, ino: u32, raw: &RawInode) -> Result<Loaded> {
        let mut ibody = Vec::new();
        if let Some(r) = raw.xattr_area() {
            let area = &raw.0[r];
            if le32(area, 0) == XATTR_MAGIC {
                ibody = parse_entries(
                    area,
                    IBODY_HEADER_LEN,
                    IBODY_HEADER_LEN,
                    &format!("inode {ino}: in-inode attributes"),
                )
                .map_err(|e| self.fail(e, ino, 0, "xattr_ibody"))?;
            }
        }
        let blk = raw.file_acl();
        let mut block = Vec::new();
        if blk != 0 {
            block = self
                .xattr_read_block(ino, blk)
                .map_err(|e| self.fail(e, ino, blk, "xattr_block"))?;
        }
        for e in ibody.iter().chain(block.iter()) {
            self.ea_check_ref(ino, e)?;
        }
        Ok(Loaded { ibody, block, blk })
    }

    fn xattr_read_block(&self, ino: u32, blk: u64) -> Result<Vec<XattrEntry>> {
        let what = || format!("inode {ino}: xattr block");
        self.check_block(Corruption::Xattr, blk, 1, &what)?;
        let buf = self.bcache.get(blk)?;
        let data = buf.read();
        parse_block(&data, blk, self.xattr_csum_seed(), &format!("inode {ino}"))
    }

    /// The value of attribute `name` of inode `ino`. POSIX ACLs come back in the VFS form.
    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let (index, short) = split_name(name)?;
        let inode = self.iget(ino)?;
        let _io = inode.io_lock.read();
        let l = {
            let st = inode.state.lock();
            if st.deleted {
                return Err(Error::NotFound);
            }
            if index == INDEX_USER && !user_attrs_allowed(&st.raw) {
                return Err(Error::NoAttr);
            }
            self.xattr_load(ino, &st.raw)?
        };
        let e = l
            .ibody
            .into_iter()
            .chain(l.block)
            .find(|e| e.index == index && e.name == short)
            .ok_or(Error::NoAttr)?;
        let value = self.xattr_value(ino, &e)?;
        if is_acl(index) {
            let acl = acl_from_disk(&value).map_err(|why| {
                self.fail(
                    Error::corrupt(
                        Corruption::Xattr,
                        format!(
                            "inode {ino}: attribute {}: {why}",
                            String::from_utf8_lossy(name)
                        ),
                    ),
                    ino,
                    l.blk,
                    "getxattr",
                )
            })?;
            return Ok(acl_to_vfs(&acl));
        }
        Ok(value)
    }

    /// The full names (with prefixes) of inode `ino`'s attributes. Entries with an index this
    /// engine does not know are left out.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let inode = self.iget(ino)?;
        let _io = inode.io_lock.read();
        let l = {
            let st = inode.state.lock();
            if st.deleted {
                return Err(Error::NotFound);
            }
            self.xattr_load(ino, &st.raw)?
        };
        Ok(l.ibody
            .iter()
            .chain(l.block.iter())
            .filter_map(|e| join_name(e.index, &e.name))
            .collect())
    }

    /// Sets attribute `name` of inode `ino`, as root would: [`Fs::setxattr_as`] with
    /// [`Cred::root`].
    pub fn setxattr(&self, ino: u32, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.setxattr_as(&Cred::root(), ino, name, value, flags)
    }

    /// Sets attribute `name` of inode `ino` for `cred`. POSIX ACLs are given in the VFS form; an
    /// ACL with no entries removes the attribute. An access ACL also sets the permission bits
    /// it implies (owner, mask or owning group, other), one that says no more than those bits
    /// is not stored (an existing one is removed), and set-group-ID goes when the caller is
    /// neither privileged nor in the file's group: the kernel's posix_acl_update_mode, in the
    /// attribute's handle.
    pub fn setxattr_as(
        &self,
        cred: &Cred,
        ino: u32,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        let (index, short) = split_name(name)?;
        if !is_acl(index) {
            if value.len() > VALUE_MAX {
                return Err(Error::NoSpace);
            }
            return self.xattr_change(ino, index, short, Some(value.to_vec()), flags, None);
        }
        let acl = match acl_from_vfs(value)? {
            Some(acl) => acl,
            None => {
                // Setting an empty ACL removes it; absence is not an error then.
                return match self.xattr_change(ino, index, short, None, flags, None) {
                    Err(Error::NoAttr) if flags != XattrFlags::Replace => Ok(()),
                    r => r,
                };
            }
        };
        if index == INDEX_POSIX_ACL_DEFAULT {
            return self.xattr_change(ino, index, short, Some(acl_to_disk(&acl)), flags, None);
        }
        let bits = crate::acl::mode_bits(&acl);
        let value = (!crate::acl::is_equivalent_to_mode(&acl)).then(|| acl_to_disk(&acl));
        let flags = if value.is_none() {
            XattrFlags::Any
        } else {
            flags
        };
        let mode = |raw: &RawInode| {
            let mut m = raw.mode() & !0o777 | bits;
            if !cred.in_group_or_privileged(raw.gid()) {
                m &= !S_ISGID;
            }
            m
        };
        self.xattr_change(ino, index, short, value, flags, Some(&mode))
    }

    /// Takes away from `inode` (not a directory) the set-ID bits `clear` returns for its
    /// on-disk fields, and `security.capability`, in one handle; nothing (no handle) when there
    /// is neither. Whether the mode changed.
    pub(crate) fn remove_privs_of(
        &self,
        inode: &Inode,
        clear: &dyn Fn(&RawInode) -> u16,
    ) -> Result<bool> {
        {
            let st = inode.state.lock();
            if st.raw.is_dir() || (st.raw.mode() & clear(&st.raw) == 0 && !may_have_cap(&st)) {
                return Ok(false);
            }
        }
        self.check_writable()?;
        let _io = inode.io_lock.write();
        let mut h = self.start(crate::transaction::credits::XATTR)?;
        let mut st = inode.state.lock();
        if st.deleted || st.raw.is_dir() {
            return Ok(false);
        }
        let dropped = self.drop_capability_in(&mut h, inode.ino, &mut st)?;
        let mode = st.raw.mode();
        let new = mode & !clear(&st.raw);
        if new != mode {
            st.raw.set_mode(new);
        }
        if new != mode || dropped {
            st.raw.set_ctime(self.now());
            self.mark_inode_dirty(&mut h, inode, &mut st)?;
        }
        Ok(new != mode)
    }

    /// Removes `security.capability` from the inode in handle `h`, if it has one (the inode's
    /// state held). Whether it had one. Afterwards the inode is known to have none, so later
    /// writes skip the look.
    pub(crate) fn drop_capability_in(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
    ) -> Result<bool> {
        if !may_have_cap(st) {
            return Ok(false);
        }
        let is_cap = |e: &XattrEntry| e.index == INDEX_SECURITY && e.name == CAPABILITY;
        let l = self.xattr_load(ino, &st.raw)?;
        if !l.ibody.iter().chain(l.block.iter()).any(is_cap) {
            st.no_capability = true;
            return Ok(false);
        }
        let old_block = l.block.clone();
        let all: Vec<XattrEntry> = l
            .ibody
            .into_iter()
            .chain(l.block)
            .filter(|e| !is_cap(e))
            .collect();
        self.xattr_store(h, ino, st, all, l.blk, &old_block)?;
        st.no_capability = true;
        Ok(true)
    }

    /// The ACL of kind `index` (access or default) of the inode, if it has one (its state
    /// held). No I/O for an inode without attributes.
    pub(crate) fn acl_in(
        &self,
        ino: u32,
        st: &InodeState,
        index: u8,
    ) -> Result<Option<Vec<AclEntry>>> {
        if !has_xattrs(&st.raw) {
            return Ok(None);
        }
        let l = self.xattr_load(ino, &st.raw)?;
        let Some(e) = l
            .ibody
            .iter()
            .chain(l.block.iter())
            .find(|e| e.index == index && e.name.is_empty())
        else {
            return Ok(None);
        };
        let value = self.xattr_value(ino, e)?;
        acl_from_disk(&value).map(Some).map_err(|why| {
            self.fail(
                Error::corrupt(Corruption::Xattr, format!("inode {ino}: POSIX ACL: {why}")),
                ino,
                l.blk,
                "acl",
            )
        })
    }

    /// Adds (or replaces) attributes of the inode in handle `h` (its state held): a new
    /// inode's inherited ACLs, a chmod's updated access ACL.
    pub(crate) fn xattr_put_in(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        entries: Vec<XattrEntry>,
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let l = self.xattr_load(ino, &st.raw)?;
        let old_block = l.block.clone();
        let mut all: Vec<XattrEntry> = l
            .ibody
            .into_iter()
            .chain(l.block)
            .filter(|e| {
                !entries
                    .iter()
                    .any(|n| n.index == e.index && n.name == e.name)
            })
            .collect();
        all.extend(entries);
        self.xattr_store(h, ino, st, all, l.blk, &old_block)?;
        self.ext_attr_feature_on(h)
    }

    /// As the kernel does: the first attribute turns on the ext_attr feature.
    fn ext_attr_feature_on(&self, h: &mut Handle<'_>) -> Result<()> {
        let missing = {
            let mut sb = self.sb.lock();
            let missing = !sb.has_compat(COMPAT_EXT_ATTR);
            if missing {
                let f = sb.feature_compat() | COMPAT_EXT_ATTR;
                sb.set_feature_compat(f);
            }
            missing
        };
        if missing {
            self.write_superblock_to_buffer(h)?;
        }
        Ok(())
    }

    /// Removes attribute `name` of inode `ino` (`Error::NoAttr` if absent).
    pub fn removexattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        let (index, short) = split_name(name)?;
        // Removing an ACL is setting none, which succeeds whether there was one (the
        // kernel's ext4_set_acl with no ACL); any other absent name is ENODATA.
        let flags = if is_acl(index) {
            XattrFlags::Any
        } else {
            XattrFlags::Replace
        };
        self.xattr_change(ino, index, short, None, flags, None)
    }

    /// Sets (`value` Some) or removes (None) one attribute. Removing with `XattrFlags::Any`
    /// tolerates absence. `mode` gives the inode's new mode (from its on-disk fields).
    fn xattr_change(
        &self,
        ino: u32,
        index: u8,
        name: &[u8],
        value: Option<Vec<u8>>,
        flags: XattrFlags,
        mode: Option<&dyn Fn(&RawInode) -> u16>,
    ) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        let inode = self.iget(ino)?;
        let _io = inode.io_lock.write();
        let ea_inodes = self.ea_inode_enabled();
        let credits = crate::transaction::credits::XATTR + if ea_inodes { 16 } else { 0 };
        let mut h = self.start(credits)?;
        let mut st = inode.state.lock();
        if st.deleted {
            return Err(Error::NotFound);
        }
        crate::flags::may_change(&st.raw)?;
        if index == INDEX_USER && !user_attrs_allowed(&st.raw) {
            return Err(Error::Perm);
        }
        if index == INDEX_POSIX_ACL_DEFAULT && value.is_some() && !st.raw.is_dir() {
            return Err(Error::Invalid(
                "a default ACL can only be set on a directory".into(),
            ));
        }
        let l = self.xattr_load(ino, &st.raw)?;
        let exists = l
            .ibody
            .iter()
            .chain(l.block.iter())
            .any(|e| e.index == index && e.name == name);
        match (exists, value.is_some(), flags) {
            (true, true, XattrFlags::Create) => return Err(Error::Exists),
            (false, _, XattrFlags::Replace) => return Err(Error::NoAttr),
            _ => {}
        }
        let old_block = l.block.clone();
        let mut all: Vec<XattrEntry> = l.ibody.into_iter().chain(l.block).collect();
        let pos = all.iter().position(|e| e.index == index && e.name == name);
        if let Some(p) = pos {
            all.remove(p);
        }
        let value_added = value.is_some();
        let changed = pos.is_some() || value_added;
        let mut new_ea = None;
        let _ea = self.ea_guard();
        if let Some(value) = value {
            let mut e = XattrEntry {
                index,
                name: name.to_vec(),
                value,
                ea: None,
            };
            if ea_inodes && self.wants_ea_inode(&st.raw, &all, &e) {
                e = self.ea_entry_new(&mut h, ino, &st.raw, index, name, &e.value)?;
                new_ea = e.ea.map(|r| r.inum);
            }
            all.push(e);
        }
        if changed {
            if let Err(e) = self.xattr_store(&mut h, ino, &mut st, all, l.blk, &old_block) {
                if let Some(inum) = new_ea {
                    // A new EA inode nothing came to name goes again.
                    let _ = self.ea_refs_apply(&mut h, ino, &BTreeMap::from([(inum, 0)]));
                }
                return Err(e);
            }
        }
        if value_added {
            self.ext_attr_feature_on(&mut h)?;
            if index == INDEX_SECURITY && name == CAPABILITY {
                st.no_capability = false;
            }
        }
        if let Some(mode) = mode {
            let m = mode(&st.raw);
            st.raw.set_mode(m);
        }
        st.raw.set_ctime(self.now());
        self.mark_inode_dirty(&mut h, &inode, &mut st)
    }

    /// Whether new entry `e` goes to an EA inode, as the kernel decides: a value too large for
    /// a block at once, else one that does not fit beside the others (`rest`).
    fn wants_ea_inode(&self, raw: &RawInode, rest: &[XattrEntry], e: &XattrEntry) -> bool {
        if e.value.is_empty() {
            return false;
        }
        if e.value_len() > crate::xattr_inode::min_large_value(self.geo.block_size as usize) {
            return true;
        }
        let mut all = rest.to_vec();
        all.push(e.clone());
        self.xattr_layout(raw, all).is_err()
    }

    /// Splits `all` between the inode area and the block: the smallest first into the inode
    /// while they fit, the rest into the block; each part sorted as it is stored. NoSpace when
    /// the rest does not fit a block.
    fn xattr_layout(
        &self,
        raw: &RawInode,
        all: Vec<XattrEntry>,
    ) -> Result<(Vec<XattrEntry>, Vec<XattrEntry>)> {
        let bs = self.geo.block_size as usize;
        // Room for entries and values after the magic, less the list terminator.
        let ibody_room = raw
            .xattr_area()
            .map(|r| r.len().saturating_sub(IBODY_HEADER_LEN + 4))
            .unwrap_or(0);
        let block_room = bs - BLOCK_HEADER_LEN - 4;
        // An inline inode's "system.data" stays in the inode whatever else moves (the kernel
        // reads it nowhere else): it takes its room first.
        let (pinned, mut all): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|e| e.index == INDEX_SYSTEM && e.name == b"data");
        let mut used: usize = pinned.iter().map(|e| e.cost()).sum();
        if used > ibody_room {
            return Err(Error::NoSpace);
        }
        all.sort_by(|a, b| {
            a.cost()
                .cmp(&b.cost())
                .then(a.sort_key().cmp(&b.sort_key()))
        });
        let split = all
            .iter()
            .position(|e| {
                used += e.cost();
                used > ibody_room
            })
            .unwrap_or(all.len());
        let mut in_block = all.split_off(split);
        let mut in_inode = pinned;
        in_inode.extend(all);
        if in_block.iter().map(|e| e.cost()).sum::<usize>() > block_room {
            return Err(Error::NoSpace);
        }
        in_inode.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        in_block.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        Ok((in_inode, in_block))
    }

    /// Lays `all` out over the inode area and the block. `old_blk`/`old_block` are the block
    /// and its entries as read. Checks that everything fits before changing anything. EA
    /// inodes gain and lose references as their entries come and go (each in-inode entry is
    /// one, each block one for all its entries), and the inode's i_blocks follows the values
    /// it names (xattr_inode.rs).
    pub(crate) fn xattr_store(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        all: Vec<XattrEntry>,
        old_blk: u64,
        old_block: &[XattrEntry],
    ) -> Result<()> {
        // The in-inode area and xattr blocks are in no fast-commit record (the kernel's
        // EXT4_FC_REASON_XATTR).
        h.fc_ineligible("an extended attribute change");
        let _ea = self.ea_guard();
        let (in_inode, in_block) = self.xattr_layout(&st.raw, all)?;
        let old_ibody = self.xattr_load_ibody(ino, &st.raw)?;
        let mut refs = BTreeMap::new();
        count_refs(&mut refs, &old_ibody, -1);
        count_refs(&mut refs, &in_inode, 1);
        let charge_before = self.ea_charge(&old_ibody) + self.ea_charge(old_block);
        let charge_after = self.ea_charge(&in_inode) + self.ea_charge(&in_block);

        // The block first: allocation may fail, and then nothing has changed yet.
        if in_block.is_empty() {
            if old_blk != 0 {
                self.xattr_release_block(h, ino, st, old_blk, old_block, &mut refs)?;
            }
        } else if old_blk == 0 || in_block.as_slice() != old_block {
            self.xattr_write_block(h, ino, st, (old_blk, old_block), &in_block, &mut refs)?;
        }

        if let Some(r) = st.raw.xattr_area() {
            let area = &mut st.raw.0[r];
            if in_inode.is_empty() {
                area.fill(0);
            } else {
                write_ibody(area, &in_inode);
            }
        }
        if charge_after != charge_before {
            let v = st.raw.blocks_512(self.geo.block_size) + charge_after;
            st.raw.set_blocks_512(v.saturating_sub(charge_before));
        }
        self.ea_refs_apply(h, ino, &refs)
    }

    /// The in-inode attributes alone, as stored now.
    pub(crate) fn xattr_load_ibody(&self, ino: u32, raw: &RawInode) -> Result<Vec<XattrEntry>> {
        match raw.xattr_area() {
            Some(r) if le32(&raw.0[r.clone()], 0) == XATTR_MAGIC => parse_entries(
                &raw.0[r],
                IBODY_HEADER_LEN,
                IBODY_HEADER_LEN,
                &format!("inode {ino}: in-inode attributes"),
            )
            .map_err(|e| self.fail(e, ino, 0, "xattr_ibody")),
            _ => Ok(Vec::new()),
        }
    }

    /// Writes `entries` as this inode's block: in place when the inode is the block's only
    /// user, else into a newly allocated block (the old one, `old` as block number and
    /// entries, loses this inode's reference). The block's EA inode references move with it
    /// into `refs`.
    fn xattr_write_block(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        old: (u64, &[XattrEntry]),
        entries: &[XattrEntry],
        refs: &mut BTreeMap<u32, i64>,
    ) -> Result<()> {
        let bs = self.geo.block_size as usize;
        let (old_blk, old_entries) = old;
        if old_blk != 0 {
            let buf = self.bcache.get(old_blk)?;
            let mut d = buf.write();
            if le32(&d, H_REFCOUNT) <= 1 {
                // Ours alone (nobody can add a reference but the kernel's mbcache, which is not
                // running while we are mounted).
                d.copy_from_slice(&build_block(bs, entries, old_blk, self.xattr_csum_seed()));
                drop(d);
                h.dirty(&buf);
                count_refs(refs, old_entries, -1);
                count_refs(refs, entries, 1);
                return Ok(());
            }
        }
        let goal = self.balloc.groups[self.geo.ino_group(ino) as usize]
            .lock()
            .desc
            .inode_table();
        let (blk, _) = self.alloc_blocks(h, goal, 1, None)?;
        let buf = self.bcache.get_new(blk)?;
        buf.write()
            .copy_from_slice(&build_block(bs, entries, blk, self.xattr_csum_seed()));
        h.dirty(&buf);
        count_refs(refs, entries, 1);
        if old_blk != 0 {
            // i_blocks is unchanged: one block out, one in.
            if self.xattr_drop_ref(h, ino, old_blk)? {
                count_refs(refs, old_entries, -1);
            }
        } else {
            // With bigalloc an xattr block takes (and counts) a cluster.
            let v = st.raw.blocks_512(self.geo.block_size) + self.cluster_sectors();
            st.raw.set_blocks_512(v);
        }
        st.raw.set_file_acl(blk);
        Ok(())
    }

    /// Drops one reference to xattr block `blk`: decrements its refcount, or frees it when this
    /// was the last (true then: the block's EA inode references go with it). The
    /// read-modify-write happens under the buffer's lock, so two inodes sharing the block
    /// cannot lose an update.
    fn xattr_drop_ref(&self, h: &mut Handle<'_>, ino: u32, blk: u64) -> Result<bool> {
        let buf = self.bcache.get(blk)?;
        let mut d = buf.write();
        if le32(&d, H_MAGIC) != XATTR_MAGIC {
            drop(d);
            return Err(self.fail(
                Error::corrupt(
                    Corruption::Xattr,
                    format!("inode {ino}: xattr block {blk} has bad magic"),
                ),
                ino,
                blk,
                "xattr_drop_ref",
            ));
        }
        let refs = le32(&d, H_REFCOUNT);
        if refs > 1 {
            put32(&mut d, H_REFCOUNT, refs - 1);
            if let Some(seed) = self.xattr_csum_seed() {
                let c = block_csum(seed, blk, &d);
                put32(&mut d, H_CHECKSUM, c);
            }
            drop(d);
            h.dirty(&buf);
            Ok(false)
        } else {
            drop(d);
            drop(buf);
            self.free_blocks(h, blk, 1, true)?;
            Ok(true)
        }
    }

    /// Releases the inode's block reference (`entries` as read) and clears i_file_acl, fixing
    /// i_blocks.
    fn xattr_release_block(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        blk: u64,
        entries: &[XattrEntry],
        refs: &mut BTreeMap<u32, i64>,
    ) -> Result<()> {
        if self.xattr_drop_ref(h, ino, blk)? {
            count_refs(refs, entries, -1);
        }
        let v = st
            .raw
            .blocks_512(self.geo.block_size)
            .saturating_sub(self.cluster_sectors());
        st.raw.set_blocks_512(v);
        st.raw.set_file_acl(0);
        Ok(())
    }

    /// When an inode is deleted: drops its xattr block reference (decrementing the refcount or
    /// freeing the block) and fixes i_blocks; the EA inodes its entries name lose those
    /// references (freed at zero). The in-inode area goes with the inode.
    pub(crate) fn xattr_free_all(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
    ) -> Result<()> {
        let blk = st.raw.file_acl();
        let ea_inodes = self.ea_inode_enabled();
        if blk == 0 && !(ea_inodes && has_xattrs(&st.raw)) {
            return Ok(());
        }
        h.fc_ineligible("an extended attribute change");
        let mut refs = BTreeMap::new();
        let mut block = Vec::new();
        let _ea = self.ea_guard();
        if ea_inodes {
            let l = self
                .xattr_load(ino, &st.raw)
                .map_err(|e| self.fail(e, ino, blk, "xattr_free_all"))?;
            count_refs(&mut refs, &l.ibody, -1);
            block = l.block;
        } else if blk != 0 {
            self.check_block(Corruption::Xattr, blk, 1, &|| {
                format!("inode {ino}: xattr block")
            })
            .map_err(|e| self.fail(e, ino, blk, "xattr_free_all"))?;
        }
        if blk != 0 {
            self.xattr_release_block(h, ino, st, blk, &block, &mut refs)?;
        }
        self.ea_refs_apply(h, ino, &refs)
    }
}
