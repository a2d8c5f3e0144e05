//! Inode flags, the label, fallocate's COLLAPSE_RANGE and INSERT_RANGE (and FITRIM's count),
//! against the kernel's ext4: the same requests go to a loop mount of one copy of an image
//! (ioctls, syscalls, as root) and to the engine on another copy, and must give the same
//! errors and leave the same flags, contents and sizes; each image reads back in the other
//! system and is `e2fsck -fn` clean. The rules for unprivileged callers, which the tests (as
//! root) cannot ask of the kernel, are checked against the kernel's code. Without root or
//! loop devices the kernel halves are skipped (said on stderr).

mod common;

use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::flags::*;
use uext4::{Cred, Error, Fs, MountOptions, SetAttr, TimeSet, XattrFlags};
use uext4::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE};
use uext4::{FALLOC_FL_PUNCH_HOLE, ROOT_INO};

const FS_IOC_GETFLAGS: u64 = 0x8008_6601;
const FS_IOC_SETFLAGS: u64 = 0x4008_6602;
const FS_IOC_FSGETXATTR: u64 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u64 = 0x401c_5820;
const FS_IOC_GETFSLABEL: u64 = 0x8100_9431;
const FS_IOC_SETFSLABEL: u64 = 0x4100_9432;

type Res = std::result::Result<(), i32>;

fn open_fs(p: &Path) -> Arc<Fs> {
    Fs::open_path(
        p,
        MountOptions {
            commit_interval_secs: 0,
            ..Default::default()
        },
    )
    .unwrap()
}

fn ino(fs: &Fs, path: &str) -> u32 {
    path.split('/')
        .filter(|c| !c.is_empty())
        .fold(ROOT_INO, |i, c| fs.lookup(i, c.as_bytes()).unwrap().ino)
}

fn errno(e: Error) -> i32 {
    e.errno()
}

fn eng<T>(r: uext4::Result<T>) -> Res {
    r.map(|_| ()).map_err(errno)
}

fn sys(r: std::io::Result<()>) -> Res {
    r.map_err(|e| e.raw_os_error().unwrap())
}

