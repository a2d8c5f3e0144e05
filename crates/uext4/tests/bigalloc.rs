//! bigalloc filesystems (allocation in clusters) the kernel filled read back equal through
//! uext4: file contents (small, cluster-sized, sparse, large), directories, symlinks and
//! attributes, and statfs's block counts equal to the kernel's (free space counted in
//! clusters on disk). And uext4 writes them as the kernel does: whole clusters allocated,
//! blocks of one logical cluster in one physical cluster, partial clusters kept at truncate
//! and punch, i_blocks and free counts in clusters (e2fsck after each round of changes, free
//! counts and file contents against the kernel's). Kernel parts need root and loop devices
//! and skip with a message otherwise.

mod common;

use common::*;
use uext4::{Fs, MountOptions, XattrFlags};

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
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
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
        drop(fs);
        e2fsck_clean_when(&img.0, &format!("{tag}: after uext4 read it"));
    }
}

/// One change, made the same way through uext4 and through the kernel.
#[derive(Clone, Debug)]
enum Op {
    Mkdir(&'static str),
    /// Writes `len` bytes (from `seed`) at `off`, creating the file.
    Write(&'static str, u64, u64, u64),
    Truncate(&'static str, u64),
    /// Punches a hole (KEEP_SIZE).
    Punch(&'static str, u64, u64),
    /// Preallocates (KEEP_SIZE).
    Falloc(&'static str, u64, u64),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Symlink(&'static str, usize),
    /// Sets `user.big` to `len` bytes, too large for the inode (an xattr block).
    Xattr(&'static str, usize),
    RemoveXattr(&'static str),
}

fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut r = xorshift(seed + 1);
    (0..len).map(|_| r() as u8).collect()
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn apply_uext4(fs: &Fs, op: &Op) {
    let dir_of = |p: &str| lookup(fs, split(p).0);
    let name = |p: &'static str| split(p).1.as_bytes();
    match *op {
        Op::Mkdir(p) => drop(fs.mkdir(dir_of(p), name(p), 0o755, 0, 0).unwrap()),
        Op::Write(p, off, len, seed) => {
            let ino = match fs.lookup(dir_of(p), name(p)) {
                Ok(a) => a.ino,
                Err(_) => fs.create(dir_of(p), name(p), 0o644, 0, 0).unwrap().ino,
            };
            assert_eq!(fs.write(ino, off, &bytes(seed, len)).unwrap(), len as usize);
        }
        Op::Truncate(p, size) => fs.truncate(lookup(fs, p), size).unwrap(),
        Op::Punch(p, off, len) => fs.fallocate(lookup(fs, p), 3, off, len).unwrap(),
        Op::Falloc(p, off, len) => fs.fallocate(lookup(fs, p), 1, off, len).unwrap(),
        Op::Unlink(p) => fs.unlink(dir_of(p), name(p)).unwrap(),
        Op::Rmdir(p) => fs.rmdir(dir_of(p), name(p)).unwrap(),
        Op::Rename(a, b) => fs
            .rename(dir_of(a), name(a), dir_of(b), name(b), Default::default())
            .unwrap(),
        Op::Symlink(p, n) => drop(
            fs.symlink(dir_of(p), name(p), &vec![b'x'; n], 0, 0)
                .unwrap(),
        ),
        Op::Xattr(p, n) => fs
            .setxattr(
                lookup(fs, p),
                b"user.big",
                &bytes(n as u64, n as u64),
                XattrFlags::Any,
            )
            .unwrap(),
        Op::RemoveXattr(p) => fs.removexattr(lookup(fs, p), b"user.big").unwrap(),
    }
}

fn apply_kernel(root: &std::path::Path, op: &Op) {
    use std::io::{Seek, Write};
    let at = |p: &str| root.join(p);
    match *op {
        Op::Mkdir(p) => std::fs::create_dir(at(p)).unwrap(),
        Op::Write(p, off, len, seed) => {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(at(p))
                .unwrap();
            f.seek(std::io::SeekFrom::Start(off)).unwrap();
            f.write_all(&bytes(seed, len)).unwrap();
        }
        Op::Truncate(p, size) => {
            let f = std::fs::OpenOptions::new().write(true).open(at(p)).unwrap();
            f.set_len(size).unwrap();
        }
        Op::Punch(p, off, len) => drop(sh(&format!(
            "fallocate -p -o {off} -l {len} {}",
            at(p).display()
        ))),
        Op::Falloc(p, off, len) => drop(sh(&format!(
            "fallocate -n -o {off} -l {len} {}",
            at(p).display()
        ))),
        Op::Unlink(p) => std::fs::remove_file(at(p)).unwrap(),
        Op::Rmdir(p) => std::fs::remove_dir(at(p)).unwrap(),
        Op::Rename(a, b) => std::fs::rename(at(a), at(b)).unwrap(),
        Op::Symlink(p, n) => {
            std::os::unix::fs::symlink("x".repeat(n), at(p)).unwrap();
        }
        Op::Xattr(p, n) => assert!(set_xattr(&at(p), "user.big", &bytes(n as u64, n as u64))),
        Op::RemoveXattr(p) => drop(sh(&format!("setfattr -x user.big {}", at(p).display()))),
    }
}

/// The changes, in three rounds (e2fsck after each): making things (files of every shape,
/// writes into the middle of clusters, appends into a partly used cluster, holes, a
/// directory of several blocks, an extent tree of two levels, symlinks, xattr blocks); then
/// cutting them (truncates into a cluster, punched holes, preallocation); then removing
/// them (unlink, rmdir, rename over a file, xattrs removed).
fn rounds(bs: u64) -> Vec<Vec<Op>> {
    let mut make = vec![
        Op::Mkdir("d"),
        Op::Mkdir("d/e"),
        Op::Write("d/one", 0, 1, 1),
        Op::Write("d/mid", 0, 5000, 2),
        Op::Write("d/big", 0, 300_000, 3),
        Op::Write("sparse", 3 * bs + 17, 100, 4),
        Op::Write("sparse", bs, 10, 5),
        Op::Write("sparse", 1000 * bs, 2 * bs, 6),
        Op::Write("sparse", 2 * bs, 3, 7),
        Op::Write("append", 0, 100, 8),
        Op::Write("append", 100, bs + 5, 9),
        Op::Write("append", 2 * bs + 105, 2 * bs, 10),
        Op::Symlink("d/short", 20),
        Op::Symlink("d/long", 300),
        Op::Xattr("d/mid", bs as usize * 3 / 8),
        Op::Xattr("d/one", bs as usize / 3),
    ];
    // A directory of several blocks.
    let names: &'static [&'static str] = Box::leak(
        (0..120)
            .map(|i| &*Box::leak(format!("d/e/a-rather-long-file-name-{i:04}").into_boxed_str()))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    make.extend(names.iter().map(|n| Op::Write(n, 0, 0, 0)));
    // An extent tree deeper than the inode's four entries: one block in every other
    // 64 KiB, each its own extent.
    make.extend((0..400u64).map(|i| Op::Write("tree", i * 131_072 + bs, 10, 11 + i)));
    let cut = vec![
        Op::Truncate("d/big", 200_000 + 3 * bs / 2),
        Op::Truncate("append", 2 * bs + 1),
        Op::Punch("d/big", 9 * bs + 100, 20 * bs),
        Op::Punch("sparse", bs, 2 * bs),
        Op::Falloc("d/mid", 5 * bs, 40 * bs),
        Op::Write("d/mid", 7 * bs + 9, bs, 12),
        // Cut to leaves that still need an index (the kernel never makes a tree shallower on
        // truncate, where uext4 pulls a lone child into the inode: both are valid, but the
        // free counts would differ by that block).
        Op::Truncate("tree", 380 * 131_072),
        Op::Write("grow", 0, 10, 13),
        Op::Truncate("grow", 50 * bs),
        Op::Write("grow", 40 * bs, 5, 14),
    ];
    let mut remove = vec![
        Op::Rename("d/one", "d/mid"),
        Op::Unlink("sparse"),
        Op::Unlink("d/long"),
        Op::RemoveXattr("d/mid"),
        Op::Unlink("tree"),
    ];
    remove.extend(names.iter().step_by(2).map(|n| Op::Unlink(n)));
    remove.push(Op::Mkdir("gone"));
    remove.push(Op::Write("gone/f", 0, 3 * bs, 15));
    remove.push(Op::Unlink("gone/f"));
    remove.push(Op::Rmdir("gone"));
    vec![make, cut, remove]
}

/// Every regular file and symlink under `root` of a uext4 filesystem, by path.
fn uext4_tree(fs: &Fs, ino: u32, path: &str, out: &mut Vec<(String, Vec<u8>)>) {
    for e in fs.read_dir(ino).unwrap() {
        let name = String::from_utf8(e.name.clone()).unwrap();
        if name == "lost+found" {
            continue;
        }
        let p = format!("{path}{name}");
        let a = fs.getattr(e.ino).unwrap();
        match a.mode & 0o170000 {
            0o040000 => uext4_tree(fs, e.ino, &format!("{p}/"), out),
            0o120000 => out.push((p, fs.readlink(e.ino).unwrap())),
            _ => out.push((p, read_all(fs, e.ino))),
        }
    }
}

fn kernel_tree(root: &std::path::Path, rel: &str, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name == "lost+found" {
            continue;
        }
        let p = format!("{rel}{name}");
        let t = e.file_type().unwrap();
        if t.is_dir() {
            kernel_tree(root, &format!("{p}/"), out);
        } else if t.is_symlink() {
            use std::os::unix::ffi::OsStrExt;
            out.push((
                p,
                std::fs::read_link(e.path())
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            ));
        } else {
            out.push((p, std::fs::read(e.path()).unwrap()));
        }
    }
}

fn sorted(mut v: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    v.sort();
    v
}

/// uext4 writes bigalloc filesystems (clusters of 16 and 64 KiB on 4 KiB blocks, 4 KiB on
/// 1 KiB blocks): after each round of changes e2fsck -fn finds nothing (cluster bitmaps,
/// free counts in clusters, i_blocks in whole clusters, blocks at their offsets in their
/// clusters), the free space equals the kernel's after the same changes, and the kernel reads
/// every file back equal; then uext4 reads the kernel's own changes equal.
#[test]
fn uext4_writes_bigalloc_as_the_kernel() {
    for (tag, bs, cluster, buffered) in [
        ("w4k16", 4096u64, "16384", false),
        ("w4k64", 4096, "65536", false),
        ("w1k4", 1024, "4096", false),
        ("w4k16-delalloc", 4096, "16384", true),
    ] {
        let ours = scratch(&format!("{tag}-u"));
        let theirs = scratch(&format!("{tag}-k"));
        let args = ["-b", &bs.to_string(), "-O", "bigalloc", "-C", cluster];
        mke2fs(&ours.0, "64M", &args);
        mke2fs(&theirs.0, "64M", &args);
        let kernel = can_loop_mount();
        for (i, round) in rounds(bs).iter().enumerate() {
            let fs = Fs::open_path(&ours.0, opts::no_timer_buffered(buffered)).unwrap();
            assert!(!fs.is_read_only(), "{tag}: {:?}", fs.read_only_reason());
            for op in round {
                apply_uext4(&fs, op);
            }
            fs.unmount().unwrap();
            drop(fs);
            e2fsck_clean_when(&ours.0, &format!("{tag}: after round {i}"));
            // Counted once everything is committed (as the kernel's after sync): clusters a
            // handle frees are held back until its commit, which may still be running when
            // the round's last call returns.
            let free = Fs::open_path(&ours.0, MountOptions::ro())
                .unwrap()
                .statfs()
                .blocks_free;
            if kernel {
                let m = KernelMount::new(&theirs.0);
                for op in round {
                    apply_kernel(&m.dir, op);
                }
                sh("sync");
                let (_, _, kfree, _, _) = kernel_statfs(&m.dir);
                drop(m);
                assert_eq!(
                    free, kfree,
                    "{tag}: free blocks after round {i} against the kernel's"
                );
            }
        }
        let fs = Fs::open_path(&ours.0, MountOptions::ro()).unwrap();
        let mut mine = Vec::new();
        uext4_tree(&fs, 2, "", &mut mine);
        drop(fs);
        if !kernel {
            continue;
        }
        {
            let m = KernelMount::new(&ours.0);
            let mut seen = Vec::new();
            kernel_tree(&m.dir, "", &mut seen);
            assert!(
                sorted(seen) == sorted(mine),
                "{tag}: the kernel reads uext4's files differently"
            );
            // The kernel's own changes over uext4's.
            for op in &rounds(bs)[0][2..12] {
                apply_kernel(
                    &m.dir,
                    &match op {
                        Op::Write(p, o, l, s) => Op::Write(
                            Box::leak(format!("k{}", split(p).1).into_boxed_str()),
                            *o,
                            *l,
                            *s,
                        ),
                        o => o.clone(),
                    },
                );
            }
            sh("sync");
        }
        e2fsck_clean_when(&ours.0, &format!("{tag}: after the kernel wrote"));
        let m = KernelMount::new(&ours.0);
        let mut seen = Vec::new();
        kernel_tree(&m.dir, "", &mut seen);
        drop(m);
        let fs = Fs::open_path(&ours.0, MountOptions::ro()).unwrap();
        let mut mine = Vec::new();
        uext4_tree(&fs, 2, "", &mut mine);
        assert!(
            sorted(seen) == sorted(mine),
            "{tag}: uext4 reads the kernel's files differently"
        );
    }
}

/// COLLAPSE_RANGE of less than a cluster is refused (EINVAL, as the kernel); a collapse of
/// whole clusters works and leaves the image clean.
#[test]
fn bigalloc_refusals_are_clear() {
    let img = scratch("ba-refuse");
    mke2fs(
        &img.0,
        "32M",
        &["-b", "4096", "-O", "bigalloc", "-C", "16384"],
    );
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    let data = bytes(1, 40 * 4096);
    fs.write(f, 0, &data).unwrap();
    let e = fs
        .fallocate(f, uext4::FALLOC_FL_COLLAPSE_RANGE, 4096, 4096)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    fs.fallocate(f, uext4::FALLOC_FL_COLLAPSE_RANGE, 16384, 16384)
        .unwrap();
    let mut want = data[..16384].to_vec();
    want.extend_from_slice(&data[32768..]);
    assert!(read_all(&fs, f) == want, "collapse of a whole cluster");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after a collapse of a whole cluster");
}

/// Filling a bigalloc filesystem to the last cluster (small files, each a cluster, then one
/// large file) ends in a clean "no space" with the image e2fsck-clean, and removing
/// everything gives every cluster back; in buffered mode too (a cluster reserved per cached
/// page over a hole, the write straight to the device once that cannot be had).
#[test]
fn bigalloc_fills_and_empties() {
    fills_and_empties(false);
    fills_and_empties(true);
}

fn fills_and_empties(buffered: bool) {
    let img = scratch("ba-full");
    mke2fs(
        &img.0,
        "16M",
        &["-b", "1024", "-O", "bigalloc", "-C", "4096", "-N", "2048"],
    );
    let fs = Fs::open_path(&img.0, opts::no_timer_buffered(buffered)).unwrap();
    let empty = fs.statfs().blocks_free;
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    let mut small = 0;
    for i in 0..1500 {
        let f = fs
            .create(d, format!("s{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write(f, 0, b"x").unwrap();
        small += 1;
    }
    let big = fs.create(2, b"big", 0o644, 0, 0).unwrap().ino;
    let chunk = bytes(7, 1 << 20);
    let mut off = 0u64;
    loop {
        match fs.write(big, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    assert!(
        fs.statfs().blocks_free < 4,
        "full: {:?}",
        fs.statfs().blocks_free
    );
    if buffered {
        assert!(
            fs.delalloc_writeback_runs() > 0,
            "the writes went through the cache"
        );
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "full");
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    assert!(
        read_all(&fs, big)[..chunk.len().min(off as usize)]
            == chunk[..chunk.len().min(off as usize)]
    );
    fs.unlink(2, b"big").unwrap();
    for i in 0..small {
        fs.unlink(d, format!("s{i}").as_bytes()).unwrap();
    }
    fs.rmdir(2, b"d").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "emptied");
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    assert_eq!(fs.statfs().blocks_free, empty, "every cluster given back");
}
