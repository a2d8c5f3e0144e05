//! Extended attributes on disk (Documentation/filesystems/ext4/attributes.rst). No I/O.
//!
//! Two places hold them:
//! - the inode body after `i_extra_isize`: a 4-byte magic, then entries; value offsets count
//!   from the first entry and values sit at the end of the inode;
//! - one external block: a 32-byte header (magic, refcount, blocks = 1, hash, checksum), then
//!   entries sorted by (index, name length, name); value offsets count from the block start and
//!   values sit at the end of the block.
//!
//! An entry is 16 bytes (name length, name index, value offset, value inode, value size, hash)
//! followed by the name, padded to 4 bytes; a list ends with 4 zero bytes. Values are padded to
//! 4 bytes too.
//!
//! POSIX ACLs are stored in ext4's compact form (version 1; 4-byte entries for the owner, owning
//! group, mask and other classes, 8-byte entries with an id for named users and groups) and
//! exchanged with callers in the VFS form (`posix_acl_xattr`, version 2, 8-byte entries).

use super::csum::crc32c;
use super::{le16, le32, put16, put32};
use crate::error::{Corruption, Error, Result};

/// `h_magic` of an xattr block, and the magic before in-inode xattrs.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Bytes of the in-inode header (the magic).
pub const IBODY_HEADER_LEN: usize = 4;
/// Bytes of the block header.
pub const BLOCK_HEADER_LEN: usize = 32;
/// Bytes of an entry before its name.
pub const ENTRY_LEN: usize = 16;
/// The longest full attribute name (prefix included), as the VFS allows.
pub const NAME_MAX: usize = 255;
/// The largest value the VFS passes (XATTR_SIZE_MAX).
pub const VALUE_MAX: usize = 65536;
/// The kernel stops sharing a block at this many references.
pub const REFCOUNT_MAX: u32 = 1024;

// Block header fields (struct ext4_xattr_header).
/// Byte offset of the xattr block header's magic field.
pub const H_MAGIC: usize = 0x0;
/// Byte offset of the xattr block header's refcount field.
pub const H_REFCOUNT: usize = 0x4;
/// Byte offset of the xattr block header's blocks field.
pub const H_BLOCKS: usize = 0x8;
/// Byte offset of the xattr block header's hash field.
pub const H_HASH: usize = 0xC;
/// Byte offset of the xattr block header's checksum field.
pub const H_CHECKSUM: usize = 0x10;

// Name indexes (e_name_index).
/// Xattr name index: the `user` prefix.
pub const INDEX_USER: u8 = 1;
/// Xattr name index: the `posix.acl.access` prefix.
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
/// Xattr name index: the `posix.acl.default` prefix.
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
/// Xattr name index: the `trusted` prefix.
pub const INDEX_TRUSTED: u8 = 4;
/// Xattr name index: the `security` prefix.
pub const INDEX_SECURITY: u8 = 6;
/// Xattr name index: the `system` prefix.
pub const INDEX_SYSTEM: u8 = 7;
/// Xattr name index: the `richacl` prefix.
pub const INDEX_RICHACL: u8 = 8;

/// Name prefixes by index, the namespaces the kernel's ext4 has handlers for. The ACL indexes
/// stand for a whole name (empty suffix). `INDEX_SYSTEM` ("system.data", where inline_data
/// keeps a file's bytes) and `INDEX_RICHACL` are not users' attributes: as in the kernel, they
/// are never listed, and any other "system." name is refused (EOPNOTSUPP). Entries with those
/// indexes are kept as they are when an inode's attributes are laid out again.
const PREFIXES: &[(u8, &str, bool)] = &[
    (INDEX_POSIX_ACL_ACCESS, "system.posix_acl_access", true),
    (INDEX_POSIX_ACL_DEFAULT, "system.posix_acl_default", true),
    (INDEX_USER, "user.", false),
    (INDEX_TRUSTED, "trusted.", false),
    (INDEX_SECURITY, "security.", false),
];

