//! `uext4 mount` and `uext4 stats`.
//!
//! Without -f, `mount` starts itself again with -f in the background (a new session, output to
//! a log file next to nothing the user sees) and returns once the mount shows up in
//! /proc/self/mountinfo, or prints the child's error if it exits first. In the foreground it
//! serves until SIGINT/SIGTERM/SIGHUP (then it unmounts) or until someone else unmounts it
//! (`umount`, `fusermount3 -u`); either way it commits everything, marks the image clean and
//! exits 0.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use uext4::Fs;
use uext4_fuse::Options;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Stay in the foreground.
    #[arg(short = 'f')]
    foreground: bool,
    /// Comma-separated options: ro, rw, threads=N, allow_other, default_permissions,
    /// writeback_cache, direct_io, commit=SECONDS, errors=remount-ro|continue|panic, dax,
    /// nodax (an image on tmpfs is mapped unless this is given), noacl (POSIX ACLs are on by
    /// default), delalloc (the engine caches allocating writes and writes them back in large
    /// runs); where the filesystem is: partition=N (of a GPT or MBR disk image; or write
    /// IMAGE@N), offset=BYTES (a multiple of 512, as fuse2fs's offset=; or write
    /// IMAGE@offset=BYTES) with an optional size=BYTES; norecovery (alias noload: the
    /// journal is not replayed; implies ro), transport=auto|uring|dev (how requests reach the
    /// server), fakeroot (everyone is root inside, as fuse2fs's), prealloc=zeroed|unwritten
    /// (what fallocate leaves), key=FILE (an fscrypt master key), the atime policy (relatime,
    /// the default; strictatime, noatime, nodiratime, atime, lazytime), entry_timeout=SECONDS
    /// and attr_timeout=SECONDS (how long the kernel keeps names and attributes; a day by
    /// default), noopen (files opened without OPEN requests: with ro or noatime; see
    /// docs/USAGE.md), usrquota (or quota), grpquota and prjquota (quota limits enforced, as the
    /// kernel's; usage is kept without them), nosandbox and
    /// sandbox=required (see docs/SECURITY.md). mount(8)'s generic options (nodev, nosuid,
    /// noexec, nofail, _netdev, user, ...) are taken as mount(8) gives them.
    #[arg(short = 'o')]
    options: Vec<String>,
    /// The image file or block device (IMAGE@N, IMAGE@offset=BYTES, an NBD URI).
    image: PathBuf,
    /// The directory to mount it on.
    mountpoint: PathBuf,
}

/// A mountinfo field with its octal escapes (`\040` for a space and so on) decoded.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// A line of /proc/self/mountinfo.
#[derive(Clone, Debug)]
struct MountEntry {
    id: u64,
    /// The superblock's device number ("0:53"): one FUSE connection for all of its mounts.
    dev: String,
    target: PathBuf,
    fstype: String,
    source: PathBuf,
    /// The superblock's options ("rw,user_id=0,..."): read-only here means the server is.
    super_opts: String,
}

impl MountEntry {
    fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.")
    }

    /// Whether the filesystem behind the mount is read-only (not only this mount).
    fn super_read_only(&self) -> bool {
        self.super_opts.split(',').any(|o| o == "ro")
    }
}

