//! Image building through the `uext4` binary: `mkfs -d ARCHIVE` and `cp --from-tar` keep what
//! a tarball says (devices, FIFOs, hard links, symlinks, set-id modes, owners, xattrs and ACLs,
//! holes, nanosecond mtimes) and give the same bytes twice under SOURCE_DATE_EPOCH;
//! `--all-root`, `-D` device tables, `chmod`, `chown`, `touch`, `--size fit`; bad input ends
//! in one line and leaves nothing behind. Every image is checked with `e2fsck -fn`.
//! The round trip needs root (GNU tar makes the source tree's devices and owners; the kernel
//! mounts the result); it prints SKIP and passes without it.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

fn assert_set_xattr(p: &Path, name: &str, value: &[u8]) {
    assert!(
        set_xattr(p, name, value),
        "setxattr {name} on {}",
        p.display()
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The source tree of the round trip (as root): every kind of entry a rootfs holds.
fn source_tree(root: &Path) {
    sh(&format!(
        "set -e; cd '{r}'; mkdir -p etc dev usr/bin var/empty tmp
         printf 'hello\\n' > etc/hostname; ln etc/hostname etc/hostname.link
         ln -s hostname etc/rel; ln -s /etc/hostname etc/abs; ln -s nowhere etc/dangling
         ln -s /$(printf 'long%.0s' $(seq 1 40)) etc/longlink
         mkfifo dev/fifo; mknod dev/null c 1 3; mknod dev/sda1 b 8 1; mknod dev/big c 300 70000
         printf x > usr/bin/su; chmod 4755 usr/bin/su; printf y > usr/bin/wall; chmod 2711 usr/bin/wall
         chmod 1777 tmp; chmod 0 var/empty
         printf owned > etc/owned; chown 1234:5678 etc/owned; chown 99:98 var/empty
         head -c 100000 /dev/urandom > usr/bin/data
         truncate -s 3M usr/bin/sparse; printf middle | dd of=usr/bin/sparse bs=1 seek=1048576 conv=notrunc 2>/dev/null
         printf tail >> usr/bin/sparse
         touch -h -d '2001-02-03 04:05:06.123456789' etc/hostname etc/rel dev/null",
        r = root.display()
    ));
    assert_set_xattr(
        &root.join("etc/owned"),
        "user.comment",
        b"a\nvalue with a newline",
    );
    assert_set_xattr(&root.join("etc/owned"), "trusted.bin", &[0, 10, 255, 10]);
    // A file capability (cap_net_raw), as setcap writes it.
    assert_set_xattr(
        &root.join("usr/bin/su"),
        "security.capability",
        &[0, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    if have(&["setfacl"]) {
        sh(&format!(
            "setfacl -m u:1000:rw,g:100:r '{0}/etc/owned' && setfacl -d -m u:1000:rwx '{0}/tmp'",
            root.display()
        ));
    }
}

/// Compares every entry under `a` with the same path under `b`.
fn same_tree(a: &Path, b: &Path, what: &str) {
    let mut stack = vec![PathBuf::new()];
    let mut n = 0;
    while let Some(rel) = stack.pop() {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = (
            std::fs::symlink_metadata(&pa).unwrap(),
            std::fs::symlink_metadata(&pb)
                .unwrap_or_else(|e| panic!("{what}: {} missing: {e}", rel.display())),
        );
        n += 1;
        let at = format!("{what}: {}", rel.display());
        assert_eq!(ma.mode(), mb.mode(), "{at}: mode");
        assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{at}: owner");
        assert_eq!(xattrs(&pa), xattrs(&pb), "{at}: xattrs");
        let ft = ma.file_type();
        if !ft.is_dir() {
            assert_eq!(ma.nlink(), mb.nlink(), "{at}: links");
            assert_eq!(
                (ma.mtime(), ma.mtime_nsec()),
                (mb.mtime(), mb.mtime_nsec()),
                "{at}: mtime"
            );
        }
        if ft.is_dir() {
            let mut kids: Vec<_> = std::fs::read_dir(&pa)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n != "lost+found")
                .collect();
            kids.sort();
            let mut kb: Vec<_> = std::fs::read_dir(&pb)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n != "lost+found")
                .collect();
            kb.sort();
            assert_eq!(kids, kb, "{at}: entries");
            stack.extend(kids.into_iter().map(|k| rel.join(k)));
        } else if ft.is_symlink() {
            assert_eq!(
                std::fs::read_link(&pa).unwrap(),
                std::fs::read_link(&pb).unwrap()
            );
        } else if ft.is_file() {
            assert_eq!(ma.size(), mb.size(), "{at}: size");
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{at}: data"
            );
            // Holes stay holes (the image may hold less, never more than a block per run).
            assert!(
                mb.blocks() <= ma.blocks() + 16,
                "{at}: {} blocks against {}",
                mb.blocks(),
                ma.blocks()
            );
        } else if ft.is_char_device() || ft.is_block_device() {
            assert_eq!(ma.rdev(), mb.rdev(), "{at}: rdev");
        } else {
            assert!(ft.is_fifo(), "{at}: type");
        }
    }
    assert!(n > 20, "{what}: only {n} entries compared");
}

#[test]
fn tarball_round_trips_exactly() {
    if !have(&["e2fsck"]) {
        return;
    }
    if !is_root() || !have(&["tar"]) {
        eprintln!("SKIP: the tarball round trip needs root and GNU tar");
        return;
    }
    let w = Scratch::dir("roundtrip");
    let src = w.p("src");
    std::fs::create_dir(&src).unwrap();
    source_tree(&src);
    let tar = |name: &str, extra: &str| {
        let out = w.p(name);
        sh(&format!(
            "tar --sparse --numeric-owner {extra} -cf '{}' -C '{}' .",
            out.display(),
            src.display()
        ));
        out
    };
    let x = "--xattrs --xattrs-include='*' --acls --format=posix";
    let posix = tar("a.tar", x);
    let gz = tar("a.tar.gz", &format!("{x} -z"));
    let gnu = tar("gnu.tar", "--format=gnu");
    let mut archives = vec![posix.clone(), gz];
    if have(&["zstd"]) {
        archives.push(tar("a.tar.zst", &format!("{x} --zstd")));
    }
    let mnt = w.p("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for (i, a) in archives.iter().enumerate() {
        let img = w.p(&format!("img{i}"));
        UEXT4.ok(&["mkfs", "--size", "64M", "-d", s(a), s(&img)]);
        e2fsck_clean(&img);
        // Through uext4 (as root, cp puts owners and xattrs back) ...
        let out = w.p(&format!("out{i}"));
        UEXT4.ok(&["cp", "-r", &format!("{}:/", s(&img)), s(&out)]);
        same_tree(&src, &out, &format!("{} via uext4 cp", a.display()));
        // ... and through the kernel.
        let m = Command::new("mount")
            .args(["-o", "loop,ro", s(&img), s(&mnt)])
            .output()
            .unwrap();
        if m.status.success() {
            let r = std::panic::catch_unwind(|| {
                same_tree(&src, &mnt, &format!("{} in the kernel", a.display()))
            });
            sh(&format!("umount '{}'", mnt.display()));
            if let Err(e) = r {
                std::panic::resume_unwind(e);
            }
        } else {
            eprintln!(
                "SKIP: no loop mount here: {}",
                String::from_utf8_lossy(&m.stderr)
            );
        }
    }
    // Old GNU sparse entries keep their holes too (GNU format stores no xattrs).
    let img = w.p("gnu.img");
    UEXT4.ok(&["mkfs", "--size", "64M", "-d", s(&gnu), s(&img)]);
    e2fsck_clean(&img);
    let st = UEXT4.ok(&["stat", &format!("{}:/usr/bin/sparse", s(&img))]);
    let blocks: u64 = st
        .split("Blocks: ")
        .nth(1)
        .and_then(|b| b.split_whitespace().next())
        .and_then(|b| b.parse().ok())
        .unwrap_or(u64::MAX);
    // Two short runs of data in 3 MiB: a few blocks, not 3 MiB of them.
    assert!(st.contains("Size: 3145732") && blocks <= 16, "{st}");
    // The same tarball twice, with SOURCE_DATE_EPOCH, elsewhere and with another umask:
    // the same bytes.
    let build = |dir: &str, umask: &str| {
        let d = w.p(dir);
        std::fs::create_dir_all(&d).unwrap();
        let img = d.join("r.img");
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; exec \"$0\" mkfs --size 32M -d \"$1\" \"$2\""
            ))
            .arg(UEXT4.0)
            .arg(&posix)
            .arg(&img)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(img).unwrap()
    };
    let one = build("r1", "022");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(
        one == build("r2/deeper", "077"),
        "two builds of one tarball differ"
    );
    // cp --from-tar into a directory of an existing image.
    let img = w.p("cp.img");
    UEXT4.ok(&["mkfs", "--size", "64M", s(&img)]);
    UEXT4.ok(&["mkdir", &format!("{}:/layer", s(&img))]);
    UEXT4.ok(&[
        "cp",
        "--from-tar",
        s(&posix),
        &format!("{}:/layer", s(&img)),
    ]);
    e2fsck_clean(&img);
    let out = w.p("cpout");
    UEXT4.ok(&["cp", "-r", &format!("{}:/layer", s(&img)), s(&out)]);
    same_tree(&src, &out, "cp --from-tar");
}

