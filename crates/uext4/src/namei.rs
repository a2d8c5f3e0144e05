//! Namespace operations: lookup, create, mknod, mkdir, symlink, link, unlink, rmdir, rename,
//! readdir, setattr, readlink.
//!
//! Locking (see the ranking in docs/ARCHITECTURE.md): a directory change takes the directory's `io_lock`
//! exclusively (lookups take it shared); a rename between two directories first takes
//! `Fs::rename_lock`, then both directories' `io_lock`s in inode-number order. The handle is
//! started after the `io_lock`s and before any inode `state` mutex.

use crate::acl::{NewOwner, Umask};
use crate::cred::Cred;
use crate::error::{Corruption, Error, Result};
use crate::format::inode::*;
use crate::fs::Fs;
use crate::inode::{encode_rdev, Attr, Inode, InodeRef, InodeState};
use crate::transaction::{credits, Handle};
use std::sync::atomic::Ordering;

/// Largest link count; directories past it (dir_nlink) store 1.
pub const LINK_MAX: u16 = 65000;

/// File types as directory entries store them.
pub const FT_UNKNOWN: u8 = 0;
/// Directory entry file type: regular file.
pub const FT_REG: u8 = 1;
/// Directory entry file type: directory.
pub const FT_DIR: u8 = 2;
/// Directory entry file type: character device.
pub const FT_CHRDEV: u8 = 3;
/// Directory entry file type: block device.
pub const FT_BLKDEV: u8 = 4;
/// Directory entry file type: FIFO.
pub const FT_FIFO: u8 = 5;
/// Directory entry file type: socket.
pub const FT_SOCK: u8 = 6;
/// Directory entry file type: symbolic link.
pub const FT_SYMLINK: u8 = 7;

pub fn ftype_of(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => FT_REG,
        S_IFDIR => FT_DIR,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

pub use rename::{RenameFlags, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};

mod path;
mod rename;

/// One directory entry as readdir returns it.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// The inode the entry names.
    pub ino: u32,
    /// ext4 file type (FT_*).
    pub kind: u8,
    /// The name.
    pub name: Vec<u8>,
    /// The offset to pass to readdir to continue after this entry.
    pub next_offset: u64,
}

impl Fs {
    /// i_generation for a new inode: random (`next_generation`), or in a reproducible build
    /// (`MountOptions::time_clamp`) the next of a sequence seeded by the hash seed, so that
    /// the same operations give the same bytes.
    fn next_generation(&self) -> u32 {
        if self.opts.time_clamp.is_none() {
            return next_generation();
        }
        let n = self.generations.fetch_add(1, Ordering::Relaxed);
        let seed = self
            .geo
            .hash_seed
            .iter()
            .fold(0u64, |a, &w| a.rotate_left(17) ^ w as u64);
        let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as u32
    }
}