fn last_errno(rc: i64) -> Res {
    if rc < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(())
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// An ioctl on `p` (opened read-only, or O_NOFOLLOW-free for directories), with `arg`.
fn ioctl_path(p: &Path, req: u64, arg: *mut libc::c_void) -> Res {
    let f = std::fs::File::open(p).map_err(|e| e.raw_os_error().unwrap())?;
    use std::os::fd::AsRawFd;
    // SAFETY: `arg` points at a buffer of the size the request names, alive for the call.
    last_errno(unsafe { libc::ioctl(f.as_raw_fd(), req as _, arg) } as i64)
}

fn k_getflags(p: &Path) -> u32 {
    let mut f: libc::c_int = 0;
    ioctl_path(p, FS_IOC_GETFLAGS, &mut f as *mut _ as *mut _).unwrap();
    f as u32
}

fn k_setflags(p: &Path, flags: u32) -> Res {
    let mut f = flags as libc::c_int;
    ioctl_path(p, FS_IOC_SETFLAGS, &mut f as *mut _ as *mut _)
}

/// `struct fsxattr` as the kernel lays it out: five u32 and 8 bytes of padding.
#[repr(C)]
#[derive(Default)]
struct RawFsx {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

fn k_getfsx(p: &Path) -> FsXattr {
    let mut x = RawFsx::default();
    ioctl_path(p, FS_IOC_FSGETXATTR, &mut x as *mut _ as *mut _).unwrap();
    FsXattr {
        xflags: x.xflags,
        extsize: x.extsize,
        nextents: x.nextents,
        projid: x.projid,
        cowextsize: x.cowextsize,
    }
}

fn k_setfsx(p: &Path, xflags: u32, projid: u32) -> Res {
    let mut x = RawFsx {
        xflags,
        projid,
        ..RawFsx::default()
    };
    ioctl_path(p, FS_IOC_FSSETXATTR, &mut x as *mut _ as *mut _)
}

fn kernel_ok() -> bool {
    let ok = uext4_testkit::needs::can_loop_mount();
    if !ok {
        eprintln!("SKIP: kernel comparison needs root and loop devices");
    }
    ok
}

/// Two copies of one new image: one for the kernel, one for the engine.
fn twin_images(tag: &str, size: &str, extra: &[&str]) -> (Scratch, Scratch) {
    let a = scratch(&format!("{tag}-k"));
    let b = scratch(&format!("{tag}-u"));
    mke2fs(&a.0, size, extra);
    std::fs::copy(&a.0, &b.0).unwrap();
    (a, b)
}

/// The flag requests, in order, that each of a file and a directory receives (each
/// replaces the flags whole, as chattr sends them after GETFLAGS); what the kernel and the
/// engine answer and leave must be equal.
fn flag_requests(ext: u32) -> Vec<u32> {
    let mut reqs = vec![
        ext | FL_NODUMP,
        ext | FL_NODUMP | FL_SYNC | FL_NOATIME,
        ext | FL_DIRSYNC,
        ext | FL_TOPDIR,
        ext | FL_SECRM | FL_UNRM | FL_COMPR | FL_NOTAIL,
        ext | FL_PROJINHERIT,
        ext | FL_CASEFOLD,
        ext | FL_INDEX,
        ext | 0x8000_0000,
        ext | FL_EOFBLOCKS,
        ext | FL_IMMUTABLE,
        ext | FL_IMMUTABLE | FL_NODUMP,
        ext | FL_NODUMP,
        ext | FL_APPEND,
        ext | FL_APPEND | FL_IMMUTABLE,
        ext,
        ext | FL_JOURNAL_DATA,
        ext | FL_JOURNAL_DATA | FL_DAX,
        ext | FL_DAX,
        ext | FL_DAX | FL_NOATIME,
        ext,
    ];
    // JOURNAL_DATA needs CAP_SYS_RESOURCE, which a container may withhold from root: the
    // kernel then refuses what the engine (asked as root) allows.
    if !has_cap(24) {
        eprintln!("no CAP_SYS_RESOURCE: JOURNAL_DATA requests not compared");
        reqs.retain(|r| r & FL_JOURNAL_DATA == 0);
    }
    reqs
}

/// Whether this process has capability `bit` in its effective set.
fn has_cap(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|v| v & (1 << bit) != 0)
}

#[test]
fn flag_requests_match_the_kernel() {
    if !kernel_ok() {
        return;
    }
    let (ka, ua) = twin_images("flags", "64M", &[]);
    let fs = open_fs(&ua.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"data").unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let ext = fs.get_flags(f).unwrap() & FL_EXTENTS;
    let mut mine = Vec::new();
    for (name, i) in [("f", f), ("d", d)] {
        for req in flag_requests(ext) {
            let r = eng(fs.set_flags(i, req));
            mine.push((
                name,
                req,
                r,
                fs.get_flags(i).unwrap(),
                fs.get_fsxattr(i).unwrap(),
            ));
        }
    }
    // Inheritance: a directory with flags that are inherited and some that are not.
    fs.set_flags(
        d,
        ext | FL_NODUMP | FL_SYNC | FL_DIRSYNC | FL_NOATIME | FL_TOPDIR,
    )
    .unwrap();
    let kids = [
        fs.create(d, b"file", 0o644, 0, 0).unwrap().ino,
        fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino,
        fs.symlink(d, b"ln", b"target", 0, 0).unwrap().ino,
    ];
    let inherited: Vec<u32> = kids.iter().map(|&k| fs.get_flags(k).unwrap()).collect();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&ua.0, "after the engine's flag changes");

    let m = uext4_testkit::faulty::KernelMount::new(&ka.0);
    std::fs::write(m.dir.join("f"), b"data").unwrap();
    std::fs::create_dir(m.dir.join("d")).unwrap();
    let mut theirs = Vec::new();
    for name in ["f", "d"] {
        let p = m.dir.join(name);
        for req in flag_requests(ext) {
            let r = k_setflags(&p, req);
            theirs.push((name, req, r, k_getflags(&p), k_getfsx(&p)));
        }
    }
    let d = m.dir.join("d");
    k_setflags(
        &d,
        ext | FL_NODUMP | FL_SYNC | FL_DIRSYNC | FL_NOATIME | FL_TOPDIR,
    )
    .unwrap();
    std::fs::write(d.join("file"), b"").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink("target", d.join("ln")).unwrap();
    let k_inherited: Vec<u32> = ["file", "sub"]
        .iter()
        .map(|n| k_getflags(&d.join(n)))
        .collect();
    let names = ["f", "d", "d/file", "d/sub"];
    let k_final: Vec<u32> = names.iter().map(|n| k_getflags(&m.dir.join(n))).collect();
    drop(m);
    e2fsck_clean_when(&ka.0, "after the kernel's flag changes");
    for (a, b) in mine.iter().zip(&theirs) {
        assert_eq!(
            (a.2, a.3, a.4),
            (b.2, b.3, b.4),
            "{} request {:#x}: engine {:?}, kernel {:?}",
            a.0,
            a.1,
            a,
            b
        );
    }
    assert_eq!(&inherited[..2], &k_inherited[..]);
    // The kernel's symlink, read by the engine: only NODUMP and NOATIME pass to a symlink.
    let kfs = open_fs(&ka.0);
    let kln = ino(&kfs, "d/ln");
    assert_eq!(kfs.get_flags(kln).unwrap(), inherited[2]);
    // And each reads the other's flags.
    for (name, want) in names.iter().zip(k_final) {
        assert_eq!(kfs.get_flags(ino(&kfs, name)).unwrap(), want, "{name}");
    }
    kfs.unmount().unwrap();
    drop(kfs);
    let m = uext4_testkit::faulty::KernelMount::new(&ua.0);
    assert_eq!(k_getflags(&m.dir.join("d/file")), inherited[0]);
    assert_eq!(k_getflags(&m.dir.join("d/sub")), inherited[1]);
    assert_eq!(
        k_getflags(&m.dir.join("f")),
        mine[flag_requests(ext).len() - 1].3
    );
}

