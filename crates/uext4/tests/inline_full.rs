//! Inline directories on a completely full filesystem (issue 38's two write bugs). The kernel
//! removes names from an inline directory, and moves one to a new parent, where they lie, so
//! those need no block; uext4 must not either. A change that does need a block (a name added
//! that makes the directory convert) fails with ENOSPC and leaves the inode inline and every
//! bitmap agreeing with it: it once freed the directory's xattr block, failed, and left the
//! inode still referring to it (e2fsck: "Block bitmap differences: +N"). Images made and filled
//! by the kernel (loop mount), then by uext4 to the last block; e2fsck -fn after every step and
//! the kernel reads the result. Needs root and loop devices; says so and skips otherwise.

mod common;

use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use uext4::{Error, Fs, MountOptions, RenameFlags, XattrFlags};

/// "Size of inline data" of `path` as debugfs reports it; None when the inode is not inline.
fn inline_size(img: &Path, path: &str) -> Option<u32> {
    sh(&format!("debugfs -R 'stat {path}' {} 2>&1", img.display()))
        .lines()
        .find_map(|l| l.strip_prefix("Size of inline data: "))
        .map(|v| v.trim().parse().unwrap())
}

fn free_blocks(img: &Path) -> u64 {
    sh(&format!("dumpe2fs -h {} 2>/dev/null", img.display()))
        .lines()
        .find_map(|l| l.strip_prefix("Free blocks:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// The names in a directory, "." and ".." left out, sorted.
fn names(fs: &Fs, dir: u32) -> Vec<String> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.push(String::from_utf8_lossy(&e.name).into_owned());
        }
        true
    })
    .unwrap();
    out.sort();
    out
}

fn host_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

const NAMES: [&str; 5] = ["name0001", "name0002", "name0003", "name0004", "name0005"];

