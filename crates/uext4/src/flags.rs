//! Inode flags (chattr's), as the kernel's ext4 keeps them in i_flags and its ioctl.c and the
//! VFS's fileattr code change them: FS_IOC_GETFLAGS/SETFLAGS and FS_IOC_FSGETXATTR/FSSETXATTR
//! (the xflags and the project id), who may change which flag, and the rules the flags impose
//! on other operations (immutable, append-only, sync and dirsync), which the operations ask
//! here under their inode's lock.

use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::format::features::{INCOMPAT_CASEFOLD, RO_COMPAT_PROJECT};
use crate::format::inode::{RawInode, GOOD_OLD_INODE_SIZE, S_IFDIR, S_IFMT, S_IFREG};
use crate::fs::Fs;
use crate::inode::{Attr, InodeState};
use crate::transaction::credits;
use std::sync::atomic::Ordering;

/// `EXT4_SECRM_FL`: secure deletion (stored, not acted on, as by the kernel).
pub const FL_SECRM: u32 = 0x1;
/// `EXT4_UNRM_FL`: undelete (stored only).
pub const FL_UNRM: u32 = 0x2;
/// `EXT4_COMPR_FL`: compress (stored only).
pub const FL_COMPR: u32 = 0x4;
/// `EXT4_SYNC_FL`: every change to the file is durable when its call returns.
pub const FL_SYNC: u32 = 0x8;
/// `EXT4_IMMUTABLE_FL`: no change at all, no new link, no removal.
pub const FL_IMMUTABLE: u32 = 0x10;
/// `EXT4_APPEND_FL`: writes only at the end; no truncation, removal or renaming.
pub const FL_APPEND: u32 = 0x20;
/// `EXT4_NODUMP_FL`: left out of backups by dump(8).
pub const FL_NODUMP: u32 = 0x40;
/// `EXT4_NOATIME_FL`: reads do not update the access time.
pub const FL_NOATIME: u32 = 0x80;
/// `EXT4_DIRTY_FL` (compression, visible only).
pub const FL_DIRTY: u32 = 0x100;
/// `EXT4_COMPRBLK_FL` (compression, visible only).
pub const FL_COMPRBLK: u32 = 0x200;
/// `EXT4_NOCOMPR_FL` (compression, visible only).
pub const FL_NOCOMPR: u32 = 0x400;
/// `EXT4_ENCRYPT_FL`: an encrypted file (visible only).
pub const FL_ENCRYPT: u32 = 0x800;
/// `EXT4_INDEX_FL`: a directory with a hashed index (visible only).
pub const FL_INDEX: u32 = 0x1000;
/// `EXT4_IMAGIC_FL`: AFS directory.
pub const FL_IMAGIC: u32 = 0x2000;
/// `EXT4_JOURNAL_DATA_FL`: the file's data goes through the journal (changed only with
/// CAP_SYS_RESOURCE).
pub const FL_JOURNAL_DATA: u32 = 0x4000;
/// `EXT4_NOTAIL_FL` (stored only).
pub const FL_NOTAIL: u32 = 0x8000;
/// `EXT4_DIRSYNC_FL`: changes to the directory's entries are durable when their call
/// returns.
pub const FL_DIRSYNC: u32 = 0x1_0000;
/// `EXT4_TOPDIR_FL`: the top of a directory hierarchy (for the Orlov allocator).
pub const FL_TOPDIR: u32 = 0x2_0000;
/// `EXT4_HUGE_FILE_FL`: i_blocks counts file system blocks.
pub const FL_HUGE_FILE: u32 = 0x4_0000;
/// `EXT4_EXTENTS_FL`: the file maps its blocks with an extent tree.
pub const FL_EXTENTS: u32 = 0x8_0000;
/// `EXT4_VERITY_FL`: fs-verity (visible only).
pub const FL_VERITY: u32 = 0x10_0000;
/// Formerly `EXT4_EOFBLOCKS_FL`; still in the kernel's modifiable mask.
pub const FL_EOFBLOCKS: u32 = 0x40_0000;
/// `EXT4_DAX_FL`: the file is accessed directly (DAX).
pub const FL_DAX: u32 = 0x200_0000;
/// `EXT4_INLINE_DATA_FL`: the data is in the inode (visible only).
pub const FL_INLINE_DATA: u32 = 0x1000_0000;
/// `EXT4_PROJINHERIT_FL`: new inodes in the directory get its project id.
pub const FL_PROJINHERIT: u32 = 0x2000_0000;
/// `EXT4_CASEFOLD_FL`: names in the directory are compared without case.
pub const FL_CASEFOLD: u32 = 0x4000_0000;

