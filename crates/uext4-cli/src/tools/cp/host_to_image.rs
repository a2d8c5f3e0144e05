//! Copying a host tree into an image (`cp HOST IMAGE:PATH`, `mkfs -d DIR`): host_walk.rs reads
//! the tree on its own thread; this side makes the entries, in the walk's order.

use super::data_writer::DataWriter;
use super::host_walk::{walk, Data, Entry, Kind, Stat, Xattrs};
use super::rules::*;
use super::*;
use crate::image::*;
use anyhow::{bail, Context, Result};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use uext4::Fs;

/// Where entries go: a directory of the image, and whether this copy made it (then it holds
/// nothing the copy must look for or replace).
struct Target {
    ino: u32,
    made: bool,
}

struct HostToImage<'a> {
    fs: &'a Fs,
    links: Links<(u64, u64), u32>,
    progress: Progress,
    batch: Batch,
    /// The directories begun and not yet ended, innermost last.
    stack: Vec<Target>,
    /// Where file data goes while a copy runs, when new files' blocks are placed and filled
    /// by writer threads (`Fs::place_new_data`): only on an image made afresh, whose free
    /// blocks read as zeros, since a crash may leave placed blocks mapped before their data
    /// is in. Elsewhere (a copy into an existing image) there is none, and the data is
    /// written before the extent that maps it, as every write does.
    writer: Option<DataWriter>,
    /// Whether `run` starts the writer.
    place: bool,
}

