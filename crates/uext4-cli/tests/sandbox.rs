//! The contained server (docs/SECURITY.md), through real mounts: once mounted, every thread
//! of the server runs under a seccomp filter with no_new_privs and no capability; a system
//! call off the list, an exec and a file outside landlock's set are refused from inside the
//! server while the mount goes on serving; `-o nosandbox` leaves it as it was;
//! `-o sandbox=required` mounts here; the image tools' `--sandbox` still work. Needs root and
//! /dev/fuse; skips with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

struct Env {
    img: PathBuf,
    mnt: PathBuf,
    place: MountPlace,
}

impl Env {
    fn new(tag: &str) -> Option<Env> {
        if !fuse_usable(&format!("sandbox::{tag}")) {
            return None;
        }
        let place = MountPlace::new(&format!("sbx-{tag}"), &["m"]);
        let (img, mnt) = (place.img.clone(), place.point(0));
        Cli(bin()).ok(&["mkfs", "--size", "32M", img.to_str().unwrap()]);
        Some(Env { img, mnt, place })
    }

    /// `uext4 mount -f OPTS IMG MNT` with `env`, its stderr into a file; waits for the mount.
    fn serve(&self, opts: &[&str], env: &[(&str, &str)]) -> (Child, PathBuf) {
        let log = self.place.point(0).with_extension("log");
        let mut cmd = Command::new(bin());
        cmd.arg("mount")
            .arg("-f")
            .args(opts)
            .arg(&self.img)
            .arg(&self.mnt);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !mounted(&self.mnt) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no mount: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (child, log)
    }

    /// Stops a foreground server with SIGTERM: it unmounts (through its helper when
    /// contained) and exits 0.
    fn stop(&self, mut child: Child) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let st = child.wait().unwrap();
        assert!(st.success(), "server exit: {st}");
        assert!(!mounted(&self.mnt), "still mounted after SIGTERM");
    }
}

fn mounted(mnt: &Path) -> bool {
    let target = mnt.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(target) && l.contains(" - fuse.uext4 "))
}

/// The server's process id, as its root answers it.
fn server_pid(mnt: &Path) -> u32 {
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", "user.uext4.server"])
        .arg(mnt)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// `field` of /proc/PID/task/TID/status for every thread of `pid`.
fn per_thread(pid: u32, field: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let st = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default();
        if let Some(l) = st.lines().find(|l| l.starts_with(&format!("{field}:"))) {
            out.push(l[field.len() + 1..].trim().to_string());
        }
    }
    assert!(!out.is_empty(), "no {field} in /proc/{pid}");
    out
}

