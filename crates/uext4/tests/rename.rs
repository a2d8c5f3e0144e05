//! renameat2's flags and O_TMPFILE in the engine, as overlayfs uses them on its upper layer:
//! RENAME_NOREPLACE, RENAME_EXCHANGE (files and directories, within and across directories:
//! '..' and link counts as the kernel's ext4_cross_rename leaves them), RENAME_WHITEOUT (the
//! source name becomes a 0/0 character device in the same transaction, as
//! ext4_whiteout_for_rename makes it), unknown flags refused, and tmpfiles (unnamed inodes on
//! the orphan list until a link names them). Every image is `e2fsck -fn` clean afterwards,
//! and where root can loop-mount, the same renames on the kernel's ext4 leave the same modes,
//! link counts and device numbers.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use uext4::{Error, Fs, MountOptions};
use uext4::{RenameFlags, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};

const S_IFMT: u16 = 0o170000;
const S_IFCHR: u16 = 0o020000;

fn ino(fs: &Fs, path: &str) -> u32 {
    let mut i = 2;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        i = fs
            .lookup(i, c.as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .ino;
    }
    i
}

fn exists(fs: &Fs, dir: u32, name: &str) -> bool {
    match fs.lookup(dir, name.as_bytes()) {
        Ok(_) => true,
        Err(Error::NotFound) => false,
        Err(e) => panic!("{name}: {e}"),
    }
}

