//! FUSE mounts made by the `uext4` binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Mounts `img` at `mnt` with the `uext4` binary `bin` (`bin mount OPTS IMG MNT`); panics
/// with its error output if the mount fails.
pub fn uext4_mount(bin: &str, img: &Path, mnt: &Path, opts: &[&str]) {
    let o = Command::new(bin)
        .arg("mount")
        .args(opts)
        .arg(img)
        .arg(mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A test's image (in /dev/shm) and its mount points (in a directory of the temp dir), named
/// by a tag and this process's id. Dropped, it detaches whatever is still mounted on its
/// points (`umount -l`) and removes the image and the directory, so that a test leaves
/// nothing behind, failed or not. The image is not made here.
pub struct MountPlace {
    /// Where the image goes.
    pub img: PathBuf,
    base: PathBuf,
    points: Vec<PathBuf>,
}

impl MountPlace {
    /// `/dev/shm/uext4-TAG-PID.img` (removed if a run before left one) and the mount points
    /// `POINTS` in `TMPDIR/uext4-TAG-PID/`.
    pub fn new(tag: &str, points: &[&str]) -> MountPlace {
        let name = format!("uext4-{tag}-{}", std::process::id());
        let base = std::env::temp_dir().join(&name);
        let points: Vec<PathBuf> = points.iter().map(|p| base.join(p)).collect();
        for p in &points {
            std::fs::create_dir_all(p).unwrap();
        }
        let img = PathBuf::from(format!("/dev/shm/{name}.img"));
        let _ = std::fs::remove_file(&img);
        MountPlace { img, base, points }
    }

    /// Mount point `i` (in the order given to `new`).
    pub fn point(&self, i: usize) -> PathBuf {
        self.points[i].clone()
    }
}

impl Drop for MountPlace {
    /// Every directory in the place is taken for a mount point (a test may make more there
    /// than it named): each is detached if mounted and removed if empty; nothing is removed
    /// recursively.
    fn drop(&mut self) {
        let dirs: Vec<PathBuf> = std::fs::read_dir(&self.base)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        for p in &dirs {
            let _ = Command::new("umount").arg("-l").arg(p).output();
        }
        let _ = std::fs::remove_file(&self.img);
        for p in &dirs {
            let _ = std::fs::remove_dir(p);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

/// Unmounts `mnt` with umount(8) and waits until the server of `img` is gone. A mount found
/// busy is tried again for up to 3 s (right after a test's last close, umount(8) found the
/// mount busy in two of a dozen runs of the cache-mode model test while fstests loaded the
/// machine; the cause was not found), then the test fails naming what holds it.
pub fn umount_and_wait(mnt: &Path, img: &Path) {
    let start = Instant::now();
    while !Command::new("umount").arg(mnt).status().unwrap().success() {
        if start.elapsed() > Duration::from_secs(3) {
            let holders = Command::new("fuser").arg("-vm").arg(mnt).output();
            let holders = holders
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!("umount {} failed; held by: {holders}", mnt.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_server_gone(img);
}

/// Waits until no uext4 server serves `img` any more: `umount` returns before the server has
/// written the image back and exited. Panics after 20 s.
pub fn wait_server_gone(img: impl AsRef<Path>) {
    let name = img.as_ref().to_string_lossy().into_owned();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let busy = Command::new("pgrep")
            .args(["-f", &format!("uext4 mount -f .*{name}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not exit after unmount");
}

/// An idmapped mount (Linux 5.12+) of the mount at `src` at `dst`: on-disk ids
/// `from..from + n` (users and groups) show as `to..to + n` there, and files created
/// there by `to..` are stored as `from..`. Made as mount(8) and container runtimes make it:
/// a user namespace with that mapping (a helper process's, from `unshare --user`, whose maps
/// this process writes), then open_tree(OPEN_TREE_CLONE), mount_setattr(MOUNT_ATTR_IDMAP)
/// and move_mount. Err with the step that failed: the filesystem refusing idmapped mounts
/// fails at mount_setattr (EINVAL).
pub fn idmapped_mount(src: &Path, dst: &Path, from: u32, to: u32, n: u32) -> Result<(), String> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut helper = Command::new("unshare")
        .args(["--user", "sleep", "60"])
        .spawn()
        .map_err(|e| format!("unshare: {e}"))?;
    let pid = helper.id();
    let ours = std::fs::read_link("/proc/self/ns/user").map_err(|e| e.to_string())?;
    let start = Instant::now();
    while std::fs::read_link(format!("/proc/{pid}/ns/user"))
        .ok()
        .as_ref()
        == Some(&ours)
    {
        if start.elapsed() > Duration::from_secs(5) {
            let _ = helper.kill();
            return Err("unshare --user did not enter a user namespace".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // A line of uid_map is "inside outside count". An idmapped mount shows a file's
    // on-disk id as the host id that the namespace maps it to: disk `from` shows as `to`.
    let line = format!("{from} {to} {n}\n");
    let maps = ["uid_map", "gid_map"]
        .iter()
        .try_for_each(|m| std::fs::write(format!("/proc/{pid}/{m}"), &line));
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"));
    let _ = helper.kill();
    let _ = helper.wait();
    maps.map_err(|e| format!("writing the user namespace's maps: {e}"))?;
    let ns = ns.map_err(|e| format!("opening the user namespace: {e}"))?;

    let path = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (src, dst, empty) = (path(src), path(dst), CString::new("").unwrap());
    const OPEN_TREE_CLONE: libc::c_ulong = 1;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_ulong = 4;
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let last = || std::io::Error::last_os_error();
    // SAFETY: the syscalls get valid NUL-terminated paths and a MountAttr of the size given.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_ulong,
        );
        if fd < 0 {
            return Err(format!("open_tree: {}", last()));
        }
        let tree = OwnedFd::from_raw_fd(fd as i32);
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: ns.as_raw_fd() as u64,
        };
        if libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ) != 0
        {
            return Err(format!("mount_setattr(MOUNT_ATTR_IDMAP): {}", last()));
        }
        if libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ) != 0
        {
            return Err(format!("move_mount: {}", last()));
        }
    }
    Ok(())
}
