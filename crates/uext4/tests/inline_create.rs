//! Inline data made by uext4 (issue 38): new small files and directories on an inline_data
//! image are kept in their inodes as the kernel's ext4 keeps them. Each case is done twice, by
//! uext4 on one image and by the kernel (loop mount) on a twin, and debugfs's `stat` of every
//! inode must agree: flags, size, and "Size of inline data" (or the block it converted to).
//! e2fsck -fn is clean after each, the kernel reads back every byte and name uext4 wrote, and
//! then keeps writing to uext4's inline files and directories (e2fsck clean again). Needs root
//! and loop devices; says so and skips otherwise.

mod common;

use common::*;
use std::path::Path;
use std::sync::Arc;
use uext4::{Fs, MountOptions};

/// (flags, size, inline size) of `path` as debugfs's stat shows them.
fn shape(img: &Path, path: &str) -> (String, u64, Option<u32>) {
    let out = sh(&format!("debugfs -R 'stat {path}' {} 2>&1", img.display()));
    let flags = out
        .split("Flags: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no flags for {path}:\n{out}"))
        .to_string();
    let size = out
        .split("Size: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let inline = out
        .lines()
        .find_map(|l| l.strip_prefix("Size of inline data: "))
        .map(|v| v.trim().parse().unwrap());
    (flags, size, inline)
}

/// Deterministic contents for file `i` of `n` bytes.
fn bytes(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|k| (k * 7 + i * 13 + 1) as u8).collect()
}

/// One file case: its name and what is done to it, by uext4 (`Op`s on the engine) or the
/// kernel (the same steps with std::fs on the mount).
enum Op {
    /// Write `n` bytes at `off`.
    Write(u64, usize),
    /// Set the size.
    Truncate(u64),
}

fn file_cases() -> Vec<(String, Vec<Op>)> {
    let mut v = Vec::new();
    for n in [0usize, 1, 59, 60, 61, 100, 124, 127, 128, 129, 200, 5000] {
        v.push((format!("w{n}"), vec![Op::Write(0, n)]));
    }
    for n in [60usize, 127, 128, 129] {
        // One byte, then the rest appended: grows the inline data, or converts.
        v.push((format!("a{n}"), vec![Op::Write(0, 1), Op::Write(1, n - 1)]));
    }
    v.push(("gap".into(), vec![Op::Write(0, 10), Op::Write(90, 5)]));
    v.push(("t100-10".into(), vec![Op::Write(0, 100), Op::Truncate(10)]));
    v.push(("t10-50".into(), vec![Op::Write(0, 10), Op::Truncate(50)]));
    v.push(("t10-100".into(), vec![Op::Write(0, 10), Op::Truncate(100)]));
    let shrink_grow = vec![Op::Write(0, 100), Op::Truncate(70), Op::Truncate(90)];
    v.push(("t100-70-90".into(), shrink_grow));
    v.push(("t100-0".into(), vec![Op::Write(0, 100), Op::Truncate(0)]));
    v.push(("empty-t".into(), vec![Op::Truncate(10)]));
    v
}

/// What a file holds after its ops.
fn expected(ops: &[Op], seed: usize) -> Vec<u8> {
    let mut f = Vec::new();
    for op in ops {
        match *op {
            Op::Write(off, n) => {
                let end = off as usize + n;
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[off as usize..end].copy_from_slice(&bytes(seed, n));
            }
            Op::Truncate(s) => f.resize(s as usize, 0),
        }
    }
    f
}

fn run_uext4(fs: &Fs, dir: u32, name: &str, ops: &[Op], seed: usize) {
    let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    for op in ops {
        match *op {
            Op::Write(off, n) => fs.write_all(ino, off, &bytes(seed, n)).unwrap(),
            Op::Truncate(s) => fs.truncate(ino, s).unwrap(),
        }
    }
}

fn run_kernel(dir: &Path, name: &str, ops: &[Op], seed: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    for op in ops {
        match *op {
            Op::Write(off, n) => {
                f.seek(SeekFrom::Start(off)).unwrap();
                f.write_all(&bytes(seed, n)).unwrap();
            }
            Op::Truncate(s) => f.set_len(s).unwrap(),
        }
    }
}

