//! Quotas (the `quota` and `project` features), against e2fsprogs: images made by `mke2fs -O
//! quota,project` and filled by e2fsprogs read as `debugfs -R 'lq TYPE'` lists them, and every
//! change the engine makes leaves usage that `e2fsck -fn` (which recomputes usage from the
//! inodes and compares it with the quota files: "[QUOTA WARNING] Usage inconsistent") finds
//! right, for users, groups and projects. Limits set here are what debugfs lists.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use uext4::flags::XFLAG_PROJINHERIT;
use uext4::format::quota::{Dquot, QuotaType};
use uext4::{Cred, Fs, SetAttr, ROOT_INO};

/// (space bytes, inodes, block soft, block hard (KiB), inode soft, inode hard) per id.
type Listing = BTreeMap<u32, [u64; 6]>;

/// `debugfs -R 'lq TYPE'` parsed: its columns are id, space, block quota, block limit,
/// inodes, inode quota, inode limit (space in bytes, block limits in KiB).
fn debugfs_lq(img: &Path, t: QuotaType) -> Listing {
    let out = Command::new("debugfs")
        .args(["-R", &format!("lq {}", t.name())])
        .arg(img)
        .output()
        .expect("debugfs must be installed (e2fsprogs)");
    let mut m = Listing::new();
    for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
        let v: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if v.len() == 7 {
            m.insert(v[0] as u32, [v[1], v[4], v[2], v[3], v[5], v[6]]);
        }
    }
    m
}

/// The engine's entries in the same shape.
fn engine_lq(fs: &Fs, t: QuotaType) -> Listing {
    let r = fs.quota_report(t).unwrap().expect("the type is kept");
    r.entries
        .iter()
        .map(|q| {
            (
                q.id,
                [
                    q.curspace,
                    q.curinodes,
                    q.bsoftlimit / 1024,
                    q.bhardlimit / 1024,
                    q.isoftlimit,
                    q.ihardlimit,
                ],
            )
        })
        .collect()
}

fn quota_image(tag: &str, extra: &[&str]) -> Scratch {
    let img = scratch(tag);
    let mut args = vec![
        "-O",
        "quota,project",
        "-E",
        "quotatype=usrquota:grpquota:prjquota",
        "-I",
        "256",
    ];
    args.extend_from_slice(extra);
    mke2fs(&img.0, "64M", &args);
    img
}

fn have_tools() -> bool {
    needs::have(&["mke2fs", "e2fsck", "debugfs"])
}

fn open_rw(img: &Path) -> Arc<Fs> {
    Fs::open_path(img, opts::no_timer()).unwrap()
}

/// Read-write, with the limits of the types in `limits` enforced (usrquota, grpquota,
/// prjquota).
fn open_limited(img: &Path, limits: [bool; 3], buffered: bool) -> Arc<Fs> {
    let o = uext4::MountOptions {
        quota_limits: limits,
        ..opts::no_timer_buffered(buffered)
    };
    Fs::open_path(img, o).unwrap()
}

fn set_project(fs: &Fs, ino: u32, projid: u32, inherit: bool) {
    let mut x = fs.get_fsxattr(ino).unwrap();
    x.projid = projid;
    if inherit {
        x.xflags |= XFLAG_PROJINHERIT;
    }
    fs.set_fsxattr_as(&Cred::root(), ino, &x).unwrap();
}

/// Every type's listing, the engine's and debugfs's, must agree.
fn assert_listings_agree(fs: &Fs, img: &Path, when: &str) {
    for t in QuotaType::ALL {
        assert_eq!(
            engine_lq(fs, t),
            debugfs_lq(img, t),
            "{} quota {when}",
            t.name()
        );
    }
}