/// FSSETXATTR's xflags replace the flags they stand for and keep the rest; a project id
/// other than 0 needs the project feature.
#[test]
fn fsxattr_requests_match_the_kernel() {
    if !kernel_ok() {
        return;
    }
    let (ka, ua) = twin_images("fsx", "64M", &[]);
    let fs = open_fs(&ua.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let reqs: [(u32, u32); 8] = [
        (XFLAG_NODUMP | XFLAG_NOATIME, 0),
        (XFLAG_SYNC | XFLAG_APPEND, 0),
        (XFLAG_PROJINHERIT, 0),
        (XFLAG_DAX, 0),
        (XFLAG_IMMUTABLE, 0),
        (XFLAG_IMMUTABLE | XFLAG_NODUMP, 0),
        (0, 0),
        (XFLAG_NODUMP, 7),
    ];
    let mut mine = Vec::new();
    for i in [f, d] {
        for (x, p) in reqs {
            let fsx = FsXattr {
                xflags: x,
                projid: p,
                ..FsXattr::default()
            };
            let r = eng(fs.set_fsxattr_as(&Cred::root(), i, &fsx));
            mine.push((r, fs.get_flags(i).unwrap(), fs.get_fsxattr(i).unwrap()));
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&ua.0);
    let m = uext4_testkit::faulty::KernelMount::new(&ka.0);
    std::fs::write(m.dir.join("f"), b"").unwrap();
    std::fs::create_dir(m.dir.join("d")).unwrap();
    let mut theirs = Vec::new();
    for name in ["f", "d"] {
        let p = m.dir.join(name);
        for (x, pr) in reqs {
            let r = k_setfsx(&p, x, pr);
            theirs.push((r, k_getflags(&p), k_getfsx(&p)));
        }
    }
    drop(m);
    e2fsck_clean(&ka.0);
    for (i, (a, b)) in mine.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "request {i}");
    }
}

/// The operations an immutable or append-only file or directory refuses.
trait Ops {
    fn write(&self, path: &str, off: Option<u64>, data: &[u8]) -> Res;
    fn truncate(&self, path: &str, size: u64) -> Res;
    fn chmod(&self, path: &str, mode: u32) -> Res;
    fn touch(&self, path: &str, explicit: bool) -> Res;
    fn setxattr(&self, path: &str) -> Res;
    fn link(&self, path: &str, new: &str) -> Res;
    fn unlink(&self, path: &str) -> Res;
    fn rename(&self, path: &str, new: &str) -> Res;
    fn create(&self, path: &str) -> Res;
    fn fallocate(&self, path: &str, mode: i32, off: u64, len: u64) -> Res;
    fn setflags(&self, path: &str, flags: u32) -> Res;
    fn size(&self, path: &str) -> u64;
}

struct Kernel(PathBuf);

impl Kernel {
    fn p(&self, path: &str) -> PathBuf {
        self.0.join(path)
    }
}

impl Ops for Kernel {
    fn write(&self, path: &str, off: Option<u64>, data: &[u8]) -> Res {
        let mut o = std::fs::OpenOptions::new();
        match off {
            None => o.append(true),
            Some(_) => o.write(true),
        };
        let f = o
            .open(self.p(path))
            .map_err(|e| e.raw_os_error().unwrap())?;
        sys(match off {
            None => std::io::Write::write_all(&mut &f, data),
            Some(off) => f.write_all_at(data, off),
        })
    }
    fn truncate(&self, path: &str, size: u64) -> Res {
        let p = cpath(&self.p(path));
        // SAFETY: a NUL-terminated path.
        last_errno(unsafe { libc::truncate(p.as_ptr(), size as i64) } as i64)
    }
    fn chmod(&self, path: &str, mode: u32) -> Res {
        use std::os::unix::fs::PermissionsExt;
        sys(std::fs::set_permissions(
            self.p(path),
            std::fs::Permissions::from_mode(mode),
        ))
    }
    fn touch(&self, path: &str, explicit: bool) -> Res {
        let p = cpath(&self.p(path));
        let t = libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        };
        let times = [t, t];
        let tp = if explicit {
            times.as_ptr()
        } else {
            std::ptr::null()
        };
        // SAFETY: a NUL-terminated path and two timespecs (or none).
        last_errno(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), tp, 0) } as i64)
    }
    fn setxattr(&self, path: &str) -> Res {
        let p = cpath(&self.p(path));
        let n = CString::new("user.x").unwrap();
        // SAFETY: NUL-terminated strings and a 1-byte value.
        last_errno(
            unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0) } as i64,
        )
    }
    fn link(&self, path: &str, new: &str) -> Res {
        sys(std::fs::hard_link(self.p(path), self.p(new)))
    }
    fn unlink(&self, path: &str) -> Res {
        let p = self.p(path);
        sys(if p.is_dir() {
            std::fs::remove_dir(p)
        } else {
            std::fs::remove_file(p)
        })
    }
    fn rename(&self, path: &str, new: &str) -> Res {
        sys(std::fs::rename(self.p(path), self.p(new)))
    }
    fn create(&self, path: &str) -> Res {
        sys(std::fs::File::create(self.p(path)).map(|_| ()))
    }
    fn fallocate(&self, path: &str, mode: i32, off: u64, len: u64) -> Res {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_APPEND)
            .open(self.p(path))
            .or_else(|_| std::fs::OpenOptions::new().write(true).open(self.p(path)))
            .map_err(|e| e.raw_os_error().unwrap())?;
        use std::os::fd::AsRawFd;
        // SAFETY: an open descriptor.
        last_errno(unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) } as i64)
    }
    fn setflags(&self, path: &str, flags: u32) -> Res {
        k_setflags(&self.p(path), flags)
    }
    fn size(&self, path: &str) -> u64 {
        std::fs::metadata(self.p(path)).unwrap().len()
    }
}

