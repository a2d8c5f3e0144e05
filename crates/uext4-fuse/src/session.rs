//! Mounting and serving: the session and its threads, and unmounting.

use crate::adapter::Uext4Fuse;
use crate::options::Options;
use crate::transport::{Answer, InHeader, Link, Notify, RawRequest, Serve, Transport};
use crate::transport::{OutHeader, IN_HEADER_LEN, OUT_HEADER_LEN};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::Fs;

fn fusermount_bin() -> std::ffi::OsString {
    std::env::var_os("FUSERMOUNT_PATH").unwrap_or_else(|| "fusermount3".into())
}

/// A mount being served: the session's threads, and how to take the mount down.
pub struct Served {
    threads: Vec<std::thread::JoinHandle<()>>,
    server: Arc<dyn Serve>,
    mountpoint: PathBuf,
}

impl Served {
    /// Unmounts (lazily when the mount is busy: then open files keep working until they are
    /// closed) and waits until the session has ended.
    pub fn unmount_and_join(self) -> std::io::Result<()> {
        unmount(&self.mountpoint)?;
        self.join()
    }

    /// Whether the session has ended (the kernel let go of the mount).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Waits until the session ends (someone else unmounted it).
    pub fn join(self) -> std::io::Result<()> {
        for t in self.threads {
            let _ = t.join();
        }
        self.server.ended();
        Ok(())
    }
}

/// Unmounts `mountpoint`: root with umount2 (detaching when busy), others with fusermount3.
pub fn unmount(mountpoint: &Path) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        eprintln!(
            "uext4: {} is busy: detached, serving open files until they are closed",
            mountpoint.display()
        );
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        return Err(std::io::Error::last_os_error());
    }
    let run = |lazy: bool| {
        let mut cmd = std::process::Command::new(fusermount_bin());
        cmd.arg("-u").arg("-q");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--")
            .arg(mountpoint)
            .stdin(std::process::Stdio::null())
            .output()
    };
    if run(false)?.status.success() {
        return Ok(());
    }
    let out = run(true)?;
    if out.status.success() {
        eprintln!(
            "uext4: {} is busy: detached, serving open files until they are closed",
            mountpoint.display()
        );
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "fusermount3 -u: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Mounts `image` at `mountpoint` and serves it from background threads until it is unmounted
/// ([`Served::unmount_and_join`], or `umount` from outside). A stand-in for the /dev/fuse
/// transport of the `devfuse` branch: root mounts only, one descriptor read by every thread.
pub fn serve(
    fs: Arc<Fs>,
    image: &Path,
    mountpoint: &Path,
    opts: &Options,
) -> std::io::Result<Served> {
    let server: Arc<dyn Serve> = Arc::new(Uext4Fuse::new(fs, opts.clone()));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = if let Some(fd) = fd_path(mountpoint) {
        fuse_device_fd(fd)?
    } else if root {
        mount_as_root(image, mountpoint, opts)?
    } else {
        return Err(std::io::Error::other(
            "mounting as an ordinary user needs fusermount3",
        ));
    };
    let dev = Arc::new(dev);
    let t: Arc<dyn Transport> = Arc::new(Dev(dev.clone()));
    let mut buf = vec![0u8; BUF];
    let mut out = vec![0u8; BUF];
    loop {
        let n = read_req(&dev, &mut buf)?.ok_or_else(|| std::io::Error::other("no INIT"))?;
        let h = InHeader::parse(&buf[..n]).ok_or_else(|| std::io::Error::other("short"))?;
        let done = h.opcode == crate::abi::INIT;
        serve_one(&*server, &t, &buf[..n], &mut out);
        if done {
            break;
        }
    }
    server.started(Link {
        notifier: Arc::new(Dev(dev.clone())),
    });
    let threads = (0..opts.threads.max(2))
        .map(|_| {
            let (dev, server, t) = (dev.clone(), server.clone(), t.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; BUF];
                let mut out = vec![0u8; BUF];
                while let Ok(Some(n)) = read_req(&dev, &mut buf) {
                    serve_one(&*server, &t, &buf[..n], &mut out);
                }
            })
        })
        .collect();
    Ok(Served {
        threads,
        server,
        mountpoint: mountpoint.to_path_buf(),
    })
}

const BUF: usize = (1 << 20) + 8192;

struct Dev(Arc<OwnedFd>);

