//! Access times as the kernel keeps them (fs/inode.c atime_needs_update): relatime,
//! strictatime, noatime, nodiratime, the NOATIME inode flag, read-only opens; the new atime is
//! written at the next commit (no handle per read) and reads back after a reopen; the image
//! is `e2fsck -fn` clean.

use std::path::Path;
use std::sync::Arc;
use uext4::flags::FL_NOATIME;
use uext4::{AtimeMode, AtimePolicy, Cred, Fs, MountOptions, SetAttr, TimeSet, Timestamp};
use uext4_testkit::*;

const FILE: u32 = 0o100644;
const DIR: u32 = 0o40755;

fn open(p: &Path, mode: AtimeMode, nodiratime: bool) -> Arc<Fs> {
    Fs::open_path(
        p,
        MountOptions {
            commit_interval_secs: 0,
            atime: AtimePolicy { mode, nodiratime },
            ..Default::default()
        },
    )
    .unwrap()
}

fn at(sec: i64) -> Timestamp {
    Timestamp { sec, nsec: 0 }
}

/// Sets all three times of `ino` back to `sec` (ctime: by the setattr itself, then checked
/// only as "not newer than atime" where it matters).
fn set_times(fs: &Fs, ino: u32, atime: i64, mtime: i64) {
    fs.setattr(
        ino,
        &SetAttr {
            atime: Some(TimeSet::At(at(atime))),
            mtime: Some(TimeSet::At(at(mtime))),
            ..Default::default()
        },
    )
    .unwrap();
}

fn atime(fs: &Fs, ino: u32) -> i64 {
    fs.getattr(ino).unwrap().atime.sec
}

fn read(fs: &Fs, ino: u32) {
    let mut b = [0u8; 16];
    fs.read(ino, 0, &mut b).unwrap();
}

fn list(fs: &Fs, ino: u32) {
    fs.readdir(ino, 0, &mut |_| true).unwrap();
}

/// A file "f" with data and a directory "d" under the root: (file, dir).
fn populate(fs: &Fs) -> (u32, u32) {
    let f = fs.create(uext4::ROOT_INO, b"f", FILE, 0, 0).unwrap().ino;
    fs.write(f, 0, b"hello").unwrap();
    let d = fs.mkdir(uext4::ROOT_INO, b"d", DIR, 0, 0).unwrap().ino;
    (f, d)
}

#[test]
fn relatime_updates_once_after_a_change_and_persists() {
    let img = scratch("atime-rel");
    mke2fs(&img.0, "16M", &[]);
    let fs = open(&img.0, AtimeMode::Relative, false);
    let (f, d) = populate(&fs);
    let now = Timestamp::now().sec;
    // Accessed an hour ago, changed since (ctime is now): a read updates it.
    set_times(&fs, f, now - 3600, now - 7200);
    read(&fs, f);
    let first = atime(&fs, f);
    assert!(first >= now, "atime {first} not updated (now {now})");
    // Read again: atime is newer than mtime and ctime and less than a day old: kept.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    read(&fs, f);
    assert_eq!(atime(&fs, f), first);
    // A listing is an access of the directory.
    let before = atime(&fs, d);
    set_times(&fs, d, now - 3600, now - 7200);
    list(&fs, d);
    assert!(atime(&fs, d) >= now && atime(&fs, d) >= before);
    // The new times reach the disk with the next commit.
    fs.unmount().unwrap();
    drop(fs);
    let fs = open(&img.0, AtimeMode::NoAtime, false);
    assert_eq!(atime(&fs, f), first);
    assert!(atime(&fs, d) >= now);
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

#[test]
fn strictatime_noatime_nodiratime_and_the_inode_flag() {
    let img = scratch("atime-modes");
    mke2fs(&img.0, "16M", &[]);
    let fs = open(&img.0, AtimeMode::Strict, true);
    let (f, d) = populate(&fs);
    let now = Timestamp::now().sec;
    // strictatime: every read, even with atime after mtime and ctime.
    set_times(&fs, f, now + 100, now - 7200);
    read(&fs, f);
    assert!(atime(&fs, f) <= now + 1, "strictatime kept a future atime");
    // nodiratime: listings leave directories alone.
    set_times(&fs, d, now - 3600, now - 7200);
    list(&fs, d);
    assert_eq!(atime(&fs, d), now - 3600);
    // chattr +A: never.
    let fl = fs.get_flags(f).unwrap();
    fs.set_flags_as(&Cred::root(), f, fl | FL_NOATIME).unwrap();
    set_times(&fs, f, now - 3600, now - 7200);
    read(&fs, f);
    assert_eq!(atime(&fs, f), now - 3600);
    fs.unmount().unwrap();
    drop(fs);
    let fs = open(&img.0, AtimeMode::NoAtime, false);
    let g = fs.lookup(uext4::ROOT_INO, b"d").unwrap().ino;
    set_times(&fs, g, now - 3600, now - 7200);
    let f2 = fs.create(uext4::ROOT_INO, b"g", FILE, 0, 0).unwrap().ino;
    fs.write(f2, 0, b"x").unwrap();
    set_times(&fs, f2, now - 3600, now - 7200);
    read(&fs, f2);
    list(&fs, g);
    assert_eq!(atime(&fs, f2), now - 3600);
    assert_eq!(atime(&fs, g), now - 3600);
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

#[test]
fn read_only_never_writes_atime() {
    let img = scratch("atime-ro");
    mke2fs(&img.0, "16M", &[]);
    let fs = open(&img.0, AtimeMode::Relative, false);
    let (f, _) = populate(&fs);
    let now = Timestamp::now().sec;
    set_times(&fs, f, now - 3600, now - 7200);
    fs.unmount().unwrap();
    drop(fs);
    let bytes = std::fs::read(&img.0).unwrap();
    let fs = Fs::open_path(
        &img.0,
        MountOptions {
            atime: AtimePolicy {
                mode: AtimeMode::Strict,
                nodiratime: false,
            },
            ..MountOptions::ro()
        },
    )
    .unwrap();
    read(&fs, f);
    list(&fs, uext4::ROOT_INO);
    assert_eq!(atime(&fs, f), now - 3600);
    fs.unmount().unwrap();
    drop(fs);
    assert!(
        std::fs::read(&img.0).unwrap() == bytes,
        "a read-only open changed the image"
    );
    e2fsck_clean(&img.0);
}
