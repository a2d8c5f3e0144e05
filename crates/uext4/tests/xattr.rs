//! Extended attributes against the oracles: attributes the kernel set (small, large, shared
//! blocks, POSIX ACLs) read back through uext4 equal to `getfattr`; attributes uext4 set
//! (in-inode, in the block, many, replaced, removed, ACLs) pass `e2fsck -fn` and read back equal
//! under the kernel (`getfattr`, `getfacl`). Kernel parts need root and loop devices and skip with
//! a message otherwise; they also need getfattr/setfattr/getfacl/setfacl (packages attr, acl).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use uext4::{Corruption, XattrFlags};
use uext4::{Error, Fs, MountOptions};
use uext4_testkit::unhex;

type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn have_attr_tools() -> bool {
    let ok = ["getfattr", "setfattr", "getfacl", "setfacl"]
        .iter()
        .all(|t| {
            Command::new(t)
                .arg("--version")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        });
    if !ok {
        eprintln!("SKIP: getfattr/setfattr/getfacl/setfacl missing (apt-get install attr acl)");
    }
    ok
}

/// `getfattr -d -m - -e hex` of each path: path -> (name -> value). Paths without attributes
/// map to an empty set.
fn getfattr(paths: &[&Path]) -> BTreeMap<String, Xattrs> {
    let out = Command::new("getfattr")
        .args(["--absolute-names", "-h", "-d", "-m", "-", "-e", "hex"])
        .args(paths)
        .output()
        .expect("getfattr");
    assert!(
        out.status.success(),
        "getfattr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut res: BTreeMap<String, Xattrs> = paths
        .iter()
        .map(|p| (p.display().to_string(), Xattrs::new()))
        .collect();
    let mut cur = String::new();
    for line in out.stdout.split(|&b| b == b'\n') {
        if let Some(f) = line.strip_prefix(b"# file: ") {
            cur = String::from_utf8(f.to_vec()).unwrap();
        } else if !line.is_empty() {
            // Names are printed raw; the value is the hex after the last '='.
            let eq = line.iter().rposition(|&b| b == b'=').expect("name=value");
            let v = std::str::from_utf8(&line[eq + 1..]).unwrap();
            let v = v.strip_prefix("0x").expect("hex value");
            res.get_mut(&cur)
                .expect("getfattr printed a path we did not ask for")
                .insert(line[..eq].to_vec(), unhex(v));
        }
    }
    res
}

fn ours(fs: &Fs, ino: u32) -> Xattrs {
    uext4_testkit::fs_xattrs(fs, ino)
}

fn lookup_path(fs: &Fs, path: &str) -> u32 {
    let mut ino = 2;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(ino, c.as_bytes()).unwrap().ino;
    }
    ino
}

