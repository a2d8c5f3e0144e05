//! Data requests (read, write, fallocate, copy_file_range, ioctl) and directory listings.

use super::*;

/// chattr's append-only and immutable flags (the inode's i_flags).
const FL_APPEND: u32 = 0x20;
const FL_IMMUTABLE: u32 = 0x10;

impl Uext4Fuse {
    /// Reads straight into the reply (the kernel asks for at most max_pages pages, which the
    /// transport's buffer holds).
    pub(super) fn read(&self, ino: u32, offset: u64, size: u32, out: &mut [u8]) -> Reply {
        let n = (size as usize).min(out.len());
        self.fs
            .read(ino, offset, &mut out[..n])
            .map_err(|e| errno(&e))
    }

    pub(super) fn write(
        &self,
        h: &InHeader,
        ino: u32,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        out: &mut [u8],
    ) -> Reply {
        // A write from the page cache (writeback_cache, or a shared mapping's pages) is
        // whole or an error: the kernel's writeback takes a short count for the whole
        // request and marks its pages clean, so the rest would be lost without an error for
        // fsync to report. A program's own write may come back short, as pwrite(2) does.
        let kill = write_flags & abi::FUSE_WRITE_KILL_SUIDGID != 0;
        let cred = self.data_cred(h, ino, Some(kill));
        let cached = write_flags & abi::FUSE_WRITE_CACHE != 0;
        if cached && self.fs.cache_reserve() > 0 {
            // Data the kernel already accepted: it may take the reserve kept for it.
            let r = self
                .fs
                .cache_writeback(|| self.write_as_asked(&cred, ino, offset, data, true));
            if self.near_full() {
                self.forget_attrs(ino);
            }
            return r.map(|n| reply::written(out, n as u32));
        }
        self.write_as_asked(&cred, ino, offset, data, cached)
            .map(|n| reply::written(out, n as u32))
    }

    /// The engine's write for a WRITE request: whole for the page cache's (`cached`), with the
    /// caller's credentials where KILLPRIV_V2 was agreed. The count written.
    fn write_as_asked(
        &self,
        cred: &Option<Cred>,
        ino: u32,
        offset: u64,
        data: &[u8],
        cached: bool,
    ) -> Result<usize, i32> {
        let r = match (cred, cached) {
            (Some(c), true) => self
                .fs
                .write_all_as(c, ino, offset, data)
                .map(|m| (data.len(), m)),
            (Some(c), false) => self.fs.write_as(c, ino, offset, data),
            (None, true) => self
                .fs
                .write_all(ino, offset, data)
                .map(|()| (data.len(), false)),
            (None, false) => self.fs.write(ino, offset, data).map(|n| (n, false)),
        };
        let (n, changed) = r.map_err(|e| errno(&e))?;
        if changed {
            self.mode_changed(ino);
        }
        Ok(n)
    }

    /// The answer to a SETATTR of times the engine refuses on an append-only file: with
    /// writeback_cache the kernel's own clock comes as an explicit mtime (with the equal
    /// ctime), which the engine refuses there as the kernel's ext4 refuses explicit times. Its
    /// flush after a write (no atime) only repeats what the engine's write set, and is answered
    /// with the file's attributes; `utime(f, NULL)` (atime now) sets the times to now. None
    /// where the error stands. (The new ctime the kernel sends right after an unlink reaches an
    /// inode the engine keeps while the kernel holds it: see `forget`.)
    pub(super) fn setattr_fallback(&self, ino: u32, s: &SetattrIn) -> Option<Attr> {
        let times_only = s.mode.is_none() && s.uid.is_none() && s.gid.is_none() && s.size.is_none();
        if !times_only || !self.writeback_cached() {
            return None;
        }
        if let Ok(a) = self.fs.getattr(ino) {
            if a.flags & FL_APPEND == 0 || a.flags & FL_IMMUTABLE != 0 {
                return None;
            }
            // The kernel sends its own clock as an explicit mtime with the ctime it set at the
            // same instant (its flush of a written file's times, `touch`), where an explicit
            // time from the caller (`touch -d`, refused) differs from the new ctime.
            let now = s.mtime.is_none_or(|m| match (m, s.ctime) {
                (TimeArg::At(ms, mn), Some((cs, cn))) => (ms, mn) == (cs, cn),
                _ => false,
            });
            return match s.atime {
                _ if !now => None,
                // The flush repeats what the engine's write already set.
                None => Some(a),
                // utime(f, NULL): the kernel's ext4 allows the times set to now.
                Some(TimeArg::Now) => {
                    let set = SetAttr {
                        atime: Some(TimeSet::Now),
                        mtime: s.mtime.map(|_| TimeSet::Now),
                        ..Default::default()
                    };
                    self.fs.setattr(ino, &set).ok()
                }
                Some(TimeArg::At(..)) => None,
            };
        }
        None
    }

