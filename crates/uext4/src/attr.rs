//! Attribute changes (chmod, chown, truncate, times) and the rules that come with them, as
//! the kernel's notify_change and ext4_setattr: a chmod keeps the access ACL's owner, group
//! class and other entries equal to the mode (posix_acl_chmod), and for a caller's
//! credentials a chown or truncate takes set-ID bits and `security.capability` away
//! (should_remove_suid, ATTR_KILL_PRIV), in the change's handle.

use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::format::inode::{RawInode, Timestamp, S_IFMT};
use crate::format::xattr::{acl_to_disk, XattrEntry, INDEX_POSIX_ACL_ACCESS};
use crate::fs::Fs;
use crate::inode::Attr;
use crate::transaction::credits;
use crate::xattr::{has_xattrs, may_have_cap};
use std::sync::atomic::Ordering;

/// Which attributes `setattr` changes.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// The new mode (permission bits and set-id bits; the file type is kept).
    pub mode: Option<u32>,
    /// The new owner.
    pub uid: Option<u32>,
    /// The new group.
    pub gid: Option<u32>,
    /// The new size: truncates or extends (as `truncate`).
    pub size: Option<u64>,
    /// The new access time.
    pub atime: Option<TimeSet>,
    /// The new modification time.
    pub mtime: Option<TimeSet>,
    /// The new change time (else the time of the change, as always).
    pub ctime: Option<Timestamp>,
    /// The new creation time (for restoring archives; the kernel has no call for it).
    pub crtime: Option<Timestamp>,
}

/// A time that `setattr` sets: now (as `utimensat` with `UTIME_NOW`), or a given one.
#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    /// The current time.
    Now,
    /// This time.
    At(Timestamp),
}

impl TimeSet {
    /// The time to store: `now` (already clamped), or the time given, clamped to `clamp`.
    pub(crate) fn resolve(self, now: Timestamp, clamp: Option<i64>) -> Timestamp {
        match self {
            TimeSet::Now => now,
            TimeSet::At(t) => t.at_most(clamp),
        }
    }
}

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;

impl Fs {
    /// Changes the attributes `set` names, as an image tool does (no set-ID or capability
    /// removal). A new mode also updates the access ACL, as chmod does.
    pub fn setattr(&self, ino: u32, set: &SetAttr) -> Result<Attr> {
        let attr = self.setattr_inner(ino, set, None)?;
        self.sync_if_flagged(ino, false)?;
        Ok(attr)
    }

    /// [`Fs::setattr`] for `cred`: a chown (of anything but a directory) loses set-user-ID,
    /// set-group-ID when group-executable (or of a group an unprivileged caller is not in) and
    /// `security.capability`; a truncate by an unprivileged caller loses the same, and by
    /// anyone `security.capability`. A change that sets the mode itself keeps what it sets.
    pub fn setattr_as(&self, cred: &Cred, ino: u32, set: &SetAttr) -> Result<Attr> {
        let attr = self.setattr_inner(ino, set, Some(cred))?;
        self.sync_if_flagged(ino, false)?;
        Ok(attr)
    }