/// The mounts this process sees, in mount order.
fn mountinfo() -> Vec<MountEntry> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let path = |f: &str| PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(f)));
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            if f.len() < 5 {
                return None;
            }
            Some(MountEntry {
                id: f[0].parse().ok()?,
                dev: f[2].to_string(),
                target: path(f[4]),
                fstype: f.get(sep + 1)?.to_string(),
                source: path(f.get(sep + 2)?),
                super_opts: f.get(sep + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// The mounts at `mountpoint` (an absolute, canonical path): (mount id, filesystem type).
fn mounts_at(mountpoint: &Path) -> Vec<(u64, String)> {
    mounts_with_source_at(mountpoint)
        .into_iter()
        .map(|(id, t, _)| (id, t))
        .collect()
}

/// The mounts at `mountpoint`: (mount id, filesystem type, source).
fn mounts_with_source_at(mountpoint: &Path) -> Vec<(u64, String, PathBuf)> {
    mountinfo()
        .into_iter()
        .filter(|m| m.target == mountpoint)
        .map(|m| (m.id, m.fstype, m.source))
        .collect()
}

/// The ids of the FUSE mounts at `mountpoint` (type "fuse", or "fuse.uext4" where the
/// subtype is recorded).
fn uext4_mounts_at(mountpoint: &Path) -> Vec<u64> {
    mounts_at(mountpoint)
        .into_iter()
        .filter(|(_, t)| t == "fuse" || t.starts_with("fuse."))
        .map(|(id, _)| id)
        .collect()
}

/// Whether `mountpoint` is currently a mount point (per /proc/self/mountinfo).
pub fn is_mounted(mountpoint: &Path) -> bool {
    let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    !mounts_at(&canon).is_empty()
}

/// `uext4 umount`: unmounts a uext4 mount and returns once its server has written the image
/// back and exited. (umount(8) returns as soon as the kernel lets go of the mount point,
/// before the server has committed: a program that opens the image right after, the kernel's
/// own mount or e2fsck, would find it half written.) It waits for that mount's server only,
/// found by the process id its root answers in `user.uext4.server`, and gives up after
/// `timeout`.
pub fn run_umount(mountpoint: &Path, timeout: Duration) -> Result<()> {
    let mnt =
        std::fs::canonicalize(mountpoint).with_context(|| mountpoint.display().to_string())?;
    // The topmost FUSE mount there (mounts stacked on one directory: the one umount takes).
    let Some(ours) = mountinfo()
        .into_iter()
        .rev()
        .find(|m| m.target == mnt && m.is_fuse())
    else {
        bail!("{}: not a uext4 mount", mountpoint.display());
    };
    let pid = server_pid(&mnt).with_context(|| {
        format!(
            "{}: not a uext4 mount (its root does not name a uext4 server)",
            mountpoint.display()
        )
    })?;
    // A descriptor on the process, so that a new process reusing its id is not waited for.
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    // SAFETY: we own the new descriptor; OwnedFd closes it.
    let pidfd = (pidfd >= 0)
        .then(|| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) });
    uext4_fuse::unmount(&mnt).with_context(|| format!("unmounting {}", mnt.display()))?;
    // Another mount of the same filesystem (the image mounted a second time, attached to this
    // server) keeps the server serving: there is nothing to wait for.
    if mountinfo().iter().any(|m| m.dev == ours.dev) {
        return Ok(());
    }
    let Some(pidfd) = pidfd else {
        // The server is already gone.
        return Ok(());
    };
    let start = Instant::now();
    let mut told = false;
    loop {
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a pidfd becomes readable when its process exits.
        if unsafe { libc::poll(&mut p, 1, 200) } > 0 {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= timeout {
            bail!(
                "{}: the server (pid {pid}) has not finished after {} s (files still open on a \
                 busy mount keep it serving); it goes on in the background",
                mnt.display(),
                timeout.as_secs()
            );
        }
        if !told && waited > Duration::from_secs(2) {
            eprintln!(
                "uext4: umount: waiting for the server (pid {pid}) to write the image back (and \
                 for files still open on a busy mount to close)"
            );
            told = true;
        }
    }
}

/// The process id of the uext4 server of the mount at `mnt`.
fn server_pid(mnt: &Path) -> Result<u32> {
    let v = root_xattr(mnt, uext4_fuse::SERVER_XATTR)?;
    std::str::from_utf8(&v)?
        .trim()
        .parse()
        .context("reading the server's process id")
}

/// One of the virtual attributes a uext4 server answers on its root (`uext4_fuse`).
fn root_xattr(mountpoint: &Path, name: &[u8]) -> std::io::Result<Vec<u8>> {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
    let name = std::ffi::CString::new(name)?;
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Takes `offset=BYTES` (fuse2fs's name), `size=BYTES` and `partition=N` out of the option
/// list: they say where the filesystem is, not how to serve it. Returns the other options and
/// the `@` form they make (`offset=N[,size=N]` or `N`), if any.
fn take_region_options(options: &[String]) -> Result<(Vec<String>, Option<String>)> {
    let (mut rest, mut offset, mut size, mut part) = (Vec::new(), None, None, None);
    for o in options.iter().flat_map(|l| l.split(',')) {
        match o.trim().split_once('=') {
            Some(("offset", v)) => offset = Some(v.to_string()),
            Some(("size", v)) => size = Some(v.to_string()),
            Some(("partition", v)) => part = Some(v.to_string()),
            _ if o.trim().is_empty() => {}
            _ => rest.push(o.trim().to_string()),
        }
    }
    let spec = match (offset, size, part) {
        (None, None, None) => None,
        (None, None, Some(p)) => Some(p),
        (Some(o), s, None) => Some(match s {
            Some(s) => format!("offset={o},size={s}"),
            None => format!("offset={o}"),
        }),
        (None, Some(_), _) => bail!("option size= needs offset= (size=BYTES is the length there)"),
        (Some(_), _, Some(_)) => bail!("options offset= and partition= exclude each other"),
    };
    Ok((rest, spec))
}

/// Where the filesystem is and how to serve it, read from IMAGE and the `-o` list as
/// `uext4 mount` and `uext4 serve` read them.
pub(crate) struct Target {
    /// The image, and where in it the filesystem lies.
    pub img: crate::image::Img,
    pub region: Option<uext4::blockdev::Region>,
    /// The options as given, less partition=/offset=/size= (which `img` holds).
    pub listed: Vec<String>,
    /// `listed` less the sandbox options.
    pub options: Vec<String>,
    pub sandbox: crate::sandbox::Mode,
    pub opts: Options,
}

/// Reads IMAGE (IMAGE@N, IMAGE@offset=BYTES, an NBD URI) and the `-o` list for command
/// `cmd`. A wrong option is a usage error whatever the image, as for mount(8): one line, then
/// exit status 2.
pub(crate) fn target(image: &Path, options: &[String], cmd: &str) -> Result<Target> {
    let usage = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("uext4: {cmd}: {e}");
        std::process::exit(crate::usage_status());
    };
    // Where the filesystem is: IMAGE@N or IMAGE@offset=BYTES, or -o partition=N / offset=BYTES.
    let (listed, spec) = take_region_options(options).unwrap_or_else(|e| usage(&e));
    let (options, sandbox) = crate::sandbox::take_option(&listed).unwrap_or_else(|e| usage(&e));
    let opts = Options::parse(&options.join(",")).unwrap_or_else(|e| usage(&e));
    let mut img = crate::image::image_arg(image)?;
    // Read access only: a write-protected image mounts read-only (write_protected).
    crate::image::check_image(&img.path, false)?;
    if let Some(spec) = &spec {
        if img.within != crate::image::Within::Whole {
            let opt = if spec.starts_with("offset=") {
                spec.clone()
            } else {
                format!("partition={spec}")
            };
            bail!(
                "{}: the image names its partition or offset already; drop -o {opt}",
                image.display()
            );
        }
        img.within = crate::image::parse_within(spec).with_context(|| format!("-o {spec}"))?;
    }
    let region = crate::image::fs_region_of(&img)?;
    Ok(Target {
        img,
        region,
        listed,
        options,
        sandbox,
        opts,
    })
}

pub fn run_mount(a: MountArgs) -> Result<()> {
    let Target {
        img,
        region,
        listed,
        options,
        sandbox,
        opts,
    } = target(&a.image, &a.options, "mount")?;
    let a = MountArgs {
        image: img.path.clone(),
        options: match region_option(&img) {
            Some(o) => listed.iter().cloned().chain([o]).collect(),
            None => listed.clone(),
        },
        ..a
    };
    if sandbox == crate::sandbox::Mode::Required {
        if let Some(m) = crate::sandbox::missing_here().first() {
            bail!("sandbox=required: {m}");
        }
    }
    let nbd = uext4::image::is_nbd_uri(&a.image);
    // /dev/fd/N as the mount point: a /dev/fuse descriptor the caller has mounted (checked
    // when the server starts). Otherwise a directory.
    let fd_mount = uext4_fuse::fd_path(&a.mountpoint).is_some();
    if !fd_mount {
        match std::fs::metadata(&a.mountpoint) {
            Ok(m) if m.is_dir() => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
                "{}: a FUSE mount whose server is gone is still there; umount it first",
                a.mountpoint.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("{}: mount point does not exist", a.mountpoint.display())
            }
            _ => bail!("{}: mount point is not a directory", a.mountpoint.display()),
        }
    }
    // Absolute from here on: the mount table names mount points (and shows the image) that way.
    // An image or mount point given as a descriptor (/proc/self/fd/N, /dev/fd/N) stays so:
    // the file it names may have no path reachable from here. An NBD URI is kept as written
    // (it names no local file).
    let keep = |p: &Path| -> Result<PathBuf> {
        if uext4_fuse::fd_path(p).is_some() {
            Ok(p.to_path_buf())
        } else {
            std::fs::canonicalize(p).with_context(|| p.display().to_string())
        }
    };
    let mountpoint = keep(&a.mountpoint)?;
    let image = if nbd {
        a.image.clone()
    } else {
        keep(&a.image)?
    };
    if !nbd && !fd_mount {
        if let Some(first) = served_by(&image, img.within) {
            if let Some(r) = attach(&first, &image, &mountpoint, &opts) {
                return r;
            }
        }
    }
    if !a.foreground {
        return daemonize(&a, &image, &mountpoint);
    }
    serve_foreground(
        &image,
        region,
        &mountpoint,
        &opts,
        (asked_rw(&options), sandbox),
    )
}

/// Whether the options ask for a read-write mount in so many words: the last of `ro` and `rw`
/// is `rw`. Such a mount fails where the filesystem can only be read; without it, the mount
/// goes read-only and says why.
pub(crate) fn asked_rw(options: &[String]) -> bool {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .rfind(|o| *o == "ro" || *o == "rw")
        == Some("rw")
}

/// One of the mounts of a uext4 server.
struct Served {
    entry: MountEntry,
    pid: u32,
}

/// A mount of a uext4 server serving the filesystem `within` of `image` here (among the mounts
/// this process sees), a read-write one where there are several servers.
fn served_by(image: &Path, within: crate::image::Within) -> Option<Served> {
    use std::os::unix::fs::MetadataExt;
    let mut found: Vec<Served> = mountinfo()
        .into_iter()
        .filter(|m| m.fstype == "fuse.uext4" && m.source == image)
        .filter_map(|m| {
            // Only a mount that is not hidden under another answers for itself. Asking it
            // goes through its server: one that does not answer in time (hung, or stopped
            // under a debugger) is passed over, not waited for, and its hold on the image
            // then refuses the new mount in one line.
            let target = m.target.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let d = std::fs::metadata(&target).ok().map(|st| st.dev());
                let _ = tx.send(d.map(|d| (d, server_pid(&target).ok())));
            });
            let (d, pid) = rx.recv_timeout(Duration::from_secs(2)).ok()??;
            if format!("{}:{}", libc::major(d), libc::minor(d)) != m.dev {
                return None;
            }
            let pid = pid?;
            (served_within(pid)? == within).then_some(Served { entry: m, pid })
        })
        .collect();
    found.sort_by_key(|s| s.entry.super_read_only());
    found.into_iter().next()
}

