//! The image tools, driven through the built `uext4` binary: a host tree goes in and comes back
//! out equal (contents, holes, modes, owners, nanosecond times, symlinks, hard links, special
//! files); the namespace commands behave; every writing command leaves an image that
//! `e2fsck -fn` passes; errors are one line, exit 1 (usage errors 2) and never a panic.
//! Needs e2fsck (skips with a message without it); no root (owner checks only run as root).

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

/// A writing command, then `e2fsck -fn` on the image.
fn write_ok(img: &Scratch, args: &[&str]) -> String {
    let out = UEXT4.ok(args);
    e2fsck_clean_when(&img.0, &format!("after uext4 {args:?}"));
    out
}

fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let t = [
        libc::timespec {
            tv_sec: atime.0 as libc::time_t,
            tv_nsec: atime.1 as libc::c_long,
        },
        libc::timespec {
            tv_sec: mtime.0 as libc::time_t,
            tv_nsec: mtime.1 as libc::c_long,
        },
    ];
    // SAFETY: a valid C string and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The host tree every copy test uses: content, holes, odd modes, nanosecond times (past 2038
/// too), symlinks (relative, absolute, dangling), a hard link, a FIFO, a long and an odd name,
/// a directory with a few hundred entries, and (as root) other owners.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(root.join("many")).unwrap();
    std::fs::write(root.join("a.txt"), b"hello\n").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(
        root.join("sub/b.bin"),
        (0..300_000u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("../a.txt", root.join("sub/uplink")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", root.join("dangling")).unwrap();
    let long_target = "t/".repeat(100);
    std::os::unix::fs::symlink(&long_target, root.join("longlink")).unwrap();
    std::fs::hard_link(root.join("a.txt"), root.join("sub/hard")).unwrap();
    // Sparse: data at 0, at 10 MiB and at the end of 50 MiB; holes between.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(root.join("sparse")).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(&[0xabu8; 8192], 10 << 20).unwrap();
        f.write_all_at(b"end", (50 << 20) - 3).unwrap();
    }
    // A file that is all hole.
    std::fs::File::create(root.join("hole"))
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    for i in 0..300 {
        std::fs::write(root.join(format!("many/entry-{i:04}")), format!("{i}\n")).unwrap();
    }
    let long_name = "n".repeat(255);
    std::fs::write(root.join(&long_name), b"long name\n").unwrap();
    std::fs::write(root.join("with space é"), b"odd name\n").unwrap();
    std::fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff\xfe")),
        b"bytes\n",
    )
    .unwrap();
    let fifo = CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    std::fs::write(root.join("setuid"), b"#!/bin/sh\n").unwrap();
    std::fs::write(root.join("nothing"), b"x").unwrap();
    std::fs::create_dir(root.join("sticky")).unwrap();
    std::fs::create_dir(root.join("setgid")).unwrap();
    chmod(&root.join("setuid"), 0o4755);
    // Unreadable to its owner: only root can copy it.
    chmod(&root.join("nothing"), if is_root() { 0o000 } else { 0o444 });
    chmod(&root.join("sticky"), 0o1777);
    chmod(&root.join("setgid"), 0o2750);
    chmod(&root.join("sub/deeper"), 0o711);
    if is_root() {
        std::os::unix::fs::lchown(root.join("sub/b.bin"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(root.join("link"), Some(42), Some(43)).unwrap();
        std::os::unix::fs::lchown(root.join("sticky"), Some(7), Some(8)).unwrap();
    }
    // Extended attributes (where the host keeps them): small, large, on a directory, binary.
    if set_xattr(&root.join("a.txt"), "user.comment", b"a greeting") {
        assert!(set_xattr(&root.join("sub/b.bin"), "user.big", &[0x5a; 800]));
        assert!(set_xattr(&root.join("sub"), "user.dir", b""));
        assert!(set_xattr(
            &root.join("sub/b.bin"),
            "user.bin",
            &[0, 1, 2, 255]
        ));
    } else {
        eprintln!("SKIP (part): the host filesystem keeps no user xattrs; not copying any");
    }
    // Symlinks carry trusted. (root only) and security. attributes, never user. ones.
    if is_root() {
        assert!(set_xattr(&root.join("link"), "trusted.onlink", b"kept"));
    }
    // POSIX ACLs (system.posix_acl_access / _default xattrs), where setfacl is there.
    let acl = |args: &[&str], p: &Path| {
        Command::new("setfacl")
            .args(args)
            .arg(p)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !(acl(&["-m", "u:1234:rw,g:99:r"], &root.join("empty"))
        && acl(&["-d", "-m", "u:1234:rwx"], &root.join("sub/deeper")))
    {
        eprintln!("SKIP (part): no setfacl or no ACL support here; not copying ACLs");
    }
    // Nanosecond times, one past 2038 and one before 1970; directories last.
    set_times(
        &root.join("a.txt"),
        (1_600_000_000, 1),
        (1_500_000_000, 123_456_789),
    );
    set_times(
        &root.join("sub/b.bin"),
        (2_200_000_000, 5),
        (2_100_000_000, 987_654_321),
    );
    set_times(
        &root.join("empty"),
        (-1_000_000, 0),
        (-86_400 * 365, 999_999_999),
    );
    set_times(&root.join("link"), (1_400_000_000, 7), (1_300_000_000, 700));
    set_times(
        &root.join("sub/deeper"),
        (1_000_000_000, 1),
        (1_111_111_111, 111_111_111),
    );
    set_times(
        &root.join("sub"),
        (1_000_000_000, 2),
        (1_222_222_222, 222_222_222),
    );
}

/// Every path under `root`, relative, with its metadata (not following symlinks).
fn walk(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let md = std::fs::symlink_metadata(root.join(&rel)).unwrap();
        if md.is_dir() {
            for e in std::fs::read_dir(root.join(&rel)).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        out.push((rel, md));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `back` holds the same tree as `src` (whose metadata `a` was taken before anything read it,
/// since reading moves atimes): names, types, modes, sizes, contents, symlink targets,
/// nanosecond times, owners (as root), hard links.
fn assert_same_tree(src: &Path, a: &[(PathBuf, std::fs::Metadata)], back: &Path) {
    let b = walk(back);
    let names =
        |v: &[(PathBuf, std::fs::Metadata)]| v.iter().map(|e| e.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(a), names(&b), "same names");
    let mut links_a: HashMap<u64, PathBuf> = HashMap::new();
    let mut links_b: HashMap<u64, PathBuf> = HashMap::new();
    for ((rel, ma), (_, mb)) in a.iter().zip(b.iter()) {
        let what = rel.display();
        assert_eq!(ma.mode(), mb.mode(), "{what}: mode");
        assert_eq!(ma.len(), mb.len(), "{what}: size");
        if !ma.is_dir() {
            assert_eq!(ma.nlink(), mb.nlink(), "{what}: links");
        }
        assert_eq!(
            (ma.mtime(), ma.mtime_nsec()),
            (mb.mtime(), mb.mtime_nsec()),
            "{what}: mtime"
        );
        // (Directory atimes move when anything lists them, this walk included.)
        if !ma.file_type().is_symlink() && !ma.is_dir() {
            assert_eq!(
                (ma.atime(), ma.atime_nsec()),
                (mb.atime(), mb.atime_nsec()),
                "{what}: atime"
            );
        }
        if is_root() {
            assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
        }
        {
            let (xa, xb) = (xattrs(&src.join(rel)), xattrs(&back.join(rel)));
            let brief = |x: &[(Vec<u8>, Vec<u8>)]| {
                x.iter()
                    .map(|(n, v)| format!("{}={}b", String::from_utf8_lossy(n), v.len()))
                    .collect::<Vec<_>>()
            };
            assert!(
                xa == xb,
                "{what}: xattrs {:?} came back as {:?}",
                brief(&xa),
                brief(&xb)
            );
        }
        if ma.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(src.join(rel)).unwrap(),
                std::fs::read_link(back.join(rel)).unwrap(),
                "{what}: symlink target"
            );
        } else if ma.is_file() {
            assert_eq!(
                std::fs::read(src.join(rel)).unwrap(),
                std::fs::read(back.join(rel)).unwrap(),
                "{what}: contents"
            );
            if ma.nlink() > 1 {
                let fa = links_a.entry(ma.ino()).or_insert(rel.clone()).clone();
                let fb = links_b.entry(mb.ino()).or_insert(rel.clone()).clone();
                assert_eq!(fa, fb, "{what}: hard link to the same first name");
            }
        }
    }
    // And diff(1) agrees on contents.
    let d = Command::new("diff")
        .args(["-r", "--no-dereference", "--exclude=fifo"])
        .arg(src)
        .arg(back)
        .output();
    if let Ok(d) = d {
        assert!(
            d.status.success(),
            "diff -r: {}{}",
            String::from_utf8_lossy(&d.stdout),
            String::from_utf8_lossy(&d.stderr)
        );
    }
}

#[test]
fn tree_goes_in_and_comes_back_equal() {
    if !have(&["e2fsck"]) {
        return;
    }
    let img = Scratch::new("rt-img");
    let src = Scratch::new("rt-src");
    let back = Scratch::new("rt-back");
    make_tree(&src.0);
    let before = walk(&src.0);
    write_ok(&img, &["mkfs", "--size", "256M", img.s()]);
    assert!(UEXT4.ok(&["info", img.s()]).contains("metadata_csum"));
    write_ok(&img, &["cp", "-r", src.s(), &img.at("/src")]);

    // Read back without mounting.
    let ls = UEXT4.ok(&["ls", "-l", &img.at("/src")]);
    for want in [
        "a.txt",
        "link -> a.txt",
        "dangling -> /nowhere/at/all",
        "prw-r-----",
        "-rwsr-xr-x",
        "drwxrwxrwt",
        "drwxr-s---",
        if is_root() {
            "----------"
        } else {
            "-r--r--r--"
        },
        "with space é",
    ] {
        assert!(ls.contains(want), "ls -l lacks {want:?}:\n{ls}");
    }
    assert!(UEXT4
        .ok(&["ls", "-l", &img.at("/src/link")])
        .contains("/src/link -> a.txt"));
    let plain = UEXT4.ok(&["ls", &img.at("/src/many")]);
    assert_eq!(plain.lines().count(), 300);
    assert!(
        plain.lines().zip(plain.lines().skip(1)).all(|(a, b)| a < b),
        "sorted"
    );
    assert_eq!(UEXT4.ok(&["cat", &img.at("/src/link")]), "hello\n");
    assert_eq!(UEXT4.ok(&["cat", &img.at("/src/sub/uplink")]), "hello\n");
    assert_eq!(
        UEXT4.ok(&["cat", &img.at("/src/sub/../sub/deeper/../hard")]),
        "hello\n"
    );
    let cat = Command::new(UEXT4.0)
        .args(["cat", &img.at("/src/sub/b.bin")])
        .output()
        .unwrap();
    assert_eq!(cat.stdout, std::fs::read(src.0.join("sub/b.bin")).unwrap());
    let st = UEXT4.ok(&["stat", &img.at("/src/sub/hard")]);
    assert!(
        st.contains("Links: 2") && st.contains("regular file"),
        "{st}"
    );
    assert!(st.contains("Modify: 2017-07-14 02:40:00.123456789"), "{st}");
    let st = UEXT4.ok(&["stat", &img.at("/src/sub/b.bin")]);
    assert!(st.contains("Modify: 2036-07-18 13:20:00.987654321"), "{st}");
    assert!(st.contains("Size: 300000"), "{st}");
    if !xattrs(&src.0.join("a.txt")).is_empty() {
        let st = UEXT4.ok(&["stat", &img.at("/src/a.txt")]);
        assert!(st.contains("Extended attributes:\n  user.comment"), "{st}");
    }
    let st = UEXT4.ok(&["stat", &img.at("/src/setuid")]);
    assert!(st.contains("(4755/-rwsr-xr-x)"), "{st}");
    let st = UEXT4.ok(&["stat", &img.at("/src/link")]);
    assert!(
        st.contains("symbolic link") && st.contains("Size: 5"),
        "{st}"
    );
    // The holes stayed holes in the image: 50 MiB apparent, a few blocks allocated.
    let st = UEXT4.ok(&["stat", &img.at("/src/sparse")]);
    let blocks: u64 = st
        .split("Blocks: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(
        blocks < 200,
        "sparse file took {blocks} sectors in the image"
    );

    // Out again, and equal.
    std::fs::create_dir_all(&back.0).unwrap();
    UEXT4.ok(&["cp", "-r", &img.at("/src"), back.s()]);
    assert_same_tree(&src.0, &before, &back.0.join("src"));
    let sp = std::fs::metadata(back.0.join("src/sparse")).unwrap();
    assert!(
        sp.blocks() < 1024,
        "the sparse file stayed sparse on the host ({} sectors)",
        sp.blocks()
    );
    let hole = std::fs::metadata(back.0.join("src/hole")).unwrap();
    assert_eq!((hole.len(), hole.blocks()), (5 << 20, 0));

    // Image to image: into a second image (ext3: block maps, 1 KiB blocks), and within the
    // same one; then out and equal.
    let img2 = Scratch::new("rt-img2");
    let made = write_ok(
        &img2,
        &[
            "mkfs",
            "-t",
            "ext3",
            "--size",
            "128M",
            "--block-size",
            "1024",
            img2.s(),
        ],
    );
    assert!(made.contains(": ext3, 128 MiB"), "{made}");
    write_ok(&img2, &["cp", "-r", &img.at("/src"), &img2.at("/")]);
    write_ok(&img, &["cp", "-r", &img.at("/src"), &img.at("/again")]);
    let birth = |p: &str| {
        UEXT4
            .ok(&["stat", p])
            .lines()
            .find(|l| l.contains("Birth:"))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        birth(&img.at("/src/sub/b.bin")),
        birth(&img.at("/again/sub/b.bin")),
        "image to image keeps the creation time"
    );
    let back2 = Scratch::new("rt-back2");
    std::fs::create_dir_all(&back2.0).unwrap();
    UEXT4.ok(&[
        "cp",
        "-r",
        &img2.at("/src"),
        &back2.0.join("one").display().to_string(),
    ]);
    UEXT4.ok(&[
        "cp",
        "-r",
        &img.at("/again"),
        &back2.0.join("two").display().to_string(),
    ]);
    assert_same_tree(&src.0, &before, &back2.0.join("one"));
    assert_same_tree(&src.0, &before, &back2.0.join("two"));
}

#[test]
fn namespace_commands_behave() {
    if !have(&["e2fsck"]) {
        return;
    }
    let img = Scratch::new("ns-img");
    let host = Scratch::new("ns-host");
    std::fs::create_dir_all(&host.0).unwrap();
    write_ok(&img, &["mkfs", "--size", "64M", img.s()]);

    // mkdir, mkdir -p, through a symlinked component.
    write_ok(&img, &["mkdir", &img.at("/d")]);
    UEXT4.fails(&["mkdir", &img.at("/d")]);
    UEXT4.fails(&["mkdir", &img.at("/no/such/parent")]);
    write_ok(&img, &["mkdir", "-p", &img.at("/x/y/z")]);
    write_ok(&img, &["mkdir", "-p", &img.at("/x/y/z")]);
    write_ok(&img, &["ln", "-s", "x/y", &img.at("/toy")]);
    write_ok(&img, &["mkdir", "-p", &img.at("/toy/z/w")]);
    assert_eq!(UEXT4.ok(&["ls", &img.at("/x/y/z")]), "w\n");
    // '.' and '..' as the last name are refused, as rm(1) refuses them, and nothing goes:
    // `rm -r img:/.` emptied the whole filesystem before.
    for p in ["/.", "/x/..", "/x/y/z/.."] {
        assert!(
            UEXT4.fails(&["rm", "-r", &img.at(p)]).contains("refusing"),
            "{p}"
        );
    }
    assert!(UEXT4
        .fails(&["mkdir", &img.at("/x/..")])
        .contains("refusing"));
    assert_eq!(UEXT4.ok(&["ls", &img.at("/x/y/z")]), "w\n");
    assert!(UEXT4.ok(&["ls", &img.at("/")]).contains("lost+found"));

    // cp of single files, into a directory and to a new name; overwrite.
    let f = host.0.join("f.txt");
    std::fs::write(&f, b"one\n").unwrap();
    write_ok(&img, &["cp", f.to_str().unwrap(), &img.at("/d")]);
    write_ok(&img, &["cp", f.to_str().unwrap(), &img.at("/d/renamed")]);
    std::fs::write(&f, b"two, longer\n").unwrap();
    write_ok(&img, &["cp", f.to_str().unwrap(), &img.at("/d/f.txt")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/d/f.txt")]), "two, longer\n");
    assert_eq!(UEXT4.ok(&["cat", &img.at("/d/renamed")]), "one\n");
    UEXT4.fails(&["cp", host.s(), &img.at("/d")]); // a directory without -r
    UEXT4.fails(&["cp", &img.at("/x"), host.s()]);
    // Within one image: a copy of a file, a refused copy onto itself and into itself.
    write_ok(&img, &["cp", &img.at("/d/f.txt"), &img.at("/d/copy")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/d/copy")]), "two, longer\n");
    write_ok(&img, &["rm", &img.at("/d/copy")]);
    assert!(UEXT4
        .fails(&["cp", &img.at("/d/f.txt"), &img.at("/d")])
        .contains("same file"));
    assert!(UEXT4
        .fails(&["cp", "-r", &img.at("/x"), &img.at("/x/y/z")])
        .contains("into itself"));
    let out = host.0.join("out.txt");
    UEXT4.ok(&["cp", &img.at("/d/renamed"), out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), b"one\n");

    // ln: hard links count, symlinks resolve (relative to their directory, `..` included).
    write_ok(&img, &["ln", &img.at("/d/f.txt"), &img.at("/x/hard")]);
    assert!(UEXT4
        .ok(&["stat", &img.at("/d/f.txt")])
        .contains("Links: 2"));
    UEXT4.fails(&["ln", &img.at("/d/f.txt"), &img.at("/x/hard")]);
    UEXT4.fails(&["ln", &img.at("/x"), &img.at("/dirlink")]); // no hard links to directories
    write_ok(&img, &["ln", "-s", "../../d/f.txt", &img.at("/x/y/sym")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/x/y/sym")]), "two, longer\n");
    assert_eq!(UEXT4.ok(&["cat", &img.at("/toy/sym")]), "two, longer\n");
    write_ok(&img, &["ln", "-s", "loop2", &img.at("/loop1")]);
    write_ok(&img, &["ln", "-s", "loop1", &img.at("/loop2")]);
    assert!(UEXT4
        .fails(&["cat", &img.at("/loop1/x")])
        .contains("symbolic links"));

    // mv: rename, into a directory, a directory, refused into its own subtree.
    write_ok(&img, &["mv", &img.at("/d/renamed"), &img.at("/d/moved")]);
    write_ok(&img, &["mv", &img.at("/d/moved"), &img.at("/x")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/x/moved")]), "one\n");
    UEXT4.fails(&["cat", &img.at("/d/moved")]);
    write_ok(&img, &["mv", &img.at("/x/y"), &img.at("/d/ydir")]);
    assert_eq!(UEXT4.ok(&["ls", &img.at("/d/ydir")]), "sym\nz\n");
    UEXT4.fails(&["mv", &img.at("/d"), &img.at("/d/ydir/z")]);
    UEXT4.fails(&["mv", &img.at("/nothing"), &img.at("/d")]);

    // truncate: grow (a hole reads as zeros), shrink, sizes with suffixes.
    write_ok(&img, &["truncate", "-s", "3", &img.at("/x/hard")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/d/f.txt")]), "two");
    write_ok(&img, &["truncate", "-s", "1M", &img.at("/x/hard")]);
    let c = Command::new(UEXT4.0)
        .args(["cat", &img.at("/d/f.txt")])
        .output()
        .unwrap();
    assert_eq!(c.stdout.len(), 1 << 20);
    assert!(c.stdout[..3] == *b"two" && c.stdout[3..].iter().all(|&b| b == 0));
    UEXT4.fails_with(&["truncate", "-s", "12Q", &img.at("/x/hard")], 2);
    UEXT4.fails(&["truncate", "-s", "1", &img.at("/x")]);
    // A missing file is made, as truncate(1) makes it; with -c it is left missing, without an
    // error, as truncate(1) leaves it. Its directory must exist.
    write_ok(&img, &["truncate", "-s", "5K", &img.at("/x/new")]);
    let st = UEXT4.ok(&["stat", &img.at("/x/new")]);
    assert!(
        st.contains("Size: 5120") && st.contains("regular file"),
        "{st}"
    );
    write_ok(&img, &["truncate", "-c", "-s", "1", &img.at("/x/absent")]);
    UEXT4.fails(&["stat", &img.at("/x/absent")]);
    UEXT4.fails(&["truncate", "-s", "1", &img.at("/nodir/new")]);
    write_ok(&img, &["rm", &img.at("/x/new")]);

    // rm: files, directories need -r, -f ignores missing names, the root stays.
    write_ok(&img, &["rm", &img.at("/x/hard")]);
    assert!(UEXT4
        .ok(&["stat", &img.at("/d/f.txt")])
        .contains("Links: 1"));
    UEXT4.fails(&["rm", &img.at("/d")]);
    UEXT4.fails(&["rm", &img.at("/missing")]);
    write_ok(&img, &["rm", "-f", &img.at("/missing")]);
    write_ok(&img, &["rm", "-r", &img.at("/d")]);
    write_ok(&img, &["rm", &img.at("/toy")]);
    assert_eq!(UEXT4.ok(&["ls", &img.at("/x")]), "moved\n");
    UEXT4.fails(&["rm", "-r", &img.at("/")]);
    let ls = UEXT4.ok(&["ls", &img.at("/")]);
    assert_eq!(ls, "loop1\nloop2\nlost+found\nx\n");
}

#[test]
fn mkfs_options_and_info() {
    if !have(&["e2fsck"]) {
        return;
    }
    let img = Scratch::new("mk-img");
    write_ok(
        &img,
        &[
            "mkfs",
            "--size",
            "96M",
            "--block-size",
            "1024",
            "--journal-size",
            "8",
            "-L",
            "mylabel",
            "-O",
            "^metadata_csum,uninit_bg",
            img.s(),
        ],
    );
    let info = UEXT4.ok(&["info", img.s()]);
    assert!(info.contains("Volume name:              mylabel"), "{info}");
    assert!(info.contains("Block size:               1024"), "{info}");
    assert!(info.contains("Block count:              98304"), "{info}");
    assert!(info.contains("inode 8, 8192 KiB"), "{info}");
    assert!(
        info.contains("Journal log:              8192 blocks of 1024, sequence 1, empty"),
        "{info}"
    );
    assert!(info.contains("State:                    clean"), "{info}");
    assert!(
        !info.contains("metadata_csum") && info.contains("uninit_bg"),
        "{info}"
    );
    // Without a journal; then again over the same file, size taken from the file, and the
    // rest as mke2fs picks for 96 MiB (its "small" type: 1 KiB blocks, an inode per 4 KiB).
    // An existing filesystem is overwritten only when asked, and the refusal writes nothing.
    let before = std::fs::read(&img.0).unwrap();
    let e = UEXT4.fails(&["mkfs", "--journal-size", "0", img.s()]);
    assert!(e.contains("already holds") && e.contains("--force"), "{e}");
    assert!(std::fs::read(&img.0).unwrap() == before);
    write_ok(&img, &["mkfs", "--force", "--journal-size", "0", img.s()]);
    let info = UEXT4.ok(&["info", img.s()]);
    assert!(
        !info.contains("has_journal") && info.contains("Block size:               1024"),
        "{info}"
    );
    assert!(info.contains("Inode count:              24576"), "{info}");
    assert_eq!(std::fs::metadata(&img.0).unwrap().len(), 96 << 20);
    // The tools work on it.
    write_ok(&img, &["mkdir", &img.at("/nj")]);
    assert!(UEXT4.ok(&["ls", &img.at("/")]).contains("nj"));
}

/// A filesystem with a feature uext4 does not implement: the tools refuse it in one line that
/// names the feature, and leave it as it was; `info` still shows what its superblock says and
/// why it does not open.
#[test]
fn unsupported_features_are_named() {
    if !have(&["e2fsck"]) {
        return;
    }
    // (An external journal device: ea_inode and bigalloc, once refused, now open.)
    let (feature, says) = (
        "journal_dev",
        "unsupported incompatible feature: journal_dev",
    );
    let img = Scratch::new(&format!("unsup-{feature}"));
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", feature, img.s(), "32M"])
        .status()
        .unwrap();
    assert!(st.success());
    let before = std::fs::read(&img.0).unwrap();
    let src = Scratch::new("unsup-src");
    std::fs::write(&src.0, b"data").unwrap();
    let info = UEXT4.ok(&["info", img.s()]);
    assert!(info.contains(feature), "{info}");
    assert!(
        info.contains(&format!("Opens in uext4:           no: {says}")),
        "{info}"
    );
    assert!(info.contains("Block count:              32768"), "{info}");
    let ls = vec!["ls".to_string(), img.at("/")];
    refuses_in_one_line(&img, &src, &[ls], says, &before);
}

/// `mkdir`, `cp` and the `more` commands fail on `img` saying `says`, and leave it `before`.
fn refuses_in_one_line(
    img: &Scratch,
    src: &Scratch,
    more: &[Vec<String>],
    says: &str,
    before: &[u8],
) {
    let changes = [
        vec!["mkdir".to_string(), img.at("/d")],
        vec!["cp".to_string(), src.s().to_string(), img.at("/h")],
    ];
    for args in more.iter().chain(changes.iter()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert!(UEXT4.fails(&args).contains(says), "{args:?}");
    }
    assert!(
        std::fs::read(&img.0).unwrap() == before,
        "{}: the image changed",
        img.s()
    );
}

/// A bigalloc filesystem (allocation in clusters) is written by the tools: each change
/// leaves it e2fsck-clean, and `info` shows dumpe2fs's cluster size and free blocks (the
/// descriptors count clusters, the superblock blocks) before and after.
#[test]
fn bigalloc_tools_write() {
    if !have(&["mke2fs", "dumpe2fs"]) {
        return;
    }
    let img = Scratch::new("bigalloc-rw");
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", "bigalloc", "-C", "16384"])
        .args([img.s(), "32M"])
        .status()
        .unwrap();
    assert!(st.success());
    let src = Scratch::new("bigalloc-src");
    let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(&src.0, &data).unwrap();
    let agrees = || {
        let info = UEXT4.ok(&["info", img.s()]);
        assert!(!info.contains("Opens read-only:"), "{info}");
        let dumpe2fs = Command::new("dumpe2fs")
            .args(["-h", img.s()])
            .output()
            .unwrap();
        let dumpe2fs = String::from_utf8_lossy(&dumpe2fs.stdout);
        for field in ["Cluster size:", "Free blocks:"] {
            let line = |t: &str| t.lines().find(|l| l.starts_with(field)).map(str::to_string);
            assert_eq!(line(&info), line(&dumpe2fs), "{field}");
            assert!(line(&info).is_some(), "{field} in {info}");
        }
    };
    agrees();
    write_ok(&img, &["mkdir", &img.at("/d")]);
    write_ok(&img, &["cp", src.s(), &img.at("/d/f")]);
    write_ok(&img, &["cp", src.s(), &img.at("/g")]);
    let out = UEXT4.run(&["cat", &img.at("/d/f")]);
    assert!(out.status.success() && out.stdout == data, "cat /d/f");
    agrees();
    write_ok(&img, &["rm", "-r", &img.at("/d")]);
    agrees();
}

/// `uext4 mkfs -O bigalloc -C` with mke2fs's defaults otherwise: dumpe2fs -h equals
/// mke2fs's (bytes per inode raised to a cluster, as mke2fs raises its default); `-d` fills
/// it e2fsck-clean; -C without bigalloc is refused in one line.
#[test]
fn mkfs_bigalloc_like_mke2fs() {
    if !have(&["mke2fs", "dumpe2fs"]) {
        return;
    }
    // Less what differs by design: identities, times, checksums, and the journal's
    // checksum features, which uext4's journal sets from the start (as mkfs.rs's tests).
    let stable = |img: &Scratch| -> Vec<String> {
        let out = Command::new("dumpe2fs")
            .args(["-h", img.s()])
            .output()
            .unwrap();
        let skip = [
            "UUID",
            "Hash Seed",
            "time",
            "created",
            "Last checked",
            "Checksum",
            "Lifetime",
            "Journal features",
            "Journal checksum",
            "Journal users",
        ];
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !skip.iter().any(|s| l.contains(s)))
            .map(str::to_string)
            .collect()
    };
    for (size, cluster) in [("64M", "16K"), ("600M", "64K")] {
        let ours = Scratch::new("mkfs-bigalloc-ours");
        UEXT4.ok(&[
            "mkfs",
            "-O",
            "bigalloc",
            "-C",
            cluster,
            "--size",
            size,
            ours.s(),
        ]);
        e2fsck_clean(&ours.0);
        let theirs = Scratch::new("mkfs-bigalloc-theirs");
        std::fs::File::create(&theirs.0)
            .unwrap()
            .set_len(parse(size))
            .unwrap();
        let st = Command::new("mke2fs")
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-O",
                "bigalloc",
                "-C",
                cluster,
                theirs.s(),
            ])
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(stable(&ours), stable(&theirs), "{size}, -C {cluster}");
    }
    let dir = Scratch::new("mkfs-bigalloc-dir");
    std::fs::create_dir_all(dir.0.join("sub")).unwrap();
    let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
    std::fs::write(dir.0.join("sub/f"), &data).unwrap();
    std::fs::write(dir.0.join("small"), b"hi\n").unwrap();
    let img = Scratch::new("mkfs-bigalloc-d");
    UEXT4.ok(&[
        "mkfs",
        "-O",
        "bigalloc",
        "-C",
        "16K",
        "--size",
        "64M",
        "-d",
        dir.s(),
        img.s(),
    ]);
    e2fsck_clean(&img.0);
    let out = UEXT4.run(&["cat", &img.at("/sub/f")]);
    assert!(out.status.success() && out.stdout == data, "cat /sub/f");
    let no = Scratch::new("mkfs-bigalloc-no");
    let err = UEXT4.fails(&["mkfs", "-C", "16K", "--size", "64M", no.s()]);
    assert!(
        err.contains("needs the bigalloc feature") && err.lines().count() == 1,
        "{err}"
    );
}

fn parse(size: &str) -> u64 {
    size.trim_end_matches('M').parse::<u64>().unwrap() << 20
}

#[test]
fn errors_are_one_line() {
    let img = Scratch::new("err-img");
    let zeros = Scratch::new("err-zeros");
    let short = Scratch::new("err-short");
    std::fs::write(&zeros.0, vec![0u8; 1 << 20]).unwrap();
    UEXT4.ok(&["mkfs", "--size", "32M", img.s()]);
    UEXT4.ok(&["mkdir", &img.at("/d")]);
    let i = img.s();
    assert!(UEXT4
        .fails(&["cat", &img.at("/nope")])
        .contains("no such file"));
    assert!(UEXT4
        .fails(&["ls", &img.at("/nope/deeper")])
        .contains("no such file"));
    assert!(UEXT4
        .fails(&["cat", &img.at("/d")])
        .contains("is a directory"));
    assert!(UEXT4
        .fails(&["ls", &zeros.at("/")])
        .contains("not an ext2/3/4 filesystem"));
    assert!(UEXT4
        .fails(&["info", zeros.s()])
        .contains("not an ext2/3/4 filesystem"));
    UEXT4.fails(&["cp", "-r", &zeros.at("/"), "/tmp/uext4-never"]);
    assert!(UEXT4
        .fails(&["ls", "/no/such/image.img:/"])
        .contains("no such image"));
    assert!(UEXT4
        .fails(&["info", "/no/such/image.img"])
        .contains("/no/such/image.img"));
    assert!(UEXT4
        .fails(&["mkfs", "--block-size", "2048", "--size", "32M", i])
        .contains("1024 or 4096"));
    assert!(UEXT4.fails(&["mkfs", "-O", "bogus", i]).contains("bogus"));
    let never = img.0.with_extension("never").display().to_string();
    assert!(UEXT4
        .fails(&["mkfs", "-t", "xfs", "--size", "32M", &never])
        .contains("\"xfs\""));
    assert!(UEXT4
        .fails(&["mkfs", "-t", "ext3", "-O", "64bit", "--size", "32M", &never])
        .contains("64bit needs the extent feature"));
    assert!(
        !std::path::Path::new(&never).exists(),
        "a refused mkfs made no file"
    );
    UEXT4.fails(&["mkfs", "--size", "64K", short.s()]);
    // A size that is not one is a usage mistake: exit 2.
    UEXT4.fails_with(&["mkfs", "--size", "lots", short.s()], 2);
    assert!(UEXT4
        .fails(&["mkfs", &short.0.join("x.img").display().to_string()])
        .contains("--size"));
    UEXT4.fails(&["mv", &img.at("/d"), &zeros.at("/d")]);
    UEXT4.fails(&["rm", &img.at("/lost+found")]);
    // (An unknown mount option is a usage error or a plain one: exit 2 or 1.)
    let o = UEXT4.run(&["mount", "-o", "nosuchoption", i, "/tmp"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(1 | 2)), "mount: {err}");
    assert!(
        err.trim().lines().count() == 1 && err.contains("nosuchoption"),
        "{err}"
    );
    // Usage errors: clap's message in one line, exit status 2.
    UEXT4.fails_with(&["frobnicate"], 2);
    UEXT4.fails_with(&["ls", "--bogus", &img.at("/")], 2);
    UEXT4.fails_with(&["mkfs"], 2);
    UEXT4.fails_with(&["truncate", &img.at("/d")], 2);
    // A truncated image: the first MiB of a real one.
    let data = std::fs::read(&img.0).unwrap();
    std::fs::write(&short.0, &data[..1 << 20]).unwrap();
    for args in [
        vec!["ls", "-l"],
        vec!["cat"],
        vec!["mkdir"],
        vec!["rm", "-r"],
    ] {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push(short.at("/d/x"));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        UEXT4.fails(&a);
    }
    if have(&["e2fsck"]) {
        e2fsck_clean_when(&img.0, "after the failed commands");
    }
}

#[test]
fn damaged_images_give_errors_not_panics() {
    let img = Scratch::new("dmg-img");
    let bad = Scratch::new("dmg-bad");
    let src = Scratch::new("dmg-src");
    std::fs::create_dir_all(src.0.join("d/e")).unwrap();
    for i in 0..40 {
        std::fs::write(src.0.join(format!("d/f{i}")), vec![i as u8; i * 1000]).unwrap();
    }
    std::fs::write(src.0.join("d/e/big"), vec![7u8; 3 << 20]).unwrap();
    UEXT4.ok(&["mkfs", "--size", "16M", "--block-size", "1024", img.s()]);
    UEXT4.ok(&["cp", "-r", src.s(), &img.at("/s")]);
    let clean = std::fs::read(&img.0).unwrap();
    // Damage a run of bytes in a metadata-rich area (the first 2 MiB) at pseudo-random places.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let out = Scratch::new("dmg-out");
    let n = if std::env::var_os("UEXT4_QUICK").is_some() {
        40
    } else {
        120
    };
    for _ in 0..n {
        let mut d = clean.clone();
        let at = (next() % (2 << 20)) as usize;
        let len = 1 + (next() % 64) as usize;
        for b in &mut d[at..(at + len).min(clean.len())] {
            *b = next() as u8;
        }
        std::fs::write(&bad.0, &d).unwrap();
        for args in [
            vec!["ls".to_string(), "-l".to_string(), bad.at("/s/d")],
            vec!["cat".to_string(), bad.at("/s/d/e/big")],
            vec![
                "cp".to_string(),
                "-r".to_string(),
                bad.at("/s"),
                out.s().to_string(),
            ],
            vec![
                "mkdir".to_string(),
                "-p".to_string(),
                bad.at("/s/d/new/deeper"),
            ],
            vec!["rm".to_string(), "-r".to_string(), bad.at("/s/d")],
        ] {
            let o = Command::new(UEXT4.0).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !err.contains("panicked"),
                "damage at {at}+{len}: uext4 {args:?}: {err}"
            );
            assert!(
                matches!(o.status.code(), Some(0 | 1)),
                "damage at {at}+{len}: uext4 {args:?}: status {:?}: {err}",
                o.status
            );
            if !o.status.success() {
                assert_eq!(err.trim().lines().count(), 1, "uext4 {args:?}: {err}");
            }
        }
        let _ = std::fs::remove_dir_all(&out.0);
    }
}

/// An image left as a crash leaves it: committed transactions not yet home (or home with
/// needs_recovery still set), and on the orphan list a file unlinked while open and a file
/// being truncated. Returns the image's bytes.
fn crashed_image_with_orphans(size: &str) -> Vec<u8> {
    let img = Scratch::new("crash-src");
    UEXT4.ok(&["mkfs", "--size", size, img.s()]);
    let dev = std::sync::Arc::new(uext4::blockdev::MemDevice::from_vec(
        std::fs::read(&img.0).unwrap(),
    ));
    let fs = uext4::Fs::open_dev(
        dev.clone(),
        uext4::MountOptions {
            commit_interval_secs: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let root = fs.root_ino();
    let kept = fs.create(root, b"kept", 0o644, 0, 0).unwrap().ino;
    fs.write(kept, 0, b"kept before the crash\n").unwrap();
    let gone = fs.create(root, b"open-unlinked", 0o644, 0, 0).unwrap().ino;
    fs.write(gone, 0, &vec![7u8; 300_000]).unwrap();
    fs.sync().unwrap();
    fs.open(gone).unwrap();
    fs.unlink(root, b"open-unlinked").unwrap();
    fs.mkdir(root, b"left-behind", 0o755, 0, 0).unwrap();
    fs.commit().unwrap();
    let crashed = dev.to_vec();
    std::mem::forget(fs);
    crashed
}

fn sha(p: &Path) -> Vec<u8> {
    // The bytes themselves: images here are small, and equality is what counts.
    std::fs::read(p).unwrap()
}

/// Every read-only path leaves the image byte for byte as it was, on a clean image and on one
/// whose journal needs recovery and whose orphan list is not empty: the tools that read, `cp`
/// out of the image, the library's read-only open, `mount -o ro` and `-o norecovery`, and an
/// image on a read-only filesystem. A dirty image is seen recovered (the journal replayed in
/// memory); `norecovery` shows it as it is on disk. The first read-write open then replays it
/// for real, frees the orphans, and e2fsck finds it clean.
#[test]
fn read_only_paths_never_write_the_image() {
    if !have(&["e2fsck"]) {
        return;
    }
    let dir = Scratch::new("ro-dir");
    std::fs::create_dir_all(&dir.0).unwrap();
    let img = dir.0.join("img");
    let is = img.to_str().unwrap().to_string();
    let at = |p: &str| format!("{is}:{p}");
    let out = Scratch::new("ro-out");
    for dirty in [false, true] {
        if dirty {
            std::fs::write(&img, crashed_image_with_orphans("64M")).unwrap();
        } else {
            let _ = std::fs::remove_file(&img);
            UEXT4.ok(&["mkfs", "--size", "64M", &is]);
            UEXT4.ok(&["mkdir", &at("/left-behind")]);
            UEXT4.ok(&["cp", "/etc/hostname", &at("/kept")]);
        }
        let before = sha(&img);
        let o = UEXT4.run(&["info", &is]);
        assert!(o.status.success(), "{o:?}");
        let info = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            info.contains("Needs recovery:           yes"),
            dirty,
            "{info}"
        );
        // The image as on disk, apart from the replayed view: dumpe2fs's journal start.
        assert_eq!(
            info.contains("(holds transactions to replay)"),
            dirty,
            "{info}"
        );
        let dump = sh(&format!("dumpe2fs -h {is} 2>/dev/null"));
        let start = dump
            .lines()
            .find_map(|l| l.strip_prefix("Journal start:"))
            .unwrap()
            .trim();
        assert!(
            info.contains(&format!("Journal start:            {start}")),
            "{info}"
        );
        let note = String::from_utf8_lossy(&o.stderr);
        assert_eq!(note.contains("replayed in memory only"), dirty, "{note}");
        // --quiet: no note, the same listing.
        let q = UEXT4.run(&["--quiet", "info", &is]);
        assert!(q.status.success() && q.stderr.is_empty(), "{q:?}");
        assert_eq!(q.stdout, o.stdout);
        let ls = UEXT4.ok(&["ls", &at("/")]);
        assert!(ls.contains("left-behind") && ls.contains("kept"), "{ls}");
        assert!(!ls.contains("open-unlinked"), "{ls}");
        UEXT4.ok(&["ls", "-l", &at("/")]);
        UEXT4.ok(&["stat", &at("/kept")]);
        UEXT4.ok(&["cat", &at("/kept")]);
        let _ = std::fs::remove_dir_all(&out.0);
        UEXT4.ok(&["cp", "-r", &at("/"), out.s()]);
        assert!(out.0.join("left-behind").is_dir());
        {
            let fs = uext4::Fs::open_path(&img, uext4::MountOptions::ro()).unwrap();
            assert_eq!(fs.journal_replayed_in_memory(), dirty);
            assert!(fs.lookup(fs.root_ino(), b"left-behind").is_ok());
            fs.unmount().unwrap();
        }
        {
            let fs = uext4::Fs::open_path(
                &img,
                uext4::MountOptions {
                    norecovery: true,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(fs.is_read_only());
            assert!(!fs.journal_replayed_in_memory());
            fs.unmount().unwrap();
        }
        assert!(
            sha(&img) == before,
            "a read-only tool changed the image (dirty {dirty})"
        );
        if fuse_usable("the mount part") {
            let mnt = Scratch::new("ro-mnt");
            std::fs::create_dir_all(&mnt.0).unwrap();
            for opts in ["ro", "norecovery"] {
                UEXT4.ok(&["mount", "-o", opts, &is, mnt.s()]);
                let names: Vec<String> = std::fs::read_dir(&mnt.0)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                let r = std::fs::write(mnt.0.join("new"), "x");
                UEXT4.ok(&["umount", mnt.s()]);
                assert!(r.is_err(), "a write through -o {opts} succeeded");
                // Without recovery, what the journal holds is not seen.
                let sees = names.iter().any(|n| n == "left-behind");
                assert!(
                    sees || (dirty && opts == "norecovery"),
                    "-o {opts}: {names:?}"
                );
                assert!(sha(&img) == before, "mount -o {opts} changed the image");
            }
            // The image on a read-only filesystem (a bind mount made read-only).
            let ro = Scratch::new("ro-bind");
            std::fs::create_dir_all(&ro.0).unwrap();
            let bind = |args: &[&str]| {
                Command::new("mount")
                    .args(args)
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            if bind(&["--bind", dir.s(), ro.s()]) && bind(&["-o", "remount,bind,ro", ro.s()]) {
                let rimg = ro.0.join("img");
                let ri = rimg.to_str().unwrap();
                assert!(UEXT4
                    .ok(&["ls", &format!("{ri}:/")])
                    .contains("left-behind"));
                UEXT4.ok(&["mount", "-o", "ro", ri, mnt.s()]);
                assert!(mnt.0.join("left-behind").is_dir());
                UEXT4.ok(&["umount", mnt.s()]);
                let err = UEXT4.fails(&["mkdir", &format!("{ri}:/x")]);
                assert!(err.contains("cannot be written: the image"), "{err}");
                let _ = Command::new("umount").arg(&ro.0).output();
            } else {
                eprintln!("SKIP: a read-only bind mount could not be made");
            }
            assert!(sha(&img) == before, "the read-only file changed");
        }
        // The first read-write open replays and frees the orphans for real.
        UEXT4.ok(&["mkdir", &at("/after")]);
        assert!(sha(&img) != before || !dirty);
        let o = Command::new("e2fsck")
            .arg("-fn")
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "e2fsck after the read-write open (dirty {dirty}): {}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(UEXT4.ok(&["ls", &at("/")]).contains("left-behind"));
    }
}

/// A read-write open is refused while another program writes the image (here a process with
/// it open for writing, as fuse2fs or e2fsck would have it), naming that program; a reader
/// does not stop it. Nothing is written before the refusal.
#[test]
fn a_second_writer_is_refused_by_name() {
    if !have(&["e2fsck"]) {
        return;
    }
    let img = Scratch::new("writer-img");
    UEXT4.ok(&["mkfs", "--size", "64M", img.s()]);
    let before = sha(&img.0);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let reader = Kill(
        Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&img.0).unwrap())
            .spawn()
            .unwrap(),
    );
    let writer = Kill(
        Command::new("sleep")
            .arg("60")
            .stdout(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&img.0)
                    .unwrap(),
            )
            .spawn()
            .unwrap(),
    );
    for args in [
        &["mkdir", &img.at("/x")][..],
        &["mkfs", img.s()][..],
        &["cp", "/etc/hostname", &img.at("/h")][..],
    ] {
        let err = UEXT4.fails(args);
        assert!(
            err.contains("in use") && err.contains(&format!("sleep (pid {})", writer.0.id())),
            "{args:?}: {err}"
        );
    }
    assert!(sha(&img.0) == before);
    // Readers read on.
    UEXT4.ok(&["ls", &img.at("/")]);
    drop(writer);
    write_ok(&img, &["mkdir", &img.at("/x")]);
    drop(reader);
}

#[test]
fn progress_bar_only_on_a_terminal() {
    let img = Scratch::new("pb-img");
    let src = Scratch::new("pb-src");
    std::fs::write(&src.0, vec![0x42u8; 64 << 20]).unwrap();
    UEXT4.ok(&["mkfs", "--size", "256M", img.s()]);
    // Not a terminal: nothing on stderr.
    let o = UEXT4.run(&["cp", src.s(), &img.at("/plain")]);
    assert!(o.status.success() && o.stderr.is_empty(), "{:?}", o);
    // A terminal (script(1) gives the command a pseudo-terminal): a bar is drawn.
    let have_script = Command::new("script")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have_script {
        eprintln!("SKIP (part): no script(1) to give uext4 a terminal");
        return;
    }
    let cmd = format!("{} cp {} {}", UEXT4.0, src.s(), img.at("/tty"));
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains('█') || out.contains('░'),
        "no progress bar drawn: {out:?}"
    );
    assert!(UEXT4
        .ok(&["stat", &img.at("/tty")])
        .contains("Size: 67108864"));
}

/// A directory entry that leads back up the tree (corruption: debugfs's `ln` adds one without
/// checks) stops `rm -r` and `cp -r` with an error naming the cycle; before, `rm -r` overflowed
/// the stack and a copy inside the image recursed until the image was full. Copying a
/// directory into its own subdirectory is refused as cp(1) refuses it.
#[test]
fn directory_cycles_and_copies_into_themselves_are_refused() {
    if !have(&["e2fsck"]) {
        return;
    }
    let img = Scratch::new("cycle-img");
    let out = Scratch::new("cycle-out");
    UEXT4.ok(&["mkfs", "--size", "32M", img.s()]);
    UEXT4.ok(&["mkdir", "-p", &img.at("/a/b")]);
    UEXT4.ok(&["cp", "/etc/hostname", &img.at("/a/f")]);
    let into = UEXT4.fails(&["cp", "-r", &img.at("/a"), &img.at("/a/b")]);
    assert!(into.contains("into itself"), "{into}");
    e2fsck_clean_when(&img.0, "after a refused copy into itself");

    let st = Command::new("debugfs")
        .args(["-w", "-R", "ln <2> a/b/up", img.s()])
        .output()
        .unwrap();
    assert!(st.status.success(), "debugfs ln failed");
    for args in [
        vec!["rm", "-r", &img.at("/a")],
        vec!["cp", "-r", &img.at("/a"), out.s()],
        vec!["cp", "-r", &img.at("/a"), &img.at("/copy")],
    ] {
        let err = UEXT4.fails(&args);
        // Inside one image the walk may first meet the copy it is making, under the root
        // that the bad entry leads to.
        assert!(
            err.contains("directory cycle") || err.contains("into itself"),
            "uext4 {args:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&out.0);
    // What the refused commands did before stopping is still a listable tree.
    let listing = UEXT4.ok(&["ls", &img.at("/")]);
    assert!(listing.contains('a'), "{listing}");
}

/// Copying a tree again over an earlier copy replaces what is there, symlinks and hard links
/// included, as cp(1) does (it stopped with "file exists" at the first symlink); a
/// non-directory over a directory is refused by name. Host to image and image to image.
#[test]
fn copying_over_an_earlier_copy_replaces_links() {
    let img = Scratch::new("recopy-img");
    let src = Scratch::new("recopy-src");
    std::fs::create_dir_all(src.0.join("t")).unwrap();
    std::fs::write(src.0.join("t/a"), b"first").unwrap();
    std::fs::hard_link(src.0.join("t/a"), src.0.join("t/b")).unwrap();
    std::os::unix::fs::symlink("a", src.0.join("t/l")).unwrap();
    UEXT4.ok(&["mkfs", "--size", "16M", img.s()]);
    let t = src.0.join("t");
    write_ok(&img, &["cp", "-r", t.to_str().unwrap(), &img.at("/")]);
    std::fs::remove_file(src.0.join("t/a")).unwrap();
    std::fs::remove_file(src.0.join("t/b")).unwrap();
    std::fs::write(src.0.join("t/a"), b"second").unwrap();
    std::fs::hard_link(src.0.join("t/a"), src.0.join("t/b")).unwrap();
    std::fs::remove_file(src.0.join("t/l")).unwrap();
    std::os::unix::fs::symlink("b", src.0.join("t/l")).unwrap();
    write_ok(&img, &["cp", "-r", t.to_str().unwrap(), &img.at("/")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/t/a")]), "second");
    assert_eq!(UEXT4.ok(&["cat", &img.at("/t/b")]), "second");
    assert_eq!(UEXT4.ok(&["cat", &img.at("/t/l")]), "second");
    let ls = UEXT4.ok(&["ls", "-l", &img.at("/t")]);
    assert!(ls.contains("l -> b"), "{ls}");
    // Inside the image, over an earlier copy too.
    write_ok(&img, &["cp", "-r", &img.at("/t"), &img.at("/u")]);
    write_ok(&img, &["cp", "-r", &img.at("/t"), &img.at("/u")]);
    assert_eq!(UEXT4.ok(&["cat", &img.at("/u/l")]), "second");
    // A symlink where the copy has a directory.
    write_ok(&img, &["mkdir", &img.at("/v")]);
    write_ok(&img, &["mkdir", &img.at("/v/l")]);
    std::fs::remove_file(src.0.join("t/b")).unwrap();
    std::fs::create_dir(src.0.join("v")).unwrap();
    std::os::unix::fs::symlink("a", src.0.join("v/l")).unwrap();
    let err = UEXT4.fails(&["cp", "-r", src.0.join("v").to_str().unwrap(), &img.at("/")]);
    assert!(err.contains("cannot overwrite directory l"), "{err}");
    e2fsck_clean_when(&img.0, "after the refused copy");
}

// ---- partitions and offsets ----

/// `e2fsck -fn 'IMAGE?offset=BYTES'`: must be clean.
fn fsck_at(img: &Path, offset: u64, when: &str) {
    let o = Command::new("e2fsck")
        .arg("-fn")
        .arg(format!("{}?offset={offset}", img.display()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "e2fsck at offset {offset} {when}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Fills `start..start + len` of the file with a pattern that names its place.
fn fill_pattern(img: &Path, start: u64, len: u64, seed: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    let buf: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ seed).collect();
    f.write_all_at(&buf, start).unwrap();
}

/// Everything of the file outside `start..end` (tables, neighbours, headers, trailers).
fn outside(img: &Path, start: u64, end: u64) -> Vec<u8> {
    let v = std::fs::read(img).unwrap();
    [&v[..start as usize], &v[end as usize..]].concat()
}

const SECTOR: u64 = 512;
// Partition 1: sectors 2048..10240 (4 MiB), partition 2 (ext4): 10240..59392 (24 MiB),
// partition 3: from 59392 to the end (the table's own end for GPT).
const P2: (u64, u64) = (10240 * SECTOR, 59392 * SECTOR);

/// A 32 MiB whole-disk image with three partitions, made by sgdisk (GPT) or sfdisk (MBR);
/// partitions 1 and 3 filled with patterns. None (and a SKIP) without the tool.
fn partitioned_disk(tag: &str, gpt: bool) -> Option<Scratch> {
    let disk = Scratch::new(tag);
    std::fs::File::create(&disk.0)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let ok = if gpt {
        if !have(&["sgdisk"]) {
            return None;
        }
        Command::new("sgdisk")
            .args([
                "-n",
                "1:2048:10239",
                "-c",
                "1:before",
                "-n",
                "2:10240:59391",
            ])
            .args(["-c", "2:data", "-n", "3:59392:0", "-c", "3:after", disk.s()])
            .output()
            .unwrap()
            .status
            .success()
    } else {
        if !have(&["sfdisk"]) {
            return None;
        }
        use std::io::Write;
        let mut c = Command::new("sfdisk")
            .arg(disk.s())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(b"label: dos\n2048,8192,83\n10240,49152,83\n59392,,83\n")
            .unwrap();
        c.wait().unwrap().success()
    };
    assert!(ok, "making the partition table");
    fill_pattern(&disk.0, 2048 * SECTOR, 8192 * SECTOR, 0x5a);
    fill_pattern(&disk.0, 59392 * SECTOR, 4096 * SECTOR, 0xa5);
    Some(disk)
}

/// Writes a lot into partition 2 through the tools and the mount, to its last block; the
/// rest of the disk is unchanged byte for byte and e2fsck is clean at every step.
fn writes_stay_inside_partition_2(gpt: bool) {
    if !have(&["e2fsck"]) {
        return;
    }
    let Some(disk) = partitioned_disk(if gpt { "gpt" } else { "mbr" }, gpt) else {
        return;
    };
    let before = outside(&disk.0, P2.0, P2.1);
    let p2 = |path: &str| format!("{}@2:{path}", disk.s());
    let info = UEXT4.ok(&["info", disk.s()]);
    assert!(info.contains(if gpt { "GPT" } else { "MBR" }), "{info}");
    assert!(info.contains("3 partitions"), "{info}");
    UEXT4.ok(&["mkfs", &format!("{}@2", disk.s())]);
    let info = UEXT4.ok(&["info", disk.s()]);
    let line2 = info
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap();
    assert!(line2.contains("ext4"), "{info}");
    assert!(info.contains(&format!("{}@N", disk.s())), "{info}");
    fsck_at(&disk.0, P2.0, "after mkfs");

    // The tools: a tree in, the namespace commands, then a file larger than the space left.
    let src = Scratch::new(if gpt { "gpt-src" } else { "mbr-src" });
    std::fs::create_dir(&src.0).unwrap();
    for i in 0..200 {
        std::fs::write(src.0.join(format!("f{i}")), vec![i as u8; 1000 + i * 37]).unwrap();
    }
    UEXT4.ok(&["cp", "-r", src.s(), &p2("/tree")]);
    UEXT4.ok(&["mkdir", "-p", &p2("/a/b/c")]);
    UEXT4.ok(&["ln", "-s", "/tree/f1", &p2("/a/link")]);
    UEXT4.ok(&["ln", &p2("/tree/f2"), &p2("/a/hard")]);
    UEXT4.ok(&["mv", &p2("/tree/f3"), &p2("/a/b/moved")]);
    UEXT4.ok(&["truncate", "-s", "1M", &p2("/a/sparse")]);
    UEXT4.ok(&["rm", &p2("/tree/f4")]);
    assert_eq!(UEXT4.ok(&["cat", &p2("/a/link")]).len(), 1037);
    assert!(UEXT4
        .ok(&["stat", &p2("/a/b/moved")])
        .contains("Size: 1111"));
    fsck_at(&disk.0, P2.0, "after the namespace commands");
    let big = Scratch::new(if gpt { "gpt-big" } else { "mbr-big" });
    std::fs::write(&big.0, vec![0x77u8; 30 << 20]).unwrap();
    let e = UEXT4.fails(&["cp", big.s(), &p2("/big")]);
    assert!(e.contains("no space"), "{e}");
    fsck_at(&disk.0, P2.0, "after filling it with uext4 cp");
    UEXT4.ok(&["rm", &p2("/big")]);
    assert_eq!(
        outside(&disk.0, P2.0, P2.1),
        before,
        "the tools wrote outside partition 2"
    );

    // The mount: -o partition=2, to ENOSPC, then IMAGE@2.
    if is_root() && Path::new("/dev/fuse").exists() {
        let mnt = Scratch::new(if gpt { "gpt-mnt" } else { "mbr-mnt" });
        std::fs::create_dir(&mnt.0).unwrap();
        UEXT4.ok(&["mount", "-o", "partition=2", disk.s(), mnt.s()]);
        std::fs::write(mnt.0.join("hello"), b"written through the mount\n").unwrap();
        let fill = Command::new("dd")
            .args(["if=/dev/urandom", "bs=1M", "count=40"])
            .arg(format!("of={}", mnt.0.join("fill").display()))
            .output()
            .unwrap();
        assert!(!fill.status.success(), "40 MiB fit in a 24 MiB partition?");
        assert!(String::from_utf8_lossy(&fill.stderr).contains("No space left"));
        UEXT4.ok(&["umount", mnt.s()]);
        fsck_at(&disk.0, P2.0, "after filling it through the mount");
        assert_eq!(
            outside(&disk.0, P2.0, P2.1),
            before,
            "the mount wrote outside partition 2"
        );
        UEXT4.ok(&["mount", &format!("{}@2", disk.s()), mnt.s()]);
        assert_eq!(
            std::fs::read(mnt.0.join("hello")).unwrap(),
            b"written through the mount\n"
        );
        std::fs::remove_file(mnt.0.join("fill")).unwrap();
        UEXT4.ok(&["umount", mnt.s()]);
        fsck_at(&disk.0, P2.0, "after the second mount");

        // The kernel reads partition 2 back through a loop device at its offset.
        let k = Command::new("mount")
            .args([
                "-o",
                &format!("ro,loop,offset={},sizelimit={}", P2.0, P2.1 - P2.0),
            ])
            .arg(&disk.0)
            .arg(&mnt.0)
            .output()
            .unwrap();
        if k.status.success() {
            let hello = std::fs::read(mnt.0.join("hello"));
            let f5 = std::fs::read(mnt.0.join("tree/f5"));
            let _ = Command::new("umount").arg(&mnt.0).status();
            assert_eq!(hello.unwrap(), b"written through the mount\n");
            assert_eq!(f5.unwrap(), vec![5u8; 1000 + 5 * 37]);
        } else {
            eprintln!(
                "SKIP (part): no loop mount here: {}",
                String::from_utf8_lossy(&k.stderr).trim()
            );
        }
    } else {
        eprintln!("SKIP (part): the mount part needs root and /dev/fuse");
    }
    assert_eq!(
        outside(&disk.0, P2.0, P2.1),
        before,
        "wrote outside partition 2"
    );
}

#[test]
fn gpt_partition_writes_stay_inside_it() {
    writes_stay_inside_partition_2(true);
}

#[test]
fn mbr_partition_writes_stay_inside_it() {
    writes_stay_inside_partition_2(false);
}

/// A SIF-like file: a header of 1 MiB, an ext4 image of 16 MiB, a trailer of 1 MiB.
#[test]
fn filesystem_at_an_offset() {
    if !have(&["e2fsck"]) {
        return;
    }
    const OFF: u64 = 1 << 20;
    const LEN: u64 = 16 << 20;
    let sif = Scratch::new("sif");
    std::fs::File::create(&sif.0)
        .unwrap()
        .set_len(OFF + LEN + (1 << 20))
        .unwrap();
    fill_pattern(&sif.0, 0, OFF, 0x11);
    fill_pattern(&sif.0, OFF + LEN, 1 << 20, 0x22);
    let before = outside(&sif.0, OFF, OFF + LEN);
    let at = format!("{}@offset={OFF},size={LEN}", sif.s());
    UEXT4.ok(&["mkfs", &at]);
    fsck_at(&sif.0, OFF, "after mkfs");
    let src = Scratch::new("sif-src");
    std::fs::create_dir(&src.0).unwrap();
    for i in 0..50 {
        std::fs::write(src.0.join(format!("f{i}")), vec![i as u8; 5000 + i]).unwrap();
    }
    UEXT4.ok(&["cp", "-r", src.s(), &format!("{at}:/d")]);
    let big = Scratch::new("sif-big");
    std::fs::write(&big.0, vec![0x33u8; 20 << 20]).unwrap();
    UEXT4.fails(&["cp", big.s(), &format!("{at}:/big")]);
    fsck_at(&sif.0, OFF, "after filling it");
    // Without size= the filesystem still ends where its superblock says.
    let plain = format!("{}@offset=1048576:/d/f7", sif.s());
    assert_eq!(UEXT4.ok(&["cat", &plain]).len(), 5007);
    assert_eq!(
        outside(&sif.0, OFF, OFF + LEN),
        before,
        "wrote outside the window"
    );

    // An image mke2fs made at an offset reads and writes too.
    let m = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-E", &format!("offset={OFF}")])
        .arg(&sif.0)
        .arg("8M")
        .output()
        .unwrap();
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    let at = format!("{}@offset={OFF}", sif.s());
    UEXT4.ok(&["mkdir", &format!("{at}:/x")]);
    assert!(UEXT4.ok(&["ls", &format!("{at}:/")]).contains("lost+found"));
    assert!(UEXT4.ok(&["info", &at]).contains("Location:"));
    fsck_at(&sif.0, OFF, "after writing mke2fs's image");
    assert_eq!(
        &std::fs::read(&sif.0).unwrap()[..OFF as usize],
        &before[..OFF as usize]
    );
}

/// Bad partitions and offsets: one line each, exit 1, the image unchanged.
#[test]
fn bad_partitions_and_offsets_are_one_line_errors() {
    if !have(&["e2fsck"]) {
        return;
    }
    let Some(disk) = partitioned_disk("bad", true) else {
        return;
    };
    UEXT4.ok(&["mkfs", &format!("{}@2", disk.s())]);
    let before = std::fs::read(&disk.0).unwrap();
    let d = disk.s();
    let cases: [(String, &str); 9] = [
        (
            format!("{d}@7:/"),
            "partition 7 does not exist (the GPT partition table has 3 partitions: 1, 2, 3)",
        ),
        (
            format!("{d}@1:/"),
            "partition 1 is not ext4 (it holds unrecognised data)",
        ),
        (format!("{d}@0:/"), "numbered from 1"),
        (format!("{d}@x:/"), "partition number"),
        (
            format!("{d}@offset=1000:/"),
            "offset 1000 is not a multiple of 512 bytes",
        ),
        (
            format!("{d}@offset=1073741824:/"),
            "offset 1073741824 is past the end",
        ),
        (format!("{d}@offset=5242880,size=1G:/"), "runs past the end"),
        (format!("{d}@offset=1048576:/"), "no ext4 at offset 1048576"),
        (format!("{d}:/"), "not ext4 itself but a whole disk"),
    ];
    for (arg, want) in &cases {
        // What follows the '@' misspelt is a usage mistake (exit 2); a partition or region
        // the image does not have is a failure (exit 1).
        let code = if arg.contains("@0:") || arg.contains("@x:") {
            2
        } else {
            1
        };
        for cmd in [&["ls", arg.as_str()][..], &["mkdir", &format!("{arg}new")]] {
            let e = UEXT4.fails_with(cmd, code);
            assert!(e.contains(want), "uext4 {cmd:?}: {e:?} lacks {want:?}");
        }
    }
    let plain = Scratch::new("bad-plain");
    std::fs::File::create(&plain.0)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let e = UEXT4.fails(&["ls", &format!("{}@2:/", plain.s())]);
    assert!(e.contains("no partition table"), "{e}");
    let e = UEXT4.fails(&["info", &format!("{d}@3")]);
    assert!(e.contains("partition 3 is not ext4"), "{e}");
    let e = UEXT4.fails(&["mkfs", &format!("{d}@9")]);
    assert!(e.contains("partition 9 does not exist"), "{e}");
    let e = UEXT4.fails_with(&["mount", "-o", "partition=2,offset=512", d, plain.s()], 2);
    assert!(e.contains("exclude each other"), "{e}");
    if is_root() && Path::new("/dev/fuse").exists() {
        let mnt = Scratch::new("bad-mnt");
        std::fs::create_dir(&mnt.0).unwrap();
        let e = UEXT4.fails(&["mount", "-o", "partition=5", d, mnt.s()]);
        assert!(e.contains("partition 5 does not exist"), "{e}");
        let e = UEXT4.fails(&["mount", "-o", "offset=100", d, mnt.s()]);
        assert!(e.contains("not a multiple of 512"), "{e}");
    }
    // A qcow2 file is named for what it is.
    let q = Scratch::new("bad-qcow2");
    let mut v = vec![0u8; 1 << 20];
    v[..4].copy_from_slice(b"QFI\xfb");
    std::fs::write(&q.0, &v).unwrap();
    let e = UEXT4.fails(&["info", q.s()]);
    assert!(
        e.contains("qcow2 image") && e.contains("qemu-img convert"),
        "{e}"
    );
    assert!(
        std::fs::read(&disk.0).unwrap() == before,
        "a refused command changed the image"
    );
    fsck_at(&disk.0, P2.0, "after the refused commands");
}

/// A tree with what image builders put in a rootfs: nested directories, a hard link, a
/// symlink, a sparse file, an executable, an extended attribute.
fn rootfs_tree(root: &Path) {
    std::fs::create_dir_all(root.join("etc/conf.d")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(root.join("etc/hostname"), "builder\n").unwrap();
    std::fs::write(root.join("etc/conf.d/a"), vec![b'a'; 9000]).unwrap();
    std::fs::hard_link(root.join("etc/conf.d/a"), root.join("etc/conf.d/a-link")).unwrap();
    std::os::unix::fs::symlink("../etc/hostname", root.join("usr/name")).unwrap();
    let bin = root.join("usr/bin/tool");
    std::fs::write(&bin, vec![0x7fu8; 70_000]).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = std::fs::File::create(root.join("sparse")).unwrap();
    f.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"end", (8 << 20) - 3).unwrap();
    let c = CString::new(root.join("etc/hostname").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings and a value buffer of the given length.
    unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.builder".as_ptr(),
            b"yes".as_ptr().cast(),
            3,
            0,
        )
    };
}

/// `mkfs -d DIR` with SOURCE_DATE_EPOCH builds byte-identical images from the same tree
/// wherever and whenever it runs (another directory, another umask, a later clock), and the
/// image holds the tree: the kernel-independent checks here, e2fsck clean.
#[test]
fn reproducible_images_from_a_tree() {
    if !have(&["e2fsck"]) {
        return;
    }
    let work = Scratch::new("repro");
    let (t1, t2) = (work.0.join("one/tree"), work.0.join("two/elsewhere/tree"));
    rootfs_tree(&t1);
    rootfs_tree(&t2);
    // The second tree is written later: other ctimes and, without clamping, other mtimes.
    let build = |tree: &Path, img: &Path, umask: &str| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; exec \"$0\" mkfs --size 64M -d \"$1\" \"$2\"",
            ))
            .arg(UEXT4.0)
            .arg(tree)
            .arg(img)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .current_dir(tree.parent().unwrap())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (i1, i2) = (work.0.join("one.img"), work.0.join("two.img"));
    build(&t1, &i1, "022");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    build(&t2, &i2, "077");
    assert!(
        std::fs::read(&i1).unwrap() == std::fs::read(&i2).unwrap(),
        "two builds of the same tree differ"
    );
    let o = Command::new("e2fsck").arg("-fn").arg(&i1).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let at = |p: &str| format!("{}:{p}", i1.display());
    assert_eq!(UEXT4.ok(&["cat", &at("/etc/hostname")]), "builder\n");
    let st = UEXT4.ok(&["stat", &at("/etc/conf.d/a")]);
    assert!(st.contains("Links: 2"), "{st}");
    let st = UEXT4.ok(&["stat", &at("/etc/hostname")]);
    // Every time clamped to the epoch (the files were written after it).
    assert!(st.contains("2023-11-14 22:13:20"), "{st}");
    assert!(
        !UEXT4.ok(&["ls", "-l", &at("/")]).contains(" tree"),
        "-d copies the contents"
    );
    // Without SOURCE_DATE_EPOCH and with -U and -E hash_seed the identity is as asked.
    let i3 = work.0.join("three.img");
    let u = "d5d8f1b4-4c4b-4a0f-9d1e-2f0c6f1b7a01";
    UEXT4.ok(&[
        "mkfs",
        "--size",
        "32M",
        "-U",
        u,
        "-E",
        "hash_seed=0b1c2d3e-4f50-4162-8374-95a6b7c8d9e0,root_owner=1234:5678",
        "-N",
        "2048",
        "-m",
        "1",
        "-I",
        "512",
        i3.to_str().unwrap(),
    ]);
    let d = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&i3)
        .output()
        .unwrap();
    let d = String::from_utf8_lossy(&d.stdout);
    for want in [
        &format!("Filesystem UUID:          {u}")[..],
        "Directory Hash Seed:      0b1c2d3e-4f50-4162-8374-95a6b7c8d9e0",
        "Inode count:              2048",
        "Reserved block count:     327",
        "Inode size:\t          512",
    ] {
        assert!(d.contains(want), "dumpe2fs lacks {want:?}:\n{d}");
    }
    let st = UEXT4.ok(&["stat", &format!("{}:/", i3.display())]);
    assert!(st.contains("1234") && st.contains("5678"), "{st}");
    // mke2fs gives the same counts for the same request.
    let m = work.0.join("mke2fs.img");
    let o = Command::new("mke2fs")
        .args([
            "-q", "-F", "-t", "ext4", "-N", "2048", "-m", "1", "-I", "512",
        ])
        .arg(&m)
        .arg("32M")
        .output()
        .unwrap();
    assert!(o.status.success());
    let md = Command::new("dumpe2fs").arg("-h").arg(&m).output().unwrap();
    let md = String::from_utf8_lossy(&md.stdout);
    for field in ["Inode count:", "Reserved block count:", "Inodes per group:"] {
        let line = |t: &str| {
            t.lines()
                .find(|l| l.starts_with(field))
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(line(&d), line(&md), "{field}");
    }
    let o = Command::new("e2fsck").arg("-fn").arg(&i3).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // A failed mkfs leaves no file of its own behind.
    let bad = work.0.join("bad.img");
    UEXT4.fails(&[
        "mkfs",
        "--size",
        "32M",
        "-N",
        "99999999",
        bad.to_str().unwrap(),
    ]);
    assert!(!bad.exists(), "a failed mkfs left its file");
}

/// `cp -r DIR/. IMAGE:DEST` copies DIR's contents (cp(1)'s rule), and several sources go
/// into a directory.
#[test]
fn cp_takes_contents_and_several_sources() {
    if !have(&["e2fsck"]) {
        return;
    }
    let work = Scratch::new("cpdot");
    let tree = work.0.join("tree");
    rootfs_tree(&tree);
    let img = Scratch::new("cpdot-img");
    UEXT4.ok(&["mkfs", "--size", "64M", img.s()]);
    UEXT4.ok(&["mkdir", &img.at("/dest")]);
    write_ok(
        &img,
        &[
            "cp",
            "-r",
            &format!("{}/.", tree.display()),
            &img.at("/dest"),
        ],
    );
    let ls = UEXT4.ok(&["ls", &img.at("/dest")]);
    assert!(
        ls.contains("etc") && ls.contains("usr") && !ls.contains("tree"),
        "{ls}"
    );
    let (a, b) = (work.0.join("x"), work.0.join("y"));
    std::fs::write(&a, "x").unwrap();
    std::fs::write(&b, "y").unwrap();
    write_ok(
        &img,
        &[
            "cp",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            &img.at("/dest"),
        ],
    );
    assert_eq!(UEXT4.ok(&["cat", &img.at("/dest/y")]), "y");
    let e = UEXT4.fails(&[
        "cp",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        &img.at("/dest/x"),
    ]);
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn fstrim_makes_holes_where_files_were() {
    let img = scratch("fstrim");
    let data = scratch("fstrim-data");
    std::fs::write(&data.0, vec![0x3c; 20 << 20]).unwrap();
    write_ok(&img, &["mkfs", "--size", "64M", img.0.to_str().unwrap()]);
    let at = |p: &str| format!("{}:{p}", img.0.display());
    write_ok(&img, &["cp", data.0.to_str().unwrap(), &at("/data")]);
    let full = std::fs::metadata(&img.0).unwrap().blocks() * 512;
    write_ok(&img, &["rm", &at("/data")]);
    let out = write_ok(&img, &["fstrim", "-v", img.0.to_str().unwrap()]);
    let trimmed: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("fstrim -v said {out:?}"));
    assert!(trimmed >= 20 << 20, "{out}");
    let after = std::fs::metadata(&img.0).unwrap().blocks() * 512;
    assert!(after + (18 << 20) <= full, "{full} -> {after}");
    // A bad minimum is a one-line usage error; the image is untouched and clean.
    let e = UEXT4.fails_with(&["fstrim", "-m", "lots", img.0.to_str().unwrap()], 2);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    e2fsck_clean(&img.0);
}

#[test]
fn info_shows_what_dumpe2fs_h_shows() {
    if !have(&["mke2fs", "tune2fs", "dumpe2fs"]) {
        eprintln!("SKIP: needs mke2fs, tune2fs and dumpe2fs");
        return;
    }
    let img = Scratch::new("info-history");
    for tune in [
        vec![
            "-c",
            "20",
            "-C",
            "5",
            "-e",
            "remount-ro",
            "-o",
            "journal_data_writeback",
        ],
        vec!["-c", "-1", "-e", "panic", "-o", "^acl", "-r", "77"],
    ] {
        let _ = std::fs::remove_file(&img.0);
        mke2fs(&img.0, "32M", &[]);
        let o = Command::new("tune2fs")
            .args(&tune)
            .arg(&img.0)
            .output()
            .unwrap();
        assert!(o.status.success(), "tune2fs {tune:?}: {o:?}");
        let info = UEXT4.ok(&["info", img.s()]);
        let dump = Command::new("dumpe2fs")
            .arg("-h")
            .arg(&img.0)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout);
        for field in [
            "Default mount options:",
            "Errors behavior:",
            "Reserved block count:",
            "Filesystem created:",
            "Last mount time:",
            "Last write time:",
            "Mount count:",
            "Maximum mount count:",
            "Last checked:",
            "Check interval:",
        ] {
            let line = |t: &str| {
                t.lines()
                    .find(|l| l.starts_with(field))
                    .map(str::to_string)
                    .unwrap_or_else(|| panic!("{field} missing from:\n{t}"))
            };
            assert_eq!(line(&info), line(&dump), "tune2fs {tune:?}");
        }
    }
}