/// A ustar header for hand-made (and broken) archives.
fn header(name: &str, typeflag: u8, size: usize, link: &str) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14000000000\0");
    h[148..156].copy_from_slice(b"        ");
    h[156] = typeflag;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn archive(entries: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (name, t, data, link) in entries {
        v.extend(header(name, *t, data.len(), link));
        v.extend_from_slice(data);
        v.resize(v.len().next_multiple_of(512), 0);
    }
    v.extend([0u8; 1024]);
    v
}

#[test]
fn bad_input_is_refused_and_leaves_nothing() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("bad");
    let img = w.p("x.img");
    let good = archive(&[("a/", b'5', b"", ""), ("a/f", b'0', b"data", "")]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", vec![0x55u8; 4096], "not a tar archive"),
        (
            "flipped",
            {
                let mut g = good.clone();
                g[520] ^= 0x40;
                g
            },
            "checksum",
        ),
        ("truncated", good[..600].to_vec(), "ends inside"),
        (
            "unknown",
            archive(&[("x", b'Z', b"", "")]),
            "unknown entry type 'Z'",
        ),
        (
            "escape",
            archive(&[("a/../../etc/passwd", b'0', b"x", "")]),
            "..",
        ),
        ("linkout", archive(&[("l", b'1', b"", "../outside")]), ".."),
        (
            "gzip",
            {
                let mut g = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
                g.extend([0xffu8; 64]);
                g
            },
            "",
        ),
    ];
    for (name, bytes, want) in cases {
        let a = w.p(&format!("{name}.tar"));
        std::fs::write(&a, bytes).unwrap();
        let e = UEXT4.fails(&["mkfs", "--size", "16M", "-d", s(&a), s(&img)]);
        assert!(e.contains(want), "{name}: {e}");
        assert!(!img.exists(), "{name}: a failed mkfs left its image");
    }
    // A good one of the same shape works.
    let a = w.p("good.tar");
    std::fs::write(&a, &good).unwrap();
    UEXT4.ok(&["mkfs", "--size", "16M", "-d", s(&a), s(&img)]);
    e2fsck_clean(&img);
    assert_eq!(UEXT4.ok(&["cat", &format!("{}:/a/f", s(&img))]), "data");
    // cp --from-tar of a bad archive: one line, and the image stays clean.
    let bad = w.p("escape.tar");
    UEXT4.fails(&["cp", "--from-tar", s(&bad), &format!("{}:/", s(&img))]);
    e2fsck_clean(&img);
    std::fs::remove_file(&img).unwrap();
    // Bad device table lines.
    for (name, line, want) in [
        ("type", "/dev/x q 644 0 0", "type"),
        ("mode", "/dev/x c 9z 0 0 1 1", "mode"),
        ("fields", "/dev/x", "fields"),
        ("dotdot", "/dev/../../x c 644 0 0 1 1", ".."),
    ] {
        let t = w.p(&format!("{name}.table"));
        std::fs::write(&t, format!("# a table\n{line}\n")).unwrap();
        let e = UEXT4.fails(&["mkfs", "--size", "16M", "-D", s(&t), s(&img)]);
        assert!(e.contains(want) && e.contains("line 2"), "{name}: {e}");
        assert!(!img.exists(), "{name}: a failed mkfs left its image");
    }
    // A table whose directory is missing fails once the image is made: nothing is left.
    let t = w.p("missing.table");
    std::fs::write(&t, "/nodir/x c 644 0 0 1 1\n").unwrap();
    let e = UEXT4.fails(&["mkfs", "--size", "16M", "-D", s(&t), s(&img)]);
    assert!(e.contains("does not exist"), "{e}");
    assert!(!img.exists());
}