/// `EXT4_FL_USER_MODIFIABLE`: the flags FS_IOC_SETFLAGS may change.
pub const FL_USER_MODIFIABLE: u32 = FL_SECRM
    | FL_UNRM
    | FL_COMPR
    | FL_SYNC
    | FL_IMMUTABLE
    | FL_APPEND
    | FL_NODUMP
    | FL_NOATIME
    | FL_JOURNAL_DATA
    | FL_NOTAIL
    | FL_DIRSYNC
    | FL_TOPDIR
    | FL_EXTENTS
    | FL_EOFBLOCKS
    | FL_DAX
    | FL_PROJINHERIT
    | FL_CASEFOLD;

/// `EXT4_FL_USER_VISIBLE`: the flags FS_IOC_GETFLAGS shows.
pub const FL_USER_VISIBLE: u32 = FL_USER_MODIFIABLE
    | FL_DIRTY
    | FL_COMPRBLK
    | FL_NOCOMPR
    | FL_ENCRYPT
    | FL_INDEX
    | FL_VERITY
    | FL_INLINE_DATA;

/// `EXT4_FL_INHERITED`: the flags a new inode takes from its directory.
const FL_INHERITED: u32 = FL_SECRM
    | FL_UNRM
    | FL_COMPR
    | FL_SYNC
    | FL_NODUMP
    | FL_NOATIME
    | FL_NOCOMPR
    | FL_JOURNAL_DATA
    | FL_NOTAIL
    | FL_DIRSYNC
    | FL_PROJINHERIT
    | FL_CASEFOLD
    | FL_DAX;

/// The flags only a directory may carry (`EXT4_REG_FLMASK` is the rest).
const FL_DIR_ONLY: u32 = FL_DIRSYNC | FL_TOPDIR | FL_CASEFOLD | FL_PROJINHERIT;

/// The only flags other files (not regular, not directories) may carry.
const FL_OTHER_MASK: u32 = FL_NODUMP | FL_NOATIME;

/// Flags that cannot be combined with DAX (`EXT4_DAX_MUT_EXCL`).
const FL_DAX_MUT_EXCL: u32 = FL_VERITY | FL_ENCRYPT | FL_JOURNAL_DATA | FL_INLINE_DATA;

/// The generic flags that the xflags of FS_IOC_FSSETXATTR stand for (`FS_COMMON_FL`).
const FL_COMMON: u32 =
    FL_SYNC | FL_IMMUTABLE | FL_APPEND | FL_NODUMP | FL_NOATIME | FL_DAX | FL_PROJINHERIT;

/// `FS_XFLAG_IMMUTABLE`.
pub const XFLAG_IMMUTABLE: u32 = 0x8;
/// `FS_XFLAG_APPEND`.
pub const XFLAG_APPEND: u32 = 0x10;
/// `FS_XFLAG_SYNC`.
pub const XFLAG_SYNC: u32 = 0x20;
/// `FS_XFLAG_NOATIME`.
pub const XFLAG_NOATIME: u32 = 0x40;
/// `FS_XFLAG_NODUMP`.
pub const XFLAG_NODUMP: u32 = 0x80;
/// `FS_XFLAG_PROJINHERIT`.
pub const XFLAG_PROJINHERIT: u32 = 0x200;
/// `FS_XFLAG_DAX`.
pub const XFLAG_DAX: u32 = 0x8000;