struct Engine(Arc<Fs>);

impl Engine {
    fn i(&self, path: &str) -> Result<u32, i32> {
        let mut i = ROOT_INO;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            i = self.0.lookup(i, c.as_bytes()).map_err(errno)?.ino;
        }
        Ok(i)
    }
    fn split<'a>(&self, path: &'a str) -> Result<(u32, &'a str), i32> {
        match path.rsplit_once('/') {
            Some((d, n)) => Ok((self.i(d)?, n)),
            None => Ok((ROOT_INO, path)),
        }
    }
}

impl Ops for Engine {
    fn write(&self, path: &str, off: Option<u64>, data: &[u8]) -> Res {
        let i = self.i(path)?;
        // Opening for writing is refused as the kernel's may_open refuses it.
        let flags = if off.is_none() {
            libc::O_WRONLY | libc::O_APPEND
        } else {
            libc::O_WRONLY
        };
        eng(self.0.check_open(i, flags))?;
        let off = off.unwrap_or_else(|| self.0.getattr(i).unwrap().size);
        eng(self.0.write_all(i, off, data))
    }
    fn truncate(&self, path: &str, size: u64) -> Res {
        let i = self.i(path)?;
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        eng(self.0.setattr_as(&Cred::root(), i, &set))
    }
    fn chmod(&self, path: &str, mode: u32) -> Res {
        let i = self.i(path)?;
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        eng(self.0.setattr_as(&Cred::root(), i, &set))
    }
    fn touch(&self, path: &str, explicit: bool) -> Res {
        let i = self.i(path)?;
        let t = if explicit {
            TimeSet::At(uext4::Timestamp {
                sec: 1_000_000,
                nsec: 0,
            })
        } else {
            TimeSet::Now
        };
        let set = SetAttr {
            atime: Some(t),
            mtime: Some(t),
            ..SetAttr::default()
        };
        eng(self.0.setattr_as(&Cred::root(), i, &set))
    }
    fn setxattr(&self, path: &str) -> Res {
        let i = self.i(path)?;
        eng(self.0.setxattr(i, b"user.x", b"v", XattrFlags::Any))
    }
    fn link(&self, path: &str, new: &str) -> Res {
        let i = self.i(path)?;
        let (d, n) = self.split(new)?;
        eng(self.0.link(i, d, n.as_bytes()))
    }
    fn unlink(&self, path: &str) -> Res {
        let (d, n) = self.split(path)?;
        let dir = self.0.getattr(self.i(path)?).unwrap().is_dir();
        eng(if dir {
            self.0.rmdir(d, n.as_bytes())
        } else {
            self.0.unlink(d, n.as_bytes())
        })
    }
    fn rename(&self, path: &str, new: &str) -> Res {
        let (d, n) = self.split(path)?;
        let (nd, nn) = self.split(new)?;
        let flags = uext4::RenameFlags::default();
        eng(self.0.rename(d, n.as_bytes(), nd, nn.as_bytes(), flags))
    }
    fn create(&self, path: &str) -> Res {
        let (d, n) = self.split(path)?;
        eng(self.0.create(d, n.as_bytes(), 0o644, 0, 0))
    }
    fn fallocate(&self, path: &str, mode: i32, off: u64, len: u64) -> Res {
        let i = self.i(path)?;
        eng(self.0.fallocate(i, mode, off, len))
    }
    fn setflags(&self, path: &str, flags: u32) -> Res {
        let i = self.i(path)?;
        eng(self.0.set_flags(i, flags))
    }
    fn size(&self, path: &str) -> u64 {
        self.0.getattr(self.i(path).unwrap()).unwrap().size
    }
}

/// Every operation the flags govern, on an immutable and an append-only file and
/// directory, with what each answered.
fn enforcement_script(o: &dyn Ops, ext: u32) -> Vec<(String, Res)> {
    let mut out = Vec::new();
    let mut r = |what: &str, res: Res| out.push((what.to_string(), res));
    for d in ["di", "da"] {
        r("mk x", o.create(&format!("{d}/x")));
    }
    r("mk i", o.create("i"));
    r("mk a", o.create("a"));
    r("mk f", o.create("f"));
    r("w i", o.write("i", Some(0), b"immutable"));
    r("w a", o.write("a", Some(0), b"append"));
    r("+i i", o.setflags("i", ext | FL_IMMUTABLE));
    r("+a a", o.setflags("a", ext | FL_APPEND));
    r("+i di", o.setflags("di", ext | FL_IMMUTABLE));
    r("+a da", o.setflags("da", ext | FL_APPEND));
    for f in ["i", "a"] {
        r(&format!("write at 0 {f}"), o.write(f, Some(0), b"x"));
        r(&format!("append {f}"), o.write(f, None, b"more"));
        r(&format!("truncate {f}"), o.truncate(f, 2));
        r(&format!("chmod {f}"), o.chmod(f, 0o600));
        r(&format!("touch {f}"), o.touch(f, false));
        r(&format!("utimes {f}"), o.touch(f, true));
        r(&format!("setxattr {f}"), o.setxattr(f));
        r(&format!("link {f}"), o.link(f, &format!("{f}.l")));
        r(&format!("rename {f}"), o.rename(f, &format!("{f}.r")));
        r(&format!("unlink {f}"), o.unlink(f));
        r(&format!("rename over {f}"), o.rename("f", f));
        r(&format!("alloc {f}"), o.fallocate(f, 0, 0, 8192));
        r(
            &format!("keep {f}"),
            o.fallocate(f, FALLOC_FL_KEEP_SIZE, 0, 65536),
        );
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        r(&format!("punch {f}"), o.fallocate(f, punch, 0, 4096));
        r(
            &format!("collapse {f}"),
            o.fallocate(f, FALLOC_FL_COLLAPSE_RANGE, 0, 4096),
        );
    }
    for d in ["di", "da"] {
        r(&format!("create in {d}"), o.create(&format!("{d}/new")));
        r(
            &format!("write in {d}"),
            o.write(&format!("{d}/x"), Some(0), b"y"),
        );
        r(&format!("unlink in {d}"), o.unlink(&format!("{d}/x")));
        r(
            &format!("rename in {d}"),
            o.rename(&format!("{d}/x"), &format!("{d}/y")),
        );
        r(
            &format!("rename out of {d}"),
            o.rename(&format!("{d}/x"), "out"),
        );
        r(
            &format!("rename into {d}"),
            o.rename("f", &format!("{d}/f")),
        );
        r(&format!("link into {d}"), o.link("a", &format!("{d}/l")));
        r(&format!("chmod {d}"), o.chmod(d, 0o700));
        r(&format!("rmdir {d}"), o.unlink(d));
    }
    for f in ["i", "a", "di", "da"] {
        r(&format!("clear {f}"), o.setflags(f, ext));
    }
    r("size a", Err(o.size("a") as i32));
    r("size i", Err(o.size("i") as i32));
    out
}