/// i_file_acl of `path` in the image, through debugfs.
fn file_acl(img: &Path, path: &str) -> u64 {
    let out = sh(&format!(
        "debugfs -R 'stat {path}' {} 2>/dev/null",
        img.display()
    ));
    let i = out.find("File ACL: ").expect("debugfs stat shows File ACL");
    out[i + 10..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn acl_vfs(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const U: u32 = u32::MAX;

/// Attributes the kernel wrote read back through uext4 exactly as getfattr shows them.
#[test]
fn kernel_written_xattrs_read_back() {
    if !can_loop_mount() || !have_attr_tools() {
        return;
    }
    for (tag, args) in [
        ("k4k", &["-b", "4096"][..]),
        ("k1k128", &["-b", "1024", "-I", "128"][..]),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "64M", args);
        let names = ["small", "big", "many", "acl", "dacl", "shared1", "shared2"];
        let expect = {
            let m = KernelMount::new(&img.0);
            let r = m.dir.display();
            sh(&format!(
                "set -e; cd {r}; touch small big many acl shared1 shared2; mkdir dacl; \
                 setfattr -n user.x -v hello small; setfattr -n trusted.t -v 0x00ff00 small; \
                 setfattr -n security.s -v sec small; setfattr -n user.empty small; \
                 setfattr -n user.big -v $(head -c 700 /dev/zero | tr '\\0' b) big; \
                 for i in $(seq 1 20); do setfattr -n user.attr-$i -v value-$i-xxxxxxxx many; done; \
                 setfacl -m u:1000:rw,g:50:r acl; setfattr -n user.after-acl -v 1 acl; \
                 setfacl -d -m u:1000:rx dacl; setfacl -m u:7:x dacl; \
                 setfattr -n user.same -v $(head -c 600 /dev/zero | tr '\\0' s) shared1; \
                 setfattr -n user.same -v $(head -c 600 /dev/zero | tr '\\0' s) shared2; \
                 python3 -c \"import os; os.setxattr('many', b'user.\\xc3\\xbc\\xff', b'hi'); \
                 os.setxattr('big', b'trusted.\\xe6\\x97\\xa5', b'x' * 150)\""
            ));
            let paths: Vec<_> = names.iter().map(|n| m.dir.join(n)).collect();
            let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
            let got = getfattr(&refs);
            names
                .iter()
                .zip(paths.iter())
                .map(|(n, p)| (n.to_string(), got[&p.display().to_string()].clone()))
                .collect::<BTreeMap<_, _>>()
        };
        e2fsck_clean(&img.0);
        assert_eq!(expect["many"].len(), 21);
        assert!(expect["acl"].contains_key(&b"system.posix_acl_access"[..]));
        assert!(expect["dacl"].contains_key(&b"system.posix_acl_default"[..]));
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        for n in names {
            let ino = lookup_path(&fs, n);
            assert_eq!(ours(&fs, ino), expect[n], "{tag}: attributes of {n}");
        }
        let acl = lookup_path(&fs, "acl");
        assert!(matches!(fs.getxattr(acl, b"user.nope"), Err(Error::NoAttr)));
        assert!(matches!(
            fs.getxattr(acl, b"system.posix_acl_default"),
            Err(Error::NoAttr)
        ));
        assert!(matches!(
            fs.getxattr(acl, b"nosuchns.x"),
            Err(Error::NotSupported(_))
        ));
    }
}

/// Sets a varied collection of attributes through uext4, checking the error cases on the way;
/// returns (path, expected attributes) for each file.
fn populate(fs: &Fs, block_size: usize, ibody: bool) -> Vec<(String, Xattrs)> {
    let a = fs.create(2, b"inode-only", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(2, b"block", 0o644, 0, 0).unwrap().ino;
    let c = fs.create(2, b"many", 0o644, 0, 0).unwrap().ino;
    let d = fs.mkdir(2, b"dir", 0o755, 0, 0).unwrap().ino;
    let e = fs.create(d, b"acl", 0o640, 1000, 100).unwrap().ino;
    let f = fs.create(2, b"removed", 0o644, 0, 0).unwrap().ino;

    // Small ones (in the inode when it has room).
    fs.setxattr(a, b"user.a", b"1", XattrFlags::Create).unwrap();
    fs.setxattr(a, b"trusted.b", b"22", XattrFlags::Any)
        .unwrap();
    fs.setxattr(a, b"user.empty", b"", XattrFlags::Any).unwrap();
    assert!(matches!(
        fs.setxattr(a, b"user.a", b"x", XattrFlags::Create),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.setxattr(a, b"user.zz", b"x", XattrFlags::Replace),
        Err(Error::NoAttr)
    ));
    fs.setxattr(a, b"user.a", b"replaced", XattrFlags::Replace)
        .unwrap();
    assert_eq!(fs.getxattr(a, b"user.a").unwrap(), b"replaced");
    let long = [b"user.".to_vec(), vec![b'n'; 251]].concat();
    assert!(matches!(
        fs.setxattr(a, &long, b"x", XattrFlags::Any),
        Err(Error::NameTooLong)
    ));
    assert!(matches!(
        fs.setxattr(a, b"bogus.x", b"x", XattrFlags::Any),
        Err(Error::NotSupported(_))
    ));
    // The longest name there is.
    fs.setxattr(a, &long[..255], b"long name", XattrFlags::Any)
        .unwrap();

    // A value that only the block can hold, then one too large for anything.
    let big: Vec<u8> = (0..block_size * 3 / 4).map(|i| (i % 251) as u8).collect();
    fs.setxattr(b, b"user.big", &big, XattrFlags::Any).unwrap();
    fs.setxattr(b, b"security.small", b"s", XattrFlags::Any)
        .unwrap();
    let before = ours(fs, b);
    assert!(matches!(
        fs.setxattr(b, b"user.huge", &vec![7u8; block_size], XattrFlags::Any),
        Err(Error::NoSpace)
    ));
    assert!(matches!(
        fs.setxattr(b, b"user.huge", &vec![7u8; 70000], XattrFlags::Any),
        Err(Error::NoSpace)
    ));
    assert_eq!(ours(fs, b), before, "a failed set changed nothing");

    // Many: fill the inode and most of the block, replace some, remove some.
    let n = block_size / 80;
    for i in 0..n {
        fs.setxattr(
            c,
            format!("user.attr-{i:03}").as_bytes(),
            format!("value-{i}-{}", "v".repeat(i % 30)).as_bytes(),
            XattrFlags::Create,
        )
        .unwrap();
    }
    for i in (0..n).step_by(3) {
        fs.setxattr(
            c,
            format!("user.attr-{i:03}").as_bytes(),
            format!("new-{i}").as_bytes(),
            XattrFlags::Replace,
        )
        .unwrap();
    }
    for i in (1..n).step_by(4) {
        fs.removexattr(c, format!("user.attr-{i:03}").as_bytes())
            .unwrap();
    }
    assert!(matches!(
        fs.removexattr(c, b"user.attr-001"),
        Err(Error::NoAttr)
    ));

    // ACLs: access on a file, default and access on a directory.
    let access = acl_vfs(&[
        (0x01, 6, U),
        (0x02, 6, 1000),
        (0x04, 4, U),
        (0x08, 4, 50),
        (0x10, 6, U),
        (0x20, 0, U),
    ]);
    fs.setxattr(e, b"system.posix_acl_access", &access, XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.getxattr(e, b"system.posix_acl_access").unwrap(), access);
    // The access ACL sets the mode's rwx bits: owner 6, mask 6, other 0.
    assert_eq!(fs.getattr(e).unwrap().mode & 0o7777, 0o660);
    // A minimal ACL only sets the mode bits and is not stored.
    fs.setxattr(
        a,
        b"system.posix_acl_access",
        &acl_vfs(&[(0x01, 7, U), (0x04, 5, U), (0x20, 1, U)]),
        XattrFlags::Any,
    )
    .unwrap();
    assert_eq!(fs.getattr(a).unwrap().mode & 0o7777, 0o751);
    assert!(matches!(
        fs.getxattr(a, b"system.posix_acl_access"),
        Err(Error::NoAttr)
    ));
    let default = acl_vfs(&[
        (0x01, 7, U),
        (0x02, 5, 1000),
        (0x04, 5, U),
        (0x10, 5, U),
        (0x20, 5, U),
    ]);
    fs.setxattr(d, b"system.posix_acl_default", &default, XattrFlags::Any)
        .unwrap();
    assert!(matches!(
        fs.setxattr(e, b"system.posix_acl_default", &default, XattrFlags::Any),
        Err(Error::Invalid(_))
    ));
    // Malformed: named user without a mask.
    assert!(matches!(
        fs.setxattr(
            d,
            b"system.posix_acl_access",
            &acl_vfs(&[(0x01, 7, U), (0x02, 5, 1000), (0x04, 5, U), (0x20, 5, U)]),
            XattrFlags::Any
        ),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.setxattr(d, b"system.posix_acl_access", b"junk", XattrFlags::Any),
        Err(Error::Invalid(_))
    ));

    // Set then removed again: block allocated and freed.
    let free0 = fs.statfs().blocks_free;
    fs.setxattr(f, b"user.big", &big, XattrFlags::Any).unwrap();
    fs.setxattr(f, b"user.small", b"stays", XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().blocks, block_size as u64 / 512);
    fs.removexattr(f, b"user.big").unwrap();
    if ibody {
        // "stays" moved into the inode: the block is gone.
        assert_eq!(fs.getattr(f).unwrap().blocks, 0);
        assert_eq!(fs.statfs().blocks_free, free0);
    } else {
        assert_eq!(fs.getattr(f).unwrap().blocks, block_size as u64 / 512);
        assert_eq!(fs.statfs().blocks_free, free0 - 1);
        fs.removexattr(f, b"user.small").unwrap();
        assert_eq!(fs.getattr(f).unwrap().blocks, 0);
        assert_eq!(fs.statfs().blocks_free, free0);
        fs.setxattr(f, b"user.small", b"stays", XattrFlags::Any)
            .unwrap();
    }

    // Names with bytes above 0x7f (the kernel hashes them unsigned; e2fsck checks).
    let u = fs.create(2, b"unicode", 0o644, 0, 0).unwrap().ino;
    let uname = "user.\u{fc}n\u{ef}c\u{f6}d\u{e9}-\u{65e5}\u{672c}".as_bytes();
    fs.setxattr(u, uname, b"small", XattrFlags::Any).unwrap();
    let uname2 = [b"trusted.".to_vec(), vec![0xff, 0x80, 0xc3]].concat();
    fs.setxattr(u, &uname2, &vec![3u8; block_size / 2], XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.getxattr(u, uname).unwrap(), b"small");
    assert_eq!(fs.listxattr(u).unwrap().len(), 2);

    // A fast symlink and a fifo with attributes (an xattr block on a fast symlink must not
    // make it look like a slow one).
    let sl = fs.symlink(2, b"sl", b"inode-only", 0, 0).unwrap().ino;
    fs.setxattr(sl, b"trusted.big", &big, XattrFlags::Any)
        .unwrap();
    fs.setxattr(sl, b"trusted.s", b"s", XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.readlink(sl).unwrap(), b"inode-only");
    let fifo = fs.mknod(2, b"fifo", 0o010644, 0, 0, 0).unwrap().ino;
    fs.setxattr(fifo, b"trusted.f", &big[..100], XattrFlags::Any)
        .unwrap();

    // The largest value one block holds: header 32, entry 16 + name 4, terminator 4.
    let mx = fs.create(2, b"max", 0o644, 0, 0).unwrap().ino;
    assert!(matches!(
        fs.setxattr(mx, b"user.x", &vec![9u8; block_size - 55], XattrFlags::Any),
        Err(Error::NoSpace)
    ));
    fs.setxattr(mx, b"user.x", &vec![9u8; block_size - 56], XattrFlags::Any)
        .unwrap();

    // The root directory.
    fs.setxattr(2, b"user.root", b"on the root", XattrFlags::Any)
        .unwrap();

    [
        ("inode-only", a),
        ("block", b),
        ("many", c),
        ("dir", d),
        ("dir/acl", e),
        ("removed", f),
        ("sl", sl),
        ("max", mx),
        ("fifo", fifo),
        ("", 2),
    ]
    .into_iter()
    .map(|(p, ino)| (p.to_string(), ours(fs, ino)))
    .collect()
}

fn kernel_compare(img: &Path, expect: &[(String, Xattrs)]) {
    if !can_loop_mount() || !have_attr_tools() {
        return;
    }
    let m = KernelMount::new(img);
    let paths: Vec<_> = expect.iter().map(|(p, _)| m.dir.join(p)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let got = getfattr(&refs);
    for ((p, want), path) in expect.iter().zip(paths.iter()) {
        assert_eq!(
            &got[&path.display().to_string()],
            want,
            "kernel view of /{p}"
        );
    }
    let facl = sh(&format!(
        "getfacl -n --absolute-names {}",
        m.dir.join("dir/acl").display()
    ));
    assert!(facl.contains("user:1000:rw-"), "{facl}");
    assert!(facl.contains("group:50:r--"), "{facl}");
    let dfacl = sh(&format!(
        "getfacl -n --absolute-names {}",
        m.dir.join("dir").display()
    ));
    assert!(dfacl.contains("default:user:1000:r-x"), "{dfacl}");
    let modes = sh(&format!(
        "stat -c %a {} {}",
        m.dir.join("dir/acl").display(),
        m.dir.join("inode-only").display()
    ));
    assert_eq!(modes, "660\n751\n");
    assert_eq!(
        std::fs::read_link(m.dir.join("sl")).unwrap(),
        Path::new("inode-only")
    );
    // The kernel can change what we wrote: its view after a change is what e2fsck accepts.
    sh(&format!(
        "set -e; cd {}; setfattr -n user.kernel -v k many; setfattr -x user.big block; \
         setfacl -m u:2000:r dir/acl",
        m.dir.display()
    ));
    let after = {
        let paths: Vec<_> = expect.iter().map(|(p, _)| m.dir.join(p)).collect();
        let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
        let got = getfattr(&refs);
        paths
            .iter()
            .map(|p| got[&p.display().to_string()].clone())
            .collect::<Vec<_>>()
    };
    drop(m);
    e2fsck_clean(img);
    // And uext4 reads the kernel's changes back.
    let fs = Fs::open_path(img, MountOptions::ro()).unwrap();
    for ((p, _), want) in expect.iter().zip(after.iter()) {
        assert_eq!(
            &ours(&fs, lookup_path(&fs, p)),
            want,
            "after the kernel: /{p}"
        );
    }
}

/// Attributes written by uext4: e2fsck clean, equal under the kernel; on several geometries.
#[test]
fn uext4_written_xattrs_pass_e2fsck_and_kernel() {
    for (tag, args, bs) in [
        ("w4k", &["-b", "4096"][..], 4096usize),
        ("w1k", &["-b", "1024"][..], 1024),
        ("w1k128", &["-b", "1024", "-I", "128"][..], 1024),
        (
            "w4knocsum",
            &["-b", "4096", "-O", "^metadata_csum"][..],
            4096,
        ),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "64M", args);
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let expect = populate(&fs, bs, !args.contains(&"128"));
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        // Read back after a fresh open.
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        for (p, want) in &expect {
            assert_eq!(
                &ours(&fs, lookup_path(&fs, p)),
                want,
                "{tag}: reopened /{p}"
            );
        }
        fs.unmount().unwrap();
        drop(fs);
        kernel_compare(&img.0, &expect);
    }
}

/// A block the kernel shares between two inodes is copied on write, and deleting an inode drops
/// its reference; the last reference frees the block.
#[test]
fn shared_block_copy_on_write_and_release() {
    if !can_loop_mount() || !have_attr_tools() {
        return;
    }
    let img = scratch("shared");
    mke2fs(&img.0, "64M", &[]);
    {
        let m = KernelMount::new(&img.0);
        sh(&format!(
            "set -e; cd {}; touch s1 s2 s3 s4; for f in s1 s2 s3 s4; do \
             setfattr -n user.same -v $(head -c 900 /dev/zero | tr '\\0' s) $f; done",
            m.dir.display()
        ));
    }
    let shared = file_acl(&img.0, "s1");
    assert_ne!(shared, 0);
    for f in ["s2", "s3", "s4"] {
        assert_eq!(file_acl(&img.0, f), shared, "kernel shared the block");
    }
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let ino = |n: &str| lookup_path(&fs, n);
    let same = fs.getxattr(ino("s1"), b"user.same").unwrap();
    // A change that leaves the block alone (small attribute into the inode) keeps sharing.
    fs.setxattr(ino("s1"), b"user.tiny", b"t", XattrFlags::Any)
        .unwrap();
    // A change to the block's contents copies it.
    fs.setxattr(ino("s2"), b"user.same", b"changed", XattrFlags::Any)
        .unwrap();
    fs.setxattr(ino("s3"), b"user.more", &vec![b'm'; 600], XattrFlags::Any)
        .unwrap();
    fs.unlink(2, b"s4").unwrap();
    assert_eq!(fs.getxattr(ino("s1"), b"user.same").unwrap(), same);
    assert_eq!(fs.getxattr(ino("s2"), b"user.same").unwrap(), b"changed");
    assert_eq!(fs.getxattr(ino("s3"), b"user.same").unwrap(), same);
    assert_eq!(
        fs.getxattr(ino("s3"), b"user.more").unwrap(),
        vec![b'm'; 600]
    );
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(file_acl(&img.0, "s1"), shared);
    assert_ne!(file_acl(&img.0, "s3"), shared);
    assert_ne!(file_acl(&img.0, "s3"), 0);
    let refcount = sh(&format!(
        "debugfs -R 'bd {shared}' {} 2>/dev/null | head -1",
        img.0.display()
    ));
    // Block header: magic 0xEA020000, then h_refcount (le32): s1 alone now.
    assert!(
        refcount.starts_with("0000  0000 02ea 0100 0000"),
        "shared block header: {refcount}"
    );
    // Now the last holder goes: the block is freed.
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let free0 = fs.statfs().blocks_free;
    fs.unlink(2, b"s1").unwrap();
    fs.unlink(2, b"s3").unwrap();
    assert!(fs.statfs().blocks_free >= free0 + 2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    {
        let m = KernelMount::new(&img.0);
        let p = m.dir.join("s2");
        let got = getfattr(&[p.as_path()]);
        assert_eq!(
            got[&p.display().to_string()][&b"user.same"[..]],
            b"changed".to_vec()
        );
    }
    e2fsck_clean(&img.0);
}

/// Deleting a file frees its xattr block (no root needed).
#[test]
fn unlink_frees_xattr_block() {
    let img = scratch("unlink");
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let free0 = fs.statfs().blocks_free;
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, b"user.big", &vec![1u8; 3000], XattrFlags::Any)
        .unwrap();
    let l = fs.symlink(2, b"l", b"f", 0, 0).unwrap().ino;
    fs.setxattr(l, b"trusted.big", &vec![2u8; 3000], XattrFlags::Any)
        .unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    fs.setxattr(d, b"user.big", &vec![3u8; 3000], XattrFlags::Any)
        .unwrap();
    assert!(fs.statfs().blocks_free < free0);
    fs.unlink(2, b"f").unwrap();
    fs.unlink(2, b"l").unwrap();
    fs.rmdir(2, b"d").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_eq!(fs.statfs().blocks_free, free0);
    fs.unmount().unwrap();
}

/// Many threads setting and removing attributes on their own files and on one shared file.
#[test]
fn concurrent_xattr_changes() {
    let img = scratch("conc");
    mke2fs(&img.0, "64M", &[]);
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let common_ino = fs.create(2, b"common", 0o644, 0, 0).unwrap().ino;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let own = fs
                    .create(2, format!("own-{t}").as_bytes(), 0o644, 0, 0)
                    .unwrap()
                    .ino;
                for i in 0..60 {
                    let v = vec![t as u8; 20 + (i * 37) % 700];
                    fs.setxattr(
                        own,
                        format!("user.k{}", i % 7).as_bytes(),
                        &v,
                        XattrFlags::Any,
                    )
                    .unwrap();
                    fs.setxattr(
                        common_ino,
                        format!("user.t{t}").as_bytes(),
                        &v[..v.len().min(200)],
                        XattrFlags::Any,
                    )
                    .unwrap();
                    if i % 5 == 4 {
                        fs.removexattr(own, format!("user.k{}", i % 7).as_bytes())
                            .unwrap();
                    }
                }
                own
            })
        })
        .collect();
    let owns: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let names = fs.listxattr(common_ino).unwrap();
    assert_eq!(names.len(), 8);
    for t in 0..8u8 {
        let v = fs
            .getxattr(common_ino, format!("user.t{t}").as_bytes())
            .unwrap();
        assert!(v.iter().all(|&b| b == t));
    }
    let expect: Vec<Xattrs> = owns.iter().map(|&o| ours(&fs, o)).collect();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    for (o, want) in owns.iter().zip(expect.iter()) {
        assert_eq!(&ours(&fs, *o), want);
    }
    fs.unmount().unwrap();
}