impl HostToImage<'_> {
    fn new<'f>(fs: &'f Fs, src: &Path, place: bool) -> HostToImage<'f> {
        HostToImage {
            fs,
            links: Links::new(),
            progress: Progress::for_host(src),
            batch: Batch::default(),
            stack: Vec::new(),
            writer: None,
            place,
        }
    }

    /// Copies what the walk of `src` sends: the first entry as `name` in `dir`, or, with
    /// `contents`, the first directory's entries into `dir` and its attributes onto it (as
    /// `cp -a SRC/. DEST`). An error names the host path it happened at.
    fn run(
        &mut self,
        src: &Path,
        dir: u32,
        name: &[u8],
        recursive: bool,
        contents: bool,
    ) -> Result<()> {
        std::thread::scope(|scope| {
            let rx = walk(scope, src, recursive);
            self.writer = self.place.then(|| DataWriter::start(scope, self.fs));
            let r = self.entries(rx, src, dir, name, recursive, contents);
            // The walk stops once its receiver is gone (dropped in `entries`).
            let written = self.writer.take().map_or(Ok(()), DataWriter::finish);
            r.and(written)
        })
    }

    /// The walk's entries, as `run` says.
    fn entries(
        &mut self,
        rx: std::sync::mpsc::Receiver<Result<Vec<Entry>>>,
        src: &Path,
        dir: u32,
        name: &[u8],
        recursive: bool,
        contents: bool,
    ) -> Result<()> {
        let mut first = true;
        for batch in rx {
            for mut e in batch? {
                if std::mem::take(&mut first) {
                    self.stack.push(Target {
                        ino: dir,
                        made: false,
                    });
                    if contents {
                        if !e.st.is_dir() {
                            bail!("{}: not a directory", src.display());
                        }
                        continue;
                    }
                    e.name = name.to_vec();
                }
                let path = e.path.clone();
                let r = self.entry(e, recursive);
                // The source itself is named by the caller.
                match path != src {
                    true => r.with_context(|| path.display().to_string())?,
                    false => r?,
                }
            }
        }
        Ok(())
    }

    fn entry(&mut self, e: Entry, recursive: bool) -> Result<()> {
        let fs = self.fs;
        let parent = self.stack.last().map_or(fs.root_ino(), |t| t.ino);
        let fresh = self.stack.last().is_some_and(|t| t.made);
        let st = e.st;
        let key = (st.dev, st.ino);
        if self.writer.is_some() && !fresh && !matches!(e.kind, Kind::Dir | Kind::EndDir(_)) {
            // A name there is replaced: its data may still be on its way into blocks that
            // the removal frees.
            if fs.lookup(parent, &e.name).is_ok() {
                self.drain()?;
            }
        }
        if !matches!(e.kind, Kind::EndDir(_)) {
            if let Some(&earlier) = self.links.earlier(&key, st.nlink, st.is_dir()) {
                if !fresh {
                    make_room(fs, parent, &e.name)?;
                }
                fs.link(earlier, parent, &e.name)?;
                return Ok(());
            }
        }
        let owner = (st.uid, st.gid);
        let (ino, xattrs) = match e.kind {
            Kind::Dir => {
                if !recursive {
                    bail!("{}: is a directory (use -r)", e.path.display());
                }
                let existing = match fresh {
                    true => None,
                    false => fs.lookup(parent, &e.name).ok().filter(|a| a.is_dir()),
                };
                let t = match existing {
                    Some(a) => Target {
                        ino: a.ino,
                        made: false,
                    },
                    None if fresh => Target {
                        ino: fs
                            .mknod_unique(parent, &e.name, st.mode, 0, owner.0, owner.1)?
                            .ino,
                        made: true,
                    },
                    None => Target {
                        ino: fs.mkdir(parent, &e.name, st.mode, owner.0, owner.1)?.ino,
                        made: true,
                    },
                };
                self.stack.push(t);
                return Ok(());
            }
            Kind::EndDir(xattrs) => {
                let t = self.stack.pop().expect("a directory begun");
                // The first directory of `contents` copies its attributes and owner onto the
                // directory copied into.
                let owner = self.stack.is_empty();
                return self.attributes(&e.path, &st, t.ino, xattrs, owner);
            }
            Kind::Symlink(target, xattrs) => {
                let what = NewEntry::Symlink(&target);
                (self.make(parent, fresh, &e.name, what, &st)?, xattrs)
            }
            Kind::File(data, xattrs) => {
                let ino = self.make(parent, fresh, &e.name, NewEntry::File, &st)?;
                self.data(&e.path, ino, data, st.size)?;
                (ino, xattrs)
            }
            Kind::Special(xattrs) => {
                let what = NewEntry::Special(st.rdev as u32);
                (self.make(parent, fresh, &e.name, what, &st)?, xattrs)
            }
        };
        self.links.note(key, st.nlink, false, ino);
        self.attributes(&e.path, &st, ino, xattrs, false)
    }

    /// Makes a non-directory; in a directory this copy made, no earlier entry can be in the
    /// way.
    fn make(
        &mut self,
        dir: u32,
        fresh: bool,
        name: &[u8],
        what: NewEntry,
        st: &Stat,
    ) -> Result<u32> {
        let owner = (st.uid, st.gid);
        let fs = self.fs;
        if !fresh {
            return make_entry(fs, dir, name, what, st.mode, owner);
        }
        // The names of a directory this copy made come from one listing: each is new there.
        Ok(match what {
            NewEntry::Symlink(t) => fs.symlink_unique(dir, name, t, owner.0, owner.1)?.ino,
            NewEntry::File => {
                fs.mknod_unique(dir, name, st.mode, 0, owner.0, owner.1)?
                    .ino
            }
            NewEntry::Special(rdev) => {
                fs.mknod_unique(dir, name, st.mode, rdev, owner.0, owner.1)?
                    .ino
            }
        })
    }

    /// Waits until the data handed to the writer is written (none without one).
    fn drain(&self) -> Result<()> {
        self.writer.as_ref().map_or(Ok(()), DataWriter::drain)
    }

    /// A new file's data: a file without holes has its blocks placed here and filled by the
    /// data writer; a sparse one (or one whose placing failed) is written here, piece by
    /// piece, once what is queued is written.
    fn data(&mut self, path: &Path, ino: u32, data: Data, size: u64) -> Result<()> {
        let fs = self.fs;
        let Data(f, segs) = data;
        if let Some(w) = self
            .writer
            .as_ref()
            .filter(|_| size > 0 && segs == [(0, size)])
        {
            if let Ok(placed) = fs.place_new_data(ino, size) {
                self.progress.add(size);
                return w.fill(path.to_path_buf(), f, placed);
            }
        }
        self.drain()?;
        copy_segments(
            &segs,
            &self.progress,
            |off, buf| {
                f.read_exact_at(buf, off)?;
                Ok(buf.len())
            },
            |off, data| Ok(fs.write_all(ino, off, data)?),
        )?;
        // A hole at the end: the size is not reached by any write.
        if segs.last().map_or(0, |&(o, l)| o + l) < size {
            fs.truncate(ino, size)?;
        }
        Ok(())
    }

    /// Extended attributes, mode and times of a host entry onto `ino` (and its owner with
    /// `owner`: made inodes get it at creation).
    fn attributes(
        &mut self,
        path: &Path,
        st: &Stat,
        ino: u32,
        xattrs: std::io::Result<Xattrs>,
        owner: bool,
    ) -> Result<()> {
        let xattrs = xattrs.unwrap_or_else(|e| {
            warn_xattr(path, b"(list)", e);
            Vec::new()
        });
        let meta = CopiedMeta {
            mode: st.mode,
            owner: owner.then_some((st.uid, st.gid)),
            atime: ts(st.atime.0, st.atime.1),
            mtime: ts(st.mtime.0, st.mtime.1),
            crtime: None,
        };
        set_image_metadata(self.fs, ino, path, xattrs, &meta)?;
        if self.batch.commits_next() {
            self.drain()?;
        }
        self.batch.made_one(self.fs)
    }
}

/// Copies the contents of the host directory `src` into the image directory `dir` (and
/// `src`'s own attributes onto `dir`), as `cp -a SRC/. DEST`.
pub(crate) fn copy_host_contents(fs: &Fs, src: &Path, dir: u32, fresh: bool) -> Result<()> {
    HostToImage::new(fs, src, fresh).run(src, dir, b"", true, true)
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
    let fs = open_for_copy(img)?;
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
            copy_host_contents(&fs, s, dir, false)
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
        HostToImage::new(&fs, s, false).run(s, dir, &n, recursive, false)
    })();
    finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")))
}
