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
        e2fsck_clean(&img.0);
        assert!(checked > 0);
    }
}

/// Lines of a command's output.
fn lines_of(cmd: &mut Command) -> Vec<String> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Records of `|`-separated fields equal on every field the Sleuth Kit fills: it writes 0 for
/// the creation time on ext3 images (column `crtime`) and leaves a slow symlink's target out
/// of its name in extent-mapped inodes (column `name`); the kernel records both, and uext4
/// writes them.
fn same_where_both_fill(
    ours: &[String],
    theirs: &[String],
    crtime: usize,
    name: Option<usize>,
    what: &str,
) {
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{what}: {ours:#?} against {theirs:#?}"
    );
    for (o, t) in ours.iter().zip(theirs) {
        let (o, t): (Vec<&str>, Vec<&str>) = (o.split('|').collect(), t.split('|').collect());
        assert_eq!(o.len(), t.len(), "{what}: {o:?} against {t:?}");
        for (k, (a, b)) in o.iter().zip(&t).enumerate() {
            if k == crtime && *b == "0" {
                continue;
            }
            if Some(k) == name && !b.contains(" -> ") && a.contains(" -> ") {
                assert!(
                    a.starts_with(&format!("{b} -> ")),
                    "{what}: {a} against {b}"
                );
                continue;
            }
            assert_eq!(a, b, "{what}: field {k} of {o:?} against {t:?}");
        }
    }
}

