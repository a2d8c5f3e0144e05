//! POSIX ACL rules that tie an ACL to the mode bits, as the kernel's fs/posix_acl.c:
//! inheriting a directory's default ACL at creation (`posix_acl_create`), keeping an access
//! ACL in step with chmod (`posix_acl_chmod`) and taking the mode from an access ACL that is
//! set (`posix_acl_update_mode`). The ACLs are lists of [`AclEntry`]; their two byte forms are
//! in [`crate::format::xattr`]. The engine's create paths (namei.rs) apply them through
//! `Fs::new_inode_policy`, inside the create's handle.

use crate::cred::Cred;
use crate::error::Result;
use crate::format::inode::{S_IFDIR, S_IFLNK, S_IFMT};
use crate::format::xattr::{
    acl_to_disk, AclEntry, XattrEntry, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER_OBJ,
    INDEX_POSIX_ACL_ACCESS, INDEX_POSIX_ACL_DEFAULT,
};
use crate::fs::Fs;
use crate::inode::Inode;

/// Whether the ACL says no more than the mode bits (owner, owning group and other only).
pub fn is_equivalent_to_mode(acl: &[AclEntry]) -> bool {
    acl.iter()
        .all(|e| matches!(e.tag, ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_OTHER))
}

/// The permission bits (rwx for owner, group class, other) the ACL stands for: the group
/// class is the mask entry when there is one, else the owning group's.
pub fn mode_bits(acl: &[AclEntry]) -> u16 {
    let get = |t: u16| acl.iter().find(|e| e.tag == t).map(|e| e.perm & 7);
    let user = get(ACL_USER_OBJ).unwrap_or(0);
    let group = get(ACL_MASK).or_else(|| get(ACL_GROUP_OBJ)).unwrap_or(0);
    let other = get(ACL_OTHER).unwrap_or(0);
    (user << 6) | (group << 3) | other
}

/// For a new inode under a default ACL: limits the ACL by the requested mode and the mode by
/// the ACL (`posix_acl_create_masq`). Returns the new mode (type and set-ID bits kept).
pub fn create_masq(acl: &mut [AclEntry], mode: u32) -> u32 {
    let mut mode = mode;
    let mut mask_at = None;
    let mut group_at = None;
    for (i, e) in acl.iter_mut().enumerate() {
        match e.tag {
            ACL_USER_OBJ => {
                e.perm &= ((mode >> 6) & 7) as u16;
                mode &= ((e.perm as u32) << 6) | !0o700;
            }
            ACL_OTHER => {
                e.perm &= (mode & 7) as u16;
                mode &= (e.perm as u32) | !0o007;
            }
            ACL_GROUP_OBJ => group_at = Some(i),
            ACL_MASK => mask_at = Some(i),
            _ => {}
        }
    }
    if let Some(i) = mask_at.or(group_at) {
        let e = &mut acl[i];
        e.perm &= ((mode >> 3) & 7) as u16;
        mode &= ((e.perm as u32) << 3) | !0o070;
    }
    mode
}

/// After chmod: owner, group class (mask, or the owning group without one) and other take
/// the new mode's bits (`posix_acl_chmod`).
pub fn chmod(acl: &mut [AclEntry], mode: u32) {
    let has_mask = acl.iter().any(|e| e.tag == ACL_MASK);
    for e in acl.iter_mut() {
        match e.tag {
            ACL_USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
            ACL_MASK => e.perm = ((mode >> 3) & 7) as u16,
            ACL_GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
            ACL_OTHER => e.perm = (mode & 7) as u16,
            _ => {}
        }
    }
}

/// How the permission bits of a new inode are limited, as the kernel's VFS does with the
/// process's umask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Umask {
    /// POSIX ACLs on (ext4's `acl`, its default): a default ACL of the parent is inherited
    /// and limits the mode; the umask applies only without one.
    Acl(u32),
    /// ACLs off (`noacl`): the umask applies and nothing is inherited.
    NoAcl(u32),
}

