//! Directory listings and tree walks for embedders that act on what they find.
//!
//! [`Fs::readdir`] calls back with the directory's locks held, so its callback must not call
//! into the filesystem. [`Fs::read_dir`] collects a directory first and returns the entries,
//! and [`Fs::walk`] goes through a tree one collected directory at a time, so both leave the
//! caller free to stat, read, or change what they find.
//!
//! ```no_run
//! let fs = uext4::Fs::open_path("disk.img".as_ref(), uext4::MountOptions::ro())?;
//! for e in fs.walk(uext4::ROOT_INO) {
//!     let e = e?;
//!     println!("{} {}", e.ino, String::from_utf8_lossy(&e.path));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::Result;
use crate::fs::Fs;
use crate::namei::{DirEntry, FT_DIR};

/// Directories nested deeper than this are not entered (the kernel's paths end at 4096
/// bytes, so at most 2048 levels; a directory loop on a damaged image would be endless).
const WALK_DEPTH_MAX: usize = 2048;

impl Fs {
    /// The entries of directory `dir`, `.` and `..` left out, collected before returning.
    pub fn read_dir(&self, dir: u32) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        self.readdir(dir, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                out.push(e);
            }
            true
        })?;
        Ok(out)
    }

    /// Every name below directory `start`, depth first, each directory before what it holds
    /// and names in each directory's readdir order. A directory that cannot be read ends as
    /// an error item, and the walk goes on with the rest.
    pub fn walk(&self, start: u32) -> Walk<'_> {
        Walk {
            fs: self,
            open: Some((Vec::new(), start, 0)),
            frames: Vec::new(),
        }
    }
}

/// One name found by [`Fs::walk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkEntry {
    /// Its path below the walk's start, without a leading `/` (`a/b/c`).
    pub path: Vec<u8>,
    /// Its inode.
    pub ino: u32,
    /// Its ext4 file type (`FT_*`).
    pub kind: u8,
    /// How many directories below the start it is (0: directly in it).
    pub depth: usize,
}

/// The iterator [`Fs::walk`] returns.
pub struct Walk<'a> {
    fs: &'a Fs,
    /// The directory to read before going on: (path, inode, depth of its entries).
    open: Option<(Vec<u8>, u32, usize)>,
    /// The entries still to give of each directory being walked, innermost last, each in
    /// reverse order (given from the end).
    frames: Vec<Vec<WalkEntry>>,
}

impl Iterator for Walk<'_> {
    type Item = Result<WalkEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some((path, dir, depth)) = self.open.take() {
            let entries = match self.fs.read_dir(dir) {
                Ok(v) => v,
                Err(e) => return Some(Err(e)),
            };
            let frame = entries
                .into_iter()
                .rev()
                .map(|e| {
                    let mut p = path.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                    WalkEntry {
                        path: p,
                        ino: e.ino,
                        kind: e.kind,
                        depth,
                    }
                })
                .collect();
            self.frames.push(frame);
        }
        loop {
            let frame = self.frames.last_mut()?;
            let Some(e) = frame.pop() else {
                self.frames.pop();
                continue;
            };
            if e.kind == FT_DIR && self.frames.len() < WALK_DEPTH_MAX {
                self.open = Some((e.path.clone(), e.ino, e.depth + 1));
            }
            return Some(Ok(e));
        }
    }
}
