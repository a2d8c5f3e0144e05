//! The data-path rules, by counting: overwrites start no journal handle (R1), full-block writes
//! zero nothing and partial ones zero only the uncovered part (R3), fdatasync after a
//! timestamp-only change does not commit, and readers and overwriters of one file run together.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uext4::{Fs, MountOptions};

/// A fresh image opened with pread/pwrite (`map_tmpfs` off: the counting tests are about the
/// engine's rules, the same whatever the device; the mapped device has tests of its own), and
/// fallocate making unwritten extents as it does off tmpfs (`prealloc_zeroed` has its own test).
fn open(tag: &str) -> (Scratch, Arc<Fs>) {
    open_made(tag, "128M", &[])
}

/// As `open`, on an image of `size` that mke2fs makes with `mkfs` options.
fn open_made(tag: &str, size: &str, mkfs: &[&str]) -> (Scratch, Arc<Fs>) {
    let img = scratch(tag);
    mke2fs(&img.0, size, mkfs);
    let fs = Fs::open_path(
        &img.0,
        MountOptions {
            map_tmpfs: false,
            prealloc_zeroed: false,
            ..opts::no_timer()
        },
    )
    .unwrap();
    (img, fs)
}

#[test]
fn overwrites_start_no_handles() {
    let (img, fs) = open("ow");
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
    fs.fsync(f, false).unwrap();
    let h0 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    for i in 0..1000u64 {
        fs.write(f, (i * 4096 * 7) % (1 << 20), &[2u8; 4096])
            .unwrap();
    }
    let h1 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    assert_eq!(h1 - h0, 0, "1000 overwrites started {} handles", h1 - h0);
    // The timestamp change is logged by the next commit, once.
    let c0 = fs.txn_stats().commits.load(Ordering::Relaxed);
    fs.fdatasync_then_fsync_check(f);
    let c1 = fs.txn_stats().commits.load(Ordering::Relaxed);
    assert_eq!(
        c1 - c0,
        1,
        "fdatasync commits nothing for timestamps; fsync commits them once"
    );
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

trait Check {
    fn fdatasync_then_fsync_check(&self, ino: u32);
}
impl Check for Fs {
    fn fdatasync_then_fsync_check(&self, ino: u32) {
        self.fsync(ino, true).unwrap();
        self.fsync(ino, false).unwrap();
        self.fsync(ino, false).unwrap();
    }
}

#[test]
fn zeroing_only_where_a_write_does_not_cover() {
    let (img, fs) = open("zero");
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![1u8; 64 * 4096]).unwrap();
    assert_eq!(
        fs.stats.zeroed_bytes.load(Ordering::Relaxed),
        0,
        "full-block writes zero nothing"
    );
    fs.write(f, 100 * 4096 + 100, &[3u8; 200]).unwrap();
    assert_eq!(
        fs.stats.zeroed_bytes.load(Ordering::Relaxed),
        4096 - 200,
        "only the uncovered part of one block"
    );
    let mut b = vec![9u8; 4096];
    let n = fs.read(f, 100 * 4096, &mut b).unwrap();
    assert_eq!(n, 300, "short read at the end of the file");
    assert!(b[..100].iter().all(|&x| x == 0) && b[100..300].iter().all(|&x| x == 3));
    // Preallocated extents read as zeros without device reads, and take writes.
    let g = fs.create(2, b"g", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(g, 0, 0, 1 << 20).unwrap();
    let r0 = fs.io_counters().bytes_read.load(Ordering::Relaxed);
    let mut big = vec![7u8; 1 << 20];
    fs.read(g, 0, &mut big).unwrap();
    assert!(big.iter().all(|&x| x == 0));
    assert_eq!(
        fs.io_counters().bytes_read.load(Ordering::Relaxed),
        r0,
        "unwritten extents read without the device"
    );
    fs.write(g, 4096, &[5u8; 8192]).unwrap();
    fs.read(g, 0, &mut big).unwrap();
    assert!(
        big[..4096].iter().all(|&x| x == 0)
            && big[4096..12288].iter().all(|&x| x == 5)
            && big[12288..].iter().all(|&x| x == 0)
    );
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

#[test]
fn readers_and_overwriters_of_one_file_run_together() {
    let (img, fs) = open("par");
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![0u8; 4 << 20]).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                for i in 0..2000u64 {
                    let off = ((i * 7919 + t * 104729) % 1024) * 4096;
                    if t % 2 == 0 {
                        fs.write(f, off, &[t as u8 + 1; 4096]).unwrap();
                    } else {
                        fs.read(f, off, &mut buf).unwrap();
                        // Only data some writer wrote (or the initial zeros). (Like the kernel,
                        // a read racing a write of the same block may see parts of both.)
                        assert!(
                            buf.iter().all(|&x| x == 0 || x == 1 || x == 3),
                            "foreign data at {off}"
                        );
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

/// DAX: the mapped image with cached and with non-temporal copies gives the same bytes and a
/// clean image, on tmpfs (no msync) and on a disk filesystem (msync of the dirty chunks).
#[test]
fn dax_mapped_image_roundtrip() {
    for (nt, on_disk) in [(false, false), (true, false), (true, true), (false, true)] {
        let img = if on_disk {
            Scratch(std::env::temp_dir().join(format!("uext4-dax-{}-{nt}.img", std::process::id())))
        } else {
            scratch("dax")
        };
        mke2fs(&img.0, "64M", &[]);
        let opts = MountOptions {
            dax: true,
            dax_non_temporal: nt,
            ..opts::no_timer()
        };
        let fs = Fs::open_path(&img.0, opts.clone()).unwrap();
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        fs.write(f, 0, &data).unwrap();
        fs.write(f, 12345, &[7u8; 100_000]).unwrap();
        fs.fsync(f, false).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(fs.read(f, 0, &mut back).unwrap(), data.len());
        let mut want = data.clone();
        want[12345..112345].fill(7);
        assert!(back == want, "DAX (non-temporal: {nt}) content differs");
    }
}

/// An image that is a sparse file on a full tmpfs: mapped by default, and its writes into
/// holes fail with an error (ENOSPC, as pwrite's would), not SIGBUS. Needs root (a tmpfs of its
/// own, 16 MiB, under a 64 MiB image).
#[test]
fn mapped_image_on_a_full_tmpfs_fails_cleanly() {
    on_own_tmpfs("fulltmpfs", |dir| {
        let img = dir.join("img");
        mke2fs(&img, "64M", &["-J", "size=4"]);
        // Room that is given back after the failure, so that the unmount can write its metadata.
        let filler = dir.join("filler");
        std::fs::write(&filler, vec![1u8; 4 << 20]).unwrap();
        let fs = Fs::open_path(&img, opts::no_timer()).unwrap();
        assert!(fs.is_mapped(), "an image on tmpfs is mapped by default");
        let f = fs.create(2, b"big", 0o644, 0, 0).unwrap().ino;
        let chunk = vec![0xabu8; 1 << 20];
        let mut written = 0u64;
        let err = loop {
            match fs.write(f, written, &chunk) {
                Ok(_) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(written < 64 << 20, "64 MiB written into a 16 MiB tmpfs");
        };
        eprintln!("after {} MiB: {err}", written >> 20);
        assert!(written >= 1 << 20, "nothing could be written at all");
        // What was written before the error reads back.
        let mut back = vec![0u8; 1 << 20];
        fs.read(f, 0, &mut back).unwrap();
        assert!(back == chunk);
        // The failed write left nothing half-done: with room again, unmount and e2fsck find a
        // clean image.
        std::fs::remove_file(&filler).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img);
    });
}

/// fallocate on a thin image (a sparse image larger than its tmpfs): the blocks are made
/// unwritten extents (no storage until written, as on the kernel's ext4), not zeroed pages
/// of the tmpfs, so the call does not fill the tmpfs and the filesystem goes on working.
/// Before, a preallocation that fit took the tmpfs's space (one that did not was reported
/// done over blocks with nothing under them): the next commits failed and the filesystem
/// stopped, losing every change since mount. Needs root (a tmpfs of its own, 16 MiB, under
/// a 64 MiB image).
#[test]
fn fallocate_beyond_the_images_storage_makes_unwritten_extents() {
    on_own_tmpfs("smalltmpfs", |dir| {
        let img = dir.join("img");
        mke2fs(&img, "64M", &["-J", "size=4"]);
        let fs = Fs::open_path(&img, opts::no_timer()).unwrap();
        let avail_kib = || -> u64 {
            let out = sh(&format!("df -k --output=avail {}", dir.display()));
            out.lines().nth(1).unwrap().trim().parse().unwrap()
        };
        let before = avail_kib();
        let f = fs.create(2, b"prealloc", 0o644, 0, 0).unwrap().ino;
        fs.fallocate(f, 0, 0, 13 << 20).unwrap();
        fs.fallocate(f, 0, 13 << 20, 27 << 20).unwrap();
        assert_eq!(fs.getattr(f).unwrap().size, 40 << 20);
        assert!(
            avail_kib() + 1024 >= before,
            "the preallocation took the tmpfs's space ({before} -> {} KiB free)",
            avail_kib()
        );
        let mut back = vec![1u8; 1 << 20];
        fs.read(f, 20 << 20, &mut back).unwrap();
        assert!(
            back.iter().all(|&x| x == 0),
            "preallocated blocks read as zeros"
        );
        // The filesystem still works: new files, data, fsyncs.
        for i in 0..50u32 {
            let g = fs
                .create(2, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_all(g, 0, &[i as u8; 65536]).unwrap();
            fs.fsync(g, false).unwrap();
        }
        fs.write_all(f, 1 << 20, &[7u8; 1 << 20]).unwrap();
        fs.fsync(f, false).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img);
        let fs = Fs::open_path(&img, MountOptions::default()).unwrap();
        let f = fs.lookup(2, b"prealloc").unwrap().ino;
        fs.read(f, 1 << 20, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 7));
        let g = fs.lookup(2, b"f49").unwrap().ino;
        let mut small = vec![0u8; 65536];
        fs.read(g, 0, &mut small).unwrap();
        assert!(small.iter().all(|&x| x == 49));
        fs.unmount().unwrap();
    });
}

/// The mapped device gives a hole of a sparse image storage when it first writes there (by
/// pwrite) and leaves the bytes around the write as they were (zeros), with pages already
/// backed kept.
#[test]
fn mapped_device_backs_holes_before_storing() {
    use std::os::unix::fs::MetadataExt;
    let img = scratch("holes");
    let f = std::fs::File::create(&img.0).unwrap();
    f.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[9u8; 4096], 1 << 20).unwrap();
    drop(f);
    let before = std::fs::metadata(&img.0).unwrap().blocks();
    let dev = uext4::blockdev::MappedDevice::open(&img.0, false).unwrap();
    use uext4::blockdev::BlockDevice;
    dev.write_at(3 << 20, &[5u8; 100]).unwrap();
    dev.write_at((1 << 20) + 10, &[6u8; 10]).unwrap();
    dev.flush().unwrap();
    let after = std::fs::metadata(&img.0).unwrap().blocks();
    assert!(
        after > before,
        "the hole under the store got storage ({before} -> {after} sectors)"
    );
    let mut b = vec![0u8; 4096];
    dev.read_at(3 << 20, &mut b).unwrap();
    assert!(b[..100].iter().all(|&x| x == 5) && b[100..].iter().all(|&x| x == 0));
    dev.read_at(1 << 20, &mut b).unwrap();
    assert!(b[..10].iter().all(|&x| x == 9) && b[10..20].iter().all(|&x| x == 6));
    assert!(b[20..].iter().all(|&x| x == 9));
}

/// On tmpfs the mapped device maps the backed pages of a 2 MiB chunk into its page tables at
/// the chunk's first access, so that later stores take no page fault, and gives no hole
/// storage on the way. Measured with the mapping's Rss in /proc/self/smaps: a plain read fault
/// would map at most the 64 KiB around the page read.
#[test]
fn mapped_device_populates_backed_pages_only() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    use uext4::blockdev::BlockDevice;
    let Some((img, f)) = sparse_file_on_tmpfs("populate") else {
        return;
    };
    f.write_all_at(&[1u8; 64 << 10], 0).unwrap();
    f.write_all_at(&[2u8; 4096], 1 << 20).unwrap();
    f.write_all_at(&[3u8; 4096], 3 << 20).unwrap();
    drop(f);
    let blocks = || std::fs::metadata(&img.0).unwrap().blocks();
    let before = blocks();
    let dev = uext4::blockdev::MappedDevice::open(&img.0, false).unwrap();
    let mut b = vec![0u8; 4096];
    dev.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
    assert_eq!(blocks(), before, "populating gave holes storage");
    // Exact page counts only where tmpfs does not use huge pages.
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .unwrap_or_default();
    let exact = thp.is_empty() || thp.contains("[never]") || thp.contains("[deny]");
    let rss_kib = || mapping_rss_kib(&img.0);
    if exact {
        // The 16 pages at 0 and the page at 1 MiB (chunk 0); not the page at 3 MiB (chunk 1).
        assert_eq!(
            rss_kib(),
            68,
            "chunk 0's backed pages mapped at its first access"
        );
    }
    dev.write_at((3 << 20) + 8, &[7u8; 100]).unwrap();
    if exact {
        assert_eq!(
            rss_kib(),
            72,
            "chunk 1's backed page mapped at its first store"
        );
    }
    assert_eq!(blocks(), before, "populating gave holes storage");
    dev.read_at(3 << 20, &mut b).unwrap();
    assert!(b[..8].iter().all(|&x| x == 3) && b[8..108].iter().all(|&x| x == 7));
    assert!(b[108..].iter().all(|&x| x == 3));
}

/// A read of a hole in the image returns zeros and leaves it a hole: a load from the mapping
/// would give the page storage at fault time (on tmpfs; on a full one the fault is SIGBUS).
#[test]
fn mapped_device_reads_holes_without_giving_them_storage() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    use uext4::blockdev::BlockDevice;
    let img = scratch("hole-read");
    let f = std::fs::File::create(&img.0).unwrap();
    f.set_len(8 << 20).unwrap();
    f.write_all_at(&[4u8; 4096], 1 << 20).unwrap();
    drop(f);
    let blocks = || std::fs::metadata(&img.0).unwrap().blocks();
    let before = blocks();
    let dev = uext4::blockdev::MappedDevice::open(&img.0, false).unwrap();
    let mut b = vec![1u8; 3 * 4096];
    // All hole; then a backed page between two holes.
    dev.read_at(5 << 20, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    dev.read_at((1 << 20) - 4096, &mut b).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 0) && b[8192..].iter().all(|&x| x == 0));
    assert!(b[4096..8192].iter().all(|&x| x == 4));
    assert_eq!(blocks(), before, "reading holes gave them storage");
}

