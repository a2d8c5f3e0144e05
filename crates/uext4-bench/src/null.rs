//! fuse-null: a FUSE server on the same crate and thread count as uext4 that does no work. Files
//! live only as names and sizes in one flat directory; reads return zeros, writes are dropped.
//! It measures the ceiling of the FUSE transport.

use anyhow::Result;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime};

const TTL: Duration = Duration::from_secs(1);

/// The open flags uext4's server gives (`Uext4Fuse::open_flags`), so both take the same path
/// through the kernel: an O_DIRECT open gets FOPEN_DIRECT_IO, without which the kernel ignores
/// FOPEN_PARALLEL_DIRECT_WRITES.
fn open_flags(flags: i32) -> FopenFlags {
    let mut f = FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
    if flags & libc::O_DIRECT != 0 {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    f
}

struct Null {
    #[allow(clippy::type_complexity)]
    files: Mutex<(HashMap<Vec<u8>, u64>, HashMap<u64, u64>, u64)>,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    let t = SystemTime::UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size / 512,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o777 } else { 0o666 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Null {
    fn lookup(&self, _r: &Request, _p: INodeNo, name: &OsStr, reply: ReplyEntry) {
        use std::os::unix::ffi::OsStrExt;
        let f = self.files.lock();
        match f.0.get(name.as_bytes()) {
            Some(&ino) => reply.entry(&TTL, &attr(ino, f.1[&ino], false), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == 1 {
            return reply.attr(&TTL, &attr(1, 4096, true));
        }
        let f = self.files.lock();
        match f.1.get(&ino.0) {
            Some(&s) => reply.attr(&TTL, &attr(ino.0, s, false)),
            None => reply.error(Errno::ENOENT),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _r: &Request,
        ino: INodeNo,
        _m: Option<u32>,
        _u: Option<u32>,
        _g: Option<u32>,
        size: Option<u64>,
        _a: Option<TimeOrNow>,
        _mt: Option<TimeOrNow>,
        _c: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _cr: Option<SystemTime>,
        _ch: Option<SystemTime>,
        _b: Option<SystemTime>,
        _fl: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino.0 == 1 {
            return reply.attr(&TTL, &attr(1, 4096, true));
        }
        let mut f = self.files.lock();
        if let Some(s) = size {
            f.1.insert(ino.0, s);
        }
        let s = f.1.get(&ino.0).copied().unwrap_or(0);
        reply.attr(&TTL, &attr(ino.0, s, false));
    }
    fn create(
        &self,
        _r: &Request,
        _p: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        use std::os::unix::ffi::OsStrExt;
        let mut f = self.files.lock();
        let ino = match f.0.get(name.as_bytes()) {
            Some(&i) => i,
            None => {
                f.2 += 1;
                let i = f.2;
                f.0.insert(name.as_bytes().to_vec(), i);
                f.1.insert(i, 0);
                i
            }
        };
        let s = f.1[&ino];
        reply.created(
            &TTL,
            &attr(ino, s, false),
            Generation(0),
            FileHandle(0),
            open_flags(flags),
        );
    }
    fn open(&self, _r: &Request, _ino: INodeNo, f: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), open_flags(f.0));
    }
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.files.lock().1.get(&ino.0).copied().unwrap_or(0);
        let n = len.saturating_sub(offset).min(size as u64) as usize;
        reply.data(&vec![0u8; n]);
    }
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _w: WriteFlags,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let end = offset + data.len() as u64;
        let mut f = self.files.lock();
        let s = f.1.entry(ino.0).or_insert(0);
        if *s < end {
            *s = end;
        }
        reply.written(data.len() as u32);
    }
    fn flush(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _l: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }
    fn fsync(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }
    fn unlink(&self, _r: &Request, _p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        use std::os::unix::ffi::OsStrExt;
        let mut f = self.files.lock();
        match f.0.remove(name.as_bytes()) {
            Some(i) => {
                f.1.remove(&i);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }
    fn readdir(
        &self,
        _r: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let f = self.files.lock();
        let mut names: Vec<(&Vec<u8>, &u64)> = f.0.iter().collect();
        names.sort();
        for (i, (n, &ino)) in names.into_iter().enumerate().skip(offset as usize) {
            use std::os::unix::ffi::OsStrExt;
            if reply.add(
                INodeNo(ino),
                i as u64 + 1,
                FileType::RegularFile,
                OsStr::from_bytes(n),
            ) {
                break;
            }
        }
        reply.ok();
    }
    fn statfs(&self, _r: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

/// Serves the do-nothing filesystem at `mountpoint` until it is unmounted.
pub fn serve(mountpoint: &Path, threads: usize) -> Result<()> {
    let mut c = Config::default();
    c.mount_options = vec![MountOption::FSName("fuse-null".into()), MountOption::RW];
    c.acl = SessionACL::All;
    c.n_threads = Some(threads.max(2));
    c.clone_fd = true;
    fuser::mount2(
        Null {
            files: Mutex::new((HashMap::new(), HashMap::new(), 1)),
        },
        mountpoint,
        &c,
    )?;
    Ok(())
}