/// Who a new inode is created for: an explicit owner (image tools: no set-group-ID rules,
/// no umask), or a caller's credentials.
pub(crate) struct NewOwner<'a> {
    uid: u32,
    gid: u32,
    cred: Option<&'a Cred>,
    umask: Umask,
    /// The caller knows the name is not in the directory (an image builder filling a
    /// directory it made from one listing): no lookup first.
    pub(crate) unique: bool,
}

impl<'a> NewOwner<'a> {
    pub(crate) fn raw(uid: u32, gid: u32) -> NewOwner<'a> {
        NewOwner {
            uid,
            gid,
            cred: None,
            umask: Umask::Acl(0),
            unique: false,
        }
    }

    /// As `raw`, for a name the caller knows is new in its directory.
    pub(crate) fn unique(uid: u32, gid: u32) -> NewOwner<'a> {
        NewOwner {
            unique: true,
            ..NewOwner::raw(uid, gid)
        }
    }

    pub(crate) fn of(cred: &'a Cred, umask: Umask) -> NewOwner<'a> {
        NewOwner {
            uid: cred.uid,
            gid: cred.gid,
            cred: Some(cred),
            umask,
            unique: false,
        }
    }
}

/// A new inode's mode, owner and inherited ACLs (on-disk attribute entries).
pub(crate) struct NewInode {
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub xattrs: Vec<XattrEntry>,
}

impl NewInode {
    /// Journal credits storing the inherited ACLs takes on top of a create's.
    pub(crate) fn extra_credits(&self) -> usize {
        if self.xattrs.is_empty() {
            0
        } else {
            crate::transaction::credits::XATTR
        }
    }
}

const S_ISGID: u32 = 0o2000;

impl Fs {
    /// The mode, owner and ACLs of a new inode of `mode` in directory `d` (its `io_lock`
    /// held): the kernel's inode_init_owner (group of a set-group-ID parent, which a new
    /// directory inherits; set-group-ID dropped from a group-executable file of a group the
    /// caller is not in) and posix_acl_create (a default ACL of the parent limits the mode
    /// and is copied as the access ACL unless it says no more than the mode, and as a new
    /// directory's default ACL; without one the umask applies). Symbolic links take neither.
    pub(crate) fn new_inode_policy(
        &self,
        d: &Inode,
        mode: u16,
        owner: &NewOwner<'_>,
    ) -> Result<NewInode> {
        let dst = d.state.lock();
        let ft = mode & S_IFMT;
        let is_dir = ft == S_IFDIR;
        let mut mode = mode as u32;
        let (uid, mut gid) = (owner.uid, owner.gid);
        if let Some(cred) = owner.cred {
            if dst.raw.mode() as u32 & S_ISGID != 0 {
                gid = dst.raw.gid();
                if is_dir {
                    mode |= S_ISGID;
                }
            }
            if !is_dir
                && mode & (S_ISGID | 0o010) == S_ISGID | 0o010
                && !cred.in_group_or_privileged(gid)
            {
                mode &= !S_ISGID;
            }
        }
        let mut xattrs = Vec::new();
        if ft != S_IFLNK {
            let default = match owner.umask {
                Umask::Acl(_) => self.acl_in(d.ino, &dst, INDEX_POSIX_ACL_DEFAULT)?,
                Umask::NoAcl(_) => None,
            };
            match default {
                Some(dacl) => {
                    let mut acl = dacl.clone();
                    mode = create_masq(&mut acl, mode);
                    if !is_equivalent_to_mode(&acl) {
                        xattrs.push(XattrEntry {
                            index: INDEX_POSIX_ACL_ACCESS,
                            name: Vec::new(),
                            value: acl_to_disk(&acl),
                            ea: None,
                        });
                    }
                    if is_dir {
                        xattrs.push(XattrEntry {
                            index: INDEX_POSIX_ACL_DEFAULT,
                            name: Vec::new(),
                            value: acl_to_disk(&dacl),
                            ea: None,
                        });
                    }
                }
                None => {
                    let (Umask::Acl(u) | Umask::NoAcl(u)) = owner.umask;
                    mode &= !(u & 0o777);
                }
            }
        }
        Ok(NewInode {
            mode: mode as u16,
            uid,
            gid,
            xattrs,
        })
    }
}