/// Bounded work whatever a device table says: one line makes at most 65536 nodes (four
/// billion is refused, naming the line, before the image is made), and a line within the
/// bound on an image with fewer inodes makes nodes until the image is full and fails there.
#[test]
fn a_device_table_count_is_bounded() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("devtable-count");
    let table = w.p("table");
    let img = w.p("c.img");
    std::fs::write(&table, "/tty c 666 0 0 4 0 0 1 4294967295\n").unwrap();
    let e = UEXT4.fails(&["mkfs", "--size", "1M", "-D", s(&table), s(&img)]);
    assert!(e.contains("line 1") && e.contains("more than 65536"), "{e}");
    assert!(!img.exists(), "a failed mkfs left its image");
    std::fs::write(&table, "/tty c 666 0 0 4 0 0 1 65536\n").unwrap();
    let e = UEXT4.fails(&["mkfs", "--size", "1M", "-N", "32", "-D", s(&table), s(&img)]);
    assert!(e.contains("line 1"), "{e}");
    assert!(e.contains("no free inodes"), "{e}");
    assert!(!img.exists(), "a failed mkfs left its image");
}

/// The value of a `uext4 stat` field such as "Uid:".
fn stat_has(img: &Path, path: &str, want: &[&str]) {
    let st = UEXT4.ok(&["stat", &format!("{}:{path}", s(img))]);
    for w in want {
        assert!(st.contains(w), "{path}: {w:?} not in\n{st}");
    }
}

