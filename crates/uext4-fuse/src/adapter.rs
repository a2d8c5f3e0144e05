//! The adapter: each FUSE request becomes one engine call with the caller's credentials
//! (`uext4::Cred`) and its reply; engine errors become errnos in one place
//! ([`crate::errno`]). Filesystem rules (ACL inheritance, modes from ACLs, set-ID and
//! capability removal, ownership of new inodes) are the engine's. The kernel's lookup counts
//! are kept per inode and pin the inode number in the engine until the kernel forgets it.
//!
//! [`Serve::serve`] decodes the request (request.rs), calls the opcode's method here, and
//! the method writes its reply body with reply.rs. INIT's negotiation is in `adapter/init.rs`,
//! requests about names and attributes in `adapter/meta.rs`, data and listings in
//! `adapter/data.rs`.

use crate::abi;
use crate::convert::*;
use crate::options::Options;
use crate::reply;
use crate::request::{forgets, Op, SetattrIn, TimeArg};
use crate::transport::{Answer, InHeader, Link, Notify, RawRequest, Serve, Transport};
use crate::{SERVER_XATTR, STATS_XATTR};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use uext4::FsyncQueue;
use uext4::Umask;
use uext4::S_IFMT;
use uext4::{Attr, Error, Fs};
use uext4::{Cred, Groups};
use uext4::{SetAttr, TimeSet};

mod data;
mod init;
mod meta;
mod requests;

/// A reply body's length, or an errno.
type Reply = Result<usize, i32>;

/// The longest a guest's kernel may keep names and attributes (see `attr_ttl`): what it
/// cannot be told of changes within this.
const GUEST_TTL: Duration = Duration::from_secs(1);

/// The FUSE filesystem.
pub struct Uext4Fuse {
    fs: Arc<Fs>,
    opts: Options,
    /// Lookup counts the kernel holds, per inode (FUSE's lookup/forget protocol).
    lookups: Mutex<HashMap<u32, u64>>,
    next_fh: AtomicU64,
    /// The kernel agreed to FUSE_POSIX_ACL: creates inherit default ACLs (the engine's
    /// `Umask::Acl`); otherwise the umask always applies.
    acl_on: AtomicBool,
    /// The kernel agreed to FUSE_DONT_MASK: the umask is applied here (not under a default ACL).
    dont_mask: AtomicBool,
    /// fsync and fsyncdir requests, committed in batches by whichever loop thread leads. A
    /// queued request is answered later through its transport, so the loop thread that
    /// queued it goes on reading requests: concurrent fsyncs are not bounded by the number
    /// of loop threads, and a batch holds as many as arrive while the leader commits.
    fsyncs: FsyncQueue<Later>,
    /// The kernel agreed to FUSE_HANDLE_KILLPRIV_V2: it no longer asks for security.capability
    /// before every write (one extra request per write otherwise); the engine removes
    /// set-ID bits and capabilities on write, truncate and chown instead (`write_as`,
    /// `setattr_as`), from the caller's credentials.
    killpriv: AtomicBool,
    /// OPENDIR is answered ENOSYS, so the kernel sends no OPENDIR and RELEASEDIR at all
    /// (FUSE_NO_OPENDIR_SUPPORT): see `opendir`.
    no_opendir: AtomicBool,
    /// `-o noopen`, and the kernel offered FUSE_NO_OPEN_SUPPORT: OPEN is answered ENOSYS, so
    /// the kernel sends no OPEN, and no RELEASE for files (opened or created) once it has
    /// had that answer. Nothing then counts a file's opens: an unlinked file stays while the
    /// kernel holds its inode (the lookup pin), as a directory without OPENDIR does.
    no_open: AtomicBool,
    /// INIT asks for FUSE_OVER_IO_URING (the session serves the ring if the kernel agrees).
    uring: bool,
    /// The callers are a virtual machine's processes (virtio-fs): their process ids mean
    /// nothing here, so nothing is read from this host's /proc (see [`Self::for_guest`]).
    guest: bool,
    /// The engine was unmounted (FUSE_DESTROY, or the session's end).
    destroyed: AtomicBool,
    /// Tells the kernel about changes it did not ask for (set once the session exists).
    notifier: OnceLock<Arc<dyn Notify>>,
    /// Requests served, by opcode, with the time spent on them (`uext4 stats`).
    requests: requests::RequestStats,
}

