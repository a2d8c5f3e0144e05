//! Requests about names, attributes and extended attributes, and opens.

use super::*;

impl Uext4Fuse {
    /// LOOKUP. The kernel asks for "." and ".." only to decode a file handle
    /// (open_by_handle_at, an NFS export, overlayfs's index) whose inode it no longer
    /// caches: "." under the handle's node id (which may name any kind of inode, one the
    /// kernel has forgotten), ".." under a directory's node id for its parent. Either
    /// answer is a lookup the kernel will forget, like any other.
    pub(super) fn lookup(&self, nodeid: u64, name: &[u8], out: &mut [u8]) -> Reply {
        let dir = to_ext(nodeid);
        if name == b"." {
            let a = self.by_handle(nodeid)?;
            return self.entry(dir, Ok(a), out);
        }
        match self.fs.lookup(dir, name) {
            // Kept by the kernel as a negative entry: a program that probes for files that
            // are not there (an interpreter's imports, a compiler's include path, PATH)
            // asks once per entry timeout. Every change of names comes through the kernel, which
            // replaces the entry itself (but for other spellings in a casefolded directory:
            // `ttl_in`).
            Err(Error::NotFound) => Ok(reply::negative_entry(out, self.ttl_in(dir).entry)),
            r => self.entry(dir, r, out),
        }
    }

    /// The inode a file handle's node id names, read from the image if need be, or ESTALE
    /// where no such inode is in use, as the kernel's ext4 answers (`ext4_nfs_get_inode`):
    /// numbers out of range, reserved inodes other than the root, free inodes, and inodes
    /// with no links left (an open one is still in the kernel's cache and never asked for
    /// here). The kernel compares the generation with the handle's itself.
    fn by_handle(&self, nodeid: u64) -> Result<Attr, i32> {
        let g = &self.fs.geo;
        let ino = u32::try_from(nodeid).map_err(|_| libc::ESTALE)?;
        let ino = to_ext(ino as u64);
        // Node ids are inode numbers, but the root's is 1: its inode number is no node id.
        let valid = to_fuse(ino) == nodeid
            && (ino == self.fs.root_ino() || (ino >= g.first_ino && ino <= g.inodes_count));
        if !valid {
            return Err(libc::ESTALE);
        }
        match self.fs.getattr(ino) {
            Ok(a) if a.nlink == 0 => Err(libc::ESTALE),
            Ok(a) => Ok(a),
            Err(Error::NotFound) => Err(libc::ESTALE),
            Err(e) => Err(errno(&e)),
        }
    }

    /// `fh`: the open file the kernel asks for (FUSE_GETATTR_FH). With writeback_cache that
    /// is how a write(2) starts: it gets ENOSPC here once the space outside the write-cache
    /// reserve is gone (`cached_write_refused`).
    pub(super) fn getattr(&self, ino: u32, fh: Option<u64>, out: &mut [u8]) -> Reply {
        if fh.is_some_and(|fh| self.cached_write_refused(fh)) {
            return Err(libc::ENOSPC);
        }
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        Ok(reply::attr(out, self.attr_ttl(), &wire_attr(&a)))
    }

    /// STATX: the attributes and the birth time, where the inode has room for one (inodes
    /// of 128 bytes have none, as on the kernel's ext4).
    pub(super) fn statx(&self, ino: u32, out: &mut [u8]) -> Reply {
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        let mut mask = abi::STATX_BASIC_STATS;
        if self.fs.geo.inode_size > 128 {
            mask |= abi::STATX_BTIME;
        }
        // stx_attributes from the inode flags, as ext4_getattr fills them.
        const FLAG_ATTRS: [(u32, u64); 6] = [
            (0x0000_0004, 0x4),       // COMPR_FL: STATX_ATTR_COMPRESSED
            (0x0000_0010, 0x10),      // IMMUTABLE_FL: STATX_ATTR_IMMUTABLE
            (0x0000_0020, 0x20),      // APPEND_FL: STATX_ATTR_APPEND
            (0x0000_0040, 0x40),      // NODUMP_FL: STATX_ATTR_NODUMP
            (0x0000_0800, 0x800),     // ENCRYPT_FL: STATX_ATTR_ENCRYPTED
            (0x0010_0000, 0x10_0000), // VERITY_FL: STATX_ATTR_VERITY
        ];
        let attrs = FLAG_ATTRS
            .iter()
            .filter(|(f, _)| a.flags & f != 0)
            .fold(0, |acc, (_, s)| acc | s);
        let attrs_mask = FLAG_ATTRS.iter().fold(0, |acc, (_, s)| acc | s);
        Ok(reply::statx(
            out,
            self.attr_ttl(),
            &wire_attr(&a),
            mask,
            (attrs, attrs_mask),
        ))
    }