    fn setattr_inner(&self, ino: u32, set: &SetAttr, cred: Option<&Cred>) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        may_setattr(&self.iget(ino)?.state.lock().raw, set)?;
        if let Some(size) = set.size {
            self.truncate(ino, size)?;
        }
        let chown = set.uid.is_some() || set.gid.is_some();
        let kill = cred.filter(|_| set.mode.is_none() && (chown || set.size.is_some()));
        let clear = |raw: &RawInode| match kill {
            Some(c) if !raw.is_dir() => privs_to_clear(raw, c, chown),
            _ => 0,
        };
        let inode = self.iget(ino)?;
        let extra = {
            let st = inode.state.lock();
            let acl = set.mode.is_some() && has_xattrs(&st.raw);
            let cap = kill.is_some() && !st.raw.is_dir() && may_have_cap(&st);
            if acl || cap {
                credits::XATTR
            } else {
                0
            }
        };
        // The capability's removal may convert an inline file: its io_lock then.
        let _io = (extra != 0).then(|| inode.io_lock.write());
        let mut h = self.start(credits::SETATTR + extra)?;
        let mut st = inode.state.lock();
        if st.deleted {
            return Err(Error::NotFound);
        }
        let now = self.now();
        let mut changed = set.size.is_some();
        let clear_bits = clear(&st.raw);
        if kill.is_some() && !st.raw.is_dir() && self.drop_capability_in(&mut h, ino, &mut st)? {
            changed = true;
        }
        if let Some(m) = set.mode {
            let m = (m as u16 & !S_IFMT) | st.raw.file_type();
            st.raw.set_mode(m);
            changed = true;
            if let Some(mut acl) = self.acl_in(ino, &st, INDEX_POSIX_ACL_ACCESS)? {
                crate::acl::chmod(&mut acl, m as u32);
                let e = XattrEntry {
                    index: INDEX_POSIX_ACL_ACCESS,
                    name: Vec::new(),
                    value: acl_to_disk(&acl),
                    ea: None,
                };
                self.xattr_put_in(&mut h, ino, &mut st, vec![e])?;
            }
        } else if st.raw.mode() & clear_bits != 0 {
            let m = st.raw.mode() & !clear_bits;
            st.raw.set_mode(m);
            changed = true;
        }
        if let Some(u) = set.uid {
            st.raw.set_uid(u);
            changed = true;
        }
        if let Some(g) = set.gid {
            st.raw.set_gid(g);
            changed = true;
        }
        if let Some(t) = set.atime {
            st.raw.set_atime(t.resolve(now, self.opts.time_clamp));
            changed = true;
        }
        if let Some(t) = set.mtime {
            st.raw.set_mtime(t.resolve(now, self.opts.time_clamp));
            changed = true;
        }
        if let Some(t) = set.crtime {
            st.raw.set_crtime(t.at_most(self.opts.time_clamp));
        }
        if let Some(t) = set.ctime {
            st.raw.set_ctime(t.at_most(self.opts.time_clamp));
        } else if changed {
            st.raw.set_ctime(now);
        }
        // Fields of the inode only (an ACL or capability changed with them has made the
        // transaction ineligible already).
        self.fc_track(&mut h, ino, &st, None);
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        Ok(self.attr_of(ino, &st))
    }
}

/// The set-ID bits a chown (`chown`) or truncate by `cred` takes from a file that is not a
/// directory: the kernel's should_remove_suid and setattr_should_drop_sgid.
fn privs_to_clear(raw: &RawInode, cred: &Cred, chown: bool) -> u16 {
    let mode = raw.mode();
    let mut clear = 0;
    if chown || !cred.privileged {
        clear |= S_ISUID;
    }
    if mode & S_ISGID != 0
        && (mode & 0o010 != 0 && (chown || !cred.privileged)
            || !cred.privileged && !cred.in_group(raw.gid()))
    {
        clear |= S_ISGID;
    }
    clear
}

/// The set-ID bits a write by `cred` takes from a regular file (the kernel's
/// should_remove_suid): none for a privileged caller; else set-user-ID, and set-group-ID when
/// group-executable or of a group the caller is not in (`in_group`, asked only then).
pub(crate) fn write_privs(mode: u16, cred: &Cred, in_group: impl FnOnce() -> bool) -> u16 {
    if cred.privileged || mode & 0o6000 == 0 {
        return 0;
    }
    let sgid = mode & 0o2000 != 0 && (mode & 0o010 != 0 || !in_group());
    0o4000 | if sgid { 0o2000 } else { 0 }
}

/// [`write_privs`] as `remove_privs_of` asks it, under the inode's lock: whether `cred` is
/// in group `gid` was found out before (`member`), since finding out may read /proc.
pub(crate) fn write_privs_known(
    cred: &Cred,
    gid: u32,
    member: bool,
) -> impl Fn(&RawInode) -> u16 + '_ {
    move |raw: &RawInode| {
        write_privs(raw.mode(), cred, || {
            if raw.gid() == gid {
                member
            } else {
                cred.in_group(raw.gid())
            }
        })
    }
}

/// Fails with EPERM for a setattr of `raw`: anything on an immutable inode (ext4_setattr);
/// on an append-only one, a mode, owner or explicit time (notify_change; setting the times to
/// now is allowed).
fn may_setattr(raw: &RawInode, set: &SetAttr) -> Result<()> {
    let f = raw.flags();
    if f & crate::flags::FL_IMMUTABLE != 0 {
        return Err(Error::Perm);
    }
    let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    let restricted = set.mode.is_some()
        || set.uid.is_some()
        || set.gid.is_some()
        || set.size.is_some()
        || explicit(set.atime)
        || explicit(set.mtime)
        || set.ctime.is_some()
        || set.crtime.is_some();
    if f & crate::flags::FL_APPEND != 0 && restricted {
        return Err(Error::Perm);
    }
    Ok(())
}