/// A request whose reply is sent later through the transport it came by (a queued fsync).
/// Dropped unanswered (the fsync queue's leader panicked), it answers EIO, so the caller
/// does not wait for ever.
pub(crate) struct Later(Option<(Arc<dyn Transport>, u64)>);

impl Later {
    fn new(from: &Arc<dyn Transport>, unique: u64) -> Later {
        Later(Some((from.clone(), unique)))
    }

    fn send(mut self, r: Result<&[u8], i32>) {
        if let Some((t, unique)) = self.0.take() {
            if let Err(e) = t.reply_later(unique, r) {
                tracing::debug!("deferred reply {unique}: {e}");
            }
        }
    }
}

impl Drop for Later {
    fn drop(&mut self) {
        if let Some((t, unique)) = self.0.take() {
            let _ = t.reply_later(unique, Err(libc::EIO));
        }
    }
}

/// Answers a queued fsync with the commit's result.
fn answer_later(l: Later, r: Result<(), &Error>) {
    l.send(r.map(|()| &[][..]).map_err(errno));
}

fn empty(r: uext4::Result<()>) -> Reply {
    r.map(|()| 0).map_err(|e| errno(&e))
}

impl Uext4Fuse {
    pub fn new(fs: Arc<Fs>, opts: Options) -> Self {
        Uext4Fuse {
            fs,
            opts,
            lookups: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            acl_on: AtomicBool::new(false),
            dont_mask: AtomicBool::new(false),
            killpriv: AtomicBool::new(false),
            no_opendir: AtomicBool::new(false),
            no_open: AtomicBool::new(false),
            fsyncs: FsyncQueue::default(),
            uring: false,
            guest: false,
            destroyed: AtomicBool::new(false),
            notifier: OnceLock::new(),
            requests: requests::RequestStats::new(),
        }
    }

    /// Whether INIT asks the kernel for FUSE over io_uring.
    pub fn with_uring(mut self, yes: bool) -> Self {
        self.uring = yes;
        self
    }

    /// Serves a virtual machine's kernel (virtio-fs) rather than this host's:
    /// - a caller is the ids in the request's header and nothing more: its process id names
    ///   a process of the guest, so neither its supplementary groups nor its privilege are
    ///   looked up in this host's /proc (the guest's kernel checks permissions itself under
    ///   default_permissions, and decides group membership there); FUSE_ALLOW_IDMAP, which
    ///   leaves the ids out of most requests, is not asked for;
    /// - FUSE_DESTROY (the guest unmounted the tag) commits and drops the guest's lookup
    ///   counts but keeps the engine open: the guest may mount the tag again on the same
    ///   connection, with a new INIT. The engine is unmounted when the connection ends.
    pub fn for_guest(mut self, yes: bool) -> Self {
        self.guest = yes;
        self
    }

    /// FUSE_DESTROY: the kernel let go of the mount. On a host, the engine is unmounted; for
    /// a guest ([`Self::for_guest`]) everything is committed and the kernel's lookup counts
    /// dropped (it sends no FORGET after DESTROY), so unlinked inodes it held are freed.
    fn destroy_request(&self) -> Reply {
        if !self.guest {
            self.destroy();
            return Ok(0);
        }
        let held: Vec<u32> = self.lookups.lock().drain().map(|(ino, _)| ino).collect();
        for ino in held {
            self.fs.pin_ino(ino, false);
            if let Err(e) = self.fs.forgotten(ino) {
                tracing::error!(ino, "freeing a forgotten unlinked inode: {e}");
            }
        }
        empty(self.fs.sync())
    }