    pub(super) fn setattr(&self, h: &InHeader, ino: u32, s: &SetattrIn, out: &mut [u8]) -> Reply {
        let conv = |t: TimeArg| match t {
            TimeArg::Now => TimeSet::Now,
            TimeArg::At(sec, nsec) => TimeSet::At(timestamp((sec, nsec))),
        };
        let set = SetAttr {
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            atime: s.atime.map(conv),
            mtime: s.mtime.map(conv),
            ctime: s.ctime.filter(|_| !self.kernel_ctime(s)).map(timestamp),
            crtime: None,
        };
        let chown = s.uid.is_some() || s.gid.is_some();
        let killpriv = self.killpriv.load(Ordering::Relaxed);
        // With HANDLE_KILLPRIV_V2 the engine takes set-ID bits and capabilities away on
        // chown and truncate. A truncate's privilege is the kernel's word: it sets
        // FATTR_KILL_SUIDGID when the caller lacks CAP_FSETID. A chown's is "uid 0" (the
        // kernel flags every chown of a file alike), and set-group-ID stays on a file that is
        // not group-executable when the caller is privileged or in its group:
        // `Self::setid_cred`. Nothing else asks who the caller is. Without KILLPRIV_V2 the
        // kernel sends the mode a chown leaves; the engine's rule covers a kernel that sends
        // none for a non-root caller.
        let cred = if chown && killpriv {
            self.setid_cred(h, ino)
        } else if chown {
            self.cred(h)
        } else if s.size.is_some() && killpriv {
            Cred {
                privileged: !s.kill_suidgid,
                ..self.header_cred(h)
            }
        } else if s.size.is_some() {
            self.cred(h)
        } else {
            self.header_cred(h)
        };
        let r = if killpriv || (chown && !cred.privileged) {
            self.fs.setattr_as(&cred, ino, &set)
        } else {
            self.fs.setattr(ino, &set)
        };
        let a = match r {
            Err(e) => self.setattr_fallback(ino, s).ok_or_else(|| errno(&e))?,
            Ok(a) => a,
        };
        Ok(reply::attr(out, self.attr_ttl(), &wire_attr(&a)))
    }

    pub(super) fn readlink(&self, ino: u32, out: &mut [u8]) -> Reply {
        let t = self.fs.readlink(ino).map_err(|e| errno(&e))?;
        if t.len() > out.len() {
            return Err(libc::ENAMETOOLONG);
        }
        Ok(reply::data(out, &t))
    }

    /// RENAME and RENAME2 (NOREPLACE, EXCHANGE, WHITEOUT, as the engine offers them).
    pub(super) fn rename(
        &self,
        h: &InHeader,
        dir: u32,
        name: &[u8],
        newdir: u32,
        newname: &[u8],
        flags: u32,
    ) -> Reply {
        // A whiteout is owned as a new node in the source directory would be.
        let (uid, gid) = if flags & libc::RENAME_WHITEOUT != 0 {
            self.fs
                .owner_in(&self.cred(h), dir)
                .map_err(|e| errno(&e))?
        } else {
            (0, 0)
        };
        let f = uext4::RenameFlags::from_bits(flags, uid, gid).map_err(|e| errno(&e))?;
        empty(self.fs.rename(dir, name, newdir, newname, f))
    }

    pub(super) fn open(&self, ino: u32, flags: u32, out: &mut [u8]) -> Reply {
        // `-o noopen`: the kernel opens files by itself from now on (`no_open`).
        if self.no_open.load(Ordering::Relaxed) {
            return Err(libc::ENOSYS);
        }
        // Immutable and append-only files: the kernel keeps no inode flags for FUSE, so its
        // may_open cannot refuse a write open of one; the engine does, as the kernel's would.
        self.fs
            .check_open(ino, flags as i32)
            .map_err(|e| errno(&e))?;
        self.fs.open(ino).map_err(|e| errno(&e))?;
        let fh = self.new_fh(flags);
        if fh & 1 == 1 && self.near_full() {
            // Attributes cached from an earlier lookup would let its first write(2) skip the
            // GETATTR that can refuse it.
            self.forget_attrs(ino);
        }
        let mut open_flags = self.open_flags(ino, flags);
        if self.uncached_open(ino) {
            open_flags |= abi::FOPEN_DIRECT_IO;
        }
        Ok(reply::open(out, fh, open_flags))
    }