    /// Whether the SETATTR's ctime is only the kernel's clock, which it adds to every
    /// attribute change with writeback_cache (it keeps a regular file's times itself): no
    /// explicit atime or mtime comes with it. The engine sets ctime itself on any change, and
    /// taking the kernel's as an explicit time would make `utime(f, NULL)` on an append-only
    /// file EPERM, where the kernel's ext4 allows setting the times to now.
    pub(super) fn kernel_ctime(&self, s: &SetattrIn) -> bool {
        let explicit = |t: Option<TimeArg>| matches!(t, Some(TimeArg::At(..)));
        self.writeback_cached() && !explicit(s.atime) && !explicit(s.mtime)
    }

    /// The kernel caches writes for this mount (writeback_cache agreed: a reserve is kept).
    pub(super) fn writeback_cached(&self) -> bool {
        self.fs.cache_reserve() > 0
    }

    /// Whether an open of `ino` must bypass the kernel's write-back cache: an append-only
    /// file, which the kernel would write back from the start of its last cached page (a
    /// write before the end, refused), so its writes go through one by one, at the end.
    pub(super) fn uncached_open(&self, ino: u32) -> bool {
        self.writeback_cached() && self.fs.getattr(ino).is_ok_and(|a| a.flags & FL_APPEND != 0)
    }

    /// A file handle for an open with `flags`; the lowest bit tells whether it may write
    /// (`cached_write_refused` asks).
    pub(super) fn new_fh(&self, flags: u32) -> u64 {
        let writes = flags as i32 & libc::O_ACCMODE != libc::O_RDONLY;
        (self.next_fh.fetch_add(1, Ordering::Relaxed) << 1) | writes as u64
    }

    /// Whether a GETATTR for open file `fh` is a cached write(2) to refuse with ENOSPC: the
    /// kernel's write-back cache is on (a reserve is kept), `fh` may write, and no space is
    /// left outside the reserve (which the data the kernel already cached may need).
    pub(super) fn cached_write_refused(&self, fh: u64) -> bool {
        fh & 1 == 1 && self.fs.cache_reserve() > 0 && self.fs.free_beyond_cache_reserve() == 0
    }

    /// Whether the space outside the write-cache reserve is less than the reserve itself:
    /// from there on, writers are made to ask before each cached write(2). After the
    /// writeback of a file's cached data, the kernel forgets its attributes
    /// (`forget_attrs`), so the writer's next write(2) sends GETATTR with its handle and can
    /// be refused in time; writers the kernel throttles are the ones whose data comes back,
    /// so each is told before it has cached more than the kernel lets a FUSE mount hold
    /// dirty. New opens for writing are told at once.
    pub(super) fn near_full(&self) -> bool {
        let r = self.fs.cache_reserve();
        r > 0 && self.fs.free_beyond_cache_reserve() < r
    }

