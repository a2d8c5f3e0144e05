//! `uext4 quota` through the built binary: the report lists what `debugfs -R 'lq TYPE'`
//! lists; `uext4 quota set` sets limits that debugfs then lists, and changes made by the
//! other tools (`chown`, `cp`, `chattr -p`) move usage so that the image stays `e2fsck -fn`
//! clean (e2fsck compares usage with the inodes). Bad arguments exit 2 with one line.

use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

fn write_ok(img: &Scratch, args: &[&str]) -> String {
    let out = UEXT4.ok(args);
    e2fsck_clean_when(&img.0, &format!("after uext4 {args:?}"));
    out
}

/// debugfs's `lq TYPE` lines: id, space, block soft, block hard, inodes, soft, hard.
fn lq(img: &std::path::Path, t: &str) -> Vec<Vec<u64>> {
    let out = Command::new("debugfs")
        .args(["-R", &format!("lq {t}")])
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .filter(|v: &Vec<u64>| v.len() == 7)
        .collect()
}

/// The report's rows as the same numbers: id, space (bytes, from KiB), limits, inodes.
fn report_rows(out: &str, t: &str) -> Vec<Vec<u64>> {
    let mut rows = Vec::new();
    let mut in_type = false;
    for l in out.lines() {
        if l.starts_with("*** Report for ") {
            in_type = l.contains(&format!(" {t} quotas"));
        } else if in_type && l.starts_with('#') {
            let w: Vec<&str> = l.split_whitespace().collect();
            let id = w[0][1..].parse::<u64>().unwrap();
            // #ID, marks, used, soft, hard, [grace], used, soft, hard, [grace]
            let rest: Vec<u64> = (2..w.len()).filter_map(|i| w[i].parse().ok()).collect();
            rows.push(vec![
                id, rest[0], rest[1], rest[2], rest[3], rest[4], rest[5],
            ]);
        }
    }
    rows
}

#[test]
fn report_and_set_agree_with_debugfs() {
    if !needs::have(&["mke2fs", "debugfs", "e2fsck"]) {
        eprintln!("SKIP: needs e2fsprogs");
        return;
    }
    let img = scratch("cli-quota");
    mke2fs(
        &img.0,
        "32M",
        &[
            "-O",
            "quota,project",
            "-E",
            "quotatype=usrquota:grpquota:prjquota",
        ],
    );
    write_ok(&img, &["mkdir", &img.at("/d")]);
    write_ok(&img, &["truncate", "-s", "0", &img.at("/d/f")]);
    let src = Scratch::file("cli-quota-src", 0);
    std::fs::write(&src.0, vec![3u8; 50_000]).unwrap();
    write_ok(&img, &["cp", src.s(), &img.at("/d/g")]);
    write_ok(&img, &["chown", "1000:2000", &img.at("/d/g")]);
    write_ok(&img, &["chattr", "-p", "9", "+P", &img.at("/d")]);
    write_ok(
        &img,
        &[
            "quota",
            "set",
            "-u",
            "1000",
            "1M",
            "2048",
            "3",
            "4",
            img.s(),
        ],
    );
    write_ok(
        &img,
        &["quota", "set", "-P", "9", "0", "100", "0", "0", img.s()],
    );
    write_ok(&img, &["quota", "grace", "-g", "3600", "86400", img.s()]);
    let out = UEXT4.ok(&["quota", img.s()]);
    assert!(
        out.contains("Block grace time: 01:00; Inode grace time: 1days"),
        "{out}"
    );
    for t in ["user", "group", "project"] {
        let kib = |v: &Vec<u64>| {
            let mut v = v.clone();
            v[1] = v[1].div_ceil(1024);
            v
        };
        let want: Vec<Vec<u64>> = lq(&img.0, t).iter().map(kib).collect();
        assert_eq!(report_rows(&out, t), want, "{t} quotas:\n{out}");
    }
    let users = lq(&img.0, "user");
    let u1000 = users
        .iter()
        .find(|v| v[0] == 1000)
        .expect("user 1000 listed");
    assert_eq!(u1000[2..], [1024, 2048, 1, 3, 4]);
    assert!(u1000[1] >= 50_000);
    let prj = lq(&img.0, "project");
    assert!(
        prj.iter().any(|v| v[0] == 9 && v[3] == 100 && v[4] == 1),
        "{prj:?}"
    );
    // One type only; a bad call exits 2.
    let only = UEXT4.ok(&["quota", "-g", img.s()]);
    assert!(only.contains("group quotas") && !only.contains("user quotas"));
    UEXT4.fails_with(&["quota", "set", "1000", "1", "1", "1", "1", img.s()], 2);
    let plain = scratch("cli-quota-none");
    mke2fs(&plain.0, "16M", &[]);
    let e = UEXT4.fails(&["quota", plain.s()]);
    assert!(e.contains("keeps no quotas"), "{e}");
}