    /// OPENDIR, where the kernel still sends it. Where it may do without (it offered
    /// FUSE_NO_OPENDIR_SUPPORT), the first OPENDIR is answered ENOSYS and the kernel sends
    /// none again, nor RELEASEDIR: two round trips fewer for every directory a walk lists.
    /// It then keeps listings (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, its default for
    /// directories without OPENDIR) until the directory changes. What OPENDIR gave besides is
    /// kept another way: a directory removed while open stays usable through its descriptor
    /// because the kernel holds its inode until FORGET (`Fs::held`); and atime, which only a
    /// READDIR that reaches the engine updates, is due under relatime only after a change,
    /// which drops the kept listing, or after 24 hours, which a listing kept that long misses
    /// (under strictatime OPENDIR stays).
    pub(super) fn opendir(&self, ino: u32, out: &mut [u8]) -> Reply {
        if self.no_opendir.load(Ordering::Relaxed) {
            return Err(libc::ENOSYS);
        }
        // Counted open, as a file's open is: a directory removed (rmdir, or a rename over
        // it) while open stays usable through its descriptor until releasedir (fstat shows
        // link count 0, fchmod and fsetxattr work), as on the kernel's ext4.
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        if !a.is_dir() {
            return Err(libc::ENOTDIR);
        }
        self.fs.open(ino).map_err(|e| errno(&e))?;
        // The kernel may cache listings; it drops them itself when it changes the
        // directory (all changes come through it). Not while the directory's atime is due:
        // only a READDIR that reaches the engine updates it.
        let keep = if self.fs.atime_due(ino) {
            0
        } else {
            abi::FOPEN_KEEP_CACHE
        };
        Ok(reply::open(out, 0, abi::FOPEN_CACHE_DIR | keep))
    }

    /// STATFS of the node the caller named: a project directory reports its quota.
    pub(super) fn statfs(&self, ino: u32, out: &mut [u8]) -> Reply {
        let s = self.fs.statfs_of(ino).map_err(|e| errno(&e))?;
        let k = reply::Kstatfs {
            blocks: s.blocks,
            bfree: s.blocks_free,
            bavail: s.blocks_avail,
            files: s.files,
            ffree: s.files_free,
            bsize: s.block_size,
            namelen: s.name_max,
            frsize: s.block_size,
        };
        Ok(reply::statfs(out, &k))
    }

