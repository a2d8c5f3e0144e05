//! uext4's own mkfs: every supported configuration passes `e2fsck -fn`, opens in uext4, and
//! mounts under the kernel, which can then fill it (and e2fsck still passes).

mod common;

use common::*;
use std::path::Path;
use uext4::blockdev::FileDevice;
use uext4::mkfs::{mkfs, MkfsOptions};
use uext4::{Fs, MountOptions};

fn make(path: &Path, size: u64, bs: u32, features: &str) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let dev = FileDevice::open(path, false).unwrap();
    let mut o = MkfsOptions::default_for(size);
    o.block_size = bs;
    o.assume_zeroed = true;
    o.features.apply(features).unwrap();
    mkfs(&dev, &o).unwrap();
}

#[test]
fn configurations_pass_e2fsck_and_open() {
    let cases: &[(u64, u32, &str)] = &[
        (8 << 20, 1024, ""),
        (64 << 20, 4096, ""),
        (64 << 20, 1024, "^metadata_csum"),
        (600 << 20, 4096, ""),
        (600 << 20, 1024, "^64bit"),
        (100 << 20, 4096, "metadata_csum_seed"),
        (1 << 30, 4096, "^64bit,^metadata_csum"),
        (5 << 30, 4096, ""),
        (5 << 30, 4096, "^flex_bg"),
    ];
    for &(size, bs, feat) in cases {
        let img = scratch("mkfs");
        make(&img.0, size, bs, feat);
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::default())
            .unwrap_or_else(|e| panic!("{size} {bs} {feat}: {e}"));
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 100_000]).unwrap();
        fs.unmount().unwrap();
        e2fsck_clean(&img.0);
    }
}

#[test]
fn kernel_mounts_and_fills_our_image() {
    if !can_loop_mount() {
        return;
    }
    for (bs, feat) in [(4096u32, ""), (1024, "^metadata_csum")] {
        let img = scratch("mkfs-k");
        make(&img.0, 600 << 20, bs, feat);
        {
            let m = KernelMount::new(&img.0);
            sh(&format!(
                "set -e; cd {}; mkdir big; for i in $(seq 1 10000); do : > big/f$i; done; \
                 dd if=/dev/urandom of=data bs=1M count=20 status=none; test $(ls big | wc -l) = 10000",
                m.dir.display()
            ));
        }
        e2fsck_clean(&img.0);
    }
}