fn send(fd: &OwnedFd, unique: u64, error: i32, body: &[u8]) -> std::io::Result<()> {
    let h = OutHeader {
        len: (OUT_HEADER_LEN + body.len()) as u32,
        error,
        unique,
    }
    .to_bytes();
    let iov = [
        libc::iovec {
            iov_base: h.as_ptr() as *mut libc::c_void,
            iov_len: h.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    // SAFETY: both iovecs point into live buffers.
    if unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 2) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Transport for Dev {
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> std::io::Result<()> {
        match body {
            Ok(b) => send(&self.0, unique, 0, b),
            Err(e) => send(&self.0, unique, -e, &[]),
        }
    }
}

impl Notify for Dev {
    fn inval_inode(&self, nodeid: u64, offset: i64, len: i64) -> std::io::Result<()> {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&nodeid.to_ne_bytes());
        b[8..16].copy_from_slice(&offset.to_ne_bytes());
        b[16..].copy_from_slice(&len.to_ne_bytes());
        send(&self.0, 0, crate::abi::NOTIFY_INVAL_INODE, &b)
    }
}

/// Reads one request; None once the mount is gone.
fn read_req(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        // SAFETY: reads into a live buffer of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
            Some(libc::ENODEV) => return Ok(None),
            _ => return Err(e),
        }
    }
}

fn serve_one(server: &dyn Serve, t: &Arc<dyn Transport>, b: &[u8], out: &mut [u8]) {
    let Some(header) = InHeader::parse(b) else {
        return;
    };
    let args = &b[IN_HEADER_LEN.min(b.len())..];
    let f = crate::request::fixed_len(header.opcode).min(args.len());
    let req = RawRequest {
        header,
        fixed: &args[..f],
        rest: &args[f..],
    };
    let dev = |t: &Arc<dyn Transport>, unique, r| {
        let _ = t.reply_later(unique, r);
    };
    match server.serve(&req, out, t) {
        Answer::Reply(n) => dev(t, header.unique, Ok(&out[..n])),
        Answer::Error(e) => dev(t, header.unique, Err(e)),
        Answer::None => {}
    }
}

/// The descriptor number in `/dev/fd/N` or `/proc/self/fd/N`.
pub fn fd_path(p: &Path) -> Option<i32> {
    let s = p.to_str()?;
    let n = s
        .strip_prefix("/dev/fd/")
        .or_else(|| s.strip_prefix("/proc/self/fd/"))?;
    n.parse::<i32>().ok().filter(|&n| n >= 0)
}

/// A copy of descriptor `fd`, which must be an open /dev/fuse (character device 10, 229).
fn fuse_device_fd(fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: fstat into a zeroed struct; dup of a descriptor number (fails if not open).
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != libc::makedev(10, 229) {
            return Err(std::io::Error::other(format!(
                "/dev/fd/{fd} is not a /dev/fuse descriptor (a mount point given as /dev/fd/N \
                 is a /dev/fuse descriptor its caller has mounted)"
            )));
        }
        let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
        if d < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(std::os::fd::OwnedFd::from_raw_fd(d))
    }
}

/// Opens /dev/fuse and mounts it at `mountpoint` as "fuse.uext4" (so /proc/mounts shows the
/// subtype, as fusermount3 records it for ordinary users), with the image as the source.
fn mount_as_root(
    image: &Path,
    mountpoint: &Path,
    opts: &Options,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let dev: std::os::fd::OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let mode = std::fs::metadata(mountpoint)?.mode();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={:o},user_id={uid},group_id={gid}",
        dev.as_raw_fd(),
        mode & libc::S_IFMT
    );
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags: libc::c_ulong = 0;
    if opts.nodev {
        flags |= libc::MS_NODEV;
    }
    if opts.nosuid {
        flags |= libc::MS_NOSUID;
    }
    if opts.noexec {
        flags |= libc::MS_NOEXEC;
    }
    if opts.read_only {
        flags |= libc::MS_RDONLY;
    }
    let c = |s: &[u8]| {
        std::ffi::CString::new(s).map_err(|_| std::io::Error::other("a NUL in a mount argument"))
    };
    let src = c(image.as_os_str().as_bytes())?;
    let target = c(mountpoint.as_os_str().as_bytes())?;
    let data = c(data.as_bytes())?;
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            c"fuse.uext4".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(dev)
}