#[test]
fn immutable_and_append_only_are_enforced_as_by_the_kernel() {
    if !kernel_ok() {
        return;
    }
    let (ka, ua) = twin_images("enforce", "64M", &[]);
    let fs = open_fs(&ua.0);
    for d in [b"di", b"da"] {
        fs.mkdir(ROOT_INO, d, 0o755, 0, 0).unwrap();
    }
    let ext = FL_EXTENTS;
    let mine = enforcement_script(&Engine(fs.clone()), ext);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&ua.0, "after the engine's enforcement script");
    let m = uext4_testkit::faulty::KernelMount::new(&ka.0);
    for d in ["di", "da"] {
        std::fs::create_dir(m.dir.join(d)).unwrap();
    }
    let theirs = enforcement_script(&Kernel(m.dir.clone()), ext);
    drop(m);
    e2fsck_clean_when(&ka.0, "after the kernel's enforcement script");
    let diff: Vec<String> = mine
        .iter()
        .zip(&theirs)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("{}: engine {:?}, kernel {:?}", a.0, a.1, b.1))
        .collect();
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    assert!(mine.iter().filter(|m| m.1 == Err(libc::EPERM)).count() > 30);
}

/// The rules the tests cannot ask the kernel as root: the owner may change the ordinary
/// flags, only a privileged caller IMMUTABLE, APPEND and JOURNAL_DATA, nobody else
/// anything; special files take only NODUMP and NOATIME.
#[test]
fn unprivileged_callers_and_special_files() {
    let img = scratch("flags-cred");
    mke2fs(&img.0, "32M", &[]);
    let fs = open_fs(&img.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 1000, 1000).unwrap().ino;
    let ext = fs.get_flags(f).unwrap();
    let owner = Cred::user(1000, 1000);
    let other = Cred::user(1001, 1001);
    assert!(fs.set_flags_as(&owner, f, ext | FL_NODUMP).is_ok());
    assert!(matches!(fs.set_flags_as(&other, f, ext), Err(Error::Perm)));
    for fl in [FL_IMMUTABLE, FL_APPEND, FL_JOURNAL_DATA] {
        assert!(matches!(
            fs.set_flags_as(&owner, f, ext | fl),
            Err(Error::Perm)
        ));
    }
    fs.set_flags(f, ext | FL_APPEND).unwrap();
    // Only a privileged caller takes APPEND away, even from its own file.
    assert!(matches!(fs.set_flags_as(&owner, f, ext), Err(Error::Perm)));
    assert!(fs
        .set_flags_as(&owner, f, ext | FL_APPEND | FL_NOATIME)
        .is_ok());
    fs.set_flags(f, ext).unwrap();
    let fifo = fs.mknod(ROOT_INO, b"p", 0o010644, 0, 0, 0).unwrap().ino;
    assert!(fs.set_flags(fifo, FL_NODUMP | FL_NOATIME).is_ok());
    assert!(matches!(
        fs.set_flags(fifo, FL_SYNC),
        Err(Error::NotSupported(_))
    ));
    assert!(matches!(fs.set_flags(f, 0), Err(Error::NotSupported(_))));
    // A SYNC file's write commits before it returns.
    fs.set_flags(f, ext | FL_SYNC).unwrap();
    let before = fs
        .txn_stats()
        .commits
        .load(std::sync::atomic::Ordering::Relaxed);
    fs.write(f, 0, &[7u8; 10000]).unwrap();
    let after = fs
        .txn_stats()
        .commits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(after > before, "a write to a SYNC file commits");
    // A DIRSYNC directory's new entries commit before the create returns; its files'
    // writes do not (the flag is the directory's, and files inherit only SYNC).
    let d = fs.mkdir(ROOT_INO, b"ds", 0o755, 0, 0).unwrap().ino;
    fs.set_flags(d, fs.get_flags(d).unwrap() | FL_DIRSYNC)
        .unwrap();
    let commits = || {
        fs.txn_stats()
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = commits();
    let g = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    assert!(
        commits() > before,
        "a create in a DIRSYNC directory commits"
    );
    assert_eq!(fs.get_flags(g).unwrap() & (FL_DIRSYNC | FL_SYNC), 0);
    let before = commits();
    fs.write(g, 0, b"x").unwrap();
    assert_eq!(commits(), before);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// The label: set by the engine (primary and backup superblocks), read by the kernel,
/// set by the kernel, read by the engine; 17 bytes are EINVAL for both.
#[test]
fn label_matches_the_kernel() {
    let img = scratch("label");
    mke2fs(&img.0, "64M", &["-b", "1024"]);
    let fs = open_fs(&img.0);
    assert_eq!(fs.label(), b"");
    fs.set_label(b"uext4-label").unwrap();
    assert!(matches!(
        fs.set_label(b"seventeen-bytes-x"),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.set_label_as(&Cred::user(1, 1), b"x"),
        Err(Error::Perm)
    ));
    assert_eq!(fs.label(), b"uext4-label");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    for sb in ["", "-o superblock=8193 -o blocksize=1024"] {
        let out = sh(&format!("dumpe2fs -h {sb} {} 2>/dev/null", img.s()));
        assert!(
            out.contains("Filesystem volume name:   uext4-label"),
            "superblock {sb}: {out}"
        );
    }
    if !kernel_ok() {
        return;
    }
    {
        let m = uext4_testkit::faulty::KernelMount::new(&img.0);
        let mut buf = [0u8; 256];
        ioctl_path(&m.dir, FS_IOC_GETFSLABEL, buf.as_mut_ptr().cast()).unwrap();
        assert_eq!(&buf[..12], b"uext4-label\0");
        let mut long = [0u8; 256];
        long[..17].copy_from_slice(b"seventeen-bytes-x");
        let r = ioctl_path(&m.dir, FS_IOC_SETFSLABEL, long.as_mut_ptr().cast());
        assert_eq!(r, Err(libc::EINVAL));
        let mut new = [0u8; 256];
        new[..12].copy_from_slice(b"kernel-label");
        ioctl_path(&m.dir, FS_IOC_SETFSLABEL, new.as_mut_ptr().cast()).unwrap();
    }
    e2fsck_clean(&img.0);
    let fs = open_fs(&img.0);
    assert_eq!(fs.label(), b"kernel-label");
    fs.unmount().unwrap();
}

/// A file of `blocks` 1 KiB blocks, every third one a hole and a preallocated tail, so that
/// its tree has two levels; the same on both systems.
fn fragmented(write: &mut dyn FnMut(u64, &[u8]), blocks: u64) {
    for b in 0..blocks {
        if b % 3 != 2 {
            let v = (b % 251) as u8 + 1;
            write(b * 1024, &[v; 1024]);
        }
    }
}

/// The collapse and insert requests, in order: (mode, offset, length) in bytes.
fn shift_requests() -> Vec<(i32, u64, u64)> {
    let c = FALLOC_FL_COLLAPSE_RANGE;
    let i = FALLOC_FL_INSERT_RANGE;
    vec![
        (c, 50 * 1024, 100 * 1024),
        (i, 500 * 1024, 37 * 1024),
        (c, 0, 1024),
        (i, 1024, 1000 * 1024),
        (c, 2 * 1024, 3 * 1024),
        (i, 0, 5 * 1024),
        (c, 3000 * 1024, 500 * 1024),
        (c, 100, 1024),
        (i, 1024, 512),
        (c | FALLOC_FL_KEEP_SIZE, 0, 1024),
        (c, 0, 100_000 * 1024),
        (i, 100_000 * 1024, 1024),
        (c, 1200 * 1024, 1700 * 1024),
        (i, 7 * 1024, 1024),
    ]
}

#[test]
fn collapse_and_insert_match_the_kernel() {
    if !kernel_ok() {
        return;
    }
    let (ka, ua) = twin_images("shift", "64M", &["-b", "1024"]);
    let blocks = 3600;
    let fs = open_fs(&ua.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fragmented(&mut |off, d| fs.write_all(f, off, d).unwrap(), blocks);
    fs.fallocate(f, FALLOC_FL_KEEP_SIZE, blocks * 1024, 300 * 1024)
        .unwrap();
    assert_eq!(fs.ext_tree_depth(f).unwrap(), 2);
    let mine: Vec<Res> = shift_requests()
        .into_iter()
        .map(|(m, o, l)| eng(fs.fallocate(f, m, o, l)))
        .collect();
    let size = fs.getattr(f).unwrap().size;
    let mut data = vec![0u8; size as usize];
    assert_eq!(fs.read(f, 0, &mut data).unwrap(), size as usize);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&ua.0, "after the engine's collapses and inserts");

    let m = uext4_testkit::faulty::KernelMount::new(&ka.0);
    let p = m.dir.join("f");
    {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        fragmented(&mut |off, d| file.write_all_at(d, off).unwrap(), blocks);
        file.sync_all().unwrap();
    }
    let k = Kernel(m.dir.clone());
    k.fallocate("f", FALLOC_FL_KEEP_SIZE, blocks * 1024, 300 * 1024)
        .unwrap();
    let theirs: Vec<Res> = shift_requests()
        .into_iter()
        .map(|(md, o, l)| k.fallocate("f", md, o, l))
        .collect();
    let kdata = std::fs::read(&p).unwrap();
    drop(m);
    e2fsck_clean_when(&ka.0, "after the kernel's collapses and inserts");
    assert_eq!(mine, theirs);
    assert_eq!(data.len(), kdata.len());
    assert!(data == kdata, "contents differ after the same shifts");
    // Each system reads the other's result.
    let kfs = open_fs(&ka.0);
    let kf = ino(&kfs, "f");
    let mut back = vec![0u8; kdata.len()];
    kfs.read(kf, 0, &mut back).unwrap();
    assert!(back == kdata);
    kfs.unmount().unwrap();
    let m = uext4_testkit::faulty::KernelMount::new(&ua.0);
    assert!(std::fs::read(m.dir.join("f")).unwrap() == data);
}

/// Shifts on 4 KiB blocks without a kernel: an insert splits an extent and reads back with
/// the hole where it opened; a collapse joins the two sides; e2fsck agrees at each step.
#[test]
fn collapse_and_insert_keep_data() {
    let img = scratch("shift-4k");
    mke2fs(&img.0, "32M", &[]);
    let fs = open_fs(&img.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model: Vec<u8> = (0..40 * 4096u32).map(|i| (i / 4096) as u8 + 1).collect();
    fs.write_all(f, 0, &model).unwrap();
    fs.fallocate(f, FALLOC_FL_INSERT_RANGE, 8 * 4096, 3 * 4096)
        .unwrap();
    model.splice(8 * 4096..8 * 4096, vec![0u8; 3 * 4096]);
    fs.fallocate(f, FALLOC_FL_COLLAPSE_RANGE, 20 * 4096, 5 * 4096)
        .unwrap();
    model.drain(20 * 4096..25 * 4096);
    let size = fs.getattr(f).unwrap().size;
    assert_eq!(size, model.len() as u64);
    let mut buf = vec![0u8; size as usize];
    fs.read(f, 0, &mut buf).unwrap();
    assert!(buf == model);
    let inline = fs.create(ROOT_INO, b"small", 0o644, 0, 0).unwrap().ino;
    fs.write_all(inline, 0, &[1u8; 8192]).unwrap();
    assert!(matches!(
        fs.fallocate(inline, FALLOC_FL_COLLAPSE_RANGE, 0, 8192),
        Err(Error::Invalid(_))
    ));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Random collapses and inserts (and writes between them) on a two-level tree, against a
/// model of the bytes; the image is e2fsck clean and reads the same after a reopen.
#[test]
fn random_shifts_follow_a_model() {
    let img = scratch("shift-random");
    mke2fs(&img.0, "64M", &["-b", "1024"]);
    let fs = open_fs(&img.0);
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![0u8; 3000 * 1024];
    fragmented(
        &mut |off, d| {
            fs.write_all(f, off, d).unwrap();
            model[off as usize..off as usize + d.len()].copy_from_slice(d);
        },
        3000,
    );
    // The last block is one of the holes: the file ends before it.
    model.truncate(fs.getattr(f).unwrap().size as usize);
    assert_eq!(fs.ext_tree_depth(f).unwrap(), 2);
    let seed = std::env::var("FUZZ_SEED").map_or(0x5eed, |s| s.parse().unwrap());
    let mut rnd = xorshift(seed);
    let ops = if std::env::var_os("UEXT4_QUICK").is_some() {
        60
    } else {
        200
    };
    for step in 0..ops {
        let blocks = model.len() as u64 / 1024;
        let r = rnd() % 10;
        if r < 4 && blocks > 2 {
            let off = rnd() % (blocks - 1);
            let len = 1 + rnd() % (blocks - 1 - off).min(40);
            fs.fallocate(f, FALLOC_FL_COLLAPSE_RANGE, off * 1024, len * 1024)
                .unwrap_or_else(|e| panic!("step {step}: collapse {off}+{len}: {e}"));
            model.drain(off as usize * 1024..(off + len) as usize * 1024);
        } else if r < 8 {
            let off = rnd() % blocks;
            let len = 1 + rnd() % 40;
            fs.fallocate(f, FALLOC_FL_INSERT_RANGE, off * 1024, len * 1024)
                .unwrap_or_else(|e| panic!("step {step}: insert {off}+{len}: {e}"));
            let at = off as usize * 1024;
            model.splice(at..at, vec![0u8; len as usize * 1024]);
        } else {
            let off = rnd() % (model.len() as u64);
            let len = (1 + rnd() % 2000).min(model.len() as u64 - off) as usize;
            let v = (step % 250) as u8 + 1;
            fs.write_all(f, off, &vec![v; len]).unwrap();
            model[off as usize..off as usize + len].fill(v);
        }
        assert_eq!(
            fs.getattr(f).unwrap().size,
            model.len() as u64,
            "step {step}"
        );
    }
    let check = |fs: &Fs| {
        let mut buf = vec![0u8; model.len()];
        assert_eq!(fs.read(f, 0, &mut buf).unwrap(), model.len());
        assert!(buf == model, "contents differ from the model");
    };
    check(&fs);
    eprintln!(
        "{ops} shifts and writes: {} bytes, {} extents, tree depth {}",
        model.len(),
        fs.ext_list(f).unwrap().len(),
        fs.ext_tree_depth(f).unwrap()
    );
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after random collapses and inserts");
    let fs = open_fs(&img.0);
    check(&fs);
    fs.unmount().unwrap();
}

/// A power cut at any point of a collapse or an insert (every flush point, and random
/// points with unflushed writes lost) leaves an `e2fsck -fn` clean image whose file reads as
/// before or after the change, never between: each is one transaction.
#[test]
fn a_crash_shows_a_shift_whole_or_not_at_all() {
    use uext4::blockdev::RecordingDevice;
    let base = scratch("shift-crash-base");
    mke2fs(&base.0, "16M", &["-b", "1024"]);
    let dev = Arc::new(RecordingDevice::new(std::fs::read(&base.0).unwrap()));
    let opts = MountOptions {
        commit_interval_secs: 0,
        ..Default::default()
    };
    let fs = Fs::open_dev(dev.clone(), opts.clone()).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = Vec::new();
    fragmented(
        &mut |off, d| {
            fs.write_all(f, off, d).unwrap();
            model.resize(model.len().max(off as usize + d.len()), 0);
            model[off as usize..off as usize + d.len()].copy_from_slice(d);
        },
        1500,
    );
    fs.fsync(f, false).unwrap();
    let start = dev.log_len();
    let mut versions = vec![model.clone()];
    let ops = [
        (FALLOC_FL_COLLAPSE_RANGE, 100u64, 300u64),
        (FALLOC_FL_INSERT_RANGE, 10, 50),
        (FALLOC_FL_COLLAPSE_RANGE, 0, 1),
        (FALLOC_FL_INSERT_RANGE, 700, 1),
    ];
    for (mode, off, len) in ops {
        fs.fallocate(f, mode, off * 1024, len * 1024).unwrap();
        let (o, l) = (off as usize * 1024, len as usize * 1024);
        if mode == FALLOC_FL_COLLAPSE_RANGE {
            model.drain(o..o + l);
        } else {
            model.splice(o..o, vec![0u8; l]);
        }
        fs.fsync(f, false).unwrap();
        versions.push(model.clone());
    }
    fs.unmount().unwrap();
    drop(fs);
    let total = dev.log_len();
    let mut points: Vec<(usize, u64)> = dev
        .flush_points()
        .into_iter()
        .filter(|&p| p >= start)
        .map(|p| (p, 0))
        .collect();
    let mut rnd = xorshift(0xC0FFEE);
    for _ in 0..24 {
        points.push((start + rnd() as usize % (total - start + 1), rnd() | 1));
    }
    let state = scratch("shift-crash-state");
    let mut seen = vec![0usize; versions.len()];
    for (at, seed) in &points {
        let mut s = *seed;
        let img = dev.crash_image(*at, &mut |_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            *seed != 0 && (s >> 33) % 3 != 0
        });
        std::fs::write(&state.0, img).unwrap();
        // Recovery first (the journal replays on a read-write open), then the checker.
        let fs = open_fs(&state.0);
        let size = fs.getattr(f).unwrap().size as usize;
        let mut buf = vec![0u8; size];
        fs.read(f, 0, &mut buf).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean_when(&state.0, &format!("crash at log entry {at}/{total}"));
        let v = versions.iter().position(|v| *v == buf);
        let v = v.unwrap_or_else(|| panic!("crash at {at}/{total}: the file is no version"));
        seen[v] += 1;
    }
    eprintln!(
        "{} crash states: versions seen {seen:?} ({} log entries)",
        points.len(),
        total - start
    );
    assert!(seen[0] > 0 && seen[versions.len() - 1] > 0);
}

/// FITRIM (trim.rs) counts what the kernel's ext4 counts: on the same image, the kernel's
/// FITRIM on a fresh mount and `Fs::trim` discard the same number of bytes (every free run of
/// each group), and the engine's image is `e2fsck -fn` clean with its files whole.
#[test]
fn trim_counts_as_the_kernel() {
    if !kernel_ok() {
        return;
    }
    let (ka, ua) = twin_images("trim", "64M", &[]);
    let fs = open_fs(&ua.0);
    let mut kept = Vec::new();
    for i in 0..40u32 {
        let name = format!("f{i}");
        let a = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap();
        let data = vec![i as u8 + 1; 100_000 + i as usize * 4096];
        fs.write_all(a.ino, 0, &data).unwrap();
        if i % 3 == 0 {
            kept.push((a.ino, data));
        }
    }
    for i in (0..40u32).filter(|i| i % 3 != 0) {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    std::fs::copy(&ua.0, &ka.0).unwrap();
    let fs = open_fs(&ua.0);
    let mine = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(mine.supported);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&ua.0, "after FITRIM");
    let fs = open_fs(&ua.0);
    for (ino, data) in &kept {
        let mut buf = vec![0u8; data.len()];
        fs.read(*ino, 0, &mut buf).unwrap();
        assert!(buf == *data, "inode {ino} changed");
    }
    fs.unmount().unwrap();
    let m = uext4_testkit::faulty::KernelMount::new(&ka.0);
    let mut range = [0u64, u64::MAX, 0];
    ioctl_path(&m.dir, 0xC018_5879, range.as_mut_ptr().cast()).unwrap();
    drop(m);
    assert_eq!(mine.bytes, range[1], "bytes trimmed: engine, kernel");
}
