//! The workloads' calls through a mounted filesystem (or a plain folder), with system calls.

use super::*;

pub(super) fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| anyhow!("{}: NUL in path", p.display()))
}

fn times(a: &Attrs) -> [libc::timespec; 2] {
    let t = libc::timespec {
        tv_sec: a.mtime.0 as libc::time_t,
        tv_nsec: a.mtime.1 as _,
    };
    [t, t]
}

pub(super) fn check(r: libc::c_int, what: &str, p: &Path) -> Result<()> {
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("{what} {}", p.display()));
    }
    Ok(())
}

/// Through a mounted filesystem (or a plain folder), with system calls.
pub struct Posix {
    pub root: PathBuf,
    /// syncfs's errors: reported with the workload, which goes on (it did its work; the error
    /// is the filesystem's report of a failed write-back, worth seeing, not a missing number).
    pub warnings: std::cell::RefCell<Vec<String>>,
}

impl Posix {
    pub fn new(root: &Path) -> Posix {
        Posix {
            root: root.to_path_buf(),
            warnings: Default::default(),
        }
    }
}

impl Posix {
    fn lutimes(&self, p: &Path, a: &Attrs) -> Result<()> {
        let c = cpath(p)?;
        let ts = times(a);
        // SAFETY: c is a NUL-terminated path, ts two timespecs.
        check(
            unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    ts.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            },
            "utimensat",
            p,
        )
    }
}

fn write_chunks(f: &mut std::fs::File, data: &[u8]) -> std::io::Result<()> {
    for c in data.chunks(CHUNK) {
        f.write_all(c)?;
    }
    Ok(())
}

fn ekind(ft: std::fs::FileType) -> EKind {
    if ft.is_dir() {
        EKind::Dir
    } else if ft.is_symlink() {
        EKind::Symlink
    } else if ft.is_file() {
        EKind::File
    } else {
        EKind::Other
    }
}