/// Two twin images: `-O inline_data` with the given extra mke2fs options.
fn twins(tag: &str, extra: &[&str]) -> (Scratch, Scratch) {
    let (a, b) = (scratch(&format!("{tag}-u")), scratch(&format!("{tag}-k")));
    let mut opts = vec!["-O", "inline_data", "-I", "256"];
    opts.extend_from_slice(extra);
    mke2fs(&a.0, "16M", &opts);
    mke2fs(&b.0, "16M", &opts);
    (a, b)
}

fn files_match_kernel(tag: &str, extra: &[&str]) {
    let (u, k) = twins(tag, extra);
    let cases = file_cases();
    {
        let fs: Arc<Fs> = Fs::open_path(&u.0, MountOptions::default()).unwrap();
        for (i, (name, ops)) in cases.iter().enumerate() {
            run_uext4(&fs, 2, name, ops, i);
        }
        for (i, (name, ops)) in cases.iter().enumerate() {
            let ino = fs.lookup(2, name.as_bytes()).unwrap().ino;
            assert_eq!(read_all(&fs, ino), expected(ops, i), "uext4 reads {name}");
        }
        fs.unmount().unwrap();
    }
    e2fsck_clean_when(&u.0, "after uext4 made the inline files");
    {
        let m = KernelMount::new(&k.0);
        for (i, (name, ops)) in cases.iter().enumerate() {
            run_kernel(&m.dir, name, ops, i);
        }
    }
    e2fsck_clean(&k.0);
    let mut inline = 0;
    for (name, _) in &cases {
        let (us, ks) = (shape(&u.0, name), shape(&k.0, name));
        assert_eq!(us, ks, "{name}: uext4's inode (left) and the kernel's");
        inline += us.2.is_some() as usize;
    }
    assert!(inline >= 12, "most cases stay inline ({inline})");
    // The kernel reads uext4's files, then appends to each and truncates some.
    {
        let m = KernelMount::new(&u.0);
        for (i, (name, ops)) in cases.iter().enumerate() {
            let got = std::fs::read(m.dir.join(name)).unwrap();
            assert_eq!(got, expected(ops, i), "the kernel reads {name}");
            let mut want = got;
            want.extend_from_slice(b"kernel");
            sh(&format!("printf kernel >> {}", m.dir.join(name).display()));
            assert_eq!(std::fs::read(m.dir.join(name)).unwrap(), want);
        }
    }
    e2fsck_clean_when(&u.0, "after the kernel appended to uext4's inline files");
    // And uext4 writes to the kernel's: one more append each, read back.
    let fs: Arc<Fs> = Fs::open_path(&k.0, MountOptions::default()).unwrap();
    for (i, (name, ops)) in cases.iter().enumerate() {
        let ino = fs.lookup(2, name.as_bytes()).unwrap().ino;
        let mut want = expected(ops, i);
        fs.write_all(ino, want.len() as u64, b"uext4").unwrap();
        want.extend_from_slice(b"uext4");
        assert_eq!(read_all(&fs, ino), want, "{name} after uext4's append");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&k.0, "after uext4 appended to the kernel's inline files");
}

/// Files of sizes around i_block's 60 bytes and the 128 a 256-byte inode holds, appends,
/// writes past the end, truncates down and up: the same inodes as the kernel's, 4 KiB blocks
/// with metadata_csum.
#[test]
fn inline_files_match_kernel_4k_csum() {
    if !can_loop_mount() {
        return;
    }
    files_match_kernel("inl-files-4k", &["-b", "4096", "-O", "metadata_csum"]);
}

/// The same with 1 KiB blocks, no metadata_csum.
#[test]
fn inline_files_match_kernel_1k() {
    if !can_loop_mount() {
        return;
    }
    files_match_kernel("inl-files-1k", &["-b", "1024", "-O", "^metadata_csum"]);
}

/// The same without extents (block maps): the kernel keeps these inline too, and converts to
/// a block map.
#[test]
fn inline_files_match_kernel_blockmap() {
    if !can_loop_mount() {
        return;
    }
    files_match_kernel("inl-files-bmap", &["-b", "4096", "-O", "^extent,^64bit"]);
}