/// statvfs(2) of a path: (blocks, free blocks, files).
fn statvfs(p: &std::path::Path) -> (u64, u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    (s.f_blocks as u64, s.f_bfree as u64, s.f_files as u64)
}

#[test]
fn df_on_a_project_directory_of_a_mount_shows_its_quota() {
    if !needs::have(&["mke2fs", "e2fsck"]) || !needs::fuse_usable("df of a project directory") {
        return;
    }
    let place = MountPlace::new("cli-quota-df", &["m"]);
    mke2fs(
        &place.img,
        "32M",
        &["-O", "quota,project", "-E", "quotatype=prjquota"],
    );
    let img = place.img.to_str().unwrap();
    UEXT4.ok(&["mkdir", &format!("{img}:/p")]);
    UEXT4.ok(&["chattr", "-p", "4", "+P", &format!("{img}:/p")]);
    UEXT4.ok(&["quota", "set", "-P", "4", "0", "2M", "0", "50", img]);
    let m = place.point(0);
    uext4_mount(UEXT4.0, &place.img, &m, &["-o", "prjquota"]);
    let (blocks, free, files) = statvfs(&m.join("p"));
    let whole = statvfs(&m);
    umount_and_wait(&m, &place.img);
    e2fsck_clean(&place.img);
    // 2 MiB of 4 KiB blocks, less the directory's block; 50 inodes.
    assert_eq!((blocks, free, files), (512, 511, 50));
    assert!(
        whole.0 > 512,
        "the root shows the whole filesystem: {whole:?}"
    );
}

#[test]
fn a_user_over_its_limit_gets_edquot_through_a_mount() {
    if !needs::have(&["mke2fs", "e2fsck", "setpriv"]) || !needs::fuse_usable("EDQUOT on a mount") {
        return;
    }
    let place = MountPlace::new("cli-quota-edquot", &["m"]);
    mke2fs(&place.img, "32M", &["-O", "quota"]);
    let img = place.img.to_str().unwrap();
    UEXT4.ok(&["mkdir", &format!("{img}:/home")]);
    UEXT4.ok(&["chown", "1000:1000", &format!("{img}:/home")]);
    UEXT4.ok(&["quota", "set", "-u", "1000", "0", "64", "0", "0", img]);
    let m = place.point(0);
    uext4_mount(UEXT4.0, &place.img, &m, &["-o", "allow_other,usrquota"]);
    let as_user = |cmd: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap()
    };
    let f = m.join("home/f");
    let small = as_user(&format!("head -c 16384 /dev/zero > {}", f.display()));
    let big = as_user(&format!("head -c 200000 /dev/zero >> {}", f.display()));
    // Root is not limited.
    std::fs::write(m.join("home/r"), vec![0u8; 200_000]).unwrap();
    umount_and_wait(&m, &place.img);
    e2fsck_clean(&place.img);
    assert!(small.status.success(), "{small:?}");
    let err = String::from_utf8_lossy(&big.stderr);
    assert!(!big.status.success() && err.contains("quota"), "{err}");
    // User 1000 stopped at its 64 KiB (its directory and what of the file fitted).
    let users = lq(&place.img, "user");
    let u = users.iter().find(|v| v[0] == 1000).unwrap();
    assert!(u[1] <= 64 << 10 && u[1] >= 16384 && u[4] == 2, "{u:?}");
}