/// Corrupt xattr blocks and in-inode areas give Xattr corruption errors naming the inode, never a
/// panic.
#[test]
fn corrupt_xattrs_are_reported() {
    use std::io::{Read, Seek, SeekFrom, Write};
    for csum in [true, false] {
        let img = scratch("corrupt");
        let args: &[&str] = if csum { &[] } else { &["-O", "^metadata_csum"] };
        mke2fs(&img.0, "32M", args);
        let (f, g) = {
            let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
            let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
            fs.setxattr(f, b"user.big", &vec![5u8; 2000], XattrFlags::Any)
                .unwrap();
            let g = fs.create(2, b"g", 0o644, 0, 0).unwrap().ino;
            fs.setxattr(g, b"user.small", b"abc", XattrFlags::Any)
                .unwrap();
            fs.unmount().unwrap();
            (f, g)
        };
        e2fsck_clean(&img.0);
        let blk = file_acl(&img.0, "f");
        let poke = |off: u64, bytes: &[u8]| {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&img.0)
                .unwrap();
            file.seek(SeekFrom::Start(off)).unwrap();
            file.write_all(bytes).unwrap();
        };
        let peek = |off: u64, n: usize| {
            let mut file = std::fs::File::open(&img.0).unwrap();
            file.seek(SeekFrom::Start(off)).unwrap();
            let mut v = vec![0u8; n];
            file.read_exact(&mut v).unwrap();
            v
        };
        let open_ro = || Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        let base = blk * 4096;
        let saved = peek(base, 4096);
        // A flipped value byte: checksum error with metadata_csum (the value is read as is
        // without it).
        poke(base + 4000, &[0xAA]);
        {
            let fs = open_ro();
            let r = fs.getxattr(f, b"user.big");
            if csum {
                match r {
                    Err(Error::BadChecksum {
                        kind: Corruption::Xattr,
                        detail,
                    }) => assert!(detail.contains(&format!("inode {f}")), "{detail}"),
                    other => panic!("expected BadChecksum, got {other:?}"),
                }
            } else {
                assert!(r.is_ok());
            }
        }
        // Bad magic; then an entry whose value runs off the block.
        for (off, bytes) in [
            (0u64, &[0u8, 0, 0, 0][..]),
            (32 + 8, &[0xff, 0xff, 0, 0][..]),
        ] {
            poke(base, &saved);
            poke(base + off, bytes);
            let fs = open_ro();
            for r in [
                fs.getxattr(f, b"user.big").map(|_| ()),
                fs.listxattr(f).map(|_| ()),
            ] {
                match r {
                    Err(e) if e.corruption() == Some(Corruption::Xattr) => {
                        assert!(e.to_string().contains(&format!("inode {f}")), "{e}")
                    }
                    other => panic!("expected corruption, got {other:?}"),
                }
            }
        }
        poke(base, &saved);
        if !csum {
            // In-inode area garbage (no inode checksum to catch it first).
            let imap = sh(&format!(
                "debugfs -R 'imap <{g}>' {} 2>/dev/null",
                img.0.display()
            ));
            let i = imap.find("located at block ").unwrap();
            let rest = &imap[i + 17..];
            let iblk: u64 = rest.split(',').next().unwrap().parse().unwrap();
            let j = rest.find("offset 0x").unwrap();
            let ioff = u64::from_str_radix(
                rest[j + 9..]
                    .split(|c: char| !c.is_ascii_hexdigit())
                    .next()
                    .unwrap(),
                16,
            )
            .unwrap();
            let ibase = iblk * 4096 + ioff;
            let extra = u16::from_le_bytes(peek(ibase + 128, 2).try_into().unwrap()) as u64;
            let area = ibase + 128 + extra;
            assert_eq!(peek(area, 4), 0xEA02_0000u32.to_le_bytes());
            // Value size far past the inode.
            poke(area + 4 + 8, &[0, 0x10, 0, 0]);
            let fs = open_ro();
            match fs.getxattr(g, b"user.small") {
                Err(Error::Corrupt {
                    kind: Corruption::Xattr,
                    detail,
                }) => assert!(detail.contains(&format!("inode {g}")), "{detail}"),
                other => panic!("expected Corrupt, got {other:?}"),
            }
            // No terminator: all ones after the magic.
            poke(area + 4, &vec![0xff; (256 - 128 - extra - 4) as usize]);
            let fs = open_ro();
            assert!(matches!(
                fs.listxattr(g),
                Err(Error::Corrupt {
                    kind: Corruption::Xattr,
                    ..
                })
            ));
        }
    }
}

