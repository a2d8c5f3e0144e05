//! An image as a user names it: a file or block device, an NBD URI, and where in it the
//! filesystem lies: `disk.img` (the whole file), `disk.img@2` (partition 2 of a whole-disk
//! image, GPT or MBR, numbered as fdisk and lsblk number them), `disk.img@offset=1M[,size=64M]`
//! (a filesystem at a byte offset, as in a container file), `nbd://host/export@1`. The uext4
//! command reads its IMAGE arguments with this; embedders can take the same names.
//!
//! ```no_run
//! let name = uext4::ImageName::parse("disk.img@2")?;
//! let fs = name.open(uext4::MountOptions::ro())?;
//! # Ok::<(), uext4::Error>(())
//! ```

use crate::blockdev::{BlockDevice, Region, RegionDevice};
use crate::error::{Error, Result};
use crate::fs::{Fs, MountOptions};
use crate::image::{is_nbd_uri, open_image};
use crate::partition::Table;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which part of an image holds the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Within {
    /// The whole file (or device).
    Whole,
    /// `IMAGE@N`: partition N of a whole-disk image (GPT or MBR), numbered from 1 as fdisk and
    /// lsblk number them (logical MBR partitions from 5).
    Partition(u32),
    /// `IMAGE@offset=BYTES[,size=BYTES]`: a filesystem at a byte offset (a multiple of 512),
    /// as in a container file (Apptainer's SIF); to the end of the image without `size`.
    Offset {
        /// Where the filesystem starts, in bytes.
        offset: u64,
        /// Its length in bytes; `None` reaches to the end of the image.
        size: Option<u64>,
    },
}

/// An image and where in it the filesystem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageName {
    /// The image file, block device or NBD URI.
    pub path: PathBuf,
    /// Where the filesystem lies in it.
    pub within: Within,
}

impl ImageName {
    /// Reads `IMAGE`, `IMAGE@N`, `IMAGE@offset=BYTES[,size=BYTES]` or an NBD URI with an
    /// optional `@...` at its end. A file named by the whole text wins over the `@` forms (an
    /// image may be called `a@1`); a name that matches no file is taken whole (the open then
    /// says it is missing).
    ///
    /// # Errors
    /// [`Error::Invalid`] for what follows an `@` that is neither form.
    pub fn parse(s: &str) -> Result<ImageName> {
        let whole = |p: &str| ImageName {
            path: PathBuf::from(p),
            within: Within::Whole,
        };
        if is_nbd_uri(Path::new(s)) {
            // After the authority (host and port), an '@' is ours: one inside the export name
            // or the query is written %40.
            let auth = nbd_authority_end(s);
            return match s[auth..].rfind('@').map(|i| auth + i) {
                Some(at) => Ok(ImageName {
                    path: PathBuf::from(&s[..at]),
                    within: parse_within(&s[at + 1..]).map_err(|e| named(s, e))?,
                }),
                None => Ok(whole(s)),
            };
        }
        if is_image_file(Path::new(s)) {
            return Ok(whole(s));
        }
        if let Some((base, spec)) = s.rsplit_once('@') {
            if is_image_file(Path::new(base)) {
                return Ok(ImageName {
                    path: PathBuf::from(base),
                    within: parse_within(spec).map_err(|e| named(s, e))?,
                });
            }
        }
        Ok(whole(s))
    }

    /// The name as written: `disk.img`, `disk.img@2`, `disk.img@offset=1048576`.
    pub fn name(&self) -> String {
        let p = self.path.display();
        match self.within {
            Within::Whole => p.to_string(),
            Within::Partition(n) => format!("{p}@{n}"),
            Within::Offset { offset, size: None } => format!("{p}@offset={offset}"),
            Within::Offset {
                offset,
                size: Some(s),
            } => format!("{p}@offset={offset},size={s}"),
        }
    }

    /// Where the filesystem lies on `dev`, the image opened (`None`: all of it), and the
    /// window onto it. Reads the partition table for `@N`, and checks the region against the
    /// device.
    ///
    /// # Errors
    /// [`Error::PartitionTable`] for a missing table or partition (naming the partitions
    /// there are), [`Error::Invalid`] for a region outside the device; each names the image.
    pub fn region_in(
        &self,
        dev: &Arc<dyn BlockDevice>,
    ) -> Result<(Option<Region>, Arc<dyn BlockDevice>)> {
        let path = self.path.display();
        let region = match self.within {
            Within::Whole => return Ok((None, dev.clone())),
            Within::Offset { offset, size } => Region { offset, len: size },
            Within::Partition(n) => match Table::read(&**dev) {
                Ok(Some(t)) => t.region_of(n).map_err(|e| named(&path.to_string(), e))?,
                Ok(None) => {
                    return Err(Error::PartitionTable(format!(
                        "{path}: no partition table (neither GPT nor MBR), so no partition \
                         {n}; for a filesystem at an offset write {path}@offset=BYTES"
                    )))
                }
                Err(e) => return Err(named(&path.to_string(), e)),
            },
        };
        let w = RegionDevice::new(dev.clone(), region).map_err(|e| named(&self.name(), e))?;
        Ok((Some(w.region()), Arc::new(w)))
    }