/// Splits a full name ("user.foo") into its index and the suffix stored on disk.
/// Errors: `NameTooLong` past 255 bytes, `NotSupported` for an unknown namespace, `Invalid` for
/// an empty suffix.
pub fn split_name(full: &[u8]) -> Result<(u8, &[u8])> {
    if full.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    for &(index, prefix, whole) in PREFIXES {
        let p = prefix.as_bytes();
        if whole {
            if full == p {
                return Ok((index, &full[full.len()..]));
            }
        } else if let Some(rest) = full.strip_prefix(p) {
            if rest.is_empty() {
                return Err(Error::Invalid(format!(
                    "attribute name {:?} has an empty suffix",
                    String::from_utf8_lossy(full)
                )));
            }
            return Ok((index, rest));
        }
    }
    Err(Error::NotSupported(format!(
        "attribute namespace of {:?}",
        String::from_utf8_lossy(full)
    )))
}

/// The full name of an entry, or None for an index this engine does not know.
pub fn join_name(index: u8, name: &[u8]) -> Option<Vec<u8>> {
    let &(_, prefix, whole) = PREFIXES.iter().find(|(i, _, _)| *i == index)?;
    let mut v = prefix.as_bytes().to_vec();
    if !whole {
        v.extend_from_slice(name);
    }
    Some(v)
}

/// Rounds up to a multiple of 4 (entries and values are 4-aligned).
#[inline]
pub fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// One attribute as stored: index, suffix, value (in the on-disk encoding).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XattrEntry {
    /// The name index (`INDEX_*`): the name's prefix.
    pub index: u8,
    /// The name after its prefix.
    pub name: Vec<u8>,
    /// The value, when it is kept in the list (empty when `ea` names an inode holding it).
    pub value: Vec<u8>,
    /// Where the value lives in an inode of its own (the ea_inode feature), else None.
    pub ea: Option<EaRef>,
}

/// An entry's reference to the inode holding its value (ea_inode): `e_value_inum`,
/// `e_value_size`, and `e_hash`, which for such an entry covers the name and the value's
/// crc32c (the EA inode's hash) rather than the value itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EaRef {
    /// The EA inode (`e_value_inum`).
    pub inum: u32,
    /// The value's length (`e_value_size`), which is the EA inode's size.
    pub size: u32,
    /// The entry hash (`e_hash`).
    pub hash: u32,
}

/// The kernel's value hash of an EA inode (ext4_xattr_inode_hash): crc32c of the value seeded
/// with the filesystem's checksum seed. It is kept in the EA inode's i_atime.
pub fn ea_value_hash(fs_seed: u32, value: &[u8]) -> u32 {
    crc32c(fs_seed, value)
}

/// The entry hash of an attribute whose value is in an EA inode with value hash `value_hash`:
/// the name, then the value hash as one little-endian word (ext4_xattr_set_entry).
pub fn ea_entry_hash(name: &[u8], value_hash: u32) -> u32 {
    XattrEntry {
        name: name.to_vec(),
        value: value_hash.to_le_bytes().to_vec(),
        ..Default::default()
    }
    .hash()
}

/// [`ea_entry_hash`] as kernels before 6.2 computed it where `char` is signed (name bytes
/// from 0x80 sign-extended), which the kernel and e2fsck still accept.
pub fn ea_entry_hash_signed(name: &[u8], value_hash: u32) -> u32 {
    let mut h: u32 = 0;
    for &c in name {
        h = h.rotate_left(5) ^ (c as i8 as i32 as u32);
    }
    h.rotate_left(16) ^ value_hash
}

