//! FITRIM (`Fs::trim`, trim.rs): free blocks become holes in the image file (mapped on tmpfs,
//! and with pread/pwrite), blocks freed by a transaction not yet home are left alone, files
//! read back whole, and the image passes `e2fsck -fn`.

mod common;

use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use uext4::{Fs, MountOptions};

/// Bytes the host has allocated for the image file.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

fn trim_gives_free_blocks_back(opts: MountOptions) {
    let img = scratch("trim");
    mke2fs(&img.0, "128M", &[]);
    let fs = Fs::open_path(&img.0, opts.clone()).unwrap();
    let keep = fs.create(2, b"keep", 0o644, 0, 0).unwrap().ino;
    let gone = fs.create(2, b"gone", 0o644, 0, 0).unwrap().ino;
    fs.write(keep, 0, &pattern(8 << 20, 1)).unwrap();
    fs.write(gone, 0, &pattern(32 << 20, 2)).unwrap();
    fs.sync().unwrap();
    let full = allocated(&img.0);
    assert!(full >= 40 << 20, "the files' data is not in the image");

    // Freed by a transaction that is not home yet: a crash could give the blocks back to
    // the file, so they keep their contents.
    fs.unlink(2, b"gone").unwrap();
    let t = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(t.supported);
    assert!(
        allocated(&img.0) + (1 << 20) >= full,
        "blocks of an uncommitted unlink were discarded ({} -> {})",
        full,
        allocated(&img.0)
    );

    fs.sync().unwrap();
    let t = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(t.bytes >= 32 << 20, "trimmed only {} bytes", t.bytes);
    let after = allocated(&img.0);
    assert!(
        after + (30 << 20) <= full,
        "the image did not shrink: {full} -> {after}"
    );
    // A minimum longer than any free run trims nothing.
    assert_eq!(fs.trim(0, u64::MAX, 1 << 40).unwrap().bytes, 0);

    // New data lands in trimmed blocks and reads back; the kept file is whole.
    let again = fs.create(2, b"again", 0o644, 0, 0).unwrap().ino;
    fs.write(again, 0, &pattern(16 << 20, 3)).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, opts).unwrap();
    for (name, len, seed) in [(&b"keep"[..], 8 << 20, 1), (b"again", 16 << 20, 3)] {
        let ino = fs.lookup(2, name).unwrap().ino;
        let mut back = vec![0u8; len];
        assert_eq!(fs.read(ino, 0, &mut back).unwrap(), len);
        assert!(
            back == pattern(len, seed),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

#[test]
fn trim_on_a_mapped_image() {
    trim_gives_free_blocks_back(MountOptions::default());
}

#[test]
fn trim_with_pread_and_pwrite() {
    trim_gives_free_blocks_back(MountOptions {
        map_tmpfs: false,
        ..MountOptions::default()
    });
}

#[test]
fn trim_of_a_range_and_on_a_read_only_filesystem() {
    let img = scratch("trim-range");
    mke2fs(&img.0, "64M", &["-b", "1024"]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    // 1 KiB blocks: the range is in bytes; only the first 8 MiB is looked at.
    let t = fs.trim(0, 8 << 20, 0).unwrap();
    assert!(t.bytes > 0 && t.bytes <= 8 << 20, "{t:?}");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let ro = Fs::open_path(
        &img.0,
        MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let e = ro.trim(0, u64::MAX, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
}