/// On tmpfs, zeroing a range (what fallocate does for new blocks there) allocates its pages
/// and maps them into the device's mapping at once, so the kernel clears them now and not
/// in the first writes that store into them (which would each clear a whole 2 MiB chunk).
#[test]
fn mapped_device_zero_range_maps_its_pages() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    use uext4::blockdev::BlockDevice;
    let Some((img, f)) = sparse_file_on_tmpfs("zero-range") else {
        return;
    };
    f.write_all_at(&[8u8; 1 << 20], 4 << 20).unwrap();
    drop(f);
    let blocks = || std::fs::metadata(&img.0).unwrap().blocks();
    let dev = uext4::blockdev::MappedDevice::open(&img.0, false).unwrap();
    let rss_kib = || mapping_rss_kib(&img.0);
    let (rss0, blocks0) = (rss_kib(), blocks());
    // 1 MiB of hole and the 1 MiB of data after it, from the middle of a page to the middle
    // of a page.
    dev.zero_range((3 << 20) + 100, (2 << 20) - 200).unwrap();
    assert!(
        blocks() >= blocks0 + (1 << 20) / 512 - 8,
        "the hole's pages were allocated ({blocks0} -> {} sectors)",
        blocks()
    );
    assert!(
        rss_kib() >= rss0 + 2048 - 8,
        "the zeroed pages are mapped ({rss0} -> {} KiB)",
        rss_kib()
    );
    let mut b = vec![1u8; 2 << 20];
    dev.read_at(3 << 20, &mut b).unwrap();
    assert!(b[100..(2 << 20) - 100].iter().all(|&x| x == 0));
    assert!(
        b[(2 << 20) - 100..].iter().all(|&x| x == 8),
        "the data after the range stays"
    );
    dev.write_at((3 << 20) + 4096, &[6u8; 4096]).unwrap();
    dev.read_at((3 << 20) + 4096, &mut b[..8192]).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 6) && b[4096..8192].iter().all(|&x| x == 0));
}