/// Each generic flag and the xflag that stands for it.
const XFLAGS: [(u32, u32); 7] = [
    (FL_SYNC, XFLAG_SYNC),
    (FL_IMMUTABLE, XFLAG_IMMUTABLE),
    (FL_APPEND, XFLAG_APPEND),
    (FL_NODUMP, XFLAG_NODUMP),
    (FL_NOATIME, XFLAG_NOATIME),
    (FL_DAX, XFLAG_DAX),
    (FL_PROJINHERIT, XFLAG_PROJINHERIT),
];

/// What FS_IOC_FSGETXATTR returns and FS_IOC_FSSETXATTR takes (`struct fsxattr`); ext4 keeps
/// only the xflags and the project id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsXattr {
    /// `fsx_xflags`: the `FS_XFLAG_*` bits.
    pub xflags: u32,
    /// `fsx_extsize` (always 0 on ext4).
    pub extsize: u32,
    /// `fsx_nextents` (always 0 on ext4).
    pub nextents: u32,
    /// `fsx_projid`: the project id (0 without the project feature).
    pub projid: u32,
    /// `fsx_cowextsize` (always 0 on ext4).
    pub cowextsize: u32,
}

/// The xflags of inode flags `flags` (the kernel's fileattr_fill_flags).
pub fn flags_to_xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// The inode flags the xflags `xflags` stand for (the kernel's fileattr_fill_xflags).
pub fn xflags_to_flags(xflags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(_, xf)| xflags & xf != 0)
        .fold(0, |f, (fl, _)| f | fl)
}

/// `flags` without those inode type `mode` may not carry (the kernel's ext4_mask_flags).
fn mask_flags(mode: u16, flags: u32) -> u32 {
    match mode & S_IFMT {
        S_IFDIR => flags,
        S_IFREG => flags & !FL_DIR_ONLY,
        _ => flags & FL_OTHER_MASK,
    }
}

/// The flags a new inode of type `mode` takes from its directory's flags `dir_flags`.
pub(crate) fn inherited(dir_flags: u32, mode: u16) -> u32 {
    mask_flags(mode, dir_flags & FL_INHERITED)
}

/// Whether DAX may be set or kept with the other flags (the kernel's dax_compatible).
fn dax_compatible(is_dir: bool, mut old: u32, mut new: u32) -> bool {
    if is_dir {
        old &= !FL_INLINE_DATA;
        new &= !FL_INLINE_DATA;
    }
    if new & FL_DAX != 0 && old & FL_DAX_MUT_EXCL != 0 {
        return false;
    }
    !((new ^ old) & FL_DAX_MUT_EXCL != 0 && (old | new) & FL_DAX != 0)
}

/// Fails with EPERM for an inode whose contents or attributes may not change: immutable or
/// append-only (writes at the end excepted, which `may_write` allows). Attribute changes,
/// xattrs, new links and removal ask this (the kernel's xattr_permission, may_delete,
/// vfs_link).
pub(crate) fn may_change(raw: &RawInode) -> Result<()> {
    if raw.flags() & (FL_IMMUTABLE | FL_APPEND) != 0 {
        return Err(Error::Perm);
    }
    Ok(())
}

/// Fails with EPERM where a name may not be added to directory `raw`: it is immutable (the
/// write permission inode_permission refuses).
pub(crate) fn may_add_entry(raw: &RawInode) -> Result<()> {
    if raw.flags() & FL_IMMUTABLE != 0 {
        return Err(Error::Perm);
    }
    Ok(())
}

/// Fails with EPERM where a name may not leave directory `raw`: it is immutable or
/// append-only (may_delete).
pub(crate) fn may_remove_entry(raw: &RawInode) -> Result<()> {
    may_change(raw)
}