fn assert_contained(pid: u32) {
    let fields = [
        ("Seccomp", "2"),
        ("NoNewPrivs", "1"),
        ("CapEff", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
    ];
    // The server contains itself once the mount is in the table (it needs the mount's
    // device number first), so the mount can be seen, and answer, a moment before: wait
    // for it, a bounded time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline
        && !fields
            .iter()
            .all(|(f, want)| per_thread(pid, f).iter().all(|v| v == want))
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (field, want) in fields {
        let got = per_thread(pid, field);
        assert!(
            got.iter().all(|v| v == want),
            "{field} of the server's threads: {got:?}, want {want}"
        );
    }
}

fn write_and_read(mnt: &Path) {
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/f"), b"contained").unwrap();
    assert_eq!(std::fs::read(mnt.join("d/f")).unwrap(), b"contained");
    std::fs::rename(mnt.join("d/f"), mnt.join("g")).unwrap();
    std::fs::remove_file(mnt.join("g")).unwrap();
}

#[test]
fn a_mount_is_contained_by_default_in_every_thread() {
    let Some(e) = Env::new("default") else {
        return;
    };
    uext4_mount(bin(), &e.img, &e.mnt, &[]);
    let pid = server_pid(&e.mnt);
    assert_contained(pid);
    write_and_read(&e.mnt);
    // umount goes through the helper that kept the right to unmount; the server then writes
    // the image back and exits.
    Cli(bin()).ok(&["umount", e.mnt.to_str().unwrap()]);
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&e.img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

#[test]
fn what_the_sandbox_refuses_is_refused_and_the_mount_goes_on() {
    let Some(e) = Env::new("probe") else {
        return;
    };
    // A file this process may read but the server may not: landlock's set is the image and
    // /proc only.
    let outside = e.mnt.with_extension("outside");
    std::fs::write(&outside, b"secret").unwrap();
    let probe = format!(
        "socket,open={},exec=/bin/true,open=/proc/self/status,open={}",
        outside.display(),
        e.img.display()
    );
    let (child, log) = e.serve(&[], &[("UEXT4_SANDBOX_PROBE", &probe)]);
    let start = Instant::now();
    let text = loop {
        let t = std::fs::read_to_string(&log).unwrap();
        if t.matches("sandbox probe").count() >= 5 || start.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = |what: &str| {
        text.lines()
            .find(|l| l.contains(&format!("probe: {what}:")))
            .unwrap_or_else(|| panic!("no probe line for {what}: {text}"))
            .to_string()
    };
    assert!(line("socket").contains("refused (Operation not permitted"));
    assert!(line("exec=/bin/true").contains("refused"));
    let o = line(&format!("open={}", outside.display()));
    assert!(o.contains("refused (Permission denied"), "{o}");
    assert!(line("open=/proc/self/status").contains("allowed"));
    assert!(line(&format!("open={}", e.img.display())).contains("allowed"));
    // The refusals stopped nothing: the server serves and stops cleanly.
    write_and_read(&e.mnt);
    e.stop(child);
    let _ = std::fs::remove_file(outside);
}

#[test]
fn nosandbox_leaves_the_server_as_it_was() {
    let Some(e) = Env::new("off") else {
        return;
    };
    let (child, _log) = e.serve(&["-o", "nosandbox"], &[]);
    let pid = server_pid(&e.mnt);
    assert!(per_thread(pid, "Seccomp").iter().all(|v| v == "0"));
    assert!(per_thread(pid, "CapEff")
        .iter()
        .all(|v| v != "0000000000000000"));
    write_and_read(&e.mnt);
    e.stop(child);
}

#[test]
fn sandbox_required_mounts_where_the_kernel_has_it_all() {
    let Some(e) = Env::new("required") else {
        return;
    };
    let (child, log) = e.serve(&["-o", "ro,sandbox=required"], &[]);
    assert_contained(server_pid(&e.mnt));
    assert!(std::fs::read_dir(&e.mnt).unwrap().count() >= 1);
    e.stop(child);
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!text.contains("going on without it"), "{text}");
    // A value it does not know is a usage error.
    let o = Command::new(bin())
        .args(["mount", "-o", "sandbox=maybe"])
        .arg(&e.img)
        .arg(&e.mnt)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("sandbox= takes on, off or required"));
}

#[test]
fn the_image_tools_work_contained() {
    let Some(e) = Env::new("tools") else {
        return;
    };
    let img = e.img.to_str().unwrap();
    let src = e.mnt.with_extension("src");
    std::fs::write(&src, b"from the host").unwrap();
    let dst = e.mnt.with_extension("dst");
    let cli = Cli(bin());
    cli.ok(&[
        "--sandbox",
        "cp",
        src.to_str().unwrap(),
        &format!("{img}:/f"),
    ]);
    assert_eq!(
        cli.ok(&["--sandbox", "cat", &format!("{img}:/f")]),
        "from the host"
    );
    cli.ok(&[
        "--sandbox",
        "cp",
        &format!("{img}:/f"),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&dst).unwrap(), b"from the host");
    assert!(cli
        .ok(&["--sandbox", "ls", &format!("{img}:/")])
        .contains('f'));
    // Copying a tree out makes directories and sets modes and times under the named path.
    let out = e.mnt.with_extension("tree");
    cli.ok(&[
        "--sandbox",
        "cp",
        "-r",
        &format!("{img}:/"),
        out.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(out.join("f")).unwrap(), b"from the host");
    let _ = (std::fs::remove_file(src), std::fs::remove_file(dst));
    let _ = std::fs::remove_dir_all(out);
}
