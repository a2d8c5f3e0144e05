//! fuse-mem: the metadata workloads' FUSE ceiling. A minimal in-memory filesystem on the same
//! transport, thread count, timeouts and INIT capabilities (POSIX ACLs included) as uext4's
//! server (`uext4_fuse`), which answers OPEN, FLUSH and OPENDIR as it does, so that the kernel
//! sends it the same requests: real
//! directories, files, symbolic and hard links, attributes and data, all kept in memory behind
//! one lock, nothing persisted. What a metadata workload costs on it is what the FUSE transport
//! and the kernel's FUSE client cost for that sequence of requests; what uext4 takes beyond it
//! is the engine's and its server's share.

use anyhow::Result;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uext4_fuse::abi::{self, InitIn, InitOut};
use uext4_fuse::reply::{self, Dirents, WireAttr};
use uext4_fuse::request::{Op, TimeArg};
use uext4_fuse::transport::{Answer, InHeader, RawRequest, Serve, Transport};

/// uext4's server answers with the same timeouts for names and attributes (its default
/// `entry_timeout` and `attr_timeout`: both are the mount's only writer).
const TTL: Duration = uext4_fuse::options::LONG_TIMEOUT;

const DIR: u32 = libc::S_IFDIR;
const REG: u32 = libc::S_IFREG;
const LNK: u32 = libc::S_IFLNK;

type R<T> = std::result::Result<T, i32>;