    /// Opens the filesystem it names with `opts` (whose `region` it sets).
    ///
    /// # Errors
    /// As [`ImageName::region_in`] and [`Fs::open_path`].
    pub fn open(&self, opts: MountOptions) -> Result<Arc<Fs>> {
        let mut opts = opts;
        if self.within != Within::Whole {
            let dev = open_image(&self.path, true)?;
            opts.region = self.region_in(&dev)?.0;
        }
        Fs::open_path(&self.path, opts)
    }
}

/// Where an NBD URI's authority (host and port) ends: after it, a ':' or an '@' belongs to
/// the name around the URI (`nbd://h/exp@2`, and the uext4 command's `nbd://h/exp:/etc`).
pub fn nbd_authority_end(uri: &str) -> usize {
    let start = uri.find("://").map_or(0, |i| i + 3);
    start + uri[start..].find(['/', '?']).unwrap_or(uri.len() - start)
}

/// `e` with `what` in front of its message, keeping its kind.
fn named(what: &str, e: Error) -> Error {
    match e {
        Error::Invalid(m) => Error::Invalid(format!("{what}: {m}")),
        Error::PartitionTable(m) => Error::PartitionTable(format!("{what}: {m}")),
        e => Error::Invalid(format!("{what}: {e}")),
    }
}

/// What follows the `@` of `IMAGE@...`: a partition number, or `offset=BYTES[,size=BYTES]`.
///
/// # Errors
/// [`Error::Invalid`] naming what is wrong.
pub fn parse_within(spec: &str) -> Result<Within> {
    let bad = |m: String| Err(Error::Invalid(m));
    if let Ok(n) = spec.parse::<u32>() {
        if n == 0 {
            return bad("partitions are numbered from 1 (as fdisk and lsblk number them)".into());
        }
        return Ok(Within::Partition(n));
    }
    if spec.starts_with("offset=") {
        let (mut offset, mut size) = (None, None);
        for part in spec.split(',') {
            match part.split_once('=') {
                Some(("offset", v)) => offset = Some(parse_size(v)?),
                Some(("size", v)) => size = Some(parse_size(v)?),
                _ => return bad(format!("{part:?}: expected offset=BYTES or size=BYTES")),
            }
        }
        if size == Some(0) {
            return bad("size=0: the region is empty".into());
        }
        return Ok(Within::Offset {
            offset: offset.unwrap_or(0),
            size,
        });
    }
    bad("after '@' give a partition number (IMAGE@2) or offset=BYTES[,size=BYTES]".into())
}

/// A size as people write one: 4096, 64K, 64M, 2G, 1T (powers of 1024).
///
/// # Errors
/// [`Error::Invalid`] for what is not a size, or too large for 64 bits.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| Error::Invalid(format!("{s:?} is not a size (like 4096, 64M, 2G)")))?;
    n.checked_mul(mult)
        .ok_or_else(|| Error::Invalid(format!("size {s:?} is too large")))
}

/// Whether `p` is an existing file or device (not a directory).
fn is_image_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| !m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_as_the_tools_read_them() {
        let dir = std::env::temp_dir().join(format!("uext4-imgname-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("d.img");
        std::fs::write(&img, b"").unwrap();
        let at = dir.join("odd@1");
        std::fs::write(&at, b"").unwrap();
        let p = |s: &Path| s.to_str().unwrap().to_string();
        let n = ImageName::parse(&format!("{}@2", p(&img))).unwrap();
        assert_eq!((n.path, n.within), (img.clone(), Within::Partition(2)));
        let n = ImageName::parse(&format!("{}@offset=1M,size=64M", p(&img))).unwrap();
        let want = Within::Offset {
            offset: 1 << 20,
            size: Some(64 << 20),
        };
        assert_eq!(n.within, want);
        assert_eq!(
            n.name(),
            format!("{}@offset=1048576,size=67108864", p(&img))
        );
        // A file named with the '@' wins; a missing name is taken whole.
        assert_eq!(ImageName::parse(&p(&at)).unwrap().within, Within::Whole);
        let missing = format!("{}/none@3", p(&dir));
        assert_eq!(
            ImageName::parse(&missing).unwrap().path,
            PathBuf::from(&missing)
        );
        let n = ImageName::parse("nbd://h:10809/exp%40x@5").unwrap();
        assert_eq!(n.path, PathBuf::from("nbd://h:10809/exp%40x"));
        assert_eq!(n.within, Within::Partition(5));
        for bad in ["@0", "@offset=x", "@size=1", "@offset=0,size=0", "@x"] {
            let e = ImageName::parse(&format!("{}{bad}", p(&img))).unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{bad}: {e}");
            assert!(e.to_string().contains(&p(&img)), "{bad}: {e}");
        }
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("99999999999T").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