/// i_generation for a new inode: unpredictable and different from the previous holder of the
/// inode number (NFS file handles compare it), like the kernel's random value. A SplitMix64
/// sequence seeded once from the clock and the process id.
fn next_generation() -> u32 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let t = Timestamp::now();
        (t.sec as u64).wrapping_mul(1_000_000_007)
            ^ (t.nsec as u64)
            ^ ((std::process::id() as u64) << 32)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > 255 {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!(
            "file name {:?} contains '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn inc_nlink(raw: &mut RawInode) -> Result<()> {
    let n = raw.links_count();
    if raw.is_dir() {
        if n == 1 || n >= LINK_MAX - 1 {
            raw.set_links_count(1); // dir_nlink: "many"
        } else {
            raw.set_links_count(n + 1);
        }
        return Ok(());
    }
    if n >= LINK_MAX {
        return Err(Error::TooManyLinks);
    }
    raw.set_links_count(n + 1);
    Ok(())
}

fn dec_nlink(raw: &mut RawInode) {
    let n = raw.links_count();
    if raw.is_dir() && n == 1 {
        return; // "many" stays many (the kernel does the same) until rmdir sets it to 0
    }
    raw.set_links_count(n.saturating_sub(1));
}

impl Fs {
    pub(crate) fn dir_inode(&self, dir: u32) -> Result<InodeRef> {
        let d = self.iget(dir)?;
        let st = d.state.lock();
        if !st.raw.is_dir() {
            return Err(Error::NotDir);
        }
        drop(st);
        Ok(d)
    }

    /// Looks a name up in a directory (the caller holds the directory's io_lock).
    /// A directory found under `name` in directory `dir` must be its child: its ".." names
    /// `dir`. An entry that names `dir` itself or one of its ancestors is corrupt (the
    /// kernel's VFS refuses such a directory alias with EIO), and taking that directory's
    /// io_lock after `dir`'s would wait for this thread itself, or invert the parent-child lock
    /// order against an rmdir higher up. `dir`'s io_lock is held, so the child's ".." cannot
    /// change meanwhile (only a rename out of `dir` changes it).
    fn check_child_dir(&self, dir: u32, name: &[u8], child: &Inode) -> Result<()> {
        let parent = {
            let mut st = child.state.lock();
            self.dir_lookup(child.ino, &mut st, b"..")?.map(|(i, _)| i)
        };
        if child.ino == dir || parent != Some(dir) {
            return Err(self.fail(
                Error::corrupt(
                    Corruption::Directory,
                    format!(
                        "directory inode {dir}: entry {:?} names directory {}, whose parent is {}",
                        String::from_utf8_lossy(name),
                        child.ino,
                        parent.map_or("missing".to_string(), |p| format!("inode {p}"))
                    ),
                ),
                dir,
                0,
                "check_child_dir",
            ));
        }
        Ok(())
    }

    fn find(&self, d: &Inode, name: &[u8]) -> Result<Option<(u32, u8)>> {
        let mut st = d.state.lock();
        if st.raw.links_count() == 0 {
            return Ok(None);
        }
        self.dir_lookup(d.ino, &mut st, name)
    }

    /// Looks up `name` in the directory `dir`: its inode's attributes.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound) when there is no such entry;
    /// [`Error::NotDir`](crate::Error::NotDir) when `dir` is not a directory.
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        let d = self.dir_inode(dir)?;
        let _g = d.io_lock.read();
        match self.find(&d, name)? {
            Some((ino, _)) => self.getattr(ino),
            None => Err(Error::NotFound),
        }
    }

    /// Creates a regular file (or, with another type in `mode`, that kind of node) owned by
    /// `uid`/`gid` with the permission bits of `mode`, as an image tool does. A default ACL of
    /// `dir` is inherited (and limits the mode) in the create's handle; no umask applies.
    pub fn create(&self, dir: u32, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod_inner(
            dir,
            name,
            with_type(mode, S_IFREG),
            0,
            &NewOwner::raw(uid, gid),
        )
    }

    /// Creates a regular file (or another type in `mode`) for `cred`, as open(O_CREAT) does:
    /// owned by the caller, with the group of a set-group-ID `dir`; under a default ACL of
    /// `dir` the ACL limits the mode and becomes the file's access ACL, else `umask` applies.
    /// All in the create's handle.
    pub fn create_as(
        &self,
        cred: &Cred,
        dir: u32,
        name: &[u8],
        mode: u32,
        umask: Umask,
    ) -> Result<Attr> {
        let owner = NewOwner::of(cred, umask);
        let _limits = crate::quota::limits_for(cred);
        self.mknod_inner(dir, name, with_type(mode, S_IFREG), 0, &owner)
    }

    /// Makes a node of the type in `mode` owned by `uid`/`gid` (as [`Fs::create`]).
    pub fn mknod(
        &self,
        dir: u32,
        name: &[u8],
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.mknod_inner(dir, name, mode, rdev, &NewOwner::raw(uid, gid))
    }

    /// As [`Fs::mknod`] (any type, directories too), for image builders that know `name` is
    /// not in `dir`: a directory they made and fill from one listing of a source. The name is
    /// not looked up first; a name that is there after all ends up twice in the directory,
    /// which e2fsck reports.
    pub fn mknod_unique(
        &self,
        dir: u32,
        name: &[u8],
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.mknod_inner(dir, name, mode, rdev, &NewOwner::unique(uid, gid))
    }

    /// As [`Fs::symlink`], for a name known to be new in `dir` (as [`Fs::mknod_unique`]).
    pub fn symlink_unique(
        &self,
        dir: u32,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.symlink_inner(dir, name, target, &NewOwner::unique(uid, gid))
    }

    /// Makes a node of the type in `mode` for `cred` (as [`Fs::create_as`]).
    pub fn mknod_as(
        &self,
        cred: &Cred,
        dir: u32,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: Umask,
    ) -> Result<Attr> {
        let _limits = crate::quota::limits_for(cred);
        self.mknod_inner(dir, name, mode, rdev, &NewOwner::of(cred, umask))
    }

    fn mknod_inner(
        &self,
        dir: u32,
        name: &[u8],
        mode: u32,
        rdev: u32,
        owner: &NewOwner<'_>,
    ) -> Result<Attr> {
        let ft = (mode as u16) & S_IFMT;
        match ft {
            S_IFREG | S_IFCHR | S_IFBLK | S_IFIFO | S_IFSOCK => {}
            S_IFDIR => return self.mkdir_inner(dir, name, mode, owner),
            _ => {
                return Err(Error::Invalid(format!(
                    "mknod: unsupported file type {:o}",
                    ft
                )))
            }
        }
        self.new_node(dir, name, mode as u16, owner, None, |fs, raw| {
            if ft == S_IFCHR || ft == S_IFBLK {
                encode_rdev(raw, rdev);
            } else if ft == S_IFREG {
                fs.init_block_map(raw);
            }
            Ok(())
        })
    }

    /// Makes a directory owned by `uid`/`gid` (as [`Fs::create`]); it also inherits the
    /// default ACL of `dir` as its own default ACL.
    pub fn mkdir(&self, dir: u32, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mkdir_inner(dir, name, mode, &NewOwner::raw(uid, gid))
    }

    /// Makes a directory for `cred` (as [`Fs::create_as`]); under a set-group-ID `dir` it is
    /// set-group-ID too.
    pub fn mkdir_as(
        &self,
        cred: &Cred,
        dir: u32,
        name: &[u8],
        mode: u32,
        umask: Umask,
    ) -> Result<Attr> {
        let _limits = crate::quota::limits_for(cred);
        self.mkdir_inner(dir, name, mode, &NewOwner::of(cred, umask))
    }

    fn mkdir_inner(&self, dir: u32, name: &[u8], mode: u32, owner: &NewOwner<'_>) -> Result<Attr> {
        let mode = (mode as u16 & !S_IFMT) | S_IFDIR;
        self.new_node(dir, name, mode, owner, None, |fs, raw| {
            fs.init_block_map(raw);
            raw.set_links_count(2);
            Ok(())
        })
    }

    /// Makes a symbolic link owned by `uid`/`gid`.
    pub fn symlink(
        &self,
        dir: u32,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.symlink_inner(dir, name, target, &NewOwner::raw(uid, gid))
    }

    /// Makes a symbolic link for `cred`: owned by the caller, with the group of a
    /// set-group-ID `dir` (a link's mode is always 0777 and it inherits no ACL).
    pub fn symlink_as(&self, cred: &Cred, dir: u32, name: &[u8], target: &[u8]) -> Result<Attr> {
        let owner = NewOwner::of(cred, Umask::Acl(0));
        let _limits = crate::quota::limits_for(cred);
        self.symlink_inner(dir, name, target, &owner)
    }

    fn symlink_inner(
        &self,
        dir: u32,
        name: &[u8],
        target: &[u8],
        owner: &NewOwner<'_>,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= self.geo.block_size as usize || target.len() > 4095 {
            return Err(Error::NameTooLong);
        }
        let mode = S_IFLNK | 0o777;
        if self.crypt_enabled && self.dir_is_encrypted(dir)? {
            // The target is encrypted with the new inode's key once its number is known.
            // Whether it is slow is known before: the length depends on the policy only.
            let policy = match self.crypt_of(dir)?.require()? {
                Some(k) => k.policy,
                None => {
                    return Err(Error::Invalid(
                        "encrypted directory without a policy".into(),
                    ))
                }
            };
            let bs = self.geo.block_size as usize;
            let ct = crate::crypto::fname_encrypted_size(&policy, target.len(), bs - 3)
                .ok_or(Error::NameTooLong)?;
            let slow = ct + 3 > I_BLOCK_SIZE;
            return self.new_node_crypt(dir, name, mode, owner, None, Some(target), |fs, raw| {
                if slow {
                    fs.init_block_map(raw);
                }
                Ok(())
            });
        }
        // A slow symlink's target is its first data block, written before the name is linked
        // (a readlink that finds the name reads the whole target; a crash leaves both or neither).
        let slow = (target.len() >= I_BLOCK_SIZE).then_some(target);
        self.new_node(dir, name, mode, owner, slow, |fs, raw| {
            raw.set_size(target.len() as u64);
            if target.len() < I_BLOCK_SIZE {
                // Fast symlink: the target lives in i_block.
                raw.i_block_mut()[..target.len()].copy_from_slice(target);
            } else {
                fs.init_block_map(raw);
            }
            Ok(())
        })
    }

    /// The owner `cred` gives a new inode in `dir`: the caller's uid, and the group of a
    /// set-group-ID `dir` or else the caller's (a rename's whiteout is owned so).
    pub fn owner_in(&self, cred: &Cred, dir: u32) -> Result<(u32, u32)> {
        let d = self.iget(dir)?;
        let st = d.state.lock();
        if st.raw.mode() & 0o2000 != 0 {
            Ok((cred.uid, st.raw.gid()))
        } else {
            Ok((cred.uid, cred.gid))
        }
    }

    /// Lets `init` fill in type-specific fields, allocates the inode, writes `first_block` (if
    /// any) as its data block 0, and links it into `dir`.
    #[allow(clippy::too_many_arguments)]
    fn new_node(
        &self,
        dir: u32,
        name: &[u8],
        mode: u16,
        owner: &NewOwner<'_>,
        first_block: Option<&[u8]>,
        init: impl Fn(&Fs, &mut RawInode) -> Result<()>,
    ) -> Result<Attr> {
        self.new_node_crypt(dir, name, mode, owner, first_block, None, init)
    }

    /// [`Fs::new_node`]; `link_target`: a symlink's target, to encrypt with the new inode's
    /// key where `dir` is encrypted (`init` and `first_block` then leave the target out).
    #[allow(clippy::too_many_arguments)]
    fn new_node_crypt(
        &self,
        dir: u32,
        name: &[u8],
        mode: u16,
        owner: &NewOwner<'_>,
        first_block: Option<&[u8]>,
        link_target: Option<&[u8]>,
        init: impl Fn(&Fs, &mut RawInode) -> Result<()>,
    ) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        // A retry runs the whole creation again (`retry_nospace`).
        let attr = self.retry_nospace(|| {
            check_name(name)?;
            self.check_writable()?;
            let d = self.dir_inode(dir)?;
            let _g = d.io_lock.write();
            if is_dot(name) || (!owner.unique && self.find(&d, name)?.is_some()) {
                return Err(Error::Exists);
            }
            check_dir_live(&d)?;
            crate::flags::may_add_entry(&d.state.lock().raw)?;
            let is_dir = mode & S_IFMT == S_IFDIR;
            // fscrypt_prepare_new_inode: files, directories and symlinks made in an
            // encrypted directory inherit its policy with a nonce of their own; the key
            // must be there (ENOKEY), as the name is encrypted with it.
            let new_ctx = if self.crypt_enabled {
                let mut dst = d.state.lock();
                let dir_key = self.crypt(dir, &mut dst)?.require()?.cloned();
                match dir_key {
                    Some(k) if matches!(mode & S_IFMT, S_IFREG | S_IFDIR | S_IFLNK) => {
                        Some(k.policy.new_context()?)
                    }
                    _ => None,
                }
            } else {
                None
            };
            let new = self.new_inode_policy(&d, mode, owner)?;
            let now = self.now();
            let mut raw = self.fresh_raw_inode(new.mode, new.uid, new.gid, now);
            self.inherit_flags(&d.state.lock().raw, &mut raw);
            if new_ctx.is_some() {
                raw.set_flags(raw.flags() | crate::flags::FL_ENCRYPT);
            }
            init(self, &mut raw)?;
            let mut h = self.start(credits::CREATE + new.extra_credits())?;
            let inode = self.alloc_inode(&mut h, dir, is_dir, raw)?;
            let ino = inode.ino;
            let result = (|| -> Result<()> {
                let mut ist = inode.state.lock();
                let mut xattrs = new.xattrs.clone();
                if let Some(ctx) = &new_ctx {
                    let kind = match mode & S_IFMT {
                        S_IFREG => crate::crypto::InodeKind::Regular,
                        S_IFDIR => crate::crypto::InodeKind::Directory,
                        _ => crate::crypto::InodeKind::Symlink,
                    };
                    let key = self.keyring.inode_key(ctx, kind, ino, &self.geo.uuid)?;
                    if let Some(t) = link_target {
                        let disk = key.encrypt_symlink(t, self.geo.block_size as usize)?;
                        ist.raw.set_size(disk.len() as u64 - 1);
                        if disk.len() <= I_BLOCK_SIZE {
                            ist.raw.i_block_mut()[..disk.len()].copy_from_slice(&disk);
                        } else {
                            self.write_first_block(&mut h, ino, &mut ist, &disk)?;
                        }
                    }
                    ist.crypt = Some(std::sync::Arc::new(key));
                    // The context first: in the inode, as the kernel puts it.
                    xattrs.insert(0, crate::encrypt::context_entry(ctx));
                }
                if let Some(data) = first_block {
                    self.write_first_block(&mut h, ino, &mut ist, data)?;
                }
                ist.may_inline = self.may_inline_new(&ist.raw);
                // Inherited ACLs in the create's handle, as the kernel's ext4_init_acl, before
                // the directory's first block or inline data (ext4_init_new_dir).
                self.xattr_put_in(&mut h, ino, &mut ist, xattrs)?;
                if is_dir {
                    self.dir_init(&mut h, ino, &mut ist, dir)?;
                }
                self.mark_inode_dirty(&mut h, &inode, &mut ist)?;
                // Whole now: a stale number that reaches it sees a new inode, as after reuse.
                ist.creating = false;
                // A new regular file is a CREAT record (anything else commits in full).
                self.fc_track_create(&mut h, dir, name, ino, &ist);
                drop(ist);
                let mut dst = d.state.lock();
                self.dir_add(&mut h, dir, &mut dst, name, ino, ftype_of(mode))?;
                if is_dir {
                    inc_nlink(&mut dst.raw)?;
                }
                dst.raw.set_mtime(now);
                dst.raw.set_ctime(now);
                self.mark_inode_dirty(&mut h, &d, &mut dst)?;
                Ok(())
            })();
            if let Err(e) = result {
                h.fc_ineligible("a create undone after an error");
                self.discard_new_inode(&mut h, &inode, is_dir)?;
                return Err(e);
            }
            let st = inode.state.lock();
            Ok(self.attr_of(ino, &st))
        })?;
        self.sync_if_flagged(dir, true)?;
        Ok(attr)
    }

    /// Undoes an inode allocated in this handle whose name could not be added: releases
    /// whatever it got, and its number.
    fn discard_new_inode(&self, h: &mut Handle<'_>, inode: &Inode, is_dir: bool) -> Result<()> {
        let mut ist = inode.state.lock();
        let _ = self.evict_blocks(h, inode, &mut ist);
        // The inode was already written live in this handle: write it back as deleted.
        ist.raw.set_links_count(0);
        ist.raw.set_dtime(self.now().sec as u32);
        let _ = self.write_inode(h, inode.ino, &mut ist.raw);
        ist.deleted = true;
        ist.creating = false;
        drop(ist);
        self.free_inode(h, inode.ino, is_dir)
    }

    /// The on-disk fields of a new inode: its mode and owner, one link, every time `now`, a
    /// new generation.
    pub(crate) fn fresh_raw_inode(
        &self,
        mode: u16,
        uid: u32,
        gid: u32,
        now: Timestamp,
    ) -> RawInode {
        let mut raw = self.new_raw_inode();
        raw.set_mode(mode);
        raw.set_uid(uid);
        raw.set_gid(gid);
        raw.set_links_count(1);
        raw.set_atime(now);
        raw.set_mtime(now);
        raw.set_ctime(now);
        raw.set_crtime(now);
        raw.set_generation(self.next_generation());
        raw
    }

    /// A fresh inode, allocated near `dir` in handle `h` and written whole, with no name yet.
    #[allow(clippy::too_many_arguments)]
    fn new_unnamed_inode(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        mode: u16,
        uid: u32,
        gid: u32,
        now: Timestamp,
        init: impl Fn(&Fs, &mut RawInode),
    ) -> Result<InodeRef> {
        let mut raw = self.fresh_raw_inode(mode, uid, gid, now);
        init(self, &mut raw);
        let inode = self.alloc_inode(h, dir, false, raw)?;
        let mut ist = inode.state.lock();
        if let Err(e) = self.mark_inode_dirty(h, &inode, &mut ist) {
            drop(ist);
            self.discard_new_inode(h, &inode, false)?;
            return Err(e);
        }
        ist.creating = false;
        drop(ist);
        Ok(inode)
    }

    /// O_TMPFILE: a new regular file (mode's permission bits) with no name, on the orphan
    /// list with no links (as the kernel's ext4_tmpfile), opened once: `release` frees it
    /// unless `link` gave it a name meanwhile (which takes it off the orphan list). A crash
    /// before either leaves an orphan that the next open (or e2fsck) frees.
    pub fn tmpfile(&self, dir: u32, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.tmpfile_inner(dir, mode, &NewOwner::raw(uid, gid))
    }

    /// [`Fs::tmpfile`] for `cred`: owned as [`Fs::create_as`] owns a file, with its mode
    /// and ACL from the directory's default ACL or the umask.
    pub fn tmpfile_as(&self, cred: &Cred, dir: u32, mode: u32, umask: Umask) -> Result<Attr> {
        let _limits = crate::quota::limits_for(cred);
        self.tmpfile_inner(dir, mode, &NewOwner::of(cred, umask))
    }

    fn tmpfile_inner(&self, dir: u32, mode: u32, owner: &NewOwner<'_>) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let mode = (mode as u16 & !S_IFMT) | S_IFREG;
        self.retry_nospace(|| {
            self.check_writable()?;
            let d = self.dir_inode(dir)?;
            let _g = d.io_lock.read();
            check_dir_live(&d)?;
            let dir_raw = d.state.lock().raw.clone();
            crate::flags::may_add_entry(&dir_raw)?;
            let new = self.new_inode_policy(&d, mode, owner)?;
            let mut h = self.start(credits::CREATE + new.extra_credits())?;
            let now = self.now();
            // fscrypt_prepare_new_inode, as for a named file: the directory's policy with a
            // nonce of its own, the key required (ENOKEY).
            let ctx = if self.crypt_enabled && crate::encrypt::is_encrypted(&dir_raw) {
                let dir_key = self.crypt(dir, &mut d.state.lock())?.require()?.cloned();
                dir_key.map(|k| k.policy.new_context()).transpose()?
            } else {
                None
            };
            let inode =
                self.new_unnamed_inode(&mut h, dir, new.mode, new.uid, new.gid, now, |fs, raw| {
                    fs.init_block_map(raw);
                    fs.inherit_flags(&dir_raw, raw);
                    if ctx.is_some() {
                        raw.set_flags(raw.flags() | crate::flags::FL_ENCRYPT);
                    }
                })?;
            inode.open_count.fetch_add(1, Ordering::AcqRel);
            let mut ist = inode.state.lock();
            ist.may_inline = self.may_inline_new(&ist.raw);
            ist.raw.set_links_count(0);
            self.orphan_add(&mut h, &inode, &mut ist)?;
            let mut xattrs = new.xattrs.clone();
            if let Some(ctx) = &ctx {
                let kind = crate::crypto::InodeKind::Regular;
                let key = self
                    .keyring
                    .inode_key(ctx, kind, inode.ino, &self.geo.uuid)?;
                ist.crypt = Some(std::sync::Arc::new(key));
                xattrs.insert(0, crate::encrypt::context_entry(ctx));
            }
            self.xattr_put_in(&mut h, inode.ino, &mut ist, xattrs)?;
            self.mark_inode_dirty(&mut h, &inode, &mut ist)?;
            Ok(self.attr_of(inode.ino, &ist))
        })
    }

    /// Makes `newname` in `newdir` a hard link to `ino`.
    ///
    /// # Errors
    /// [`Error::Exists`](crate::Error::Exists);
    /// [`Error::TooManyLinks`](crate::Error::TooManyLinks); [`Error::Perm`](crate::Error::Perm) for
    /// a directory.
    pub fn link(&self, ino: u32, newdir: u32, newname: &[u8]) -> Result<Attr> {
        let r = self.link_inner(ino, newdir, newname);
        self.delete_deferred();
        let attr = r?;
        self.sync_if_flagged(newdir, true)?;
        Ok(attr)
    }

    fn link_inner(&self, ino: u32, newdir: u32, newname: &[u8]) -> Result<Attr> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        check_name(newname)?;
        self.check_writable()?;
        let inode = self.iget(ino)?;
        if inode.state.lock().raw.is_dir() {
            return Err(Error::Perm);
        }
        crate::flags::may_change(&inode.state.lock().raw)?;
        if self.crypt_enabled {
            self.may_link_crypt(newdir, ino)?;
        }
        let d = self.dir_inode(newdir)?;
        // A copy of the directory's fields: two inodes' state locks are never held together.
        let dir_raw = d.state.lock().raw.clone();
        self.check_same_project(&dir_raw, &inode.state.lock().raw)?;
        let _g = d.io_lock.write();
        // The inode's io_lock too (after the directory's, as unlink takes its victim's): if the
        // new name cannot be added and the other names went meanwhile, the inode is freed
        // below, and an overwrite in flight must not be writing its blocks then.
        let _ig = inode.io_lock.write();
        if is_dot(newname) || self.find(&d, newname)?.is_some() {
            return Err(Error::Exists);
        }
        check_dir_live(&d)?;
        crate::flags::may_add_entry(&d.state.lock().raw)?;
        let mut h = self.start(credits::LINK)?;
        let now = self.now();
        // The link count goes up before the new entry exists, in the same hold of the inode's
        // lock as the check that the inode is live: an unlink of its last other name in
        // between would otherwise free it, and the new entry would then name a freed inode.
        let (ft, was_orphan) = {
            let mut ist = inode.state.lock();
            if ist.deleted || ist.dying || (ist.raw.links_count() == 0 && !ist.orphaned) {
                return Err(Error::NotFound);
            }
            if ist.raw.links_count() >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            inc_nlink(&mut ist.raw)?;
            ist.raw.set_ctime(now);
            let was_orphan = ist.orphaned;
            if was_orphan {
                self.orphan_del(&mut h, &inode, &mut ist)?;
            }
            self.mark_inode_dirty(&mut h, &inode, &mut ist)?;
            (ftype_of(ist.raw.mode()), was_orphan)
        };
        let added = (|| -> Result<()> {
            let mut dst = d.state.lock();
            self.dir_add(&mut h, newdir, &mut dst, newname, ino, ft)?;
            dst.raw.set_mtime(now);
            dst.raw.set_ctime(now);
            self.mark_inode_dirty(&mut h, &d, &mut dst)
        })();
        let mut ist = inode.state.lock();
        if let Err(e) = added {
            // Take the count back; if the other names went meanwhile, this was the last.
            h.fc_ineligible("a link undone after an error");
            dec_nlink(&mut ist.raw);
            self.drop_link_finish(&mut h, &inode, &mut ist)?;
            return Err(e);
        }
        if was_orphan {
            // A linked O_TMPFILE leaves the orphan list, which no record describes.
            h.fc_ineligible("an orphan linked");
        } else {
            self.fc_track_link(&mut h, newdir, dir_raw.flags(), newname, ino, &ist);
        }
        Ok(self.attr_of(ino, &ist))
    }

    /// Removes the name `name` (not a directory) from `dir`; the inode is freed with its last link
    /// and last open.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound); [`Error::IsDir`](crate::Error::IsDir).
    pub fn unlink(&self, dir: u32, name: &[u8]) -> Result<()> {
        let r = self.remove_entry(dir, name, false);
        self.delete_deferred();
        r?;
        self.sync_if_flagged(dir, true)
    }

    /// Removes the empty directory `name` from `dir`.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound); [`Error::NotDir`](crate::Error::NotDir);
    /// [`Error::NotEmpty`](crate::Error::NotEmpty).
    pub fn rmdir(&self, dir: u32, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::Invalid("rmdir of \".\"".into()));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        let r = self.remove_entry(dir, name, true);
        self.delete_deferred();
        r?;
        self.sync_if_flagged(dir, true)
    }

    fn remove_entry(&self, dir: u32, name: &[u8], want_dir: bool) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        self.check_writable()?;
        let d = self.dir_inode(dir)?;
        let _g = d.io_lock.write();
        let Some((ino, _)) = self.find(&d, name)? else {
            return Err(Error::NotFound);
        };
        let inode = self.iget(ino)?;
        crate::flags::may_remove_entry(&d.state.lock().raw)?;
        crate::flags::may_change(&inode.state.lock().raw)?;
        let is_dir = inode.state.lock().raw.is_dir();
        if want_dir && !is_dir {
            return Err(Error::NotDir);
        }
        if !want_dir && is_dir {
            return Err(Error::IsDir);
        }
        if is_dir {
            self.check_child_dir(dir, name, &inode)?;
        }
        // The victim's io_lock too (rank: after the directory's), as the kernel's vfs_unlink
        // locks the victim: if this removes the last link of a file nobody has open, its
        // blocks are freed here, and an overwrite in flight (which maps its blocks, then
        // writes them holding this lock shared) must finish first.
        let _cg = inode.io_lock.write();
        if is_dir {
            let mut cst = inode.state.lock();
            if !self.dir_is_empty(ino, &mut cst)? {
                return Err(Error::NotEmpty);
            }
        }
        let mut h = self.start(credits::UNLINK)?;
        let now = self.now();
        let dir_flags = {
            let mut dst = d.state.lock();
            self.dir_remove(&mut h, dir, &mut dst, name)?;
            if is_dir {
                dec_nlink(&mut dst.raw);
            }
            dst.raw.set_mtime(now);
            dst.raw.set_ctime(now);
            self.mark_inode_dirty(&mut h, &d, &mut dst)?;
            dst.raw.flags()
        };
        let mut ist = inode.state.lock();
        if is_dir {
            ist.raw.set_links_count(0);
        } else {
            dec_nlink(&mut ist.raw);
        }
        ist.raw.set_ctime(now);
        self.fc_track_unlink(&mut h, dir, dir_flags, name, ino, &ist);
        self.drop_link_finish(&mut h, &inode, &mut ist)
    }

    /// After an inode lost a link: delete it if it has none left and nobody has it open (nor
    /// a front end holds it: see [`Fs::pin_ino`]), or put it on the orphan list until its last
    /// close (or the front end's forget). A file too large to free within this
    /// handle goes on the orphan list too, and on `deferred_deletes`: the public operation
    /// frees it in pieces once its handle is done (`delete_deferred`), as the kernel's
    /// eviction truncates a large file over several transactions with the inode an orphan.
    pub(crate) fn drop_link_finish(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        ist: &mut InodeState,
    ) -> Result<()> {
        if ist.raw.links_count() > 0 {
            return self.mark_inode_dirty(h, inode, ist);
        }
        let open = self.held(inode);
        let large = !open && self.removal_is_large(inode.ino, ist, 0, 1 << 32)?;
        if open || large {
            if !ist.orphaned {
                self.orphan_add(h, inode, ist)?;
            }
            if large {
                self.deferred_deletes.lock().push(inode.ino);
            }
            return self.mark_inode_dirty(h, inode, ist);
        }
        self.delete_inode(h, inode, ist)
    }

    /// Frees an inode with no links: its blocks, its xattr block, its number. Once the first
    /// block may be free in its bitmap, a failure (a corrupt extent tree or xattr block met
    /// half-way) abandons the transaction (`Fs::abandon_txn`), as the kernel's ext4_error
    /// aborts the journal: a bitmap never reaches the disk freed under an inode that still
    /// maps the block.
    pub(crate) fn delete_inode(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        ist: &mut InodeState,
    ) -> Result<()> {
        let was_dir = ist.raw.is_dir();
        self.delalloc_discard(inode.ino, ist, 0);
        if ist.orphaned {
            self.orphan_del(h, inode, ist)?;
        }
        let freed = self
            .evict_blocks(h, inode, ist)
            .and_then(|()| self.xattr_free_all(h, inode.ino, ist));
        if let Err(e) = freed {
            return Err(self.abandon_txn(e, inode.ino, "delete_inode"));
        }
        ist.raw.set_dtime(self.now().sec as u32);
        ist.raw.set_size(0);
        self.mark_inode_dirty(h, inode, ist)?;
        ist.deleted = true;
        self.free_inode(h, inode.ino, was_dir)
    }

    /// Releases every data and tree block of an inode.
    pub(crate) fn evict_blocks(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        ist: &mut InodeState,
    ) -> Result<()> {
        if Self::has_data_blocks(&ist.raw) {
            self.ext_remove(h, inode.ino, ist, 0, 1u64 << 32)?;
        }
        Ok(())
    }

    /// Whether the inode's i_block holds a block mapping (not a fast symlink or device number).
    pub(crate) fn has_data_blocks(raw: &RawInode) -> bool {
        if Self::is_inline(raw) {
            return false;
        }
        match raw.file_type() {
            S_IFREG | S_IFDIR => true,
            S_IFLNK => !Self::is_fast_symlink(raw),
            _ => false,
        }
    }

    pub(crate) fn is_fast_symlink(raw: &RawInode) -> bool {
        raw.is_symlink() && raw.flags() & FL_EXTENTS == 0 && raw.size() < I_BLOCK_SIZE as u64 && {
            // i_blocks counts an xattr block too; a fast symlink has no data blocks.
            let xattr_sectors = if raw.file_acl() != 0 { 1 } else { 0 };
            raw.blocks_lo() as u64 <= xattr_sectors * 8 || raw.blocks_lo() == 0
        }
    }

    /// The target of the symbolic link `ino`.
    ///
    /// # Errors
    /// [`Error::Invalid`](crate::Error::Invalid) when `ino` is not a symbolic link.
    pub fn readlink(&self, ino: u32) -> Result<Vec<u8>> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let inode = self.iget(ino)?;
        // A symlink whose last name went and that is being freed (`dying`, in pieces: its
        // target may be gone already) is no longer there, as an open finds it.
        use crate::inode::freed;
        let size = {
            let st = inode.state.lock();
            if freed(&st) {
                return Err(Error::NotFound);
            }
            if !st.raw.is_symlink() {
                return Err(Error::Invalid("not a symbolic link".into()));
            }
            let size = st.raw.size();
            if Self::is_fast_symlink(&st.raw) {
                let disk = st.raw.i_block()[..size as usize].to_vec();
                drop(st);
                return self.symlink_shown(ino, disk);
            }
            size
        };
        if size > self.geo.block_size as u64 {
            return Err(Error::corrupt(
                Corruption::Inode,
                format!("inode {ino}: symlink size {size} exceeds a block"),
            ));
        }
        let mut buf = vec![0u8; size as usize];
        let n = self.read(ino, 0, &mut buf)?;
        buf.truncate(n);
        // Freed while its block was read: what was read may be the freed block's.
        if freed(&inode.state.lock()) {
            return Err(Error::NotFound);
        }
        self.symlink_shown(ino, buf)
    }

    /// The target a symlink shows: decrypted with its key, its no-key form without.
    fn symlink_shown(&self, ino: u32, disk: Vec<u8>) -> Result<Vec<u8>> {
        if !self.crypt_enabled {
            return Ok(disk);
        }
        match self.crypt_of(ino)? {
            crate::encrypt::Crypt::Plain => Ok(disk),
            crate::encrypt::Crypt::Key(k) => Ok(k.decrypt_symlink(&disk)?),
            crate::encrypt::Crypt::NoKey(_) => Ok(crate::crypto::nokey_name(
                crate::crypto::symlink::symlink_ciphertext(&disk)?,
                None,
            )),
        }
    }

    /// Calls `f` with each entry of directory `dir` from cookie `offset` on, until it returns
    /// false. `f` runs with the directory's locks held: it must not call back into this
    /// filesystem (collect the entries, then act on them, as the FUSE server and the tools do).
    pub fn readdir(
        &self,
        dir: u32,
        offset: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        let d = self.dir_inode(dir)?;
        let _g = d.io_lock.read();
        let mut st = d.state.lock();
        if st.raw.links_count() == 0 {
            return Ok(());
        }
        let crypt = self.crypt(dir, &mut st)?;
        if matches!(crypt, crate::encrypt::Crypt::Plain) {
            self.dir_iter(dir, &mut st, offset, &mut |next, ino, kind, name, _| {
                f(DirEntry {
                    ino,
                    kind,
                    name: name.to_vec(),
                    next_offset: next,
                })
            })?;
        } else {
            // Names decrypted, or no-key names with the dirhash where ext4's readdir has
            // one (its hash-tree readdir: indexed, one-block or inline directories), or the
            // hash the entry stores (encrypted casefolded directories, linear ones too).
            let version = self.nokey_hash_version(dir, &mut st)?;
            let mut failed = None;
            let mut each = |next, ino, kind, name: &[u8], stored: Option<(u32, u32)>| {
                let hash = || stored.or_else(|| version.map(|v| self.name_hash(name, v)));
                match self.shown_name(&crypt, name, hash) {
                    Ok(name) => f(DirEntry {
                        ino,
                        kind,
                        name,
                        next_offset: next,
                    }),
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                }
            };
            self.dir_iter(dir, &mut st, offset, &mut each)?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        drop(st);
        // As the kernel's iterate_dir: a listing is an access.
        self.file_accessed(&d);
        Ok(())
    }

    /// Directory `dir` and its ancestors up to the root, by '..' (with the rename lock held,
    /// so that no directory moves meanwhile).
    fn ancestry(&self, mut dir: u32) -> Result<Vec<u32>> {
        let mut chain = vec![dir];
        while dir != ROOT_INO {
            let d = self.iget(dir)?;
            let mut st = d.state.lock();
            let parent = self
                .dir_lookup(dir, &mut st, b"..")?
                .map(|p| p.0)
                .unwrap_or(ROOT_INO);
            drop(st);
            if chain.len() > 65536 {
                return Err(Error::corrupt(
                    Corruption::Directory,
                    format!("directory {dir}: '..' chain does not reach the root"),
                ));
            }
            chain.push(parent);
            dir = parent;
        }
        Ok(chain)
    }

    /// Opens an inode: counts it so that an unlink keeps it until the last release.
    pub fn open(&self, ino: u32) -> Result<()> {
        let inode = self.iget(ino)?;
        if self.crypt_enabled {
            // fscrypt_file_open: a regular file's contents need its key.
            let mut st = inode.state.lock();
            if st.raw.file_type() == crate::format::inode::S_IFREG {
                self.crypt(ino, &mut st)?.require()?;
            }
        }
        inode.open_count.fetch_add(1, Ordering::AcqRel);
        // A last unlink that read the count before it went up has freed the inode (under its
        // state lock), or is freeing it in pieces; counted on a freed inode, the open's
        // release would land on whatever inode reuses the number.
        let gone = crate::inode::freed(&inode.state.lock());
        if gone {
            inode.open_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// Whether an inode is open, or pinned by a front end that may still ask for it (a FUSE
    /// kernel's cached inode: a process's working directory, or one whose stat is on its
    /// way): either keeps an unlinked inode alive, as the kernel's ext4 keeps it until its
    /// last iput. Asked with the inode's state lock held (the pin lock is a leaf).
    pub(crate) fn held(&self, inode: &Inode) -> bool {
        inode.open_count.load(Ordering::Acquire) > 0 || self.pinned.lock().contains(&inode.ino)
    }

    /// Closes an inode; the last close of an unlinked inode frees it.
    pub fn release(&self, ino: u32) -> Result<()> {
        let Some(inode) = self.icache.get_cached(ino) else {
            return Ok(());
        };
        // A release without an open (a library caller's mistake) changes nothing.
        let Ok(prev) = inode
            .open_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
        else {
            return Ok(());
        };
        if prev == 1 {
            let orphaned = inode.state.lock().orphaned;
            if orphaned && !self.is_read_only() {
                self.delete_orphan(&inode)?;
            }
        }
        Ok(())
    }
}

/// Fails with NotFound if directory `d` has been removed (checked with its io_lock held, so
/// it stays so while the caller holds the lock), as the kernel refuses entries in a dead
/// directory.
/// `mode` with file type `ft` when it names none.
fn with_type(mode: u32, ft: u16) -> u32 {
    if mode & S_IFMT as u32 == 0 {
        mode | ft as u32
    } else {
        mode
    }
}

fn check_dir_live(d: &Inode) -> Result<()> {
    let st = d.state.lock();
    if st.deleted || st.raw.links_count() == 0 {
        return Err(Error::NotFound);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
