//! The mapped (DAX) backend: the image file or block device mapped into memory (the
//! `mapped` feature, memmap2).

use super::{
    file_name, is_tmpfs, punch_hole, range_check, write_zeros, zero_file_range, BlockDevice,
};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The DAX backend: the image is mapped into memory, so a read or a write is one memory copy
/// and no system call (DESIGN.md R3). A flush writes back only the dirty parts of the mapping:
/// writes mark 64 KiB chunks in a lock-free bitmap, and `flush` msyncs the marked runs.
///
/// Holes: a store into a hole of a sparse image file makes the kernel find storage for the
/// page at fault time, and where there is none (a full tmpfs or disk) the answer is SIGBUS,
/// which would kill the process. So the device keeps a bitmap of the pages known to have
/// storage (found with SEEK_DATA/SEEK_HOLE at open), and a write that touches any other page
/// goes through pwrite instead: a full filesystem then fails that write with ENOSPC.
/// Only pages of the image file itself are tracked: somebody else punching holes in or
/// truncating the image while it is open is not guarded against (pread/pwrite would see it
/// too, as zeros or short reads).
pub struct MappedDevice {
    map: memmap2::MmapRaw,
    /// One bit per 64 KiB chunk written since the last flush (not kept on tmpfs).
    dirty: AtomicBits,
    /// Use non-temporal stores for large aligned copies (see `copy_nt`).
    non_temporal: bool,
    file: File,
    /// Whether flush must msync: not on tmpfs, where the mapped pages are the storage and
    /// msync has nothing to write (it would only cost a system call per dirty run).
    needs_sync: bool,
    /// One bit per page of the image: set when the page has storage (is not a hole).
    backed: AtomicBits,
    page_shift: u32,
    /// On tmpfs, one bit per 2 MiB chunk whose backed pages have been mapped into this
    /// mapping's page tables (see `populate_chunks`).
    populated: AtomicBits,
}

/// A fixed number of bits that threads set without a lock.
struct AtomicBits(Vec<AtomicU64>);

