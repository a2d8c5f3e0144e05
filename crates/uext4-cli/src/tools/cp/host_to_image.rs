//! Copying a host tree into an image (`cp HOST IMAGE:PATH`, `mkfs -d DIR`).

use super::rules::*;
use super::*;
use crate::host::*;
use crate::image::*;
use anyhow::{bail, Context, Result};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use uext4::Fs;

struct HostToImage<'a> {
    fs: &'a Fs,
    links: Links<(u64, u64), u32>,
    progress: Progress,
    failed_at: Option<PathBuf>,
}

impl HostToImage<'_> {
    /// Copies `src` to `name` in `dir`; on failure remembers the deepest path that failed.
    fn copy(&mut self, src: &Path, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let r = self.copy_one(src, dir, name, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(src.to_path_buf());
        }
        r
    }

    fn copy_one(&mut self, src: &Path, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let md = std::fs::symlink_metadata(src)?;
        let fs = self.fs;
        let ft = md.file_type();
        let key = (md.dev(), md.ino());
        if let Some(&earlier) = self.links.earlier(&key, md.nlink(), ft.is_dir()) {
            make_room(fs, dir, name)?;
            fs.link(earlier, dir, name)?;
            return Ok(());
        }
        let owner = (md.uid(), md.gid());
        let ino = if ft.is_dir() {
            if !recursive {
                bail!("{}: is a directory (use -r)", src.display());
            }
            let ino = match fs.lookup(dir, name) {
                Ok(a) if a.is_dir() => a.ino,
                _ => fs.mkdir(dir, name, md.mode(), owner.0, owner.1)?.ino,
            };
            self.copy_entries(src, ino)?;
            ino
        } else if ft.is_symlink() {
            let t = std::fs::read_link(src)?;
            let target = NewEntry::Symlink(t.as_os_str().as_bytes());
            make_entry(fs, dir, name, target, md.mode(), owner)?
        } else if ft.is_file() {
            let ino = make_entry(fs, dir, name, NewEntry::File, md.mode(), owner)?;
            let f = std::fs::File::open(src)?;
            copy_segments(
                &host_segments(&f, md.len()),
                &self.progress,
                |off, buf| {
                    f.read_exact_at(buf, off)?;
                    Ok(buf.len())
                },
                |off, data| Ok(fs.write_all(ino, off, data)?),
            )?;
            if fs.getattr(ino)?.size != md.len() {
                fs.truncate(ino, md.len())?;
            }
            ino
        } else {
            let special = NewEntry::Special(md.rdev() as u32);
            make_entry(fs, dir, name, special, md.mode(), owner)?
        };
        self.links.note(key, md.nlink(), ft.is_dir(), ino);
        self.copy_attributes(src, &md, ino, false)
    }

    /// Copies the entries of the host directory `src` into the image's directory `dir`, in
    /// name order (the same image from the same tree, whatever order the host lists it in).
    fn copy_entries(&mut self, src: &Path, dir: u32) -> Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(src)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            self.copy(&e.path(), dir, e.file_name().as_bytes(), true)?;
        }
        Ok(())
    }

    /// `cp -r DIR/. IMAGE:DEST`, as cp(1): DIR's contents into DEST, and DIR's own mode,
    /// owner, times and attributes onto DEST (`mkfs -d DIR` puts a tree in the root so).
    fn copy_contents(&mut self, src: &Path, dir: u32) -> Result<()> {
        let md = std::fs::metadata(src)?;
        if !md.is_dir() {
            bail!("{}: not a directory", src.display());
        }
        self.copy_entries(src, dir)?;
        self.copy_attributes(src, &md, dir, true)
    }

    /// Extended attributes, mode and times of `src` onto `ino` (and its owner with `owner`:
    /// made inodes get it at creation).
    fn copy_attributes(
        &mut self,
        src: &Path,
        md: &std::fs::Metadata,
        ino: u32,
        owner: bool,
    ) -> Result<()> {
        let xattrs = host_xattrs(src).unwrap_or_else(|e| {
            warn_xattr(src, b"(list)", e);
            Vec::new()
        });
        let meta = CopiedMeta {
            mode: md.mode(),
            owner: owner.then(|| (md.uid(), md.gid())),
            atime: ts(md.atime(), md.atime_nsec()),
            mtime: ts(md.mtime(), md.mtime_nsec()),
            crtime: None,
        };
        set_image_metadata(self.fs, ino, src, xattrs, &meta)
    }
}

/// Copies the contents of the host directory `src` into the image directory `dir` (and
/// `src`'s own attributes onto `dir`), as `cp -a SRC/. DEST`.
pub(crate) fn copy_host_contents(fs: &Fs, src: &Path, dir: u32) -> Result<()> {
    let mut c = HostToImage {
        fs,
        links: Links::new(),
        progress: Progress::new(host_total(src)),
        failed_at: None,
    };
    let r = c.copy_contents(src, dir);
    match c.failed_at {
        Some(p) => r.with_context(|| p.display().to_string()),
        None => r,
    }
}

/// `cp [-r] HOST IMAGE:PATH` (and `HOST/.`, the directory's contents).
pub(super) fn cp(
    src: &str,
    dst: &str,
    s: &Path,
    img: &Img,
    d: &str,
    recursive: bool,
) -> Result<()> {
    let fs = open_img(img, false)?;
    let total = host_total(s);
    if src == "." || src.ends_with("/.") {
        // DIR/. : DIR's contents into the directory DST, as cp(1).
        let r = (|| -> Result<()> {
            if !recursive {
                bail!("{src}: is a directory (use -r)");
            }
            let dir = resolve(&fs, d, true).with_context(|| dst.to_string())?;
            if !fs.getattr(dir)?.is_dir() {
                bail!("{dst}: not a directory");
            }
            copy_host_contents(&fs, s, dir)
        })();
        return finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")));
    }
    let r = (|| -> Result<()> {
        let name = s
            .file_name()
            .ok_or_else(|| anyhow!("{src}: no file name"))?
            .as_bytes()
            .to_vec();
        let (dir, n) = match resolve(&fs, d, true) {
            Ok(ino) if fs.getattr(ino)?.is_dir() => (ino, name),
            _ => parent_of(&fs, d)?,
        };
        let mut c = HostToImage {
            fs: &fs,
            links: rules::Links::new(),
            progress: Progress::new(total),
            failed_at: None,
        };
        let r = c.copy(s, dir, &n, recursive);
        match c.failed_at {
            Some(p) if p != s => r.with_context(|| p.display().to_string()),
            _ => r,
        }
    })();
    finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")))
}