impl Ops for Posix {
    fn top(&self) -> H {
        H {
            path: self.root.clone(),
            ino: 0,
        }
    }
    fn mkdir(&self, parent: &H, name: &str, mode: u32) -> Result<H> {
        let h = parent.child(name, 0);
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(&h.path)
            .with_context(|| format!("mkdir {}", h.path.display()))?;
        Ok(h)
    }
    fn put_file(&self, parent: &H, name: &str, data: &[u8], a: &Attrs) -> Result<H> {
        use std::os::fd::AsRawFd;
        let h = parent.child(name, 0);
        let ctx = || h.path.display().to_string();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(a.mode & 0o777)
            .open(&h.path)
            .with_context(ctx)?;
        write_chunks(&mut f, data).with_context(ctx)?;
        let fd = f.as_raw_fd();
        let ts = times(a);
        // SAFETY: fd is open for the calls' duration; ts holds two timespecs.
        unsafe {
            check(libc::fchown(fd, a.uid, a.gid), "fchown", &h.path)?;
            check(libc::fchmod(fd, a.mode), "fchmod", &h.path)?;
            check(libc::futimens(fd, ts.as_ptr()), "futimens", &h.path)?;
        }
        Ok(h)
    }
    fn symlink(&self, parent: &H, name: &str, target: &[u8], a: &Attrs) -> Result<H> {
        let h = parent.child(name, 0);
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &h.path)
            .with_context(|| format!("symlink {}", h.path.display()))?;
        std::os::unix::fs::lchown(&h.path, Some(a.uid), Some(a.gid))
            .with_context(|| format!("lchown {}", h.path.display()))?;
        self.lutimes(&h.path, a)?;
        Ok(h)
    }
    fn link(&self, target: &H, parent: &H, name: &str) -> Result<H> {
        let h = parent.child(name, 0);
        std::fs::hard_link(&target.path, &h.path)
            .with_context(|| format!("link {}", h.path.display()))?;
        Ok(h)
    }
    fn set_attrs(&self, h: &H, a: &Attrs) -> Result<()> {
        std::os::unix::fs::chown(&h.path, Some(a.uid), Some(a.gid))
            .with_context(|| format!("chown {}", h.path.display()))?;
        std::fs::set_permissions(&h.path, std::fs::Permissions::from_mode(a.mode))
            .with_context(|| format!("chmod {}", h.path.display()))?;
        self.lutimes(&h.path, a)
    }
    fn list(&self, dir: &H) -> Result<Vec<(String, EKind, H)>> {
        let ctx = || format!("readdir {}", dir.path.display());
        let mut v = Vec::new();
        for e in std::fs::read_dir(&dir.path).with_context(ctx)? {
            let e = e.with_context(ctx)?;
            let name = e.file_name().to_string_lossy().into_owned();
            let k = ekind(e.file_type().with_context(ctx)?);
            let h = dir.child(&name, 0);
            v.push((name, k, h));
        }
        Ok(v)
    }
    /// lstat(2) as find, du, `ls -l` and git call it (fstatat, the basic attributes). Not
    /// Rust's `symlink_metadata`, which asks statx for the birth time too: through FUSE that
    /// costs a STATX request per inode the first time (entries carry no birth time), which
    /// the walk's users do not pay.
    fn lstat(&self, _parent: &H, _name: &str, h: &H) -> Result<Stat> {
        let c = cpath(&h.path)?;
        // SAFETY: an all-zero stat is a valid value for fstatat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: c is a NUL-terminated path, st a stat to fill.
        check(
            unsafe {
                libc::fstatat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            },
            "lstat",
            &h.path,
        )?;
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => EKind::Dir,
            libc::S_IFLNK => EKind::Symlink,
            libc::S_IFREG => EKind::File,
            _ => EKind::Other,
        };
        Ok(Stat {
            ino: st.st_ino,
            nlink: st.st_nlink,
            kind,
            attrs: Attrs {
                mode: st.st_mode & 0o7777,
                uid: st.st_uid,
                gid: st.st_gid,
                mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            },
        })
    }
    fn read_file(&self, h: &H, buf: &mut Vec<u8>) -> Result<()> {
        let ctx = || h.path.display().to_string();
        let mut f = std::fs::File::open(&h.path).with_context(ctx)?;
        buf.clear();
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut chunk).with_context(ctx)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    }
    fn readlink(&self, h: &H) -> Result<Vec<u8>> {
        Ok(std::fs::read_link(&h.path)
            .with_context(|| h.path.display().to_string())?
            .as_os_str()
            .as_bytes()
            .to_vec())
    }
    fn listxattr(&self, h: &H) -> Result<()> {
        let c = cpath(&h.path)?;
        // SAFETY: a size query (no buffer).
        let r = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOTSUP) {
                return Err(e).with_context(|| format!("llistxattr {}", h.path.display()));
            }
        }
        Ok(())
    }
    fn replace_file(&self, dir: &H, tmp: &str, name: &str, data: &[u8], a: &Attrs) -> Result<()> {
        let t = dir.path.join(tmp);
        let p = dir.path.join(name);
        let ctx = || t.display().to_string();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&t)
            .with_context(ctx)?;
        write_chunks(&mut f, data).with_context(ctx)?;
        f.sync_all().with_context(ctx)?;
        drop(f);
        std::fs::rename(&t, &p).with_context(|| format!("rename over {}", p.display()))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(a.mode))
            .with_context(|| format!("chmod {}", p.display()))?;
        std::os::unix::fs::chown(&p, Some(a.uid), Some(a.gid))
            .with_context(|| format!("chown {}", p.display()))?;
        self.lutimes(&p, a)
    }
    fn unlink(&self, parent: &H, name: &str) -> Result<()> {
        let p = parent.path.join(name);
        std::fs::remove_file(&p).with_context(|| format!("unlink {}", p.display()))
    }
    fn rmdir(&self, parent: &H, name: &str) -> Result<()> {
        let p = parent.path.join(name);
        std::fs::remove_dir(&p).with_context(|| format!("rmdir {}", p.display()))
    }
    fn syncfs(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        let d = std::fs::File::open(&self.root).with_context(|| self.root.display().to_string())?;
        // SAFETY: d is an open descriptor.
        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
            let e = std::io::Error::last_os_error();
            self.warnings
                .borrow_mut()
                .push(format!("syncfs reported: {e}"));
        }
        Ok(())
    }
    fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.borrow_mut())
    }
}
