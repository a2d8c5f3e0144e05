//! `uext4 chattr`, `lsattr` and `label` through the built binary: what chattr sets, lsattr
//! prints as e2fsprogs' lsattr prints it on a kernel mount of the same image (and the
//! reverse: what the real chattr sets, `uext4 lsattr` prints the same); the label is what
//! e2label and the kernel see. Every writing command leaves an `e2fsck -fn` clean image.
//! The kernel halves need root, loop devices and e2fsprogs' chattr/lsattr (skipped with a
//! message otherwise).

use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

fn write_ok(img: &Scratch, args: &[&str]) -> String {
    let out = UEXT4.ok(args);
    e2fsck_clean_when(&img.0, &format!("after uext4 {args:?}"));
    out
}

fn kernel_ok() -> bool {
    let ok = needs::can_loop_mount() && needs::have(&["lsattr", "chattr", "e2label"]);
    if !ok {
        eprintln!("SKIP: the kernel comparison needs root, loop devices, lsattr, chattr, e2label");
    }
    ok
}

/// Each line of lsattr's output with the mount point (or `IMAGE:`) cut from its path.
fn lines(out: &str, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(|l| l.replacen(prefix, "", 1)).collect();
    v.sort();
    v
}

#[test]
fn chattr_and_lsattr_agree_with_e2fsprogs() {
    let img = scratch("cli-chattr");
    mke2fs(&img.0, "32M", &[]);
    write_ok(&img, &["mkdir", &img.at("/d")]);
    for f in ["/d/a", "/d/b", "/d/.hidden"] {
        write_ok(&img, &["truncate", "-s", "10", &img.at(f)]);
    }
    write_ok(&img, &["mkdir", &img.at("/d/sub")]);
    write_ok(&img, &["chattr", "+iS", &img.at("/d/a")]);
    write_ok(&img, &["chattr", "+d", "+A", "-A", &img.at("/d/b")]);
    write_ok(&img, &["chattr", "-R", "+d", &img.at("/d/sub")]);
    write_ok(&img, &["chattr", "=aD", &img.at("/d/sub")]);
    let err = UEXT4.fails(&["chattr", "+I", &img.at("/d/a")]);
    assert!(err.contains("read-only flag"), "{err}");
    let err = UEXT4.fails(&["chattr", "+D", &img.at("/d/b")]);
    assert!(err.contains("not supported"), "{err}");
    let mine = lines(&UEXT4.ok(&["lsattr", "-a", &img.at("/d")]), &img.at(""));
    let mine_d = UEXT4.ok(&["lsattr", "-d", &img.at("/d/sub")]);
    assert!(mine_d.starts_with("---D-a--------e------- "), "{mine_d}");
    assert!(mine.iter().any(|l| l.starts_with("--S-i---------e-------")));
    // Immutable: the image tools cannot remove it either.
    UEXT4.fails(&["rm", &img.at("/d/a")]);
    if !kernel_ok() {
        return;
    }
    let m = faulty::KernelMount::new(&img.0);
    let mnt = m.dir.to_str().unwrap().to_string();
    let theirs = lines(&host::sh(&format!("lsattr -a {mnt}/d")), &mnt);
    let theirs: Vec<String> = theirs
        .into_iter()
        .filter(|l| !l.ends_with("/d/.") && !l.ends_with("/d/.."))
        .collect();
    assert_eq!(mine, theirs);
    let theirs_d = host::sh(&format!("lsattr -d {mnt}/d/sub")).replacen(&mnt, "", 1);
    assert_eq!(mine_d.replacen(&img.at(""), "", 1), theirs_d);
    // The other way: e2fsprogs' chattr on the mount, read by uext4 lsattr.
    host::sh(&format!(
        "chattr -i +j +t {mnt}/d/a 2>&1; chattr +T {mnt}/d"
    ));
    let theirs = lines(&host::sh(&format!("lsattr -R {mnt}/d")), &mnt);
    drop(m);
    e2fsck_clean_when(&img.0, "after the kernel's chattr");
    let mine = lines(&UEXT4.ok(&["lsattr", "-R", &img.at("/d")]), &img.at(""));
    assert_eq!(
        mine.iter().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        theirs
            .iter()
            .filter(|l| !l.is_empty() && !l.ends_with(':'))
            .collect::<Vec<_>>()
    );
}

