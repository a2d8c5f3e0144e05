//! The data-path rules, by counting: overwrites start no journal handle (R1), full-block writes
//! zero nothing and partial ones zero only the uncovered part (R3), fdatasync after a
//! timestamp-only change does not commit, and readers and overwriters of one file run together.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uext4::{Fs, MountOptions};

fn open(tag: &str) -> (Scratch, Arc<Fs>) {
    let img = scratch(tag);
    mke2fs(&img.0, "128M", &[]);
    let fs = Fs::open_path(
        &img.0,
        MountOptions {
            commit_interval_secs: 0,
            ..Default::default()
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
/// clean image.
#[test]
fn dax_mapped_image_roundtrip() {
    for nt in [false, true] {
        let img = scratch("dax");
        mke2fs(&img.0, "64M", &[]);
        let opts = MountOptions {
            dax: true,
            dax_non_temporal: nt,
            commit_interval_secs: 0,
            ..Default::default()
        };
        let fs = Fs::open_path(&img.0, opts.clone()).unwrap();
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        fs.write(f, 0, &data).unwrap();
        fs.write(f, 12345, &[7u8; 100_000]).unwrap();
        fs.fsync(f, false).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(
            &img.0,
            MountOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(fs.read(f, 0, &mut back).unwrap(), data.len());
        let mut want = data.clone();
        want[12345..112345].fill(7);
        assert!(back == want, "DAX (non-temporal: {nt}) content differs");
    }
}