    pub(super) fn setxattr(
        &self,
        h: &InHeader,
        ino: u32,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Reply {
        let flags = flags as i32;
        let f = if flags & libc::XATTR_CREATE != 0 {
            uext4::XattrFlags::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            uext4::XattrFlags::Replace
        } else {
            uext4::XattrFlags::Any
        };
        // Only an access ACL asks who the caller is (whether set-group-ID stays).
        let cred = if name == b"system.posix_acl_access" {
            self.setid_cred(h, ino)
        } else {
            self.header_cred(h)
        };
        let before = self.fs.getattr(ino).ok();
        let r = empty(self.fs.setxattr_as(&cred, ino, name, value, f));
        self.attrs_moved(ino, before);
        r
    }

    /// REMOVEXATTR; the attributes it may move (a freed xattr block) are dropped from the
    /// kernel's cache (`attrs_moved`).
    pub(super) fn removexattr(&self, ino: u32, name: &[u8]) -> Reply {
        let before = self.fs.getattr(ino).ok();
        let r = empty(self.fs.removexattr(ino, name));
        self.attrs_moved(ino, before);
        r
    }

    /// RELEASE of a file. Without OPEN (`no_open`) nothing counted the file's opens.
    pub(super) fn release(&self, ino: u32) -> Reply {
        if self.no_open.load(Ordering::Relaxed) {
            return Ok(0);
        }
        empty(self.fs.release(ino))
    }

    /// A value, its size when asked with size 0, or ERANGE when it does not fit.
    fn sized(v: &[u8], size: u32, out: &mut [u8]) -> Reply {
        if size == 0 {
            Ok(reply::xattr_size(out, v.len() as u32))
        } else if v.len() > size as usize || v.len() > out.len() {
            Err(libc::ERANGE)
        } else {
            Ok(reply::data(out, v))
        }
    }

    pub(super) fn getxattr(&self, ino: u32, name: &[u8], size: u32, out: &mut [u8]) -> Reply {
        let v = if ino == 2 && name == STATS_XATTR {
            // The engine's counters, and the requests that reached them.
            let mut j = self.fs.stats_json();
            if j.ends_with('}') {
                j.pop();
                j.push_str(&format!(", \"fuse_requests\": {}}}", self.requests.json()));
            }
            Ok(j.into_bytes())
        } else if ino == 2 && name == SERVER_XATTR {
            Ok(std::process::id().to_string().into_bytes())
        } else {
            self.fs.getxattr(ino, name)
        };
        Self::sized(&v.map_err(|e| errno(&e))?, size, out)
    }

    pub(super) fn listxattr(&self, ino: u32, size: u32, out: &mut [u8]) -> Reply {
        let names = self.fs.listxattr(ino).map_err(|e| errno(&e))?;
        let mut buf = Vec::new();
        for n in names {
            buf.extend_from_slice(&n);
            buf.push(0);
        }
        Self::sized(&buf, size, out)
    }

    pub(super) fn access(&self, h: &InHeader, ino: u32, mask: u32) -> Reply {
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        // With default_permissions the kernel checks the mode bits itself and never asks.
        let want = mask & 7;
        if self.opts.default_permissions || want == 0 {
            return Ok(0);
        }
        let mode = a.mode as u32;
        let cred = self.cred(h);
        let ok = if cred.privileged {
            // Root may do anything but execute a file nobody may execute.
            want & 1 == 0 || a.is_dir() || mode & 0o111 != 0
        } else {
            let bits = if cred.uid == a.uid {
                mode >> 6
            } else if cred.in_group(a.gid) {
                mode >> 3
            } else {
                mode
            } & 7;
            bits & want == want
        };
        if ok {
            Ok(0)
        } else {
            Err(libc::EACCES)
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn create(
        &self,
        h: &InHeader,
        dir: u32,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: u32,
        out: &mut [u8],
    ) -> Reply {
        let (cred, umask) = (self.cred(h), self.umask(umask));
        let a = match self.fs.create_as(&cred, dir, name, mode, umask) {
            Ok(a) => a,
            // Created meanwhile by someone else: open it as open(2) would, O_TRUNC included.
            Err(Error::Exists) if flags as i32 & libc::O_EXCL == 0 => {
                let found = self.fs.lookup(dir, name).and_then(|a| {
                    if a.is_dir() {
                        return Err(Error::IsDir);
                    }
                    // Immutable and append-only files, as OPEN refuses them.
                    self.fs.check_open(a.ino, flags as i32)?;
                    if flags as i32 & libc::O_TRUNC != 0
                        && a.size != 0
                        && a.mode & S_IFMT == 0o100000
                    {
                        self.fs.truncate(a.ino, 0)?;
                        return self.fs.getattr(a.ino);
                    }
                    Ok(a)
                });
                found.map_err(|e| errno(&e))?
            }
            Err(e) => return Err(errno(&e)),
        };
        // Under `noopen` no RELEASE may come for it: only the lookup pin holds it.
        if !self.no_open.load(Ordering::Relaxed) {
            self.fs.open(a.ino).map_err(|e| errno(&e))?;
        }
        self.opened(dir, &a, flags, out)
    }

    /// O_TMPFILE: an inode with no name, opened once (its release frees it unless a LINK
    /// named it meanwhile), owned and moded as a create in `dir` would be.
    pub(super) fn tmpfile(
        &self,
        h: &InHeader,
        dir: u32,
        mode: u32,
        umask: u32,
        flags: u32,
        out: &mut [u8],
    ) -> Reply {
        let (cred, umask) = (self.cred(h), self.umask(umask));
        let a = self
            .fs
            .tmpfile_as(&cred, dir, mode, umask)
            .map_err(|e| errno(&e))?;
        let r = self.opened(dir, &a, flags, out);
        if self.no_open.load(Ordering::Relaxed) {
            // No RELEASE will close the engine's open: the lookup pin `opened` took keeps
            // the nameless inode until the kernel forgets it.
            let _ = self.fs.release(a.ino);
        }
        r
    }

    /// The reply to a CREATE or TMPFILE: the entry (a lookup the kernel now holds) and the
    /// open file.
    fn opened(&self, dir: u32, a: &Attr, flags: u32, out: &mut [u8]) -> Reply {
        self.counted(a);
        let fh = self.new_fh(flags);
        // Near full, the kernel keeps the new file's attributes for no time, so its first
        // write(2) asks (GETATTR with the handle) and can be refused.
        let mut ttl = self.ttl_in(dir);
        if self.near_full() {
            ttl.attr = Duration::ZERO;
        }
        Ok(reply::create(
            out,
            a.generation as u64,
            ttl,
            &wire_attr(a),
            fh,
            self.open_flags(a.ino, flags),
        ))
    }
}
