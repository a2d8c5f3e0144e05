//! uext4's fast commits through `uext4 mount`: on an image made with `mke2fs -O fast_commit`,
//! the fsyncs of a package manager's replaces (a new version written and fsynced under a
//! temporary name, renamed over the old one, the directory fsynced), of appends and of a
//! hard link and a removal are all answered by fast commits, after the FUSE kernel's FORGETs
//! of the replaced files too (`uext4 stats` counts them). The server is then killed (SIGKILL,
//! a power cut for everything not yet written), and the kernel's ext4 replays the image to
//! exactly what was fsynced, e2fsck -fn clean. Needs root, /dev/fuse and loop devices; skips
//! with a message otherwise.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

/// The server, killed on drop if the test did not kill it (a failed assertion), then the
/// mount detached, so that a failure leaves nothing mounted.
struct Server {
    child: Child,
    mnt: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// The named counters of `uext4 stats MNT`.
fn stats(mnt: &Path) -> serde_json::Value {
    let o = Command::new(bin()).arg("stats").arg(mnt).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn write_synced(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn fsync_dir(dir: &Path) {
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

#[test]
fn fast_commits_through_the_mount_replay_after_a_kill() {
    if !fuse_usable("the fast-commit mount test") {
        return;
    }
    if !can_loop_mount() {
        eprintln!("skipped: the fast-commit mount test needs loop devices");
        return;
    }
    let place = MountPlace::new("fcmount", &["mnt"]);
    let (img, mnt) = (place.img.clone(), place.point(0));
    // A fast-commit area of 64 blocks, room for every fast commit below (mke2fs's default
    // here is 16; a full area commits in full).
    mke2fs(
        &img,
        "64M",
        &["-O", "fast_commit", "-J", "size=16,fast_commit_size=256"],
    );
    // commit=600: no periodic full commit during the test.
    let child = Command::new(bin())
        .args(["mount", "-f", "-o", "commit=600"])
        .arg(&img)
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Server {
        child,
        mnt: mnt.clone(),
    };
    let start = Instant::now();
    while !mnt.join("lost+found").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The setup, committed in full by syncfs.
    let pkg = |i: usize| mnt.join(format!("lib{i}.so"));
    let version = |i: usize, v: u8| vec![v.wrapping_add(i as u8); 3000 + 4096 * (i % 3)];
    for i in 0..8 {
        std::fs::write(pkg(i), version(i, 1)).unwrap();
    }
    std::fs::write(mnt.join("doomed"), b"removed later\n").unwrap();
    std::fs::write(mnt.join("log"), b"").unwrap();
    // syncfs does not reach a FUSE server: the server's own commit once the mount goes quiet
    // (a tick without a change) commits the setup in full.
    let n = |j: &serde_json::Value, k: &str| j[k].as_u64().unwrap();
    let start = Instant::now();
    while n(&stats(&mnt), "commits") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no commit when quiet"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = stats(&mnt);

    let mut fsyncs = 0;
    let mut log = Vec::new();
    for i in 0..8 {
        let tmp = mnt.join(format!(".lib{i}.so.tmp"));
        write_synced(&tmp, &version(i, 2));
        std::fs::rename(&tmp, pkg(i)).unwrap();
        fsync_dir(&mnt);
        let line = format!("installed lib{i}.so\n");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("log"))
            .unwrap();
        f.write_all(line.as_bytes()).unwrap();
        f.sync_data().unwrap();
        log.extend_from_slice(line.as_bytes());
        fsyncs += 3;
    }
    std::fs::hard_link(pkg(0), mnt.join("lib0.so.1")).unwrap();
    std::fs::remove_file(mnt.join("doomed")).unwrap();
    fsync_dir(&mnt);
    fsyncs += 1;
    // The kernel forgets the replaced files when it drops their inodes: drop its caches so
    // that the FORGETs (and the frees they bring) come before the last fsync.
    let forgets = |j: &serde_json::Value| {
        let r = &j["fuse_requests"];
        r["FORGET"]["count"].as_u64().unwrap_or(0)
            + r["BATCH_FORGET"]["count"].as_u64().unwrap_or(0)
    };
    let forgot = forgets(&stats(&mnt));
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let start = Instant::now();
    while forgets(&stats(&mnt)) == forgot {
        assert!(start.elapsed() < Duration::from_secs(10), "no FORGET came");
        std::thread::sleep(Duration::from_millis(50));
    }
    write_synced(&mnt.join("last"), b"after the forgets\n");
    fsyncs += 1;

    // Every fsync a fast commit; full commits only the server's own, when the mount went
    // quiet, never one an fsync fell back to.
    let after = stats(&mnt);
    let fast = n(&after, "fast_commits") - n(&before, "fast_commits");
    assert_eq!(
        (fast, n(&after, "fast_commit_fallbacks")),
        (fsyncs, 0),
        "{after}"
    );

    // A power cut: nothing the server had not written reaches the image.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let k = KernelMount::new(&img);
    for i in 0..8 {
        assert_eq!(
            std::fs::read(k.dir.join(format!("lib{i}.so"))).unwrap(),
            version(i, 2)
        );
        assert!(!k.dir.join(format!(".lib{i}.so.tmp")).exists());
    }
    assert_eq!(std::fs::read(k.dir.join("log")).unwrap(), log);
    assert_eq!(
        std::fs::read(k.dir.join("lib0.so.1")).unwrap(),
        version(0, 2)
    );
    assert!(!k.dir.join("doomed").exists());
    assert_eq!(
        std::fs::read(k.dir.join("last")).unwrap(),
        b"after the forgets\n"
    );
    assert!(k.try_unmount(), "the kernel's mount stays busy");
    e2fsck_clean_when(&img, "after the kernel replayed the mount's fast commits");
}