impl XattrEntry {
    /// Bytes of the entry itself (header and padded name).
    pub fn entry_len(&self) -> usize {
        ENTRY_LEN + pad4(self.name.len())
    }
    /// Bytes of the padded value in the list (none for a value in an EA inode).
    pub fn value_len(&self) -> usize {
        pad4(self.value.len())
    }
    /// The value's length, wherever it is kept.
    pub fn value_size(&self) -> usize {
        match self.ea {
            Some(r) => r.size as usize,
            None => self.value.len(),
        }
    }
    /// Bytes the attribute takes in a list.
    pub fn cost(&self) -> usize {
        self.entry_len() + self.value_len()
    }
    /// The kernel's entry hash (ext4_xattr_hash_entry): name bytes rotated in by 5 bits, then
    /// the value's 32-bit little-endian words (zero padded) rotated in by 16.
    /// For a value in an EA inode, the stored `e_hash`.
    pub fn hash(&self) -> u32 {
        if let Some(r) = self.ea {
            return r.hash;
        }
        let mut h: u32 = 0;
        for &c in &self.name {
            h = h.rotate_left(5) ^ c as u32;
        }
        for w in self.value.chunks(4) {
            let mut word = [0u8; 4];
            word[..w.len()].copy_from_slice(w);
            h = h.rotate_left(16) ^ u32::from_le_bytes(word);
        }
        h
    }
    /// The order of entries in a block (the kernel's sorted lookup).
    pub fn sort_key(&self) -> (u8, usize, &[u8]) {
        (self.index, self.name.len(), &self.name)
    }
}

/// The kernel's block hash (ext4_xattr_rehash) over the entries' hashes, in list order.
pub fn block_hash(entries: &[XattrEntry]) -> u32 {
    let mut h: u32 = 0;
    for e in entries {
        let eh = e.hash();
        if eh == 0 {
            return 0;
        }
        h = h.rotate_left(16) ^ eh;
    }
    h
}

/// The block checksum: crc32c over the fs seed, the block number (le64) and the block with
/// h_checksum zeroed.
pub fn block_csum(fs_seed: u32, blk: u64, data: &[u8]) -> u32 {
    let mut c = crc32c(fs_seed, &blk.to_le_bytes());
    c = crc32c(c, &data[..H_CHECKSUM]);
    c = crc32c(c, &[0u8; 4]);
    crc32c(c, &data[H_CHECKSUM + 4..])
}

/// Parses an entry list starting at `first` in `area`; value offsets count from `base`.
/// Everything is bounds-checked as the kernel checks it (ext4_xattr_check_entries): entries
/// inside the area, values after the list's terminator and inside the area. A value held in an
/// inode (ea_inode) comes back as its reference (`XattrEntry::ea`) with an empty value: the
/// caller checks the reference. `what` names the place for error messages.
pub fn parse_entries(
    area: &[u8],
    first: usize,
    base: usize,
    what: &str,
) -> Result<Vec<XattrEntry>> {
    struct Raw {
        index: u8,
        name: std::ops::Range<usize>,
        offs: usize,
        size: usize,
        inum: u32,
        hash: u32,
    }
    let mut raws = Vec::new();
    let mut off = first;
    loop {
        if off.checked_add(4).is_none_or(|e| e > area.len()) {
            return Err(Error::corrupt(
                Corruption::Xattr,
                format!("{what}: attribute list has no terminator"),
            ));
        }
        if le32(area, off) == 0 {
            break;
        }
        if off + ENTRY_LEN > area.len() {
            return Err(Error::corrupt(
                Corruption::Xattr,
                format!("{what}: attribute entry at byte {off} overruns the area"),
            ));
        }
        let name_len = area[off] as usize;
        let index = area[off + 1];
        let offs = le16(area, off + 2) as usize;
        let inum = le32(area, off + 4);
        let size = le32(area, off + 8) as usize;
        let name = off + ENTRY_LEN..off + ENTRY_LEN + name_len;
        if name.end > area.len() {
            return Err(Error::corrupt(
                Corruption::Xattr,
                format!("{what}: attribute name at byte {off} overruns the area"),
            ));
        }
        raws.push(Raw {
            index,
            name,
            offs,
            size,
            inum,
            hash: le32(area, off + 12),
        });
        off += ENTRY_LEN + pad4(name_len);
    }
    let list_end = off + 4;
    let mut out = Vec::with_capacity(raws.len());
    for r in raws {
        if r.inum != 0 {
            out.push(XattrEntry {
                index: r.index,
                name: area[r.name].to_vec(),
                value: Vec::new(),
                ea: Some(EaRef {
                    inum: r.inum,
                    size: r.size as u32,
                    hash: r.hash,
                }),
            });
            continue;
        }
        let value = if r.size == 0 {
            Vec::new()
        } else {
            let start = base + r.offs;
            if start < list_end
                || start
                    .checked_add(pad4(r.size))
                    .is_none_or(|e| e > area.len())
            {
                return Err(Error::corrupt(
                    Corruption::Xattr,
                    format!(
                        "{what}: attribute value at byte {start} (+{}) is outside the value area",
                        r.size
                    ),
                ));
            }
            area[start..start + r.size].to_vec()
        };
        out.push(XattrEntry {
            index: r.index,
            name: area[r.name].to_vec(),
            value,
            ea: None,
        });
    }
    Ok(out)
}

