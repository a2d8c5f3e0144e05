//! Reading a host tree for a copy into an image, on a thread of its own: the walk (names in
//! order, status, extended attributes, link targets, regular files opened) runs ahead of the
//! copy, which only makes entries. The order is the copy's (names sorted in each directory),
//! so the image does not depend on how fast either side runs.
//!
//! Entries are reached relative to their directory's descriptor (`fstatat`, `openat`), not by
//! full paths the kernel would walk again for every entry. What is read ahead is bounded: at
//! most [`AHEAD`] batches of [`BATCH`] entries are on their way (entries travel in batches:
//! one wake-up of the other side per batch). File data is not read here: files travel open,
//! and their bytes go from the file to the image in the kernel (data_writer.rs), so memory
//! does not grow with the tree.

use crate::host::fd_xattrs;
use anyhow::{anyhow, Context, Result};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Batches of entries read ahead of the copy.
const AHEAD: usize = 8;
/// Entries sent at once.
const BATCH: usize = 32;
/// Directory levels whose descriptors stay open during the walk.
const HELD: usize = 64;

/// What `lstat` says of a host entry, as far as a copy uses it.
#[derive(Clone, Copy)]
pub(super) struct Stat {
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) nlink: u64,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) rdev: u64,
    pub(super) size: u64,
    pub(super) blocks: u64,
    pub(super) atime: (i64, i64),
    pub(super) mtime: (i64, i64),
}

impl Stat {
    fn from(s: &libc::stat) -> Stat {
        Stat {
            mode: s.st_mode,
            uid: s.st_uid,
            gid: s.st_gid,
            nlink: s.st_nlink,
            dev: s.st_dev,
            ino: s.st_ino,
            rdev: s.st_rdev,
            size: s.st_size as u64,
            blocks: s.st_blocks as u64,
            atime: (s.st_atime, s.st_atime_nsec),
            mtime: (s.st_mtime, s.st_mtime_nsec),
        }
    }
    pub(super) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
}

/// A regular file, open, with its data segments (offset, length): one segment over the whole
/// file unless it has holes.
pub(super) struct Data(pub(super) File, pub(super) Vec<(u64, u64)>);

/// What a host entry is, with what the copy needs of it besides its status.
pub(super) enum Kind {
    /// A directory: its entries follow, then [`Kind::EndDir`].
    Dir,
    /// The end of the directory last begun, with its extended attributes.
    EndDir(std::io::Result<Xattrs>),
    File(Data, std::io::Result<Xattrs>),
    Symlink(Vec<u8>, std::io::Result<Xattrs>),
    /// A device, FIFO or socket.
    Special(std::io::Result<Xattrs>),
}

pub(super) type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of the walk, in copy order.
pub(super) struct Entry {
    /// The host path, for messages.
    pub(super) path: PathBuf,
    pub(super) name: Vec<u8>,
    pub(super) st: Stat,
    pub(super) kind: Kind,
}

/// Walks `top` (any kind of entry; a directory's contents only with `recursive`) on a new
/// thread of `scope`, sending its entries in copy order. A failure to read ends the walk
/// with an error naming the path; the walk also ends when the receiver is dropped.
pub(super) fn walk<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    top: &Path,
    recursive: bool,
) -> Receiver<Result<Vec<Entry>>> {
    let (tx, rx) = sync_channel(AHEAD);
    let top = top.to_path_buf();
    raise_descriptor_limit();
    scope.spawn(move || {
        let w = Walk {
            tx,
            pending: Default::default(),
        };
        let r = w.top(&top, recursive);
        let _ = w.flush();
        if let Err(e) = r {
            let _ = w.tx.send(Err(e));
        }
    });
    rx
}

/// A send the receiver stopped listening to: the copy failed and the walk just ends.
struct Gone;

impl From<Gone> for anyhow::Error {
    fn from(_: Gone) -> Self {
        anyhow!("the copy stopped")
    }
}

struct Walk {
    tx: SyncSender<Result<Vec<Entry>>>,
    /// Entries not yet sent.
    pending: super::Gather<Entry, BATCH>,
}