#[test]
fn images_filled_by_e2fsprogs_read_as_debugfs_lists_them() {
    if !have_tools() || !needs::is_root() {
        eprintln!("skipped: needs e2fsprogs and root (mke2fs -d keeps owners)");
        return;
    }
    let src = Scratch::dir("quota-src");
    for (name, uid, gid, len) in [
        ("a", 1000, 100, 5000),
        ("b", 1001, 100, 70000),
        ("c", 0, 0, 1),
    ] {
        let p = src.p(name);
        std::fs::write(&p, vec![7u8; len]).unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
    }
    std::fs::create_dir(src.p("d")).unwrap();
    std::os::unix::fs::chown(src.p("d"), Some(1002), Some(200)).unwrap();
    let img = quota_image("quota-read", &["-d", src.s()]);
    // mke2fs -d (1.47) leaves the quota files as mkfs made them, and debugfs writes no
    // usage: e2fsck -fy computes it, as it does for any image whose usage is off.
    let sh = |args: &[&str]| Command::new(args[0]).args(&args[1..]).output().unwrap();
    sh(&[
        "debugfs",
        "-w",
        "-R",
        "set_inode_field /b projid 5",
        img.s(),
    ]);
    sh(&[
        "debugfs",
        "-w",
        "-R",
        "set_inode_field /d projid 6",
        img.s(),
    ]);
    sh(&["e2fsck", "-fy", img.s()]);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, opts::read_only()).unwrap();
    assert_listings_agree(&fs, &img.0, "of an image mke2fs -d filled");
    let users = engine_lq(&fs, QuotaType::User);
    assert_eq!(users[&1000][1], 1, "user 1000 owns one inode");
    assert!(users.contains_key(&1002));
    let prj = engine_lq(&fs, QuotaType::Project);
    assert_eq!((prj[&5][1], prj[&6][1]), (1, 1), "{prj:?}");
}

#[test]
fn changes_keep_usage_right_for_users_groups_and_projects() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    for (bs, buffered) in [("4096", false), ("1024", false), ("4096", true)] {
        changes_keep_usage_right(bs, buffered);
    }
}

