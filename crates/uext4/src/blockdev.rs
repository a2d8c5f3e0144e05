//! Block devices: the small table of functions everything else reads and writes through.
//!
//! Backends: [`FileDevice`] (an image file or block device, pread/pwrite), [`MappedDevice`]
//! (the image mapped into memory), [`MemDevice`] (tests, building images), [`OverlayDevice`]
//! (writes kept in memory over a device never written: read-only journal replay),
//! [`RegionDevice`] (a window onto part of another device: a partition of a whole-disk image,
//! or a filesystem kept at an offset inside a container file), [`RecordingDevice`] (the
//! crash checker's), [`NbdDevice`](crate::NbdDevice) (an export of an NBD server). Opening a
//! device by what a path or URI names is [`crate::image`]'s, above this module.
//!
//! A user can plug in a device of their own: implement [`BlockDevice`] and open it with
//! [`crate::Fs::open_dev`].

use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A byte-addressed device. Implementations must be safe to call from many threads at once.
pub trait BlockDevice: Send + Sync {
    /// Reads exactly `buf.len()` bytes at byte offset `off`.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at byte offset `off`.
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at `off`, into blocks just allocated (or unwritten): a hint for
    /// backends whose best copy depends on it (`MappedDevice`). The same as `write_at`
    /// otherwise.
    fn write_new_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.write_at(off, buf)
    }
    /// Copies `len` bytes of `src` from its byte `src_off` to `off`, into blocks just
    /// allocated (as `write_new_at`); fewer where `src` ends sooner. Returns how many bytes it
    /// copied. This default reads through a buffer; an image file has the kernel copy them.
    fn copy_new_from(&self, off: u64, src: &File, src_off: u64, len: u64) -> io::Result<u64> {
        copy::copy_through_buffer(self, off, src, src_off, len)
    }
    /// Reads as [`read_at`](Self::read_at), but the device as it lies, past any journal
    /// replayed in memory over it ([`OverlayDevice`]): what the examiner's tools show as "on
    /// disk".
    fn read_beneath_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_at(off, buf)
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Whether writes are refused.
    fn read_only(&self) -> bool {
        false
    }
    /// Whether reads and writes are memory copies into a mapping of the image.
    fn is_mapped(&self) -> bool {
        false
    }
    /// Whether [`zero_range`](Self::zero_range) costs no data writes here: true for an image
    /// file on tmpfs, where it punches a hole and allocates fresh pages (both read as zeros).
    /// Where it is, fallocate maps its new blocks as written over zeroed blocks instead of as
    /// unwritten extents, so no later write into them needs a conversion (DESIGN.md R4).
    fn zeroes_cheaply(&self) -> bool {
        false
    }
    /// Makes `off..off + len` read as zeros. Ordered as a write: durable at the next flush.
    /// This default writes zeros; backends where `zeroes_cheaply` is true do better.
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        write_zeros(self, off, len)
    }
    /// Reads as `read_at`, but from the device itself rather than any cache of it on this
    /// host: for the multi-mount protection block, which another node may have rewritten.
    fn read_fresh_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_at(off, buf)
    }
    /// Tells the device that `off..off + len` holds nothing the filesystem needs (free
    /// blocks, FITRIM): it may drop their storage (a hole in an image file, `NBD_CMD_TRIM`),
    /// after which the range reads as zeros or as before. Ordered as a write. Returns whether
    /// the device does this at all; the default does nothing and says so.
    fn discard(&self, off: u64, len: u64) -> io::Result<bool> {
        let _ = (off, len);
        Ok(false)
    }
    /// A short name of what is underneath (the image file's or device's name), for the
    /// multi-mount protection block's `mmp_bdevname`.
    fn name(&self) -> Option<String> {
        None
    }
}

