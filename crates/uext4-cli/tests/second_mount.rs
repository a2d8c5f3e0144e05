//! The same image mounted at two mount points is one filesystem (the second `uext4 mount`
//! attaches to the first server with a bind mount), and atime through a mount follows the
//! mount's atime options. Needs root and /dev/fuse; skips with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

struct Env {
    img: PathBuf,
    a: PathBuf,
    b: PathBuf,
    _place: MountPlace,
}

impl Env {
    fn new(tag: &str) -> Env {
        let place = MountPlace::new(&format!("2m-{tag}"), &["a", "b"]);
        let (img, a, b) = (place.img.clone(), place.point(0), place.point(1));
        Cli(bin()).ok(&["mkfs", "--size", "64M", img.to_str().unwrap()]);
        Env {
            img,
            a,
            b,
            _place: place,
        }
    }
    fn mount(&self, at: &Path, opts: &[&str]) -> Output {
        Command::new(bin())
            .arg("mount")
            .args(opts)
            .arg(&self.img)
            .arg(at)
            .output()
            .unwrap()
    }
    fn mount_ok(&self, at: &Path, opts: &[&str]) {
        let o = self.mount(at, opts);
        assert!(
            o.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    fn umount(&self, at: &Path) {
        let o = Command::new(bin()).arg("umount").arg(at).output().unwrap();
        assert!(
            o.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    fn dev_of(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().dev()
    }
}

#[test]
fn second_mount_is_the_same_filesystem() {
    if !fuse_usable("the second-mount tests") {
        return;
    }
    let e = Env::new("rw");
    e.mount_ok(&e.a, &[]);
    e.mount_ok(&e.b, &[]);
    assert_eq!(Env::dev_of(&e.a), Env::dev_of(&e.b), "two connections");
    // generic/732's moves, across the two mount points.
    let (a, b) = (e.a.display(), e.b.display());
    let script = format!(
        "set -e; mkdir {a}/A {a}/B; echo data > {a}/A/f; mv {a}/A/f {a}/B/; cat {b}/B/f; \
         mv {b}/B/f {b}/A/; cat {a}/A/f; mv {a}/A/f {a}/B/; test $(cat {b}/B/f) = data"
    );
    let o = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // One of them goes: at once (the server keeps serving the other), and the other works.
    let t = Instant::now();
    e.umount(&e.a);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "umount waited for the server"
    );
    std::fs::write(e.b.join("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(e.b.join("B/f")).unwrap(), b"data\n");
    // A ro mount attached to the rw server refuses writes; the rw one still writes.
    e.mount_ok(&e.a, &["-o", "ro"]);
    let err = std::fs::write(e.a.join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    std::fs::write(e.b.join("yes"), b"y").unwrap();
    assert_eq!(std::fs::read(e.a.join("yes")).unwrap(), b"y");
    // umount(8) of one leaves the other too.
    assert!(Command::new("umount").arg(&e.b).status().unwrap().success());
    assert_eq!(std::fs::read(e.a.join("after")).unwrap(), b"still here");
    e.umount(&e.a);
    wait_server_gone(&e.img);
    e2fsck_clean(&e.img);
    let ls = sh(&format!(
        "debugfs -R 'ls -l /B' {} 2>/dev/null",
        e.img.display()
    ));
    assert!(ls.contains(" f"), "{ls}");
}

#[test]
fn read_write_mount_of_an_image_served_read_only_is_refused() {
    if !fuse_usable("the second-mount tests") {
        return;
    }
    let e = Env::new("ro");
    e.mount_ok(&e.a, &["-o", "ro"]);
    let o = e.mount(&e.b, &[]);
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert_eq!(msg.trim().lines().count(), 1, "{msg}");
    assert!(msg.contains("read-only"), "{msg}");
    // A read-only one is fine.
    e.mount_ok(&e.b, &["-o", "ro"]);
    assert!(e.b.join("lost+found").is_dir());
    e.umount(&e.b);
    e.umount(&e.a);
    wait_server_gone(&e.img);
    e2fsck_clean(&e.img);
}

/// An idmapped mount of a uext4 mount (FUSE_ALLOW_IDMAP): owners show mapped, a file made
/// through it is stored with the unmapped owner, and the rules the server applies for the
/// kernel (set-ID removal on write, flag changes by the owner) hold for callers whose ids
/// the kernel no longer sends.
#[test]
fn an_idmapped_mount_maps_owners_and_keeps_the_server_rules() {
    if !fuse_usable("the idmapped-mount test") || !have(&["unshare", "setpriv", "chattr"]) {
        return;
    }
    let e = Env::new("idmap");
    e.mount_ok(&e.a, &["-o", "allow_other"]);
    let (a, b) = (e.a.display(), e.b.display());
    sh(&format!(
        "set -e; mkdir {a}/d; printf x > {a}/d/prog; chown -R 1000:1000 {a}/d; \
         chmod 6755 {a}/d/prog; printf r > {a}/rootprog; chmod 6755 {a}/rootprog"
    ));
    idmapped_mount(&e.a, &e.b, 1000, 2000, 1).unwrap();
    assert_eq!(
        sh(&format!("stat -c '%u %g' {b}/d {a}/d")),
        "2000 2000\n1000 1000\n"
    );
    let as_2000 = |cmd: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=2000",
                "--regid=2000",
                "--clear-groups",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap()
    };
    let o = as_2000(&format!(
        "set -e; printf new > {b}/d/new; printf y >> {b}/d/prog; chattr +d {b}/d/new; \
         chmod 640 {b}/d/new"
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        sh(&format!("stat -c '%u %g %a' {a}/d/new {a}/d/prog")),
        "1000 1000 640\n1000 1000 755\n",
        "stored unmapped; a write by the owner takes set-user-ID and set-group-ID"
    );
    assert!(sh(&format!("lsattr -d {a}/d/new")).starts_with("------d"));
    // Without the mapping 2000 owns nothing: the kernel refuses its flag change.
    assert!(!as_2000(&format!("chattr -d {a}/d/new")).status.success());
    // Root's write keeps the set-ID bits (CAP_FSETID), also without ids in the request.
    sh(&format!("printf s >> {a}/rootprog"));
    assert_eq!(sh(&format!("stat -c '%a' {a}/rootprog")), "6755\n");
    assert!(Command::new("umount").arg(&e.b).status().unwrap().success());
    e.umount(&e.a);
    wait_server_gone(&e.img);
    e2fsck_clean(&e.img);
}

/// atime as `stat` shows it through the mount, in seconds.
fn atime(p: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().atime()
}

fn set_atime_back(p: &Path) {
    let o = Command::new("touch")
        .args(["-a", "-d", "@1000000000"])
        .arg(p)
        .status()
        .unwrap();
    assert!(o.success());
}

#[test]
fn reads_update_atime_by_the_mount_options() {
    if !fuse_usable("the atime mount tests") {
        return;
    }
    let e = Env::new("atime");
    // relatime (the default): a read after a change updates atime, once.
    e.mount_ok(&e.a, &[]);
    let f = e.a.join("f");
    std::fs::write(&f, b"hello").unwrap();
    set_atime_back(&f);
    assert_eq!(atime(&f), 1_000_000_000);
    std::fs::read(&f).unwrap();
    let first = atime(&f);
    assert!(
        first > 1_000_000_000,
        "relatime: a read did not update atime"
    );
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::read(&f).unwrap();
    assert_eq!(atime(&f), first, "relatime: a second read updated atime");
    // A listing is an access of the directory.
    let d = e.a.join("d");
    std::fs::create_dir(&d).unwrap();
    set_atime_back(&d);
    std::fs::read_dir(&d).unwrap().for_each(drop);
    assert!(
        atime(&d) > 1_000_000_000,
        "relatime: a listing did not update atime"
    );
    e.umount(&e.a);
    // strictatime: every read.
    e.mount_ok(&e.a, &["-o", "strictatime"]);
    std::fs::read(&f).unwrap();
    let s1 = atime(&f);
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::read(&f).unwrap();
    assert!(
        atime(&f) > s1,
        "strictatime: a second read did not update atime"
    );
    // And every listing: under strictatime the kernel still opens directories through the
    // server, which keeps it from serving a listing from its cache.
    std::fs::read_dir(&d).unwrap().for_each(drop);
    let d1 = atime(&d);
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::read_dir(&d).unwrap().for_each(drop);
    assert!(
        atime(&d) > d1,
        "strictatime: a second listing did not update atime"
    );
    e.umount(&e.a);
    // noatime: never; a read-only mount: never.
    for opts in ["noatime", "ro,strictatime"] {
        e.mount_ok(&e.a, &["-o", "rw"]);
        set_atime_back(&f);
        e.umount(&e.a);
        e.mount_ok(&e.a, &["-o", opts]);
        std::fs::read(&f).unwrap();
        assert_eq!(atime(&f), 1_000_000_000, "{opts}: a read updated atime");
        e.umount(&e.a);
    }
    wait_server_gone(&e.img);
    e2fsck_clean(&e.img);
}