fn read(fs: &Fs, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn file(fs: &Fs, dir: u32, name: &str, data: &[u8]) -> u32 {
    let i = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    fs.write(i, 0, data).unwrap();
    i
}

fn flags(bits: u32) -> RenameFlags {
    RenameFlags::from_bits(bits, 1000, 1001).unwrap()
}

fn new_image(tag: &str) -> Scratch {
    let img = scratch(tag);
    mke2fs(&img.0, "32M", &[]);
    img
}

#[test]
fn flag_bits_are_checked() {
    assert!(matches!(
        RenameFlags::from_bits(8, 0, 0),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        RenameFlags::from_bits(RENAME_EXCHANGE | RENAME_WHITEOUT, 0, 0),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        RenameFlags::from_bits(RENAME_EXCHANGE | RENAME_NOREPLACE, 0, 0),
        Err(Error::Invalid(_))
    ));
    let f = RenameFlags::from_bits(RENAME_NOREPLACE | RENAME_WHITEOUT, 5, 6).unwrap();
    assert!(f.noreplace && !f.exchange && f.whiteout == Some((5, 6)));
    assert_eq!(
        RenameFlags::from_bits(0, 0, 0).unwrap(),
        RenameFlags::default()
    );
}

#[test]
fn noreplace_and_exchange() {
    let img = new_image("rn-xchg");
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(2, b"b", 0o755, 0, 0).unwrap().ino;
    file(&fs, a, "x", b"X");
    file(&fs, a, "y", b"Y");
    // NOREPLACE: refused over an existing name, nothing changes; works onto a free one.
    assert!(matches!(
        fs.rename(a, b"x", a, b"y", flags(RENAME_NOREPLACE)),
        Err(Error::Exists)
    ));
    assert_eq!(read(&fs, ino(&fs, "a/x")), b"X");
    fs.rename(a, b"x", a, b"z", flags(RENAME_NOREPLACE))
        .unwrap();
    fs.rename(a, b"z", a, b"x", flags(RENAME_NOREPLACE))
        .unwrap();
    // EXCHANGE of two files in one directory.
    fs.rename(a, b"x", a, b"y", flags(RENAME_EXCHANGE)).unwrap();
    assert_eq!(read(&fs, ino(&fs, "a/x")), b"Y");
    assert_eq!(read(&fs, ino(&fs, "a/y")), b"X");
    // EXCHANGE needs both names.
    assert!(matches!(
        fs.rename(a, b"x", a, b"none", flags(RENAME_EXCHANGE)),
        Err(Error::NotFound)
    ));
    // A file and a directory across directories: the parents' link counts follow the
    // directory, and its '..' names its new parent.
    let d = fs.mkdir(b, b"d", 0o755, 0, 0).unwrap().ino;
    file(&fs, d, "inner", b"I");
    let (na, nb) = (fs.getattr(a).unwrap().nlink, fs.getattr(b).unwrap().nlink);
    fs.rename(a, b"x", b, b"d", flags(RENAME_EXCHANGE)).unwrap();
    assert_eq!(ino(&fs, "a/x"), d);
    assert_eq!(read(&fs, ino(&fs, "b/d")), b"Y");
    assert_eq!(ino(&fs, "a/x/.."), a);
    assert_eq!(fs.getattr(a).unwrap().nlink, na + 1);
    assert_eq!(fs.getattr(b).unwrap().nlink, nb - 1);
    // Two directories across directories: both '..' swap, the counts stay.
    let e = fs.mkdir(b, b"e", 0o755, 0, 0).unwrap().ino;
    let (na, nb) = (fs.getattr(a).unwrap().nlink, fs.getattr(b).unwrap().nlink);
    fs.rename(a, b"x", b, b"e", flags(RENAME_EXCHANGE)).unwrap();
    assert_eq!((ino(&fs, "a/x"), ino(&fs, "b/e")), (e, d));
    assert_eq!((ino(&fs, "a/x/.."), ino(&fs, "b/e/..")), (a, b));
    assert_eq!(read(&fs, ino(&fs, "b/e/inner")), b"I");
    assert_eq!(fs.getattr(a).unwrap().nlink, na);
    assert_eq!(fs.getattr(b).unwrap().nlink, nb);
    // A directory may not be exchanged into its own subtree.
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    assert!(matches!(
        fs.rename(b, b"e", sub, b"none2", flags(RENAME_NOREPLACE)),
        Err(Error::Loop)
    ));
    file(&fs, sub, "f", b"F");
    assert!(matches!(
        fs.rename(sub, b"f", b, b"e", flags(RENAME_EXCHANGE)),
        Err(Error::Loop)
    ));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

#[test]
fn whiteout_renames() {
    let img = new_image("rn-wh");
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let free0 = fs.statfs().files_free;
    let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(2, b"b", 0o755, 0, 0).unwrap().ino;
    let check_whiteout = |dir: u32, name: &str| {
        let at = fs.lookup(dir, name.as_bytes()).unwrap();
        assert_eq!(at.mode, S_IFCHR, "{name}: mode {:o}", at.mode);
        assert_eq!((at.rdev, at.nlink, at.size), (0, 1, 0), "{name}");
        assert_eq!((at.uid, at.gid), (1000, 1001), "{name}");
        let mut kind = None;
        fs.readdir(dir, 0, &mut |e| {
            if e.name == name.as_bytes() {
                kind = Some(e.kind);
            }
            true
        })
        .unwrap();
        assert_eq!(kind, Some(uext4::FT_CHRDEV), "{name}: entry type");
    };
    // Within one directory, onto a free name.
    let x = file(&fs, a, "x", b"X");
    fs.rename(a, b"x", a, b"x2", flags(RENAME_WHITEOUT))
        .unwrap();
    assert_eq!(ino(&fs, "a/x2"), x);
    check_whiteout(a, "x");
    // Over an existing file, which is freed.
    let y = file(&fs, a, "y", b"Y");
    let old = file(&fs, a, "old", b"OLD");
    fs.rename(a, b"y", a, b"old", flags(RENAME_WHITEOUT))
        .unwrap();
    assert_eq!(ino(&fs, "a/old"), y);
    assert!(fs.getattr(old).is_err(), "the replaced file was not freed");
    check_whiteout(a, "y");
    // NOREPLACE with WHITEOUT over an existing name: refused, nothing made.
    let used = fs.statfs().files_free;
    assert!(matches!(
        fs.rename(
            a,
            b"x2",
            a,
            b"old",
            flags(RENAME_NOREPLACE | RENAME_WHITEOUT)
        ),
        Err(Error::Exists)
    ));
    assert_eq!(fs.statfs().files_free, used);
    // Across directories, and a whiteout renamed again (overlayfs moves whiteouts around).
    fs.rename(
        a,
        b"x2",
        b,
        b"x3",
        flags(RENAME_WHITEOUT | RENAME_NOREPLACE),
    )
    .unwrap();
    check_whiteout(a, "x2");
    assert_eq!(read(&fs, ino(&fs, "b/x3")), b"X");
    fs.rename(a, b"x2", b, b"moved-whiteout", RenameFlags::default())
        .unwrap();
    // A directory, across directories: the old parent loses its link, the new gains one.
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    file(&fs, d, "in", b"IN");
    let (na, nb) = (fs.getattr(a).unwrap().nlink, fs.getattr(b).unwrap().nlink);
    fs.rename(a, b"d", b, b"d", flags(RENAME_WHITEOUT)).unwrap();
    check_whiteout(a, "d");
    assert_eq!(ino(&fs, "b/d/.."), b);
    assert_eq!(fs.getattr(a).unwrap().nlink, na - 1);
    assert_eq!(fs.getattr(b).unwrap().nlink, nb + 1);
    // A directory within its directory: the count stays.
    let na = fs.getattr(a).unwrap().nlink;
    fs.mkdir(a, b"e", 0o755, 0, 0).unwrap();
    fs.rename(a, b"e", a, b"e2", flags(RENAME_WHITEOUT))
        .unwrap();
    check_whiteout(a, "e");
    assert_eq!(fs.getattr(a).unwrap().nlink, na + 1);
    // The whiteouts are ordinary inodes to unlink.
    for n in ["x", "y", "d", "e"] {
        fs.unlink(a, n.as_bytes()).unwrap();
    }
    fs.unlink(b, b"moved-whiteout").unwrap();
    fs.rmdir(a, b"e2").unwrap();
    assert!(!exists(&fs, a, "x"));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    assert_eq!(read(&fs, ino(&fs, "b/d/in")), b"IN");
    assert!(fs.statfs().files_free < free0);
}

#[test]
fn whiteout_rename_on_a_full_inode_table_changes_nothing() {
    let img = scratch("rn-noino");
    mke2fs(&img.0, "4M", &["-N", "16", "-b", "1024"]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    file(&fs, 2, "src", b"S");
    let mut n = 0;
    while fs
        .create(2, format!("fill{n}").as_bytes(), 0o644, 0, 0)
        .is_ok()
    {
        n += 1;
    }
    assert!(matches!(
        fs.rename(2, b"src", 2, b"dst", flags(RENAME_WHITEOUT)),
        Err(Error::NoInodes)
    ));
    assert_eq!(read(&fs, ino(&fs, "src")), b"S");
    assert!(!exists(&fs, 2, "dst"));
    // Without a whiteout the same rename needs no inode.
    fs.rename(2, b"src", 2, b"dst", RenameFlags::default())
        .unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

#[test]
fn tmpfiles_are_orphans_until_linked() {
    let img = new_image("rn-tmp");
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let free0 = fs.statfs().files_free;
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    // Linked: visible with its data, one link, no longer an orphan.
    let t = fs.tmpfile(d, 0o640, 7, 8).unwrap();
    assert_eq!((t.nlink, t.mode), (0, 0o100640));
    fs.write(t.ino, 0, &vec![7u8; 50_000]).unwrap();
    let l = fs.link(t.ino, d, b"named").unwrap();
    assert_eq!(l.nlink, 1);
    fs.release(t.ino).unwrap();
    assert_eq!(read(&fs, ino(&fs, "d/named")), vec![7u8; 50_000]);
    // Never linked: freed at its release.
    let u = fs.tmpfile(d, 0o600, 0, 0).unwrap();
    fs.write(u.ino, 0, &vec![1u8; 90_000]).unwrap();
    fs.release(u.ino).unwrap();
    assert!(fs.getattr(u.ino).is_err());
    assert_eq!(fs.statfs().files_free, free0 - 2);
    // Open when the filesystem goes away without a release (a crash, or a server killed):
    // the orphan list frees it at the next open.
    let v = fs.tmpfile(d, 0o600, 0, 0).unwrap();
    fs.write(v.ino, 0, &vec![2u8; 30_000]).unwrap();
    fs.fsync(v.ino, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    // (e2fsck -n would report the orphan as a deleted inode with no dtime, as after a crash
    // with an O_TMPFILE open on the kernel's ext4.)
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert!(fs.getattr(v.ino).is_err(), "the orphan was not freed");
    assert_eq!(fs.statfs().files_free, free0 - 2);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// (mode, nlink, rdev, uid, gid) of every path under the root, and the entry types.
fn shape(fs: &Fs) -> BTreeMap<String, (u16, u32, u32, u32, u32, u8)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(2u32, String::new())];
    while let Some((dir, path)) = todo.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            entries.push(e);
            true
        })
        .unwrap();
        for e in entries {
            if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.ino).unwrap();
            out.insert(p.clone(), (a.mode, a.nlink, a.rdev, a.uid, a.gid, e.kind));
            if a.mode & S_IFMT == 0o040000 {
                todo.push((e.ino, p));
            }
        }
    }
    out
}