/// The last component of the path that `file` was opened by.
fn file_name(file: &File) -> Option<String> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// Zeroes `off..off + len` of a file on tmpfs without writing data: punches a hole (the old
/// pages are dropped and read back as zeros), then allocates fresh pages for it, which also
/// read as zeros. The allocation is what the caller's fallocate asked for: the space is then
/// there for the writes to come, which store into the pages instead of first finding memory
/// for a hole (faster than the punch alone on fsync-randwrite-16k, BENCHMARKS.md).
///
/// Only where the filesystem under the image could still back every page of it: zeroing
/// takes that filesystem's space now, where unwritten extents take none until written, and
/// on a thin image (a sparse image larger than its tmpfs) preallocations filled the tmpfs,
/// so that the next writes, the journal's among them, failed and the filesystem stopped,
/// losing every change since its last commit. There, and where tmpfs cannot allocate the
/// pages after all, nothing is allocated (the range is left a hole, still zero) and the
/// error says so ([`is_backing_full`]): fallocate then makes unwritten extents, as the
/// kernel's ext4 on such an image does.
fn zero_file_range(file: &File, off: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    if !backs_whole_image(file) {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            BackingFull(format!(
                "no storage under the image for {len} bytes at offset {off}: its filesystem \
                 could not hold the whole image"
            )),
        ));
    }
    // SAFETY: fallocate on our own descriptor with plain integer arguments.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("zeroing {len} bytes at offset {off} of the image (punching a hole): {e}"),
        ));
    }
    // SAFETY: as above; mode 0 inside the file's size allocates and keeps the size.
    let r = unsafe { libc::fallocate(fd, 0, off as libc::off_t, len as libc::off_t) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            BackingFull(format!(
                "no storage under the image for {len} bytes at offset {off} (the range is \
                 left a hole): {e}"
            )),
        ));
    }
    Ok(())
}

/// Punches a hole in `off..off + len` of an image file (the storage of free blocks goes back
/// to the host). Ok(false) where the host's filesystem or device cannot punch holes.
fn punch_hole(file: &File, off: u64, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on our own descriptor with plain integer arguments.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(false),
        _ => Err(io::Error::new(
            e.kind(),
            format!("discarding {len} bytes at offset {off} of the image (punching a hole): {e}"),
        )),
    }
}

/// `zero_range`'s "no storage under the image" (see [`is_backing_full`]).
#[derive(Debug)]
struct BackingFull(String);

impl std::fmt::Display for BackingFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackingFull {}

/// Whether the filesystem holding `file` has room for every page of it that has no storage
/// yet (its size less its allocated blocks). False where that cannot be told.
fn backs_whole_image(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let unbacked = meta
        .size()
        .saturating_sub(meta.blocks().saturating_mul(512));
    // SAFETY: fstatvfs writes `st` (zeroed plain data) before it is read.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64) >= unbacked
}

/// Whether `e` is `zero_range`'s "no storage under the image": the filesystem holding the
/// image could not allocate the zeroed range (which is left a hole, reading as zeros).
pub fn is_backing_full(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<BackingFull>())
}

/// Counters of device traffic, shown by `uext4 stats`.
#[derive(Default, Debug)]
pub struct IoCounters {
    /// Bytes read from the device.
    pub bytes_read: AtomicU64,
    /// Bytes written to the device.
    pub bytes_written: AtomicU64,
    /// Read calls.
    pub reads: AtomicU64,
    /// Write calls.
    pub writes: AtomicU64,
    /// Flushes (write barriers).
    pub flushes: AtomicU64,
}

impl IoCounters {
    pub(crate) fn count_read(&self, len: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
    }
    pub(crate) fn count_write(&self, len: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
    }
}

/// An image file or a block device, read and written with pread/pwrite.
pub struct FileDevice {
    file: File,
    size: u64,
    read_only: bool,
    /// A writable image file on tmpfs: zeroing is a punched hole and fresh pages.
    tmpfs: bool,
}

