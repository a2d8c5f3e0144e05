//! Copying between images, or within one (`cp IMAGE:A IMAGE:B`).

use super::rules::*;
use super::*;
use crate::image::*;
use anyhow::{bail, Result};
use std::path::Path;
use uext4::Fs;

/// A copy between two images (or within one), engine to engine.
struct ImageToImage<'a> {
    src: &'a Fs,
    dst: &'a Fs,
    /// Source inode -> destination inode, for hard links.
    links: Links<u32, u32>,
    progress: Progress,
    /// The source path (as far as known) of the deepest failure.
    failed_at: Option<String>,
    /// Source directories entered so far (see `directory_cycle`).
    dirs_seen: std::collections::HashSet<u32>,
    /// Within one image: the directories this copy made or filled, which it must not copy
    /// again as sources (`cp -r img:/a img:/a/b`, or a corrupt entry leading back up).
    dirs_made: std::collections::HashSet<u32>,
}

impl ImageToImage<'_> {
    /// Within one image: refuses to copy directory `src` into `dst_dir` when that is `src`
    /// itself or below it (the copy would never end).
    fn refuse_into_itself(&self, src: u32, dst_dir: u32) -> Result<()> {
        let mut cur = dst_dir;
        for _ in 0..4096 {
            if cur == src {
                bail!("cannot copy a directory into itself");
            }
            if cur == 2 {
                return Ok(());
            }
            cur = self.dst.lookup(cur, b"..")?.ino;
        }
        bail!("directory tree too deep")
    }

    fn copy_children(&mut self, ino: u32, dir: u32) -> Result<()> {
        let mut entries = Vec::new();
        self.src.readdir(ino, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e);
            }
            true
        })?;
        for e in entries {
            self.copy(e.ino, dir, &e.name, true)?;
        }
        Ok(())
    }

    fn copy(&mut self, ino: u32, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let r = self.copy_one(ino, dir, name, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(String::from_utf8_lossy(name).into_owned());
        } else if let (Err(_), Some(p)) = (&r, &mut self.failed_at) {
            // Build the failing path up as the recursion unwinds.
            if !p.starts_with('/') {
                *p = format!("{}/{p}", String::from_utf8_lossy(name));
            }
        }
        r
    }

    fn copy_one(&mut self, ino: u32, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let (src, dst) = (self.src, self.dst);
        let a = src.getattr(ino)?;
        let kind = a.mode as u32 & 0o170000;
        let is_dir = kind == 0o040000;
        if let Some(&earlier) = self.links.earlier(&ino, a.nlink as u64, is_dir) {
            make_room(dst, dir, name)?;
            dst.link(earlier, dir, name)?;
            return Ok(());
        }
        let owner = (a.uid, a.gid);
        let new = match kind {
            0o040000 => {
                if !recursive {
                    bail!("the source is a directory (use -r)");
                }
                if self.dirs_made.contains(&ino) {
                    bail!("cannot copy a directory into itself");
                }
                if !self.dirs_seen.insert(ino) {
                    return Err(directory_cycle(ino).into());
                }
                let d = match dst.lookup(dir, name) {
                    Ok(e) if e.is_dir() => e.ino,
                    _ => dst.mkdir(dir, name, a.mode as u32, a.uid, a.gid)?.ino,
                };
                if std::ptr::eq(src, dst) {
                    self.dirs_made.insert(d);
                }
                self.copy_children(ino, d)?;
                d
            }
            0o120000 => {
                let target = src.readlink(ino)?;
                make_entry(
                    dst,
                    dir,
                    name,
                    NewEntry::Symlink(&target),
                    a.mode as u32,
                    owner,
                )?
            }
            0o100000 => {
                if let Ok(e) = dst.lookup(dir, name) {
                    if std::ptr::eq(src, dst) && e.ino == ino {
                        bail!("source and destination are the same file");
                    }
                }
                let f = make_entry(dst, dir, name, NewEntry::File, a.mode as u32, owner)?;
                copy_segments(
                    &image_segments(src, ino, a.size)?,
                    &self.progress,
                    |off, buf| Ok(src.read(ino, off, buf)?),
                    |off, data| Ok(dst.write_all(f, off, data)?),
                )?;
                if dst.getattr(f)?.size != a.size {
                    dst.truncate(f, a.size)?;
                }
                f
            }
            _ => make_entry(
                dst,
                dir,
                name,
                NewEntry::Special(a.rdev),
                a.mode as u32,
                owner,
            )?,
        };
        self.links.note(ino, a.nlink as u64, is_dir, new);
        let what = String::from_utf8_lossy(name).into_owned();
        let what = Path::new(&what);
        let xattrs = src
            .listxattr(ino)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| match src.getxattr(ino, &n) {
                Ok(v) => Some((n, v)),
                Err(e) => {
                    warn_xattr(what, &n, e);
                    None
                }
            });
        let meta = CopiedMeta {
            mode: a.mode as u32,
            owner: None,
            atime: a.atime,
            mtime: a.mtime,
            crtime: Some(a.crtime),
        };
        set_image_metadata(dst, new, what, xattrs, &meta)
    }
}

