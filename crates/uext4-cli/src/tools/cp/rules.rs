//! The rules every copy direction follows, each in one place: which entries are hard links
//! to an earlier copy, how file data moves (holes stay holes), how an entry is made in an
//! image, and which metadata a copy in an image gets.

use super::{warn_xattr, Progress};
use crate::image::make_room;
use anyhow::Result;
use std::collections::HashMap;
use std::hash::Hash;
use std::path::Path;
use uext4::Timestamp;
use uext4::XattrFlags;
use uext4::{Error, Fs};
use uext4::{SetAttr, TimeSet};

/// Hard links: the first copy of a non-directory with several links, by its identity in the
/// source (`K`); later names of it become links to that copy (`V`).
pub(super) struct Links<K, V>(HashMap<K, V>);

impl<K: Hash + Eq, V> Links<K, V> {
    pub(super) fn new() -> Self {
        Links(HashMap::new())
    }
    /// The earlier copy of this source entry, if it has one.
    pub(super) fn earlier(&self, key: &K, nlink: u64, is_dir: bool) -> Option<&V> {
        if nlink > 1 && !is_dir {
            self.0.get(key)
        } else {
            None
        }
    }
    /// Remembers a copy that later names of the same source entry link to.
    pub(super) fn note(&mut self, key: K, nlink: u64, is_dir: bool, copy: V) {
        if nlink > 1 && !is_dir {
            self.0.insert(key, copy);
        }
    }
}

/// The data segments (offset, length) of an image file of `size` bytes: holes are skipped.
pub(super) fn image_segments(fs: &Fs, ino: u32, size: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let d = match fs.lseek_data_hole(ino, pos, true) {
            Ok(d) => d,
            Err(Error::Nxio) => break,
            Err(e) => return Err(e.into()),
        };
        let h = fs.lseek_data_hole(ino, d, false)?;
        out.push((d, h - d));
        pos = h;
    }
    Ok(out)
}

/// Moves the data segments of a file in 1 MiB pieces: `read(offset, buf)` gives how many bytes
/// it read (0 ends the segment early), `write(offset, bytes)` puts them at the same offset.
pub(super) fn copy_segments(
    segments: &[(u64, u64)],
    progress: &Progress,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<usize>,
    mut write: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    // As large as the largest segment, up to 1 MiB: most files are small, and zeroing a
    // megabyte for each of them costs more than copying them.
    let largest = segments.iter().map(|s| s.1).max().unwrap_or(0);
    let mut buf = vec![0u8; largest.min(1 << 20) as usize];
    for &(start, len) in segments {
        let mut off = start;
        while off < start + len {
            let n = ((start + len - off) as usize).min(buf.len());
            let got = read(off, &mut buf[..n])?;
            if got == 0 {
                break;
            }
            write(off, &buf[..got])?;
            progress.add(got as u64);
            off += got as u64;
        }
    }
    Ok(())
}

/// What a new entry in an image is.
pub(crate) enum NewEntry<'a> {
    Symlink(&'a [u8]),
    File,
    /// A device, FIFO or socket, with its device number.
    Special(u32),
}

/// Makes `name` in the image directory `dir` (replacing a non-directory there, as cp does),
/// owned by `uid`:`gid`; its inode number.
pub(crate) fn make_entry(
    fs: &Fs,
    dir: u32,
    name: &[u8],
    what: NewEntry,
    mode: u32,
    (uid, gid): (u32, u32),
) -> Result<u32> {
    make_room(fs, dir, name)?;
    Ok(match what {
        NewEntry::Symlink(target) => fs.symlink(dir, name, target, uid, gid)?.ino,
        NewEntry::File => fs.create(dir, name, mode, uid, gid)?.ino,
        NewEntry::Special(rdev) => fs.mknod(dir, name, mode, rdev, uid, gid)?.ino,
    })
}

/// The metadata a copy in an image takes from its source, after its data.
pub(super) struct CopiedMeta {
    pub(super) mode: u32,
    /// Set where the entry was not made with its owner (the root of `cp -r DIR/.`).
    pub(super) owner: Option<(u32, u32)>,
    pub(super) atime: Timestamp,
    pub(super) mtime: Timestamp,
    /// Where the source has one to give (another image).
    pub(super) crtime: Option<Timestamp>,
}

/// Gives the image inode `ino` its source's extended attributes (symlinks too: they carry
/// trusted. and security. ones; one that cannot be set is a warning naming `what`), then its
/// mode (not a symlink's), owner and times.
pub(super) fn set_image_metadata(
    fs: &Fs,
    ino: u32,
    what: &Path,
    xattrs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    m: &CopiedMeta,
) -> Result<()> {
    for (name, value) in xattrs {
        if let Err(e) = fs.setxattr(ino, &name, &value, XattrFlags::Any) {
            warn_xattr(what, &name, e);
        }
    }
    let symlink = m.mode & 0o170000 == 0o120000;
    let set = SetAttr {
        mode: (!symlink).then_some(m.mode),
        uid: m.owner.map(|o| o.0),
        gid: m.owner.map(|o| o.1),
        atime: Some(TimeSet::At(m.atime)),
        mtime: Some(TimeSet::At(m.mtime)),
        crtime: m.crtime,
        ..Default::default()
    };
    fs.setattr(ino, &set)?;
    Ok(())
}
