//! The examiner's commands against debugfs, on images the kernel made and then changed
//! (written, fragmented, preallocated, deleted; extent-mapped and block-mapped): `uext4 stat`
//! agrees with debugfs's `stat` line by line on every field both print, by path and by
//! `<N>`, for live and deleted inodes; and no command changes a byte of the image.
//! Needs root, loop devices and debugfs; skips with a message otherwise.

use std::path::Path;
use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

/// debugfs's `stat` of `what`, in UTC, without the lines uext4 words its own way (xattr
/// values).
fn debugfs_stat(img: &Path, what: &str) -> Vec<String> {
    let out = Command::new("debugfs")
        .env("TZ", "UTC")
        .args(["-R", &format!("stat {what}")])
        .arg(img)
        .output()
        .unwrap();
    comparable(&String::from_utf8_lossy(&out.stdout))
}

fn comparable(s: &str) -> Vec<String> {
    s.lines()
        .filter(|l| !l.starts_with("  ") && !l.starts_with("Extended attributes"))
        .map(str::to_string)
        .collect()
}

/// uext4's debugfs-layout part of `stat`, the same lines kept.
fn uext4_stat(img: &Path, what: &str) -> Vec<String> {
    let out = UEXT4.ok(&["stat", &format!("{}:{what}", img.display())]);
    comparable(&out)
        .into_iter()
        .skip_while(|l| !(l.starts_with("Inode: ") && l.contains("   Type: ")))
        .filter(|l| !l.starts_with("Location: "))
        .collect()
}

/// A kernel-made image: `features` for mke2fs, then `script` run in its mount point.
fn kernel_image(tag: &str, mkfs: &[&str], script: &str) -> Option<Scratch> {
    if !is_root() || !can_loop_mount() || !have(&["debugfs", "mke2fs"]) {
        println!("SKIP: needs root, loop devices and e2fsprogs");
        return None;
    }
    let img = scratch(tag);
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-b", "4096"])
        .args(mkfs)
        .arg(&img.0)
        .arg("64M")
        .status()
        .unwrap();
    assert!(st.success(), "mke2fs {mkfs:?}");
    let mnt = std::env::temp_dir().join(format!("uext4-examine-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!(
        "mount -o loop {} {}",
        img.0.display(),
        mnt.display()
    ));
    let r = Command::new("bash")
        .arg("-c")
        .arg(format!("set -e; cd {}; {script}", mnt.display()))
        .output()
        .unwrap();
    sh(&format!("umount {}", mnt.display()));
    let _ = std::fs::remove_dir(&mnt);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    Some(img)
}

const FILL: &str = "echo hi > small; setfattr -n user.a -v b small; \
    dd if=/dev/urandom of=big bs=1k count=300 status=none; { fallocate -l 40k prealloc 2>/dev/null || truncate -s 40k prealloc; }; \
    for i in $(seq 1 400); do dd if=/dev/zero of=frag bs=1k count=1 seek=$((i*2)) conv=notrunc status=none; done; \
    ln -s small fast; ln -s /$(printf 'x%.0s' $(seq 1 100))/t slow; mkdir -p d/e; mknod dev c 4 5; \
    echo gone > deleted; dd if=/dev/urandom of=big-gone bs=4k count=20 status=none; sync; \
    rm deleted big-gone";

#[test]
fn stat_agrees_with_debugfs() {
    for (tag, mkfs) in [
        ("ext4", &["-t", "ext4"][..]),
        ("ext3", &["-t", "ext3"][..]),
        ("inline", &["-t", "ext4", "-O", "inline_data"][..]),
    ] {
        let Some(img) = kernel_image(&format!("stat-{tag}"), mkfs, FILL) else {
            return;
        };
        let before = std::fs::read(&img.0).unwrap();
        let mut checked = 0;
        for name in [
            "small", "big", "prealloc", "frag", "fast", "slow", "d", "d/e", "dev",
        ] {
            let theirs = debugfs_stat(&img.0, name);
            assert!(theirs.len() > 5, "{tag} {name}: debugfs said {theirs:?}");
            assert_eq!(
                uext4_stat(&img.0, &format!("/{name}")),
                theirs,
                "{tag}: {name}"
            );
            checked += 1;
        }
        // By number: every inode of the first group's table that debugfs shows, deleted
        // ones (a dtime, links 0) among them.
        let mut deleted = 0;
        for ino in 1..=40u32 {
            let theirs = debugfs_stat(&img.0, &format!("<{ino}>"));
            assert_eq!(
                uext4_stat(&img.0, &format!("<{ino}>")),
                theirs,
                "{tag}: <{ino}>"
            );
            deleted += theirs.iter().any(|l| l.starts_with(" dtime:")) as usize;
        }
        assert!(
            deleted >= 2,
            "{tag}: {deleted} deleted inodes among the first 40"
        );
        let json = UEXT4.ok(&["stat", "--json", &format!("{}:/big", img.0.display())]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["size"], 300 * 1024);
        assert_eq!(v["in_use"], true);
        assert!(!v["map"].as_array().unwrap().is_empty());
        assert_eq!(
            std::fs::read(&img.0).unwrap(),
            before,
            "{tag}: stat changed the image"
        );
        assert!(checked > 0);
    }
}
