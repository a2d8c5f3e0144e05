//! The journal's history and recovery from it, on images the kernel wrote:
//! - `uext4 journal` lists the transactions recovery would replay exactly as debugfs's
//!   `logdump -a` does (sequence, filesystem block, log block), on a copy taken while the
//!   kernel had the image mounted;
//! - `uext4 journal --inode` shows the older copies of an inode in order;
//! - `uext4 recover` brings back every deleted file extundelete brings back, byte for byte,
//!   and more (with names, from directory blocks the log still holds), on ext3 and ext4;
//! - neither changes a byte of the image, and the images pass `e2fsck -fn`.
//!
//! Needs root, loop devices, e2fsprogs and extundelete; skips with a message otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

/// A kernel-written image: mke2fs with `mkfs`, then `script` run in its mount point with
/// `$H` naming a host folder for keeping originals. With `copy_mounted`, the image is
/// copied while still mounted (its journal then needs recovery) and the copy returned too.
fn kernel_image(
    tag: &str,
    mkfs: &[&str],
    script: &str,
    host: &Path,
    copy_mounted: bool,
) -> Option<(Scratch, Option<Scratch>)> {
    if !is_root() || !can_loop_mount() || !have(&["debugfs", "mke2fs", "extundelete"]) {
        println!("SKIP: needs root, loop devices, e2fsprogs and extundelete");
        return None;
    }
    let img = scratch(tag);
    sh(&format!("mke2fs -q -F {} {} 64M", mkfs.join(" "), img.s()));
    let mnt = Scratch::dir(&format!("{tag}-mnt"));
    sh(&format!("mount -o loop {} {}", img.s(), mnt.s()));
    let r = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; H={}; cd {}; {script}",
            host.display(),
            mnt.s()
        ))
        .output()
        .unwrap();
    let copy = copy_mounted.then(|| {
        let c = scratch(&format!("{tag}-copy"));
        sh(&format!("sync; cp {} {}", img.s(), c.s()));
        c
    });
    sh(&format!("umount {}", mnt.s()));
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    Some((img, copy))
}