/// The resident size of this process's mapping of `path`, from /proc/self/smaps (KiB).
fn mapping_rss_kib(path: &std::path::Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let name = path.to_str().unwrap();
    let mut lines = smaps.lines().skip_while(|l| !l.ends_with(name));
    lines.next().expect("the image's mapping in smaps");
    let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
    rss.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A new 8 MiB sparse file on tmpfs, or None (having said SKIP) where scratch files are not
/// on tmpfs.
fn sparse_file_on_tmpfs(tag: &str) -> Option<(Scratch, std::fs::File)> {
    let img = scratch(tag);
    let f = std::fs::File::create(&img.0).unwrap();
    if !uext4::blockdev::is_tmpfs(&f) {
        eprintln!("SKIP: {} is not on tmpfs", img.0.display());
        return None;
    }
    f.set_len(8 << 20).unwrap();
    Some((img, f))
}

/// Runs `f` on a 16 MiB tmpfs of its own (root only: else says SKIP and returns), which is
/// unmounted afterwards whatever `f` does.
fn on_own_tmpfs(tag: &str, f: impl FnOnce(&std::path::Path) + std::panic::UnwindSafe) {
    if !is_root() {
        eprintln!("SKIP: not root, no tmpfs of our own to fill");
        return;
    }
    let dir = std::env::temp_dir().join(format!("uext4-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=16m uext4test {}",
        dir.display()
    ));
    let result = std::panic::catch_unwind(|| f(&dir));
    let _ = sh(&format!("umount {}", dir.display()));
    let _ = std::fs::remove_dir(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn open_buffered(img: &Scratch) -> Arc<Fs> {
    Fs::open_path(&img.0, opts::no_timer_buffered(true)).unwrap()
}

fn block(i: u64) -> Vec<u8> {
    (0..4096u64).map(|b| (i * 31 + b * 7) as u8).collect()
}

/// What `debugfs -R REQUEST IMG` prints.
fn debugfs(img: &std::path::Path, request: &str) -> String {
    let o = std::process::Command::new("debugfs")
        .args(["-R", request])
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The extents debugfs lists for `path`: "(first-last):pstart-pend" ranges.
fn debugfs_extents(img: &std::path::Path, path: &str) -> Vec<String> {
    let out = debugfs(img, &format!("stat {path}"));
    let ext = out
        .split("EXTENTS:")
        .nth(1)
        .unwrap_or_else(|| panic!("no EXTENTS in {out}"));
    ext.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| s.starts_with('(') && !s.starts_with("(ETB"))
        .map(str::to_string)
        .collect()
}

/// Buffered mode: 512 appends of 4 KiB start no handle, read back from the cache, and become
/// one allocation and one extent at fsync; without it each append is its own handle.
#[test]
fn buffered_appends_become_one_allocation() {
    let img = scratch("buffered");
    mke2fs(&img.0, "128M", &[]);
    let fs = open_buffered(&img);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let h0 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    for i in 0..512u64 {
        fs.write(f, i * 4096, &block(i)).unwrap();
    }
    let h1 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    assert_eq!(h1 - h0, 0, "cached appends started {} handles", h1 - h0);
    assert_eq!(fs.getattr(f).unwrap().size, 512 * 4096);
    let mut buf = vec![0u8; 4096];
    fs.read(f, 77 * 4096, &mut buf).unwrap();
    assert_eq!(buf, block(77), "read from the cache");
    assert_eq!(fs.delalloc_writeback_runs(), 0);
    fs.fsync(f, true).unwrap();
    assert_eq!(fs.delalloc_writeback_runs(), 1, "one run for 512 pages");
    let h2 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    assert!(h2 - h1 <= 2, "writeback started {} handles", h2 - h1);
    // A partial append on a block that is on disk reads the block in first.
    fs.write(f, 512 * 4096 + 100, b"tail").unwrap();
    fs.write(f, 5, b"head").unwrap(); // a pure overwrite: straight to the device
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
    let ext = debugfs_extents(&img.0, "/f");
    // The 512-block run, and the tail block (merged into it when allocated right after).
    assert!(
        ext.len() <= 2 && (ext[0].starts_with("(0-511)") || ext[0].starts_with("(0-512)")),
        "extents {ext:?}"
    );
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let mut all = vec![0u8; 513 * 4096];
    let n = fs.read(f, 0, &mut all).unwrap();
    assert_eq!(n, 512 * 4096 + 104);
    let mut want: Vec<u8> = (0..512).flat_map(block).collect();
    want[5..9].copy_from_slice(b"head");
    want.extend_from_slice(&[0u8; 100]);
    want.extend_from_slice(b"tail");
    assert!(all[..n] == want[..], "content after remount");
    fs.unmount().unwrap();

    // The same appends without buffered mode: one handle each.
    let img2 = scratch("unbuffered");
    mke2fs(&img2.0, "128M", &[]);
    let fs = Fs::open_path(&img2.0, MountOptions::default()).unwrap();
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let h0 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    for i in 0..512u64 {
        fs.write(f, i * 4096, &block(i)).unwrap();
    }
    let h1 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
    assert!(
        h1 - h0 >= 512,
        "unbuffered appends started {} handles",
        h1 - h0
    );
    fs.unmount().unwrap();
    e2fsck_clean(&img2.0);
}

/// A crash in buffered mode loses what was not written back, and never shows it as a longer
/// file of zeros: commits log the size the device backs.
#[test]
fn buffered_crash_keeps_synced_data_and_sizes() {
    let img = scratch("bufcrash");
    mke2fs(&img.0, "128M", &[]);
    let fs = open_buffered(&img);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let g = fs.create(2, b"g", 0o644, 0, 0).unwrap().ino;
    for i in 0..25u64 {
        fs.write(f, i * 4096, &block(i)).unwrap();
    }
    fs.fsync(f, false).unwrap();
    for i in 25..50u64 {
        fs.write(f, i * 4096, &block(i)).unwrap();
    }
    fs.write(g, 0, &block(9)[..3000]).unwrap();
    // Both inodes go to the journal with their on-disk sizes (times changed).
    fs.sync_metadata_only_for_test();
    assert_eq!(fs.getattr(f).unwrap().size, 50 * 4096);
    drop(fs); // a crash: no writeback, no unmount
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_eq!(
        fs.getattr(f).unwrap().size,
        25 * 4096,
        "f: the fsynced part"
    );
    let mut buf = vec![0u8; 25 * 4096];
    fs.read(f, 0, &mut buf).unwrap();
    assert!(buf == (0..25).flat_map(block).collect::<Vec<u8>>());
    assert_eq!(fs.getattr(g).unwrap().size, 0, "g: nothing written back");
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

trait CommitOnly {
    fn sync_metadata_only_for_test(&self);
}
impl CommitOnly for Fs {
    /// Commits the running transaction without writing back cached data.
    fn sync_metadata_only_for_test(&self) {
        self.commit().unwrap();
    }
}

/// Buffered mode reserves space at write time: a full filesystem fails the write with ENOSPC,
/// and everything accepted before it is written back at fsync.
#[test]
fn buffered_writes_fail_when_full_not_at_fsync() {
    let img = scratch("buffull");
    mke2fs(&img.0, "16M", &[]);
    let fs = open_buffered(&img);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![0x77u8; 64 << 10];
    let mut off = 0u64;
    let err = loop {
        match fs.write(f, off, &chunk) {
            Ok(n) => {
                // Rewriting cached data reserves nothing more, however full the disk is.
                fs.write(f, off, &chunk)
                    .expect("rewrite of cached data near a full filesystem");
                off += n as u64
            }
            Err(e) => break e,
        }
        assert!(off < 64 << 20, "no ENOSPC from a 16 MiB filesystem");
    };
    assert!(matches!(err, uext4::Error::NoSpace), "{err:?}");
    // Rewriting what is already there needs no new space, full or not.
    let back = off - chunk.len() as u64;
    fs.write(f, back, &chunk)
        .expect("rewrite of accepted data on a full filesystem");
    fs.write(f, 0, &chunk)
        .expect("rewrite of the first chunk on a full filesystem");
    fs.fsync(f, false).expect("what the writes accepted fits");
    assert_eq!(fs.getattr(f).unwrap().size, off);
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    fs.read(f, off - buf.len() as u64, &mut buf).unwrap();
    assert!(buf == chunk);
    fs.unmount().unwrap();
}

/// Buffered writes that each need an extent-tree block at writeback (sparse files with more
/// extents than the inode holds) are accepted only while there is room for those blocks too:
/// writing until ENOSPC, then fsync of every file, loses nothing that was accepted.
#[test]
fn buffered_writes_leave_room_for_extent_blocks() {
    let img = scratch("buftree");
    mke2fs(&img.0, "16M", &["-b", "4096", "-N", "2048"]);
    let fs = open_buffered(&img);
    // Every other block: six extents, one more than the inode's four.
    let files = fill_sparse_and_fsync(&fs, 2000, |i, f, k| {
        fs.write(f, 2 * k * 4096, &block(k + i as u64))
    });
    unmount_and_check_sparse(&img, fs, &files);
}

/// Makes up to `max` files, each written with six `write(i, ino, k)` calls, until one fails
/// with ENOSPC (which must happen), then fsyncs every file: what was accepted must fit.
/// Returns each file's inode and how many of its writes were accepted.
fn fill_sparse_and_fsync(
    fs: &Fs,
    max: u32,
    write: impl Fn(u32, u32, u64) -> uext4::Result<usize>,
) -> Vec<(u32, u64)> {
    let mut files = Vec::new();
    'fill: for i in 0..max {
        let f = fs
            .create(2, format!("s{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        for k in 0..6u64 {
            match write(i, f, k) {
                Ok(_) => {}
                Err(uext4::Error::NoSpace) => {
                    files.push((f, k));
                    break 'fill;
                }
                Err(e) => panic!("s{i}: {e}"),
            }
        }
        files.push((f, 6));
    }
    assert!(files.len() < max as usize, "the filesystem never filled");
    for &(f, n) in &files {
        fs.fsync(f, false)
            .unwrap_or_else(|e| panic!("fsync of inode {f} ({n} writes accepted): {e}"));
    }
    files
}

/// Buffered pages that fill holes inside a large extent tree may each split a different full
/// leaf (and the index blocks above): the reservation covers that too. A file of one-block
/// extents (1 KiB blocks, 84 to a leaf, depth 2), its physical gaps taken by another file,
/// gets one page in every leaf on a nearly full filesystem: whatever the writes accepted,
/// sync finds room for.
#[test]
fn buffered_writes_into_full_leaves_leave_room_for_splits() {
    let img = scratch("bufsplit");
    mke2fs(&img.0, "32M", &["-b", "1024", "-O", "^has_journal"]);
    let n_ext = 11_000u64;
    let (a, c) = {
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let a = fs.create(2, b"a", 0o644, 0, 0).unwrap().ino;
        let b = fs.create(2, b"b", 0o644, 0, 0).unwrap().ino;
        for k in 0..n_ext {
            fs.write(a, 2 * k * 1024, &[1u8; 1024]).unwrap();
            fs.write(b, k * 1024, &[2u8; 1024]).unwrap();
        }
        assert_eq!(fs.ext_list(a).unwrap().len() as u64, n_ext);
        // Fill what is left, then give back 250 blocks.
        let c = fs.create(2, b"c", 0o644, 0, 0).unwrap().ino;
        let mut size = 0u64;
        while let Ok(n) = fs.write(c, size, &[3u8; 16 << 10]) {
            size += n as u64;
            if n < 16 << 10 {
                break;
            }
        }
        let free = fs.statfs().blocks_free;
        fs.truncate(c, size - (250 - free.min(250)) * 1024).unwrap();
        fs.unmount().unwrap();
        (a, c)
    };
    let fs = open_buffered(&img);
    assert!(
        fs.statfs().blocks_free <= 280,
        "{}",
        fs.statfs().blocks_free
    );
    let mut accepted = Vec::new();
    for leaf in 0..n_ext / 84 {
        let lblk = 2 * (84 * leaf + 40) + 1;
        match fs.write(a, lblk * 1024, &[9u8; 1024]) {
            Ok(_) => accepted.push(lblk),
            Err(uext4::Error::NoSpace) => {}
            Err(e) => panic!("page {lblk}: {e}"),
        }
    }
    assert!(
        accepted.len() > 10,
        "only {} pages accepted",
        accepted.len()
    );
    fs.sync()
        .unwrap_or_else(|e| panic!("sync after {} accepted pages: {e}", accepted.len()));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let mut got = [0u8; 1024];
    for &lblk in &accepted {
        fs.read(a, lblk * 1024, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 9), "page {lblk}");
    }
    assert!(fs.getattr(c).unwrap().size > 0);
}

/// The same for block-mapped files (ext3): pages far apart each need an indirect block of
/// their own, and a double indirect one past the first 268 blocks.
#[test]
fn buffered_writes_leave_room_for_indirect_blocks() {
    let img = scratch("bufind");
    mke2fs(
        &img.0,
        "8M",
        &["-b", "1024", "-N", "1024", "-O", "^extent,^64bit"],
    );
    let fs = open_buffered(&img);
    let bs = 1024u64;
    let at = |k: u64| (12 + k * 300) * bs;
    let page = |i: u32, k: u64| vec![(i as u64 * 7 + k + 1) as u8; bs as usize];
    let files = fill_sparse_and_fsync(&fs, 1000, |i, f, k| fs.write(f, at(k), &page(i, k)));
    unmount_and_check(&img, fs, &files, at, page);
}

/// Unmounts, checks the image, and reads back file i's `n` blocks at every other block.
fn unmount_and_check_sparse(img: &Scratch, fs: Arc<Fs>, files: &[(u32, u64)]) {
    let want = |i: u32, k: u64| block(k + i as u64);
    unmount_and_check(img, fs, files, |k| 2 * k * 4096, want);
}

/// Unmounts, checks the image, and reads back what file i's `n` writes put at `at(k)`:
/// `want(i, k)`.
fn unmount_and_check(
    img: &Scratch,
    fs: Arc<Fs>,
    files: &[(u32, u64)],
    at: impl Fn(u64) -> u64,
    want: impl Fn(u32, u64) -> Vec<u8>,
) {
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    for (i, &(f, n)) in files.iter().enumerate() {
        for k in 0..n {
            let want = want(i as u32, k);
            let mut got = vec![0u8; want.len()];
            fs.read(f, at(k), &mut got).unwrap();
            assert!(got == want, "s{i} block {k}");
        }
    }
}

/// Blocks that buffered writes reserved are not given to other allocations: with most of the
/// free space reserved by cached pages, directories are made until ENOSPC, and then every
/// file's writeback still finds its blocks.
#[test]
fn reserved_blocks_are_kept_from_other_allocations() {
    let img = scratch("bufresv");
    mke2fs(&img.0, "16M", &["-b", "4096", "-N", "4096"]);
    let fs = open_buffered(&img);
    let bs = 4096u64;
    // Six sparse blocks per file reserve six data blocks and two tree blocks: stay clear of
    // ENOSPC (whose writeback would map everything and end the reservations).
    let n = (fs.statfs().blocks_free.saturating_sub(200) / 8) as u32;
    assert!(n > 100, "{n}");
    let mut files = Vec::new();
    for i in 0..n {
        let f = fs
            .create(2, format!("s{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        for k in 0..6u64 {
            fs.write(f, 2 * k * bs, &block(k + i as u64))
                .unwrap_or_else(|e| panic!("s{i} block {k}: {e}"));
        }
        files.push((f, 6));
    }
    let mut dirs = 0;
    loop {
        match fs.mkdir(2, format!("d{dirs}").as_bytes(), 0o755, 0, 0) {
            Ok(_) => dirs += 1,
            Err(uext4::Error::NoSpace) => break,
            Err(e) => panic!("mkdir d{dirs}: {e}"),
        }
        assert!(dirs < 4000, "directories never ran out of space");
    }
    assert!(dirs > 0);
    for (i, &(f, _)) in files.iter().enumerate() {
        fs.fsync(f, false)
            .unwrap_or_else(|e| panic!("fsync of s{i} after {dirs} directories: {e}"));
    }
    unmount_and_check_sparse(&img, fs, &files);
}

/// A buffered write that fails part-way (here reading the partly covered block it must merge
/// with) leaves the cache and its space accounting as they were: the pages it had set up were
/// once kept without being counted, and writing them back later wrapped the reservation
/// counter, so every later allocation found no space.
#[test]
fn failed_buffered_write_leaves_the_accounting_whole() {
    let img = scratch("buffail");
    mke2fs(&img.0, "16M", &["-b", "4096"]);
    let (dev, fs) = open_faulty(&img.0, true);
    let bs = 4096usize;
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, bs as u64, &vec![5u8; 2 * bs]).unwrap();
    fs.fsync(f, false).unwrap();
    let free = fs.statfs().blocks_free;
    // Block 0 is a hole (a new page), block 1 is on disk and only partly covered (read first).
    dev.fail(FAIL_READS);
    assert!(fs.write(f, 0, &vec![9u8; bs + 100]).is_err());
    dev.fail(FAIL_NONE);
    fs.fsync(f, false).unwrap();
    let after = fs.statfs();
    assert!(
        after.blocks_free <= after.blocks && after.blocks_free + 8 >= free,
        "free blocks {free} before, {} after",
        after.blocks_free
    );
    fs.mkdir(2, b"d", 0o755, 0, 0)
        .expect("allocations after the failed write find space");
    fs.write(f, 0, &vec![9u8; bs + 100]).unwrap();
    fs.fsync(f, false).unwrap();
    let mut got = vec![0u8; 3 * bs];
    fs.read(f, 0, &mut got).unwrap();
    assert!(got[..bs + 100].iter().all(|&b| b == 9));
    assert!(got[bs + 100..].iter().all(|&b| b == 5));
    fs.unmount().unwrap();
    drop(fs);
    drop(dev);
    e2fsck_clean(&img.0);
}

/// While a run of cached pages is written back, the blocks it has been given stop counting as
/// reserved as they are allocated, as the kernel claims a delalloc reservation at allocation:
/// seen from inside the run's data write, the free count has not fallen by the run a second
/// time (it once did, until the run was done, so other allocations and buffered writes near a
/// full filesystem met ENOSPC with space to spare).
#[test]
fn writeback_claims_its_reservation_as_it_allocates() {
    let img = scratch("bufclaim");
    mke2fs(&img.0, "64M", &["-b", "4096"]);
    let (dev, fs) = open_faulty(&img.0, true);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let run = 1024u64;
    fs.write(f, 0, &vec![3u8; (run * 4096) as usize]).unwrap();
    let before = fs.statfs().blocks_free;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let (fs2, seen) = (Arc::downgrade(&fs), seen.clone());
        *dev.on_write.lock().unwrap() = Some(Box::new(move |_, len| {
            if len >= 1 << 20 {
                if let Some(fs) = fs2.upgrade() {
                    seen.lock().unwrap().push(fs.statfs().blocks_free);
                }
            }
        }));
    }
    fs.fsync(f, false).unwrap();
    *dev.on_write.lock().unwrap() = None;
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no data write of the run was seen");
    for s in &seen {
        assert!(
            s + 8 >= before,
            "free blocks {before} before writeback, {s} during its data write"
        );
    }
    // Afterwards: the run's blocks, once; the tree blocks held for the worst case come back.
    let after = fs.statfs().blocks_free;
    assert!(
        after + 8 >= before && after <= before + 64,
        "{before} -> {after}"
    );
    fs.unmount().unwrap();
    drop(fs);
    drop(dev);
    e2fsck_clean(&img.0);
}

/// Pieces of a file allocated out of order (as neighbouring writeback ranges from two threads
/// are) still land physically in file order: each piece aims at its own distance from the
/// extent before it.
#[test]
fn out_of_order_pieces_stay_contiguous() {
    let (img, fs) = open("order");
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let piece = vec![7u8; 1 << 20];
    for i in [0u64, 2, 1, 5, 3, 4] {
        fs.write(f, i << 20, &piece).unwrap();
    }
    let ext = fs.ext_list(f).unwrap();
    let first = ext[0].pblk - ext[0].lblk as u64;
    for e in &ext {
        assert_eq!(
            e.pblk - e.lblk as u64,
            first,
            "not in file order on disk: {ext:?}"
        );
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

/// Space freed by deleting a file on a full filesystem is usable at once, not only after the
/// deleting transaction has been committed and written home: a write, a fallocate, a sync's
/// writeback and a mkdir that need it commit and retry.
#[test]
fn deleted_space_is_usable_at_once() {
    for buffered in [false, true] {
        let img = scratch(if buffered { "full-buf" } else { "full" });
        mke2fs(&img.0, "16M", &[]);
        let fs = Fs::open_path(&img.0, opts::no_timer_buffered(buffered)).unwrap();
        let fill = |name: &[u8]| -> u64 {
            let ino = fs.create(2, name, 0o644, 0, 0).unwrap().ino;
            let chunk = vec![0x33u8; 1 << 20];
            let mut off = 0u64;
            // Until a write fails or is cut short (ENOSPC part-way).
            while let Ok(n) = fs.write(ino, off, &chunk) {
                off += n as u64;
                if n < chunk.len() {
                    break;
                }
            }
            fs.fsync(ino, false).unwrap_or(());
            off
        };
        let filled = fill(b"a");
        assert!(filled >= 8 << 20, "filled only {filled} bytes");
        fs.unlink(2, b"a").unwrap();
        // The unlink is not committed yet; its blocks must still serve the next writer.
        let b = fs.create(2, b"b", 0o644, 0, 0).unwrap().ino;
        let data = vec![0x44u8; filled as usize];
        fs.write(b, 0, &data).unwrap();
        fs.fsync(b, false).unwrap();
        let mut back = vec![0u8; filled as usize];
        assert_eq!(fs.read(b, 0, &mut back).unwrap(), filled as usize);
        assert!(back == data, "b reads back other bytes");
        fs.unlink(2, b"b").unwrap();
        let c = fs.create(2, b"c", 0o644, 0, 0).unwrap().ino;
        fs.fallocate(c, 0, 0, filled).unwrap();
        fs.unlink(2, b"c").unwrap();
        // sync writes back buffered pages of every file: it too waits for the freed blocks.
        let e = fs.create(2, b"e", 0o644, 0, 0).unwrap().ino;
        fs.write(e, 0, &data).unwrap();
        fs.sync().unwrap();
        fs.unlink(2, b"e").unwrap();
        fs.mkdir(2, b"d", 0o755, 0, 0).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img.0);
    }
}

/// `debugfs -R "ex PATH"`: each extent's first and last logical block and whether it is
/// unwritten.
fn debugfs_ex(img: &std::path::Path, path: &str) -> Vec<(u64, u64, bool)> {
    debugfs(img, &format!("ex {path}"))
        .lines()
        .skip(1)
        .filter_map(|l| {
            // " 0/ 0   1/  2     0 -  8191  16385 -  24576   8192 Uninit"
            let t: Vec<&str> = l.split_whitespace().collect();
            let dash = t.iter().position(|&s| s == "-")?;
            let first = t.get(dash - 1)?.parse().ok()?;
            let last = t.get(dash + 1)?.parse().ok()?;
            Some((first, last, l.trim_end().ends_with("Uninit")))
        })
        .collect()
}

/// fallocate on an image on tmpfs (pread/pwrite or mapped): the blocks it allocates inside the
/// file's size are zeroed (a punched hole in the image) and mapped written, so a write into
/// them is an overwrite and starts no handle; blocks past the size (KEEP_SIZE) stay unwritten.
/// The blocks are reused ones full of another file's bytes, which must never show. With
/// `prealloc_zeroed` off: unwritten extents, read as zeros without the device, and a write
/// into them converts in a handle of its own. e2fsck and the kernel agree with the result.
#[test]
fn fallocate_zeroes_on_tmpfs_or_maps_unwritten() {
    for (map_tmpfs, zeroed, bs) in [
        (false, true, "1024"),
        (true, true, "1024"),
        (true, true, "4096"),
        (false, false, "4096"),
    ] {
        let img = scratch(&format!("prealloc-{map_tmpfs}-{zeroed}-{bs}"));
        mke2fs(&img.0, "16M", &["-b", bs]);
        let on_tmpfs = uext4::blockdev::is_tmpfs(&std::fs::File::open(&img.0).unwrap());
        if zeroed && !on_tmpfs {
            eprintln!(
                "SKIP: {} is not on tmpfs: no zeroed preallocation here",
                img.0.display()
            );
        }
        let zeroed = zeroed && on_tmpfs;
        let fs = Fs::open_path(
            &img.0,
            MountOptions {
                map_tmpfs,
                prealloc_zeroed: zeroed,
                ..opts::no_timer()
            },
        )
        .unwrap();
        // Fill the filesystem with 0x5A, then free it all: fallocate must reuse these blocks.
        let a = fs.create(2, b"a", 0o644, 0, 0).unwrap().ino;
        let chunk = vec![0x5Au8; 1 << 20];
        let mut filled = 0u64;
        while let Ok(n) = fs.write(a, filled, &chunk) {
            filled += n as u64;
            if n < chunk.len() {
                break;
            }
        }
        fs.fsync(a, false).unwrap();
        fs.unlink(2, b"a").unwrap();
        fs.fsync(2, false).unwrap();
        let len = filled / 2;
        let c = fs.create(2, b"c", 0o644, 0, 0).unwrap().ino;
        fs.fallocate(c, 0, 0, len).unwrap();
        // 1 MiB more past the size.
        fs.fallocate(c, 0x01, len, 1 << 20).unwrap();
        let r0 = fs.io_counters().bytes_read.load(Ordering::Relaxed);
        let mut back = vec![0xFFu8; len as usize];
        assert_eq!(fs.read(c, 0, &mut back).unwrap(), len as usize);
        assert!(
            back.iter().all(|&b| b == 0),
            "preallocated space shows old bytes"
        );
        if !zeroed {
            assert_eq!(
                fs.io_counters().bytes_read.load(Ordering::Relaxed),
                r0,
                "unwritten extents read without the device"
            );
        }
        let h0 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
        fs.write(c, 4096, &[7u8; 8192]).unwrap();
        let h1 = fs.txn_stats().handles_started.load(Ordering::Relaxed);
        if zeroed {
            assert_eq!(h1, h0, "a write into zeroed preallocation is an overwrite");
        } else {
            assert!(h1 > h0, "a write into unwritten extents converts them");
        }
        back[4096..12288].fill(7);
        let mut again = vec![0xFFu8; len as usize];
        fs.read(c, 0, &mut again).unwrap();
        assert!(again == back);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let bsz: u64 = bs.parse().unwrap();
        let size_blocks = len.div_ceil(bsz);
        let ex = debugfs_ex(&img.0, "c");
        assert!(!ex.is_empty(), "no extents listed for c");
        let covered: u64 = ex.iter().map(|e| e.1 - e.0 + 1).sum();
        assert_eq!(covered, size_blocks + (1 << 20) / bsz, "{ex:?}");
        for &(first, last, uninit) in &ex {
            if first >= size_blocks {
                assert!(uninit, "blocks past the size must stay unwritten: {ex:?}");
            } else if zeroed {
                assert!(!uninit && last < size_blocks, "{ex:?}");
            } else {
                let written = (4096 / bsz)..(12288 / bsz);
                assert_eq!(
                    !uninit,
                    written.contains(&first),
                    "only the written 8 KiB converted: {ex:?}"
                );
            }
        }
        if can_loop_mount() {
            let k = KernelMount::new(&img.0);
            let kb = std::fs::read(k.dir.join("c")).unwrap();
            assert!(kb == back, "the kernel reads other bytes");
        }
    }
}

/// Operations whose metadata would not fit the log in one transaction: on 300 MiB of 1 KiB
/// blocks in groups of 256 (some 1,200 groups) with the smallest journal (1,024 blocks), a
/// 280 MiB preallocation, a truncate, a punched hole, an unlink, the last close of an
/// unlinked file and a rename over a file each touch a bitmap in every group. Each goes
/// through the journal in transactions that fit it: none is written home without it (the
/// allocator's search built and dirtied the bitmap of every unused group it looked at, and
/// each removal was one handle, some 1,200 blocks; both were written home unjournaled).
#[test]
fn operations_larger_than_the_log_stay_journaled() {
    let (img, fs) = open_made(
        "biglog",
        "300M",
        &["-b", "1024", "-g", "256", "-N", "4096", "-J", "size=1"],
    );
    let unjournaled = || fs.txn_stats().unjournaled_commits.load(Ordering::Relaxed);
    let free0 = fs.statfs().blocks_free;
    const BIG: u64 = 280 << 20;
    let big = |name: &[u8]| {
        let ino = fs.create(2, name, 0o644, 0, 0).unwrap().ino;
        fs.fallocate(ino, 0, 0, BIG).unwrap();
        fs.write(ino, BIG - 5000, &[7u8; 5000]).unwrap();
        fs.fsync(ino, false).unwrap();
        assert_eq!(unjournaled(), 0, "the preallocation bypassed the journal");
        ino
    };
    // Truncate to the middle, then punch most of what is left.
    let f = big(b"f");
    fs.write(f, 0, &[1u8; 10_000]).unwrap();
    fs.truncate(f, 100 << 20).unwrap();
    fs.fallocate(f, 0x3, 8192, (100 << 20) - 16384).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(
        unjournaled(),
        0,
        "the truncate or the punch bypassed the journal"
    );
    let mut head = vec![0u8; 10_000];
    assert_eq!(fs.read(f, 0, &mut head).unwrap(), 10_000);
    assert_eq!(&head[..8192], &[1u8; 8192][..]);
    assert!(head[8192..].iter().all(|&b| b == 0), "the hole reads zeros");
    assert_eq!(fs.getattr(f).unwrap().size, 100 << 20);
    fs.truncate(f, 0).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(unjournaled(), 0, "the truncate to 0 bypassed the journal");
    // Unlink, last close of an unlinked file, rename over a file.
    big(b"g");
    fs.unlink(2, b"g").unwrap();
    let o = big(b"o");
    fs.open(o).unwrap();
    fs.unlink(2, b"o").unwrap();
    assert!(
        fs.statfs().blocks_free < free0 - (BIG >> 10),
        "freed while open"
    );
    fs.release(o).unwrap();
    big(b"t");
    let s = fs.create(2, b"s", 0o644, 0, 0).unwrap().ino;
    fs.write(s, 0, b"small").unwrap();
    fs.rename(2, b"s", 2, b"t", uext4::RenameFlags::default())
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(unjournaled(), 0, "a removal bypassed the journal");
    let held = free0 - fs.statfs().blocks_free;
    assert!(held < 100, "{held} blocks still held after the removals");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// An unlinked file that nobody has open is freed in pieces when it is too large for one
/// handle, from its end down. Meanwhile it cannot be opened (by a stale inode number, as the
/// library and FUSE's lookup races allow): such an open fails as for a deleted file. (It
/// succeeded, and the file, kept as an orphan for its opener, read zeros where the pieces
/// already freed had been.) The open is tried from inside the deletion's device writes.
#[test]
fn a_file_being_freed_in_pieces_cannot_be_opened() {
    let img = scratch("dying");
    mke2fs(
        &img.0,
        "300M",
        &["-b", "1024", "-g", "256", "-N", "4096", "-J", "size=1"],
    );
    let (dev, fs) = open_faulty(&img.0, false);
    const SIZE: u64 = 200 << 20;
    let ino = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(ino, 0, 0, SIZE).unwrap();
    fs.write(ino, SIZE - 4096, &[0x5au8; 4096]).unwrap();
    fs.fsync(ino, false).unwrap();
    let tries = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let opened = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (fs, tries, opened) = (fs.clone(), tries.clone(), opened.clone());
        *dev.on_write.lock().unwrap() = Some(Box::new(move |_, _| {
            tries.fetch_add(1, Ordering::Relaxed);
            // No release here: the deleting thread holds the file's io_lock.
            if fs.open(ino).is_ok() {
                opened.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let c0 = fs.txn_stats().commits.load(Ordering::Relaxed);
    fs.unlink(2, b"f").unwrap();
    *dev.on_write.lock().unwrap() = None;
    assert!(
        fs.txn_stats().commits.load(Ordering::Relaxed) - c0 >= 2,
        "the file was not freed in pieces"
    );
    assert!(
        tries.load(Ordering::Relaxed) > 0,
        "no device write during the deletion"
    );
    assert_eq!(
        opened.load(Ordering::Relaxed),
        0,
        "the file was opened while being freed"
    );
    assert!(matches!(fs.open(ino), Err(uext4::Error::NotFound)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// An extent that needs a new tree block (here the fifth extent of a file, which grows the
/// tree a level) on a filesystem with one free block left: the data block is allocated, the
/// tree block is not, and the write fails with ENOSPC leaving the file as it was. Its extent
/// cache must not keep the extent the tree never got: it did, so a later write of the same
/// block took the overwrite path into the freed block, reported success, and the data was
/// lost on disk (a hole; in buffered mode near a full filesystem, holes in files that fsync
/// had acknowledged).
#[test]
fn an_extent_the_tree_cannot_take_leaves_nothing_behind() {
    let (img, fs) = open_made("treefull", "8M", &["-b", "1024", "-N", "64"]);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    // Four one-block extents fill the root (depth 0, four entries).
    for l in [0u64, 2, 4, 6] {
        fs.write(f, l * 1024, &[l as u8 + 1; 1024]).unwrap();
    }
    assert_eq!(fs.ext_list(f).unwrap().len(), 4);
    assert_eq!(fs.ext_tree_depth(f).unwrap(), 0);
    // Fill the filesystem to one free block.
    let g = fs.create(2, b"fill", 0o644, 0, 0).unwrap().ino;
    let free = fs.statfs().blocks_free;
    fs.fallocate(g, 0, 0, (free - 64) * 1024).unwrap();
    let mut n = 0u64;
    while fs.statfs().blocks_free > 1 {
        let h = fs
            .create(2, format!("h{n}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        while fs.statfs().blocks_free > 1 && fs.getattr(h).unwrap().size < 4 * 1024 {
            let size = fs.getattr(h).unwrap().size;
            fs.write(h, size, &[9u8; 1024]).unwrap();
        }
        n += 1;
    }
    assert_eq!(fs.statfs().blocks_free, 1);
    let e = fs.write(f, 8 * 1024, &[42u8; 1024]).unwrap_err();
    assert!(matches!(e, uext4::Error::NoSpace), "{e}");
    assert_eq!(
        fs.ext_list(f).unwrap().len(),
        4,
        "the failed extent stayed cached"
    );
    assert_eq!(fs.statfs().blocks_free, 1, "the failed write kept blocks");
    // With room again, the same write lands in the tree.
    fs.unlink(2, b"fill").unwrap();
    fs.write(f, 8 * 1024, &[42u8; 1024]).unwrap();
    fs.fsync(f, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let mut buf = vec![0u8; 1024];
    fs.read(f, 8 * 1024, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 42),
        "the rewritten block is not on disk"
    );
    assert_eq!(fs.ext_list(f).unwrap().len(), 5);
    assert_eq!(fs.ext_tree_depth(f).unwrap(), 1);
}

/// A write larger than the space left writes what fits and returns that count, as the
/// kernel's pwrite does; the size covers exactly what it reported (it grew by the whole
/// request before, while the write failed with ENOSPC, so a program saw a longer file than
/// it was told it had written). The next write reports the error.
#[test]
fn a_write_cut_short_by_enospc_returns_what_it_wrote() {
    let (img, fs) = open_made("short", "16M", &["-b", "4096"]);
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let chunk: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut off = 0u64;
    let mut short = None;
    loop {
        match fs.write(f, off, &chunk) {
            Ok(n) if n == chunk.len() => off += n as u64,
            Ok(n) => {
                short = Some(n);
                off += n as u64;
            }
            Err(uext4::Error::NoSpace) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    let n = short.expect("no write was cut short");
    assert!(n > 0 && n < chunk.len());
    assert_eq!(
        fs.getattr(f).unwrap().size,
        off,
        "the size is not what the writes reported"
    );
    let mut back = vec![0u8; n];
    fs.read(f, off - n as u64, &mut back).unwrap();
    assert!(back == chunk[..n], "the short write's data differs");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// In buffered mode a file's cached data counts in st_blocks before it is written back, as
/// the kernel's ext4 counts delayed allocations (`tar --sparse` and cp judge a file sparse by
/// st_blocks: a fresh file of 0 blocks was archived as empty), and not twice after.
#[test]
fn buffered_data_counts_in_blocks_before_writeback() {
    let img = scratch("bufblocks");
    mke2fs(&img.0, "64M", &[]);
    let fs = open_buffered(&img);
    let f = fs.create(2, b"fresh", 0o644, 0, 0).unwrap().ino;
    fs.write_all(f, 0, &vec![3u8; 1_000_000]).unwrap();
    let cached = fs.getattr(f).unwrap().blocks;
    // 245 blocks of 4 KiB.
    assert_eq!(cached, 245 * 8, "cached data counted in st_blocks");
    fs.fsync(f, false).unwrap();
    let written = fs.getattr(f).unwrap().blocks;
    assert!(
        (245 * 8..=246 * 8).contains(&written),
        "after writeback: {written} sectors (data, perhaps no extent block)"
    );
    // An overwrite of written blocks reserves nothing more.
    fs.write_all(f, 0, &[4u8; 8192]).unwrap();
    assert_eq!(fs.getattr(f).unwrap().blocks, written);
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}
