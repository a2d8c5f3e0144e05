//! Opening a device by what an image argument names: a local image file or block device (read
//! through pread/pwrite, or mapped), or an NBD export written as a URI (`nbd://host[:port]/
//! export`, `nbd+unix:///export?socket=PATH`). Above the device backends (blockdev.rs,
//! nbd.rs), which know nothing of names; a partition or offset inside what is opened is a
//! `blockdev::RegionDevice` over it (partition.rs finds one by number).
//!
//! ```no_run
//! let dev = uext4::image::open_image("disk.img".as_ref(), true)?;
//! let fs = uext4::Fs::open_dev(dev, uext4::MountOptions::ro())?;
//! # Ok::<(), uext4::Error>(())
//! ```

#[cfg(feature = "mapped")]
use crate::blockdev::MappedDevice;
use crate::blockdev::{is_tmpfs, BlockDevice, FileDevice};
#[cfg(not(all(feature = "nbd", feature = "mapped")))]
use crate::error::Error;
use crate::error::Result;
#[cfg(feature = "nbd")]
use crate::nbd::NbdDevice;
use std::path::Path;
use std::sync::Arc;

pub use crate::error::Holder;
pub use crate::holder::{claim_for_writing, WriterClaim};

/// Opens what an image argument names: an NBD export for an NBD URI
/// ([`NbdDevice`]), else the image file or block device at `path` ([`FileDevice`]). Claims nothing
/// (see
/// [`crate::Fs::open_path`] for the writer claim).
pub fn open_image(path: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>> {
    #[cfg(feature = "nbd")]
    if let Some(uri) = path.to_str().filter(|s| names_nbd(s)) {
        return Ok(Arc::new(NbdDevice::open(uri, read_only)?));
    }
    #[cfg(not(feature = "nbd"))]
    if is_nbd_uri(path) {
        return Err(Error::Unsupported(format!(
            "{}: an NBD export, and this uext4 was built without the `nbd` feature",
            path.display()
        )));
    }
    Ok(Arc::new(FileDevice::open(path, read_only)?))
}

/// Whether `path` is written as an NBD URI rather than a local file (see [`open_image`]).
/// Known with or without the `nbd` feature, so that a build without it can say why it
/// refuses one.
pub fn is_nbd_uri(path: &Path) -> bool {
    path.to_str().is_some_and(names_nbd)
}

/// Whether `s` is written as an NBD URI (any of the NBD schemes, supported or not): it is then
/// opened as one, never as a file.
fn names_nbd(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let scheme = scheme.to_ascii_lowercase();
    scheme == "nbd" || scheme.starts_with("nbd+") || scheme == "nbds" || scheme.starts_with("nbds+")
}

#[cfg(test)]
#[test]
fn nbd_uris_are_told_from_file_names() {
    for s in [
        "nbd://h/x",
        "nbd+unix:///x?socket=/s",
        "nbds://h",
        "NBD://h",
    ] {
        assert!(is_nbd_uri(Path::new(s)), "{s}");
    }
    for s in ["disk.img", "/tmp/nbd", "http://h/x", "nbd:/x"] {
        assert!(!is_nbd_uri(Path::new(s)), "{s}");
    }
}

/// Whether `path` is a file on tmpfs (where mapping the image is the faster way to reach it).
pub fn on_tmpfs(path: &Path) -> bool {
    std::fs::File::open(path).is_ok_and(|f| f.metadata().is_ok_and(|m| m.is_file()) && is_tmpfs(&f))
}

/// How a filesystem wants its local image opened.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// Open read-only.
    pub read_only: bool,
    /// Map the image (`MountOptions::dax`; read-write only).
    pub dax: bool,
    /// With a mapping, copy large writes with non-temporal stores.
    pub non_temporal: bool,
    /// Map an image that is a file on tmpfs (read-write only).
    pub map_tmpfs: bool,
}

/// Opens a local image file or block device for a filesystem: mapped with `dax`, or when it
/// is a file on tmpfs and `map_tmpfs`; else through pread/pwrite, read-only when it may not
/// be written (the open then reports read-only).
pub fn open_local(path: &Path, how: Access) -> Result<Arc<dyn BlockDevice>> {
    #[cfg(feature = "mapped")]
    {
        if how.dax && !how.read_only {
            return Ok(Arc::new(MappedDevice::open(path, how.non_temporal)?));
        }
        // An image on tmpfs is mapped unless that fails (not writable by us, empty): then it
        // is opened as any other file, which reports the problem or opens it read-only.
        if how.map_tmpfs && !how.read_only && on_tmpfs(path) {
            if let Ok(dev) = MappedDevice::open(path, how.non_temporal) {
                return Ok(Arc::new(dev));
            }
        }
    }
    #[cfg(not(feature = "mapped"))]
    if how.dax && !how.read_only {
        return Err(Error::Unsupported(format!(
            "{}: dax maps the image, and this uext4 was built without the `mapped` feature",
            path.display()
        )));
    }
    let dev = FileDevice::open(path, how.read_only).or_else(|e| {
        if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EROFS) {
            FileDevice::open(path, true)
        } else {
            Err(e)
        }
    })?;
    Ok(Arc::new(dev))
}