    /// The kernel drops the attributes it caches for `ino` (not its pages).
    pub(super) fn forget_attrs(&self, ino: u32) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(to_fuse(ino), -1, 0);
        }
    }

    pub(super) fn readdir(
        &self,
        ino: u32,
        offset: u64,
        size: u32,
        plus: bool,
        out: &mut [u8],
    ) -> Reply {
        if plus {
            return self.readdirplus(ino, offset, size, out);
        }
        let mut d = reply::Dirents::new(out, size);
        self.fs
            .readdir(ino, offset, &mut |e| {
                d.add(to_fuse(e.ino), e.next_offset, type_of_ft(e.kind), &e.name)
            })
            .map_err(|e| errno(&e))?;
        Ok(d.len())
    }

    fn readdirplus(&self, ino: u32, offset: u64, size: u32, out: &mut [u8]) -> Reply {
        let mut entries = Vec::new();
        self.fs
            .readdir(ino, offset, &mut |e| {
                entries.push(e);
                entries.len() < 512
            })
            .map_err(|e| errno(&e))?;
        let mut d = reply::Dirents::new(out, size);
        let ttl = self.ttl_in(ino);
        for e in entries {
            let Ok(a) = self.fs.getattr(e.ino) else {
                continue;
            };
            let dot = e.name == b"." || e.name == b"..";
            if !d.add_plus(
                a.generation as u64,
                ttl,
                &wire_attr(&a),
                e.next_offset,
                &e.name,
            ) {
                break;
            }
            // The kernel takes no lookup for "." and "..".
            if !dot {
                self.counted(&a);
            }
        }
        Ok(d.len())
    }

    pub(super) fn fallocate(
        &self,
        h: &InHeader,
        ino: u32,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> Reply {
        let mode = mode as i32;
        // Any fallocate changes the file as a write does: the engine takes away what a write
        // by this caller would.
        let r = match self.data_cred(h, ino, None) {
            Some(c) => self
                .fs
                .fallocate_as(&c, ino, mode, offset, length)
                .map(|changed| {
                    if changed {
                        self.mode_changed(ino);
                    }
                }),
            None => self.fs.fallocate(ino, mode, offset, length),
        };
        empty(r)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_file_range(
        &self,
        h: &InHeader,
        src: u32,
        offset_in: u64,
        dst: u32,
        offset_out: u64,
        len: u64,
        out: &mut [u8],
    ) -> Reply {
        // Copied here in 1 MiB pieces: one request instead of a read and a write per page.
        let len = len.min(1 << 30);
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0u64;
        let cred = self.data_cred(h, dst, None);
        let mut changed = false;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let n = match self.fs.read(src, offset_in + done, &mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(errno(&e)),
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            let w = match &cred {
                Some(c) => self.fs.write_as(c, dst, offset_out + done, &buf[..n]),
                None => self
                    .fs
                    .write(dst, offset_out + done, &buf[..n])
                    .map(|w| (w, false)),
            };
            match w {
                Ok((w, c)) => {
                    done += w as u64;
                    changed |= c;
                }
                Err(e) if done == 0 => return Err(errno(&e)),
                Err(_) => break,
            }
            if n < want {
                break;
            }
        }
        if changed {
            self.mode_changed(dst);
        }
        Ok(reply::written(out, done as u32))
    }

    /// The ioctls the kernel's FUSE forwards that ext4 answers: the inode flags (lsattr,
    /// chattr: FS_IOC_GETFLAGS/SETFLAGS, and FS_IOC_FSGETXATTR/FSSETXATTR, which the kernel
    /// sends from its fileattr calls), FS_IOC_GETVERSION, the filesystem label
    /// (FS_IOC_GETFSLABEL/SETFSLABEL), FITRIM (fstrim on the mount point), and of fscrypt's
    /// the two whose arguments the kernel's FUSE carries whole: FS_IOC_GET_ENCRYPTION_NONCE and
    /// FS_IOC_GET_ENCRYPTION_KEY_STATUS. The engine applies ext4's rules (owner or privilege,
    /// CAP_LINUX_IMMUTABLE, CAP_SYS_ADMIN) with the caller's credentials.
    ///
    /// FUSE forwards an ioctl's argument by the size and direction its number encodes.
    /// fscrypt's policy ioctls cannot travel so: FS_IOC_SET_ENCRYPTION_POLICY is numbered as
    /// a read (the server would get no policy), FS_IOC_GET_ENCRYPTION_POLICY as a write (no
    /// room for the answer), FS_IOC_GET_ENCRYPTION_POLICY_EX carries 9 bytes of a 33-byte
    /// answer, and FS_IOC_ADD_ENCRYPTION_KEY drops the key's bytes. They are answered
    /// EOPNOTSUPP; USAGE names the tools to use instead.
    pub(super) fn ioctl(
        &self,
        h: &InHeader,
        ino: u32,
        cmd: u32,
        data: &[u8],
        out_size: u32,
        out: &mut [u8],
    ) -> Reply {
        // Both sizes of the argument (`long` in the command's number, an int on the wire).
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
        const GETVERSION: [u32; 2] = [0x8008_7601, 0x8004_7601];
        const FSGETXATTR: u32 = 0x801c_581f;
        const FSSETXATTR: u32 = 0x401c_5820;
        const GETFSLABEL: u32 = 0x8100_9431;
        const SETFSLABEL: u32 = 0x4100_9432;
        const FITRIM: u32 = 0xc018_5879;
        const GET_ENCRYPTION_NONCE: u32 = 0x8010_661b;
        const GET_ENCRYPTION_KEY_STATUS: u32 = 0xc080_661a;
        // SET_ENCRYPTION_POLICY, GET_ENCRYPTION_POLICY, GET_ENCRYPTION_POLICY_EX,
        // ADD_ENCRYPTION_KEY, REMOVE_ENCRYPTION_KEY, REMOVE_ENCRYPTION_KEY_ALL_USERS.
        const FSCRYPT_UNCARRIED: [u32; 6] = [
            0x800c_6613,
            0x400c_6615,
            0xc009_6616,
            0xc050_6617,
            0xc040_6618,
            0xc040_6619,
        ];
        // FS_IOC_ENABLE_VERITY, FS_IOC_MEASURE_VERITY: the kernel's FUSE carries both
        // (fuse_setup_enable_verity, fuse_setup_measure_verity); FS_IOC_READ_VERITY_METADATA
        // points at a user buffer that a restricted FUSE ioctl cannot reach.
        const ENABLE_VERITY: u32 = 0x4080_6685;
        const MEASURE_VERITY: u32 = 0xc004_6686;
        const READ_VERITY_METADATA: u32 = 0xc028_6687;
        const FSXATTR_LEN: usize = 28;
        const LABEL_LEN: usize = 256;
        let e = |e: uext4::Error| errno(&e);
        let want_out = |n: usize| {
            if (out_size as usize) < n {
                Err(libc::EINVAL)
            } else {
                Ok(())
            }
        };
        let u32_at = |b: &[u8], o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |b: &[u8], o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        match cmd {
            c if GETFLAGS.contains(&c) => {
                want_out(4)?;
                let f = self.fs.get_flags(ino).map_err(e)?;
                Ok(reply::ioctl(out, 0, &f.to_ne_bytes()))
            }
            c if GETVERSION.contains(&c) => {
                want_out(4)?;
                let a = self.fs.getattr(ino).map_err(e)?;
                Ok(reply::ioctl(out, 0, &a.generation.to_ne_bytes()))
            }
            c if SETFLAGS.contains(&c) => {
                let b = data.get(..4).ok_or(libc::EINVAL)?;
                self.noopen_allows(u32_at(b, 0) & (FL_IMMUTABLE | FL_APPEND) != 0)?;
                self.fs
                    .set_flags_as(&self.fileattr_cred(h, ino), ino, u32_at(b, 0))
                    .map_err(e)?;
                self.mode_changed(ino);
                Ok(reply::ioctl(out, 0, &[]))
            }
            FSGETXATTR => {
                want_out(FSXATTR_LEN)?;
                let x = self.fs.get_fsxattr(ino).map_err(e)?;
                let mut b = [0u8; FSXATTR_LEN];
                for (i, v) in [x.xflags, x.extsize, x.nextents, x.projid, x.cowextsize]
                    .into_iter()
                    .enumerate()
                {
                    b[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
                }
                Ok(reply::ioctl(out, 0, &b))
            }
            FSSETXATTR => self.fssetxattr(h, ino, data.get(..FSXATTR_LEN), out),
            GETFSLABEL => {
                want_out(LABEL_LEN)?;
                let mut b = [0u8; LABEL_LEN];
                let l = self.fs.label();
                b[..l.len().min(LABEL_LEN - 1)].copy_from_slice(&l[..l.len().min(LABEL_LEN - 1)]);
                Ok(reply::ioctl(out, 0, &b))
            }
            SETFSLABEL => {
                let b = data.get(..LABEL_LEN).ok_or(libc::EINVAL)?;
                let end = b.iter().position(|&c| c == 0).unwrap_or(LABEL_LEN);
                self.fs.set_label_as(&self.cred(h), &b[..end]).map_err(e)?;
                Ok(reply::ioctl(out, 0, &[]))
            }
            FITRIM => {
                want_out(24)?;
                let b = data.get(..24).ok_or(libc::EINVAL)?;
                let (start, len, min_len) = (u64_at(b, 0), u64_at(b, 8), u64_at(b, 16));
                let t = self
                    .fs
                    .trim_as(&self.cred(h), start, len, min_len)
                    .map_err(e)?;
                let mut r = [0u8; 24];
                r.copy_from_slice(b);
                r[8..16].copy_from_slice(&t.to_ne_bytes());
                Ok(reply::ioctl(out, 0, &r))
            }
            GET_ENCRYPTION_NONCE => {
                want_out(16)?;
                let n = self.fs.encryption_nonce(ino).map_err(e)?;
                Ok(reply::ioctl(out, 0, &n))
            }
            GET_ENCRYPTION_KEY_STATUS => {
                // fscrypt_get_key_status_arg: key_spec {type, reserved, u[32]} then
                // reserved words; out: status, status_flags, user_count at 64.
                want_out(128)?;
                let b = data.get(..128).ok_or(libc::EINVAL)?;
                let spec = match u32_at(b, 0) {
                    1 => &b[8..16],
                    2 => &b[8..24],
                    _ => return Err(libc::EINVAL),
                };
                let present = self.fs.has_encryption_key(spec);
                let mut r = [0u8; 128];
                r[..64].copy_from_slice(&b[..64]);
                // FSCRYPT_KEY_STATUS_PRESENT (2) or _ABSENT (1); a key given at mount was
                // added by no user of this system.
                r[64..68].copy_from_slice(&(if present { 2u32 } else { 1 }).to_ne_bytes());
                Ok(reply::ioctl(out, 0, &r))
            }
            ENABLE_VERITY => self.enable_verity(ino, data, out),
            MEASURE_VERITY => self.measure_verity(ino, data, out_size, out),
            READ_VERITY_METADATA => Err(libc::EOPNOTSUPP),
            c if FSCRYPT_UNCARRIED.contains(&c) => Err(libc::EOPNOTSUPP),
            _ => Err(libc::ENOTTY),
        }
    }
}

impl Uext4Fuse {
    /// Under `noopen`, a change that would make OPEN refuse what it no longer sees (an
    /// immutable, append-only or verity file, `restricting`) is EOPNOTSUPP: the kernel
    /// would open such a file for writing without asking. A read-only mount refuses
    /// every change anyway.
    fn noopen_allows(&self, restricting: bool) -> Result<(), i32> {
        if restricting && self.no_open.load(Ordering::Relaxed) && !self.opts.read_only {
            return Err(libc::EOPNOTSUPP);
        }
        Ok(())
    }

    /// FS_IOC_FSSETXATTR: `struct fsxattr` (`b`, 28 bytes): xflags, extsize, nextents,
    /// projid, cowextsize.
    fn fssetxattr(&self, h: &InHeader, ino: u32, b: Option<&[u8]>, out: &mut [u8]) -> Reply {
        let b = b.ok_or(libc::EINVAL)?;
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        // FS_XFLAG_IMMUTABLE, FS_XFLAG_APPEND.
        self.noopen_allows(u32_at(0) & (0x8 | 0x10) != 0)?;
        let x = uext4::FsXattr {
            xflags: u32_at(0),
            extsize: u32_at(4),
            nextents: u32_at(8),
            projid: u32_at(12),
            cowextsize: u32_at(16),
        };
        let cred = self.fileattr_cred(h, ino);
        self.fs
            .set_fsxattr_as(&cred, ino, &x)
            .map_err(|e| errno(&e))?;
        self.mode_changed(ino);
        Ok(reply::ioctl(out, 0, &[]))
    }

    /// FS_IOC_ENABLE_VERITY: `struct fsverity_enable_arg` (128 bytes), then the salt and the
    /// signature its pointers named, as fuse_setup_enable_verity lays them after it. The
    /// Merkle tree moves the block count: the kernel is told (`attrs_moved`).
    fn enable_verity(&self, ino: u32, data: &[u8], out: &mut [u8]) -> Reply {
        self.noopen_allows(true)?;
        let before = self.fs.getattr(ino).ok();
        let r = self.enable_verity_arg(ino, data, out);
        self.attrs_moved(ino, before);
        r
    }

    fn enable_verity_arg(&self, ino: u32, data: &[u8], out: &mut [u8]) -> Reply {
        let arg = data.get(..128).ok_or(libc::EINVAL)?;
        let u32_at = |o: usize| u32::from_ne_bytes(arg[o..o + 4].try_into().unwrap());
        // version, hash_algorithm, block_size, salt_size, salt_ptr (16), sig_size (24),
        // __reserved1 (28), sig_ptr (32), __reserved2 (40..128): fsverity_ioctl_enable's checks.
        if u32_at(0) != 1 || u32_at(28) != 0 || arg[40..].iter().any(|&b| b != 0) {
            return Err(libc::EINVAL);
        }
        let (salt_size, sig_size) = (u32_at(12) as usize, u32_at(24) as usize);
        let rest = &data[128..];
        if rest.len() < salt_size + sig_size {
            return Err(libc::EINVAL);
        }
        let args = uext4::VerityArgs {
            hash_algorithm: u32_at(4),
            block_size: u32_at(8),
            salt: rest[..salt_size].to_vec(),
            signature: rest[salt_size..salt_size + sig_size].to_vec(),
        };
        self.fs.enable_verity(ino, &args).map_err(|e| errno(&e))?;
        Ok(reply::ioctl(out, 0, &[]))
    }

    /// FS_IOC_MEASURE_VERITY: `struct fsverity_digest` (algorithm, size, digest); the
    /// caller's size is the room it has (EOVERFLOW when short, as fsverity_ioctl_measure).
    fn measure_verity(&self, ino: u32, data: &[u8], out_size: u32, out: &mut [u8]) -> Reply {
        let room = data
            .get(2..4)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]) as usize)
            .ok_or(libc::EINVAL)?;
        let (alg, digest) = self.fs.measure_verity(ino).map_err(|e| errno(&e))?;
        if room < digest.len() || (out_size as usize) < 4 + digest.len() {
            return Err(libc::EOVERFLOW);
        }
        let mut r = Vec::with_capacity(4 + digest.len());
        r.extend_from_slice(&(alg.id() as u16).to_ne_bytes());
        r.extend_from_slice(&(digest.len() as u16).to_ne_bytes());
        r.extend_from_slice(&digest);
        Ok(reply::ioctl(out, 0, &r))
    }
}