fn now() -> (i64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

struct Node {
    /// S_IFDIR, S_IFREG or S_IFLNK.
    kind: u32,
    perm: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    atime: (i64, u32),
    mtime: (i64, u32),
    ctime: (i64, u32),
    data: Vec<u8>,
    /// Directories: name to inode.
    children: BTreeMap<Vec<u8>, u64>,
    parent: u64,
}

impl Node {
    fn new(kind: u32, perm: u32, h: &InHeader, parent: u64) -> Node {
        let t = now();
        Node {
            kind,
            perm,
            uid: h.uid,
            gid: h.gid,
            nlink: if kind == DIR { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            data: Vec::new(),
            children: BTreeMap::new(),
            parent,
        }
    }
    fn attr(&self, ino: u64) -> WireAttr {
        let size = if self.kind == DIR {
            4096
        } else {
            self.data.len() as u64
        };
        WireAttr {
            ino,
            size,
            blocks: size.div_ceil(4096) * 8,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            mode: self.kind | self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
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

impl State {
    fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> R<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    /// Links a new node `n` as `name` in `parent`.
    fn add(&mut self, parent: u64, name: &[u8], n: Node) -> R<WireAttr> {
        let dir = self.node(parent)?;
        if dir.kind != DIR {
            return Err(libc::ENOTDIR);
        }
        if dir.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        let is_dir = n.kind == DIR;
        let attr = n.attr(ino);
        self.nodes.insert(ino, n);
        let t = now();
        let dir = self.node_mut(parent)?;
        dir.children.insert(name.to_vec(), ino);
        dir.mtime = t;
        dir.ctime = t;
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
            n.ctime = now();
            if n.nlink == 0 || n.kind == DIR {
                self.nodes.remove(&ino);
            }
        }
    }

    fn remove(&mut self, parent: u64, name: &[u8], want_dir: bool) -> R<()> {
        let ino = *self.node(parent)?.children.get(name).ok_or(libc::ENOENT)?;
        let n = self.node(ino)?;
        let is_dir = n.kind == DIR;
        if want_dir != is_dir {
            return Err(if want_dir {
                libc::ENOTDIR
            } else {
                libc::EISDIR
            });
        }
        if is_dir && !n.children.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        let t = now();
        let dir = self.node_mut(parent)?;
        dir.children.remove(name);
        dir.mtime = t;
        dir.ctime = t;
        if is_dir {
            dir.nlink -= 1;
        }
        self.drop_link(ino);
        Ok(())
    }

    fn rename(&mut self, parent: u64, name: &[u8], newparent: u64, newname: &[u8]) -> R<()> {
        let ino = *self.node(parent)?.children.get(name).ok_or(libc::ENOENT)?;
        let is_dir = self.node(ino)?.kind == DIR;
        let old = self.node(newparent)?.children.get(newname).copied();
        if old == Some(ino) {
            return Ok(());
        }
        if let Some(o) = old {
            let odir = self.node(o)?.kind == DIR;
            self.remove(newparent, newname, odir)?;
        }
        let t = now();
        let d = self.node_mut(parent)?;
        d.children.remove(name);
        d.mtime = t;
        d.ctime = t;
        if is_dir {
            d.nlink -= 1;
        }
        let nd = self.node_mut(newparent)?;
        nd.children.insert(newname.to_vec(), ino);
        nd.mtime = t;
        nd.ctime = t;
        if is_dir {
            nd.nlink += 1;
        }
        let n = self.node_mut(ino)?;
        n.parent = newparent;
        n.ctime = t;
        Ok(())
    }

    fn link(&mut self, ino: u64, newparent: u64, newname: &[u8]) -> R<WireAttr> {
        if self.node(newparent)?.children.contains_key(newname) {
            return Err(libc::EEXIST);
        }
        let n = self.node_mut(ino)?;
        if n.kind == DIR {
            return Err(libc::EPERM);
        }
        n.nlink += 1;
        n.ctime = now();
        let attr = n.attr(ino);
        let d = self.node_mut(newparent)?;
        d.children.insert(newname.to_vec(), ino);
        d.mtime = now();
        Ok(attr)
    }

    fn setattr(&mut self, ino: u64, s: &uext4_fuse::request::SetattrIn) -> R<WireAttr> {
        let n = self.node_mut(ino)?;
        let time = |t: TimeArg| match t {
            TimeArg::Now => now(),
            TimeArg::At(s, ns) => (s, ns),
        };
        if let Some(m) = s.mode {
            n.perm = m & 0o7777;
        }
        if let Some(u) = s.uid {
            n.uid = u;
        }
        if let Some(g) = s.gid {
            n.gid = g;
        }
        if let Some(sz) = s.size {
            n.data.resize(sz as usize, 0);
            n.mtime = now();
        }
        if let Some(t) = s.atime {
            n.atime = time(t);
        }
        if let Some(t) = s.mtime {
            n.mtime = time(t);
        }
        n.ctime = s.ctime.unwrap_or_else(now);
        Ok(n.attr(ino))
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> R<u32> {
        let n = self.node_mut(ino)?;
        let off = offset as usize;
        let end = off + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[off..end].copy_from_slice(data);
        let t = now();
        n.mtime = t;
        n.ctime = t;
        Ok(data.len() as u32)
    }

    /// A listing from `offset`: ".", "..", then the children, each entry's offset its
    /// successor's index.
    fn readdir(&self, ino: u64, offset: u64, size: u32, plus: bool, out: &mut [u8]) -> R<usize> {
        let d = self.node(ino)?;
        let mut list: Vec<(&[u8], u64)> = vec![(b".", ino), (b"..", d.parent)];
        list.extend(d.children.iter().map(|(n, &i)| (n.as_slice(), i)));
        let mut r = Dirents::new(out, size);
        for (i, (name, child)) in list.into_iter().enumerate().skip(offset as usize) {
            let Some(n) = self.nodes.get(&child) else {
                continue;
            };
            let added = if plus {
                r.add_plus(0, reply::Ttl::both(TTL), &n.attr(child), i as u64 + 1, name)
            } else {
                r.add(child, i as u64 + 1, n.kind, name)
            };
            if !added {
                break;
            }
        }
        Ok(r.len())
    }
}

/// The INIT reply the bench's servers give: `want` (what the kernel also offers), the
/// given number of background requests, 1 MiB writes, and FUSE over io_uring where uext4's
/// server would ask for it with the default options.
pub(crate) fn init(i: &InitIn, want: u64, max_background: u16, out: &mut [u8]) -> usize {
    let mut want = want | abi::FUSE_ASYNC_READ | abi::FUSE_BIG_WRITES | abi::FUSE_MAX_PAGES;
    if uext4_fuse::asks_uring(&uext4_fuse::Options::default()) {
        want |= abi::FUSE_OVER_IO_URING;
    }
    let max_readahead = i.max_readahead.min(1 << 20);
    let o = InitOut {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION,
        max_readahead,
        flags: (want | abi::FUSE_INIT_EXT) & i.flags,
        max_background,
        congestion_threshold: max_background * 3 / 4,
        max_write: 1 << 20,
        time_gran: 1,
        max_pages: 256,
    };
    reply::init(out, &o, i.minor)
}

impl Mem {
    fn serve_op(&self, h: &InHeader, op: Op<'_>, out: &mut [u8]) -> R<usize> {
        let entry = |out: &mut [u8], a: R<WireAttr>| {
            a.map(|a| reply::entry(out, 0, reply::Ttl::both(TTL), &a))
        };
        let ino = h.nodeid;
        let mut st = self.st.lock();
        match op {
            // What uext4's server asks for (its `init`), but for what needs an image. POSIX
            // ACLs too, as uext4 enforces them by default: the kernel then fetches a
            // directory's ACL after each change in it (answered ENODATA here), and applies
            // no umask itself (DONT_MASK: the creates below do).
            Op::Init(i) => {
                let want = abi::FUSE_POSIX_ACL
                    | abi::FUSE_DONT_MASK
                    | abi::FUSE_PARALLEL_DIROPS
                    | abi::FUSE_CACHE_SYMLINKS
                    | abi::FUSE_HANDLE_KILLPRIV_V2
                    | abi::FUSE_DO_READDIRPLUS
                    | abi::FUSE_READDIRPLUS_AUTO;
                Ok(init(&i, want, 64, out))
            }
            Op::Lookup { name } => {
                let i = *st.node(ino)?.children.get(name).ok_or(libc::ENOENT)?;
                let a = st.node(i)?.attr(i);
                entry(out, Ok(a))
            }
            Op::Getattr { .. } => Ok(reply::attr(out, TTL, &st.node(ino)?.attr(ino))),
            Op::Setattr(s) => st.setattr(ino, &s).map(|a| reply::attr(out, TTL, &a)),
            Op::Readlink => match st.node(ino)? {
                n if n.kind == LNK => Ok(reply::data(out, &n.data)),
                _ => Err(libc::EINVAL),
            },
            Op::Mknod {
                name, mode, umask, ..
            } => {
                if mode & libc::S_IFMT != REG {
                    return Err(libc::EPERM);
                }
                let n = Node::new(REG, mode & !umask & 0o7777, h, ino);
                entry(out, st.add(ino, name, n))
            }
            Op::Mkdir { name, mode, umask } => {
                let n = Node::new(DIR, mode & !umask & 0o7777, h, ino);
                entry(out, st.add(ino, name, n))
            }
            Op::Unlink { name } => st.remove(ino, name, false).map(|()| 0),
            Op::Rmdir { name } => st.remove(ino, name, true).map(|()| 0),
            Op::Symlink { name, target } => {
                let mut n = Node::new(LNK, 0o777, h, ino);
                n.data = target.to_vec();
                entry(out, st.add(ino, name, n))
            }
            Op::Rename { flags: 1.., .. } => Err(libc::EINVAL),
            Op::Rename {
                newdir,
                name,
                newname,
                ..
            } => st.rename(ino, name, newdir, newname).map(|()| 0),
            Op::Link { oldnodeid, newname } => entry(out, st.link(oldnodeid, ino, newname)),
            Op::Open { flags } => {
                let n = st.node_mut(ino)?;
                if flags as i32 & libc::O_TRUNC != 0 {
                    n.data.clear();
                }
                // Its data changes only through this mount, whose page cache sees it (as
                // uext4's server keeps it where no atime is due).
                Ok(reply::open(out, 0, abi::FOPEN_KEEP_CACHE))
            }
            Op::Read { offset, size } => {
                let n = st.node(ino)?;
                let start = (offset as usize).min(n.data.len());
                let end = (start + size as usize).min(n.data.len());
                Ok(reply::data(out, &n.data[start..end]))
            }
            Op::Write { offset, data, .. } => {
                let n = st.write(ino, offset, data)?;
                Ok(reply::written(out, n))
            }
            Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Access { .. } => Ok(0),
            Op::Release | Op::Releasedir | Op::Destroy => Ok(0),
            // As uext4's server: ENOSYS once, and the kernel sends no more FLUSH on close and
            // no OPENDIR or RELEASEDIR.
            Op::Flush | Op::Opendir { .. } => Err(libc::ENOSYS),
            Op::Readdir { offset, size, plus } => st.readdir(ino, offset, size, plus, out),
            Op::Statfs => Ok(statfs(out)),
            Op::Getxattr { .. } => Err(libc::ENODATA),
            Op::Listxattr { size: 0 } => Ok(reply::xattr_size(out, 0)),
            Op::Listxattr { .. } => Ok(0),
            Op::Create {
                name, mode, umask, ..
            } => {
                let n = Node::new(REG, mode & !umask & 0o7777, h, ino);
                let a = st.add(ino, name, n)?;
                Ok(reply::create(
                    out,
                    0,
                    reply::Ttl::both(TTL),
                    &a,
                    0,
                    abi::FOPEN_KEEP_CACHE,
                ))
            }
            _ => Err(libc::ENOSYS),
        }
    }
}

/// The statfs both bench servers give.
pub(crate) fn statfs(out: &mut [u8]) -> usize {
    let s = reply::Kstatfs {
        blocks: 1 << 24,
        bfree: 1 << 24,
        bavail: 1 << 24,
        files: 1 << 20,
        ffree: 1 << 20,
        bsize: 4096,
        namelen: 255,
        frsize: 4096,
    };
    reply::statfs(out, &s)
}

/// An answer from a handler's result.
pub(crate) fn answer(r: R<usize>) -> Answer {
    match r {
        Ok(n) => Answer::Reply(n),
        Err(e) => Answer::Error(e),
    }
}

impl Serve for Mem {
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], _from: &Arc<dyn Transport>) -> Answer {
        match Op::decode(req) {
            Ok(Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt) => Answer::None,
            Ok(op) => answer(self.serve_op(&req.header, op, out)),
            Err(e) => Answer::Error(e),
        }
    }
}

/// Serves `server` at `mountpoint` with `threads` loop threads until it is unmounted.
pub(crate) fn serve_until_unmounted(
    server: Arc<dyn Serve>,
    name: &str,
    mountpoint: &Path,
    threads: usize,
    default_permissions: bool,
) -> Result<()> {
    let opts = uext4_fuse::Options {
        threads: threads.max(2),
        allow_other: true,
        default_permissions,
        ..Default::default()
    };
    uext4_fuse::serve_with(server, Path::new(name), mountpoint, &opts)?.join()?;
    Ok(())
}

/// Serves the in-memory filesystem at `mountpoint` until it is unmounted.
pub fn serve(mountpoint: &Path, threads: usize) -> Result<()> {
    let mut nodes = HashMap::new();
    let root = Node::new(DIR, 0o755, &InHeader::default(), 1);
    nodes.insert(1, root);
    let mem = Mem {
        st: Mutex::new(State { nodes, next: 2 }),
    };
    serve_until_unmounted(Arc::new(mem), "fuse-mem", mountpoint, threads, true)
}