/// Names for directory `n`: short ones, and in "long" one 59-byte name.
fn dir_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("n{i}")).collect()
}

/// New directories with 0 to 12 names (i_block holds four 2-byte names; the fifth grows
/// "system.data" to all the inode holds; the tenth converts), one with a 59-byte name (straight
/// into "system.data"), one with names removed and added again: the same inodes as the
/// kernel's; the kernel lists uext4's, then adds names to them, and uext4 to the kernel's.
#[test]
fn inline_dirs_match_kernel() {
    if !can_loop_mount() {
        return;
    }
    dirs_match_kernel("inl-dirs", &["-O", "metadata_csum"]);
}

/// The same without extents: a directory that outgrows its inode converts to a block map.
#[test]
fn inline_dirs_match_kernel_blockmap() {
    if !can_loop_mount() {
        return;
    }
    dirs_match_kernel("inl-dirs-bmap", &["-O", "^extent,^64bit"]);
}

fn dirs_match_kernel(tag: &str, extra: &[&str]) {
    let (u, k) = twins(tag, extra);
    let long = "l".repeat(59);
    let mut cases: Vec<(String, Vec<String>)> =
        (0..=12).map(|n| (format!("d{n}"), dir_names(n))).collect();
    cases.push(("long".into(), vec![long.clone()]));
    {
        let fs: Arc<Fs> = Fs::open_path(&u.0, MountOptions::default()).unwrap();
        for (d, names) in &cases {
            let dino = fs.mkdir(2, d.as_bytes(), 0o755, 0, 0).unwrap().ino;
            for n in names {
                fs.create(dino, n.as_bytes(), 0o644, 0, 0).unwrap();
            }
        }
        // Removed and added again: the freed room is reused in place.
        let d7 = fs.lookup(2, b"d7").unwrap().ino;
        for n in ["n2", "n6"] {
            fs.unlink(d7, n.as_bytes()).unwrap();
        }
        fs.mkdir(d7, b"n2", 0o755, 0, 0).unwrap();
        fs.unmount().unwrap();
    }
    e2fsck_clean_when(&u.0, "after uext4 made the inline directories");
    {
        let m = KernelMount::new(&k.0);
        for (d, names) in &cases {
            std::fs::create_dir(m.dir.join(d)).unwrap();
            for n in names {
                std::fs::File::create(m.dir.join(d).join(n)).unwrap();
            }
        }
        for n in ["n2", "n6"] {
            std::fs::remove_file(m.dir.join("d7").join(n)).unwrap();
        }
        std::fs::create_dir(m.dir.join("d7/n2")).unwrap();
    }
    e2fsck_clean(&k.0);
    let mut inline = 0;
    for (d, _) in &cases {
        let (us, ks) = (shape(&u.0, d), shape(&k.0, d));
        assert_eq!(us, ks, "{d}: uext4's inode (left) and the kernel's");
        inline += us.2.is_some() as usize;
    }
    assert!(
        inline >= 10,
        "directories up to nine names stay inline ({inline})"
    );
    let listed = |dir: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let want = |d: &str, names: &[String]| {
        let mut w: Vec<String> = names.to_vec();
        if d == "d7" {
            w.retain(|n| n != "n6");
        }
        w.sort();
        w
    };
    {
        let m = KernelMount::new(&u.0);
        for (d, names) in &cases {
            assert_eq!(
                listed(&m.dir.join(d)),
                want(d, names),
                "the kernel lists {d}"
            );
            std::fs::File::create(m.dir.join(d).join("kernel-added")).unwrap();
        }
    }
    e2fsck_clean_when(&u.0, "after the kernel added names to uext4's directories");
    let fs: Arc<Fs> = Fs::open_path(&k.0, MountOptions::default()).unwrap();
    for (d, names) in &cases {
        let dino = fs.lookup(2, d.as_bytes()).unwrap().ino;
        fs.create(dino, b"uext4-added", 0o644, 0, 0).unwrap();
        let mut got = Vec::new();
        fs.readdir(dino, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                got.push(String::from_utf8_lossy(&e.name).into_owned());
            }
            true
        })
        .unwrap();
        got.sort();
        let mut w = want(d, names);
        w.push("uext4-added".into());
        w.sort();
        assert_eq!(got, w, "uext4 lists {d}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&k.0, "after uext4 added names to the kernel's directories");
}

