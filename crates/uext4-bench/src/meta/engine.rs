//! The workloads' calls into the engine, in-process (uext4-lib).

use super::*;

/// The same calls into the engine, in-process (uext4-lib): what the FUSE server would call for
/// each request the kernel sends, without the kernel and the transport.
pub struct Lib<'a> {
    pub fs: &'a Fs,
}

fn eng<T>(r: uext4::Result<T>, what: &str, name: &str) -> Result<T> {
    r.map_err(|e| anyhow!("{what} {name}: {e}"))
}

impl Lib<'_> {
    fn times(&self, ino: u32, a: &Attrs) -> Result<()> {
        use uext4::Timestamp;
        use uext4::{SetAttr, TimeSet};
        let t = TimeSet::At(Timestamp {
            sec: a.mtime.0,
            nsec: a.mtime.1,
        });
        let s = SetAttr {
            atime: Some(t),
            mtime: Some(t),
            ..Default::default()
        };
        eng(self.fs.setattr(ino, &s), "utimes", "")?;
        Ok(())
    }
    fn owner(&self, ino: u32, a: &Attrs) -> Result<()> {
        let s = uext4::SetAttr {
            uid: Some(a.uid),
            gid: Some(a.gid),
            ..Default::default()
        };
        eng(self.fs.setattr(ino, &s), "chown", "")?;
        Ok(())
    }
    fn chmod(&self, ino: u32, a: &Attrs) -> Result<()> {
        let s = uext4::SetAttr {
            mode: Some(a.mode),
            ..Default::default()
        };
        eng(self.fs.setattr(ino, &s), "chmod", "")?;
        Ok(())
    }
    fn write_chunks(&self, ino: u32, data: &[u8]) -> Result<()> {
        for (i, c) in data.chunks(CHUNK).enumerate() {
            eng(self.fs.write_all(ino, (i * CHUNK) as u64, c), "write", "")?;
        }
        Ok(())
    }
}

fn ekind_ft(ft: u8) -> EKind {
    match ft {
        1 => EKind::File,
        2 => EKind::Dir,
        7 => EKind::Symlink,
        _ => EKind::Other,
    }
}

fn ekind_mode(mode: u16) -> EKind {
    match mode as u32 & libc::S_IFMT {
        libc::S_IFDIR => EKind::Dir,
        libc::S_IFREG => EKind::File,
        libc::S_IFLNK => EKind::Symlink,
        _ => EKind::Other,
    }
}

impl Ops for Lib<'_> {
    fn top(&self) -> H {
        H {
            path: PathBuf::new(),
            ino: self.fs.root_ino(),
        }
    }
    fn mkdir(&self, parent: &H, name: &str, mode: u32) -> Result<H> {
        let a = eng(
            self.fs.mkdir(parent.ino, name.as_bytes(), mode, 0, 0),
            "mkdir",
            name,
        )?;
        Ok(parent.child(name, a.ino))
    }
    fn put_file(&self, parent: &H, name: &str, data: &[u8], a: &Attrs) -> Result<H> {
        let ino = eng(
            self.fs
                .create(parent.ino, name.as_bytes(), a.mode & 0o777, 0, 0),
            "create",
            name,
        )?
        .ino;
        eng(self.fs.open(ino), "open", name)?;
        self.write_chunks(ino, data)?;
        self.owner(ino, a)?;
        self.chmod(ino, a)?;
        self.times(ino, a)?;
        eng(self.fs.release(ino), "release", name)?;
        Ok(parent.child(name, ino))
    }
    fn symlink(&self, parent: &H, name: &str, target: &[u8], a: &Attrs) -> Result<H> {
        let ino = eng(
            self.fs.symlink(parent.ino, name.as_bytes(), target, 0, 0),
            "symlink",
            name,
        )?
        .ino;
        self.owner(ino, a)?;
        self.times(ino, a)?;
        Ok(parent.child(name, ino))
    }
    fn link(&self, target: &H, parent: &H, name: &str) -> Result<H> {
        eng(
            self.fs.link(target.ino, parent.ino, name.as_bytes()),
            "link",
            name,
        )?;
        Ok(parent.child(name, target.ino))
    }
    fn set_attrs(&self, h: &H, a: &Attrs) -> Result<()> {
        self.owner(h.ino, a)?;
        self.chmod(h.ino, a)?;
        self.times(h.ino, a)
    }
    fn list(&self, dir: &H) -> Result<Vec<(String, EKind, H)>> {
        let mut v = Vec::new();
        eng(
            self.fs.readdir(dir.ino, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    let name = String::from_utf8_lossy(&e.name).into_owned();
                    let h = dir.child(&name, e.ino);
                    v.push((name, ekind_ft(e.kind), h));
                }
                true
            }),
            "readdir",
            "",
        )?;
        Ok(v)
    }
    fn lstat(&self, parent: &H, name: &str, _h: &H) -> Result<Stat> {
        let a = eng(self.fs.lookup(parent.ino, name.as_bytes()), "lookup", name)?;
        Ok(Stat {
            ino: a.ino as u64,
            nlink: a.nlink as u64,
            kind: ekind_mode(a.mode),
            attrs: Attrs {
                mode: a.mode as u32 & 0o7777,
                uid: a.uid,
                gid: a.gid,
                mtime: (a.mtime.sec, a.mtime.nsec),
            },
        })
    }
    fn read_file(&self, h: &H, buf: &mut Vec<u8>) -> Result<()> {
        eng(self.fs.open(h.ino), "open", "")?;
        buf.clear();
        let mut chunk = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let n = eng(self.fs.read(h.ino, off, &mut chunk), "read", "")?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            off += n as u64;
        }
        eng(self.fs.release(h.ino), "release", "")?;
        Ok(())
    }
    fn readlink(&self, h: &H) -> Result<Vec<u8>> {
        eng(self.fs.readlink(h.ino), "readlink", "")
    }
    fn listxattr(&self, h: &H) -> Result<()> {
        eng(self.fs.listxattr(h.ino), "listxattr", "")?;
        Ok(())
    }
    fn replace_file(&self, dir: &H, tmp: &str, name: &str, data: &[u8], a: &Attrs) -> Result<()> {
        let ino = eng(
            self.fs.create(dir.ino, tmp.as_bytes(), 0o600, 0, 0),
            "create",
            tmp,
        )?
        .ino;
        eng(self.fs.open(ino), "open", tmp)?;
        self.write_chunks(ino, data)?;
        eng(self.fs.fsync(ino, false), "fsync", tmp)?;
        eng(self.fs.release(ino), "release", tmp)?;
        eng(
            self.fs.rename(
                dir.ino,
                tmp.as_bytes(),
                dir.ino,
                name.as_bytes(),
                Default::default(),
            ),
            "rename",
            name,
        )?;
        self.chmod(ino, a)?;
        self.owner(ino, a)?;
        self.times(ino, a)
    }
    fn unlink(&self, parent: &H, name: &str) -> Result<()> {
        eng(self.fs.unlink(parent.ino, name.as_bytes()), "unlink", name)
    }
    fn rmdir(&self, parent: &H, name: &str) -> Result<()> {
        eng(self.fs.rmdir(parent.ino, name.as_bytes()), "rmdir", name)
    }
    fn syncfs(&self) -> Result<()> {
        eng(self.fs.sync(), "sync", "")
    }
}