#[test]
fn owners_device_tables_and_attribute_tools() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("owners");
    let tree = w.p("tree");
    sh(&format!(
        "mkdir -p '{0}/bin' '{0}/etc' && printf x > '{0}/bin/sh' && chmod 4755 '{0}/bin/sh' && printf y > '{0}/etc/f'",
        tree.display()
    ));
    let table = w.p("table");
    std::fs::write(
        &table,
        "# name type mode uid gid major minor start inc count\n\
         /dev d 755 0 0 - - - - -\n\
         /dev/console c 600 0 5 5 1 - - -\n\
         /dev/tty c 666 0 5 4 0 0 1 3\n\
         /dev/sda b 660 0 6 8 0 1 1 3\n\
         /dev/initctl p 600 0 0 - - - - -\n\
         /etc/f f 640 12 34 - - - - -\n",
    )
    .unwrap();
    let img = w.p("o.img");
    UEXT4.ok(&[
        "mkfs",
        "--size",
        "32M",
        "--all-root",
        "-D",
        s(&table),
        "-d",
        s(&tree),
        s(&img),
    ]);
    e2fsck_clean(&img);
    stat_has(&img, "/bin/sh", &["Uid: 0  Gid: 0", "(4755/"]);
    stat_has(&img, "/", &["Uid: 0  Gid: 0"]);
    stat_has(&img, "/etc/f", &["Uid: 12  Gid: 34", "(0640/"]);
    stat_has(
        &img,
        "/dev/console",
        &[
            "character special",
            "Device type: 5,1",
            "Uid: 0  Gid: 5",
            "(0600/",
        ],
    );
    stat_has(&img, "/dev/tty2", &["Device type: 4,2"]);
    // genext2fs's rule: minor + i * inc - start, for i from start below count.
    stat_has(
        &img,
        "/dev/sda2",
        &["block special", "Device type: 8,1", "Gid: 6"],
    );
    stat_has(&img, "/dev/initctl", &["fifo"]);
    let ls = UEXT4.ok(&["ls", &format!("{}:/dev", s(&img))]);
    assert_eq!(ls, "console\ninitctl\nsda1\nsda2\ntty0\ntty1\ntty2\n");
    // chmod: octal, symbolic, -R; chown UID[:GID], :GID, -R; e2fsck after each.
    let at = |p: &str| format!("{}:{p}", s(&img));
    for (args, path, want) in [
        (vec!["chmod", "640"], "/etc/f", vec!["(0640/"]),
        (vec!["chmod", "u+x,g-r,o+w"], "/etc/f", vec!["(0702/"]),
        (vec!["chmod", "-R", "go-rwx"], "/bin", vec!["(0700/"]),
        (
            vec!["chown", "1000:100"],
            "/etc/f",
            vec!["Uid: 1000  Gid: 100"],
        ),
        (vec!["chown", ":7"], "/etc/f", vec!["Uid: 1000  Gid: 7"]),
        (vec!["chown", "-R", "5:6"], "/bin", vec!["Uid: 5  Gid: 6"]),
    ] {
        let mut a = args.clone();
        let target = if path == "/bin" { at("/bin") } else { at(path) };
        a.push(&target);
        UEXT4.ok(&a);
        e2fsck_clean(&img);
        stat_has(&img, path, &want);
    }
    // chmod -R reached bin/sh; chown took its set-user-ID bit, as the kernel's chown does.
    stat_has(&img, "/bin/sh", &["(0700/", "Uid: 5  Gid: 6"]);
    // touch: -d, -t, -r, -a/-m, a new file, -c.
    UEXT4.ok(&["touch", "-d", "2001-02-03 04:05:06.5", &at("/etc/f")]);
    e2fsck_clean(&img);
    stat_has(
        &img,
        "/etc/f",
        &[
            "Modify: 2001-02-03 04:05:06.500000000",
            "Access: 2001-02-03 04:05:06.5",
        ],
    );
    UEXT4.ok(&["touch", "-m", "-t", "200102030405.07", &at("/etc/f")]);
    stat_has(
        &img,
        "/etc/f",
        &[
            "Modify: 2001-02-03 04:05:07.000000000",
            "Access: 2001-02-03 04:05:06.5",
        ],
    );
    UEXT4.ok(&["touch", "-r", &at("/etc/f"), &at("/new")]);
    e2fsck_clean(&img);
    stat_has(
        &img,
        "/new",
        &[
            "regular empty file",
            "Modify: 2001-02-03 04:05:07.000000000",
        ],
    );
    UEXT4.ok(&["touch", "-c", &at("/absent")]);
    assert!(UEXT4.fails(&["stat", &at("/absent")]).contains("no such"));
    UEXT4.ok(&["touch", "-d", "@1700000000", &at("/dev")]);
    stat_has(&img, "/dev", &["Modify: 2023-11-14 22:13:20"]);
    e2fsck_clean(&img);
    // Bad arguments: one line each, the image untouched and clean.
    for args in [
        vec!["chmod", "u+q", &at("/etc/f")[..]],
        vec!["chown", "root", &at("/etc/f")],
        vec!["touch", "-d", "yesterday", &at("/etc/f")],
        vec!["touch", "-t", "20xx", &at("/etc/f")],
        vec!["chmod", "644", &at("/nope")],
    ] {
        UEXT4.fails(&args);
    }
    e2fsck_clean(&img);
}

