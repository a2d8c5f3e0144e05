//! Scratch paths in /dev/shm (or the temp dir) that are removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh number for this process: two scratch paths with one tag never meet.
pub(crate) fn next() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A scratch path (file or directory tree), removed on drop unless `UEXT4_KEEP_IMAGES` is set.
pub struct Scratch(pub PathBuf);

/// The folder scratch paths go in: /dev/shm where there is one (images there are mapped).
pub fn base() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// A scratch image path, not yet made: `uext4-test-TAG-PID-N.img`.
pub fn scratch(tag: &str) -> Scratch {
    Scratch(base().join(format!(
        "uext4-test-{tag}-{}-{}.img",
        std::process::id(),
        next()
    )))
}

impl Scratch {
    /// A path `uext4-TAG-PID` with nothing there yet (anything left by an earlier run removed).
    pub fn new(tag: &str) -> Scratch {
        let p = base().join(format!("uext4-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::remove_file(&p);
        Scratch(p)
    }
    /// An empty directory, as [`Scratch::new`] names it.
    pub fn dir(tag: &str) -> Scratch {
        let s = Scratch::new(tag);
        std::fs::create_dir_all(&s.0).unwrap();
        s
    }
    /// A sparse file of `size` bytes, as [`Scratch::new`] names it.
    pub fn file(tag: &str, size: u64) -> Scratch {
        let s = Scratch::new(tag);
        std::fs::File::create(&s.0).unwrap().set_len(size).unwrap();
        s
    }
    /// The path as a string (test paths are UTF-8).
    pub fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
    /// `IMAGE:PATH` for this image, as the tools take it.
    pub fn at(&self, path: &str) -> String {
        format!("{}:{path}", self.s())
    }
    /// A path inside this scratch directory.
    pub fn p(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("UEXT4_KEEP_IMAGES").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
