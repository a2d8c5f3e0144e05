//! Paths inside the filesystem: a path of names walked from a directory with `lookup`, its
//! symlinks followed as the kernel's path walk follows them (every one in the middle; the
//! last only when asked), for embedders that name files by path (the tools, the Python
//! package) rather than by inode.

use crate::error::{Error, Result};
use crate::format::inode::{S_IFLNK, S_IFMT};
use crate::fs::Fs;

/// More symlinks than this in one walk is a loop (the kernel's MAXSYMLINKS).
const SYMLINKS_MAX: u32 = 40;

impl Fs {
    /// The inode `path` names, walked from directory `start` (from the root, inode 2, when
    /// `path` begins with `/`). Empty components and `.` are skipped; `..` is the directory's
    /// own entry. A symlink met in the middle is followed (a relative target from the
    /// directory holding it); the last component's only with `follow`.
    ///
    /// # Errors
    /// What [`Fs::lookup`] reports for a component ([`Error::NotFound`], [`Error::NotDir`],
    /// ...), and [`Error::Invalid`] after more than 40 symlinks.
    pub fn lookup_path(&self, start: u32, path: &[u8], follow: bool) -> Result<u32> {
        self.walk_path(start, path, follow, &mut 0)
    }

    fn walk_path(&self, start: u32, path: &[u8], follow: bool, links: &mut u32) -> Result<u32> {
        let mut cur = if path.first() == Some(&b'/') {
            2
        } else {
            start
        };
        let comps: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        for (i, c) in comps.iter().enumerate() {
            let a = self.lookup(cur, c)?;
            let last = i + 1 == comps.len();
            if a.mode & S_IFMT == S_IFLNK && (!last || follow) {
                *links += 1;
                if *links > SYMLINKS_MAX {
                    return Err(Error::Invalid("too many levels of symbolic links".into()));
                }
                let target = self.readlink(a.ino)?;
                cur = self.walk_path(cur, &target, true, links)?;
            } else {
                cur = a.ino;
            }
        }
        Ok(cur)
    }
}