/// Fails with EPERM for a write at `off` to file `raw`: immutable, or append-only with `off`
/// not at the end (an append-only file is written only through O_APPEND). Else whether the
/// write must be durable before it returns (SYNC), asked here under the lock the write
/// holds anyway.
pub(crate) fn may_write(raw: &RawInode, off: u64) -> Result<bool> {
    let f = raw.flags();
    if f & (FL_IMMUTABLE | FL_VERITY) != 0 || (f & FL_APPEND != 0 && off != raw.size()) {
        return Err(Error::Perm);
    }
    Ok(f & FL_SYNC != 0)
}

/// What a write learnt under its inode's lock and acts on once its data is in.
#[derive(Default)]
pub(crate) struct WriteAfter {
    /// Set-ID bits or a capability were taken away.
    pub mode_changed: bool,
    /// The file is SYNC: the write is made durable before it returns.
    pub sync: bool,
}

/// Fails with EPERM for a change of size of `raw` (immutable or append-only, as the kernel's
/// do_truncate and ftruncate refuse; verity, as fsverity_prepare_setattr).
pub(crate) fn may_truncate(raw: &RawInode) -> Result<()> {
    if raw.flags() & FL_VERITY != 0 {
        return Err(Error::Perm);
    }
    may_change(raw)
}

/// Fails with EPERM for fallocate `mode` on `raw`: none on an immutable file, and on an
/// append-only one only plain allocation (vfs_fallocate).
pub(crate) fn may_fallocate(raw: &RawInode, mode: i32) -> Result<()> {
    let f = raw.flags();
    if f & (FL_IMMUTABLE | FL_VERITY) != 0
        || (f & FL_APPEND != 0 && mode & !FALLOC_FL_KEEP_SIZE != 0)
    {
        return Err(Error::Perm);
    }
    Ok(())
}

/// `open(2)` flags' bits that the flag rules look at.
const O_ACCMODE: i32 = 0o3;
/// fallocate's plain allocation that keeps the size: all an append-only file allows.
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const O_TRUNC: i32 = 0o1000;
const O_APPEND: i32 = 0o2000;

