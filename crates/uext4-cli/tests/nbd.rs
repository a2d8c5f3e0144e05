//! The `uext4` command on NBD exports served by nbdkit on this machine (Unix sockets and TCP
//! loopback only): mkfs, the image tools with `URI:PATH`, `@offset=`, `info`, a FUSE mount
//! with a shell workload, and a read-only export. Every image written is checked with
//! `e2fsck -fn` afterwards. Skips with `SKIP: ...` without nbdkit (or, for the mount, without
//! root and /dev/fuse).

use std::path::Path;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));
use std::process::{Command, Stdio};
use std::time::Duration;

fn tag(t: &str) -> String {
    format!("uext4-nbdcli-{t}-{}", std::process::id())
}

#[test]
fn tools_on_an_export_over_a_unix_socket_and_tcp() {
    if !have(&["nbdkit", "e2fsck"]) {
        return;
    }
    let img = Scratch::file("tools", 64 << 20);
    let img_s = img.0.to_str().unwrap();
    {
        let srv = NbdServer::nbdkit(&["file", &format!("file={img_s}")]);
        UEXT4.ok(&["mkfs", &srv.uri]);
        UEXT4.ok(&["mkdir", "-p", &srv.at("/etc/deep")]);
        UEXT4.ok(&["cp", "/etc/hostname", &srv.at("/etc/hostname")]);
        UEXT4.ok(&["cp", "-r", "/etc/apt", &srv.at("/etc/deep/apt")]);
        let ls = UEXT4.ok(&["ls", &srv.at("/etc")]);
        assert!(ls.contains("hostname") && ls.contains("deep"), "{ls}");
        assert_eq!(
            UEXT4.ok(&["cat", &srv.at("/etc/hostname")]),
            std::fs::read_to_string("/etc/hostname").unwrap()
        );
        // The root: nothing after the ':'.
        assert!(UEXT4.ok(&["ls", &srv.at("")]).contains("etc"));
        let info = UEXT4.ok(&["info", &srv.uri]);
        assert!(info.contains("Block size"), "{info}");
        // A bad URI, a missing socket, a URI with no path after it: one line each.
        let e = UEXT4.fails(&["ls", "nbd+unix:///?sockt=/x:/"]);
        assert!(e.contains("unknown query parameter"), "{e}");
        let e = UEXT4.fails(&["ls", "nbd+unix:///?socket=/nonexistent.sock:/"]);
        assert!(e.contains("connecting to the NBD server"), "{e}");
        let e = UEXT4.fails(&["ls", &srv.uri]);
        assert!(e.contains("NBD-URI:PATH"), "{e}");
    }
    e2fsck_clean(img_s);
    // The same image over TCP, read back and written again.
    {
        let srv = NbdServer::nbdkit_tcp(&["file", &format!("file={img_s}")]);
        let want = std::fs::read_dir("/etc/apt").unwrap().count();
        let got = UEXT4.ok(&["ls", &srv.at("/etc/deep/apt")]).lines().count();
        assert_eq!(got, want, "/etc/apt copied over NBD");
        UEXT4.ok(&["rm", "-r", &srv.at("/etc/deep")]);
        UEXT4.ok(&["ln", "-s", "hostname", &srv.at("/etc/link")]);
        assert!(UEXT4.ok(&["ls", &srv.at("/etc")]).contains("link"));
    }
    e2fsck_clean(img_s);
}

#[test]
fn a_filesystem_at_an_offset_of_an_export() {
    if !have(&["nbdkit", "e2fsck"]) {
        return;
    }
    let img = Scratch::file("offset", 48 << 20);
    let img_s = img.0.to_str().unwrap();
    {
        let srv = NbdServer::nbdkit(&["file", &format!("file={img_s}")]);
        let at = format!("{}@offset=1M", srv.uri);
        UEXT4.ok(&["mkfs", "--size", "32M", &at]);
        UEXT4.ok(&["mkdir", &format!("{at}:/inside")]);
        assert!(UEXT4.ok(&["ls", &format!("{at}:/")]).contains("inside"));
        let info = UEXT4.ok(&["info", &at]);
        assert!(info.contains("at offset 1048576"), "{info}");
    }
    e2fsck_clean(format!("{img_s}?offset=1048576"));
}

