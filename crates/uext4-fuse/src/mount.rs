//! Mounting and unmounting: root mounts /dev/fuse itself with mount(2) as "fuse.uext4";
//! others ask the setuid fusermount3, which opens /dev/fuse with their rights, mounts it and
//! passes the descriptor back over a socket (SCM_RIGHTS on the socket named by the
//! `_FUSE_COMMFD` environment variable, as libfuse does); a mount point given as `/dev/fd/N`
//! is a /dev/fuse descriptor its caller has already mounted (libfuse's convention).

use crate::options::Options;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use uext4::AtimeMode;

fn fusermount_bin() -> std::ffi::OsString {
    std::env::var_os("FUSERMOUNT_PATH").unwrap_or_else(|| "fusermount3".into())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn cstring(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::other("a NUL in a mount argument"))
}

/// Mounts `image` at `mountpoint` and returns the mounted /dev/fuse descriptor: the caller's
/// own descriptor for `/dev/fd/N`, a mount(2) of our own for root, fusermount3's for others.
pub(crate) fn mount(image: &Path, mountpoint: &Path, opts: &Options) -> io::Result<OwnedFd> {
    if let Some(fd) = fd_path(mountpoint) {
        fuse_device_fd(fd)
    } else if is_root() {
        mount_as_root(image, mountpoint, opts)
    } else {
        mount_with_fusermount(image, mountpoint, opts)
    }
}