#[test]
fn label_agrees_with_e2label() {
    let img = scratch("cli-label");
    mke2fs(&img.0, "32M", &["-L", "from-mke2fs"]);
    assert_eq!(UEXT4.ok(&["label", img.s()]), "from-mke2fs\n");
    write_ok(&img, &["label", img.s(), "sixteen-bytes-ok"]);
    let err = UEXT4.fails(&["label", img.s(), "seventeen-bytes-x"]);
    assert!(err.contains("at most 16 bytes"), "{err}");
    if !needs::have(&["e2label"]) {
        eprintln!("SKIP: no e2label");
        return;
    }
    let out = Command::new("e2label").arg(&img.0).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sixteen-bytes-ok\n");
    assert!(Command::new("e2label")
        .arg(&img.0)
        .arg("by-e2label")
        .status()
        .unwrap()
        .success());
    assert_eq!(UEXT4.ok(&["label", img.s()]), "by-e2label\n");
}

/// Through a mount: chattr and lsattr (e2fsprogs', FS_IOC_GETFLAGS/SETFLAGS), xfs_io's
/// fsxattr and label commands (FS_IOC_FSGETXATTR, FS_IOC_GETFSLABEL/SETFSLABEL) and fstrim
/// (FITRIM) reach the engine as FUSE ioctls; immutable and append-only files refuse what the
/// kernel's ext4 refuses.
#[test]
fn flags_label_and_fitrim_through_a_mount() {
    if !needs::fuse_usable("the ioctl test")
        || !needs::have(&["chattr", "lsattr", "xfs_io", "fstrim"])
    {
        return;
    }
    let img = scratch("cli-ioctl");
    let dir = scratch("cli-ioctl-mnt");
    std::fs::create_dir_all(&dir.0).unwrap();
    let m = dir.0.display().to_string();
    write_ok(&img, &["mkfs", "--size", "128M", img.0.to_str().unwrap()]);
    UEXT4.ok(&["mount", img.0.to_str().unwrap(), &m]);
    let fails = |cmd: &str| {
        let o = Command::new("bash").arg("-c").arg(cmd).output().unwrap();
        assert!(!o.status.success(), "`{cmd}` succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let r = std::panic::catch_unwind(|| {
        host::sh(&format!("echo data > {m}/f && chattr +i {m}/f"));
        assert!(host::sh(&format!("lsattr {m}/f")).starts_with("----i"));
        assert!(fails(&format!("echo more >> {m}/f")).contains("not permitted"));
        assert!(fails(&format!("rm {m}/f")).contains("not permitted"));
        assert!(fails(&format!("mv {m}/f {m}/g")).contains("not permitted"));
        host::sh(&format!("chattr -i {m}/f && chattr +a {m}/f"));
        host::sh(&format!("echo appended >> {m}/f"));
        assert!(fails(&format!("echo over > {m}/f")).contains("not permitted"));
        assert_eq!(host::sh(&format!("cat {m}/f")), "data\nappended\n");
        // FS_IOC_FSGETXATTR: xfs_io names the xflags.
        let x = host::sh(&format!("xfs_io -r -c 'lsattr -v' {m}/f"));
        assert!(x.starts_with("[append-only]"), "{x}");
        host::sh(&format!("chattr -a {m}/f"));
        host::sh(&format!("xfs_io -c 'label -s build-42' {m}"));
        assert!(host::sh(&format!("xfs_io -c label {m}")).contains("\"build-42\""));
        // The fresh filesystem's free space: most of its 128 MiB.
        let t = host::sh(&format!("fstrim -v {m}"));
        let bytes: u64 = t
            .split('(')
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("fstrim -v said {t:?}"));
        assert!(bytes > 64 << 20, "{t}");
    });
    UEXT4.ok(&["umount", &m]);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
    e2fsck_clean(&img.0);
    let label = host::sh(&format!("dumpe2fs -h {} 2>/dev/null", img.0.display()));
    assert!(label.contains("build-42"), "{label}");
}
