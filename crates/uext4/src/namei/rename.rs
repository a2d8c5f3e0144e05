//! rename and renameat2: its flags (NOREPLACE, EXCHANGE, WHITEOUT), the lock order of the two
//! directories, the checks on both names, and the two ways a rename changes them (swapping
//! two names, or moving one name over another or into a free slot).

use super::{check_dir_live, check_name, dec_nlink, inc_nlink, is_dot, FT_CHRDEV, FT_DIR};
use crate::error::{Error, Result};
use crate::format::inode::*;
use crate::fs::Fs;
use crate::inode::{encode_rdev, Inode, InodeRef};
use crate::transaction::{credits, Handle};
use parking_lot::RwLockWriteGuard;
use std::sync::atomic::Ordering;

/// renameat2's flags, as the kernel numbers them.
pub const RENAME_NOREPLACE: u32 = 1;
/// renameat2 flag: swap the two names.
pub const RENAME_EXCHANGE: u32 = 2;
/// renameat2 flag: leave a whiteout at the old name.
pub const RENAME_WHITEOUT: u32 = 4;

/// How `rename` treats the names (renameat2's flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with `Exists` if the new name exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: swap the two names (both must exist; either may be a directory).
    pub exchange: bool,
    /// RENAME_WHITEOUT: the source name is replaced, in the rename's transaction, by a
    /// whiteout (a character device 0/0 with mode 0, as the kernel's ext4 makes it for
    /// overlayfs) owned by this (uid, gid).
    pub whiteout: Option<(u32, u32)>,
}

impl RenameFlags {
    /// renameat2's flag bits; the whiteout, if asked for, is owned by `uid`/`gid`. Unknown
    /// bits, and EXCHANGE with NOREPLACE or WHITEOUT, are `Invalid` (EINVAL, as the kernel).
    pub fn from_bits(bits: u32, uid: u32, gid: u32) -> Result<RenameFlags> {
        let known = RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT;
        if bits & !known != 0 {
            return Err(Error::Invalid(format!(
                "rename: unknown flags {:#x}",
                bits & !known
            )));
        }
        let f = RenameFlags {
            noreplace: bits & RENAME_NOREPLACE != 0,
            exchange: bits & RENAME_EXCHANGE != 0,
            whiteout: (bits & RENAME_WHITEOUT != 0).then_some((uid, gid)),
        };
        f.check()?;
        Ok(f)
    }

    fn check(&self) -> Result<()> {
        if self.exchange && (self.noreplace || self.whiteout.is_some()) {
            return Err(Error::Invalid(
                "RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into(),
            ));
        }
        Ok(())
    }
}

/// The two directories of a rename and the names in them.
struct RenameDirs<'a> {
    odir: u32,
    oname: &'a [u8],
    od: &'a Inode,
    ndir: u32,
    nname: &'a [u8],
    nd: &'a Inode,
    /// The names are in two different directories.
    cross: bool,
    /// Each directory's chain of ancestors (empty unless `cross`).
    ochain: Vec<u32>,
    nchain: Vec<u32>,
}

/// What a rename found under its two names, with both directories locked.
struct RenameNames {
    sino: u32,
    sft: u8,
    /// The inode and file type the new name has now.
    target: Option<(u32, u8)>,
    src: InodeRef,
    src_is_dir: bool,
    tgt: Option<InodeRef>,
    tgt_is_dir: bool,
}

impl RenameDirs<'_> {
    /// The two directories' io_locks, an ancestor before its descendant (as rmdir takes a
    /// parent's before its child's, and the kernel's lock_rename does), otherwise in
    /// inode-number order. Inode-number order alone would let a rename from a child
    /// directory into its parent (child first) and an rmdir in that parent (parent first)
    /// wait for each other. The rename lock keeps the tree's shape still while this is
    /// decided.
    fn lock(&self) -> (RwLockWriteGuard<'_, ()>, Option<RwLockWriteGuard<'_, ()>>) {
        if !self.cross {
            return (self.od.io_lock.write(), None);
        }
        let old_first = if self.nchain.contains(&self.odir) {
            true
        } else if self.ochain.contains(&self.ndir) {
            false
        } else {
            self.odir < self.ndir
        };
        if old_first {
            let a = self.od.io_lock.write();
            (a, Some(self.nd.io_lock.write()))
        } else {
            let b = self.nd.io_lock.write();
            (b, Some(self.od.io_lock.write()))
        }
    }
}

impl Fs {
    /// The whiteout RENAME_WHITEOUT leaves under the old name: a character device 0/0 with
    /// mode 0 and one link (ext4_whiteout_for_rename), owned by the caller.
    fn new_whiteout(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        uid: u32,
        gid: u32,
        now: Timestamp,
    ) -> Result<InodeRef> {
        self.new_unnamed_inode(h, dir, S_IFCHR, uid, gid, now, |_, raw| encode_rdev(raw, 0))
    }