    /// Commits everything and marks the image clean, once: on FUSE_DESTROY, or when the
    /// session ends ([`Serve::ended`]).
    pub fn destroy(&self) {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.fs.unmount() {
            tracing::error!("unmount: {e}");
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

    fn forget(&self, nodeid: u64, nlookup: u64) {
        let k = to_ext(nodeid);
        {
            let mut l = self.lookups.lock();
            let Some(c) = l.get_mut(&k) else {
                return;
            };
            *c = c.saturating_sub(nlookup);
            if *c > 0 {
                return;
            }
            l.remove(&k);
            self.fs.pin_ino(k, false);
        }
        // An unlinked inode the kernel held (a removed working directory, a file renamed
        // over) is freed now that the kernel has let it go; outside the lock, as freeing
        // takes transactions. A lookup that pinned it again meanwhile keeps it.
        if let Err(e) = self.fs.forgotten(k) {
            tracing::error!(ino = k, "freeing a forgotten unlinked inode: {e}");
        }
    }

    /// The reply to a request that made the kernel hold an entry named in directory `parent`.
    fn entry(&self, parent: u32, r: uext4::Result<Attr>, out: &mut [u8]) -> Reply {
        let a = r.map_err(|e| errno(&e))?;
        self.counted(&a);
        Ok(reply::entry(
            out,
            a.generation as u64,
            self.ttl_in(parent),
            &wire_attr(&a),
        ))
    }

    /// How long the kernel may keep a name in directory `dir`. In a casefolded directory the
    /// kernel's dentries are still case-sensitive: a name it keeps under one spelling would
    /// outlive a removal or rename made under another, and a negative entry would hide a
    /// file created under another spelling. So there names are kept for no time (every use
    /// asks again, and the kernel moves a directory's one dentry to the spelling last asked
    /// for, never leaving it two); attributes still for the attribute timeout.
    fn ttl_in(&self, dir: u32) -> reply::Ttl {
        reply::Ttl {
            entry: if self.fs.folds_names(dir) {
                Duration::ZERO
            } else if self.guest {
                self.opts.entry_timeout.min(GUEST_TTL)
            } else {
                self.opts.entry_timeout
            },
            attr: self.attr_ttl(),
        }
    }

    /// How long the kernel may keep an inode's attributes (`attr_timeout`). Long: the
    /// kernel updates or drops what it caches after every change it asks for (fs/fuse/dir.c
    /// `fuse_dir_changed`, `fuse_entry_unlinked`, `fuse_update_ctime`; file.c after writes,
    /// reads (atime), fallocate and copy_file_range; acl.c after an ACL change), and the
    /// adapter tells it of the changes the engine makes beyond what was asked (`mode_changed`,
    /// `attrs_moved`).
    ///
    /// A guest (virtio-fs) is told of nothing: no notification queue (neither Linux nor
    /// QEMU has VIRTIO_FS_F_NOTIFICATION), so there both timeouts are at most `GUEST_TTL`.
    fn attr_ttl(&self) -> Duration {
        let t = self.opts.attr_timeout();
        if self.guest {
            t.min(GUEST_TTL)
        } else {
            t
        }
    }

    /// The request's caller as the engine sees it: root's privileges for uid 0, or anyone
    /// under `fakeroot`; supplementary groups read only if a decision needs them.
    ///
    /// With FUSE_ALLOW_IDMAP the kernel sends the caller's ids only with requests that
    /// create an inode (mapped through the mount's idmapping); every other request carries
    /// FUSE_INVALID_UIDGID. The kernel has checked those requests' permissions itself (it
    /// agrees to the flag only with default_permissions), so the server needs the caller
    /// only for the rules it applies on the kernel's behalf (set-ID removal, CAP_SYS_ADMIN
    /// ioctls): it reads the caller's filesystem ids and groups from `/proc/PID/status`,
    /// as the host sees them. A caller that cannot be read (gone, or a request the kernel
    /// sends on no process's behalf) is unprivileged and in no group.
    fn cred(&self, h: &InHeader) -> Cred {
        let known = h.uid != abi::FUSE_INVALID_UIDGID && h.gid != abi::FUSE_INVALID_UIDGID;
        if known || self.guest {
            return self.header_cred(h);
        }
        let mut c = Cred::of_process(h.pid).unwrap_or(Cred {
            uid: abi::FUSE_INVALID_UIDGID,
            gid: abi::FUSE_INVALID_UIDGID,
            groups: Groups::List(Vec::new()),
            privileged: false,
        });
        c.privileged |= self.opts.fakeroot;
        c
    }

    /// [`Self::cred`] without reading `/proc`: the ids as the header has them (possibly
    /// FUSE_INVALID_UIDGID), groups (and then the primary group too) read only if a decision
    /// needs them. For requests whose privilege the kernel states itself (a write's
    /// FUSE_WRITE_KILL_SUIDGID) or that need no caller (a chmod).
    fn header_cred(&self, h: &InHeader) -> Cred {
        Cred {
            uid: h.uid,
            gid: h.gid,
            // A guest's process is not this host's: its groups are the guest kernel's to know.
            groups: if self.guest {
                Groups::List(Vec::new())
            } else {
                Groups::OfProcess(h.pid)
            },
            privileged: self.opts.fakeroot || h.uid == 0,
        }
    }

    /// The caller of a flags change (FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR). The kernel's
    /// vfs_fileattr_set checked that the caller owns the inode (through the mount's
    /// idmapping) and has CAP_LINUX_IMMUTABLE for the immutable and append-only flags before
    /// it sent the ioctl. A request without the caller's ids (FUSE_ALLOW_IDMAP) is taken as
    /// the owner's, since the host's view of the caller cannot repeat an idmapped check;
    /// its privilege still comes from `/proc`.
    fn fileattr_cred(&self, h: &InHeader, ino: u32) -> Cred {
        let mut c = self.cred(h);
        if h.uid == abi::FUSE_INVALID_UIDGID {
            if let Ok(a) = self.fs.getattr(ino) {
                c.uid = a.uid;
            }
        }
        c
    }

    /// The request's umask as the engine applies it: replaced by a parent's default ACL when
    /// the kernel enforces ACLs.
    fn umask(&self, umask: u32) -> Umask {
        if self.acl_on.load(Ordering::Relaxed) {
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

    /// After an engine change the kernel cannot know of, beyond what it asked for (an
    /// extended attribute that moved the block count or, without FUSE_POSIX_ACL, the mode;
    /// a verity tree): it drops the attributes it keeps for `ino` when any of those it uses
    /// for stat and permission checks moved since `before`. The ctime the kernel updates (and
    /// marks stale) itself, so an unchanged rest sends nothing.
    fn attrs_moved(&self, ino: u32, before: Option<Attr>) {
        let key = |a: &Attr| (a.mode, a.uid, a.gid, a.nlink, a.size, a.blocks, a.flags);
        let after = self.fs.getattr(ino).ok();
        if before.as_ref().map(key) != after.as_ref().map(key) {
            self.mode_changed(ino);
        }
    }

    /// The credentials a data change of `ino` is made with (HANDLE_KILLPRIV_V2): the kernel
    /// flags writes by callers without CAP_FSETID; where it flags nothing (fallocate,
    /// copy_file_range) uid 0 stands for the capability, looked up in /proc (`Self::cred`)
    /// only when the file has set-ID bits the privilege would keep. None without
    /// KILLPRIV_V2: the kernel removed set-ID bits and capabilities itself.
    fn data_cred(&self, h: &InHeader, ino: u32, kill: Option<bool>) -> Option<Cred> {
        if !self.killpriv.load(Ordering::Relaxed) {
            return None;
        }
        Some(match kill {
            Some(kill) => Cred {
                privileged: !kill,
                ..self.header_cred(h)
            },
            None => self.setid_cred(h, ino),
        })
    }

    /// The caller of a change that may take set-ID bits from `ino` (a chown, a fallocate, an
    /// access ACL), where the privilege and group membership decide which go: [`Self::cred`]
    /// (which may read /proc) only when the file has set-ID bits; otherwise the header's
    /// ids do, as nothing is decided by them (capabilities go whoever changes the file).
    fn setid_cred(&self, h: &InHeader, ino: u32) -> Cred {
        if self.fs.getattr(ino).is_ok_and(|a| a.mode & 0o6000 == 0) {
            self.header_cred(h)
        } else {
            self.cred(h)
        }
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
    ///
    /// The kernel sends no READ for what its cache holds, and only a READ makes the server
    /// update atime: an open for reading of a file whose atime is due (`Fs::atime_due`) gets
    /// no KEEP_CACHE, so its reads reach the engine. Under relatime that is the first open
    /// after a change, once.
    fn open_flags(&self, ino: u32, flags: u32) -> u32 {
        let mut f = abi::FOPEN_PARALLEL_DIRECT_WRITES | abi::FOPEN_NOFLUSH;
        let reads = flags as i32 & libc::O_ACCMODE != libc::O_WRONLY;
        if self.opts.direct_io {
            f |= abi::FOPEN_DIRECT_IO;
        } else {
            if !(reads && self.fs.atime_due(ino)) {
                f |= abi::FOPEN_KEEP_CACHE;
            }
            if flags as i32 & libc::O_DIRECT != 0 {
                f |= abi::FOPEN_DIRECT_IO;
            }
        }
        f
    }
}

impl Serve for Uext4Fuse {
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], from: &Arc<dyn Transport>) -> Answer {
        let started = std::time::Instant::now();
        let answer = (|| -> Answer {
            let op = match Op::decode(req) {
                Ok(op) => op,
                Err(e) => return Answer::Error(e),
            };
            let h = &req.header;
            let ino = to_ext(h.nodeid);
            let r = match op {
                Op::Init(i) => self.init(&i, out),
                Op::Destroy => self.destroy_request(),
                Op::Forget { nlookup } => {
                    self.forget(h.nodeid, nlookup);
                    return Answer::None;
                }
                Op::BatchForget { entries } => {
                    for (nodeid, nlookup) in forgets(entries) {
                        self.forget(nodeid, nlookup);
                    }
                    return Answer::None;
                }
                // The kernel's requests are not cancelled part way: each ends on its own.
                Op::Interrupt => return Answer::None,
                Op::Fsync { datasync } | Op::Fsyncdir { datasync } => {
                    let later = Later::new(from, h.unique);
                    self.fsyncs
                        .submit(&self.fs, ino, datasync, later, &answer_later);
                    return Answer::None;
                }
                Op::Lookup { name } => self.lookup(h.nodeid, name, out),
                Op::Getattr { getattr_flags, fh } => {
                    let fh = (getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(fh);
                    self.getattr(ino, fh, out)
                }
                Op::Statx { .. } => self.statx(ino, out),
                Op::Setattr(s) => self.setattr(h, ino, &s, out),
                Op::Readlink => self.readlink(ino, out),
                Op::Mknod {
                    name,
                    mode,
                    rdev,
                    umask,
                } => {
                    let (cred, umask) = (self.cred(h), self.umask(umask));
                    self.entry(
                        ino,
                        self.fs.mknod_as(&cred, ino, name, mode, rdev, umask),
                        out,
                    )
                }
                Op::Mkdir { name, mode, umask } => {
                    let (cred, umask) = (self.cred(h), self.umask(umask));
                    let r = self.fs.mkdir_as(&cred, ino, name, mode & 0o7777, umask);
                    self.entry(ino, r, out)
                }
                Op::Unlink { name } => empty(self.fs.unlink(ino, name)),
                Op::Rmdir { name } => empty(self.fs.rmdir(ino, name)),
                Op::Symlink { name, target } => self.entry(
                    ino,
                    self.fs.symlink_as(&self.cred(h), ino, name, target),
                    out,
                ),
                Op::Rename {
                    newdir,
                    flags,
                    name,
                    newname,
                } => self.rename(h, ino, name, to_ext(newdir), newname, flags),
                Op::Link { oldnodeid, newname } => {
                    self.entry(ino, self.fs.link(to_ext(oldnodeid), ino, newname), out)
                }
                Op::Open { flags } => self.open(ino, flags, out),
                Op::Read { offset, size } => self.read(ino, offset, size, out),
                Op::Write {
                    offset,
                    write_flags,
                    data,
                } => self.write(h, ino, offset, data, write_flags, out),
                Op::Statfs => self.statfs(ino, out),
                // The server keeps nothing per descriptor and takes no POSIX locks: FLUSH would
                // be a round trip per close(2). FOPEN_NOFLUSH asks for none, but with
                // writeback_cache the kernel sends it anyway (after writing the file's dirty
                // pages back, which it still does); ENOSYS stops it for the whole connection.
                Op::Flush => Err(libc::ENOSYS),
                Op::Release => self.release(ino),
                Op::Opendir { .. } => self.opendir(ino, out),
                // The last close of a removed directory frees it.
                Op::Releasedir => empty(self.fs.release(ino)),
                Op::Readdir { offset, size, plus } => self.readdir(ino, offset, size, plus, out),
                Op::Setxattr { name, value, flags } => self.setxattr(h, ino, name, value, flags),
                Op::Getxattr { name, size } => self.getxattr(ino, name, size, out),
                Op::Listxattr { size } => self.listxattr(ino, size, out),
                Op::Removexattr { name } => self.removexattr(ino, name),
                Op::Access { mask } => self.access(h, ino, mask),
                Op::Create {
                    name,
                    flags,
                    mode,
                    umask,
                } => self.create(h, ino, name, mode, umask, flags, out),
                Op::Tmpfile { flags, mode, umask } => self.tmpfile(h, ino, mode, umask, flags, out),
                Op::Fallocate {
                    offset,
                    length,
                    mode,
                } => self.fallocate(h, ino, offset, length, mode),
                Op::CopyFileRange {
                    off_in,
                    nodeid_out,
                    off_out,
                    len,
                } => self.copy_file_range(h, ino, off_in, to_ext(nodeid_out), off_out, len, out),
                Op::Ioctl {
                    cmd,
                    out_size,
                    data,
                    ..
                } => self.ioctl(h, ino, cmd, data, out_size, out),
                // SEEK_DATA and SEEK_HOLE are not answered here: the kernel asks without first
                // writing back the dirty pages it caches for the file (a shared mapping's stores,
                // and with writeback_cache every write), so an answer from the image called data
                // that exists only in that cache a hole, and copies made with SEEK_DATA (cp) came
                // out with zeros where the data was. ENOSYS makes the kernel answer from the
                // file's size itself, for this and every later call: all data, no holes, always
                // right. (The engine's `lseek_data_hole` serves the library and the image tools,
                // where nothing is cached beyond the engine.)
                Op::Lseek { .. } => Err(libc::ENOSYS),
                // syncfs(2) and sync(1): everything written so far becomes durable.
                Op::Syncfs => empty(self.fs.sync()),
                // Locks (the kernel keeps POSIX and flock locks itself), BMAP, POLL and the rest.
                Op::Unknown(_) => Err(libc::ENOSYS),
            };
            match r {
                Ok(n) => Answer::Reply(n),
                Err(e) => Answer::Error(e),
            }
        })();
        self.requests
            .record(req.header.opcode, started.elapsed().as_nanos() as u64);
        answer
    }

    fn started(&self, link: Link) {
        let _ = self.notifier.set(link.notifier);
    }

    fn ended(&self) {
        self.destroy();
    }
}
