//! `uext4 bench --quick`: every available system produces numbers for every workload (never how
//! fast), from the built-in fio jobs, and for every workload of the metadata family (a generated
//! tree of about 1,000 entries), with a PNG chart per workload. Needs root and fio; skips with a
//! message otherwise. `uext4 bench` runs the `uext4-bench` program beside it (never one on
//! PATH), and says in one line when there is none. `--family virtio-fs --quick` boots a guest
//! (scripts/kernel-vm.sh, about a minute under TCG) and gives numbers for every workload on
//! both sides, or says in one line why it cannot.

use std::path::Path;
use std::process::Command;

#[test]
fn bench_without_the_harness_says_so_in_one_line() {
    let dir = uext4_testkit::Scratch::dir("bench-alone");
    let alone = dir.p("uext4");
    // A hard link where it can be: a copy is a file open for writing, which a child forked
    // meanwhile by another test's thread holds until it execs, and running the copy then
    // fails with ETXTBSY (retried below).
    if std::fs::hard_link(env!("CARGO_BIN_EXE_uext4"), &alone).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_uext4"), &alone).unwrap();
    }
    // Another build's harness on PATH is not taken for this one's.
    let other = uext4_testkit::Scratch::dir("bench-other");
    std::fs::write(other.p("uext4-bench"), "#!/bin/sh\necho wrong harness\n").unwrap();
    std::fs::set_permissions(
        other.p("uext4-bench"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = || {
        Command::new(&alone)
            .args(["bench", "--quick"])
            .env("PATH", format!("{}:/usr/bin:/bin", other.s()))
            .output()
    };
    let mut o = run();
    // ETXTBSY (26): see above.
    for _ in 0..100 {
        match &o {
            Err(e) if e.raw_os_error() == Some(26) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                o = run();
            }
            _ => break,
        }
    }
    let o = o.unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("uext4-bench is not installed beside"), "{err}");
    assert!(
        err.contains("cargo install --path crates/uext4-bench"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("wrong"));
}

