//! The adapter: each FUSE request becomes one engine call with the caller's credentials
//! (`uext4::Cred`) and its reply; engine errors become errnos in one place
//! ([`crate::errno`]). Filesystem rules (ACL inheritance, modes from ACLs, set-ID and
//! capability removal, ownership of new inodes) are the engine's. The kernel's lookup counts
//! are kept per inode and pin the inode number in the engine until the kernel forgets it.

use crate::convert::*;
use crate::options::Options;
use crate::{SERVER_XATTR, STATS_XATTR};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use uext4::FsyncQueue;
use uext4::Umask;
use uext4::S_IFMT;
use uext4::{Attr, Error, Fs};
use uext4::{Cred, Groups};
use uext4::{SetAttr, TimeSet};

/// How long the kernel may cache attributes and entries (the engine is their only writer).
const TTL: Duration = Duration::from_secs(1);

/// The FUSE filesystem.
pub struct Uext4Fuse {
    fs: Arc<Fs>,
    opts: Options,
    /// Lookup counts the kernel holds, per inode (FUSE's lookup/forget protocol).
    lookups: Mutex<HashMap<u32, u64>>,
    next_fh: AtomicU64,
    /// The kernel agreed to FUSE_POSIX_ACL: creates inherit default ACLs (the engine's
    /// `Umask::Acl`); otherwise the umask always applies.
    acl_on: bool,
    /// The kernel agreed to FUSE_DONT_MASK: the umask is applied here (not under a default ACL).
    dont_mask: bool,
    /// fsync and fsyncdir requests, committed in batches by whichever loop thread leads.
    fsyncs: FsyncQueue<ReplyEmpty>,
    /// The kernel agreed to FUSE_HANDLE_KILLPRIV_V2: it no longer asks for security.capability
    /// before every write (one extra request per write otherwise); the engine removes
    /// set-ID bits and capabilities on write, truncate and chown instead (`write_as`,
    /// `setattr_as`), from the caller's credentials.
    killpriv: bool,
    /// Tells the kernel about changes it did not ask for (set once the session exists).
    pub(crate) notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
}

impl Uext4Fuse {
    pub fn new(fs: Arc<Fs>, opts: Options) -> Self {
        Uext4Fuse {
            fs,
            opts,
            lookups: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            acl_on: false,
            dont_mask: false,
            killpriv: false,
            fsyncs: FsyncQueue::default(),
            notifier: Arc::new(std::sync::OnceLock::new()),
        }
    }

    fn counted(&self, a: &Attr) {
        let mut l = self.lookups.lock();
        let c = l.entry(a.ino).or_insert(0);
        if *c == 0 {
            self.fs.pin_ino(a.ino, true);
        }
        *c += 1;
    }