/// Overwrites, where it lies, the value of the in-inode attribute `index`.`name` in `area`
/// (the inode's space after `i_extra_isize`, magic included) with `value` of the same length,
/// as the kernel's ext4_write_inline_data rewrites "system.data": nothing moves. An entry whose
/// hash is set gets the new value's hash (the kernel leaves in-inode hashes 0). False when the
/// area holds no such attribute with a value of that length inside it (nothing written).
pub fn put_ibody_value(area: &mut [u8], index: u8, name: &[u8], value: &[u8]) -> bool {
    if area.len() < IBODY_HEADER_LEN + 4 || le32(area, 0) != XATTR_MAGIC {
        return false;
    }
    let mut off = IBODY_HEADER_LEN;
    while off + ENTRY_LEN <= area.len() && le32(area, off) != 0 {
        let name_len = area[off] as usize;
        let here = off;
        off += ENTRY_LEN + pad4(name_len);
        let Some(n) = area.get(here + ENTRY_LEN..here + ENTRY_LEN + name_len) else {
            return false;
        };
        if area[here + 1] != index || n != name {
            continue;
        }
        let start = IBODY_HEADER_LEN + le16(area, here + 2) as usize;
        let size = le32(area, here + 8) as usize;
        if size != value.len() || start < off || start + size > area.len() {
            return false;
        }
        area[start..start + size].copy_from_slice(value);
        if le32(area, here + 12) != 0 {
            let e = XattrEntry {
                index,
                name: name.to_vec(),
                value: value.to_vec(),
                ea: None,
            };
            put32(area, here + 12, e.hash());
        }
        return true;
    }
    false
}

/// Bytes an entry list takes, terminator included.
pub fn list_len(entries: &[XattrEntry]) -> usize {
    entries.iter().map(|e| e.cost()).sum::<usize>() + 4
}

/// Writes `entries` into `area` from `first` (values packed at the end, offsets relative to
/// `base`), zeroing the rest. The caller checked that `first + list_len(entries) <= area.len()`
/// and that names are at most 255 bytes.
pub fn write_entries(area: &mut [u8], first: usize, base: usize, entries: &[XattrEntry]) {
    area[first..].fill(0);
    let mut off = first;
    let mut vend = area.len();
    for e in entries {
        let offs = if e.value.is_empty() {
            0
        } else {
            vend -= e.value_len();
            area[vend..vend + e.value.len()].copy_from_slice(&e.value);
            (vend - base) as u16
        };
        area[off] = e.name.len() as u8;
        area[off + 1] = e.index;
        put16(area, off + 2, offs);
        put32(area, off + 4, e.ea.map_or(0, |r| r.inum));
        put32(area, off + 8, e.value_size() as u32);
        put32(area, off + 12, e.hash());
        area[off + ENTRY_LEN..off + ENTRY_LEN + e.name.len()].copy_from_slice(&e.name);
        off += e.entry_len();
    }
}

/// Writes `entries` as an inode's in-inode attributes into `area` (the space after
/// `i_extra_isize`): the magic, then `write_entries`. "system.data" (inline data) gets no
/// hash, as the kernel leaves it: the kernel rewrites that value in place without one
/// (ext4_write_inline_data), so a hash would go stale and e2fsck stop at it. The caller checked
/// that `IBODY_HEADER_LEN + list_len(entries) <= area.len()`.
pub fn write_ibody(area: &mut [u8], entries: &[XattrEntry]) {
    put32(area, 0, XATTR_MAGIC);
    write_entries(area, IBODY_HEADER_LEN, IBODY_HEADER_LEN, entries);
    let mut off = IBODY_HEADER_LEN;
    for e in entries {
        if e.index == INDEX_SYSTEM && e.name == b"data" {
            put32(area, off + 12, 0);
        }
        off += e.entry_len();
    }
}