/// The changes test on one block size, with writes direct or buffered (delayed allocation).
fn changes_keep_usage_right(bs: &str, buffered: bool) {
    let img = quota_image("quota-rw", &["-b", bs]);
    let fs = Fs::open_path(&img.0, opts::no_timer_buffered(buffered)).unwrap();
    assert!(!fs.is_read_only(), "{:?}", fs.read_only_reason());
    let d = fs.mkdir(ROOT_INO, b"proj", 0o755, 1000, 1000).unwrap().ino;
    set_project(&fs, d, 42, true);
    let mut files = Vec::new();
    for i in 0..20u32 {
        let (uid, gid) = (1000 + i % 3, 2000 + i % 2);
        let dir = if i % 2 == 0 { d } else { ROOT_INO };
        let f = fs
            .create(dir, format!("f{i}").as_bytes(), 0o644, uid, gid)
            .unwrap()
            .ino;
        fs.write_all(f, 0, &vec![i as u8; 1000 + 5000 * i as usize])
            .unwrap();
        files.push((dir, f));
    }
    // Ownership, group and project changes move usage between ids.
    fs.setattr(
        files[1].1,
        &SetAttr {
            uid: Some(7),
            gid: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    set_project(&fs, files[3].1, 43, false);
    // Removal, truncation, symlinks, xattr blocks.
    fs.unlink(files[0].0, b"f0").unwrap();
    fs.truncate(files[5].1, 10).unwrap();
    fs.symlink(d, b"long", &[b'x'; 300], 1000, 1000).unwrap();
    fs.setxattr(files[7].1, b"user.big", &[1u8; 700], uext4::XattrFlags::Any)
        .unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let when = format!("after the engine's changes ({bs}-byte blocks, buffered {buffered})");
    e2fsck_clean_when(&img.0, &when);
    let fs = Fs::open_path(&img.0, opts::read_only()).unwrap();
    assert_listings_agree(&fs, &img.0, &when);
    let prj = engine_lq(&fs, QuotaType::Project);
    assert!(prj[&42][1] >= 10, "project 42: {:?}", prj.get(&42));
    assert_eq!(prj[&43][1], 1);
    assert_eq!(engine_lq(&fs, QuotaType::User)[&7][1], 1);
}

#[test]
fn many_ids_grow_the_quota_files() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    let img = quota_image("quota-grow", &[]);
    let fs = open_rw(&img.0);
    // Ids spread over the tree's levels: new tree blocks, data blocks filled past one.
    for i in 0..200u32 {
        let id = i.wrapping_mul(0x0101_0101).wrapping_add(i * 7919);
        let f = fs
            .create(ROOT_INO, format!("u{i}").as_bytes(), 0o644, id, id ^ 5)
            .unwrap()
            .ino;
        fs.write_all(f, 0, &[1u8; 100]).unwrap();
        if i % 3 == 0 {
            set_project(&fs, f, id ^ 9, false);
        }
    }
    for i in (0..200u32).step_by(4) {
        fs.unlink(ROOT_INO, format!("u{i}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after 200 ids");
    let fs = Fs::open_path(&img.0, opts::read_only()).unwrap();
    assert_listings_agree(&fs, &img.0, "after 200 ids");
    assert!(engine_lq(&fs, QuotaType::User).len() >= 200);
}

#[test]
fn limits_set_here_are_what_debugfs_lists() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    let img = quota_image("quota-limits", &[]);
    let fs = open_rw(&img.0);
    let lim = Dquot {
        bsoftlimit: 1 << 20,
        bhardlimit: 2 << 20,
        isoftlimit: 10,
        ihardlimit: 20,
        ..Default::default()
    };
    fs.set_dquot_limits(QuotaType::User, 1234, &lim).unwrap();
    fs.set_dquot_limits(QuotaType::Group, 0, &lim).unwrap();
    fs.set_dquot_limits(QuotaType::Project, 77, &lim).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after setting limits");
    let lq = debugfs_lq(&img.0, QuotaType::User);
    assert_eq!(lq[&1234], [0, 0, 1024, 2048, 10, 20]);
    let fs = Fs::open_path(&img.0, opts::read_only()).unwrap();
    assert_listings_agree(&fs, &img.0, "after setting limits");
}

/// The errno of each of: link into the project directory, rename into it, rename within
/// it, exchange across it, link out of it, on an image with `/p` (project 5, PROJINHERIT),
/// `/p/in` (project 5) and `/out` (project 0).
const MOVES: [&str; 5] = [
    "link in",
    "rename in",
    "rename within",
    "exchange",
    "link out",
];

fn engine_moves(fs: &Fs) -> Vec<i32> {
    let lk = |n: &str| fs.lookup(ROOT_INO, n.as_bytes()).unwrap().ino;
    let (p, out) = (lk("p"), lk("out"));
    let inside = fs.lookup(p, b"in").unwrap().ino;
    let e = |r: uext4::Result<()>| r.err().map_or(0, |e| e.errno());
    vec![
        e(fs.link(out, p, b"l").map(|_| ())),
        e(fs.rename(ROOT_INO, b"out", p, b"moved", Default::default())),
        e(fs.rename(p, b"in", p, b"in2", Default::default())),
        e(fs.rename(
            ROOT_INO,
            b"out",
            p,
            b"in2",
            uext4::RenameFlags {
                exchange: true,
                ..Default::default()
            },
        )),
        e(fs.link(inside, ROOT_INO, b"l2").map(|_| ())),
    ]
}

fn kernel_moves(m: &Path) -> Vec<i32> {
    let e = |r: std::io::Result<()>| r.err().map_or(0, |e| e.raw_os_error().unwrap());
    let exchange = || -> std::io::Result<()> {
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let (a, b) = (c(&m.join("out")), c(&m.join("p/in2")));
        // SAFETY: two NUL-terminated paths; renameat2 reads them only.
        let rc =
            unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), 2) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    vec![
        e(std::fs::hard_link(m.join("out"), m.join("p/l"))),
        e(std::fs::rename(m.join("out"), m.join("p/moved"))),
        e(std::fs::rename(m.join("p/in"), m.join("p/in2"))),
        e(exchange()),
        e(std::fs::hard_link(m.join("p/in2"), m.join("l2"))),
    ]
}

#[test]
fn links_and_renames_across_projects_fail_as_the_kernels() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    // The project feature without quota files: the host kernel (no quota v2) mounts it
    // read-write too.
    let img = scratch("quota-exdev");
    mke2fs(&img.0, "32M", &["-O", "project", "-I", "256"]);
    {
        let fs = open_rw(&img.0);
        let p = fs.mkdir(ROOT_INO, b"p", 0o755, 0, 0).unwrap().ino;
        set_project(&fs, p, 5, true);
        fs.create(p, b"in", 0o644, 0, 0).unwrap();
        fs.create(ROOT_INO, b"out", 0o644, 0, 0).unwrap();
        fs.unmount().unwrap();
    }
    let copy = scratch("quota-exdev-kernel");
    std::fs::copy(&img.0, &copy.0).unwrap();
    let fs = open_rw(&img.0);
    assert_eq!(
        fs.get_fsxattr(
            fs.lookup(fs.lookup(ROOT_INO, b"p").unwrap().ino, b"in")
                .unwrap()
                .ino
        )
        .unwrap()
        .projid,
        5
    );
    let ours = engine_moves(&fs);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after the moves");
    let x = libc::EXDEV;
    assert_eq!(ours, vec![x, x, 0, x, 0], "{MOVES:?}");
    if !needs::can_loop_mount() || !kernel_mounts_project_rw(&copy.0) {
        return;
    }
    let m = KernelMount::new(&copy.0);
    let theirs = kernel_moves(&m.dir);
    drop(m);
    assert_eq!(ours, theirs, "engine vs kernel, for {MOVES:?}");
    e2fsck_clean_when(&copy.0, "after the kernel's moves");
}

