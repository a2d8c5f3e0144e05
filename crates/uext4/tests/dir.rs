//! Directories and the htree index against the oracles: directories the kernel made read back
//! name by name; directories grown through uext4 (tens of thousands of names, then half removed)
//! pass `e2fsck -fn` (which checks the htree deeply) and list fully under the kernel; a 100,000
//! entry directory grows an index level; readdir cookies survive concurrent changes; damaged
//! directory blocks give errors, never panics.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use uext4::{Corruption, RenameFlags};
use uext4::{Error, Fs, MountOptions};

/// A varied name: lengths from 1 to ~60 bytes, some with high-bit bytes (signed vs unsigned
/// hashing differ on those).
fn name(i: usize) -> Vec<u8> {
    let mut n = format!("f{i}").into_bytes();
    match i % 7 {
        0 => n.extend_from_slice(b"-a-somewhat-longer-name-to-vary-the-record-lengths"),
        1 => n.extend_from_slice("-é-ü".as_bytes()),
        2 => n.extend_from_slice(b"_x"),
        3 => n.extend(std::iter::repeat_n(b'z', i % 40)),
        _ => {}
    }
    n
}

fn lookup_ino(fs: &Fs, dir: u32, n: &[u8]) -> Option<u32> {
    match fs.lookup(dir, n) {
        Ok(a) => Some(a.ino),
        Err(Error::NotFound) => None,
        Err(e) => panic!("lookup {:?}: {e}", String::from_utf8_lossy(n)),
    }
}

/// All entries of a directory through readdir, name -> (inode, type); checks no name repeats.
fn list(fs: &Fs, dir: u32) -> BTreeMap<Vec<u8>, (u32, u8)> {
    let mut out = BTreeMap::new();
    fs.readdir(dir, 0, &mut |e| {
        assert!(e.next_offset > 0 && e.next_offset <= i64::MAX as u64);
        assert!(
            out.insert(e.name.clone(), (e.ino, e.kind)).is_none(),
            "readdir returned {:?} twice",
            String::from_utf8_lossy(&e.name)
        );
        true
    })
    .unwrap();
    out
}