impl FileDevice {
    /// Opens the image file or block device at `path`.
    ///
    /// # Errors
    /// What opening it reports.
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
        let tmpfs = !read_only && meta.file_type().is_file() && is_tmpfs(&file);
        Ok(FileDevice {
            file,
            size,
            read_only,
            tmpfs,
        })
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
    fn copy_new_from(&self, off: u64, src: &File, src_off: u64, len: u64) -> io::Result<u64> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        copy::kernel_copy(self, &self.file, off, src, src_off, len)
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
    fn zeroes_cheaply(&self) -> bool {
        self.tmpfs
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        if !self.tmpfs {
            return write_zeros(self, off, len);
        }
        zero_file_range(&self.file, off, len)
    }
    fn discard(&self, off: u64, len: u64) -> io::Result<bool> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        punch_hole(&self.file, off, len)
    }
    fn read_fresh_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // Drops this host's cached (clean) copy first, so that a block device shared with
        // other nodes is read from the device. An image file has one page cache for every
        // process on the host, which is what the others write into.
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is ours.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                off as libc::off_t,
                buf.len() as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
        self.file.read_exact_at(buf, off)
    }
    fn name(&self) -> Option<String> {
        file_name(&self.file)
    }
}

/// The trait's default `zero_range`, for implementations that use it only sometimes.
fn write_zeros<D: BlockDevice + ?Sized>(dev: &D, off: u64, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut at = off;
    while at < off + len {
        let n = (off + len - at).min(zeros.len() as u64) as usize;
        dev.write_at(at, &zeros[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// A device held in memory: for tests and for building images.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    /// A zeroed device of `size` bytes.
    pub fn new(size: u64) -> Self {
        MemDevice {
            data: RwLock::new(vec![0; size as usize]),
        }
    }
    /// A device holding the bytes `v` (an image read into memory).
    pub fn from_vec(v: Vec<u8>) -> Self {
        MemDevice {
            data: RwLock::new(v),
        }
    }
    /// A copy of the device's bytes.
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

/// A device whose writes stay in memory, laid over a device that is never written: the
/// journal of an image opened read-only is replayed into it, so the reader sees the recovered
/// filesystem while the image stays byte for byte as it was (the kernel's ext4 replays into
/// the device even for a read-only mount; debugfs and sleuthkit never write, and forensic
/// copies must not change). Whole 4 KiB pages are kept: a write reads the rest of its pages
/// from below first.
pub struct OverlayDevice {
    below: std::sync::Arc<dyn BlockDevice>,
    /// Page number -> the page's bytes (shorter at the end of a device whose size is not a
    /// whole number of pages).
    pages: RwLock<std::collections::HashMap<u64, Box<[u8]>>>,
}

const OVERLAY_PAGE: u64 = 4096;

impl OverlayDevice {
    /// An overlay over `below`, which it never writes.
    pub fn new(below: std::sync::Arc<dyn BlockDevice>) -> Self {
        OverlayDevice {
            below,
            pages: RwLock::new(std::collections::HashMap::new()),
        }
    }

    /// How many bytes are held in memory over the device.
    pub fn overlaid_bytes(&self) -> u64 {
        self.pages.read().values().map(|p| p.len() as u64).sum()
    }

    fn check_range(&self, off: u64, len: usize) -> io::Result<()> {
        range_check(off, len, usize::try_from(self.size()).unwrap_or(usize::MAX)).map(|_| ())
    }

    /// The pages held in memory, as (byte offset, bytes), in offset order: what writing the
    /// overlay back to the device below would write.
    pub fn overlaid_pages(&self) -> Vec<(u64, Box<[u8]>)> {
        let pages = self.pages.read();
        let mut v: Vec<_> = pages
            .iter()
            .map(|(&p, b)| (p * OVERLAY_PAGE, b.clone()))
            .collect();
        v.sort_unstable_by_key(|p| p.0);
        v
    }
}

impl BlockDevice for OverlayDevice {
    fn read_beneath_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.below.read_beneath_at(off, buf)
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(off, buf.len())?;
        self.below.read_at(off, buf)?;
        let pages = self.pages.read();
        if pages.is_empty() || buf.is_empty() {
            return Ok(());
        }
        let end = off + buf.len() as u64;
        for pno in off / OVERLAY_PAGE..end.div_ceil(OVERLAY_PAGE) {
            let Some(page) = pages.get(&pno) else {
                continue;
            };
            let pstart = pno * OVERLAY_PAGE;
            let from = off.max(pstart);
            let to = end.min(pstart + page.len() as u64);
            if from < to {
                buf[(from - off) as usize..(to - off) as usize]
                    .copy_from_slice(&page[(from - pstart) as usize..(to - pstart) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.check_range(off, buf.len())?;
        let size = self.size();
        let end = off + buf.len() as u64;
        let mut pages = self.pages.write();
        for pno in off / OVERLAY_PAGE..end.div_ceil(OVERLAY_PAGE) {
            let pstart = pno * OVERLAY_PAGE;
            let page = match pages.entry(pno) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let len = (size - pstart).min(OVERLAY_PAGE) as usize;
                    let mut page = vec![0u8; len].into_boxed_slice();
                    self.below.read_at(pstart, &mut page)?;
                    e.insert(page)
                }
            };
            let from = off.max(pstart);
            let to = end.min(pstart + page.len() as u64);
            page[(from - pstart) as usize..(to - pstart) as usize]
                .copy_from_slice(&buf[(from - off) as usize..(to - off) as usize]);
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.below.size()
    }
}

/// One thing a [`RecordingDevice`] saw.
#[derive(Clone, Debug)]
pub enum Record {
    /// A write of `data` at byte `off`.
    Write {
        /// The byte offset.
        off: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// A flush.
    Flush,
}

/// A memory device that logs every write and flush, for the crash-consistency checker: any
/// prefix of the log, with any subset of the writes after the last flush in it dropped, is a
/// state the device could be in after a power cut.
pub struct RecordingDevice {
    base: Vec<u8>,
    current: MemDevice,
    log: parking_lot::Mutex<Vec<Record>>,
    /// Answer `zeroes_cheaply` with true, as an image on tmpfs does, so the checker covers
    /// fallocate's zeroed blocks too; the zeros are logged as a write.
    cheap_zeroing: bool,
}

impl RecordingDevice {
    /// A recording device over the image `image`.
    pub fn new(image: Vec<u8>) -> Self {
        RecordingDevice {
            current: MemDevice::from_vec(image.clone()),
            base: image,
            log: parking_lot::Mutex::new(Vec::new()),
            cheap_zeroing: false,
        }
    }
    /// A recording device that claims cheap zeroing (see the field).
    pub fn with_cheap_zeroing(image: Vec<u8>) -> Self {
        RecordingDevice {
            cheap_zeroing: true,
            ..Self::new(image)
        }
    }
    /// The log so far.
    pub fn log(&self) -> Vec<Record> {
        self.log.lock().clone()
    }
    /// How many records it holds.
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
        self.log
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Record::Flush))
            .map(|(i, _)| i + 1)
            .collect()
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
        log.push(Record::Write {
            off,
            data: buf.to_vec(),
        });
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.log.lock().push(Record::Flush);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.current.size()
    }
    fn zeroes_cheaply(&self) -> bool {
        self.cheap_zeroing
    }
}

/// Whether `file` lives on tmpfs.
pub fn is_tmpfs(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: fstatfs writes `st` (zeroed plain data) before it is read.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    r == 0 && st.f_type as i64 == TMPFS_MAGIC
}

/// Where a filesystem lies inside a bigger device: a partition of a whole-disk image (see
/// [`crate::partition`]), or an image kept at a byte offset inside a container file (as
/// Apptainer's SIF keeps one). Given to [`crate::MountOptions::region`], or to
/// [`RegionDevice::new`] directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Byte offset of the filesystem's first byte: a multiple of [`REGION_ALIGN`].
    pub offset: u64,
    /// Length in bytes; `None` reaches to the end of the device.
    pub len: Option<u64>,
}

/// What a [`Region`]'s offset must be a multiple of: the sector size of partition tables,
/// and what the kernel's loop device (`losetup -o`) and every backend here can address.
pub const REGION_ALIGN: u64 = 512;

/// A window onto `offset..offset + len` of another device, seen as a device of its own
/// starting at 0: every access is translated and bounds-checked, so nothing outside the
/// window is ever read or written (an access past its end is an error, never a write into
/// the neighbouring partition). Read-only, flush, mapping and cheap zeroing are the wrapped
/// device's.
pub struct RegionDevice {
    inner: Arc<dyn BlockDevice>,
    offset: u64,
    len: u64,
}

impl RegionDevice {
    /// Checks `r` against `inner`: the offset must be a multiple of [`REGION_ALIGN`], inside
    /// the device, and the window must not be empty or run past the device's end.
    pub fn new(inner: Arc<dyn BlockDevice>, r: Region) -> crate::Result<Self> {
        let size = inner.size();
        if !r.offset.is_multiple_of(REGION_ALIGN) {
            return Err(crate::Error::Invalid(format!(
                "offset {} is not a multiple of {REGION_ALIGN} bytes",
                r.offset
            )));
        }
        if r.offset >= size {
            return Err(crate::Error::Invalid(format!(
                "offset {} is past the end of the device ({size} bytes)",
                r.offset
            )));
        }
        let len = match r.len {
            None => size - r.offset,
            Some(0) => {
                return Err(crate::Error::Invalid(format!(
                    "the region at offset {} is empty (length 0)",
                    r.offset
                )))
            }
            Some(l) if r.offset.checked_add(l).is_none_or(|e| e > size) => {
                return Err(crate::Error::Invalid(format!(
                    "the region of {l} bytes at offset {} runs past the end of the device \
                     ({size} bytes)",
                    r.offset
                )))
            }
            Some(l) => l,
        };
        Ok(RegionDevice {
            inner,
            offset: r.offset,
            len,
        })
    }

    /// The window, in the wrapped device's bytes.
    pub fn region(&self) -> Region {
        Region {
            offset: self.offset,
            len: Some(self.len),
        }
    }

    /// `off` translated to the wrapped device, once `off..off + len` is known to lie inside
    /// the window.
    fn translate(&self, off: u64, len: u64) -> io::Result<u64> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + off),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access at byte {off} (+{len}) is past the end of the region ({} bytes at \
                     offset {})",
                    self.len, self.offset
                ),
            )),
        }
    }
}