/// Which part of its image the uext4 server `pid` serves, from its command line (`uext4 mount
/// -f [-o OPTIONS]... IMAGE MOUNTPOINT`, as `mount` starts it).
fn served_within(pid: u32) -> Option<crate::image::Within> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = raw
        .split(|&b| b == 0)
        .skip(1)
        .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string())
        .peekable();
    args.next_if(|a| a == "mount");
    let (mut options, mut positional) = (Vec::new(), Vec::new());
    while let Some(a) = args.next() {
        let s = a.to_string_lossy().into_owned();
        if s == "-o" {
            options.push(args.next()?.to_string_lossy().into_owned());
        } else if let Some(o) = s.strip_prefix("-o") {
            options.push(o.to_string());
        } else if !s.starts_with('-') {
            positional.push(a);
        }
    }
    let img = crate::image::image_arg(Path::new(positional.first()?)).ok()?;
    match take_region_options(&options).ok()?.1 {
        Some(spec) if img.within == crate::image::Within::Whole => {
            crate::image::parse_within(&spec).ok()
        }
        _ => Some(img.within),
    }
}

/// A second mount of an image a uext4 server already serves: a bind mount of the server's
/// mount (read-only where asked), so that one server and one FUSE connection serve both, as
/// the kernel mounts one device twice as one filesystem. The kernel keeps the connection
/// until the last of the mounts goes. The server's options (its atime policy, threads,
/// caching) apply to both. None where the image is served read-only and a read-only mount
/// of its own serves as well (an ordinary user cannot bind-mount).
fn attach(first: &Served, image: &Path, mountpoint: &Path, opts: &Options) -> Option<Result<()>> {
    let at = first.entry.target.display();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if first.entry.super_read_only() {
        if !opts.read_only {
            return Some(Err(anyhow::anyhow!(
                "{}: mounted read-only at {at} (server pid {}); a read-write mount of it is \
                 refused while that one lasts (mount it -o ro, or unmount {at} first)",
                image.display(),
                first.pid
            )));
        }
        if !root {
            return None;
        }
    }
    if !root {
        return Some(Err(anyhow::anyhow!(
            "{}: already mounted at {at} (server pid {}); a second mount joins that server \
             with a bind mount, which needs root",
            image.display(),
            first.pid
        )));
    }
    Some(
        uext4_fuse::bind_mount(&first.entry.target, mountpoint, opts).with_context(|| {
            format!(
                "mounting {} at {} as a bind mount of {at}",
                image.display(),
                mountpoint.display()
            )
        }),
    )
}

