//! Extended attributes (Documentation/filesystems/ext4/attributes.rst): in the inode after
//! i_extra_isize, and in one external block (shared between inodes through its refcount).
//!
//! Every change rebuilds the inode's attribute set: entries sorted as the kernel sorts block
//! entries, values packed from the end, small attributes in the inode while they fit and the rest
//! in the block (copied first if another inode shares it). POSIX ACLs are stored in ext4's
//! compact format and exchanged with callers in the VFS `posix_acl_xattr` format.

use crate::error::{Error, Result};
use crate::format::csum::crc32c;
use crate::format::inode::RawInode;
use crate::format::{le16, le32, put16, put32};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::transaction::Handle;

pub const XATTR_MAGIC: u32 = 0xEA02_0000;
const BLOCK_HEADER: usize = 32;
const ENTRY_HEADER: usize = 16;

/// How setxattr treats an existing attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrFlags {
    Any,
    Create,
    Replace,
}

/// Name prefixes by e_name_index. Indexes 2 and 3 are whole names (the POSIX ACLs).
const PREFIXES: &[(u8, &str)] = &[
    (2, "system.posix_acl_access"),
    (3, "system.posix_acl_default"),
    (8, "system.richacl"),
    (1, "user."),
    (4, "trusted."),
    (6, "security."),
    (7, "system."),
];

fn split_name(name: &[u8]) -> Result<(u8, Vec<u8>)> {
    let s = std::str::from_utf8(name)
        .map_err(|_| Error::NotSupported("attribute name is not UTF-8".into()))?;
    for &(idx, p) in PREFIXES {
        if idx == 2 || idx == 3 || idx == 8 {
            if s == p {
                return Ok((idx, Vec::new()));
            }
        } else if let Some(rest) = s.strip_prefix(p) {
            if rest.is_empty() {
                return Err(Error::Invalid(format!(
                    "attribute name {s:?} has an empty suffix"
                )));
            }
            if rest.len() > 255 {
                return Err(Error::NameTooLong);
            }
            return Ok((idx, rest.as_bytes().to_vec()));
        }
    }
    Err(Error::NotSupported(format!("attribute namespace of {s:?}")))
}