#[test]
fn ncheck_icheck_timeline_inodes_and_deleted_entries_agree_with_debugfs_and_the_sleuth_kit() {
    if !have(&["fls", "ils"]) {
        println!("SKIP: the Sleuth Kit (fls, ils) is needed");
        return;
    }
    for (tag, mkfs) in [("ext4", &["-t", "ext4"][..]), ("ext3", &["-t", "ext3"][..])] {
        let Some(img) = kernel_image(&format!("ex-{tag}"), mkfs, FILL) else {
            return;
        };
        // Removed entries left readable, as e2fsprogs and older kernels leave them (current
        // kernels wipe the removed entry).
        sh(&format!(
            "cd /tmp && mkdir -p {d} && mount -o loop {i} {d} && mkdir {d}/dd && \
             for n in 1 2 3 4 5 6; do echo $n > {d}/dd/file$n; done && umount {d} && \
             debugfs -w -R 'rm dd/file2' {i} && debugfs -w -R 'rm dd/file5' {i} && rmdir {d}",
            d = format!("/tmp/uext4-ex-{tag}-{}", std::process::id()),
            i = img.0.display()
        ));
        let before = std::fs::read(&img.0).unwrap();
        let i = img.0.to_str().unwrap();

        // ncheck: every inode of the first 40 that debugfs names ("//x" is debugfs's way of
        // writing a name in the root).
        let inos: Vec<String> = (11..=40).map(|n| n.to_string()).collect();
        let mut theirs = lines_of(Command::new("debugfs").args([
            "-R",
            &format!("ncheck {}", inos.join(" ")),
            i,
        ]));
        theirs
            .iter_mut()
            .for_each(|l| *l = l.replace("\t//", "\t/"));
        let mut args = vec!["ncheck", i];
        args.extend(inos.iter().map(String::as_str));
        let ours: Vec<String> = UEXT4.ok(&args).lines().map(str::to_string).collect();
        assert_eq!(ours, theirs, "{tag}: ncheck");

        // icheck: the blocks of every mapped file, the map blocks, and blocks nobody owns.
        let mut blocks: Vec<String> = Vec::new();
        for name in ["small", "big", "prealloc", "frag", "slow", "d"] {
            let v: serde_json::Value =
                serde_json::from_str(&UEXT4.ok(&["stat", "--json", &format!("{i}:/{name}")]))
                    .unwrap();
            for m in v["map"].as_array().unwrap() {
                let b = m["physical"].as_u64().or(m["map_block"].as_u64()).unwrap();
                blocks.push(b.to_string());
                if let Some(len) = m["length"].as_u64() {
                    blocks.push((b + len - 1).to_string());
                }
            }
        }
        blocks.extend(["0", "1", "9999", "16000"].map(String::from));
        let theirs = lines_of(Command::new("debugfs").args([
            "-R",
            &format!("icheck {}", blocks.join(" ")),
            i,
        ]));
        let mut args = vec!["icheck", i];
        args.extend(blocks.iter().map(String::as_str));
        let ours: Vec<String> = UEXT4.ok(&args).lines().map(str::to_string).collect();
        assert_eq!(ours, theirs, "{tag}: icheck");

        // The body file, line for line with fls -r -m /, on the fields both fill: the Sleuth
        // Kit leaves out a slow symlink's target in an extent-mapped inode and the creation
        // time on an ext3 image (the kernel records both; uext4 writes them).
        let theirs = lines_of(Command::new("fls").args(["-r", "-m", "/", i]));
        let ours: Vec<String> = UEXT4
            .ok(&["timeline", i])
            .lines()
            .map(str::to_string)
            .collect();
        same_where_both_fill(&ours, &theirs, 10, Some(1), &format!("{tag}: timeline"));
        assert!(
            ours.iter().any(|l| l.contains("/dd/file2 (deleted)")),
            "{tag}: {ours:?}"
        );

        // Deleted inodes, as plain ils lists them (its two header lines name host and time).
        let theirs = lines_of(Command::new("ils").arg(i));
        let ours: Vec<String> = UEXT4
            .ok(&["inodes", "--deleted", i])
            .lines()
            .map(str::to_string)
            .collect();
        same_where_both_fill(&ours[2..], &theirs[2..], 7, None, &format!("{tag}: inodes"));

        // Removed entries: the same as debugfs's ls -d shows in <N>.
        let shown = UEXT4.ok(&["ls", "--deleted", &format!("{i}:/dd")]);
        let dls = lines_of(Command::new("debugfs").args(["-R", "ls -d dd", i])).join(" ");
        for n in [2, 5] {
            let line = shown
                .lines()
                .find(|l| l.starts_with(&format!("file{n} (deleted, inode ")))
                .unwrap();
            let ino: String = line
                .rsplit(' ')
                .next()
                .unwrap()
                .trim_end_matches(')')
                .to_string();
            assert!(
                dls.contains(&format!("<{ino}>")),
                "{tag}: debugfs ls -d: {dls}"
            );
        }
        assert_eq!(shown.lines().count(), 6, "{tag}: {shown}");
        let v: serde_json::Value =
            serde_json::from_str(&UEXT4.ok(&["ls", "--json", "--deleted", &format!("{i}:/dd")]))
                .unwrap();
        let got: Vec<(String, bool)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["deleted"] == true,
                )
            })
            .collect();
        let want: Vec<(String, bool)> = (1..=6)
            .map(|n| (format!("file{n}"), n == 2 || n == 5))
            .collect();
        assert_eq!(got, want, "{tag}: ls --json --deleted");
        assert_eq!(
            std::fs::read(&img.0).unwrap(),
            before,
            "{tag}: a command changed the image"
        );
        e2fsck_clean(&img.0);
    }
}

/// `info --json` carries dumpe2fs -h's numbers under stable keys.
#[test]
fn info_json_agrees_with_dumpe2fs() {
    if !have(&["mke2fs", "dumpe2fs"]) {
        println!("SKIP: needs e2fsprogs");
        return;
    }
    let img = scratch("info-json");
    mke2fs(&img.0, "32M", &["-b", "1024", "-L", "lbl"]);
    let v: serde_json::Value =
        serde_json::from_str(&UEXT4.ok(&["info", "--json", img.s()])).unwrap();
    let d = sh(&format!("dumpe2fs -h {} 2>/dev/null", img.s()));
    let field = |name: &str| {
        d.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in dumpe2fs"))
            .trim()
            .to_string()
    };
    for (key, name) in [
        ("block_count", "Block count"),
        ("free_blocks", "Free blocks"),
        ("inode_count", "Inode count"),
        ("free_inodes", "Free inodes"),
        ("block_size", "Block size"),
        ("reserved_block_count", "Reserved block count"),
    ] {
        assert_eq!(v[key].to_string(), field(name), "{key}");
    }
    assert_eq!(v["volume_name"], "lbl");
    let ours: std::collections::BTreeSet<&str> =
        v["features"].as_str().unwrap().split(' ').collect();
    let theirs = field("Filesystem features");
    let theirs: std::collections::BTreeSet<&str> = theirs.split(' ').collect();
    assert_eq!(ours, theirs);
    assert_eq!(v["on_disk"]["needs_recovery"], "no");
    e2fsck_clean(&img.0);
}