/// Builds a whole xattr block holding `entries` (sorted by the caller) with refcount 1.
pub fn build_block(
    block_size: usize,
    entries: &[XattrEntry],
    blk: u64,
    csum_seed: Option<u32>,
) -> Vec<u8> {
    let mut data = vec![0u8; block_size];
    put32(&mut data, H_MAGIC, XATTR_MAGIC);
    put32(&mut data, H_REFCOUNT, 1);
    put32(&mut data, H_BLOCKS, 1);
    write_entries(&mut data, BLOCK_HEADER_LEN, 0, entries);
    put32(&mut data, H_HASH, block_hash(entries));
    if let Some(seed) = csum_seed {
        let c = block_csum(seed, blk, &data);
        put32(&mut data, H_CHECKSUM, c);
    }
    data
}

/// Checks a block's header (and checksum when `csum_seed` is given) and parses its entries.
pub fn parse_block(
    data: &[u8],
    blk: u64,
    csum_seed: Option<u32>,
    what: &str,
) -> Result<Vec<XattrEntry>> {
    if data.len() < BLOCK_HEADER_LEN + 4 {
        return Err(Error::corrupt(
            Corruption::Xattr,
            format!("{what}: xattr block {blk} is too short"),
        ));
    }
    if le32(data, H_MAGIC) != XATTR_MAGIC {
        return Err(Error::corrupt(
            Corruption::Xattr,
            format!(
                "{what}: xattr block {blk} has bad magic {:#x}",
                le32(data, H_MAGIC)
            ),
        ));
    }
    if le32(data, H_BLOCKS) != 1 {
        return Err(Error::corrupt(
            Corruption::Xattr,
            format!(
                "{what}: xattr block {blk} claims {} blocks",
                le32(data, H_BLOCKS)
            ),
        ));
    }
    if let Some(seed) = csum_seed {
        if le32(data, H_CHECKSUM) != block_csum(seed, blk, data) {
            return Err(Error::bad_checksum(
                Corruption::Xattr,
                format!("{what}: xattr block {blk}"),
            ));
        }
    }
    parse_entries(
        data,
        BLOCK_HEADER_LEN,
        0,
        &format!("{what}: xattr block {blk}"),
    )
}

// ---- POSIX ACLs ----

/// POSIX ACL entry tag `ACL_USER_OBJ`.
pub const ACL_USER_OBJ: u16 = 0x01;
/// POSIX ACL entry tag `ACL_USER`.
pub const ACL_USER: u16 = 0x02;
/// POSIX ACL entry tag `ACL_GROUP_OBJ`.
pub const ACL_GROUP_OBJ: u16 = 0x04;
/// POSIX ACL entry tag `ACL_GROUP`.
pub const ACL_GROUP: u16 = 0x08;
/// POSIX ACL entry tag `ACL_MASK`.
pub const ACL_MASK: u16 = 0x10;
/// POSIX ACL entry tag `ACL_OTHER`.
pub const ACL_OTHER: u16 = 0x20;
/// The VFS form's version (POSIX_ACL_XATTR_VERSION).
pub const ACL_VFS_VERSION: u32 = 2;
/// ext4's on-disk form's version (EXT4_ACL_VERSION).
pub const ACL_DISK_VERSION: u32 = 1;
const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    /// `e_tag` (`ACL_*`).
    pub tag: u16,
    /// `e_perm`: rwx bits.
    pub perm: u16,
    /// `e_id`: the user or group, for `ACL_USER` and `ACL_GROUP`.
    pub id: u32,
}