    /// Renames `oname` in `odir` to `nname` in `ndir`, as `renameat2(2)` with `flags` (replacing
    /// what `nname` names unless told not to).
    ///
    /// # Errors
    /// [`Error::Exists`](crate::Error::Exists) with `RENAME_NOREPLACE`;
    /// [`Error::Loop`](crate::Error::Loop) for a directory moved below itself;
    /// [`Error::NotEmpty`](crate::Error::NotEmpty), [`Error::IsDir`](crate::Error::IsDir),
    /// [`Error::NotDir`](crate::Error::NotDir) as rename(2).
    pub fn rename(
        &self,
        odir: u32,
        oname: &[u8],
        ndir: u32,
        nname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if self.crypt_enabled {
            self.may_rename_crypt(odir, oname, ndir, nname, flags.exchange)?;
        }
        let r = if flags.whiteout.is_some() {
            // The whiteout takes an inode: on ENOSPC with frees held back, retried as a create.
            self.retry_nospace(|| self.rename_inner(odir, oname, ndir, nname, flags))
        } else {
            self.rename_inner(odir, oname, ndir, nname, flags)
        };
        // A replaced file too large to free in the rename's handle is freed now.
        self.delete_deferred();
        r?;
        self.sync_if_flagged(odir, true)?;
        if ndir != odir {
            self.sync_if_flagged(ndir, true)?;
        }
        Ok(())
    }

    fn rename_inner(
        &self,
        odir: u32,
        oname: &[u8],
        ndir: u32,
        nname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        check_name(oname)?;
        check_name(nname)?;
        if is_dot(oname) || is_dot(nname) {
            return Err(Error::Busy);
        }
        flags.check()?;
        self.check_writable()?;
        let cross = odir != ndir;
        let _rl = if cross {
            Some(self.rename_lock.lock())
        } else {
            None
        };
        let od = self.dir_inode(odir)?;
        let nd = if cross {
            self.dir_inode(ndir)?
        } else {
            od.clone()
        };
        // Each directory's chain of ancestors, walked once: the lock order, the subtree check
        // and the ancestor-target check below all read them.
        let (ochain, nchain) = if cross {
            (self.ancestry(odir)?, self.ancestry(ndir)?)
        } else {
            (Vec::new(), Vec::new())
        };
        let d = RenameDirs {
            odir,
            oname,
            od: &od,
            ndir,
            nname,
            nd: &nd,
            cross,
            ochain,
            nchain,
        };
        let (_g1, _g2) = d.lock();
        let Some(n) = self.rename_names(&d, flags)? else {
            return Ok(()); // both names are links to one inode: POSIX says do nothing
        };
        // The inode a name is replaced over may be freed below: its io_lock is held to the
        // end, as unlink holds the victim's, and taken before the handle starts (lock rank:
        // io_locks before the transaction barrier; taken after it, a commit waiting for this
        // handle and a writeback holding this lock while starting a handle would wait for
        // each other).
        let victim = if flags.exchange { None } else { n.tgt.clone() };
        let mut _tg = None;
        if let Some(t) = &victim {
            _tg = self.rename_victim(&d, &n, t)?;
        }
        let mut h = self.start(if flags.whiteout.is_some() {
            credits::RENAME + credits::CREATE
        } else {
            credits::RENAME
        })?;
        let now = self.now();
        if flags.exchange {
            return self.rename_exchange(&mut h, &d, n, now);
        }
        self.rename_move(&mut h, &d, n, flags, now)
    }