fn info_field(img: &Path, field: &str) -> u64 {
    let i = UEXT4.ok(&["info", s(img)]);
    i.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l[field.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} not in {i}"))
}

#[test]
fn size_fit_holds_the_input_with_the_free_share_asked() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("fit");
    let tree = w.p("tree");
    // 3000 files of various sizes in 30 directories, a big directory, a sparse file.
    for d in 0..30 {
        let dir = tree.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            let n = (d * 7919 + f * 104_729) % 30_000;
            std::fs::write(dir.join(format!("file-{f}")), vec![(f % 251) as u8 + 1; n]).unwrap();
        }
    }
    let big = tree.join("big");
    std::fs::create_dir(&big).unwrap();
    for f in 0..2000 {
        std::fs::write(big.join(format!("a-rather-long-file-name-{f:05}")), b"x").unwrap();
    }
    sh(&format!(
        "truncate -s 200M '{0}/sparse' && printf end >> '{0}/sparse'",
        tree.display()
    ));
    let tarball = w.p("tree.tar");
    sh(&format!(
        "tar --sparse -cf '{}' -C '{}' .",
        tarball.display(),
        tree.display()
    ));
    for (input, pct) in [(&tree, "10"), (&tarball, "10"), (&tree, "25")] {
        let img = w.p("fit.img");
        let _ = std::fs::remove_file(&img);
        UEXT4.ok(&[
            "mkfs",
            "--size",
            "fit",
            "--fit-free",
            pct,
            "-d",
            s(input),
            s(&img),
        ]);
        e2fsck_clean(&img);
        let blocks = info_field(&img, "Block count:") as f64;
        let avail = info_field(&img, "Available to users:") as f64;
        let share = avail / blocks * 100.0;
        let want: f64 = pct.parse().unwrap();
        assert!(
            share >= want && share < want + 8.0,
            "{}: {share:.1}% free for {want}% asked",
            input.display()
        );
        assert_eq!(
            UEXT4.ok(&["cat", &format!("{}:/d3/file-5", s(&img))]).len(),
            (3 * 7919 + 5 * 104_729) % 30_000
        );
        // The size was computed before writing: the file is exactly that size.
        let len = std::fs::metadata(&img).unwrap().len();
        assert_eq!(len % (1 << 20), 0);
        assert_eq!(len as f64, blocks * info_field(&img, "Block size:") as f64);
    }
    // Fit then fill: what is left can be written.
    let img = w.p("fit.img");
    let left = info_field(&img, "Available to users:") * info_field(&img, "Block size:");
    let fill = w.p("fill");
    std::fs::write(&fill, vec![7u8; (left * 9 / 10) as usize]).unwrap();
    UEXT4.ok(&["cp", s(&fill), &format!("{}:/fill", s(&img))]);
    e2fsck_clean(&img);
    // Without -d there is nothing to fit.
    let e = UEXT4.fails(&["mkfs", "--size", "fit", s(&w.p("none.img"))]);
    assert!(e.contains("-d"), "{e}");
}