impl Fs {
    /// FS_IOC_GETFLAGS: the inode's user-visible flags (`FL_*`); a regular file never shows
    /// PROJINHERIT (the kernel's ext4_fileattr_get).
    pub fn get_flags(&self, ino: u32) -> Result<u32> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        Ok(visible_flags(&st.raw))
    }

    /// FS_IOC_FSGETXATTR: the xflags of the inode's flags, and its project id.
    pub fn get_fsxattr(&self, ino: u32) -> Result<FsXattr> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        Ok(FsXattr {
            xflags: flags_to_xflags(visible_flags(&st.raw)),
            projid: self.projid_of(&st.raw),
            ..FsXattr::default()
        })
    }

    /// FS_IOC_SETFLAGS for `cred`, as the kernel's vfs_fileattr_set and ext4_fileattr_set:
    /// the owner or a privileged caller; IMMUTABLE and APPEND change only for a privileged
    /// caller (CAP_LINUX_IMMUTABLE), JOURNAL_DATA likewise (CAP_SYS_RESOURCE); flags the
    /// kernel shows but does not let change are ignored; a flag the inode's type may not
    /// carry, a change of EXTENTS (a migration), and DAX with flags it excludes are
    /// EOPNOTSUPP; CASEFOLD changes only on an empty directory (ENOTEMPTY otherwise) of a
    /// filesystem with the casefold feature; an immutable inode changes nothing but its
    /// IMMUTABLE flag.
    pub fn set_flags_as(&self, cred: &Cred, ino: u32, flags: u32) -> Result<Attr> {
        self.fileattr_set(cred, ino, Some(flags), None)
    }

    /// [`Fs::set_flags_as`] as root (the image tools).
    pub fn set_flags(&self, ino: u32, flags: u32) -> Result<Attr> {
        self.set_flags_as(&Cred::root(), ino, flags)
    }

    /// FS_IOC_FSSETXATTR for `cred`: the xflags replace the flags they stand for (the others
    /// are kept), and the project id is set (EOPNOTSUPP for one other than 0 without the
    /// project feature), with [`Fs::set_flags_as`]'s rules.
    pub fn set_fsxattr_as(&self, cred: &Cred, ino: u32, fsx: &FsXattr) -> Result<Attr> {
        self.fileattr_set(cred, ino, None, Some(fsx))
    }

    /// The first inode in use whose flags make [`Fs::check_open`] refuse some open (immutable,
    /// append-only, verity), if any: a front end that lets files be opened without asking
    /// (FUSE's `noopen`) may only do so where none is. Reads every inode table in use once,
    /// from the block cache (inodes the engine has changed since mounting are read from
    /// memory).
    pub fn first_restricted_inode(&self) -> Result<Option<u32>> {
        for ino in 1..=self.geo.inodes_count {
            if !self.inode_in_use(ino)? {
                continue;
            }
            let f = match self.icache.get_cached(ino) {
                Some(inode) => inode.state.lock().raw.flags(),
                None => self.inode_record(ino)?.raw.flags(),
            };
            if f & (FL_IMMUTABLE | FL_APPEND | FL_VERITY) != 0 {
                return Ok(Some(ino));
            }
        }
        Ok(None)
    }

    /// Whether a file may be opened with `open(2)` flags `flags` (the kernel's may_open and
    /// inode_permission for the flags): EPERM for writing an immutable file, and for writing
    /// an append-only one without O_APPEND or with O_TRUNC.
    pub fn check_open(&self, ino: u32, flags: i32) -> Result<()> {
        let inode = self.iget(ino)?;
        let f = inode.state.lock().raw.flags();
        let writing = flags & O_ACCMODE != 0 || flags & O_TRUNC != 0;
        // A verity file opens for reading only (fsverity_file_open).
        if writing && f & (FL_IMMUTABLE | FL_VERITY) != 0 {
            return Err(Error::Perm);
        }
        if f & FL_APPEND != 0 && (writing && flags & O_APPEND == 0 || flags & O_TRUNC != 0) {
            return Err(Error::Perm);
        }
        Ok(())
    }

    /// The project id of an inode (0 without the project feature or room for it).
    fn projid_of(&self, raw: &RawInode) -> u32 {
        if self.has_project() && has_projid_room(raw) {
            raw.projid()
        } else {
            0
        }
    }

    fn has_project(&self) -> bool {
        self.sb.lock().has_ro_compat(RO_COMPAT_PROJECT)
    }

    /// Sets the flags (given whole, or from `fsx`'s xflags over the current ones) and, from
    /// `fsx`, the project id, in one handle.
    fn fileattr_set(
        &self,
        cred: &Cred,
        ino: u32,
        flags: Option<u32>,
        fsx: Option<&FsXattr>,
    ) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        let inode = self.iget(ino)?;
        // As inode_lock in vfs_fileattr_set: no write or truncate runs meanwhile.
        let _io = inode.io_lock.write();
        let mut h = self.start(credits::SETATTR)?;
        let mut st = inode.state.lock();
        if st.deleted {
            return Err(Error::NotFound);
        }
        let raw = &st.raw;
        if cred.uid != raw.uid() && !cred.privileged {
            return Err(Error::Perm);
        }
        let old = visible_flags(raw);
        let old_projid = self.projid_of(raw);
        let (new, projid) = match (flags, fsx) {
            (Some(f), _) => (f, old_projid),
            (None, Some(x)) => {
                let is_file_or_dir = matches!(raw.file_type(), S_IFREG | S_IFDIR);
                if x.xflags & XFLAG_DAX != 0 && !is_file_or_dir {
                    return Err(Error::Invalid("DAX on a special file".into()));
                }
                (xflags_to_flags(x.xflags) | (old & !FL_COMMON), x.projid)
            }
            (None, None) => (old, old_projid),
        };
        self.check_new_flags(cred, ino, &mut st, old, new, projid)?;
        let sync = st.raw.flags() & FL_SYNC != 0;
        let keep = st.raw.flags() & !(FL_USER_MODIFIABLE & !FL_EXTENTS);
        let set = new & FL_USER_MODIFIABLE & !FL_EXTENTS;
        st.raw.set_flags(keep | set);
        // The flags change even when the project id cannot, as the kernel sets them first.
        let projid_set = if projid != old_projid {
            self.set_projid(&mut st, projid)
        } else {
            Ok(())
        };
        st.raw.set_ctime(self.now());
        self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        let attr = self.attr_of(ino, &st);
        let tid = h.tid();
        drop(st);
        drop(h);
        if sync {
            self.commit_upto(tid)?;
        }
        projid_set.map(|()| attr)
    }

    /// The kernel's checks of a flag change from `old` to `new` (both as GETFLAGS shows
    /// them) and a project id `projid`.
    fn check_new_flags(
        &self,
        cred: &Cred,
        ino: u32,
        st: &mut InodeState,
        old: u32,
        new: u32,
        projid: u32,
    ) -> Result<()> {
        let raw = &st.raw;
        if (new ^ old) & (FL_APPEND | FL_IMMUTABLE) != 0 && !cred.privileged {
            return Err(Error::Perm);
        }
        if new & !FL_USER_VISIBLE != 0 {
            return Err(Error::NotSupported(format!(
                "inode flags {:#x} are not ext4's",
                new & !FL_USER_VISIBLE
            )));
        }
        let new = new & FL_USER_MODIFIABLE;
        if mask_flags(raw.mode(), new) != new {
            return Err(Error::NotSupported(format!(
                "flags {:#x} do not apply to this type of inode",
                new & !mask_flags(raw.mode(), new)
            )));
        }
        let on_disk = raw.flags();
        // An immutable inode may only lose its immutability (ext4_ioctl_check_immutable).
        if on_disk & FL_IMMUTABLE != 0
            && new & FL_IMMUTABLE != 0
            && (on_disk & !FL_IMMUTABLE != new & !FL_IMMUTABLE
                || (self.has_project() && projid != self.projid_of(raw)))
        {
            return Err(Error::Perm);
        }
        if (new ^ on_disk) & FL_JOURNAL_DATA != 0 && !cred.privileged {
            return Err(Error::Perm);
        }
        if !dax_compatible(raw.is_dir(), on_disk, new) {
            return Err(Error::NotSupported(
                "DAX with inline data, journaled data, encryption or verity".into(),
            ));
        }
        if (new ^ on_disk) & FL_EXTENTS != 0 {
            return Err(Error::NotSupported(
                "migration between an extent tree and a block map".into(),
            ));
        }
        if (new ^ on_disk) & FL_CASEFOLD != 0 {
            // ext4_ioctl_setflags: on a filesystem with the feature, and only while the
            // directory is empty (its entries would be hashed and compared the other way).
            if !self.sb.lock().has_incompat(INCOMPAT_CASEFOLD) {
                return Err(Error::NotSupported(
                    "casefold on a filesystem without the casefold feature".into(),
                ));
            }
            if !raw.is_dir() {
                return Err(Error::NotDir);
            }
            if !self.dir_is_empty(ino, st)? {
                return Err(Error::NotEmpty);
            }
            if new & FL_CASEFOLD != 0 {
                self.crypt_prepare_casefold(ino, st)?;
            }
        }
        Ok(())
    }

    /// Sets an inode's project id, as ext4_ioctl_setproject (no quota is kept).
    fn set_projid(&self, st: &mut InodeState, projid: u32) -> Result<()> {
        if !self.has_project() {
            return Err(Error::NotSupported(
                "a project id without the project feature".into(),
            ));
        }
        if self.geo.inode_size as usize <= GOOD_OLD_INODE_SIZE || !has_projid_room(&st.raw) {
            return Err(Error::NotSupported("no room for a project id".into()));
        }
        st.raw.set_projid(projid);
        Ok(())
    }

    /// The project id a new inode in directory `dir_raw` gets: the directory's, when it has
    /// PROJINHERIT (and the filesystem the project feature).
    pub(crate) fn inherited_projid(&self, dir_raw: &RawInode) -> Option<u32> {
        (dir_raw.flags() & FL_PROJINHERIT != 0 && self.has_project() && has_projid_room(dir_raw))
            .then(|| dir_raw.projid())
    }

    /// Refuses a new name in directory `dir_raw` for inode `raw` (link, rename) when the
    /// directory passes its project id on and the inode is in another project, as the
    /// kernel's ext4_link and ext4_rename do (EXDEV: tools then copy, and the copy is
    /// charged to the directory's project).
    pub(crate) fn check_same_project(&self, dir_raw: &RawInode, raw: &RawInode) -> Result<()> {
        match self.inherited_projid(dir_raw) {
            Some(p) if p != self.projid_of(raw) => Err(Error::CrossDevice),
            _ => Ok(()),
        }
    }

    /// Gives a new inode `raw` in directory `dir_raw` the flags and project id it inherits
    /// (the kernel's __ext4_new_inode).
    pub(crate) fn inherit_flags(&self, dir_raw: &RawInode, raw: &mut RawInode) {
        let f = inherited(dir_raw.flags(), raw.mode());
        raw.set_flags(raw.flags() | f);
        if let Some(p) = self
            .inherited_projid(dir_raw)
            .filter(|_| has_projid_room(raw))
        {
            raw.set_projid(p);
        }
    }

    /// After a change to inode `ino` (or to entries of directory `ino`, `dir`): commits when
    /// its flags ask every change to be durable at once (SYNC; DIRSYNC for a directory's
    /// entries), as the kernel's ext4_handle_sync.
    pub(crate) fn sync_if_flagged(&self, ino: u32, dir: bool) -> Result<()> {
        // Gone meanwhile (a directory removed once this change emptied it): the change is
        // done, and nothing is left to ask for durability.
        let Ok(inode) = self.iget(ino) else {
            return Ok(());
        };
        let f = inode.state.lock().raw.flags();
        let want = if dir { FL_SYNC | FL_DIRSYNC } else { FL_SYNC };
        if f & want == 0 {
            return Ok(());
        }
        if dir {
            self.commit()
        } else {
            self.fsync(ino, false)
        }
    }
}

