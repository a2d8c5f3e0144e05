//! bigalloc filesystems (allocation in clusters) the kernel filled read back equal through
//! uext4: file contents (small, cluster-sized, sparse, large), directories, symlinks and
//! attributes, and statfs's block counts equal to the kernel's (free space counted in
//! clusters on disk). uext4 does not allocate in clusters, so they open read-only with a reason
//! that says so, and every change is refused. Kernel parts need root and loop devices and
//! skip with a message otherwise.

mod common;

use common::*;
use uext4::{Error, Fs, MountOptions};

/// The kernel's statfs of a mount: (block size, blocks, free blocks, inodes, free inodes).
fn kernel_statfs(dir: &std::path::Path) -> (u64, u64, u64, u64, u64) {
    let out = sh(&format!("stat -f -c '%S %b %f %c %d' {}", dir.display()));
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1], v[2], v[3], v[4])
}

fn lookup(fs: &Fs, path: &str) -> u32 {
    path.split('/')
        .filter(|c| !c.is_empty())
        .fold(2, |ino, c| fs.lookup(ino, c.as_bytes()).unwrap().ino)
}

/// Files of every shape in clusters of 2 to 16 blocks, on 1 KiB and 4 KiB blocks.
#[test]
fn kernel_filled_bigalloc_reads_equal() {
    if !can_loop_mount() {
        return;
    }
    for (tag, bs, cluster) in [
        ("c1k16", "1024", "16384"),
        ("c4k4", "4096", "16384"),
        ("c4k2", "4096", "8192"),
        ("c4k16", "4096", "65536"),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "128M", &["-b", bs, "-O", "bigalloc", "-C", cluster]);
        let files: Vec<(String, Vec<u8>)> = (0..12u64)
            .map(|i| {
                let n = [
                    1, 100, 1023, 1024, 4096, 8191, 8192, 16385, 65536, 70_000, 300_000, 2_500_000,
                ][i as usize];
                let mut r = xorshift(i + 7);
                (
                    format!("d{}/f{i}", i % 3),
                    (0..n).map(|_| r() as u8).collect(),
                )
            })
            .collect();
        let (kstat, sparse) = {
            let m = KernelMount::new(&img.0);
            for d in 0..3 {
                std::fs::create_dir(m.dir.join(format!("d{d}"))).unwrap();
            }
            for (p, data) in &files {
                std::fs::write(m.dir.join(p), data).unwrap();
            }
            // Sparse: blocks in the middle of clusters, holes between; then a punched hole and
            // a truncate inside a cluster.
            sh(&format!(
                "set -e; cd {}; dd if=/dev/urandom of=sparse bs=1000 seek=3 count=5 2>/dev/null; \
                 dd if=/dev/urandom of=sparse bs=1000 seek=200 count=7 conv=notrunc 2>/dev/null; \
                 dd if=/dev/urandom of=sparse bs=1000 seek=5000 count=1 conv=notrunc 2>/dev/null; \
                 fallocate -p -o 3500 -l 2000 sparse; truncate -s 204500 sparse; \
                 ln -s d1/f4 link; ln -s $(head -c 300 /dev/zero | tr '\\0' x) longlink; \
                 setfattr -n user.a -v hello d0/f0; sync",
                m.dir.display()
            ));
            let sparse = std::fs::read(m.dir.join("sparse")).unwrap();
            (kernel_statfs(&m.dir), sparse)
        };
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let why = fs.read_only_reason().unwrap_or_default().to_string();
        assert!(
            fs.is_read_only() && why.contains("bigalloc") && why.contains("clusters"),
            "{tag}: {why}"
        );
        for (p, data) in &files {
            assert!(read_all(&fs, lookup(&fs, p)) == *data, "{tag}: {p}");
        }
        assert!(
            read_all(&fs, lookup(&fs, "sparse")) == sparse,
            "{tag}: sparse"
        );
        assert_eq!(fs.readlink(lookup(&fs, "link")).unwrap(), b"d1/f4");
        assert_eq!(
            fs.readlink(lookup(&fs, "longlink")).unwrap(),
            vec![b'x'; 300]
        );
        assert_eq!(
            fs.getxattr(lookup(&fs, "d0/f0"), b"user.a").unwrap(),
            b"hello"
        );
        let s = fs.statfs();
        assert_eq!(
            (
                s.block_size as u64,
                s.blocks,
                s.blocks_free,
                s.files,
                s.files_free
            ),
            kstat,
            "{tag}: statfs (blocks, free, inodes, free inodes) against the kernel's"
        );
        assert!(matches!(
            fs.mkdir(2, b"new", 0o755, 0, 0),
            Err(Error::ReadOnly(_))
        ));
        drop(fs);
        e2fsck_clean_when(&img.0, &format!("{tag}: after uext4 read it"));
    }
}