impl Walk {
    fn send(&self, e: Entry) -> Result<()> {
        match self.pending.push(e) {
            true => self.flush(),
            false => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        let batch = self.pending.take();
        if batch.is_empty() {
            return Ok(());
        }
        self.tx.send(Ok(batch)).map_err(|_| Gone.into())
    }

    fn top(&self, top: &Path, recursive: bool) -> Result<()> {
        let name = top
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_default();
        let c = cstring(top.as_os_str().as_bytes())?;
        // Errors here are about the source itself, which the caller names.
        let st = lstat_at(libc::AT_FDCWD, &c)?;
        if st.is_dir() && recursive {
            let fd = open_at(libc::AT_FDCWD, &c, libc::O_DIRECTORY)?;
            return self.dir(fd, top.to_path_buf(), name, st, 0);
        }
        self.send(self.entry(libc::AT_FDCWD, &c, top.to_path_buf(), name, st)?)
    }

    /// Sends a directory, its entries (names in byte order) and its end. Directories down to
    /// [`HELD`] levels keep their descriptor while their entries are read; deeper ones are
    /// closed once listed and their entries reached by full path, so no depth of tree runs out
    /// of descriptors.
    fn dir(&self, fd: OwnedFd, path: PathBuf, name: Vec<u8>, st: Stat, depth: usize) -> Result<()> {
        self.send(Entry {
            path: path.clone(),
            name: name.clone(),
            st,
            kind: Kind::Dir,
        })?;
        let mut names = list(&fd).with_context(|| path.display().to_string())?;
        names.sort_unstable();
        let xattrs = fd_xattrs(fd.as_raw_fd());
        let held = (depth < HELD).then_some(fd);
        let at = held.as_ref().map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
        for (n, regular) in names {
            let p = path.join(std::ffi::OsStr::from_bytes(n.to_bytes()));
            let bytes = n.to_bytes().to_vec();
            let n = match held {
                Some(_) => n,
                None => cstring(p.as_os_str().as_bytes())?,
            };
            // A regular file (as the listing says) is opened first and its status read from
            // the descriptor: one lookup of the name instead of two. Anything else, or a name
            // that changed meanwhile, goes the general way.
            if let Some((fd, st)) = regular.then(|| open_regular(at, &n)).flatten() {
                let e = self
                    .file(fd, p.clone(), bytes, st)
                    .with_context(|| p.display().to_string())?;
                self.send(e)?;
                continue;
            }
            let st = lstat_at(at, &n).with_context(|| p.display().to_string())?;
            if st.is_dir() {
                let sub =
                    open_at(at, &n, libc::O_DIRECTORY).with_context(|| p.display().to_string())?;
                self.dir(sub, p, bytes, st, depth + 1)?;
            } else {
                let e = self
                    .entry(at, &n, p.clone(), bytes, st)
                    .with_context(|| p.display().to_string())?;
                self.send(e)?;
            }
        }
        self.send(Entry {
            path,
            name,
            st,
            kind: Kind::EndDir(xattrs),
        })
    }

    /// A non-directory (or a directory not descended into), read: data, link target, xattrs.
    fn entry(
        &self,
        dir: RawFd,
        name: &CStr,
        path: PathBuf,
        bytes: Vec<u8>,
        st: Stat,
    ) -> Result<Entry> {
        let kind = if st.is_file() {
            return self.file(open_at(dir, name, 0)?, path, bytes, st);
        } else if st.is_symlink() {
            let target = readlink_at(dir, name)?;
            Kind::Symlink(target, crate::host::host_xattrs(&path))
        } else if st.is_dir() {
            Kind::Dir
        } else {
            Kind::Special(crate::host::host_xattrs(&path))
        };
        Ok(Entry {
            path,
            name: bytes,
            st,
            kind,
        })
    }
}

impl Walk {
    /// A regular file, open: data segments and extended attributes.
    fn file(&self, fd: OwnedFd, path: PathBuf, bytes: Vec<u8>, st: Stat) -> Result<Entry> {
        let xattrs = fd_xattrs(fd.as_raw_fd());
        let f = File::from(fd);
        // A file with as many blocks as bytes has no holes: no need to ask where they are.
        let segs = if st.blocks * 512 < st.size {
            crate::host::host_segments(&f, st.size)
        } else {
            vec![(0, st.size)]
        };
        Ok(Entry {
            path,
            name: bytes,
            st,
            kind: Kind::File(Data(f, segs), xattrs),
        })
    }
}

/// `name` in `dir` opened and its status, if it is a regular file (without following a
/// symlink, and without waiting on a FIFO put there since the listing).
fn open_regular(dir: RawFd, name: &CStr) -> Option<(OwnedFd, Stat)> {
    let fd = open_at(dir, name, libc::O_NONBLOCK | libc::O_NOCTTY).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a descriptor we hold and a buffer for one stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), s.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat filled it.
    let st = Stat::from(unsafe { &s.assume_init() });
    st.is_file().then_some((fd, st))
}

/// Files travel open from the walk to the data writers (a few hundred at a time, besides the
/// directories held): the soft limit on descriptors goes up to the hard one, as far as it
/// can.
fn raise_descriptor_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one struct on our stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn cstring(b: &[u8]) -> Result<CString> {
    CString::new(b).map_err(|_| anyhow!("a name with a NUL byte"))
}

fn lstat_at(dir: RawFd, name: &CStr) -> std::io::Result<Stat> {
    let mut s = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid C string and a buffer for one stat.
    let r = unsafe {
        libc::fstatat(
            dir,
            name.as_ptr(),
            s.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatat filled it.
    Ok(Stat::from(unsafe { &s.assume_init() }))
}

fn open_at(dir: RawFd, name: &CStr, flags: i32) -> std::io::Result<OwnedFd> {
    let flags = flags | libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid C string.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn readlink_at(dir: RawFd, name: &CStr) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: a valid C string and a buffer valid for its length.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The names in a directory (without `.` and `..`), each with whether the listing says it is
/// a regular file.
fn list(fd: &OwnedFd) -> std::io::Result<Vec<(CString, bool)>> {
    // SAFETY: dup of a valid descriptor; fdopendir takes the copy and closedir closes it.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: fdopendir failed, so the copy is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut out = Vec::new();
    let r = loop {
        // SAFETY: errno is thread-local; readdir on the stream opened above.
        unsafe { *libc::__errno_location() = 0 };
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            let errno = std::io::Error::last_os_error();
            break match errno.raw_os_error() {
                Some(0) | None => Ok(()),
                _ => Err(errno),
            };
        }
        // SAFETY: readdir's entry holds a NUL-terminated name, valid until the next call.
        let n = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        if n.to_bytes() != b"." && n.to_bytes() != b".." {
            // SAFETY: as above.
            out.push((n.to_owned(), unsafe { (*ent).d_type } == libc::DT_REG));
        }
    };
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(d) };
    r.map(|()| out)
}