/// Whether debugfs shows an xattr block for `path`.
fn has_xattr_block(img: &Path, path: &str) -> bool {
    let out = sh(&format!("debugfs -R 'stat {path}' {} 2>&1", img.display()));
    !out.contains("File ACL: 0")
}

/// Attributes set on inline inodes keep them inline, as the kernel's ext4_xattr_set does:
/// "system.data" stays in the inode, a new attribute goes beside it where it fits and to an
/// xattr block where not; a later write still goes inline. The same inodes as the kernel's,
/// and each reads the other's attributes.
#[test]
fn inline_xattrs_match_kernel() {
    if !can_loop_mount() {
        return;
    }
    let (u, k) = twins("inl-xattr", &["-O", "metadata_csum"]);
    // (name, bytes written first, attribute value, bytes appended after)
    let cases: [(&str, usize, usize, usize); 5] = [
        ("small", 10, 3, 0),
        ("full", 120, 20, 0),
        ("big-attr", 10, 50, 5),
        ("grow-after", 10, 8, 90),
        ("past-after", 10, 8, 200),
    ];
    let value = |n: usize| vec![b'v'; n];
    {
        let fs: Arc<Fs> = Fs::open_path(&u.0, MountOptions::default()).unwrap();
        for (i, &(name, first, attr, more)) in cases.iter().enumerate() {
            let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write_all(ino, 0, &bytes(i, first)).unwrap();
            fs.setxattr(ino, b"user.a", &value(attr), uext4::XattrFlags::Any)
                .unwrap();
            if more > 0 {
                fs.write_all(ino, first as u64, &bytes(i + 50, more))
                    .unwrap();
            }
        }
        let d = fs.mkdir(2, b"dir", 0o755, 0, 0).unwrap().ino;
        fs.create(d, b"x", 0o644, 0, 0).unwrap();
        fs.setxattr(d, b"user.d", b"1234", uext4::XattrFlags::Any)
            .unwrap();
        fs.create(d, b"y", 0o644, 0, 0).unwrap();
        fs.unmount().unwrap();
    }
    e2fsck_clean_when(&u.0, "after uext4 set attributes on inline inodes");
    {
        let m = KernelMount::new(&k.0);
        for (i, &(name, first, attr, more)) in cases.iter().enumerate() {
            let p = m.dir.join(name);
            std::fs::write(&p, bytes(i, first)).unwrap();
            assert!(set_xattr(&p, "user.a", &value(attr)));
            if more > 0 {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
                f.write_all(&bytes(i + 50, more)).unwrap();
            }
        }
        std::fs::create_dir(m.dir.join("dir")).unwrap();
        std::fs::File::create(m.dir.join("dir/x")).unwrap();
        assert!(set_xattr(&m.dir.join("dir"), "user.d", b"1234"));
        std::fs::File::create(m.dir.join("dir/y")).unwrap();
    }
    e2fsck_clean(&k.0);
    let mut inline = 0;
    for name in cases.iter().map(|c| c.0).chain(["dir"]) {
        let (us, ks) = (shape(&u.0, name), shape(&k.0, name));
        assert_eq!(us, ks, "{name}: uext4's inode (left) and the kernel's");
        let (ub, kb) = (has_xattr_block(&u.0, name), has_xattr_block(&k.0, name));
        assert_eq!(
            ub, kb,
            "{name}: xattr block, uext4's (left) and the kernel's"
        );
        inline += us.2.is_some() as usize;
    }
    assert!(inline >= 5, "all but past-after stay inline ({inline})");
    let m = KernelMount::new(&u.0);
    for (i, &(name, first, attr, more)) in cases.iter().enumerate() {
        let p = m.dir.join(name);
        let mut want = bytes(i, first);
        want.extend_from_slice(&bytes(i + 50, more));
        assert_eq!(std::fs::read(&p).unwrap(), want, "the kernel reads {name}");
        assert_eq!(xattrs(&p), [(b"user.a".to_vec(), value(attr))]);
    }
    assert_eq!(
        xattrs(&m.dir.join("dir")),
        [(b"user.d".to_vec(), b"1234".to_vec())]
    );
}