    fn entry(&self, r: uext4::Result<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                self.counted(&a);
                reply.entry(&TTL, &file_attr(&a), Generation(a.generation as u64));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// The request's caller as the engine sees it: root's privileges for uid 0, or anyone
    /// under `fakeroot`; supplementary groups read only if a decision needs them.
    fn cred(&self, req: &Request) -> Cred {
        Cred {
            uid: req.uid(),
            gid: req.gid(),
            groups: Groups::OfProcess(req.pid()),
            privileged: self.opts.fakeroot || req.uid() == 0,
        }
    }

    /// The request's umask as the engine applies it: replaced by a parent's default ACL when
    /// the kernel enforces ACLs.
    fn umask(&self, umask: u32) -> Umask {
        if self.acl_on {
            Umask::Acl(umask)
        } else {
            Umask::NoAcl(umask)
        }
    }

    /// After the engine took set-ID bits away: the kernel keeps the mode it cached (a write
    /// invalidates only size and times), and runs a program by that mode without asking again
    /// until it times out, so a set-user-ID binary a user had just rewritten still ran
    /// set-user-ID. Invalidating the attributes (not the data) makes exec and stat fetch the
    /// new mode.
    fn mode_changed(&self, ext: u32) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(to_fuse(ext), -1, 0);
        }
    }

    /// The credentials a data change is made with (HANDLE_KILLPRIV_V2): the kernel flags
    /// writes by callers without CAP_FSETID; where it flags nothing (fallocate,
    /// copy_file_range) uid 0 stands for the capability. None without KILLPRIV_V2: the
    /// kernel removed set-ID bits and capabilities itself.
    fn data_cred(&self, req: &Request, kill: Option<bool>) -> Option<Cred> {
        if !self.killpriv {
            return None;
        }
        let mut c = self.cred(req);
        if let Some(kill) = kill {
            c.privileged = !kill;
        }
        Some(c)
    }

    /// Every change to the image goes through this mount (the server holds the image's lock),
    /// so the kernel's page cache stays valid from one open to the next (KEEP_CACHE), and a
    /// close needs no FLUSH request (the server keeps nothing per descriptor; with
    /// writeback_cache the kernel still writes dirty pages back on close).
    ///
    /// An open with O_DIRECT gets FOPEN_DIRECT_IO. The kernel honours
    /// FOPEN_PARALLEL_DIRECT_WRITES only on that path (`fuse_direct_write_iter`); an O_DIRECT
    /// descriptor without it goes through `fuse_cache_write_iter`, which holds the inode
    /// lock exclusively for every write (and, with writeback_cache, through
    /// `generic_file_write_iter`, the same), so direct writes to one file ran one at a time
    /// in the kernel before the server saw them (R2 broken one layer up). With it, writes
    /// inside the file take the lock shared, and a direct read takes none. Coherence with
    /// descriptors that use the page cache is the kernel's: a direct write invalidates the
    /// cached pages it covers, and with FUSE_DIRECT_IO_ALLOW_MMAP (always asked for) it
    /// first writes back dirty pages of its range, and a cached open or mmap waits for
    /// parallel direct writes to end.
    fn open_flags(&self, flags: i32) -> FopenFlags {
        let mut f = FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES | FopenFlags::FOPEN_NOFLUSH;
        if self.opts.direct_io {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        } else {
            f |= FopenFlags::FOPEN_KEEP_CACHE;
            if flags & libc::O_DIRECT != 0 {
                f |= FopenFlags::FOPEN_DIRECT_IO;
            }
        }
        f
    }
}

fn empty(r: uext4::Result<()>, reply: ReplyEmpty) {
    answer(reply, r.as_ref().map(|_| ()));
}