#[test]
fn quick_bench_produces_numbers_for_every_system() {
    let root = unsafe { libc::geteuid() } == 0;
    let fio = Command::new("sh")
        .args(["-c", "command -v fio"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !root || !fio {
        eprintln!("SKIP: bench --quick needs root and fio");
        return;
    }
    let (out, json) = bench("test", &["--quick"]);
    let recs = json.as_array().unwrap();
    for w in [
        "overwrite-4k",
        "mixed-randrw-4k",
        "fsync-randwrite-16k",
        "pwrite-1g",
    ] {
        for s in ["raw", "uext4-fuse", "uext4-lib"] {
            let r = recs
                .iter()
                .find(|r| r["workload"] == w && r["system"] == s)
                .unwrap_or_else(|| panic!("no record for {s} {w}"));
            assert!(
                r["iops"].as_f64().unwrap() > 0.0,
                "{s} {w}: no numbers ({})",
                r["note"]
            );
            if s != "raw" {
                assert_eq!(r["fsck"], "clean", "{s} {w}: e2fsck after the run");
            }
        }
    }
    // Every system that ran (all but the unavailable ones) has numbers for every workload and
    // a clean image; the kernel's ext4 runs here since we are root, fuse2fs when installed.
    let mut systems: Vec<&str> = recs.iter().filter_map(|r| r["system"].as_str()).collect();
    systems.sort_unstable();
    systems.dedup();
    let mut expect = vec![
        "raw",
        "uext4-fuse",
        "uext4-lib",
        "uext4-lib-buffered",
        "memcpy",
        "kernel",
    ];
    if Path::new("/dev/fuse").exists() {
        expect.push("fuse-null");
    }
    let fuse2fs = Command::new("sh")
        .args(["-c", "command -v fuse2fs"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if fuse2fs && Path::new("/dev/fuse").exists() {
        expect.push("fuse2fs");
    }
    for s in expect {
        assert!(systems.contains(&s), "{s} did not run: {systems:?}");
    }
    for s in &systems {
        for w in [
            "overwrite-4k",
            "mixed-randrw-4k",
            "fsync-randwrite-16k",
            "pwrite-1g",
        ] {
            if *s == "kernel-dioread_lock" && w != "fsync-randwrite-16k" {
                continue;
            }
            // The memory-copy ceiling exists for the large sequential write only.
            if *s == "memcpy" && w != "pwrite-1g" {
                continue;
            }
            // The in-memory FUSE server is the metadata family's ceiling only.
            if *s == "fuse-mem" {
                continue;
            }
            let rs: Vec<_> = recs
                .iter()
                .filter(|r| r["workload"] == w && r["system"] == *s)
                .collect();
            assert!(!rs.is_empty(), "no record for {s} {w}");
            for r in rs {
                assert!(r["iops"].as_f64().unwrap() > 0.0, "{s} {w}: no numbers");
                let f = r["fsck"].as_str().unwrap();
                // fuse2fs's images are not ours (it sometimes leaves an "extent tree could be
                // narrower" note); every other image must be clean.
                if *s == "fuse2fs" {
                    if f != "clean" {
                        eprintln!("note: fuse2fs {w}: e2fsck: {f}");
                    }
                } else {
                    assert!(f == "clean" || f == "-", "{s} {w}: e2fsck: {f}");
                }
            }
        }
    }
    // The metadata family: every system that runs it has seconds for every workload, and its
    // image (where it has one) is clean.
    let mut meta_expect = vec!["raw", "kernel", "uext4-fuse", "uext4-lib"];
    if Path::new("/dev/fuse").exists() {
        meta_expect.extend(["fuse-mem", "uext4-fuse-wbc"]);
        if fuse2fs {
            meta_expect.push("fuse2fs");
        }
    }
    for s in meta_expect {
        for w in [
            "untar",
            "stat-walk",
            "read-all",
            "cp-a",
            "pkg-install",
            "rm-rf",
        ] {
            let r = recs
                .iter()
                .find(|r| r["workload"] == w && r["system"] == s)
                .unwrap_or_else(|| panic!("no record for {s} {w}"));
            assert!(
                r["seconds"].as_f64().unwrap_or(0.0) > 0.0,
                "{s} {w}: no time ({})",
                r["note"]
            );
            assert!(
                r["entries"].as_u64().unwrap_or(0) > 0,
                "{s} {w}: no entries"
            );
            let f = r["fsck"].as_str().unwrap();
            if s == "fuse2fs" {
                if f != "clean" {
                    eprintln!("note: fuse2fs {w}: e2fsck: {f}");
                }
            } else if s == "raw" || s == "fuse-mem" {
                assert_eq!(f, "-", "{s} {w}: no image to check");
            } else {
                assert_eq!(f, "clean", "{s} {w}: e2fsck after the family");
            }
        }
    }
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("Metadata workloads"));
    // The fsync workload ran with a 4 MiB journal as well as the default one.
    assert!(recs
        .iter()
        .any(|r| r["workload"] == "fsync-randwrite-16k" && r["journal_mib"] == 4));
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("vs kernel"));
    // A chart per data workload, referenced from the report.
    let png = std::fs::read(out.join("overwrite-4k.png")).expect("overwrite-4k.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("(overwrite-4k.png)"));
    let _ = std::fs::remove_dir_all(&out);
}

/// `uext4 bench --family tools --quick` on uext4's mount: git, python3's venv and pip, make
/// and the C compiler each did their step (the harness checks every step's result: the
/// commit checked out, an empty `git status`, every module imported, the program's output),
/// every step has seconds, and e2fsck is clean after. Needs root, /dev/fuse and the tools.
#[test]
fn tools_family_runs_real_tools_on_the_mount() {
    let root = unsafe { libc::geteuid() } == 0;
    let tools = Command::new("sh")
        .args([
            "-c",
            "command -v git && command -v make && command -v cc && python3 -c 'import venv, ensurepip'",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !root || !tools || !Path::new("/dev/fuse").exists() {
        eprintln!(
            "SKIP: bench --family tools needs root, /dev/fuse, git, make, cc and python3-venv"
        );
        return;
    }
    let (out, json) = bench(
        "tools",
        &["--family", "tools", "--quick", "--systems", "uext4-fuse"],
    );
    let recs = json.as_array().unwrap();
    for w in [
        "git-clone",
        "git-checkout",
        "git-status",
        "venv",
        "pip-install",
        "py-import",
        "cc-build",
        "rm-tree",
    ] {
        let r = recs
            .iter()
            .find(|r| r["workload"] == w && r["system"] == "uext4-fuse")
            .unwrap_or_else(|| panic!("no record for {w}"));
        assert!(
            r["seconds"].as_f64().unwrap_or(0.0) > 0.0,
            "{w}: {}",
            r["note"]
        );
        assert!(r["entries"].as_u64().unwrap_or(0) > 0, "{w}: no entries");
        assert_eq!(r["fsck"], "clean", "{w}: e2fsck after the run");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Real tools"), "{report}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs `uext4 bench ARGS` (the harness built beside it) in a folder of its own under
/// /dev/shm, and asserts it succeeded; returns its output folder and results.json.
fn bench(name: &str, args: &[&str]) -> (std::path::PathBuf, serde_json::Value) {
    uext4_testkit::Cli(env!("CARGO_BIN_EXE_uext4")).build_beside("uext4-bench");
    let pid = std::process::id();
    let out = std::env::temp_dir().join(format!("uext4-bench-{name}-{pid}"));
    let dir = format!("/dev/shm/uext4-bench-{name}-{pid}");
    let o = Command::new(env!("CARGO_BIN_EXE_uext4"))
        .arg("bench")
        .args(args)
        .args(["--dir", &dir])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "bench {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let json = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    (out, json)
}

#[test]
fn virtio_fs_family_runs_in_a_guest_or_says_why() {
    uext4_testkit::Cli(env!("CARGO_BIN_EXE_uext4")).build_beside("uext4-bench");
    let out = uext4_testkit::Scratch::dir("bench-vfs-out");
    let dir = uext4_testkit::Scratch::dir("bench-vfs-dir");
    let o = Command::new(env!("CARGO_BIN_EXE_uext4"))
        .args([
            "bench",
            "--family",
            "virtio-fs",
            "--quick",
            "--dir",
            dir.s(),
        ])
        .args(["--out", out.s()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    if let Some(l) = stdout
        .lines()
        .find(|l| l.starts_with("virtio-fs family skipped: "))
    {
        eprintln!("SKIP: {l}");
        assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
        return;
    }
    // Each image clean after the guest (uext4's and the guest's own ext4's).
    assert!(
        stdout.contains("e2fsck -fn after the guest: virtio-fs clean, virtio-blk clean."),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.p("virtio-fs.json")).unwrap()).unwrap();
    let rows = v.as_array().unwrap();
    let row = |sys: &str, w: &str| {
        rows.iter()
            .find(|r| r["system"] == sys && r["workload"] == w)
            .unwrap_or_else(|| panic!("no {sys} {w} in {v}"))
    };
    let workloads = [
        "untar",
        "stat-walk",
        "read-all",
        "cp-a",
        "pkg-install",
        "rm-rf",
        "fsync-4k",
        "seq-write",
        "seq-read",
    ];
    for w in workloads {
        for sys in ["virtio-fs", "virtio-blk"] {
            let r = row(sys, w);
            assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["entries"].as_u64().unwrap() > 0, "{r}");
        }
        // Only uext4's side has server counters: the guest's ext4 has none.
        assert!(row("virtio-blk", w)["requests"].is_null());
        assert!(row("virtio-fs", w)["requests"].is_array());
    }
    let count = |w: &str, op: &str| -> u64 {
        row("virtio-fs", w)["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["opcode"] == op)
            .and_then(|q| q["count"].as_u64())
            .unwrap_or(0)
    };
    // The removal reached uext4 as UNLINKs, one per file at least, and the guest forgot
    // the inodes on the high-priority queue; their chains came back in batches, so the
    // guest took far fewer interrupts from that queue than it sent FORGETs.
    let rm = row("virtio-fs", "rm-rf");
    let unlinks = count("rm-rf", "UNLINK");
    let forgets = count("rm-rf", "FORGET");
    assert!(unlinks >= rm["entries"].as_u64().unwrap() / 2, "{rm}");
    assert!(forgets >= unlinks, "{rm}");
    let hiprio = rm["guest_interrupts"]["hiprio"].as_u64().unwrap();
    assert!(
        hiprio <= forgets / 2,
        "{hiprio} interrupts for {forgets} FORGETs: {rm}"
    );
    assert_eq!(count("seq-write", "FSYNC"), 1, "{v}");
}