/// An O_TMPFILE file goes inline too (the kernel's ext4_tmpfile makes it with ext4_new_inode,
/// EXT4_STATE_MAY_INLINE_DATA set): written, then linked in, it is inline on disk, e2fsck is
/// clean and the kernel reads it (with loop devices).
#[test]
fn inline_tmpfile_then_linked() {
    let img = scratch("inl-tmpfile");
    mke2fs(&img.0, "16M", &["-O", "inline_data", "-I", "256"]);
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let ino = fs.tmpfile(2, 0o644, 0, 0).unwrap().ino;
    fs.write_all(ino, 0, &bytes(1, 50)).unwrap();
    fs.link(ino, 2, b"t").unwrap();
    fs.release(ino).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(shape(&img.0, "t").2, Some(60));
    if can_loop_mount() {
        let m = KernelMount::new(&img.0);
        assert_eq!(std::fs::read(m.dir.join("t")).unwrap(), bytes(1, 50));
    }
}

/// No encrypted inode goes inline, as the kernel's ext4_set_context makes it so: a policy set
/// on an empty inline directory moves it to a block first, and the files and directories made
/// in it (which inherit the policy) start block-mapped. e2fsck is clean.
#[test]
fn encrypted_inodes_never_go_inline() {
    let img = scratch("inl-encrypt");
    mke2fs(&img.0, "16M", &["-O", "inline_data,encrypt", "-I", "256"]);
    let raw: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let key = uext4::EncryptionKey::new(raw);
    let opts = MountOptions {
        keys: vec![key.clone()],
        ..MountOptions::default()
    };
    let fs: Arc<Fs> = Fs::open_path(&img.0, opts).unwrap();
    let d = fs.mkdir(2, b"secret", 0o755, 0, 0).unwrap().ino;
    let plain = fs.mkdir(2, b"plain", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy(d, &uext4::EncryptionPolicy::v2(&key).unwrap())
        .unwrap();
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_all(f, 0, b"ten bytes!").unwrap();
    fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
    let g = fs.create(plain, b"g", 0o644, 0, 0).unwrap().ino;
    fs.write_all(g, 0, b"ten bytes!").unwrap();
    assert_eq!(read_all(&fs, f), b"ten bytes!");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(
        shape(&img.0, "secret").2,
        None,
        "the policy converted secret"
    );
    assert_eq!(shape(&img.0, "plain").2, Some(60));
    assert_eq!(shape(&img.0, "plain/g").2, Some(60));
    // The encrypted names: the only entry of each kind under secret, by inode number.
    let ls = sh(&format!(
        "debugfs -R 'ls -l secret' {} 2>&1",
        img.0.display()
    ));
    let inos: Vec<String> = ls
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.parse::<u32>().is_ok_and(|n| n > 11 && n != d))
        .map(|n| format!("<{n}>"))
        .collect();
    assert_eq!(inos.len(), 2, "{ls}");
    for i in inos {
        assert_eq!(shape(&img.0, &i).2, None, "{i} under secret is not inline");
    }
}

/// Quotas count inline files and directories as the kernel does: an inode each and no block
/// (e2fsck recomputes usage and compares it with the quota files), through creation, growth,
/// conversion and removal.
#[test]
fn inline_inodes_in_quota_usage() {
    let img = scratch("inl-quota");
    mke2fs(
        &img.0,
        "16M",
        &["-O", "inline_data,quota,project", "-I", "256"],
    );
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 1000, 1000).unwrap().ino;
    for (i, n) in [1usize, 60, 100, 128, 129, 4000].into_iter().enumerate() {
        let f = fs
            .create(d, format!("f{i}").as_bytes(), 0o644, 1000, 1000)
            .unwrap()
            .ino;
        fs.write_all(f, 0, &bytes(i, n)).unwrap();
    }
    let f0 = fs.lookup(d, b"f0").unwrap().ino;
    fs.write_all(f0, 1, &bytes(9, 300)).unwrap(); // converts
    fs.unlink(d, b"f1").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(shape(&img.0, "d").2, Some(128));
    assert_eq!(shape(&img.0, "d/f2").2, Some(100));
    assert_eq!(shape(&img.0, "d/f0").2, None);
}