impl BlockDevice for RegionDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.translate(off, buf.len() as u64)?;
        self.inner.read_at(at, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let at = self.translate(off, buf.len() as u64)?;
        self.inner.write_at(at, buf)
    }
    fn write_new_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let at = self.translate(off, buf.len() as u64)?;
        self.inner.write_new_at(at, buf)
    }
    fn copy_new_from(&self, off: u64, src: &File, src_off: u64, len: u64) -> io::Result<u64> {
        let at = self.translate(off, len)?;
        self.inner.copy_new_from(at, src, src_off, len)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.len
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn is_mapped(&self) -> bool {
        self.inner.is_mapped()
    }
    fn zeroes_cheaply(&self) -> bool {
        self.inner.zeroes_cheaply()
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        let at = self.translate(off, len)?;
        self.inner.zero_range(at, len)
    }
    fn discard(&self, off: u64, len: u64) -> io::Result<bool> {
        let at = self.translate(off, len)?;
        self.inner.discard(at, len)
    }
    fn read_fresh_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.translate(off, buf.len() as u64)?;
        self.inner.read_fresh_at(at, buf)
    }
    fn name(&self) -> Option<String> {
        self.inner.name()
    }
}

mod copy;
mod counted;
#[cfg(feature = "mapped")]
mod mapped;
pub(crate) use counted::Counted;
#[cfg(feature = "mapped")]
pub use mapped::MappedDevice;
#[cfg(test)]
mod tests;