/// The flags FS_IOC_GETFLAGS shows for an inode.
fn visible_flags(raw: &RawInode) -> u32 {
    let f = raw.flags() & FL_USER_VISIBLE;
    if raw.file_type() == S_IFREG {
        f & !FL_PROJINHERIT
    } else {
        f
    }
}

/// Whether the inode's extra fields reach i_projid (i_extra_isize covers it).
fn has_projid_room(raw: &RawInode) -> bool {
    raw.0.len() > GOOD_OLD_INODE_SIZE && raw.extra_isize() as usize >= 0x9C + 4 - 128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xflags_round_trip() {
        let all = FL_COMMON;
        assert_eq!(xflags_to_flags(flags_to_xflags(all)), all);
        assert_eq!(flags_to_xflags(FL_IMMUTABLE | FL_EXTENTS), XFLAG_IMMUTABLE);
    }

    #[test]
    fn masks_as_the_kernel() {
        assert_eq!(FL_USER_MODIFIABLE, 0x624B_C0FF);
        assert_eq!(FL_USER_VISIBLE, 0x725B_DFFF);
        assert_eq!(mask_flags(S_IFREG, FL_DIRSYNC | FL_SYNC), FL_SYNC);
        assert_eq!(mask_flags(0o120000, FL_SYNC | FL_NOATIME), FL_NOATIME);
    }

    #[test]
    fn dax_excludes_inline_data_on_files_only() {
        assert!(!dax_compatible(false, FL_INLINE_DATA, FL_DAX));
        assert!(dax_compatible(true, FL_INLINE_DATA, FL_DAX));
        assert!(!dax_compatible(false, FL_DAX, FL_JOURNAL_DATA | FL_DAX));
    }
}
