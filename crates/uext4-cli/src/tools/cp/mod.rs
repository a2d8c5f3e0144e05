//! `uext4 cp`: host to image, image to host, image to image (and `--from-tar`, in tar.rs).
//! The three directions share one rule each for hard links, file data and metadata
//! (this module); each direction's file says only how it reads and makes entries.

mod data_writer;
mod host_to_image;
mod host_walk;
mod image_to_host;
mod image_to_image;
pub(crate) mod rules;

pub(crate) use host_to_image::copy_host_contents;

use crate::image::*;
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use uext4::Fs;
use uext4::Timestamp;

/// Items gathered on one thread until `N` make a batch for another (the tree walk's entries,
/// the data writer's files): one channel message per batch, not per item.
pub(super) struct Gather<T, const N: usize>(std::cell::RefCell<Vec<T>>);

impl<T, const N: usize> Default for Gather<T, N> {
    fn default() -> Self {
        Gather(std::cell::RefCell::new(Vec::new()))
    }
}

impl<T, const N: usize> Gather<T, N> {
    /// Adds `t`; whether a batch is full and should be sent.
    fn push(&self, t: T) -> bool {
        let mut p = self.0.borrow_mut();
        p.push(t);
        p.len() >= N
    }

    /// What was gathered, to send (empty: nothing to send).
    fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.borrow_mut())
    }
}

/// A progress bar over the bytes a copy moves, shown on large copies to a terminal.
pub(super) struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(total: u64) -> Progress {
        use std::io::IsTerminal;
        if total >= 64 << 20 && std::io::stderr().is_terminal() && !quiet() {
            let pb = indicatif::ProgressBar::new(total);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Progress(Some(pb))
        } else {
            Progress(None)
        }
    }
    /// For a copy from the host path `src`: the walk that sizes the bar happens only where a
    /// bar can be shown.
    fn for_host(src: &Path) -> Progress {
        use std::io::IsTerminal;
        match std::io::stderr().is_terminal() && !quiet() {
            true => Progress::new(host_total(src)),
            false => Progress(None),
        }
    }
    fn add(&self, n: u64) {
        if let Some(p) = &self.0 {
            p.inc(n);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish_and_clear();
        }
    }
}

/// Commits every [`Batch::ENTRIES`] entries a copy makes, and waits for the committed blocks
/// to reach their home every [`Batch::HOME`] commits: the inodes, directory blocks and bitmaps
/// a transaction holds in memory until then stay bounded, whatever the size of the tree. The
/// points are counted, not timed, so the same copy gives the same image.
#[derive(Default)]
pub(crate) struct Batch {
    made: u64,
}

impl Batch {
    const ENTRIES: u64 = 1024;
    const HOME: u64 = 8;

    /// Whether the next [`Batch::made_one`] commits.
    pub(crate) fn commits_next(&self) -> bool {
        (self.made + 1).is_multiple_of(Self::ENTRIES)
    }

    pub(crate) fn made_one(&mut self, fs: &Fs) -> Result<()> {
        self.made += 1;
        if self.made.is_multiple_of(Self::ENTRIES * Self::HOME) {
            fs.sync()?;
        } else if self.made.is_multiple_of(Self::ENTRIES) {
            fs.commit()?;
        }
        Ok(())
    }
}

/// Opens an image to copy into, as a build: see [`crate::tools::build::options`] (which
/// carries the `--key` keys, so that encrypted directories take new files).
pub(crate) fn open_for_copy(img: &Img) -> Result<std::sync::Arc<Fs>> {
    let opts = crate::tools::build::options(img.fs_region()?)?;
    open_with(&img.path, opts)
}

pub(super) fn host_total(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| host_total(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Bytes of regular files under `ino`, to size the progress bar (errors count as 0); each
/// directory counted once (`seen`), so a corrupt image's directory cycle ends the walk.
pub(super) fn image_total(fs: &Fs, ino: u32, seen: &mut std::collections::HashSet<u32>) -> u64 {
    let Ok(a) = fs.getattr(ino) else { return 0 };
    if !a.is_dir() {
        return if a.mode & 0o170000 == 0o100000 {
            a.size
        } else {
            0
        };
    }
    if !seen.insert(ino) {
        return 0;
    }
    let mut kids = Vec::new();
    let _ = fs.readdir(ino, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            kids.push(e.ino);
        }
        true
    });
    kids.into_iter().map(|k| image_total(fs, k, seen)).sum()
}

pub(super) fn ts(sec: i64, nsec: i64) -> Timestamp {
    Timestamp {
        sec,
        nsec: nsec as u32,
    }
}

pub(super) fn warn_xattr(what: &Path, name: &[u8], e: impl std::fmt::Display) {
    eprintln!(
        "uext4: cp: warning: {}: extended attribute {} not copied: {e}",
        what.display(),
        String::from_utf8_lossy(name)
    );
}

/// Whether `path` (host or IMAGE:PATH) is a directory.
pub(super) fn is_directory(path: &str) -> Result<bool> {
    Ok(match parse_loc(path)? {
        Loc::Host(p) => p.is_dir(),
        Loc::Image(img, p) => {
            let fs = open_img(&img, true)?;
            resolve(&fs, &p, true).is_ok_and(|ino| fs.getattr(ino).is_ok_and(|a| a.is_dir()))
        }
    })
}

pub(super) fn cp(src: &str, dst: &str, recursive: bool) -> Result<()> {
    match (parse_loc(src)?, parse_loc(dst)?) {
        (Loc::Host(s), Loc::Image(img, d)) => host_to_image::cp(src, dst, &s, &img, &d, recursive),
        (Loc::Image(img, s), Loc::Host(d)) => image_to_host::cp(src, dst, &img, &s, d, recursive),
        (Loc::Image(si, s), Loc::Image(di, d)) => {
            image_to_image::cp(src, dst, (&si, &s), (&di, &d), recursive)
        }
        (Loc::Host(_), Loc::Host(_)) => {
            // IMAGE:PATH whose image is missing (or a directory): said as every tool says it.
            for p in [src, dst].into_iter().filter(|p| p.contains(':')) {
                crate::image::image_loc(p)?;
            }
            bail!("one side of cp must be IMAGE:PATH (an existing image file)")
        }
    }
}