/// Whether the host kernel mounts an image with the project feature read-write (it needs
/// CONFIG_QUOTA and CONFIG_QFMT_V2; without them it refuses, and the comparison is skipped).
fn kernel_mounts_project_rw(img: &Path) -> bool {
    let dir = Scratch::dir("quota-try-mount");
    let ok = Command::new("mount")
        .args(["-t", "ext4", "-o", "loop"])
        .arg(img)
        .arg(&dir.0)
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        let _ = Command::new("umount").arg(&dir.0).status();
    } else {
        eprintln!("SKIP: the host kernel does not mount project images read-write (no QFMT_V2)");
    }
    ok
}

#[test]
fn limits_give_edquot_to_unprivileged_callers() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    for buffered in [false, true] {
        let img = quota_image("quota-edquot", &[]);
        let fs = open_limited(&img.0, [true; 3], buffered);
        let user = Cred::user(1000, 1000);
        let um = uext4::Umask::Acl(0o022);
        let lim = Dquot {
            bhardlimit: 100 << 10,
            ihardlimit: 3,
            ..Default::default()
        };
        fs.set_dquot_limits(QuotaType::User, 1000, &lim).unwrap();
        let d = fs.mkdir(ROOT_INO, b"home", 0o777, 1000, 1000).unwrap().ino;
        // The directory is one inode: two more, then EDQUOT.
        let f = fs.create_as(&user, d, b"a", 0o644, um).unwrap().ino;
        fs.create_as(&user, d, b"b", 0o644, um).unwrap();
        let e = fs.create_as(&user, d, b"c", 0o644, um).unwrap_err();
        assert_eq!(e.errno(), libc::EDQUOT, "{e}");
        // Root makes what it likes (CAP_SYS_RESOURCE).
        let rootf = fs.create(d, b"r", 0o644, 1000, 1000).unwrap().ino;
        // Space: one block fits, 200 KiB more does not under 100 KiB.
        fs.write_all_as(&user, f, 0, &[2u8; 4096]).unwrap();
        let e = fs
            .write_all_as(&user, f, 4096, &vec![5u8; 200 << 10])
            .unwrap_err();
        assert_eq!(e.errno(), libc::EDQUOT, "{e} (buffered {buffered})");
        fs.write_all(rootf, 0, &vec![5u8; 200 << 10]).unwrap();
        fs.commit().unwrap();
        fs.delalloc_writeback_all().unwrap();
        let q = fs.dquot(QuotaType::User, 1000).unwrap().unwrap();
        assert!(q.curspace >= 200 << 10, "root's write counts: {q:?}");
        // Over the limit: a hole cannot be filled, written blocks can be overwritten.
        let e = fs
            .write_all_as(&user, f, 300 << 10, &[1u8; 4096])
            .unwrap_err();
        assert_eq!(e.errno(), libc::EDQUOT);
        fs.write_all_as(&user, f, 0, &[1u8; 4096]).unwrap();
        // A soft limit's grace period starts when usage is over it; while it runs, writes
        // go on.
        fs.set_dquot_limits(
            QuotaType::Group,
            1000,
            &Dquot {
                bsoftlimit: 8 << 10,
                ..Default::default()
            },
        )
        .unwrap();
        let g = fs.dquot(QuotaType::Group, 1000).unwrap().unwrap();
        assert!(
            g.btime > 0,
            "group 1000 is over its soft limit: the grace period runs"
        );
        fs.set_dquot_limits(QuotaType::User, 1000, &Dquot::default())
            .unwrap();
        fs.write_all_as(&user, f, 300 << 10, &[1u8; 4096]).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean_when(&img.0, &format!("after EDQUOT (buffered {buffered})"));
        let fs = Fs::open_path(&img.0, opts::read_only()).unwrap();
        assert_listings_agree(&fs, &img.0, "after EDQUOT");
    }
}

