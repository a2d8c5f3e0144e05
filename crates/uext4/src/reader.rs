//! A file's contents as `std::io::Read + Seek` (and `Write`, opened for writing), for
//! embedders that want a file handle rather than reads and writes at offsets (the Python
//! package's file objects; anything that takes a reader or a writer).
//!
//! ```no_run
//! use std::io::Read;
//! let fs = uext4::Fs::open_path("disk.img".as_ref(), uext4::MountOptions::ro())?;
//! let ino = fs.lookup_path(2, b"/etc/hostname", true)?;
//! let mut s = String::new();
//! fs.open_reader(ino)?.read_to_string(&mut s)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::{Error, Result};
use crate::fs::Fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::Arc;

/// An open file, read (and written, if opened for writing) at a position that reads, writes
/// and seeks move. Holds the inode open (as an open file descriptor does: unlinked meanwhile,
/// it is freed only when the handle is dropped).
pub struct FileHandle {
    fs: Arc<Fs>,
    ino: u32,
    pos: u64,
    writable: bool,
}

/// A [`FileHandle`] opened for reading ([`Fs::open_reader`]).
pub type FileReader = FileHandle;

impl Fs {
    /// Opens inode `ino` for reading. A directory is refused ([`Error::IsDir`]); an encrypted
    /// file needs its key, as for [`Fs::open`].
    pub fn open_reader(self: &Arc<Self>, ino: u32) -> Result<FileReader> {
        self.open_handle(ino, false)
    }

    /// Opens inode `ino` for reading and writing, at position 0 (as `O_RDWR`, with root's
    /// rights: an immutable or append-only file, or one with verity, refuses its writes as
    /// [`Fs::write`] refuses them). A directory is refused ([`Error::IsDir`]), and so is a
    /// read-only filesystem ([`Error::ReadOnly`]).
    pub fn open_writer(self: &Arc<Self>, ino: u32) -> Result<FileHandle> {
        if self.is_read_only() {
            return Err(Error::ReadOnly(String::new()));
        }
        self.open_handle(ino, true)
    }

    fn open_handle(self: &Arc<Self>, ino: u32, writable: bool) -> Result<FileHandle> {
        if self.getattr(ino)?.is_dir() {
            return Err(Error::IsDir);
        }
        self.open(ino)?;
        Ok(FileHandle {
            fs: self.clone(),
            ino,
            pos: 0,
            writable,
        })
    }
}

impl FileHandle {
    /// The inode read.
    pub fn ino(&self) -> u32 {
        self.ino
    }

    /// The file's size now.
    pub fn len(&self) -> Result<u64> {
        Ok(self.fs.getattr(self.ino)?.size)
    }

    /// Whether the file is empty now.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The position the next read or write starts at.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Makes what was written durable, as fsync(2) ([`Fs::fsync`]).
    pub fn sync_all(&self) -> Result<()> {
        self.fs.fsync(self.ino, false)
    }

    /// Cuts or extends the file to `size` bytes, as `File::set_len` (opened for writing).
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.check_writable()?;
        self.fs.truncate(self.ino, size)
    }

    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::Invalid(
                "the file was opened for reading only".into(),
            ))
        }
    }
}

/// The engine's error as an `io::Error` carrying its errno and its message.
fn io_error(e: Error) -> io::Error {
    io::Error::new(
        io::Error::from_raw_os_error(e.errno()).kind(),
        e.to_string(),
    )
}

impl Read for FileHandle {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.fs.read(self.ino, self.pos, buf).map_err(io_error)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Writes at the position, then moves it; the bytes are in the filesystem at once (the
/// engine has no per-handle buffer), durable after [`FileHandle::sync_all`].
impl Write for FileHandle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check_writable().map_err(io_error)?;
        let n = self.fs.write(self.ino, self.pos, buf).map_err(io_error)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for FileHandle {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let (base, delta) = match to {
            SeekFrom::Start(p) => {
                self.pos = p;
                return Ok(p);
            }
            SeekFrom::Current(d) => (self.pos, d),
            SeekFrom::End(d) => (self.len().map_err(io_error)?, d),
        };
        match base.checked_add_signed(delta) {
            Some(p) => {
                self.pos = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek to a negative position",
            )),
        }
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        let _ = self.fs.release(self.ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads and seeks move one position; the end is where the file ends; a directory is
    /// refused.
    #[test]
    fn reads_and_seeks() {
        let dev = crate::blockdev::MemDevice::new(16 << 20);
        let mut o = crate::mkfs::MkfsOptions::default_for(0);
        o.block_size = 1024;
        crate::mkfs::mkfs(&dev, &o).unwrap();
        let fs = Fs::open_dev(Arc::new(dev), Default::default()).unwrap();
        let ino = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        fs.write_all(ino, 0, &data).unwrap();
        let mut r = fs.open_reader(ino).unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        assert_eq!(all, data);
        assert_eq!(r.seek(SeekFrom::End(-10)).unwrap(), 4990);
        let mut tail = [0u8; 20];
        assert_eq!(r.read(&mut tail).unwrap(), 10);
        assert_eq!(tail[..10], data[4990..]);
        assert_eq!(r.seek(SeekFrom::Current(-5000)).unwrap(), 0);
        assert!(r.seek(SeekFrom::Current(-1)).is_err());
        assert_eq!(r.len().unwrap(), 5000);
        assert!(matches!(fs.open_reader(2), Err(Error::IsDir)));
        // Not opened for writing: writes refused, nothing changed.
        assert!(r.write(b"x").is_err());
        drop(r);
        // A writer writes at its position and seeks as the reader does.
        let mut w = fs.open_writer(ino).unwrap();
        w.seek(SeekFrom::Start(4998)).unwrap();
        w.write_all(b"abcd").unwrap();
        assert_eq!(w.position(), 5002);
        w.set_len(5001).unwrap();
        w.sync_all().unwrap();
        let mut back = Vec::new();
        w.seek(SeekFrom::Start(0)).unwrap();
        w.read_to_end(&mut back).unwrap();
        assert_eq!(back[..4998], data[..4998]);
        assert_eq!(&back[4998..], b"abc");
        drop(w);
        fs.unmount().unwrap();
    }
}
