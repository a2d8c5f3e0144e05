//! Helpers shared by the engine's integration tests: scratch images, e2fsck, environment checks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch image path in /dev/shm (or the temp dir), removed on drop.
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("UEXT4_KEEP_IMAGES").is_none() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

pub fn scratch(tag: &str) -> Scratch {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Scratch(dir.join(format!(
        "uext4-test-{}-{}-{}.img",
        tag,
        std::process::id(),
        n
    )))
}

/// Makes an image with mke2fs (the oracle), `size` like "64M", extra args like ["-b", "1024"].
pub fn mke2fs(path: &Path, size: &str, extra: &[&str]) {
    let _ = std::fs::remove_file(path);
    // mke2fs picks 1 KiB blocks for images under 512 MiB ("small"): default to 4 KiB unless the
    // caller asks.
    let bs: &[&str] = if extra.contains(&"-b") {
        &[]
    } else {
        &["-b", "4096"]
    };
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .args(bs)
        .args(extra)
        .arg(path)
        .arg(size)
        .status()
        .expect("mke2fs must be installed (e2fsprogs)");
    assert!(st.success(), "mke2fs failed for {}", path.display());
}

/// Runs `e2fsck -fn` and panics with its output on any complaint.
pub fn e2fsck_clean(path: &Path) {
    let out = Command::new("e2fsck")
        .args(["-fn"])
        .arg(path)
        .output()
        .expect("e2fsck must be installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "e2fsck -fn found problems in {}:\n{}",
        path.display(),
        text
    );
}

pub fn is_root() -> bool {
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Whether loop mounts of ext4 work here (root, loop devices, ext4 in the kernel).
pub fn can_loop_mount() -> bool {
    if !is_root() {
        eprintln!("SKIP: not root, kernel loop-mount comparison not run");
        return false;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIP: no /dev/loop-control, kernel loop-mount comparison not run");
        return false;
    }
    true
}

/// Mounts `img` with the kernel at a fresh directory; unmounts on drop.
pub struct KernelMount {
    pub dir: PathBuf,
}

impl KernelMount {
    pub fn new(img: &Path) -> KernelMount {
        let dir = std::env::temp_dir().join(format!(
            "uext4-kmnt-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(img)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kernel mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        KernelMount { dir }
    }

    /// Unmounts, retrying for up to 10 s while the kernel says the mount is busy (a process
    /// still closing a file); true once it is gone.
    pub fn try_unmount(&self) -> bool {
        for _ in 0..50 {
            if Command::new("umount")
                .arg(&self.dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
            {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        !std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .contains(&*self.dir.to_string_lossy())
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        // A mount left behind would pin its loop device and its (deleted) image in memory:
        // detach it lazily if it stays busy.
        if !self.try_unmount() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs a shell command, panicking with its output on failure.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small deterministic pseudo-random source (xorshift64) for tests that damage or drop
/// things at random places: the same seed gives the same run.
#[allow(dead_code)]
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.max(1);
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

// ---- A device that fails on demand ----

/// A device that fails I/O on demand: every write (`FAIL_ALL`), the writes that touch the
/// primary superblock's home (`FAIL_SUPERBLOCK`: every checkpoint writes it, no log write does),
/// or every read (`FAIL_READS`); or panics on every write (`PANIC_ON_WRITE`: a bug anywhere
/// below a commit).
pub struct FaultyDevice {
    pub inner: uext4::blockdev::FileDevice,
    pub mode: std::sync::atomic::AtomicU8,
    /// Called with (offset, length) before every write: a test looks at the engine from
    /// inside a write.
    #[allow(clippy::type_complexity)]
    pub on_write: std::sync::Mutex<Option<Box<dyn Fn(u64, usize) + Send + Sync>>>,
}
pub const FAIL_NONE: u8 = 0;
pub const FAIL_ALL: u8 = 1;
pub const FAIL_SUPERBLOCK: u8 = 2;
pub const FAIL_READS: u8 = 3;
pub const PANIC_ON_WRITE: u8 = 4;

impl FaultyDevice {
    pub fn fail(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

impl uext4::blockdev::BlockDevice for FaultyDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.mode.load(Ordering::SeqCst) == FAIL_READS {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        if let Some(f) = self.on_write.lock().unwrap().as_ref() {
            f(off, buf.len());
        }
        let fail = match self.mode.load(Ordering::SeqCst) {
            FAIL_ALL => true,
            FAIL_SUPERBLOCK => off < 2048 && off + buf.len() as u64 > 1024,
            PANIC_ON_WRITE => panic!("injected: device write at {off}"),
            _ => false,
        };
        if fail {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Opens `img` on a `FaultyDevice` (failing nothing yet), buffered or not, with no commit timer.
pub fn open_faulty(
    img: &Path,
    buffered: bool,
) -> (std::sync::Arc<FaultyDevice>, std::sync::Arc<uext4::Fs>) {
    let dev = std::sync::Arc::new(FaultyDevice {
        inner: uext4::blockdev::FileDevice::open(img, false).unwrap(),
        mode: std::sync::atomic::AtomicU8::new(FAIL_NONE),
        on_write: std::sync::Mutex::new(None),
    });
    let opts = uext4::MountOptions {
        commit_interval_secs: 0,
        buffered,
        ..Default::default()
    };
    let fs = uext4::Fs::open_dev(dev.clone(), opts).unwrap();
    (dev, fs)
}