/// The `-o` option that names `img`'s partition or offset, for the server started in the
/// background.
fn region_option(img: &crate::image::Img) -> Option<String> {
    use crate::image::Within;
    match img.within {
        Within::Whole => None,
        Within::Partition(n) => Some(format!("partition={n}")),
        Within::Offset { offset, size: None } => Some(format!("offset={offset}")),
        Within::Offset {
            offset,
            size: Some(s),
        } => Some(format!("offset={offset},size={s}")),
    }
}

fn daemonize(a: &MountArgs, image: &Path, mountpoint: &Path) -> Result<()> {
    // Ready when a uext4 mount that was not there before shows up at the mount point.
    let before = uext4_mounts_at(mountpoint);
    let exe = std::env::current_exe()?;
    let log = std::env::temp_dir().join(format!("uext4-mount-{}.log", std::process::id()));
    let logf = std::fs::File::create(&log)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg("-f");
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(image).arg(mountpoint);
    // Its messages go to the system log once nobody reads its stderr (log.rs).
    cmd.env(crate::log::BACKGROUND_ENV, "1");
    // In the root directory, as daemons go: the caller's working directory may be inside
    // another mount, which a server kept there would hold busy until it exits (`cd /mnt/a;
    // uext4 mount b.img /mnt/b; umount /mnt/a` failed with "target is busy"). The image and
    // mount point are absolute by now; an NBD URI may name a relative socket path, so the
    // server for one stays where it was started.
    if image.is_absolute() {
        cmd.current_dir("/");
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    // A new session, so the terminal's signals do not reach the server.
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and takes no arguments.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the server")?;
    let start = Instant::now();
    loop {
        if uext4_mounts_at(mountpoint)
            .iter()
            .any(|id| !before.contains(id))
        {
            // The server's word that it went read-only, and why, said once here (its stderr
            // is nobody's after this).
            let msg = std::fs::read_to_string(&log).unwrap_or_default();
            for l in msg.lines().filter(|l| l.contains("read-only")) {
                eprintln!("{l}");
            }
            let _ = std::fs::remove_file(&log);
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            let msg = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            let line = msg
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim_start_matches("uext4: mount: ")
                .to_string();
            // The server's own error is the mount's, in the words every command uses (an
            // image that is not ext4 reads as it does from `uext4 ls`).
            if line.is_empty() {
                bail!("the server exited ({st}) before the mount was ready");
            }
            bail!("{line}");
        }
        if start.elapsed() > Duration::from_secs(30) {
            // SIGTERM first: a server that did mount takes its mount down with it.
            // SAFETY: kill with a child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && child.try_wait()?.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            bail!("the mount did not become ready within 30 seconds");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A read-only mount's shared lock on its image, held while it serves: a uext4 writer's
/// claim (the engine's holder.rs, an exclusive lock) is refused meanwhile, while other
/// read-only mounts and tools may read. Waits a while for a writer on its way out (below).
fn lock_shared(image: &Path) -> Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(image).with_context(|| image.display().to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            bail!("{}: locking: {e}", image.display());
        }
        if Instant::now() >= deadline || fuse_mounted(image) {
            bail!(
                "{}: in use by a read-write uext4 mount or a uext4 tool writing it",
                image.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Opens the image for the server. A read-write open claims it (holder.rs); when the holder
/// is another uext4 and no mount names the image any more, it is a server on its way out
/// (`umount` returns before the server has written the image back) or a tool writing it:
/// wait for it up to 10 s instead of refusing at once.
fn open_for_mount(image: &Path, opts: uext4::MountOptions) -> Result<std::sync::Arc<Fs>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Fs::open_path(image, opts.clone()) {
            Err(uext4::Error::InUse(h))
                if h.by_uext4 && Instant::now() < deadline && !fuse_mounted(image) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r.with_context(|| image.display().to_string()),
        }
    }
}

/// Whether a FUSE mount names `image` as its source (as uext4 mount does, by its full path).
fn fuse_mounted(image: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(image) else {
        return false;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo.lines().any(|l| {
        let mut t = l.split(" - ").nth(1).unwrap_or("").split(' ');
        let (fstype, src) = (t.next().unwrap_or(""), t.next().unwrap_or(""));
        fstype.starts_with("fuse")
            && Path::new(std::ffi::OsStr::from_bytes(&unescape(src))) == canon
    })
}

/// Blocks the stop signals in every thread to come; the caller waits for them. SIGUSR1: the
/// session has ended (raised by the thread that waits for it).
pub(crate) fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain signal-mask manipulation on the current thread before threads start.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// The mount points of the filesystem with device number `dev` (a server's mount and the
/// bind mounts of a second mount of its image); without one, `mountpoint` while mounted.
fn mounts_of(dev: Option<&str>, mountpoint: &Path) -> Vec<PathBuf> {
    match dev {
        Some(d) => mountinfo()
            .into_iter()
            .filter(|m| m.dev == d)
            .map(|m| m.target)
            .collect(),
        None if is_mounted(mountpoint) => vec![mountpoint.to_path_buf()],
        None => Vec::new(),
    }
}

/// Whether the image file refuses this process's writes: then a mount asked `-o rw` fails in
/// one line, and any other goes read-only saying so, as the kernel's mount does with a
/// write-protected device.
fn write_protected(image: &Path, asked_rw: bool) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(image.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        return Ok(false);
    }
    if asked_rw {
        bail!(
            "{}: cannot mount read-write (-o rw): the image is write-protected",
            image.display()
        );
    }
    eprintln!(
        "uext4: {} is write-protected, mounting read-only",
        image.display()
    );
    Ok(true)
}

/// An image opened for a server (`mount`, `serve`).
pub(crate) struct Opened {
    pub fs: std::sync::Arc<Fs>,
    /// The options it is served with: `ro` where the image or device refuses writes.
    pub opts: Options,
    /// A read-only server's shared lock on the image, held while it serves.
    pub lock: Option<std::fs::File>,
}

/// Opens the image for a server: read-only where it is write-protected (refused when
/// `asked_rw`), or where the filesystem can only be read (said unless `ro` was asked), with
/// errors=panic's hook in place. The caller has blocked the stop signals
/// ([`block_stop_signals`]) first: the engine starts threads.
pub(crate) fn open_served(
    image: &Path,
    region: Option<uext4::blockdev::Region>,
    opts: &Options,
    asked_rw: bool,
) -> Result<Opened> {
    let mut opts = opts.clone();
    let asked_ro = opts.read_only;
    // An NBD export: nothing local to check or lock; the server decides who writes it (one
    // that exports read-only opens read-only).
    let nbd = uext4::image::is_nbd_uri(image);
    if !opts.read_only && !nbd && write_protected(image, asked_rw)? {
        opts.read_only = true;
    }
    if opts.errors == uext4::ErrorsBehaviour::Panic {
        // errors=panic stops the whole server at the first corruption (the engine panics in
        // the request's thread; without this the other threads would go on serving). The
        // journal keeps the image consistent; the mount is left for `umount` to clear.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("uext4: errors=panic: stopping the server");
            std::process::abort();
        }));
    }
    crate::log::set_source(image);
    // A read-write open claims the image for as long as the filesystem lives; a read-only
    // mount holds a shared lock until the process exits.
    let lock = if opts.read_only && !nbd {
        Some(lock_shared(image)?)
    } else {
        None
    };
    let mount_options = uext4::MountOptions {
        region,
        ..opts.mount_options()
    };
    let fs = open_for_mount(image, mount_options)?;
    if let Some(r) = fs.read_only_reason() {
        if asked_rw && !opts.read_only {
            // As the kernel refuses `mount -o rw` of a filesystem with a ro_compat feature it
            // does not know: one line naming it.
            bail!("{}: cannot mount read-write (-o rw): {r}", image.display());
        }
        if !asked_ro {
            eprintln!("uext4: {}: mounted read-only: {r}", image.display());
        }
    }
    // A device that refuses writes (an NBD export served read-only) mounts `ro`, as a
    // write-protected image file does above.
    opts.read_only |= fs.is_read_only();
    check_noopen(&fs, image, &opts)?;
    Ok(Opened { fs, opts, lock })
}

fn serve_foreground(
    image: &Path,
    region: Option<uext4::blockdev::Region>,
    mountpoint: &Path,
    opts: &Options,
    (asked_rw, sandbox): (bool, crate::sandbox::Mode),
) -> Result<()> {
    let set = block_stop_signals();
    let Opened {
        fs,
        opts,
        lock: _lock,
    } = open_served(image, region, opts, asked_rw)?;
    let opts = &opts;
    let before = uext4_mounts_at(mountpoint);
    if opts.dax {
        eprintln!("uext4: dax: the image is mapped; reads and writes are memory copies");
    } else if fs.is_mapped() {
        eprintln!("uext4: the image is on tmpfs: mapped, reads and writes are memory copies (-o nodax: pread/pwrite)");
    }
    let session = uext4_fuse::serve(fs.clone(), image, mountpoint, opts).map_err(mount_error)?;
    let via = if session.uses_uring() {
        "FUSE over io_uring"
    } else {
        "/dev/fuse"
    };
    tracing::info!("{}: requests come through {via}", mountpoint.display());
    // Our mount: the uext4 mount at the mount point that was not there before (mounts stacked
    // on the same directory, older or newer, do not count).
    let ours = uext4_mounts_at(mountpoint)
        .into_iter()
        .filter(|id| !before.contains(id))
        .max();
    // Its device number: a second mount of the image (`attach`) is a bind mount of this one,
    // with the same number; the server serves until the last of them goes.
    let dev = ours.and_then(|id| mountinfo().into_iter().find(|m| m.id == id).map(|m| m.dev));
    let fd_mount = uext4_fuse::fd_path(mountpoint).is_some();
    if opts.noopen && !opts.read_only && !fd_mount {
        teach_no_open(mountpoint);
    }
    let place = (image, mountpoint, dev.as_deref());
    let mut unmounter = contain_server(place, fs.is_read_only(), fd_mount, sandbox)?;
    // The session ends once the kernel lets go of the mount (after the last open file of a
    // detached mount is closed); the thread that waits for it wakes the loop below at once,
    // so the image is written back as soon as the mount is gone.
    let (ended_tx, ended) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = ended_tx.send(session.join());
        // SAFETY: a signal to our own process; SIGUSR1 is blocked in every thread and taken
        // by the loop's sigtimedwait.
        unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
    });
    let our_mounts = || mounts_of(dev.as_deref(), mountpoint);
    let still_mounted = || {
        if fd_mount {
            !waiter.is_finished()
        } else {
            !our_mounts().is_empty()
        }
    };
    loop {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        // SAFETY: `set` is a valid signal set; a null info pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig == libc::SIGUSR1 {
            break;
        }
        if sig > 0 && fd_mount {
            // The caller mounted the descriptor and unmounts it: write everything back and
            // stop serving (the mount answers ENOTCONN until its owner takes it down).
            fs.unmount().context("writing the filesystem back")?;
            std::process::exit(0);
        }
        if sig > 0 {
            // Unmount every mount of this server, newest first (detached when busy); on
            // failure keep serving until asked again. A contained server has its helper do
            // it.
            let done = match &mut unmounter {
                Some(u) => u.unmount(),
                None => unmount_all(dev.as_deref(), mountpoint),
            };
            match done {
                Ok(()) => break,
                Err(e) => tracing::error!("{e:#}"),
            }
        }
        if !still_mounted() {
            break;
        }
    }
    if let Ok(Err(e)) = ended.recv() {
        tracing::error!("serving {}: {e}", mountpoint.display());
    }
    fs.unmount().context("writing the filesystem back")?;
    Ok(())
}

