//! Mounting and serving: the fuser configuration for the options, the session and its
//! threads, and unmounting.

use crate::adapter::Uext4Fuse;
use crate::options::Options;
use fuser::{Config, MountOption, SessionACL};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::Fs;

/// The fuser configuration for these options.
pub fn fuse_config(image: &Path, opts: &Options) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName(image.display().to_string()),
        MountOption::Subtype("uext4".into()),
    ];
    if opts.default_permissions {
        c.mount_options.push(MountOption::DefaultPermissions);
    }
    c.mount_options.push(if opts.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    // Device nodes and set-user-ID work for root's mounts; fusermount3 refuses them to others.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    c.mount_options.push(if root && !opts.nodev {
        MountOption::Dev
    } else {
        MountOption::NoDev
    });
    c.mount_options.push(if root && !opts.nosuid {
        MountOption::Suid
    } else {
        MountOption::NoSuid
    });
    if opts.noexec {
        c.mount_options.push(MountOption::NoExec);
    }
    if opts.allow_other {
        c.acl = SessionACL::All;
    }
    c.n_threads = Some(opts.threads);
    // A /dev/fuse descriptor per loop thread (FUSE_DEV_IOC_CLONE), so requests spread over them.
    c.clone_fd = true;
    c
}

fn fusermount_bin() -> std::ffi::OsString {
    std::env::var_os("FUSERMOUNT_PATH").unwrap_or_else(|| "fusermount3".into())
}

/// A mount being served: the session's threads, and how to take the mount down.
pub struct Served {
    session: fuser::BackgroundSession,
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
        self.session.guard.is_finished()
    }

    /// Waits until the session ends (someone else unmounted it).
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
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
/// ([`Served::unmount_and_join`], or `umount`/`fusermount3 -u` from outside). Root mounts
/// directly; other users through the setuid fusermount3, which opens /dev/fuse with the
/// user's rights (so the device must be accessible to them, as it is on most distributions).
pub fn serve(
    fs: Arc<Fs>,
    image: &Path,
    mountpoint: &Path,
    opts: &Options,
) -> std::io::Result<Served> {
    let config = fuse_config(image, opts);
    let server = Uext4Fuse::new(fs, opts.clone());
    let notifier = server.notifier.clone();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let session = if let Some(fd) = fd_path(mountpoint) {
        // libfuse's convention (what Apptainer and mount.fuse3's drop_privileges pass): the
        // caller opened /dev/fuse and mounted it; /dev/fd/N is that descriptor.
        let dev = fuse_device_fd(fd)?;
        fuser::Session::from_fd(server, dev, config.acl, config.clone())?.spawn()?
    } else if root {
        // Root mounts directly, as the type "fuse.uext4" (fuser's own mount says "fuse").
        let dev = mount_as_root(image, mountpoint, opts)?;
        fuser::Session::from_fd(server, dev, config.acl, config.clone())?.spawn()?
    } else {
        fuser::spawn_mount2(server, mountpoint, &config)?
    };
    let _ = notifier.set(session.notifier());
    Ok(Served {
        session,
        mountpoint: mountpoint.to_path_buf(),
    })
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
