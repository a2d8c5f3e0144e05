//! The image tools, driven through the built `uext4` binary: every writing command leaves an
//! image that `e2fsck -fn` passes; errors are one line and never a panic.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

fn tmp(tag: &str) -> PathBuf {
    let d = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    d.join(format!("uext4-tools-{tag}-{}", std::process::id()))
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "uext4 {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(args: &[&str]) -> String {
    let o = run(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "uext4 {args:?} should fail");
    assert!(!err.contains("panicked"), "uext4 {args:?} panicked: {err}");
    assert!(
        err.trim().lines().count() == 1,
        "uext4 {args:?}: expected a one-line error, got {err:?}"
    );
    err
}

fn fsck(img: &Path) {
    let o = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    assert!(
        o.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn tools_roundtrip_a_tree() {
    let img = tmp("img");
    let src = tmp("src");
    let back = tmp("back");
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&back);
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("a.txt"), b"hello\n").unwrap();
    std::fs::write(
        src.join("sub/b.bin"),
        (0..200_000u32).map(|i| i as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    std::fs::hard_link(src.join("a.txt"), src.join("sub/hard")).unwrap();
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(50 << 20).unwrap();
    drop(sparse);
    std::fs::set_permissions(
        src.join("sub/deeper"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    let i = img.to_str().unwrap();
    ok(&["mkfs", "--size", "128M", i]);
    fsck(&img);
    assert!(ok(&["info", i]).contains("metadata_csum"));
    ok(&["cp", "-r", src.to_str().unwrap(), &format!("{i}:/src")]);
    fsck(&img);
    let ls = ok(&["ls", "-l", &format!("{i}:/src")]);
    assert!(
        ls.contains("a.txt") && ls.contains("link -> a.txt") && ls.contains("sub"),
        "{ls}"
    );
    assert_eq!(ok(&["cat", &format!("{i}:/src/link")]), "hello\n");
    assert!(ok(&["stat", &format!("{i}:/src/sub/hard")]).contains("Links: 2"));
    ok(&["mkdir", "-p", &format!("{i}:/x/y/z")]);
    ok(&["mv", &format!("{i}:/x/y"), &format!("{i}:/moved")]);
    ok(&["ln", "-s", "/src/a.txt", &format!("{i}:/sym")]);
    ok(&["ln", &format!("{i}:/src/a.txt"), &format!("{i}:/hard2")]);
    ok(&["truncate", "-s", "3", &format!("{i}:/hard2")]);
    assert_eq!(ok(&["cat", &format!("{i}:/src/a.txt")]), "hel");
    fsck(&img);
    ok(&["rm", "-r", &format!("{i}:/moved")]);
    ok(&["rm", &format!("{i}:/sym")]);
    fsck(&img);
    // Copy back out and compare.
    std::fs::create_dir_all(&back).unwrap();
    ok(&["cp", "-r", &format!("{i}:/src"), back.to_str().unwrap()]);
    let b = back.join("src");
    assert_eq!(
        std::fs::read(b.join("sub/b.bin")).unwrap(),
        std::fs::read(src.join("sub/b.bin")).unwrap()
    );
    assert_eq!(
        std::fs::read_link(b.join("link")).unwrap(),
        PathBuf::from("a.txt")
    );
    let (m1, m2) = (
        std::fs::metadata(src.join("sub/b.bin")).unwrap(),
        std::fs::metadata(b.join("sub/b.bin")).unwrap(),
    );
    assert_eq!(
        (m1.mtime(), m1.mtime_nsec()),
        (m2.mtime(), m2.mtime_nsec()),
        "mtime kept with nanoseconds"
    );
    assert_eq!(
        std::fs::metadata(b.join("sub/deeper")).unwrap().mode() & 0o7777,
        0o711
    );
    let sp = std::fs::metadata(b.join("sparse")).unwrap();
    assert_eq!(sp.len(), 50 << 20);
    assert!(
        sp.blocks() < 1024,
        "the sparse file stayed sparse ({} blocks)",
        sp.blocks()
    );
    assert_eq!(
        std::fs::metadata(b.join("sub/hard")).unwrap().ino(),
        std::fs::metadata(b.join("a.txt")).unwrap().ino()
    );
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&back);
}

#[test]
fn errors_are_one_line() {
    let img = tmp("err");
    let zeros = tmp("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let i = img.to_str().unwrap();
    let z = zeros.to_str().unwrap();
    let _ = std::fs::remove_file(&img);
    ok(&["mkfs", "--size", "32M", i]);
    assert!(fails(&["cat", &format!("{i}:/nope")]).contains("no such file"));
    assert!(fails(&["ls", &format!("{z}:/")]).contains("not an ext2/3/4 filesystem"));
    assert!(fails(&["mkfs", "--block-size", "2048", "--size", "32M", i]).contains("1024 or 4096"));
    fails(&["mkfs", "-O", "bogus", i]);
    fails(&["mount", "-o", "nosuchoption", i, "/tmp"]);
    fails(&["rm", &format!("{i}:/lost+found")]);
    let o = run(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2), "usage errors exit 2");
    fsck(&img);
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&zeros);
}
