//! Copying from an image to the host (`cp IMAGE:PATH HOST`).

use super::rules::*;
use super::*;
use crate::image::*;
use anyhow::{bail, Result};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use uext4::{Attr, Fs};

/// Gives a copied host file the image file's owner (when allowed: root, or the same user),
/// mode and times, in that order: a change of owner clears set-id bits.
fn set_host_times(fs: &Fs, p: &Path, a: &Attr) -> Result<()> {
    use std::ffi::CString;
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: a valid C string. Failure (not root) leaves the copier's ownership, as cp -p does.
    unsafe { libc::lchown(c.as_ptr(), a.uid, a.gid) };
    // Extended attributes after the owner (a chown drops security.capability), before the
    // mode; a symlink's too (trusted. and security. ones).
    for name in fs.listxattr(a.ino).unwrap_or_default() {
        let v = match fs.getxattr(a.ino, &name) {
            Ok(v) => v,
            Err(e) => {
                warn_xattr(p, &name, e);
                continue;
            }
        };
        let cn = CString::new(name.clone())?;
        // SAFETY: valid C strings and a buffer valid for its length.
        let r = unsafe { libc::lsetxattr(c.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if r != 0 {
            warn_xattr(p, &name, std::io::Error::last_os_error());
        }
    }
    if a.mode & 0o170000 != 0o120000 {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(a.mode as u32 & 0o7777))?;
    }
    let t = [
        libc::timespec {
            tv_sec: a.atime.sec as libc::time_t,
            tv_nsec: a.atime.nsec as libc::c_long,
        },
        libc::timespec {
            tv_sec: a.mtime.sec as libc::time_t,
            tv_nsec: a.mtime.nsec as libc::c_long,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

struct ImageToHost<'a> {
    fs: &'a Fs,
    links: Links<u32, PathBuf>,
    progress: Progress,
    failed_at: Option<PathBuf>,
    /// Directories entered so far (see `directory_cycle`).
    dirs_seen: std::collections::HashSet<u32>,
}

impl ImageToHost<'_> {
    /// Copies inode `ino` to `dst`; on failure remembers the deepest path that failed.
    fn copy(&mut self, ino: u32, dst: &Path, recursive: bool) -> Result<()> {
        let r = self.copy_one(ino, dst, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(dst.to_path_buf());
        }
        r
    }

    fn copy_one(&mut self, ino: u32, dst: &Path, recursive: bool) -> Result<()> {
        let fs = self.fs;
        let a = fs.getattr(ino)?;
        match a.mode & 0o170000 {
            0o040000 => {
                if !recursive {
                    bail!("the source is a directory (use -r)");
                }
                if !self.dirs_seen.insert(ino) {
                    return Err(directory_cycle(ino).into());
                }
                if !dst.is_dir() {
                    std::fs::create_dir(dst)?;
                }
                let mut entries = Vec::new();
                fs.readdir(ino, 0, &mut |e| {
                    entries.push(e);
                    true
                })?;
                for e in entries {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    self.copy(e.ino, &dst.join(std::ffi::OsStr::from_bytes(&e.name)), true)?;
                }
            }
            0o120000 => {
                let t = fs.readlink(ino)?;
                let _ = std::fs::remove_file(dst);
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), dst)?;
            }
            0o100000 => {
                if let Some(first) = self.links.earlier(&ino, a.nlink as u64, false) {
                    let _ = std::fs::remove_file(dst);
                    std::fs::hard_link(first, dst)?;
                    return Ok(());
                }
                self.links
                    .note(ino, a.nlink as u64, false, dst.to_path_buf());
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(dst)?;
                copy_segments(
                    &image_segments(fs, ino, a.size)?,
                    &self.progress,
                    |off, buf| Ok(fs.read(ino, off, buf)?),
                    |off, data| Ok(f.write_all_at(data, off)?),
                )?;
                f.set_len(a.size)?;
            }
            _ => {
                use std::ffi::CString;
                let c = CString::new(dst.as_os_str().as_bytes())?;
                // SAFETY: valid C string.
                if unsafe { libc::mknod(c.as_ptr(), a.mode as libc::mode_t, a.rdev as libc::dev_t) }
                    != 0
                {
                    return Err(std::io::Error::last_os_error().into());
                }
            }
        }
        set_host_times(fs, dst, &a)
    }
}

/// `cp [-r] IMAGE:PATH HOST`.
pub(super) fn cp(
    src: &str,
    dst: &str,
    img: &Img,
    s: &str,
    d: PathBuf,
    recursive: bool,
) -> Result<()> {
    let fs = open_img(img, true)?;
    let ino = resolve(&fs, s, false).with_context(|| src.to_string())?;
    let total = if recursive {
        image_total(&fs, ino, &mut Default::default())
    } else {
        fs.getattr(ino)?.size
    };
    let whole_root = s.split('/').all(|c| c.is_empty() || c == ".");
    let target = if d.is_dir() && whole_root {
        // The image's root: its contents go into the directory.
        d
    } else if d.is_dir() {
        let name = s
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("root");
        d.join(name)
    } else {
        d
    };
    let mut c = ImageToHost {
        fs: &fs,
        links: rules::Links::new(),
        progress: Progress::new(total),
        failed_at: None,
        dirs_seen: Default::default(),
    };
    let r = c.copy(ino, &target, recursive);
    let r = match c.failed_at {
        Some(p) if p != target => r.with_context(|| p.display().to_string()),
        _ => r,
    };
    r.with_context(|| format!("{src} -> {dst}"))
}