    /// The source and target of a rename, looked up in the locked directories and checked
    /// against the flags and the tree's shape; `None` when both names are one inode's.
    fn rename_names(&self, d: &RenameDirs<'_>, flags: RenameFlags) -> Result<Option<RenameNames>> {
        // Either directory may have been removed between its lookup and its lock (an rmdir
        // holds its parent's lock, not ours): nothing may be added to a removed directory,
        // whose blocks and number are free for reuse.
        check_dir_live(d.od)?;
        check_dir_live(d.nd)?;
        let Some((sino, sft)) = self.find(d.od, d.oname)? else {
            return Err(Error::NotFound);
        };
        let target = self.find(d.nd, d.nname)?;
        if flags.exchange && target.is_none() {
            return Err(Error::NotFound);
        }
        if flags.noreplace && target.is_some() {
            return Err(Error::Exists);
        }
        let src = self.iget(sino)?;
        let src_is_dir = src.state.lock().raw.is_dir();
        let tgt = match target {
            Some((tino, _)) => Some(self.iget(tino)?),
            None => None,
        };
        let tgt_is_dir = tgt
            .as_ref()
            .map(|t| t.state.lock().raw.is_dir())
            .unwrap_or(false);
        if src_is_dir {
            self.check_child_dir(d.odir, d.oname, &src)?;
        }
        if let Some(t) = tgt.as_ref().filter(|_| tgt_is_dir) {
            self.check_child_dir(d.ndir, d.nname, t)?;
        }
        if let Some((tino, _)) = target {
            if tino == sino {
                return Ok(None);
            }
        }
        // As may_delete and may_create: the source leaves its directory, a target is
        // replaced (or exchanged), and the new name is added.
        crate::flags::may_remove_entry(&d.od.state.lock().raw)?;
        crate::flags::may_change(&src.state.lock().raw)?;
        crate::flags::may_add_entry(&d.nd.state.lock().raw)?;
        if let Some(t) = &tgt {
            crate::flags::may_remove_entry(&d.nd.state.lock().raw)?;
            crate::flags::may_change(&t.state.lock().raw)?;
        }
        if d.cross {
            // A directory may not move into its own subtree.
            if src_is_dir && d.nchain.contains(&sino) {
                return Err(Error::Loop);
            }
            if flags.exchange && tgt_is_dir && d.ochain.contains(&target.unwrap().0) {
                return Err(Error::Loop);
            }
        }
        // Into a directory that passes on another project: EXDEV (ext4_rename and, for an
        // exchange, both ways as ext4_cross_rename).
        // (Copies of the directories' fields: two inodes' state locks are never held together.)
        let nd_raw = d.nd.state.lock().raw.clone();
        self.check_same_project(&nd_raw, &src.state.lock().raw)?;
        if let Some(t) = tgt.as_ref().filter(|_| flags.exchange) {
            let od_raw = d.od.state.lock().raw.clone();
            self.check_same_project(&od_raw, &t.state.lock().raw)?;
        }
        Ok(Some(RenameNames {
            sino,
            sft,
            target,
            src,
            src_is_dir,
            tgt,
            tgt_is_dir,
        }))
    }