/// `inodes --json` gives the records the ils lines give (those are checked against ils above).
#[test]
fn inodes_json_matches_the_ils_lines() {
    if !have(&["mke2fs"]) {
        println!("SKIP: needs e2fsprogs");
        return;
    }
    let img = scratch("inodes-json");
    mke2fs(&img.0, "16M", &["-b", "1024"]);
    UEXT4.ok(&["mkdir", &img.at("/d")]);
    UEXT4.ok(&["touch", &img.at("/d/f")]);
    let text = UEXT4.ok(&["inodes", img.s()]);
    let v: serde_json::Value =
        serde_json::from_str(&UEXT4.ok(&["inodes", "--json", img.s()])).unwrap();
    let recs = v.as_array().unwrap();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .skip(3)
        .map(|l| l.split('|').collect())
        .collect();
    assert_eq!(recs.len(), lines.len());
    for (r, l) in recs.iter().zip(&lines) {
        assert_eq!(r["inode"].to_string(), l[0]);
        assert_eq!(r["allocated"], l[1] == "a");
        assert_eq!(r["size"].to_string(), l[10]);
        assert_eq!(r["links"].to_string(), l[9]);
    }
    assert!(recs
        .iter()
        .any(|r| r["inode"] == 2 && r["allocated"] == true));
    e2fsck_clean(&img.0);
}

/// Every inode debugfs's `lsdel` reports (deleted, blocks still mapped: e2fsprogs's own
/// deletion keeps them) is in `inodes --deleted --json`, with its owner, mode and size.
/// uext4 only reads here; the image is left as debugfs's kill_file leaves it (names still
/// pointing at the freed inodes, which e2fsck would repair), so no e2fsck verdict is asked.
#[test]
fn deleted_inodes_agree_with_debugfs_lsdel() {
    if !have(&["mke2fs", "debugfs"]) {
        println!("SKIP: needs e2fsprogs");
        return;
    }
    let tree = Scratch::dir("lsdel-tree");
    sh(&format!(
        "cd {}; mkdir d; for i in 1 2 3; do head -c $((i*7000)) /dev/urandom > d/f$i; done",
        tree.s()
    ));
    let img = scratch("lsdel");
    mke2fs(&img.0, "16M", &["-b", "1024", "-d", tree.s()]);
    sh(&format!(
        "debugfs -w -R 'kill_file /d/f1' {0} && debugfs -w -R 'kill_file /d/f3' {0}",
        img.s()
    ));
    let lsdel = sh(&format!("debugfs -R lsdel {} 2>/dev/null", img.s()));
    let theirs: Vec<Vec<&str>> = lsdel
        .lines()
        .filter(|l| l.trim().chars().next().is_some_and(|c| c.is_ascii_digit()))
        .filter(|l| !l.contains("deleted inodes found"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(theirs.len(), 2, "{lsdel}");
    let v: serde_json::Value =
        serde_json::from_str(&UEXT4.ok(&["inodes", "--deleted", "--json", img.s()])).unwrap();
    for t in &theirs {
        let r = v
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["inode"].as_u64() == t[0].parse().ok())
            .unwrap_or_else(|| panic!("lsdel's inode {} missing: {v}", t[0]));
        assert_eq!(r["uid"].to_string(), t[1]);
        assert_eq!(format!("{:o}", r["mode"].as_u64().unwrap()), t[2]);
        assert_eq!(r["size"].to_string(), t[3]);
        assert_eq!(r["allocated"], false);
    }
}