/// Runs the binary with SOURCE_DATE_EPOCH set; fails on a failure.
fn ok_at_epoch(epoch: &str, args: &[&str]) {
    let o = Command::new(UEXT4.0)
        .args(args)
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `cp --from-tar` and `cp` into an existing image clamp every time they record to
/// SOURCE_DATE_EPOCH, as `mkfs -d` does: the archive's times (later than the epoch), the
/// host file's, the change and birth times, and the directories they changed.
#[test]
fn copies_into_an_image_clamp_times_to_source_date_epoch() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("clamp");
    let img = w.p("c.img");
    // 2017-07-14 02:40:00 UTC; the archive says 2021 and the host file now.
    let epoch = "1500000000";
    ok_at_epoch(epoch, &["mkfs", "--size", "32M", s(&img)]);
    let tarball = w.p("a.tar");
    let a = archive(&[("a/", b'5', b"", ""), ("a/f", b'0', b"data", "")]);
    std::fs::write(&tarball, a).unwrap();
    let host = w.p("h");
    std::fs::write(&host, b"host").unwrap();
    ok_at_epoch(
        epoch,
        &["cp", "--from-tar", s(&tarball), &format!("{}:/", s(&img))],
    );
    ok_at_epoch(epoch, &["cp", s(&host), &format!("{}:/h", s(&img))]);
    e2fsck_clean(&img);
    for p in ["/", "/a", "/a/f", "/h"] {
        let st = UEXT4.ok(&["stat", &format!("{}:{p}", s(&img))]);
        let times: Vec<&str> = st
            .lines()
            .map(str::trim)
            .filter(|l| {
                ["Access: 2", "Modify: ", "Change: ", "Birth: "]
                    .iter()
                    .any(|f| l.starts_with(f))
            })
            .collect();
        assert_eq!(times.len(), 4, "{p}: {st}");
        for t in times {
            assert!(t.contains("2017-07-14 02:40:00.000000000"), "{p}: {t}");
        }
    }
}