/// The same renames through uext4 and through the kernel's ext4 (renameat2 on a loop
/// mount) leave the same tree: types, modes, link counts, device numbers, owners.
#[test]
fn renames_match_the_kernel() {
    if !can_loop_mount() {
        return;
    }
    let ours = new_image("rn-k-ours");
    let theirs = new_image("rn-k-theirs");
    // The session: (op, from, to, flags) on a tree a/{x,y,d/},b/{e/,z}.
    let ops: &[(&str, &str, u32)] = &[
        ("a/x", "a/x2", RENAME_WHITEOUT),
        ("a/y", "b/z", RENAME_WHITEOUT),
        ("a/d", "b/d", RENAME_WHITEOUT),
        ("b/e", "a/x2", RENAME_EXCHANGE),
        ("b/d", "a/e", RENAME_NOREPLACE),
    ];
    {
        let fs = Fs::open_path(&ours.0, MountOptions::default()).unwrap();
        let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(2, b"b", 0o755, 0, 0).unwrap().ino;
        file(&fs, a, "x", b"x");
        file(&fs, a, "y", b"y");
        fs.mkdir(a, b"d", 0o755, 0, 0).unwrap();
        fs.mkdir(b, b"e", 0o755, 0, 0).unwrap();
        file(&fs, b, "z", b"z");
        for (from, to, f) in ops {
            let split = |p: &str| {
                let (d, n) = p.rsplit_once('/').unwrap();
                (ino(&fs, d), n.to_string())
            };
            let ((fd, fnm), (td, tnm)) = (split(from), split(to));
            fs.rename(
                fd,
                fnm.as_bytes(),
                td,
                tnm.as_bytes(),
                RenameFlags::from_bits(*f, 0, 0).unwrap(),
            )
            .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        }
        fs.unmount().unwrap();
    }
    e2fsck_clean(&ours.0);
    {
        let m = KernelMount::new(&theirs.0);
        let r = |p: &str| m.dir.join(p);
        std::fs::create_dir(r("a")).unwrap();
        std::fs::create_dir(r("b")).unwrap();
        std::fs::write(r("a/x"), b"x").unwrap();
        std::fs::write(r("a/y"), b"y").unwrap();
        std::fs::create_dir(r("a/d")).unwrap();
        std::fs::create_dir(r("b/e")).unwrap();
        std::fs::write(r("b/z"), b"z").unwrap();
        for (from, to, f) in ops {
            let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            let (cf, ct) = (c(&r(from)), c(&r(to)));
            // SAFETY: valid NUL-terminated paths.
            let rc = unsafe {
                libc::renameat2(libc::AT_FDCWD, cf.as_ptr(), libc::AT_FDCWD, ct.as_ptr(), *f)
            };
            assert_eq!(
                rc,
                0,
                "kernel {from} -> {to}: {}",
                std::io::Error::last_os_error()
            );
        }
        for p in ["a", "b", "a/x", "a/x2", "a/e", "b/z", "b/d"] {
            let _ = std::fs::metadata(r(p));
        }
    }
    e2fsck_clean(&theirs.0);
    let a = shape(&Fs::open_path(&ours.0, MountOptions::ro()).unwrap());
    let b = shape(&Fs::open_path(&theirs.0, MountOptions::ro()).unwrap());
    assert_eq!(a, b, "uext4 (left) and the kernel (right) differ");
}