/// A 2 MiB, 1 KiB-block inline_data image: `d` an inline directory of five names, some in
/// i_block and some in "system.data", with an attribute that lives in an xattr block (the
/// inode has no room left for it); `e` and `f` small inline directories; then filled by the
/// kernel and by uext4 until not one block is free.
fn full_image(tag: &str) -> Scratch {
    let img = scratch(tag);
    sh(&format!(
        "mke2fs -q -F -t ext4 -O inline_data -b 1024 -m 0 {} 2M",
        img.0.display()
    ));
    {
        let m = KernelMount::new(&img.0);
        sh(&format!(
            "set -e; cd {}; mkdir d e f; for n in {}; do : > d/$n; done; \
             setfattr -n user.x -v 0123456789ab d; setfattr -n user.y -v 1 e; : > f/only; \
             dd if=/dev/zero of=fill bs=1k 2>/dev/null || true; sync",
            m.dir.display(),
            NAMES.join(" ")
        ));
    }
    assert!(
        inline_size(&img.0, "/d").unwrap() > 60,
        "d spills into system.data"
    );
    let acl = sh(&format!("debugfs -R 'stat /d' {} 2>&1", img.0.display()));
    assert!(!acl.contains("File ACL: 0"), "d has an xattr block:\n{acl}");
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let pad = fs.create(2, b"pad", 0o644, 0, 0).unwrap().ino;
    let bs = fs.statfs().block_size as u64;
    let mut off = 0;
    while fs.write(pad, off, &vec![0x5a; bs as usize]).is_ok() {
        off += bs;
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(free_blocks(&img.0), 0, "the image is full");
    img
}

/// Names removed from inline directories (from i_block's run and from the attribute's), an
/// inline directory moved to another parent (its ".." rewritten in i_block) and inline
/// directories removed, one with an xattr block: all on a full filesystem, as the kernel does
/// them. The xattr block comes back free.
#[test]
fn inline_removals_need_no_block() {
    if !can_loop_mount() {
        return;
    }
    let img = full_image("inline-full-rm");
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let ino = |dir: u32, n: &str| fs.lookup(dir, n.as_bytes()).unwrap().ino;
    let (d, f, lf) = (ino(2, "d"), ino(2, "f"), ino(2, "lost+found"));
    for n in ["name0001", "name0005", "name0003"] {
        fs.unlink(d, n.as_bytes()).unwrap();
    }
    assert_eq!(names(&fs, d), ["name0002", "name0004"]);
    fs.rename(2, b"e", lf, b"e", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(ino(lf, "e"), b"..").unwrap().ino, lf);
    fs.unlink(f, b"only").unwrap();
    fs.rmdir(2, b"f").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert!(inline_size(&img.0, "/d").is_some(), "d stayed inline");
    assert_eq!(free_blocks(&img.0), 0);

    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.lookup(2, b"d").unwrap().ino;
    for n in ["name0002", "name0004"] {
        fs.unlink(d, n.as_bytes()).unwrap();
    }
    fs.rmdir(2, b"d").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(free_blocks(&img.0), 1, "d's xattr block is free");

    let m = KernelMount::new(&img.0);
    assert_eq!(host_names(&m.dir), ["fill", "lost+found", "pad"]);
    assert_eq!(host_names(&m.dir.join("lost+found")), ["e"]);
    let e = m.dir.join("lost+found/e");
    assert_eq!(xattrs(&e), [(b"user.y".to_vec(), b"1".to_vec())]);
    assert_eq!(
        std::fs::metadata(e.join("..")).unwrap().ino(),
        std::fs::metadata(m.dir.join("lost+found")).unwrap().ino()
    );
}

/// Changes that make an inline directory convert to a block fail with ENOSPC on a full
/// filesystem, and change nothing: the directory stays inline with every name and its xattr
/// block, and e2fsck finds the image clean. With a block free again, the same create converts
/// the directory, and the kernel reads every name.
#[test]
fn failed_inline_conversion_changes_nothing() {
    if !can_loop_mount() {
        return;
    }
    let img = full_image("inline-full-convert");
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.lookup(2, b"d").unwrap().ino;
    // Names fill what room the inline data has left first (no block needed, as the kernel's
    // ext4_try_add_inline_entry), until the next one needs the conversion.
    let mut all: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    for i in 0.. {
        let n = format!("more{i:04}");
        match fs.create(d, n.as_bytes(), 0o644, 0, 0) {
            Ok(_) => all.push(n),
            Err(Error::NoSpace) => break,
            Err(e) => panic!("create {n}: {e}"),
        }
    }
    assert!(all.len() > NAMES.len(), "d had room left inline");
    all.sort();
    assert!(matches!(
        fs.create(d, b"new-file", 0o644, 0, 0),
        Err(Error::NoSpace)
    ));
    assert!(matches!(
        fs.mkdir(d, b"new-dir", 0o755, 0, 0),
        Err(Error::NoSpace)
    ));
    // An attribute change keeps the directory inline (as the kernel's ext4_xattr_set): this
    // one goes into d's own xattr block in place, so it needs no block either.
    fs.setxattr(d, b"user.z", &[7; 40], XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.getxattr(d, b"user.z").unwrap(), [7; 40]);
    fs.removexattr(d, b"user.z").unwrap();
    assert_eq!(names(&fs, d), all);
    assert_eq!(fs.getxattr(d, b"user.x").unwrap(), b"0123456789ab");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert!(inline_size(&img.0, "/d").unwrap() > 60, "d stayed inline");
    assert_eq!(free_blocks(&img.0), 0);

    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.lookup(2, b"d").unwrap().ino;
    fs.unlink(2, b"pad").unwrap();
    fs.create(d, b"new-file", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(inline_size(&img.0, "/d"), None, "d converted");
    let m = KernelMount::new(&img.0);
    let mut want = all;
    want.push("new-file".into());
    want.sort();
    assert_eq!(host_names(&m.dir.join("d")), want);
    assert_eq!(
        xattrs(&m.dir.join("d")),
        [(b"user.x".to_vec(), b"0123456789ab".to_vec())]
    );
}