fn sha(p: &Path) -> String {
    sh(&format!("sha256sum {}", p.display()))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn journal_lists_the_log_as_debugfs_logdump_does() {
    let host = Scratch::dir("jh-host");
    let script =
        "mkdir d; echo a > d/x; sync; echo b > y; head -c 20000 /dev/urandom > d/x; sync; \
        rm y; mkdir d/e; sync";
    let Some((_img, Some(copy))) = kernel_image(
        "jh-list",
        &["-t", "ext4", "-b", "1024"],
        script,
        &host.0,
        true,
    ) else {
        return;
    };
    let before = sha(&copy.0);
    // debugfs walks the part of the log recovery replays.
    let dump = sh(&format!("debugfs -R 'logdump -a' {} 2>/dev/null", copy.s()));
    let mut theirs = BTreeSet::new();
    let mut seq = 0u32;
    for l in dump.lines() {
        if let Some(r) = l.strip_prefix("Dumping descriptor block, sequence ") {
            seq = r.split(',').next().unwrap().parse().unwrap();
        }
        if let Some(r) = l.trim().strip_prefix("FS block ") {
            let w: Vec<&str> = r.split_whitespace().collect();
            theirs.insert((
                seq,
                w[0].parse::<u64>().unwrap(),
                w[5].parse::<u64>().unwrap(),
            ));
        }
    }
    assert!(theirs.len() >= 10, "debugfs found too little: {dump}");
    let out = UEXT4.ok(&["journal", "--json", copy.s()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (start, sequence) = (
        v["start"].as_u64().unwrap(),
        v["sequence"].as_u64().unwrap(),
    );
    assert_ne!(start, 0, "the copy's journal needs recovery: {out}");
    let mut ours = BTreeSet::new();
    for t in v["transactions"].as_array().unwrap() {
        let s = t["sequence"].as_u64().unwrap();
        assert_eq!(t["committed"], true, "{t}");
        if s < sequence {
            continue; // checkpointed before the copy: debugfs does not walk there
        }
        for b in t["blocks"].as_array().unwrap() {
            assert_eq!(b["state"], "intact", "{b}");
            ours.insert((
                s as u32,
                b["block"].as_u64().unwrap(),
                b["log_block"].as_u64().unwrap(),
            ));
        }
    }
    assert_eq!(ours, theirs);
    // What the blocks are: the text view names inode tables, bitmaps and directory blocks.
    let text = UEXT4.ok(&["journal", copy.s()]);
    for what in [
        "inode table of group 0",
        "block bitmap of group",
        "directory block 0 of inode 2",
    ] {
        assert!(text.contains(what), "no {what:?} in:\n{text}");
    }
    // d/x was logged small, then with 20000 bytes: its copies show both, oldest first.
    let ino = UEXT4.ok(&["stat", "--json", &copy.at("/d/x")]);
    let ino: serde_json::Value = serde_json::from_str(&ino).unwrap();
    let n = ino["inode"].as_u64().unwrap().to_string();
    let copies = UEXT4.ok(&["journal", "--json", "--inode", &n, copy.s()]);
    let copies: serde_json::Value = serde_json::from_str(&copies).unwrap();
    let sizes: Vec<u64> = copies["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["inode"]["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes.first(), Some(&2), "{copies}");
    assert_eq!(sizes.last(), Some(&20000), "{copies}");
    assert_eq!(sha(&copy.0), before, "a read changed the image");
    // The copy replays cleanly in e2fsck (on a copy of the copy).
    let fixed = scratch("jh-list-fixed");
    std::fs::copy(&copy.0, &fixed.0).unwrap();
    sh(&format!("e2fsck -fy {} >/dev/null 2>&1 || true", fixed.s()));
    e2fsck_clean(&fixed.0);
}

/// extundelete's recovered files: `RECOVERED_FILES/<path>` or `file.<ino>`, by inode where
/// it says (its file.N), by path otherwise.
fn extundelete(img: &Path, work: &Path) -> BTreeMap<String, Vec<u8>> {
    let out = Command::new("extundelete")
        .current_dir(work)
        .arg(img)
        .arg("--restore-all")
        .output()
        .unwrap();
    let _ = out; // it exits non-zero when it finds nothing
    let root = work.join("RECOVERED_FILES");
    let mut found = BTreeMap::new();
    let list = sh(&format!(
        "cd {} 2>/dev/null && find . -type f || true",
        root.display()
    ));
    for f in list.lines() {
        let rel = f.trim_start_matches("./").to_string();
        found.insert(rel.clone(), std::fs::read(root.join(&rel)).unwrap());
    }
    found
}

fn recover_case(tag: &str, mkfs: &[&str]) {
    let host = Scratch::dir(&format!("{tag}-host"));
    // Files of several sizes (inline-sized to several extents), some deleted after a commit.
    let script =
        "mkdir -p d/sub; for i in 1 2 3 4 5; do head -c $((i*9000)) /dev/urandom > d/f$i; \
        cp d/f$i $H/f$i; done; echo tiny > d/sub/t; cp d/sub/t $H/t; \
        head -c 300000 /dev/urandom > big; cp big $H/big; sync; sleep 6; \
        rm d/f2 d/f4 d/sub/t big; sync";
    let Some((img, _)) = kernel_image(tag, mkfs, script, &host.0, false) else {
        return;
    };
    let before = sha(&img.0);
    let out = Scratch::dir(&format!("{tag}-out"));
    let listed = UEXT4.ok(&["recover", "--json", img.s(), out.s()]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let by_ino: BTreeMap<u64, String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["inode"].as_u64().unwrap(),
                f["written_to"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // Every deleted file, by its name, byte for byte.
    for (name, orig) in [
        ("d/f2", "f2"),
        ("d/f4", "f4"),
        ("d/sub/t", "t"),
        ("big", "big"),
    ] {
        let got = std::fs::read(out.p(name)).unwrap_or_else(|e| panic!("{name}: {e}; {listed}"));
        assert!(
            got == std::fs::read(host.p(orig)).unwrap(),
            "{name} differs"
        );
    }
    // Everything extundelete recovers, uext4 recovers identically.
    let work = Scratch::dir(&format!("{tag}-xu"));
    let theirs = extundelete(&img.0, &work.0);
    for (rel, bytes) in &theirs {
        let ours = match rel.strip_prefix("file.") {
            Some(n) => by_ino
                .get(&n.parse::<u64>().unwrap())
                .unwrap_or_else(|| panic!("extundelete recovered inode {n}, uext4 did not")),
            None => rel,
        };
        assert!(
            std::fs::read(out.p(ours)).unwrap() == *bytes,
            "{rel} differs from extundelete's"
        );
    }
    println!(
        "{tag}: extundelete recovered {}, uext4 {}",
        theirs.len(),
        by_ino.len()
    );
    assert_eq!(sha(&img.0), before, "recover changed the image");
    e2fsck_clean(&img.0);
}

#[test]
fn recover_brings_back_what_extundelete_does_on_ext3() {
    recover_case("jh-ext3", &["-t", "ext3", "-b", "1024"]);
}

#[test]
fn recover_brings_back_deleted_files_on_ext4() {
    recover_case("jh-ext4", &["-t", "ext4", "-b", "4096"]);
}