/// Power cuts during attribute changes: every crash state recovers to an image e2fsck accepts,
/// and each file's attributes are those of its last fsync or of a later change.
#[test]
fn xattr_crash_states_recover() {
    use uext4::blockdev::{MemDevice, RecordingDevice};
    let base = scratch("xcrash-base");
    mke2fs(&base.0, "32M", &["-J", "size=4"]);
    let dev = Arc::new(RecordingDevice::new(std::fs::read(&base.0).unwrap()));
    let opts = opts::no_timer();
    let fs = Fs::open_dev(dev.clone(), opts.clone()).unwrap();
    let files: Vec<u32> = (0..4)
        .map(|i| {
            fs.create(2, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino
        })
        .collect();
    fs.sync().unwrap();
    // Per file: (log length when this state was reached, state); and fsync acks (log length,
    // index into the history).
    let mut history: Vec<Vec<(usize, Xattrs)>> =
        files.iter().map(|_| vec![(0, Xattrs::new())]).collect();
    let mut acks: Vec<Vec<(usize, usize)>> =
        files.iter().map(|_| vec![(dev.log_len(), 0)]).collect();
    let mut rnd = xorshift(0x2545_F491_4F6C_DD1Du64);
    for step in 0..160u32 {
        let k = rnd() as usize % files.len();
        let ino = files[k];
        let name = format!("user.n{}", rnd() % 6);
        match rnd() % 5 {
            0 => {
                let _ = fs.removexattr(ino, name.as_bytes());
            }
            1 | 2 => {
                let len = [3usize, 40, 900, 1500][rnd() as usize % 4];
                fs.setxattr(
                    ino,
                    name.as_bytes(),
                    &vec![step as u8; len],
                    XattrFlags::Any,
                )
                .or_else(|e| match e {
                    Error::NoSpace => Ok(()),
                    e => Err(e),
                })
                .unwrap();
            }
            _ => {
                fs.setxattr(
                    ino,
                    name.as_bytes(),
                    format!("s{step}").as_bytes(),
                    XattrFlags::Any,
                )
                .unwrap();
            }
        }
        history[k].push((dev.log_len(), ours(&fs, ino)));
        if rnd().is_multiple_of(4) {
            fs.fsync(ino, false).unwrap();
            acks[k].push((dev.log_len(), history[k].len() - 1));
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let total = dev.log_len();
    // Crash points after the files were made durable: flush points, then random ones.
    let start = acks[0][0].0;
    let mut points: Vec<(usize, u64)> = dev
        .flush_points()
        .into_iter()
        .filter(|&f| f >= start)
        .map(|f| (f, 0))
        .collect();
    points.truncate(40);
    while points.len() < 100 {
        points.push((start + rnd() as usize % (total - start + 1), rnd() | 1));
    }
    println!(
        "xattr crash: {} states from a log of {total} entries ({} flushes, {} fsyncs)",
        points.len(),
        dev.flush_points().len(),
        acks.iter().map(|a| a.len() - 1).sum::<usize>()
    );
    let file = scratch("xcrash-state");
    for (at, mask) in points {
        let mut s = mask;
        let img = dev.crash_image(at, &mut |_| {
            if mask == 0 {
                return false;
            }
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % 3 != 0
        });
        let mdev = Arc::new(MemDevice::from_vec(img));
        let fs = Fs::open_dev(mdev.clone(), opts.clone()).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        std::fs::write(&file.0, mdev.to_vec()).unwrap();
        e2fsck_clean(&file.0);
        let fs = Fs::open_dev(mdev, opts.clone()).unwrap();
        for (k, &ino) in files.iter().enumerate() {
            let acked = acks[k]
                .iter()
                .filter(|(l, _)| *l <= at)
                .map(|&(_, i)| i)
                .next_back()
                .unwrap();
            let got = ours(&fs, ino);
            assert!(
                history[k][acked..].iter().any(|(_, st)| *st == got),
                "crash at {at}/{total} (mask {mask:#x}): file f{k} has {:?}, not its acknowledged state or a later one",
                got.keys().map(|n| String::from_utf8_lossy(n).into_owned()).collect::<Vec<_>>()
            );
        }
        fs.unmount().unwrap();
    }
}

/// `user.` attributes live on regular files and directories only, as the kernel's VFS rules:
/// on a symlink or a FIFO a change is EPERM and a read finds none; other namespaces are
/// allowed there.
#[test]
fn user_attributes_only_on_files_and_directories() {
    let img = scratch("xuser");
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let link = fs.symlink(2, b"link", b"target", 0, 0).unwrap().ino;
    let fifo = fs.mknod(2, b"fifo", 0o010644, 0, 0, 0).unwrap().ino;
    let file = fs.create(2, b"file", 0o644, 0, 0).unwrap().ino;
    for ino in [link, fifo] {
        assert!(matches!(
            fs.setxattr(ino, b"user.a", b"v", XattrFlags::Any),
            Err(Error::Perm)
        ));
        assert!(matches!(fs.removexattr(ino, b"user.a"), Err(Error::Perm)));
        assert!(matches!(fs.getxattr(ino, b"user.a"), Err(Error::NoAttr)));
        fs.setxattr(ino, b"trusted.a", b"v", XattrFlags::Any)
            .unwrap();
        assert_eq!(fs.getxattr(ino, b"trusted.a").unwrap(), b"v");
    }
    fs.setxattr(file, b"user.a", b"v", XattrFlags::Any).unwrap();
    fs.setxattr(2, b"user.a", b"v", XattrFlags::Any).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// The "system." namespace holds no users' attributes on ext4: the kernel has handlers for the
/// two POSIX ACL names only, so any other "system." name is EOPNOTSUPP, and an entry with the
/// internal index 7 (inline_data's "system.data", here made by debugfs) is never listed or
/// read, and survives another attribute's change.
#[test]
fn system_namespace_is_the_kernels() {
    let img = scratch("xsystem");
    mke2fs(&img.0, "32M", &[]);
    sh(&format!(
        "debugfs -w -R 'write /dev/null f' {0} && debugfs -w -R 'ea_set f system.data kept' {0}",
        img.0.display()
    ));
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let f = fs.lookup(2, b"f").unwrap().ino;
    for name in [&b"system.data"[..], b"system.foo", b"system.richacl"] {
        assert!(matches!(
            fs.setxattr(f, name, b"v", XattrFlags::Any),
            Err(Error::NotSupported(_))
        ));
        assert!(matches!(fs.getxattr(f, name), Err(Error::NotSupported(_))));
    }
    assert!(fs.listxattr(f).unwrap().is_empty());
    fs.setxattr(f, b"user.a", b"v", XattrFlags::Any).unwrap();
    assert_eq!(fs.listxattr(f).unwrap(), vec![b"user.a".to_vec()]);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let got = sh(&format!(
        "debugfs -R 'ea_get f system.data' {} 2>/dev/null",
        img.0.display()
    ));
    assert!(got.contains("kept"), "{got}");
}