/// Under `-o noopen` opens are no longer asked for: none may be one the engine would refuse.
/// On an image with the encrypt feature, an encrypted file's open fails without its key
/// (ENOKEY, as the kernel's fscrypt_file_open); read-write, a write open of an immutable,
/// append-only or verity file fails.
fn check_noopen(fs: &Fs, image: &Path, opts: &Options) -> Result<()> {
    if !opts.noopen {
        return Ok(());
    }
    if fs
        .superblock()
        .has_incompat(uext4::format::features::INCOMPAT_ENCRYPT)
    {
        bail!(
            "{}: -o noopen: the image has the encrypt feature, and only OPEN can refuse an encrypted file without its key (mount without noopen)",
            image.display()
        );
    }
    if opts.read_only {
        return Ok(());
    }
    if let Some(ino) = fs.first_restricted_inode()? {
        bail!(
            "{}: -o noopen: inode {ino} is immutable, append-only or verity, whose opens for writing only OPEN can refuse (mount ro, or without noopen)",
            image.display()
        );
    }
    Ok(())
}

/// Under `-o noopen`: the kernel stops sending OPEN only once an OPEN has been answered
/// ENOSYS, and until then it sends RELEASE after every CREATE; a program that only makes
/// files (tar) would never open one. So the server opens a file of its own mount once: a
/// nameless one (O_TMPFILE, which the kernel makes with FUSE_TMPFILE), reopened through
/// /proc, which is an OPEN. Where that fails (the mount's owner may not write its root, a
/// kernel without FUSE_TMPFILE), the first open by anyone teaches the kernel instead.
fn teach_no_open(mountpoint: &Path) {
    let dir = match std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) {
        Ok(d) => d,
        Err(_) => return,
    };
    // SAFETY: plain system calls on a valid C string; the descriptors are ours and closed.
    unsafe {
        let fd = libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600);
        if fd < 0 {
            tracing::debug!(
                "noopen: no O_TMPFILE at the mount: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        if let Ok(p) = std::ffi::CString::new(format!("/proc/self/fd/{fd}")) {
            let again = libc::open(p.as_ptr(), libc::O_RDONLY);
            if again >= 0 {
                libc::close(again);
            }
        }
        libc::close(fd);
    }
}