/// Unmounts `mountpoint`: root with umount2 (detaching when busy), others with fusermount3
/// (`-z` when busy). A detached mount serves its open files until they are closed.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    let busy = || {
        eprintln!(
            "uext4: {} is busy: detached, serving open files until they are closed",
            mountpoint.display()
        )
    };
    if is_root() {
        let c = cstring(mountpoint.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        busy();
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        return Err(io::Error::last_os_error());
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
        busy();
        return Ok(());
    }
    Err(io::Error::other(format!(
        "fusermount3 -u: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Mounts what is mounted at `from` at `to` as well (root only): a bind mount, then its own
/// mount flags (read-only, nosuid, nodev, noexec, atime) as `opts` asks. Both mounts are the
/// one FUSE connection.
pub fn bind_mount(from: &Path, to: &Path, opts: &Options) -> io::Result<()> {
    let (src, target) = (
        cstring(from.as_os_str().as_bytes())?,
        cstring(to.as_os_str().as_bytes())?,
    );
    // SAFETY: valid NUL-terminated strings; the type and data are ignored for a bind.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = libc::MS_REMOUNT | libc::MS_BIND | mount_flags(opts);
    // SAFETY: as above; a remount of the bind changes only that mount's flags.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        return Err(e);
    }
    Ok(())
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
fn fuse_device_fd(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: fstat into a zeroed struct; dup of a descriptor number (fails if not open).
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != libc::makedev(10, 229) {
            return Err(io::Error::other(format!(
                "/dev/fd/{fd} is not a /dev/fuse descriptor (a mount point given as /dev/fd/N \
                 is a /dev/fuse descriptor its caller has mounted)"
            )));
        }
        let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
        if d < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(d))
    }
}

/// The generic mount flags the options ask for. The atime flags change nothing in the kernel
/// (a FUSE inode is S_NOATIME: the server keeps atime) but show in the mount table.
fn mount_flags(opts: &Options) -> libc::c_ulong {
    let mut flags: libc::c_ulong = 0;
    for (on, f) in [
        (opts.nodev, libc::MS_NODEV),
        (opts.nosuid, libc::MS_NOSUID),
        (opts.noexec, libc::MS_NOEXEC),
        (opts.read_only, libc::MS_RDONLY),
        (opts.atime.mode == AtimeMode::NoAtime, libc::MS_NOATIME),
        (opts.atime.mode == AtimeMode::Strict, libc::MS_STRICTATIME),
        (opts.atime.nodiratime, libc::MS_NODIRATIME),
    ] {
        if on {
            flags |= f;
        }
    }
    flags
}

/// Opens /dev/fuse and mounts it at `mountpoint` as "fuse.uext4" (so /proc/mounts shows the
/// subtype, as fusermount3 records it for ordinary users), with the image as the source.
fn mount_as_root(image: &Path, mountpoint: &Path, opts: &Options) -> io::Result<OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let dev: OwnedFd = std::fs::OpenOptions::new()
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
    let src = cstring(image.as_os_str().as_bytes())?;
    let target = cstring(mountpoint.as_os_str().as_bytes())?;
    let data = cstring(data.as_bytes())?;
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            c"fuse.uext4".as_ptr(),
            mount_flags(opts),
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// The `-o` list fusermount3 gets. It adds nosuid and nodev for ordinary users itself, and
/// refuses allow_other unless /etc/fuse.conf has user_allow_other.
fn fusermount_options(image: &Path, opts: &Options) -> Vec<u8> {
    // fusermount3 splits the list at commas and takes a backslash as an escape.
    let mut o = b"fsname=".to_vec();
    for &c in image.as_os_str().as_bytes() {
        if c == b',' || c == b'\\' {
            o.push(b'\\');
        }
        o.push(c);
    }
    o.extend_from_slice(b",subtype=uext4");
    o.extend_from_slice(if opts.read_only { b",ro" } else { b",rw" });
    for (on, name) in [
        (opts.default_permissions, &b",default_permissions"[..]),
        (opts.allow_other, b",allow_other"),
        (true, b",nodev"),
        (true, b",nosuid"),
        (opts.noexec, b",noexec"),
        // fusermount3 (3.14) knows noatime, not strictatime or nodiratime.
        (opts.atime.mode == AtimeMode::NoAtime, b",noatime"),
    ] {
        if on {
            o.extend_from_slice(name);
        }
    }
    o
}

/// Has fusermount3 mount /dev/fuse at `mountpoint` and receives the descriptor from it.
fn mount_with_fusermount(image: &Path, mountpoint: &Path, opts: &Options) -> io::Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let mut sv = [0i32; 2];
    // SAFETY: socketpair writes two descriptors into `sv`.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are ours.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    let child_fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(fusermount_bin());
    cmd.arg("-o")
        .arg(std::ffi::OsStr::from_bytes(&fusermount_options(
            image, opts,
        )))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", child_fd.to_string())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only fcntl, which is async-signal-safe: fusermount3
    // inherits its end of the socket.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(child_fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    let received = receive_fd(&ours);
    let out = child.wait_with_output()?;
    let why = || {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if msg.is_empty() {
            format!("fusermount3 {}", out.status)
        } else {
            msg
        }
    };
    match received {
        Ok(Some(fd)) if out.status.success() => Ok(fd),
        Ok(Some(_)) | Ok(None) => Err(io::Error::other(why())),
        Err(e) => Err(io::Error::other(format!("{e}: {}", why()))),
    }
}

/// Receives one descriptor sent with SCM_RIGHTS; None when the peer closed the socket without
/// sending one (fusermount3 failed).
fn receive_fd(sock: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    // Room for one descriptor's control message, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    loop {
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` points at buffers that live through the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(None);
        }
        // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR/CMSG_DATA stay within `control`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            if c.is_null()
                || (*c).cmsg_level != libc::SOL_SOCKET
                || (*c).cmsg_type != libc::SCM_RIGHTS
            {
                return Ok(None);
            }
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32);
            return Ok(Some(OwnedFd::from_raw_fd(fd)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount_options_escape_the_source() {
        let o = Options::default();
        let s = fusermount_options(Path::new("/i,m\\g"), &o);
        assert_eq!(
            String::from_utf8(s).unwrap(),
            "fsname=/i\\,m\\\\g,subtype=uext4,rw,default_permissions,nodev,nosuid"
        );
    }

    /// fusermount3 mounts and hands the descriptor back over the socket (run as root here,
    /// which fusermount3 serves the same way as other users).
    #[test]
    fn fusermount3_hands_back_the_descriptor() {
        if !is_root() || !Path::new("/dev/fuse").exists() {
            eprintln!("SKIP: needs root and /dev/fuse");
            return;
        }
        if std::process::Command::new(fusermount_bin())
            .arg("-V")
            .output()
            .is_err()
        {
            eprintln!("SKIP: fusermount3 is not installed");
            return;
        }
        let dir = std::env::temp_dir().join(format!("uext4-fusermount-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fd = mount_with_fusermount(Path::new("/img,a\\b"), &dir, &Options::default()).unwrap();
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_rdev, libc::makedev(10, 229), "not /dev/fuse");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let dir_s = dir.to_str().unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(dir_s))
            .unwrap_or_else(|| panic!("not mounted: {mounts}"));
        // The source keeps its comma and backslash (escaped as /proc/mounts does).
        assert!(line.starts_with("/img,a\\134b "), "{line}");
        assert!(line.contains(" fuse.uext4 "), "{line}");
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
        drop(fd);
        unmount(&dir).unwrap();
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn fd_paths() {
        assert_eq!(fd_path(Path::new("/dev/fd/5")), Some(5));
        assert_eq!(fd_path(Path::new("/proc/self/fd/12")), Some(12));
        assert_eq!(fd_path(Path::new("/mnt/x")), None);
        assert_eq!(fd_path(Path::new("/dev/fd/-1")), None);
    }
}