/// Answers a request that returns no data (the fsync queue's answers too).
fn answer(reply: ReplyEmpty, r: Result<(), &Error>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl Filesystem for Uext4Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // One at a time: add_capabilities refuses a whole set when the kernel lacks one of it.
        let mut caps = vec![
            // Lookups, creates and removals in one directory run in parallel.
            InitFlags::FUSE_PARALLEL_DIROPS,
            // Symlink targets never change: the kernel may cache them.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // ioctl on directories too (lsattr -d).
            InitFlags::FUSE_HAS_IOCTL_DIR,
        ];
        // FUSE_ASYNC_DIO is left off: it sends even a small synchronous O_DIRECT write through
        // the background queue and completes it from the reply's thread: an extra hand-off
        // on every small direct write.
        if self.opts.writeback_cache {
            caps.push(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        // Shared mmap keeps working on direct_io files (the direct_io option, and every
        // O_DIRECT open: see open_flags), and a direct write first writes back the dirty
        // cached pages of its range.
        caps.push(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        for c in caps {
            let _ = config.add_capabilities(c);
        }
        // set-ID and capability removal on write/truncate/chown happens here, not by a
        // security.capability lookup the kernel would otherwise send before every write.
        self.killpriv = config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_ok();
        if self.opts.acl && config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_ok() {
            self.acl_on = true;
            self.dont_mask = config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok();
        }
        // readdirplus (entries with their attributes) when the kernel sees lookups follow a
        // listing, as for `ls -l`.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // More requests in flight in the background (readahead, async direct I/O, writeback)
        // than the kernel's default of 12, for the loop threads to share.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // Inodes of 128 bytes have no room for nanoseconds: times are whole seconds there, and
        // the kernel's cached times must be too (the kernel's ext4 sets s_time_gran the same).
        let granularity = if self.fs.geo.inode_size <= 128 {
            Duration::from_secs(1)
        } else {
            Duration::from_nanos(1)
        };
        let _ = config.set_time_granularity(granularity);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.unmount() {
            tracing::error!("unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.fs.lookup(to_ext(parent), name.as_bytes()), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut l = self.lookups.lock();
        let k = to_ext(ino);
        if let Some(c) = l.get_mut(&k) {
            *c = c.saturating_sub(nlookup);
            if *c == 0 {
                l.remove(&k);
                self.fs.pin_ino(k, false);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(to_ext(ino)) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let conv = |t: TimeOrNow| match t {
            TimeOrNow::Now => TimeSet::Now,
            TimeOrNow::SpecificTime(s) => TimeSet::At(setattr_time(s)),
        };
        let ext = to_ext(ino);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(conv),
            mtime: mtime.map(conv),
            ctime: ctime.map(timestamp),
            crtime: crtime.map(timestamp),
        };
        let cred = self.cred(req);
        // With HANDLE_KILLPRIV_V2 the engine takes set-ID bits and capabilities away on
        // chown and truncate (fuser does not pass the kernel's FATTR_KILL_SUIDGID, so
        // "unprivileged" is "not uid 0" here). Without it the kernel sends the mode a chown
        // leaves; the engine's rule covers a kernel that sends none for a non-root caller.
        let chown = uid.is_some() || gid.is_some();
        let r = if self.killpriv || (chown && !cred.privileged) {
            self.fs.setattr_as(&cred, ext, &set)
        } else {
            self.fs.setattr(ext, &set)
        };
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(to_ext(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (cred, umask) = (self.cred(req), self.umask(umask));
        let p = to_ext(parent);
        let r = self
            .fs
            .mknod_as(&cred, p, name.as_bytes(), mode, rdev, umask);
        self.entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (cred, umask) = (self.cred(req), self.umask(umask));
        let r = self
            .fs
            .mkdir_as(&cred, to_ext(parent), name.as_bytes(), mode & 0o7777, umask);
        self.entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.unlink(to_ext(parent), name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.rmdir(to_ext(parent), name.as_bytes()), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.symlink_as(
            &self.cred(req),
            to_ext(parent),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.entry(r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let p = to_ext(parent);
        // A whiteout is owned as a new node in the source directory would be.
        let (uid, gid) = if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            match self.fs.owner_in(&self.cred(req), p) {
                Ok(o) => o,
                Err(e) => return reply.error(errno(&e)),
            }
        } else {
            (0, 0)
        };
        let f = match uext4::RenameFlags::from_bits(flags.bits(), uid, gid) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        empty(
            self.fs
                .rename(p, name.as_bytes(), to_ext(newparent), newname.as_bytes(), f),
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(
            self.fs
                .link(to_ext(ino), to_ext(newparent), newname.as_bytes()),
            reply,
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(to_ext(ino)) {
            Ok(()) => reply.opened(
                FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed)),
                self.open_flags(flags.0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        match self.fs.read(to_ext(ino), offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ext = to_ext(ino);
        // A write from the page cache (writeback_cache, or a shared mapping's pages) is
        // whole or an error: the kernel's writeback takes a short count for the whole
        // request and marks its pages clean, so the rest would be lost without an error for
        // fsync to report. A program's own write may come back short, as pwrite(2) does.
        let kill = wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let cred = self.data_cred(req, Some(kill));
        let r = match (&cred, wf.contains(WriteFlags::FUSE_WRITE_CACHE)) {
            (Some(c), true) => self
                .fs
                .write_all_as(c, ext, offset, data)
                .map(|m| (data.len(), m)),
            (Some(c), false) => self.fs.write_as(c, ext, offset, data),
            (None, true) => self
                .fs
                .write_all(ext, offset, data)
                .map(|()| (data.len(), false)),
            (None, false) => self.fs.write(ext, offset, data).map(|n| (n, false)),
        };
        match r {
            Ok((n, changed)) => {
                if changed {
                    self.mode_changed(ext);
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.release(to_ext(ino)), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsyncs
            .submit(&self.fs, to_ext(ino), datasync, reply, &answer);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let ext = to_ext(ino);
        // Counted open, as a file's open is: a directory removed (rmdir, or a rename over
        // it) while open stays usable through its descriptor until releasedir (fstat shows
        // link count 0, fchmod and fsetxattr work), as on the kernel's ext4.
        match self.fs.getattr(ext).and_then(|a| {
            if a.is_dir() {
                self.fs.open(ext).map(|()| true)
            } else {
                Ok(false)
            }
        }) {
            // The kernel may cache listings; it drops them itself when it changes the
            // directory (all changes come through it).
            Ok(true) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Ok(false) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        // The last close of a removed directory frees it.
        empty(self.fs.release(to_ext(ino)), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.fs.readdir(to_ext(ino), offset, &mut |e| {
            !reply.add(
                to_fuse(e.ino),
                e.next_offset,
                kind_of_ft(e.kind),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut entries = Vec::new();
        let r = self.fs.readdir(to_ext(ino), offset, &mut |e| {
            entries.push(e);
            entries.len() < 512
        });
        if let Err(e) = r {
            return reply.error(errno(&e));
        }
        for e in entries {
            let Ok(a) = self.fs.getattr(e.ino) else {
                continue;
            };
            let dot = e.name == b"." || e.name == b"..";
            if reply.add(
                to_fuse(e.ino),
                e.next_offset,
                OsStr::from_bytes(&e.name),
                &TTL,
                &file_attr(&a),
                Generation(a.generation as u64),
            ) {
                break;
            }
            if !dot {
                self.counted(&a);
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsyncs
            .submit(&self.fs, to_ext(ino), datasync, reply, &answer);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_avail,
            s.files,
            s.files_free,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let f = if flags & libc::XATTR_CREATE != 0 {
            uext4::XattrFlags::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            uext4::XattrFlags::Replace
        } else {
            uext4::XattrFlags::Any
        };
        let r = self
            .fs
            .setxattr_as(&self.cred(req), to_ext(ino), name.as_bytes(), value, f);
        empty(r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let ext = to_ext(ino);
        let v = if ext == 2 && name.as_bytes() == STATS_XATTR {
            Ok(self.fs.stats_json().into_bytes())
        } else if ext == 2 && name.as_bytes() == SERVER_XATTR {
            Ok(std::process::id().to_string().into_bytes())
        } else {
            self.fs.getxattr(ext, name.as_bytes())
        };
        match v {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(to_ext(ino)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.removexattr(to_ext(ino), name.as_bytes()), reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let a = match self.fs.getattr(to_ext(ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        // With default_permissions the kernel checks the mode bits itself and never asks.
        if self.opts.default_permissions || mask == AccessFlags::F_OK {
            return reply.ok();
        }
        let mode = a.mode as u32;
        let want = (if mask.contains(AccessFlags::R_OK) {
            4
        } else {
            0
        }) | (if mask.contains(AccessFlags::W_OK) {
            2
        } else {
            0
        }) | (if mask.contains(AccessFlags::X_OK) {
            1
        } else {
            0
        });
        let cred = self.cred(req);
        let ok = if cred.privileged {
            // Root may do anything but execute a file nobody may execute.
            want & 1 == 0 || a.is_dir() || mode & 0o111 != 0
        } else {
            let bits = if req.uid() == a.uid {
                mode >> 6
            } else if cred.in_group(a.gid) {
                mode >> 3
            } else {
                mode
            } & 7;
            bits & want == want
        };
        if ok {
            reply.ok()
        } else {
            reply.error(Errno::EACCES)
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let p = to_ext(parent);
        let (cred, umask) = (self.cred(req), self.umask(umask));
        let a = match self.fs.create_as(&cred, p, name.as_bytes(), mode, umask) {
            Ok(a) => a,
            // Created meanwhile by someone else: open it as open(2) would, O_TRUNC included.
            Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                let found = self.fs.lookup(p, name.as_bytes()).and_then(|a| {
                    if a.is_dir() {
                        return Err(Error::IsDir);
                    }
                    if flags & libc::O_TRUNC != 0 && a.size != 0 && a.mode & S_IFMT == 0o100000 {
                        self.fs.truncate(a.ino, 0)?;
                        return self.fs.getattr(a.ino);
                    }
                    Ok(a)
                });
                match found {
                    Ok(a) => a,
                    Err(e) => return reply.error(errno(&e)),
                }
            }
            Err(e) => return reply.error(errno(&e)),
        };
        if let Err(e) = self.fs.open(a.ino) {
            return reply.error(errno(&e));
        }
        self.counted(&a);
        reply.created(
            &TTL,
            &file_attr(&a),
            Generation(a.generation as u64),
            FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed)),
            self.open_flags(flags),
        );
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let ext = to_ext(ino);
        // Any fallocate changes the file as a write does: the engine takes away what a write
        // by this caller would.
        let r = match self.data_cred(req, None) {
            Some(c) => self
                .fs
                .fallocate_as(&c, ext, mode, offset, length)
                .map(|changed| {
                    if changed {
                        self.mode_changed(ext);
                    }
                }),
            None => self.fs.fallocate(ext, mode, offset, length),
        };
        empty(r, reply);
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // Copied here in 1 MiB pieces: one request instead of a read and a write per page.
        let (src, dst) = (to_ext(ino_in), to_ext(ino_out));
        let len = len.min(1 << 30);
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0u64;
        let cred = self.data_cred(req, None);
        let mut changed = false;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let n = match self.fs.read(src, offset_in + done, &mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return reply.error(errno(&e)),
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
                Err(e) if done == 0 => return reply.error(errno(&e)),
                Err(_) => break,
            }
            if n < want {
                break;
            }
        }
        if changed {
            self.mode_changed(dst);
        }
        reply.written(done as u32)
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // lsattr's FS_IOC_GETFLAGS and FS_IOC_GETVERSION (both sizes of their argument); the
        // kernel writes an int for either, so 4 bytes come back.
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const GETVERSION: [u32; 2] = [0x8008_7601, 0x8004_7601];
        // The inode flags the kernel's ext4 shows to users (EXT4_FL_USER_VISIBLE).
        const USER_VISIBLE: u32 = 0x705B_DFFF;
        let value = |a: &Attr| {
            if GETFLAGS.contains(&cmd) {
                a.flags & USER_VISIBLE
            } else {
                a.generation
            }
        };
        if !GETFLAGS.contains(&cmd) && !GETVERSION.contains(&cmd) {
            return reply.error(Errno::ENOTTY);
        }
        if out_size < 4 {
            return reply.error(Errno::EINVAL);
        }
        match self.fs.getattr(to_ext(ino)) {
            Ok(a) => reply.ioctl(0, &value(&a).to_le_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // SEEK_DATA and SEEK_HOLE are not answered here: the kernel asks without first
        // writing back the dirty pages it caches for the file (a shared mapping's stores, and
        // with writeback_cache every write), so an answer from the image called data that
        // exists only in that cache a hole, and copies made with SEEK_DATA (cp) came out with
        // zeros where the data was. ENOSYS makes the kernel answer from the file's size itself,
        // for this and every later call: all data, no holes, always right. (The engine's
        // `lseek_data_hole` serves the library and the image tools, where nothing is cached
        // beyond the engine.)
        reply.error(Errno::ENOSYS)
    }
}
