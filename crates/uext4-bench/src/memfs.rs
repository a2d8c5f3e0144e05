//! fuse-mem: the metadata workloads' FUSE ceiling. A minimal in-memory filesystem on the same
//! crate, thread count, TTL and INIT capabilities as uext4's server (`uext4_fuse`): real
//! directories, files, symbolic and hard links, attributes and data, all kept in memory behind
//! one lock, nothing persisted. What a metadata workload costs on it is what the FUSE transport
//! and the kernel's FUSE client cost for that sequence of requests; what uext4 takes beyond it
//! is the engine's and its server's share.

use anyhow::Result;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// uext4's server answers with the same TTL (`uext4_fuse`'s `TTL`).
const TTL: Duration = Duration::from_secs(1);

struct Node {
    kind: FileType,
    perm: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    data: Vec<u8>,
    /// Directories: name to inode.
    children: BTreeMap<Vec<u8>, u64>,
    parent: u64,
}

impl Node {
    fn new(kind: FileType, perm: u16, uid: u32, gid: u32, parent: u64) -> Node {
        let now = SystemTime::now();
        Node {
            kind,
            perm,
            uid,
            gid,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            atime: now,
            mtime: now,
            ctime: now,
            data: Vec::new(),
            children: BTreeMap::new(),
            parent,
        }
    }
    fn attr(&self, ino: u64) -> FileAttr {
        let size = if self.kind == FileType::Directory {
            4096
        } else {
            self.data.len() as u64
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(4096) * 8,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
}

struct Mem {
    st: Mutex<State>,
}

fn time_of(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl State {
    /// Links a new node `n` as `name` in `parent`.
    fn add(&mut self, parent: u64, name: &OsStr, n: Node) -> Result<FileAttr, Errno> {
        let dir = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if dir.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if dir.children.contains_key(name.as_bytes()) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        let is_dir = n.kind == FileType::Directory;
        let attr = n.attr(ino);
        self.nodes.insert(ino, n);
        let now = SystemTime::now();
        let dir = self.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        dir.children.insert(name.as_bytes().to_vec(), ino);
        dir.mtime = now;
        dir.ctime = now;
        if is_dir {
            dir.nlink += 1;
        }
        Ok(attr)
    }

    /// Drops one link of `ino`; the node goes with its last one (open files are not kept: the
    /// workloads never read a file they removed).
    fn drop_link(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.nlink = n.nlink.saturating_sub(1);
            n.ctime = SystemTime::now();
            if n.nlink == 0 || n.kind == FileType::Directory {
                self.nodes.remove(&ino);
            }
        }
    }

    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let dir = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        let ino = *dir.children.get(name.as_bytes()).ok_or(Errno::ENOENT)?;
        let n = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let is_dir = n.kind == FileType::Directory;
        if want_dir != is_dir {
            return Err(if want_dir {
                Errno::ENOTDIR
            } else {
                Errno::EISDIR
            });
        }
        if is_dir && !n.children.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let now = SystemTime::now();
        let dir = self.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        dir.children.remove(name.as_bytes());
        dir.mtime = now;
        dir.ctime = now;
        if is_dir {
            dir.nlink -= 1;
        }
        self.drop_link(ino);
        Ok(())
    }
}

impl Mem {
    fn entry(&self, reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for Mem {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // What uext4's server asks for (its `init`), but for what needs an image.
        for c in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
        ] {
            let _ = config.add_capabilities(c);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        Ok(())
    }

    fn lookup(&self, _r: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = self.st.lock();
        let r = st
            .nodes
            .get(&parent.0)
            .and_then(|d| d.children.get(name.as_bytes()))
            .and_then(|&i| st.nodes.get(&i).map(|n| n.attr(i)))
            .ok_or(Errno::ENOENT);
        self.entry(reply, r);
    }

    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.st.lock().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr(ino.0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _r: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _cr: Option<SystemTime>,
        _ch: Option<SystemTime>,
        _b: Option<SystemTime>,
        _fl: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.st.lock();
        let Some(n) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(m) = mode {
            n.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = uid {
            n.uid = u;
        }
        if let Some(g) = gid {
            n.gid = g;
        }
        if let Some(s) = size {
            n.data.resize(s as usize, 0);
            n.mtime = SystemTime::now();
        }
        if let Some(t) = atime {
            n.atime = time_of(t);
        }
        if let Some(t) = mtime {
            n.mtime = time_of(t);
        }
        n.ctime = ctime.unwrap_or_else(SystemTime::now);
        reply.attr(&TTL, &n.attr(ino.0));
    }

    fn readlink(&self, _r: &Request, ino: INodeNo, reply: ReplyData) {
        match self.st.lock().nodes.get(&ino.0) {
            Some(n) if n.kind == FileType::Symlink => reply.data(&n.data),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mknod(
        &self,
        r: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let n = Node::new(
            FileType::RegularFile,
            (mode & !umask & 0o7777) as u16,
            r.uid(),
            r.gid(),
            parent.0,
        );
        let res = self.st.lock().add(parent.0, name, n);
        self.entry(reply, res);
    }

    fn mkdir(
        &self,
        r: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let n = Node::new(
            FileType::Directory,
            (mode & !umask & 0o7777) as u16,
            r.uid(),
            r.gid(),
            parent.0,
        );
        let res = self.st.lock().add(parent.0, name, n);
        self.entry(reply, res);
    }

    fn unlink(&self, _r: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.st.lock().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _r: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.st.lock().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        r: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut n = Node::new(FileType::Symlink, 0o777, r.uid(), r.gid(), parent.0);
        n.data = target.as_os_str().as_bytes().to_vec();
        let res = self.st.lock().add(parent.0, link_name, n);
        self.entry(reply, res);
    }

    fn rename(
        &self,
        _r: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let mut st = self.st.lock();
        let r = (|| -> Result<(), Errno> {
            let ino = *st
                .nodes
                .get(&parent.0)
                .and_then(|d| d.children.get(name.as_bytes()))
                .ok_or(Errno::ENOENT)?;
            let is_dir = st.nodes.get(&ino).map(|n| n.kind) == Some(FileType::Directory);
            let old = st
                .nodes
                .get(&newparent.0)
                .ok_or(Errno::ENOENT)?
                .children
                .get(newname.as_bytes())
                .copied();
            if old == Some(ino) {
                return Ok(());
            }
            if let Some(o) = old {
                let odir = st.nodes.get(&o).map(|n| n.kind) == Some(FileType::Directory);
                st.remove(newparent.0, newname, odir)?;
            }
            let now = SystemTime::now();
            let d = st.nodes.get_mut(&parent.0).ok_or(Errno::ENOENT)?;
            d.children.remove(name.as_bytes());
            d.mtime = now;
            d.ctime = now;
            if is_dir {
                d.nlink -= 1;
            }
            let nd = st.nodes.get_mut(&newparent.0).ok_or(Errno::ENOENT)?;
            nd.children.insert(newname.as_bytes().to_vec(), ino);
            nd.mtime = now;
            nd.ctime = now;
            if is_dir {
                nd.nlink += 1;
            }
            if let Some(n) = st.nodes.get_mut(&ino) {
                n.parent = newparent.0;
                n.ctime = now;
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _r: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut st = self.st.lock();
        let r = (|| -> Result<FileAttr, Errno> {
            let dir = st.nodes.get(&newparent.0).ok_or(Errno::ENOENT)?;
            if dir.children.contains_key(newname.as_bytes()) {
                return Err(Errno::EEXIST);
            }
            let n = st.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            if n.kind == FileType::Directory {
                return Err(Errno::EPERM);
            }
            n.nlink += 1;
            n.ctime = SystemTime::now();
            let attr = n.attr(ino.0);
            let d = st.nodes.get_mut(&newparent.0).ok_or(Errno::ENOENT)?;
            d.children.insert(newname.as_bytes().to_vec(), ino.0);
            d.mtime = SystemTime::now();
            Ok(attr)
        })();
        self.entry(reply, r);
    }

    fn open(&self, _r: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.st.lock();
        let Some(n) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.0 & libc::O_TRUNC != 0 {
            n.data.clear();
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

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
        let st = self.st.lock();
        let Some(n) = st.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let start = (offset as usize).min(n.data.len());
        let end = (start + size as usize).min(n.data.len());
        reply.data(&n.data[start..end]);
    }

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
        let mut st = self.st.lock();
        let Some(n) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let off = offset as usize;
        let end = off + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[off..end].copy_from_slice(data);
        let now = SystemTime::now();
        n.mtime = now;
        n.ctime = now;
        reply.written(data.len() as u32);
    }

    fn flush(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _l: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsyncdir(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn readdir(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = self.st.lock();
        let Some(d) = st.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let dots = [
            (b".".to_vec(), ino.0, FileType::Directory),
            (b"..".to_vec(), d.parent, FileType::Directory),
        ];
        let kids = d.children.iter().map(|(n, &i)| {
            let k = st
                .nodes
                .get(&i)
                .map(|n| n.kind)
                .unwrap_or(FileType::RegularFile);
            (n.clone(), i, k)
        });
        for (i, (name, child, kind)) in dots
            .into_iter()
            .chain(kids)
            .enumerate()
            .skip(offset as usize)
        {
            if reply.add(INodeNo(child), i as u64 + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let st = self.st.lock();
        let Some(d) = st.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let mut list: Vec<(Vec<u8>, u64)> =
            vec![(b".".to_vec(), ino.0), (b"..".to_vec(), d.parent)];
        list.extend(d.children.iter().map(|(n, &i)| (n.clone(), i)));
        for (i, (name, child)) in list.into_iter().enumerate().skip(offset as usize) {
            let attr = match st.nodes.get(&child) {
                Some(n) => n.attr(child),
                None => continue,
            };
            if reply.add(
                INodeNo(child),
                i as u64 + 1,
                OsStr::from_bytes(&name),
                &TTL,
                &attr,
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _r: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn getxattr(&self, _r: &Request, _i: INodeNo, _n: &OsStr, _s: u32, reply: ReplyXattr) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _r: &Request, _i: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _r: &Request, _i: INodeNo, _m: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        r: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let n = Node::new(
            FileType::RegularFile,
            (mode & !umask & 0o7777) as u16,
            r.uid(),
            r.gid(),
            parent.0,
        );
        match self.st.lock().add(parent.0, name, n) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}

/// Serves the in-memory filesystem at `mountpoint` until it is unmounted.
pub fn serve(mountpoint: &Path, threads: usize) -> Result<()> {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("fuse-mem".into()),
        MountOption::RW,
        MountOption::DefaultPermissions,
    ];
    c.acl = SessionACL::All;
    c.n_threads = Some(threads.max(2));
    c.clone_fd = true;
    let mut nodes = HashMap::new();
    let mut root = Node::new(FileType::Directory, 0o755, 0, 0, 1);
    root.parent = 1;
    nodes.insert(1, root);
    fuser::mount2(
        Mem {
            st: Mutex::new(State { nodes, next: 2 }),
        },
        mountpoint,
        &c,
    )?;
    Ok(())
}
