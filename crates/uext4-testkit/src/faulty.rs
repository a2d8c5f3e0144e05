//! A device that fails on demand, and a kernel loop mount of an image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

/// Mounts `img` with the kernel at a fresh directory; unmounts on drop.
pub struct KernelMount {
    pub dir: PathBuf,
}

impl KernelMount {
    pub fn new(img: &Path) -> KernelMount {
        let dir = std::env::temp_dir().join(format!(
            "uext4-kmnt-{}-{}",
            std::process::id(),
            crate::scratch::next()
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
    /// still closing a file); true once it is gone, at once if it was gone already (an
    /// unmount done before the drop: umount then fails with "not mounted", which is no
    /// reason to wait).
    pub fn try_unmount(&self) -> bool {
        for _ in 0..50 {
            if Command::new("umount")
                .arg(&self.dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
                || !self.mounted()
            {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        !self.mounted()
    }

    /// Whether /proc/mounts lists the mount point (its second field, exactly: a point
    /// named by a prefix of another's is not that one).
    fn mounted(&self) -> bool {
        let dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let dir = dir.to_string_lossy();
        std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(&*dir))
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
    let fs = uext4::Fs::open_dev(dev.clone(), crate::opts::no_timer_buffered(buffered)).unwrap();
    (dev, fs)
}