/// Peak memory of `mkfs -d` does not grow with the tree: ten times the entries, about the
/// same peak resident set (as measured by /usr/bin/time).
#[test]
fn building_memory_does_not_grow_with_the_tree() {
    if !have(&["e2fsck"]) || !Path::new("/usr/bin/time").exists() {
        eprintln!("SKIP: needs e2fsck and /usr/bin/time");
        return;
    }
    let w = Scratch::dir("flatmem");
    let peak = |dirs: usize| -> u64 {
        let src = w.p(&format!("t{dirs}"));
        for d in 0..dirs {
            let dir = src.join(format!("d{d:04}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..100 {
                std::fs::write(dir.join(format!("f{f:03}")), vec![f as u8; f * 40]).unwrap();
            }
        }
        let img = w.p(&format!("t{dirs}.img"));
        let o = Command::new("/usr/bin/time")
            .args(["-f", "%M", UEXT4.0, "mkfs", "--size", "256M", "-d"])
            .arg(&src)
            .arg(&img)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        e2fsck_clean(&img);
        let err = String::from_utf8_lossy(&o.stderr);
        err.lines().last().unwrap().trim().parse().unwrap()
    };
    let (small, large) = (peak(20), peak(200));
    // In KiB: 2,000 and 20,000 entries; the margin is less than the large tree's inodes,
    // directory blocks and names would take if kept.
    assert!(
        large < small + 6 * 1024,
        "peak RSS {small} KiB for 2k entries, {large} KiB for 20k"
    );
}

/// A tree deeper than the descriptors a process may hold is copied: the walk keeps only the
/// upper levels' directories open.
#[test]
fn a_deep_tree_is_copied_with_few_descriptors() {
    if !have(&["e2fsck"]) {
        return;
    }
    let w = Scratch::dir("deep");
    let mut p = w.p("tree");
    for i in 0..300 {
        p = p.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("leaf"), b"deep").unwrap();
    let img = w.p("deep.img");
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 128; exec \"$0\" mkfs --size 32M -d \"$1\" \"$2\"")
        .arg(UEXT4.0)
        .arg(w.p("tree"))
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    e2fsck_clean(&img);
    let leaf: String = (0..300).map(|i| format!("/d{i}")).collect::<String>() + "/leaf";
    assert_eq!(UEXT4.ok(&["cat", &format!("{}:{leaf}", s(&img))]), "deep");
}

/// (flags, size, inline data size) of `path` as debugfs's stat shows them.
fn inline_shape(img: &Path, path: &str) -> (String, String, Option<String>) {
    let out = sh(&format!("debugfs -R 'stat {path}' {} 2>&1", s(img)));
    let field = |key: &str| {
        out.split(key)
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string)
    };
    (
        field("Flags: ").unwrap_or_else(|| panic!("{path}:\n{out}")),
        field("Size: ").unwrap(),
        field("Size of inline data: "),
    )
}

/// `mkfs -O inline_data -d DIR` keeps small files and directories in their inodes as
/// `mke2fs -d` does: for each file with data and each directory, debugfs shows the same flags,
/// size and inline data size on both images (e2fsck clean), and the kernel reads uext4's back
/// (as root). Empty files and symlinks longer than 60 bytes are left as the kernel makes them
/// (an empty extent tree; a block), where mke2fs -d makes them inline.
#[test]
fn mkfs_d_keeps_small_files_inline_as_mke2fs() {
    let src = Scratch::new("inline-src");
    std::fs::create_dir_all(src.0.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(src.0.join("empty")).unwrap();
    let sizes = [1usize, 59, 60, 61, 100, 128, 129, 3000];
    for n in sizes {
        let data: Vec<u8> = (0..n).map(|i| (i * 31 + n) as u8 | 1).collect();
        std::fs::write(src.0.join(format!("f{n}")), data).unwrap();
    }
    for i in 0..3 {
        std::fs::write(src.0.join(format!("sub/n{i}")), b"x").unwrap();
    }
    for i in 0..12 {
        std::fs::write(src.0.join(format!("sub/deeper/name{i:02}")), b"y").unwrap();
    }
    let (u, k) = (scratch("inline-mkfs-u"), scratch("inline-mkfs-k"));
    UEXT4.ok(&[
        "mkfs",
        "-O",
        "inline_data",
        "-I",
        "256",
        "-d",
        s(&src.0),
        "--size",
        "16M",
        s(&u.0),
    ]);
    e2fsck_clean_when(&u.0, "after uext4 mkfs -d");
    sh(&format!(
        "mke2fs -q -F -t ext4 -O inline_data -I 256 -d {} {} 16M",
        s(&src.0),
        s(&k.0)
    ));
    let mut paths: Vec<String> = sizes.iter().map(|n| format!("f{n}")).collect();
    paths.extend(["sub", "sub/deeper", "empty", "sub/n0"].map(String::from));
    let mut inline = 0;
    for p in &paths {
        let (us, ks) = (inline_shape(&u.0, p), inline_shape(&k.0, p));
        assert_eq!(us, ks, "{p}: uext4 mkfs -d (left) and mke2fs -d");
        inline += us.2.is_some() as usize;
    }
    assert!(
        inline >= 8,
        "small files and directories are inline ({inline})"
    );
    if can_loop_mount() {
        let m = KernelMount::new(&u.0);
        same_tree(
            &src.0,
            &m.dir,
            "the kernel reading uext4 mkfs -d's inline files",
        );
    }
}