/// `debugfs -R "htree <path>"` output.
fn debugfs_htree(img: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", &format!("htree {path}")])
        .arg(img)
        .output()
        .expect("debugfs must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn indirect_levels(img: &Path, path: &str) -> Option<u32> {
    let t = debugfs_htree(img, path);
    let i = t.find("Indirect levels: ")?;
    t[i + 17..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn rw() -> MountOptions {
    MountOptions::default()
}

/// Creates `n` names in a new directory through uext4, checks them, removes every other one,
/// checks again, unmounts, runs e2fsck, reopens and checks, then lists under the kernel.
fn grow_and_shrink(tag: &str, size: &str, extra: &[&str], n: usize) {
    grow_and_shrink_then(tag, size, extra, n, None)
}

/// As grow_and_shrink, with a debugfs -w command run on the new image first.
fn grow_and_shrink_then(tag: &str, size: &str, extra: &[&str], n: usize, debugfs_w: Option<&str>) {
    let img = scratch(tag);
    mke2fs(&img.0, size, extra);
    for cmd in debugfs_w.iter().flat_map(|c| c.split(';')) {
        sh(&format!("debugfs -w -R '{cmd}' {} 2>&1", img.0.display()));
    }
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    let mut inos = Vec::with_capacity(n);
    for i in 0..n {
        inos.push(fs.create(d, &name(i), 0o644, 0, 0).unwrap().ino);
    }
    for i in (0..n).step_by(97) {
        assert_eq!(lookup_ino(&fs, d, &name(i)), Some(inos[i]), "{tag}: {i}");
    }
    assert!(matches!(
        fs.create(d, &name(5), 0o644, 0, 0),
        Err(Error::Exists)
    ));
    for i in (0..n).step_by(2) {
        fs.unlink(d, &name(i)).unwrap();
    }
    assert!(matches!(fs.unlink(d, &name(0)), Err(Error::NotFound)));
    let check = |fs: &Fs| {
        let got = list(fs, d);
        assert_eq!(got.len(), n / 2 + 2, "{tag}: readdir count");
        assert_eq!(got[&b"."[..]].0, d);
        assert_eq!(got[&b".."[..]].0, 2);
        for i in 0..n {
            let want = if i % 2 == 1 { Some(inos[i]) } else { None };
            assert_eq!(lookup_ino(fs, d, &name(i)), want, "{tag}: lookup {i}");
            if i % 2 == 1 {
                assert_eq!(got[&name(i)], (inos[i], 1), "{tag}: readdir {i}");
            }
        }
    };
    check(&fs);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    check(&fs);
    // Put some back (reusing freed space), and again clean.
    for i in (0..n).step_by(4) {
        inos[i] = fs.create(d, &name(i), 0o644, 0, 0).unwrap().ino;
    }
    assert_eq!(lookup_ino(&fs, d, &name(4)), Some(inos[4]));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let want = n / 2 + n.div_ceil(4);
    if can_loop_mount() {
        let m = KernelMount::new(&img.0);
        let names: BTreeSet<Vec<u8>> = std::fs::read_dir(m.dir.join("d"))
            .unwrap()
            .map(|e| {
                use std::os::unix::ffi::OsStrExt;
                e.unwrap().file_name().as_bytes().to_vec()
            })
            .collect();
        assert_eq!(names.len(), want, "{tag}: kernel ls count");
        for i in (1..n).step_by(2) {
            let md = std::fs::metadata(
                m.dir
                    .join("d")
                    .join(std::ffi::OsStr::new(std::str::from_utf8(&name(i)).unwrap())),
            )
            .unwrap();
            assert_eq!(md.ino(), inos[i] as u64, "{tag}: kernel lookup {i}");
        }
        // The kernel adds to our tree, and e2fsck still agrees.
        for i in 0..200 {
            std::fs::write(m.dir.join("d").join(format!("kernel-{i}")), b"").unwrap();
        }
        drop(m);
        e2fsck_clean(&img.0);
    }
}

#[test]
fn grow_shrink_4k_csum() {
    grow_and_shrink("dir4kc", "256M", &[], 20_000);
}

#[test]
fn grow_shrink_1k_csum() {
    grow_and_shrink("dir1kc", "128M", &["-b", "1024"], 20_000);
}

#[test]
fn grow_shrink_4k_nocsum() {
    grow_and_shrink("dir4k", "256M", &["-O", "^metadata_csum"], 20_000);
}

#[test]
fn grow_shrink_1k_nocsum() {
    grow_and_shrink(
        "dir1k",
        "128M",
        &["-b", "1024", "-O", "^metadata_csum,^metadata_csum_seed"],
        20_000,
    );
}

/// The other hash algorithms, and unsigned-char hashing (names with high-bit bytes hash
/// differently): e2fsck recomputes every hash.
#[test]
fn grow_shrink_hash_variants() {
    let tea = Some("ssv def_hash_version tea");
    grow_and_shrink_then("dirtea", "64M", &[], 6000, tea);
    let legacy = Some("ssv def_hash_version legacy");
    grow_and_shrink_then("dirlegacy", "64M", &[], 6000, legacy);
    let unsigned = Some("ssv flags 2");
    grow_and_shrink_then("dirunsigned", "64M", &[], 6000, unsigned);
    let both = Some("ssv flags 2;ssv def_hash_version tea");
    grow_and_shrink_then("dirunsigned-tea", "64M", &["-b", "1024"], 6000, both);
}

/// Without dir_index the directory stays linear (no conversion), still clean.
#[test]
fn grow_shrink_linear() {
    grow_and_shrink("dirlin", "64M", &["-O", "^dir_index"], 3000);
}

/// The kernel makes a 20,000 entry directory; every name looks up through uext4 to the inode
/// the kernel reports, and readdir lists exactly those.
#[test]
fn kernel_made_directory() {
    if !can_loop_mount() {
        return;
    }
    for (tag, extra) in [
        ("kdir4k", &[][..]),
        ("kdir1k", &["-b", "1024", "-O", "^metadata_csum"][..]),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "256M", extra);
        let mut want = BTreeMap::new();
        {
            let m = KernelMount::new(&img.0);
            let d = m.dir.join("d");
            std::fs::create_dir(&d).unwrap();
            std::fs::create_dir(d.join("sub")).unwrap();
            for i in 0..20_000 {
                let n = String::from_utf8(name(i)).unwrap();
                std::fs::write(d.join(&n), b"").unwrap();
            }
            for i in (0..20_000).step_by(3) {
                let n = String::from_utf8(name(i)).unwrap();
                std::fs::remove_file(d.join(&n)).unwrap();
            }
            for e in std::fs::read_dir(&d).unwrap() {
                use std::os::unix::ffi::OsStrExt;
                let e = e.unwrap();
                want.insert(
                    e.file_name().as_bytes().to_vec(),
                    e.metadata().unwrap().ino(),
                );
            }
        }
        let levels = indirect_levels(&img.0, "/d");
        assert!(levels.is_some(), "{tag}: the kernel made an htree");
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        let d = fs.lookup(2, b"d").unwrap().ino;
        for (n, &ino) in &want {
            assert_eq!(lookup_ino(&fs, d, n), Some(ino as u32), "{tag}");
        }
        for i in (0..20_000).step_by(3) {
            assert_eq!(lookup_ino(&fs, d, &name(i)), None);
        }
        let got = list(&fs, d);
        assert_eq!(got.len(), want.len() + 2);
        for (n, &ino) in &want {
            let t = if n == b"sub" { 2 } else { 1 };
            assert_eq!(got[n], (ino as u32, t));
        }
        drop(fs);
        // Then change it through uext4: remove and add, e2fsck clean, kernel sees it.
        let fs = Fs::open_path(&img.0, rw()).unwrap();
        let d = fs.lookup(2, b"d").unwrap().ino;
        for i in (1..20_000).step_by(3) {
            fs.unlink(d, &name(i)).unwrap();
        }
        for i in 0..3000 {
            fs.create(d, format!("new-{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let m = KernelMount::new(&img.0);
        let count = std::fs::read_dir(m.dir.join("d")).unwrap().count();
        assert_eq!(count, want.len() - 6667 + 3000);
        assert!(m.dir.join("d/new-2999").exists());
    }
}

/// A 100,000-entry directory grows its index to indirect_levels 1 and stays correct.
#[test]
fn hundred_thousand_entries() {
    let img = scratch("dir100k");
    mke2fs(&img.0, "512M", &["-N", "120000"]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let d = fs.mkdir(2, b"big", 0o755, 0, 0).unwrap().ino;
    let n = 100_000;
    let mut inos = Vec::with_capacity(n);
    for i in 0..n {
        inos.push(fs.create(d, &name(i), 0o644, 0, 0).unwrap().ino);
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let levels = indirect_levels(&img.0, "/big").expect("an htree");
    assert!(levels >= 1, "indirect levels {levels}");
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    for i in (0..n).step_by(7) {
        assert_eq!(lookup_ino(&fs, d, &name(i)), Some(inos[i]));
    }
    assert_eq!(list(&fs, d).len(), n + 2);
    for i in (0..n).step_by(3) {
        fs.unlink(d, &name(i)).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    if can_loop_mount() {
        let m = KernelMount::new(&img.0);
        let count = std::fs::read_dir(m.dir.join("big")).unwrap().count();
        assert_eq!(count, n - n.div_ceil(3));
    }
}

/// 1 KiB blocks reach two index levels quickly: keep going past the second level's first
/// splits, then check everything.
#[test]
fn two_levels_1k() {
    let img = scratch("dirlvl");
    mke2fs(&img.0, "256M", &["-b", "1024", "-N", "70000"]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    let n = 60_000;
    for i in 0..n {
        fs.create(d, &name(i), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(indirect_levels(&img.0, "/d"), Some(1));
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    assert_eq!(list(&fs, d).len(), n + 2);
    for i in (0..n).step_by(11) {
        assert!(lookup_ino(&fs, d, &name(i)).is_some());
    }
}

/// readdir in small batches while names are added and removed between batches: every name
/// present throughout is returned exactly once; nothing returned was never there.
#[test]
fn readdir_cookies_survive_changes() {
    for (tag, extra, n) in [
        ("dircookie-h", &[][..], 4000usize),
        ("dircookie-l", &["-O", "^dir_index"][..], 1500),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "128M", extra);
        let fs = Fs::open_path(&img.0, rw()).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        for i in 0..n {
            fs.create(d, &name(i), 0o644, 0, 0).unwrap();
        }
        let stable: BTreeSet<Vec<u8>> = (0..n).filter(|i| i % 3 != 0).map(name).collect();
        let mut ever: BTreeSet<Vec<u8>> = (0..n).map(name).collect();
        ever.insert(b".".to_vec());
        ever.insert(b"..".to_vec());
        let mut seen: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
        let mut off = 0u64;
        let mut batch = 0usize;
        loop {
            let mut got = 0;
            let mut last = off;
            fs.readdir(d, off, &mut |e| {
                if got == 37 {
                    return false;
                }
                got += 1;
                *seen.entry(e.name.clone()).or_default() += 1;
                last = e.next_offset;
                true
            })
            .unwrap();
            if got == 0 {
                break;
            }
            off = last;
            // Churn: remove some of the unstable names, add new ones (which may split leaves).
            for k in 0..20 {
                let i = (batch * 20 + k) * 3 % n;
                if i.is_multiple_of(3) {
                    let _ = fs.unlink(d, &name(i));
                }
                let nn = format!("churn-{batch}-{k}").into_bytes();
                fs.create(d, &nn, 0o644, 0, 0).unwrap();
                ever.insert(nn);
            }
            batch += 1;
            assert!(batch < 10_000, "{tag}: readdir does not end");
        }
        for s in &stable {
            assert_eq!(
                seen.get(s),
                Some(&1),
                "{tag}: {:?}",
                String::from_utf8_lossy(s)
            );
        }
        for (s, c) in &seen {
            assert!(ever.contains(s), "{tag}: readdir invented {s:?}");
            assert_eq!(
                *c,
                1,
                "{tag}: {:?} returned {c} times",
                String::from_utf8_lossy(s)
            );
        }
        // A refused entry comes back from the same offset.
        let mut first = None;
        fs.readdir(d, 0, &mut |e| {
            first = Some((e.name.clone(), e.next_offset));
            false
        })
        .unwrap();
        let mut again = None;
        fs.readdir(d, 0, &mut |e| {
            again = Some(e.name.clone());
            false
        })
        .unwrap();
        assert_eq!(first.unwrap().0, again.unwrap());
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
    }
}

/// Directories and subdirectories: rmdir needs emptiness, ".." follows renames, e2fsck clean.
#[test]
fn subdirectories_and_rename() {
    let img = scratch("dirsub");
    mke2fs(&img.0, "64M", &[]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(2, b"b", 0o755, 0, 0).unwrap().ino;
    let mut subs = Vec::new();
    for i in 0..300 {
        subs.push(
            fs.mkdir(a, format!("sub{i}").as_bytes(), 0o755, 0, 0)
                .unwrap()
                .ino,
        );
    }
    assert!(matches!(fs.rmdir(2, b"a"), Err(Error::NotEmpty)));
    for i in 0..150 {
        fs.rename(
            a,
            format!("sub{i}").as_bytes(),
            b,
            format!("moved{i}").as_bytes(),
            RenameFlags::default(),
        )
        .unwrap();
    }
    for (i, &sub) in subs.iter().enumerate().take(150) {
        let s = fs.lookup(b, format!("moved{i}").as_bytes()).unwrap().ino;
        assert_eq!(s, sub);
        assert_eq!(fs.lookup(s, b"..").unwrap().ino, b);
    }
    for i in 150..300 {
        fs.rmdir(a, format!("sub{i}").as_bytes()).unwrap();
    }
    fs.rmdir(2, b"a").unwrap();
    assert!(matches!(fs.lookup(2, b"a"), Err(Error::NotFound)));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Physical block of logical block `lblk` of `path` (debugfs bmap).
fn bmap(img: &Path, path: &str, lblk: u32) -> u64 {
    let out = sh(&format!(
        "debugfs -R 'bmap {path} {lblk}' {} 2>/dev/null",
        img.display()
    ));
    out.trim().parse().unwrap()
}

/// Exercises a damaged directory: lookups, a full readdir, an add and a remove. Returns the
/// first error (a panic or a hang is the failure this guards against).
fn exercise(img: &Path) -> Option<Error> {
    let fs = match Fs::open_path(img, rw()) {
        Ok(f) => f,
        Err(e) => return Some(e),
    };
    let mut first = None;
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            if first.is_none() {
                first = Some(e);
            }
        }
    };
    let d = match fs.lookup(2, b"d") {
        Ok(a) => a.ino,
        Err(e) => return Some(e),
    };
    for i in (0..6000).step_by(37) {
        note(fs.lookup(d, &name(i)).map(|_| ()).or_else(|e| match e {
            Error::NotFound => Ok(()),
            e => Err(e),
        }));
    }
    let mut count = 0usize;
    note(fs.readdir(d, 0, &mut |_| {
        count += 1;
        count < 100_000
    }));
    note(fs.create(d, b"added-after-damage", 0o644, 0, 0).map(|_| ()));
    note(fs.unlink(d, &name(1)));
    note(fs.rmdir(2, b"d"));
    let _ = fs.unmount();
    first
}

/// Damaged directory blocks give Directory corruption errors naming the directory, never a panic or
/// an endless loop; random damage neither.
#[test]
fn damaged_directories() {
    for (tag, extra, csum) in [
        ("dirbad-c", &["-b", "1024"][..], true),
        (
            "dirbad-n",
            &["-b", "1024", "-O", "^metadata_csum,^metadata_csum_seed"][..],
            false,
        ),
    ] {
        let img = scratch(tag);
        let mut args = extra.to_vec();
        args.extend_from_slice(&["-N", "8000"]);
        mke2fs(&img.0, "16M", &args);
        let fs = Fs::open_path(&img.0, rw()).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        for i in 0..6000 {
            fs.create(d, &name(i), 0o644, 0, 0).unwrap();
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        assert_eq!(indirect_levels(&img.0, "/d"), Some(1), "{tag}");
        let pristine = std::fs::read(&img.0).unwrap();
        let bs = 1024usize;
        let root = bmap(&img.0, "/d", 0) as usize * bs;
        // Which logical blocks are index nodes and which leaves: follow the root's first entry.
        let node_l = u32::from_le_bytes(pristine[root + 0x24..root + 0x28].try_into().unwrap());
        let node = bmap(&img.0, "/d", node_l) as usize * bs;
        let leaf_l = u32::from_le_bytes(pristine[node + 0xc..node + 0x10].try_into().unwrap());
        let leaf = bmap(&img.0, "/d", leaf_l) as usize * bs;
        let dname = format!("directory inode {d}");

        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = pristine.clone();
            f(&mut b);
            std::fs::write(&img.0, &b).unwrap();
            exercise(&img.0)
        };
        let is_named = |e: &Option<Error>, want_csum: bool| match e {
            Some(e) => {
                e.corruption() == Some(Corruption::Directory)
                    && e.is_bad_checksum() == want_csum
                    && e.to_string().contains(&dname)
            }
            None => false,
        };
        // A leaf entry's rec_len below the minimum (checksum refreshed by hand is not
        // possible here, so with csum the checksum fails first).
        let e = with(&|b| b[leaf + 4..leaf + 6].copy_from_slice(&8u16.to_le_bytes()));
        assert!(is_named(&e, csum), "{tag}: short rec_len gave {e:?}");
        // A name byte: only the checksum can tell.
        if csum {
            let e = with(&|b| b[leaf + 8] ^= 0x20);
            assert!(is_named(&e, true), "{tag}: name flip gave {e:?}");
        }
        // Root count over the limit; the root's first block pointer at the root itself; a depth
        // the index cannot have; an unknown hash version.
        for (what, off, val) in [
            ("count", 0x22usize, 0xffffu32),
            ("self pointer", 0x24, 0),
            ("depth", 0x1e, 3),
            ("hash version", 0x1c, 9),
        ] {
            let e = with(&|b| {
                if what == "count" {
                    b[root + off..root + off + 2].copy_from_slice(&(val as u16).to_le_bytes());
                } else if off == 0x24 {
                    b[root + off..root + off + 4].copy_from_slice(&val.to_le_bytes());
                } else {
                    b[root + off] = val as u8;
                }
            });
            assert!(
                is_named(&e, false) || (csum && is_named(&e, true)),
                "{tag}: root {what} gave {e:?}"
            );
        }
        // An index node pointing at itself.
        let e = with(&|b| b[node + 0xc..node + 0x10].copy_from_slice(&node_l.to_le_bytes()));
        assert!(
            is_named(&e, false) || (csum && is_named(&e, true)),
            "{tag}: node self pointer gave {e:?}"
        );
        // Random damage in the root, the node and the leaf: whatever comes back, no panic.
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for round in 0..150 {
            let base = [root, node, leaf][round % 3];
            let hits: Vec<(usize, u8)> = (0..1 + rnd() % 4)
                .map(|_| ((rnd() % bs as u64) as usize, rnd() as u8))
                .collect();
            let _ = with(&|b| {
                for &(o, v) in &hits {
                    b[base + o] = v;
                }
            });
        }
    }
}

/// Long names in 1 KiB blocks fill the index fast: without large_dir the directory stops at
/// indirect_levels 1 with "no space" (as the kernel's "Directory index full"), with large_dir it
/// grows a third level. Both stay clean, and the kernel lists the large_dir one.
#[test]
fn index_full_and_large_dir() {
    let long = |i: usize| format!("{i:08}-{}", "L".repeat(190)).into_bytes();
    for (tag, large) in [("dirfull", false), ("dirlarge", true)] {
        let img = scratch(tag);
        let mut args = vec!["-b", "1024"];
        if large {
            args.extend_from_slice(&["-O", "large_dir"]);
        }
        mke2fs(&img.0, "256M", &args);
        let fs = Fs::open_path(&img.0, rw()).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        // Names are hard links to one file (no inode per name; a failed link changes nothing
        // else).
        let f = fs.create(2, b"target", 0o644, 0, 0).unwrap().ino;
        let mut made = 0;
        for i in 0..60_000 {
            match fs.link(f, d, &long(i)) {
                Ok(_) => made += 1,
                Err(Error::NoSpace) if !large => break,
                Err(e) => panic!("{tag}: create {i}: {e}"),
            }
        }
        if !large {
            assert!(made > 20_000 && made < 60_000, "{tag}: {made} entries");
            // The failed create left nothing behind.
            assert!(lookup_ino(&fs, d, &long(made)).is_none());
        } else {
            assert_eq!(made, 60_000);
        }
        for i in (0..made).step_by(101) {
            assert!(lookup_ino(&fs, d, &long(i)).is_some(), "{tag}: {i}");
        }
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        assert_eq!(
            indirect_levels(&img.0, "/d"),
            Some(if large { 2 } else { 1 }),
            "{tag}"
        );
        if large && can_loop_mount() {
            let m = KernelMount::new(&img.0);
            assert_eq!(std::fs::read_dir(m.dir.join("d")).unwrap().count(), made);
        }
    }
}

/// Threads add and remove names in one shared directory (splitting leaves and index nodes)
/// while others look names up and list it; the end state is exact and e2fsck-clean.
#[test]
fn concurrent_changes_in_one_directory() {
    let img = scratch("dirconc");
    mke2fs(&img.0, "128M", &["-b", "1024", "-N", "40000"]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    let writers = 4;
    let per = 4000;
    std::thread::scope(|s| {
        for t in 0..writers {
            let fs = &fs;
            s.spawn(move || {
                for i in 0..per {
                    let n = format!("t{t}-{}", String::from_utf8(name(i)).unwrap());
                    fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
                    if i % 3 == 2 {
                        let old = format!("t{t}-{}", String::from_utf8(name(i - 2)).unwrap());
                        fs.unlink(d, old.as_bytes()).unwrap();
                    }
                }
            });
        }
        for _ in 0..2 {
            let fs = &fs;
            s.spawn(move || {
                for round in 0..20 {
                    let mut seen = BTreeSet::new();
                    fs.readdir(d, 0, &mut |e| {
                        assert!(seen.insert(e.name.clone()), "duplicate in readdir");
                        true
                    })
                    .unwrap();
                    assert!(seen.contains(&b".."[..]));
                    // A name that is never removed, once created, stays visible.
                    let _ = fs.lookup(d, format!("t{}-{}", round % 4, "f1-é-ü").as_bytes());
                }
            });
        }
    });
    let got = list(&fs, d);
    let mut want = BTreeSet::new();
    for t in 0..writers {
        for i in 0..per {
            let removed = i % 3 == 0 && i + 2 < per;
            if !removed {
                want.insert(format!("t{t}-{}", String::from_utf8(name(i)).unwrap()).into_bytes());
            }
        }
    }
    want.insert(b".".to_vec());
    want.insert(b"..".to_vec());
    assert_eq!(got.keys().cloned().collect::<BTreeSet<_>>(), want);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert_eq!(indirect_levels(&img.0, "/d"), Some(1));
}

/// Renaming a directory over one of its own ancestors: the target holds the source, so it is
/// not empty (ENOTEMPTY, as the kernel answers), and nothing changes.
#[test]
fn rename_over_an_ancestor_is_not_empty() {
    let img = scratch("dir-anc");
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
    let t = fs.mkdir(a, b"t", 0o755, 0, 0).unwrap().ino;
    let x = fs.mkdir(t, b"x", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(x, b"s", 0o755, 0, 0).unwrap();
    let r = fs.rename(x, b"s", a, b"t", Default::default());
    assert!(matches!(r, Err(Error::NotEmpty)), "{r:?}");
    let r = fs.rename(t, b"x", a, b"t", Default::default());
    assert!(matches!(r, Err(Error::NotEmpty)), "{r:?}");
    assert_eq!(fs.lookup(a, b"t").unwrap().ino, t);
    assert_eq!(fs.lookup(x, b"s").unwrap().mode & 0o170000, 0o040000);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// An inode a front end still holds (pinned: a FUSE kernel's cached inode, such as the working
/// directory of a process) stays alive when its last name goes, by rmdir, unlink or a rename
/// over it, as the kernel's ext4 keeps one until its last iput: its attributes read back with
/// link count 0 (fstests generic/011 through a mount: `chdir("..")` from a working directory
/// another process had removed asked for its attributes and got ENOENT), nothing can be made
/// in a removed directory, and forgetting it frees it. One still pinned at unmount is freed
/// by the unmount. The image is clean after both.
#[test]
fn pinned_unlinked_inodes_live_until_forgotten() {
    let img = scratch("pinned-unlinked");
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    let files_free = fs.statfs().files_free;
    let mk = |n: &str, dir: bool| {
        let a = if dir {
            fs.mkdir(2, n.as_bytes(), 0o755, 0, 0).unwrap()
        } else {
            let a = fs.create(2, n.as_bytes(), 0o644, 0, 0).unwrap();
            fs.write(a.ino, 0, &vec![1u8; 50_000]).unwrap();
            a
        };
        fs.pin_ino(a.ino, true);
        a.ino
    };
    let (d, f, a, b, x, _y, kept) = (
        mk("d", true),
        mk("f", false),
        mk("a", true),
        mk("b", true),
        mk("x", false),
        mk("y", false),
        mk("kept", true),
    );
    let plain = RenameFlags::default();
    fs.rmdir(2, b"d").unwrap();
    fs.unlink(2, b"f").unwrap();
    fs.rename(2, b"b", 2, b"a", plain).unwrap();
    fs.rename(2, b"y", 2, b"x", plain).unwrap();
    fs.rmdir(2, b"kept").unwrap();
    for (ino, what) in [
        (d, "rmdir"),
        (f, "unlink"),
        (a, "dir renamed over"),
        (x, "file renamed over"),
    ] {
        let at = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("{what}: getattr of a pinned inode: {e}"));
        assert_eq!(at.nlink, 0, "{what}: link count");
    }
    assert!(matches!(
        fs.create(d, b"n", 0o644, 0, 0),
        Err(Error::NotFound)
    ));
    let mut buf = vec![0u8; 100];
    assert_eq!(fs.read(f, 0, &mut buf).unwrap(), 100);
    assert_eq!(buf, vec![1u8; 100]);
    // Alive, so not yet free; the last release of an open does not free a pinned one.
    assert_eq!(fs.statfs().files_free, files_free - 7);
    fs.open(f).unwrap();
    fs.release(f).unwrap();
    fs.getattr(f).unwrap();
    for ino in [d, f, a, x] {
        fs.pin_ino(ino, false);
        fs.forgotten(ino).unwrap();
        assert!(
            matches!(fs.getattr(ino), Err(Error::NotFound)),
            "{ino} not freed"
        );
    }
    // Live inodes forgotten stay as they are.
    fs.pin_ino(b, false);
    fs.forgotten(b).unwrap();
    fs.getattr(b).unwrap();
    assert_eq!(fs.statfs().files_free, files_free - 3);
    let _ = kept;
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, rw()).unwrap();
    assert_eq!(
        fs.statfs().files_free,
        files_free - 2,
        "kept freed by the unmount"
    );
    fs.unmount().unwrap();
}

/// The kernel's forget of a pinned inode races with the removal of its last name, from
/// another thread (a FUSE server's request threads): whichever comes last frees the inode,
/// exactly once. Every inode must be free at the end and the image clean.
#[test]
fn forget_racing_the_last_unlink_frees_once() {
    let img = scratch("pinned-race");
    mke2fs(&img.0, "64M", &[]);
    let fs = std::sync::Arc::new(Fs::open_path(&img.0, rw()).unwrap());
    let files_free = fs.statfs().files_free;
    for round in 0..20 {
        let n = 100;
        let inos: Vec<u32> = (0..n)
            .map(|i| {
                let name = format!("r{round}-{i}");
                let a = if i % 3 == 0 {
                    fs.mkdir(2, name.as_bytes(), 0o755, 0, 0).unwrap()
                } else {
                    let a = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap();
                    fs.write(a.ino, 0, &[7u8; 3000]).unwrap();
                    a
                };
                fs.pin_ino(a.ino, true);
                a.ino
            })
            .collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
        let remover = {
            let (fs, b) = (fs.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                for i in 0..n {
                    let name = format!("r{round}-{i}");
                    if i % 3 == 0 {
                        fs.rmdir(2, name.as_bytes()).unwrap();
                    } else {
                        fs.unlink(2, name.as_bytes()).unwrap();
                    }
                }
            })
        };
        let forgetter = {
            let (fs, b, inos) = (fs.clone(), barrier.clone(), inos.clone());
            std::thread::spawn(move || {
                b.wait();
                // Backwards, so that each thread meets the other's work on the way.
                for &ino in inos.iter().rev() {
                    fs.pin_ino(ino, false);
                    fs.forgotten(ino).unwrap();
                }
            })
        };
        barrier.wait();
        for &ino in &inos {
            // Attributes as long as pinned or named; afterwards gone.
            let _ = fs.getattr(ino);
        }
        remover.join().unwrap();
        forgetter.join().unwrap();
        for &ino in &inos {
            assert!(
                matches!(fs.getattr(ino), Err(Error::NotFound)),
                "{ino} left alive"
            );
        }
        assert_eq!(
            fs.statfs().files_free,
            files_free,
            "round {round}: inodes leaked"
        );
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
