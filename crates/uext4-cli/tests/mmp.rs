//! Multi-mount protection through the `uext4` binary: a tool writes an `mmp` image and leaves
//! its MMP block clean; while e2fsck on another node holds the image a writing tool is refused
//! with one line naming it; a block a crashed node left is taken after the wait; `uext4 info`
//! shows the block. (A holder on this host is refused before MMP, by the tools' own check for
//! processes that have the image open; crates/uext4/tests/mmp.rs covers live holders.) Needs mke2fs, debugfs and e2fsck (skips without them).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use uext4_testkit::{have, Scratch};

/// Runs a program that must succeed; what it printed (stdout and stderr).
fn run_ok(prog: &str, args: &[&str]) -> String {
    let o = Command::new(prog).args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{prog} {args:?} failed: {text}");
    text
}

fn mmp_seq(img: &str) -> String {
    let out = run_ok("debugfs", &["-R", "dump_mmp", img]);
    out.lines()
        .find_map(|l| l.strip_prefix("sequence: "))
        .unwrap_or_else(|| panic!("no sequence in dump_mmp:\n{out}"))
        .trim()
        .to_string()
}

/// Writes the MMP block's sequence and node as another node would (with its checksum).
fn set_seq(img: &std::path::Path, seq: u32, node: &str) {
    use std::os::unix::fs::FileExt;
    use uext4::format::{mmp::MmpBlock, superblock::Superblock};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = vec![0u8; 1024];
    f.read_exact_at(&mut b, 1024).unwrap();
    let sb = Superblock::from_bytes(&b);
    let off = sb.mmp_block() * sb.block_size() as u64;
    f.read_exact_at(&mut b, off).unwrap();
    let mut m = MmpBlock::from_bytes(&b);
    m.set_seq(seq);
    m.set_nodename(node);
    m.set_csum(sb.has_metadata_csum().then(|| sb.csum_seed()));
    f.write_all_at(m.bytes(), off).unwrap();
}

#[test]
fn tools_take_the_mmp_block_leave_it_clean_and_respect_other_holders() {
    if !have(&["mke2fs", "debugfs", "e2fsck"]) {
        return;
    }
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let img = Scratch(dir.join(format!("uext4-tools-mmp-{}.img", std::process::id())));
    let s = img.0.to_str().unwrap();
    run_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-O",
            "mmp",
            "-E",
            "mmp_update_interval=1",
            s,
            "32M",
        ],
    );
    let bin = env!("CARGO_BIN_EXE_uext4");
    let o = Command::new(bin)
        .args(["mkdir", &format!("{s}:/x")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mmp_seq(s), "ff4d4d50");
    run_ok("e2fsck", &["-fn", s]);
    let info = run_ok(bin, &["info", s]);
    assert!(info.contains("MMP:") && info.contains("clean"), "{info}");

    // e2fsck (on another node) holds it: refused at once, in one line.
    set_seq(&img.0, 0xE24D_4D50, "fscknode");
    let o = Command::new(bin)
        .args(["mkdir", &format!("{s}:/y")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("MMP: e2fsck is running on it (node fscknode"),
        "{err}"
    );
    let info = run_ok(bin, &["info", s]);
    assert!(info.contains("e2fsck running"), "{info}");
    // A node that died holding it: the tool waits twice the check interval, then writes.
    set_seq(&img.0, 77, "deadnode");
    let t = Instant::now();
    let o = Command::new(bin)
        .args(["mkdir", &format!("{s}:/z")])
        .output()
        .unwrap();
    eprintln!("mkdir after a crashed node took {:?}", t.elapsed());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() >= Duration::from_secs(22));
    assert_eq!(mmp_seq(s), "ff4d4d50");
    run_ok("e2fsck", &["-fn", s]);
    let ls = run_ok(bin, &["ls", &format!("{s}:/")]);
    assert!(ls.contains('x') && ls.contains('z'), "{ls}");
}