fn full_name(idx: u8, name: &[u8]) -> Option<Vec<u8>> {
    let (_, p) = PREFIXES.iter().find(|(i, _)| *i == idx)?;
    let mut v = p.as_bytes().to_vec();
    v.extend_from_slice(name);
    Some(v)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Attr {
    index: u8,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Attr {
    fn entry_size(&self) -> usize {
        (ENTRY_HEADER + self.name.len() + 3) & !3
    }
    fn value_size(&self) -> usize {
        (self.value.len() + 3) & !3
    }
    fn cost(&self) -> usize {
        self.entry_size() + self.value_size()
    }
}

fn entry_hash(a: &Attr) -> u32 {
    let mut h: u32 = 0;
    for &c in &a.name {
        h = (h << 5) ^ (h >> 27) ^ c as u32;
    }
    let mut v = a.value.clone();
    v.resize(a.value_size(), 0);
    for w in v.chunks(4) {
        h = (h << 16) ^ (h >> 16) ^ le32(w, 0);
    }
    h
}

/// Parses entries starting at `first` in `area`; value offsets are relative to `base`.
fn parse_entries(
    area: &[u8],
    first: usize,
    base: usize,
    what: &dyn Fn() -> String,
) -> Result<Vec<Attr>> {
    let mut out = Vec::new();
    let mut off = first;
    loop {
        if off + 4 > area.len() {
            return Err(Error::corrupt(format!(
                "{}: attribute list runs past the end",
                what()
            )));
        }
        if le32(area, off) == 0 {
            break;
        }
        if off + ENTRY_HEADER > area.len() {
            return Err(Error::corrupt(format!(
                "{}: attribute entry at {off} overruns",
                what()
            )));
        }
        let name_len = area[off] as usize;
        let index = area[off + 1];
        let value_offs = le16(area, off + 2) as usize;
        let value_inum = le32(area, off + 4);
        let value_size = le32(area, off + 8) as usize;
        if value_inum != 0 {
            return Err(Error::Unsupported(format!(
                "{}: attribute values in inodes (ea_inode)",
                what()
            )));
        }
        let name_end = off + ENTRY_HEADER + name_len;
        if name_end > area.len() {
            return Err(Error::corrupt(format!(
                "{}: attribute name at {off} overruns",
                what()
            )));
        }
        let vstart = base + value_offs;
        if vstart
            .checked_add(value_size)
            .is_none_or(|e| e > area.len())
        {
            return Err(Error::corrupt(format!(
                "{}: attribute value at {vstart} (+{value_size}) overruns",
                what()
            )));
        }
        out.push(Attr {
            index,
            name: area[off + ENTRY_HEADER..name_end].to_vec(),
            value: area[vstart..vstart + value_size].to_vec(),
        });
        off += (ENTRY_HEADER + name_len + 3) & !3;
        if out.len() > 4096 {
            return Err(Error::corrupt(format!(
                "{}: too many attribute entries",
                what()
            )));
        }
    }
    Ok(out)
}

/// Writes `attrs` into `area` (entries from `first`, values packed at the end, offsets relative
/// to `base`). The caller checked they fit.
fn write_entries(area: &mut [u8], first: usize, base: usize, attrs: &[Attr]) {
    area[first..].fill(0);
    let mut off = first;
    let mut vend = area.len();
    for a in attrs {
        vend -= a.value_size();
        area[vend..vend + a.value.len()].copy_from_slice(&a.value);
        area[off] = a.name.len() as u8;
        area[off + 1] = a.index;
        put16(
            area,
            off + 2,
            if a.value.is_empty() {
                0
            } else {
                (vend - base) as u16
            },
        );
        put32(area, off + 4, 0);
        put32(area, off + 8, a.value.len() as u32);
        put32(area, off + 12, entry_hash(a));
        area[off + ENTRY_HEADER..off + ENTRY_HEADER + a.name.len()].copy_from_slice(&a.name);
        off += a.entry_size();
    }
}

fn sort_attrs(v: &mut [Attr]) {
    v.sort_by(|a, b| (a.index, a.name.len(), &a.name).cmp(&(b.index, b.name.len(), &b.name)));
}

// ---- POSIX ACL formats ----

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// VFS format (version 2, 8-byte entries) to ext4's (version 1, 4- or 8-byte entries).
fn acl_to_disk(v: &[u8]) -> Result<Vec<u8>> {
    if v.len() < 4 || (v.len() - 4) % 8 != 0 || le32(v, 0) != 2 {
        return Err(Error::Invalid("malformed POSIX ACL".into()));
    }
    let mut out = 1u32.to_le_bytes().to_vec();
    for e in v[4..].chunks(8) {
        let tag = le16(e, 0);
        let perm = le16(e, 2);
        if perm & !7 != 0 {
            return Err(Error::Invalid(
                "POSIX ACL permission bits out of range".into(),
            ));
        }
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        match tag {
            ACL_USER | ACL_GROUP => out.extend_from_slice(&e[4..8]),
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {}
            _ => return Err(Error::Invalid(format!("unknown POSIX ACL tag {tag:#x}"))),
        }
    }
    Ok(out)
}

fn acl_from_disk(v: &[u8], ino: u32) -> Result<Vec<u8>> {
    let bad = || Error::corrupt(format!("inode {ino}: malformed POSIX ACL attribute"));
    if v.len() < 4 || le32(v, 0) != 1 {
        return Err(bad());
    }
    let mut out = 2u32.to_le_bytes().to_vec();
    let mut off = 4;
    while off < v.len() {
        if off + 4 > v.len() {
            return Err(bad());
        }
        let tag = le16(v, off);
        let perm = le16(v, off + 2);
        let id = match tag {
            ACL_USER | ACL_GROUP => {
                if off + 8 > v.len() {
                    return Err(bad());
                }
                let id = le32(v, off + 4);
                off += 8;
                id
            }
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {
                off += 4;
                u32::MAX
            }
            _ => return Err(bad()),
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    Ok(out)
}

impl Fs {
    fn inode_xattr_area(raw: &RawInode) -> Option<std::ops::Range<usize>> {
        raw.xattr_area()
    }

    /// Reads all attributes of an inode: (in-inode, in-block).
    fn read_xattrs(&self, ino: u32, raw: &RawInode) -> Result<(Vec<Attr>, Vec<Attr>)> {
        let mut inode_attrs = Vec::new();
        if let Some(r) = Self::inode_xattr_area(raw) {
            let area = &raw.0[r];
            if le32(area, 0) == XATTR_MAGIC {
                inode_attrs = parse_entries(area, 4, 4, &|| format!("inode {ino}"))
                    .map_err(|e| self.fail(e, ino, 0, "xattr"))?;
            }
        }
        let mut block_attrs = Vec::new();
        let blk = raw.file_acl();
        if blk != 0 {
            self.check_block(blk, 1, &|| format!("inode {ino}: xattr block"))
                .map_err(|e| self.fail(e, ino, blk, "xattr"))?;
            let data = self.bcache.get(blk)?.read().to_vec();
            if le32(&data, 0) != XATTR_MAGIC || le32(&data, 8) != 1 {
                return Err(self.fail(
                    Error::corrupt(format!("inode {ino}: xattr block {blk}: bad header")),
                    ino,
                    blk,
                    "xattr",
                ));
            }
            if self.geo.metadata_csum && le32(&data, 0x10) != self.xattr_block_csum(blk, &data) {
                return Err(self.fail(
                    Error::BadChecksum(format!("inode {ino}: xattr block {blk}")),
                    ino,
                    blk,
                    "xattr",
                ));
            }
            block_attrs = parse_entries(&data, BLOCK_HEADER, 0, &|| {
                format!("inode {ino}: xattr block {blk}")
            })
            .map_err(|e| self.fail(e, ino, blk, "xattr"))?;
        }
        Ok((inode_attrs, block_attrs))
    }

    fn xattr_block_csum(&self, blk: u64, data: &[u8]) -> u32 {
        let mut d = data.to_vec();
        put32(&mut d, 0x10, 0);
        let c = crc32c(self.geo.csum_seed, &blk.to_le_bytes());
        crc32c(c, &d)
    }

    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let (index, short) = split_name(name)?;
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.read();
        let st = inode.state.lock();
        let (a, b) = self.read_xattrs(ino, &st.raw)?;
        let found = a
            .into_iter()
            .chain(b)
            .find(|x| x.index == index && x.name == short)
            .ok_or(Error::NoAttr)?;
        if index == 2 || index == 3 {
            return acl_from_disk(&found.value, ino);
        }
        Ok(found.value)
    }

    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.read();
        let st = inode.state.lock();
        let (a, b) = self.read_xattrs(ino, &st.raw)?;
        Ok(a.into_iter()
            .chain(b)
            .filter_map(|x| full_name(x.index, &x.name))
            .collect())
    }

    pub fn setxattr(&self, ino: u32, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        let (index, short) = split_name(name)?;
        let value = if index == 2 || index == 3 {
            acl_to_disk(value)?
        } else {
            value.to_vec()
        };
        self.change_xattr(ino, index, short, Some(value), flags)
    }

    pub fn removexattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        let (index, short) = split_name(name)?;
        self.change_xattr(ino, index, short, None, XattrFlags::Replace)
    }

    fn change_xattr(
        &self,
        ino: u32,
        index: u8,
        name: Vec<u8>,
        value: Option<Vec<u8>>,
        flags: XattrFlags,
    ) -> Result<()> {
        self.stats
            .ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.check_writable()?;
        let inode = self.iget(ino)?;
        let _g = inode.io_lock.write();
        let mut h = self.start(8)?;
        let mut st = inode.state.lock();
        if st.deleted {
            return Err(Error::NotFound);
        }
        let (a, b) = self.read_xattrs(ino, &st.raw)?;
        let mut all: Vec<Attr> = a.into_iter().chain(b).collect();
        let pos = all.iter().position(|x| x.index == index && x.name == name);
        match (pos, &value, flags) {
            (Some(_), Some(_), XattrFlags::Create) => return Err(Error::Exists),
            (None, _, XattrFlags::Replace) => return Err(Error::NoAttr),
            _ => {}
        }
        if let Some(p) = pos {
            all.remove(p);
        }
        if let Some(v) = value {
            all.push(Attr {
                index,
                name,
                value: v,
            });
        }
        self.store_xattrs(&mut h, ino, &mut st, all)?;
        st.raw.set_ctime(crate::format::inode::Timestamp::now());
        self.mark_inode_dirty(&mut h, &inode, &mut st)
    }

    /// Lays `attrs` out over the inode area and the block, allocating, copying or freeing the
    /// block as needed.
    fn store_xattrs(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        mut attrs: Vec<Attr>,
    ) -> Result<()> {
        let bs = self.geo.block_size as usize;
        let inode_room = Self::inode_xattr_area(&st.raw)
            .map(|r| r.len().saturating_sub(4 + 4))
            .unwrap_or(0);
        let block_room = bs - BLOCK_HEADER - 4;
        // Smallest first into the inode.
        attrs.sort_by_key(|a| a.cost());
        let mut in_inode = Vec::new();
        let mut in_block = Vec::new();
        let mut used = 0;
        for a in attrs {
            if used + a.cost() <= inode_room && in_block.is_empty() {
                used += a.cost();
                in_inode.push(a);
            } else {
                in_block.push(a);
            }
        }
        if in_block.iter().map(|a| a.cost()).sum::<usize>() > block_room {
            return Err(Error::NoSpace);
        }
        sort_attrs(&mut in_inode);
        sort_attrs(&mut in_block);
        // The inode area.
        if let Some(r) = Self::inode_xattr_area(&st.raw) {
            let area = &mut st.raw.0[r];
            if in_inode.is_empty() {
                area.fill(0);
            } else {
                put32(area, 0, XATTR_MAGIC);
                write_entries(area, 4, 4, &in_inode);
            }
        }
        // The block.
        let old = st.raw.file_acl();
        let old_refs = if old != 0 {
            le32(&self.bcache.get(old)?.read(), 4)
        } else {
            0
        };
        if in_block.is_empty() {
            if old != 0 {
                self.drop_xattr_block(h, st, old, old_refs)?;
                st.raw.set_file_acl(0);
            }
            return Ok(());
        }
        let blk = if old != 0 && old_refs <= 1 {
            old
        } else {
            if old != 0 {
                self.drop_xattr_block(h, st, old, old_refs)?;
            }
            let goal = self.groups[self.geo.ino_group(ino) as usize]
                .lock()
                .desc
                .inode_table();
            let (b, _) = self.alloc_blocks(h, goal, 1)?;
            let v = st.raw.blocks_512(self.geo.block_size) + self.geo.block_size as u64 / 512;
            st.raw.set_blocks_512(v);
            st.raw.set_file_acl(b);
            self.bcache.get_new(b)?;
            b
        };
        let mut data = vec![0u8; bs];
        put32(&mut data, 0, XATTR_MAGIC);
        put32(&mut data, 4, 1);
        put32(&mut data, 8, 1);
        write_entries(&mut data, BLOCK_HEADER, 0, &in_block);
        let mut bh: u32 = 0;
        for a in &in_block {
            bh = (bh << 16) ^ (bh >> 16) ^ entry_hash(a);
        }
        put32(&mut data, 12, bh);
        if self.geo.metadata_csum {
            let c = self.xattr_block_csum(blk, &data);
            put32(&mut data, 0x10, c);
        }
        let buf = self.bcache.get(blk)?;
        buf.write().copy_from_slice(&data);
        h.dirty(&buf);
        Ok(())
    }

    /// Drops this inode's reference to an xattr block: frees it or decrements its refcount.
    fn drop_xattr_block(
        &self,
        h: &mut Handle<'_>,
        st: &mut InodeState,
        blk: u64,
        refs: u32,
    ) -> Result<()> {
        if refs > 1 {
            let buf = self.bcache.get(blk)?;
            {
                let mut d = buf.write();
                put32(&mut d, 4, refs - 1);
                if self.geo.metadata_csum {
                    let c = self.xattr_block_csum(blk, &d);
                    put32(&mut d, 0x10, c);
                }
            }
            h.dirty(&buf);
        } else {
            self.free_blocks(h, blk, 1, true)?;
        }
        let v = st
            .raw
            .blocks_512(self.geo.block_size)
            .saturating_sub(self.geo.block_size as u64 / 512);
        st.raw.set_blocks_512(v);
        Ok(())
    }

    /// When an inode is deleted: releases its xattr block.
    pub(crate) fn xattr_free_all(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
    ) -> Result<()> {
        let blk = st.raw.file_acl();
        if blk == 0 {
            return Ok(());
        }
        self.check_block(blk, 1, &|| format!("inode {ino}: xattr block"))?;
        let refs = le32(&self.bcache.get(blk)?.read(), 4);
        self.drop_xattr_block(h, st, blk, refs)?;
        st.raw.set_file_acl(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_roundtrip() {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (ACL_USER_OBJ, 6u16, u32::MAX),
            (ACL_USER, 4, 1000),
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_MASK, 6, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ] {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        let d = acl_to_disk(&v).unwrap();
        assert_eq!(d.len(), 4 + 4 + 8 + 4 + 4 + 4);
        assert_eq!(acl_from_disk(&d, 1).unwrap(), v);
        assert!(acl_to_disk(&[1, 2, 3]).is_err());
    }

    #[test]
    fn names_split_and_join() {
        assert_eq!(split_name(b"user.foo").unwrap(), (1, b"foo".to_vec()));
        assert_eq!(split_name(b"system.posix_acl_access").unwrap(), (2, vec![]));
        assert!(split_name(b"bogus.x").is_err());
        assert_eq!(
            full_name(6, b"selinux").unwrap(),
            b"security.selinux".to_vec()
        );
    }
}