#[test]
fn an_expired_soft_limit_refuses() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    let img = quota_image("quota-grace", &[]);
    let fs = open_limited(&img.0, [true; 3], false);
    let user = Cred::user(1000, 1000);
    fs.set_quota_grace(QuotaType::User, 0, 0).unwrap();
    fs.set_dquot_limits(
        QuotaType::User,
        1000,
        &Dquot {
            bsoftlimit: 16 << 10,
            isoftlimit: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o666, 1000, 1000).unwrap().ino;
    // Over the soft limit: the grace period (0 s) starts, and ends at once.
    fs.write_all(f, 0, &[1u8; 32 << 10]).unwrap();
    let e = fs
        .write_all_as(&user, f, 32 << 10, &[1u8; 4096])
        .unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT);
    // One inode over the soft limit starts the (0 s) grace period; the next is refused.
    let um = uext4::Umask::Acl(0);
    fs.create_as(&user, ROOT_INO, b"g", 0o644, um).unwrap();
    let e = fs.create_as(&user, ROOT_INO, b"h", 0o644, um).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after the grace tests");
    let lq = debugfs_lq(&img.0, QuotaType::User);
    assert_eq!(lq[&1000][2], 16);
}

#[test]
fn statfs_of_a_project_directory_reports_its_quota() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    let img = quota_image("quota-statfs", &[]);
    let fs = open_limited(&img.0, [false, false, true], false);
    let p = fs.mkdir(ROOT_INO, b"p", 0o755, 0, 0).unwrap().ino;
    set_project(&fs, p, 3, true);
    let f = fs.create(p, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_all(f, 0, &[1u8; 40 << 10]).unwrap();
    fs.set_dquot_limits(
        QuotaType::Project,
        3,
        &Dquot {
            bhardlimit: 1 << 20,
            bsoftlimit: 512 << 10,
            ihardlimit: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let whole = fs.statfs();
    let s = fs.statfs_of(p).unwrap();
    // The smaller non-zero limit, in blocks; what the project uses is taken.
    assert_eq!(s.blocks, 128, "{s:?}");
    let used = fs.dquot(QuotaType::Project, 3).unwrap().unwrap();
    assert_eq!(s.blocks_free, 128 - used.curspace / 4096);
    assert_eq!(s.blocks_free, s.blocks_avail);
    assert_eq!((s.files, s.files_free), (100, 100 - used.curinodes));
    // Elsewhere (and in a directory without PROJINHERIT): the filesystem's own.
    let o = fs.statfs_of(ROOT_INO).unwrap();
    assert_eq!((o.blocks, o.files), (whole.blocks, whole.files));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Usage is kept on every open, but limits hold only for the types the mount asks for
/// (usrquota, grpquota, prjquota), as the kernel's ext4_enable_quotas enables them: without
/// usrquota a user past its inode limit still creates, with it the next create is EDQUOT;
/// grpquota alone leaves the user's limit alone; without prjquota `df` on a project
/// directory shows the whole filesystem.
#[test]
fn limits_hold_only_with_the_mount_options() {
    if !have_tools() {
        eprintln!("skipped: needs e2fsprogs");
        return;
    }
    let img = quota_image("quota-mopt", &[]);
    let user = Cred::user(1000, 1000);
    let um = uext4::Umask::Acl(0o022);
    let fs = open_rw(&img.0);
    let lim = Dquot {
        ihardlimit: 2,
        ..Default::default()
    };
    fs.set_dquot_limits(QuotaType::User, 1000, &lim).unwrap();
    fs.set_dquot_limits(QuotaType::Project, 3, &lim).unwrap();
    let d = fs.mkdir(ROOT_INO, b"home", 0o777, 1000, 1000).unwrap().ino;
    set_project(&fs, d, 3, true);
    for n in [&b"a"[..], b"b", b"c"] {
        fs.create_as(&user, d, n, 0o644, um).unwrap();
    }
    assert_eq!(
        fs.dquot(QuotaType::User, 1000).unwrap().unwrap().curinodes,
        4
    );
    assert_eq!(fs.statfs_of(d).unwrap().files, fs.statfs().files);
    fs.unmount().unwrap();
    let fs = open_limited(&img.0, [false, true, false], false);
    fs.create_as(&user, d, b"d", 0o644, um).unwrap();
    fs.unmount().unwrap();
    let fs = open_limited(&img.0, [true, false, false], false);
    let e = fs.create_as(&user, d, b"e", 0o644, um).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    fs.unmount().unwrap();
    let fs = open_limited(&img.0, [false, false, true], false);
    assert_eq!(fs.statfs_of(d).unwrap().files, 2);
    assert_listings_agree(&fs, &img.0, "after the mount options");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