/// Checks an ACL as the kernel does (posix_acl_valid): owner, named users, owning group, named
/// groups, mask (required when there are named entries), other; permissions within rwx.
pub fn acl_valid(acl: &[AclEntry]) -> Result<()> {
    #[derive(PartialEq)]
    enum St {
        UserObj,
        User,
        Group,
        Other,
        Done,
    }
    let bad = |why: &str| Err(Error::Invalid(format!("malformed POSIX ACL: {why}")));
    let mut st = St::UserObj;
    let mut named = false;
    for e in acl {
        if e.perm & !7 != 0 {
            return bad("permission bits beyond rwx");
        }
        match e.tag {
            ACL_USER_OBJ if st == St::UserObj => st = St::User,
            ACL_USER if st == St::User => {
                if e.id == ACL_UNDEFINED_ID {
                    return bad("named user without an id");
                }
                named = true;
            }
            ACL_GROUP_OBJ if st == St::User => st = St::Group,
            ACL_GROUP if st == St::Group => {
                if e.id == ACL_UNDEFINED_ID {
                    return bad("named group without an id");
                }
                named = true;
            }
            ACL_MASK if st == St::Group => st = St::Other,
            ACL_OTHER if st == St::Other || (st == St::Group && !named) => st = St::Done,
            ACL_USER_OBJ | ACL_USER | ACL_GROUP_OBJ | ACL_GROUP | ACL_MASK | ACL_OTHER => {
                return bad("entries out of order or missing");
            }
            t => return Err(Error::Invalid(format!("unknown POSIX ACL tag {t:#x}"))),
        }
    }
    if st != St::Done {
        return bad("incomplete");
    }
    Ok(())
}

/// Decodes the VFS form. `Ok(None)` for an ACL with no entries (the caller removes it).
pub fn acl_from_vfs(v: &[u8]) -> Result<Option<Vec<AclEntry>>> {
    if v.is_empty() {
        return Ok(None);
    }
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
        return Err(Error::Invalid(format!(
            "POSIX ACL of {} bytes is not a header and whole entries",
            v.len()
        )));
    }
    if le32(v, 0) != ACL_VFS_VERSION {
        return Err(Error::Invalid(format!(
            "POSIX ACL version {} (expected {ACL_VFS_VERSION})",
            le32(v, 0)
        )));
    }
    if v.len() == 4 {
        return Ok(None);
    }
    let acl: Vec<AclEntry> = v[4..]
        .chunks_exact(8)
        .map(|e| AclEntry {
            tag: le16(e, 0),
            perm: le16(e, 2),
            id: match le16(e, 0) {
                ACL_USER | ACL_GROUP => le32(e, 4),
                _ => ACL_UNDEFINED_ID,
            },
        })
        .collect();
    acl_valid(&acl)?;
    Ok(Some(acl))
}

/// Encodes the VFS form.
pub fn acl_to_vfs(acl: &[AclEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * acl.len());
    out.extend_from_slice(&ACL_VFS_VERSION.to_le_bytes());
    for e in acl {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

/// Encodes ext4's on-disk form.
pub fn acl_to_disk(acl: &[AclEntry]) -> Vec<u8> {
    let mut out = ACL_DISK_VERSION.to_le_bytes().to_vec();
    for e in acl {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        if matches!(e.tag, ACL_USER | ACL_GROUP) {
            out.extend_from_slice(&e.id.to_le_bytes());
        }
    }
    out
}

/// Decodes ext4's on-disk form; `Err` carries what is wrong.
pub fn acl_from_disk(v: &[u8]) -> std::result::Result<Vec<AclEntry>, String> {
    if v.len() < 4 {
        return Err(format!("ACL of {} bytes has no header", v.len()));
    }
    if le32(v, 0) != ACL_DISK_VERSION {
        return Err(format!("ACL version {}", le32(v, 0)));
    }
    let mut acl = Vec::new();
    let mut off = 4;
    while off < v.len() {
        if off + 4 > v.len() {
            return Err(format!("ACL entry at byte {off} is cut short"));
        }
        let tag = le16(v, off);
        let perm = le16(v, off + 2);
        let id = match tag {
            ACL_USER | ACL_GROUP => {
                if off + 8 > v.len() {
                    return Err(format!("ACL entry at byte {off} is cut short"));
                }
                let id = le32(v, off + 4);
                off += 8;
                id
            }
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {
                off += 4;
                ACL_UNDEFINED_ID
            }
            t => return Err(format!("unknown ACL tag {t:#x}")),
        };
        acl.push(AclEntry { tag, perm, id });
    }
    Ok(acl)
}

#[cfg(test)]
mod tests;