/// `cp [-r] IMAGE:PATH IMAGE:PATH`: directly between the two engines; one engine when both
/// sides are the same image.
pub(super) fn cp(
    src: &str,
    dst: &str,
    (si, s): (&Img, &str),
    (di, d): (&Img, &str),
    recursive: bool,
) -> Result<()> {
    // Directly between the two engines; one engine when both sides are the same image.
    let same_file = std::fs::canonicalize(&si.path)? == std::fs::canonicalize(&di.path)?;
    let same = same_file && si.within == di.within;
    if same_file && !same {
        // Two parts of one file: fine when they are apart (two partitions), never
        // when one overlaps the other.
        let (a, b) = (si.range()?, di.range()?);
        if a.0 < b.1 && b.0 < a.1 {
            bail!("{src} -> {dst}: the two overlap in {}", si.path.display());
        }
    }
    let dfs = open_img(di, false)?;
    let sfs = if same {
        dfs.clone()
    } else {
        match open_img(si, true) {
            Ok(f) => f,
            Err(e) => return finish(&dfs, &di.path, Err(e)),
        }
    };
    let r = (|| -> Result<()> {
        let ino = resolve(&sfs, s, false).with_context(|| src.to_string())?;
        let total = if recursive {
            image_total(&sfs, ino, &mut Default::default())
        } else {
            sfs.getattr(ino)?.size
        };
        let mut c = ImageToImage {
            src: &sfs,
            dst: &dfs,
            links: rules::Links::new(),
            progress: Progress::new(total),
            failed_at: None,
            dirs_seen: Default::default(),
            dirs_made: Default::default(),
        };
        let target = resolve(&dfs, d, true)
            .ok()
            .filter(|&t| dfs.getattr(t).map(|a| a.is_dir()).unwrap_or(false));
        let name = s
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty() && *n != ".")
            .map(|n| n.as_bytes().to_vec());
        let r = match (target, name) {
            // The root into an existing directory: its entries go into it.
            (Some(t), None) => {
                if same && sfs.getattr(ino)?.is_dir() {
                    c.refuse_into_itself(ino, t)?;
                }
                c.copy_children(ino, t)
            }
            (Some(t), Some(n)) => {
                if same && sfs.getattr(ino)?.is_dir() {
                    c.refuse_into_itself(ino, t)?;
                }
                c.copy(ino, t, &n, recursive)
            }
            (None, _) => {
                let (pd, pn) = parent_of(&dfs, d)?;
                if same && sfs.getattr(ino)?.is_dir() {
                    c.refuse_into_itself(ino, pd)?;
                }
                c.copy(ino, pd, &pn, recursive)
            }
        };
        match c.failed_at {
            Some(p) => r.with_context(|| p),
            None => r,
        }
    })();
    finish(&dfs, &di.path, r.with_context(|| format!("{src} -> {dst}")))
}