impl AtomicBits {
    fn new(bits: u64) -> Self {
        AtomicBits((0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn get(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn clear(&self, i: u64) {
        let w = &self.0[(i / 64) as usize];
        let bit = 1u64 << (i % 64);
        if w.load(Ordering::Relaxed) & bit != 0 {
            w.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Sets bit `i`; returns whether it was set already. A bit already set costs a load only,
    /// no write to a cache line that other threads read.
    fn set(&self, i: u64) -> bool {
        let w = &self.0[(i / 64) as usize];
        let bit = 1u64 << (i % 64);
        w.load(Ordering::Relaxed) & bit != 0 || w.fetch_or(bit, Ordering::Relaxed) & bit != 0
    }
}

/// Chunks of the image that `populate_chunks` maps at once: 2 MiB.
const POPULATE_SHIFT: u32 = 21;

const DAX_CHUNK_SHIFT: u32 = 16;

/// On tmpfs, writes larger than this go through pwrite rather than a store into the mapping.
/// Chosen when stores still faulted on every page the mapping had not touched (1 MiB
/// overwrites through FUSE with writeback_cache: 0.57-0.75x the kernel with stores, 0.81-0.84x
/// with pwrite). With the mapping populated (`populate_chunks`) the two are even on
/// pwrite-1g's overwrite-16m (medians of three rounds 1,437 and 1,421 MiB/s) and pwrite is
/// still ahead on its overwrite-4k through writeback_cache, whose writeback sends large writes
/// (1,250 against 1,065 MiB/s).
const PWRITE_FROM: usize = 64 << 10;

impl MappedDevice {
    /// Maps the image file or block device at `path`, read-write (`non_temporal`: copy large writes
    /// with non-temporal stores).
    ///
    /// # Errors
    /// What opening or mapping it reports.
    pub fn open(path: &Path, non_temporal: bool) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let map = memmap2::MmapOptions::new().map_raw(&file)?;
        let chunks = (map.len() as u64 >> DAX_CHUNK_SHIFT) + 1;
        let dirty = AtomicBits::new(chunks);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let page_shift = page.trailing_zeros();
        let pages = (map.len() as u64).div_ceil(page);
        let backed = AtomicBits::new(pages);
        let populated = AtomicBits::new((map.len() as u64).div_ceil(1 << POPULATE_SHIFT));
        let dev = MappedDevice {
            map,
            dirty,
            non_temporal,
            needs_sync: !is_tmpfs(&file),
            file,
            backed,
            page_shift,
            populated,
        };
        for (start, end) in data_ranges(&dev.file, dev.map.len() as u64) {
            // Whole pages inside the data range only.
            let first = start.div_ceil(page);
            let last = end >> page_shift;
            dev.mark_backed(first, last);
        }
        Ok(dev)
    }

    fn check(&self, off: u64, len: usize) -> io::Result<()> {
        range_check(off, len, self.map.len()).map(|_| ())
    }

    /// Marks pages `first..last` as having storage.
    fn mark_backed(&self, first: u64, last: u64) {
        for p in first..last {
            self.backed.set(p);
        }
    }

    /// Whether every page of `off..off + len` is known to have storage (one bit test each).
    fn all_backed(&self, off: u64, len: usize) -> bool {
        let first = off >> self.page_shift;
        let last = (off + len as u64 - 1) >> self.page_shift;
        (first..=last).all(|p| self.backed.get(p))
    }

    /// Copies `buf` into the mapping at `off` (streaming stores for whole pages with
    /// `non_temporal`) and marks its chunks dirty.
    fn copy_in(&self, off: u64, buf: &[u8], non_temporal: bool) -> io::Result<()> {
        self.check(off, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let large = !self.needs_sync && buf.len() > PWRITE_FROM;
        if large || !self.all_backed(off, buf.len()) {
            // Some page is a hole (see the type's comment): pwrite finds it storage, or fails
            // with ENOSPC, and copies the data in the same call (a store would also take a
            // page fault per page). The mapping sees the same pages. On tmpfs large writes
            // take pwrite too (`PWRITE_FROM`): it lands in the same pages.
            self.file.write_all_at(buf, off)?;
            self.mark_backed(
                off >> self.page_shift,
                ((off + buf.len() as u64 - 1) >> self.page_shift) + 1,
            );
            self.mark_dirty(off, buf.len());
            return Ok(());
        }
        self.populate_chunks(off, buf.len());
        // SAFETY: as in read_at.
        let dst = unsafe { self.map.as_mut_ptr().add(off as usize) };
        if non_temporal && buf.len() >= 4096 {
            copy_nt(dst, buf);
        } else {
            // SAFETY: as in read_at.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, buf.len()) };
        }
        self.mark_dirty(off, buf.len());
        Ok(())
    }

    /// On tmpfs, maps the backed pages of the 2 MiB chunks that `off..off + len` touches into
    /// this mapping's page tables, once per chunk, before the first copy in or out of them.
    ///
    /// Pages written with pwrite (a hole's first write, a large write, anything another process
    /// wrote) are in the page cache but not in this mapping, and each first store into one took
    /// a page fault: overwrite-4k's timed stores through FUSE faulted on about one request in
    /// two at 16 jobs (its layout writes every page by pwrite). One MADV_POPULATE_WRITE per
    /// chunk maps 512 pages for the cost of a few faults. Holes are left alone (populating one
    /// would give it storage). Not on other filesystems: there it would dirty pages that then
    /// get written back. Advice only: a kernel without MADV_POPULATE_WRITE (before 5.14), or a
    /// page that became backed after its chunk was done, just takes the fault.
    fn populate_chunks(&self, off: u64, len: usize) {
        if self.needs_sync || len == 0 {
            return;
        }
        let first = off >> POPULATE_SHIFT;
        let last = (off + len as u64 - 1) >> POPULATE_SHIFT;
        for c in first..=last {
            if self.populated.set(c) {
                continue;
            }
            let per_chunk = 1u64 << (POPULATE_SHIFT - self.page_shift);
            let pages = (self.map.len() as u64).div_ceil(1 << self.page_shift);
            let end = ((c + 1) * per_chunk).min(pages);
            let mut p = c * per_chunk;
            while p < end {
                if !self.backed.get(p) {
                    p += 1;
                    continue;
                }
                let run = p;
                while p < end && self.backed.get(p) {
                    p += 1;
                }
                self.populate(run, p);
            }
        }
    }

    /// MADV_POPULATE_WRITE over pages `first..last`, which must all have storage.
    fn populate(&self, first: u64, last: u64) {
        let start = (first << self.page_shift) as usize;
        let end = ((last << self.page_shift) as usize).min(self.map.len());
        if start >= end {
            return;
        }
        // SAFETY: the range lies inside the mapping and its pages have storage, so populating
        // them allocates nothing and changes no data.
        unsafe {
            libc::madvise(
                self.map.as_mut_ptr().add(start).cast(),
                end - start,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    fn mark_dirty(&self, off: u64, len: usize) {
        if !self.needs_sync {
            return;
        }
        let first = off >> DAX_CHUNK_SHIFT;
        let last = (off + len as u64 - 1) >> DAX_CHUNK_SHIFT;
        for c in first..=last {
            self.dirty.set(c);
        }
    }
}

/// The data ranges of `file` (everything outside them is a hole), from SEEK_DATA/SEEK_HOLE;
/// none where the filesystem cannot tell (then every page's first write is a pwrite).
fn data_ranges(file: &File, len: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < len {
        // SAFETY: lseek on our own descriptor; the shared file offset is not used elsewhere
        // (every other access is positional or through the mapping).
        let d = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        if h <= d {
            break;
        }
        out.push((d as u64, (h as u64).min(len)));
        pos = h as u64;
    }
    out
}

/// Copies with non-temporal (streaming) stores where the CPU has them, bypassing the cache for
/// large writes; falls back to a plain copy.
fn copy_nt(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // SAFETY: `dst` points at `src.len()` writable bytes of the mapping (range-checked by the
        // caller). Streaming stores need 16-byte aligned destinations: the unaligned head and
        // tail are copied normally. SSE2 is part of the x86_64 baseline.
        unsafe {
            let mut i = 0usize;
            let head = (16 - (dst as usize & 15)) & 15;
            let head = head.min(src.len());
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            i += head;
            while i + 16 <= src.len() {
                let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
                i += 16;
            }
            std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), src.len() - i);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
    }
}

impl BlockDevice for MappedDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.all_backed(off, buf.len()) {
            // A hole: pread returns its zeros without giving it storage (a load from the
            // mapping would allocate a page at fault time, and on a full tmpfs the fault is
            // SIGBUS, which would kill the process).
            return self.file.read_exact_at(buf, off);
        }
        self.populate_chunks(off, buf.len());
        // SAFETY: the range is inside the mapping (checked above); the mapping lives as long as
        // self. Concurrent writers to the same bytes are the filesystem's business (the engine's
        // locks order them), as with pread/pwrite on a shared file.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.copy_in(off, buf, self.non_temporal)
    }
    /// New blocks take a cached copy even with non-temporal stores on (faster on pwrite-1g,
    /// BENCHMARKS.md, DAX). The likely reason: in a sparse or tmpfs
    /// image their pages are faulted in (and zeroed, through the cache) by the copy itself, so
    /// the lines are in the cache when the data arrives, and streaming stores must evict them.
    fn write_new_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.copy_in(off, buf, false)
    }
    fn flush(&self) -> io::Result<()> {
        if !self.needs_sync {
            // Stores to the mapping are in the page cache, which on tmpfs is the storage;
            // order them before whatever the caller writes after the flush.
            std::sync::atomic::fence(Ordering::SeqCst);
            return Ok(());
        }
        let chunk = 1u64 << DAX_CHUNK_SHIFT;
        let len = self.map.len() as u64;
        let mut run: Option<(u64, u64)> = None;
        let sync = |r: (u64, u64)| -> io::Result<()> {
            let end = r.1.min(len);
            self.map.flush_range(r.0 as usize, (end - r.0) as usize)
        };
        for (wi, w) in self.dirty.0.iter().enumerate() {
            let bits = w.swap(0, Ordering::AcqRel);
            if bits == 0 {
                if let Some(r) = run.take() {
                    sync(r)?;
                }
                continue;
            }
            for b in 0..64 {
                let c = wi as u64 * 64 + b;
                if bits & (1 << b) != 0 {
                    run = match run {
                        Some((s, e)) if e == c * chunk => Some((s, e + chunk)),
                        Some(r) => {
                            sync(r)?;
                            Some((c * chunk, (c + 1) * chunk))
                        }
                        None => Some((c * chunk, (c + 1) * chunk)),
                    };
                } else if let Some(r) = run.take() {
                    sync(r)?;
                }
            }
        }
        if let Some(r) = run {
            sync(r)?;
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.map.len() as u64
    }
    fn name(&self) -> Option<String> {
        file_name(&self.file)
    }
    fn is_mapped(&self) -> bool {
        true
    }
    fn zeroes_cheaply(&self) -> bool {
        !self.needs_sync
    }
    /// On tmpfs (`zero_file_range`): the pages wholly inside the range are dropped and
    /// allocated afresh; the parts of pages at the ends are zeroed in place by the same punch.
    /// Their `backed` bits are cleared first, so no store reaches them while they are holes.
    ///
    /// Once allocated they are also mapped here (MADV_POPULATE_WRITE), which clears them:
    /// tmpfs allocates fallocated pages without clearing them and clears each when it is first
    /// mapped. Left to the first write, that clearing (and `populate_chunks`' 512 pages at a
    /// time) would land in the writes, holding the mapping's lock for reading while it runs:
    /// a commit's allocation that has to grow the heap (mprotect, the same lock for writing)
    /// then waits for them with the running transaction locked, and every writer behind it.
    /// Paid here it is the preallocation's cost, as writing zeros is for an ext4 without
    /// unwritten extents. (A pwrite would copy over fresh pages without clearing them, but
    /// every pwrite to the image takes its inode lock, and many writers would queue there.)
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        self.check(off, len as usize)?;
        if self.needs_sync {
            return write_zeros(self, off, len);
        }
        let page = 1u64 << self.page_shift;
        let first = off.div_ceil(page);
        let last = (off + len) >> self.page_shift;
        for p in first..last {
            self.backed.clear(p);
        }
        zero_file_range(&self.file, off, len)?;
        self.mark_backed(first, last);
        self.populate(first, last);
        Ok(())
    }
    /// The pages wholly inside the range become holes: their `backed` bits are cleared
    /// first, so that reads and writes of them go through pread/pwrite (which find them
    /// storage again) rather than the mapping.
    fn discard(&self, off: u64, len: u64) -> io::Result<bool> {
        self.check(off, len as usize)?;
        let page = 1u64 << self.page_shift;
        for p in off.div_ceil(page)..(off + len) >> self.page_shift {
            self.backed.clear(p);
        }
        punch_hole(&self.file, off, len)
    }
}