#[test]
fn a_read_only_export_is_refused_by_writing_tools_in_one_line() {
    if !have(&["nbdkit", "mke2fs"]) {
        return;
    }
    let img = Scratch::file("ro", 16 << 20);
    let img_s = img.0.to_str().unwrap();
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", img_s])
        .status()
        .unwrap();
    assert!(st.success());
    let before = std::fs::read(&img.0).unwrap();
    let srv = NbdServer::nbdkit(&["-r", "file", &format!("file={img_s}")]);
    assert!(UEXT4.ok(&["ls", &srv.at("/")]).contains("lost+found"));
    let e = UEXT4.fails(&["mkdir", &srv.at("/x")]);
    assert!(e.contains("cannot be written"), "{e}");
    let e = UEXT4.fails(&["mkfs", &srv.uri]);
    assert!(e.contains("read-only"), "{e}");
    drop(srv);
    assert!(
        std::fs::read(&img.0).unwrap() == before,
        "the read-only export changed"
    );
}

#[test]
fn a_fuse_mount_over_nbd_runs_a_shell_workload_and_stays_clean() {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: the NBD mount test needs root and /dev/fuse");
        return;
    }
    if !have(&["nbdkit", "e2fsck"]) {
        return;
    }
    let img = Scratch::file("mount", 96 << 20);
    let img_s = img.0.to_str().unwrap();
    let mnt = std::env::temp_dir().join(tag("mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    {
        let srv = NbdServer::nbdkit(&["file", &format!("file={img_s}")]);
        UEXT4.ok(&["mkfs", &srv.uri]);
        UEXT4.ok(&["mount", &srv.uri, m]);
        let script = format!(
            "set -e; cd {m}; mkdir -p a/b/c; cp -r /etc/apt a/b/c/; \
             dd if=/dev/urandom of=big bs=1M count=8 status=none; sha=$(sha256sum < big); \
             for i in $(seq 1 200); do echo $i > a/f$i; done; rm a/f1*; \
             mv a/b a/moved; ln -s moved a/l; sync; \
             [ \"$(sha256sum < big)\" = \"$sha\" ]; ls a | wc -l; echo \"$sha\" > {m}.sha"
        );
        let o = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(
            o.status.success(),
            "workload: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        UEXT4.ok(&["umount", m]);
        // Read back through the tools (same server, a fresh connection).
        let ls = UEXT4.ok(&["ls", &srv.at("/a")]);
        assert!(
            ls.contains("moved") && ls.contains("f200") && !ls.contains("f150"),
            "{ls}"
        );
    }
    let _ = std::fs::remove_dir(&mnt);
    let sha_file = format!("{m}.sha");
    let sha = std::fs::read_to_string(&sha_file).unwrap();
    let _ = std::fs::remove_file(&sha_file);
    e2fsck_clean(img_s);
    // And locally: the big file is what was written through the mount.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("{} cat {img_s}:/big | sha256sum", UEXT4.0))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), sha);
}

/// A server that dies while a tool writes: the tool fails in one line, exit status 1 (never
/// a silent death by SIGPIPE, which the tools leave at its default), and the next open
/// replays the journal and leaves the image clean.
#[test]
fn a_server_killed_under_a_writing_tool_gives_one_line_and_recovers() {
    if !have(&["nbdkit", "e2fsck"]) {
        return;
    }
    let img = Scratch::file("killed", 128 << 20);
    let img_s = img.0.to_str().unwrap();
    let src = Scratch::file("killed-src", 0);
    std::fs::write(&src.0, vec![0x42u8; 40 << 20]).unwrap();
    {
        let srv = NbdServer::nbdkit(&["file", &format!("file={img_s}")]);
        UEXT4.ok(&["mkfs", &srv.uri]);
        UEXT4.ok(&["mkdir", &srv.at("/kept")]);
    }
    // Every write takes 300 ms: the copy (its data, journal and checkpoint writes) is
    // still going when the server is killed.
    let mut srv = NbdServer::nbdkit(&[
        "--filter=delay",
        "file",
        &format!("file={img_s}"),
        "delay-write=300ms",
    ]);
    let child = Command::new(UEXT4.0)
        .args(["cp", src.0.to_str().unwrap(), &srv.at("/big")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    srv.kill();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("cp with the server killed: {:?}: {err}", o.status);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("NBD"), "{err}");
    drop(srv);
    let srv = NbdServer::nbdkit(&["file", &format!("file={img_s}")]);
    assert!(UEXT4.ok(&["ls", &srv.at("/")]).contains("kept"));
    UEXT4.ok(&["mkdir", &srv.at("/after")]);
    drop(srv);
    e2fsck_clean(img_s);
}