    /// Checks the inode `t` a plain rename replaces (its type against the source's; a
    /// directory must be empty) and takes its io_lock unless it is one of the two directories,
    /// already locked.
    fn rename_victim<'t>(
        &self,
        d: &RenameDirs<'_>,
        n: &RenameNames,
        t: &'t Inode,
    ) -> Result<Option<RwLockWriteGuard<'t, ()>>> {
        if n.src_is_dir && !n.tgt_is_dir {
            return Err(Error::NotDir);
        }
        if !n.src_is_dir && n.tgt_is_dir {
            return Err(Error::IsDir);
        }
        // The target may be one of the two directories already locked (renaming over an
        // ancestor's own entry): do not lock it twice.
        let held = t.ino == d.odir || t.ino == d.ndir;
        // A target directory that holds the source's directory is not empty, and locking
        // it now (after that descendant) would invert the lock order.
        if n.tgt_is_dir && !held && d.cross && d.ochain.contains(&t.ino) {
            return Err(Error::NotEmpty);
        }
        let guard = (!held).then(|| t.io_lock.write());
        if n.tgt_is_dir {
            let mut tst = t.state.lock();
            if !self.dir_is_empty(t.ino, &mut tst)? {
                return Err(Error::NotEmpty);
            }
        }
        Ok(guard)
    }

    /// RENAME_EXCHANGE: each name points at the other's inode; moved directories get their
    /// new parent in "..", and the parents' link counts follow the directories.
    fn rename_exchange(
        &self,
        h: &mut Handle<'_>,
        d: &RenameDirs<'_>,
        n: RenameNames,
        now: Timestamp,
    ) -> Result<()> {
        let RenameNames {
            sino,
            sft,
            target,
            src,
            src_is_dir,
            tgt,
            tgt_is_dir,
        } = n;
        let (odir, ndir, cross) = (d.odir, d.ndir, d.cross);
        let t = tgt.unwrap();
        let (tino, tft) = target.unwrap();
        {
            let mut s = d.od.state.lock();
            self.dir_set(h, odir, &mut s, d.oname, tino, tft)?;
            s.raw.set_mtime(now);
            s.raw.set_ctime(now);
            if cross && src_is_dir != tgt_is_dir {
                if tgt_is_dir {
                    inc_nlink(&mut s.raw)?;
                } else {
                    dec_nlink(&mut s.raw);
                }
            }
            self.mark_inode_dirty(h, d.od, &mut s)?;
        }
        {
            let mut s = d.nd.state.lock();
            self.dir_set(h, ndir, &mut s, d.nname, sino, sft)?;
            if cross {
                s.raw.set_mtime(now);
                s.raw.set_ctime(now);
                if src_is_dir != tgt_is_dir {
                    if src_is_dir {
                        inc_nlink(&mut s.raw)?;
                    } else {
                        dec_nlink(&mut s.raw);
                    }
                }
            }
            self.mark_inode_dirty(h, d.nd, &mut s)?;
        }
        for (node, newparent, is_dir) in [(&src, ndir, src_is_dir), (&t, odir, tgt_is_dir)] {
            let mut s = node.state.lock();
            if cross && is_dir {
                self.dir_set(h, node.ino, &mut s, b"..", newparent, FT_DIR)?;
            }
            s.raw.set_ctime(now);
            self.mark_inode_dirty(h, node, &mut s)?;
        }
        Ok(())
    }

    /// Plain rename: point (or add) the new name at the source, then remove the old name
    /// (or, with RENAME_WHITEOUT, point it at a new whiteout, as ext4_rename does); a replaced
    /// inode loses the link.
    fn rename_move(
        &self,
        h: &mut Handle<'_>,
        d: &RenameDirs<'_>,
        n: RenameNames,
        flags: RenameFlags,
        now: Timestamp,
    ) -> Result<()> {
        let RenameNames {
            sino,
            sft,
            target,
            src,
            src_is_dir,
            tgt,
            tgt_is_dir,
        } = n;
        let (odir, ndir, cross) = (d.odir, d.ndir, d.cross);
        let fc_names = !src_is_dir && flags.whiteout.is_none() && h.fc_tracked();
        let whiteout = match flags.whiteout {
            Some((uid, gid)) => Some(self.new_whiteout(h, odir, uid, gid, now)?),
            None => None,
        };
        let mut replaced: Option<InodeRef> = None;
        let nflags = {
            let mut s = d.nd.state.lock();
            let set = if target.is_some() {
                self.dir_set(h, ndir, &mut s, d.nname, sino, sft)
                    .map(|_| ())
            } else {
                self.dir_add(h, ndir, &mut s, d.nname, sino, sft)
            };
            if let Err(e) = set {
                drop(s);
                if let Some(w) = &whiteout {
                    self.discard_new_inode(h, w, false)?;
                }
                return Err(e);
            }
            if target.is_some() {
                replaced = tgt;
            }
            if src_is_dir && cross && replaced.is_none() {
                inc_nlink(&mut s.raw)?;
            }
            if src_is_dir && replaced.is_some() && !cross {
                // the replaced directory's ".." link to this parent goes away
                dec_nlink(&mut s.raw);
            }
            s.raw.set_mtime(now);
            s.raw.set_ctime(now);
            self.mark_inode_dirty(h, d.nd, &mut s)?;
            s.raw.flags()
        };
        let oflags = {
            let mut s = d.od.state.lock();
            match &whiteout {
                Some(w) => {
                    self.dir_set(h, odir, &mut s, d.oname, w.ino, FT_CHRDEV)?;
                }
                None => {
                    self.dir_remove(h, odir, &mut s, d.oname)?;
                }
            }
            if src_is_dir && cross {
                dec_nlink(&mut s.raw);
            }
            s.raw.set_mtime(now);
            s.raw.set_ctime(now);
            self.mark_inode_dirty(h, d.od, &mut s)?;
            s.raw.flags()
        };
        {
            let mut s = src.state.lock();
            if src_is_dir && cross {
                self.dir_set(h, sino, &mut s, b"..", ndir, FT_DIR)?;
            }
            s.raw.set_ctime(now);
            self.mark_inode_dirty(h, &src, &mut s)?;
        }
        if let Some(t) = replaced {
            let mut ts = t.state.lock();
            if tgt_is_dir {
                ts.raw.set_links_count(0);
            } else {
                dec_nlink(&mut ts.raw);
            }
            ts.raw.set_ctime(now);
            if fc_names {
                self.fc_track_unlink(h, ndir, nflags, d.nname, t.ino, &ts);
            }
            self.drop_link_finish(h, &t, &mut ts)?;
        }
        // As ext4_rename: the replaced name's UNLINK first, then the source's LINK under
        // the new name and UNLINK of the old (its INODE record with them). A directory
        // moved or a whiteout left is not described: the handle stays undeclared, so the
        // transaction commits in full (the kernel's EXT4_FC_REASON_RENAME_DIR).
        if fc_names {
            let s = src.state.lock();
            self.fc_track_link(h, ndir, nflags, d.nname, sino, &s);
            self.fc_track_unlink(h, odir, oflags, d.oname, sino, &s);
        }
        Ok(())
    }
}
