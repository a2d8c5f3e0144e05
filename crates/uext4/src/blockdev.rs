//! Block devices: the small table of functions everything else reads and writes through.
//!
//! Backends: [`FileDevice`] (an image file or block device, pread/pwrite), [`MemDevice`]
//! (tests), and the recording device of the crash checker (in `crate::recording`).

use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A byte-addressed device. Implementations must be safe to call from many threads at once.
pub trait BlockDevice: Send + Sync {
    /// Reads exactly `buf.len()` bytes at byte offset `off`.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at byte offset `off`.
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Whether writes are refused.
    fn read_only(&self) -> bool {
        false
    }
}

/// Counters of device traffic, shown by `uext4 stats`.
#[derive(Default, Debug)]
pub struct IoCounters {
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
}

/// An image file or a block device, read and written with pread/pwrite.
pub struct FileDevice {
    file: File,
    size: u64,
    read_only: bool,
}

impl FileDevice {
    pub fn open(path: &Path, read_only: bool) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let meta = file.metadata()?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block devices report a length of 0 in metadata: seek to the end instead.
            use std::io::Seek;
            let mut f = &file;
            f.seek(io::SeekFrom::End(0))?
        };
        Ok(FileDevice { file, size, read_only })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.file.write_all_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
}

/// A device held in memory: for tests and for building images.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(size: u64) -> Self {
        MemDevice { data: RwLock::new(vec![0; size as usize]) }
    }
    pub fn from_vec(v: Vec<u8>) -> Self {
        MemDevice { data: RwLock::new(v) }
    }
    pub fn to_vec(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

fn range_check(off: u64, len: usize, size: usize) -> io::Result<std::ops::Range<usize>> {
    let end = off.checked_add(len as u64).filter(|&e| e <= size as u64);
    match end {
        Some(e) => Ok(off as usize..e as usize),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("access at byte {off} (+{len}) is past the end of the device ({size} bytes)"),
        )),
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read();
        let r = range_check(off, buf.len(), d.len())?;
        buf.copy_from_slice(&d[r]);
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut d = self.data.write();
        let r = range_check(off, buf.len(), d.len())?;
        d[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }
}

/// Wraps a device and counts its traffic.
pub struct CountingDevice<D: BlockDevice + ?Sized> {
    pub counters: IoCounters,
    pub inner: Box<D>,
}

impl<D: BlockDevice + ?Sized> CountingDevice<D> {
    pub fn new(inner: Box<D>) -> Self {
        CountingDevice { counters: IoCounters::default(), inner }
    }
}

impl<D: BlockDevice + ?Sized> BlockDevice for CountingDevice<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
}

/// One thing a [`RecordingDevice`] saw.
#[derive(Clone, Debug)]
pub enum Record {
    Write { off: u64, data: Vec<u8> },
    Flush,
}

/// A memory device that logs every write and flush, for the crash-consistency checker: any
/// prefix of the log, with any subset of the writes after the last flush in it dropped, is a
/// state the device could be in after a power cut.
pub struct RecordingDevice {
    base: Vec<u8>,
    current: MemDevice,
    log: parking_lot::Mutex<Vec<Record>>,
}

impl RecordingDevice {
    pub fn new(image: Vec<u8>) -> Self {
        RecordingDevice { current: MemDevice::from_vec(image.clone()), base: image, log: parking_lot::Mutex::new(Vec::new()) }
    }
    /// The log so far.
    pub fn log(&self) -> Vec<Record> {
        self.log.lock().clone()
    }
    pub fn log_len(&self) -> usize {
        self.log.lock().len()
    }
    /// The device image before any logged write.
    pub fn base(&self) -> &[u8] {
        &self.base
    }
    /// Rebuilds the device as a power cut would leave it: every write before `upto` (an index
    /// into the log) that precedes the last flush before `upto` is applied; of the writes after
    /// that flush, those for which `keep(i)` is true are applied.
    pub fn crash_image(&self, upto: usize, keep: &mut dyn FnMut(usize) -> bool) -> Vec<u8> {
        let log = self.log.lock();
        let upto = upto.min(log.len());
        let last_flush = log[..upto].iter().rposition(|r| matches!(r, Record::Flush));
        let mut img = self.base.clone();
        for (i, r) in log[..upto].iter().enumerate() {
            if let Record::Write { off, data } = r {
                let durable = last_flush.is_some_and(|f| i < f);
                if durable || keep(i) {
                    img[*off as usize..*off as usize + data.len()].copy_from_slice(data);
                }
            }
        }
        img
    }
    /// Indices of the flushes in the log.
    pub fn flush_points(&self) -> Vec<usize> {
        self.log.lock().iter().enumerate().filter(|(_, r)| matches!(r, Record::Flush)).map(|(i, _)| i + 1).collect()
    }
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.current.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        // Log and apply under one lock so the log order is the device's order.
        let mut log = self.log.lock();
        self.current.write_at(off, buf)?;
        log.push(Record::Write { off, data: buf.to_vec() });
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.log.lock().push(Record::Flush);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.current.size()
    }
}