/// Unmounts every mount of the filesystem with device number `dev` (or `mountpoint`), newest
/// first (detached when busy); the first error after trying them all.
pub fn unmount_all(dev: Option<&str>, mountpoint: &Path) -> Result<()> {
    let mut failed = None;
    for m in mounts_of(dev, mountpoint).iter().rev() {
        if let Err(e) = uext4_fuse::unmount(m) {
            failed.get_or_insert(anyhow::anyhow!("unmounting {}: {e}", m.display()));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Contains a mounted server (unless `-o nosandbox`): its unmount helper first (while it
/// may still start one), then `uext4::sandbox`. `place` is the image, the mount point and the
/// mount's device number. Where containing fails, the mount is taken down and the error
/// returned.
fn contain_server(
    (image, mountpoint, dev): (&Path, &Path, Option<&str>),
    read_only: bool,
    fd_mount: bool,
    mode: crate::sandbox::Mode,
) -> Result<Option<crate::sandbox::Unmounter>> {
    if mode == crate::sandbox::Mode::Off {
        return Ok(None);
    }
    // Its stop requests and log lines need nothing it could not reach once contained.
    crate::log::prepare();
    let mut unmounter = if fd_mount {
        None
    } else {
        Some(crate::sandbox::Unmounter::start(dev, mountpoint)?)
    };
    let probe = crate::sandbox::start_probe();
    let local = (!uext4::image::is_nbd_uri(image)).then_some(image);
    if let Err(e) = crate::sandbox::contain(local, read_only, Vec::new()) {
        let down = match &mut unmounter {
            Some(u) => u.unmount(),
            None => Ok(()),
        };
        if let Err(d) = down {
            tracing::error!("{d:#}");
        }
        return Err(e);
    }
    drop(probe);
    Ok(unmounter)
}

/// Why the mount failed, with a hint at the usual cause.
fn mount_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::Unsupported {
        // What the options asked for cannot be had here (transport=uring): no hint.
        return anyhow::anyhow!("mounting: {e}");
    }
    // SAFETY: access and geteuid have no preconditions beyond a valid path.
    let dev_ok = unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    let hint = if !dev_ok {
        "/dev/fuse is not readable and writable by this user"
    } else if unsafe { libc::geteuid() } != 0 {
        "ordinary users mount through fusermount3: is it installed, and may this user write to the mount point?"
    } else {
        "is the fuse module loaded?"
    };
    anyhow::anyhow!("mounting: {e} ({hint})")
}

pub fn run_stats(path: &Path) -> Result<()> {
    // A path inside the mount names it too: the counters live on the mount's root.
    let canon = std::fs::canonicalize(path).with_context(|| path.display().to_string())?;
    let mountpoint = canon
        .ancestors()
        .find(|p| !uext4_mounts_at(p).is_empty())
        .unwrap_or(&canon);
    let buf = root_xattr(mountpoint, uext4_fuse::STATS_XATTR)
        .map_err(|e| anyhow::anyhow!("{}: not on a uext4 mount ({e})", path.display()))?;
    println!("{}", String::from_utf8_lossy(&buf));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_unescape() {
        assert_eq!(unescape("/mnt/a\\040b\\134c"), b"/mnt/a b\\c");
        assert_eq!(unescape("/x\\04"), b"/x\\04");
        assert_eq!(unescape("/plain"), b"/plain");
    }

    #[test]
    fn root_is_a_mount_and_not_uext4() {
        assert!(is_mounted(Path::new("/")));
        assert!(!mounts_at(Path::new("/")).is_empty());
        assert!(uext4_mounts_at(Path::new("/")).is_empty());
    }
}
