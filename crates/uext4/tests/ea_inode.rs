//! Extended attribute values in inodes of their own (ea_inode) against the oracles: values the
//! kernel put in EA inodes read back equal through uext4; values uext4 puts there (new,
//! shared by value, replaced, removed, released with their file) pass `e2fsck -fn`, which
//! checks each EA inode's hash, size, flag and reference count and each file's i_blocks, and
//! read back equal under the kernel, which can then change them. Kernel parts need root and
//! loop devices and skip with a message otherwise.

mod common;

use common::*;
use std::collections::BTreeMap;
use uext4::{Error, Fs, MountOptions, XattrFlags};

type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn ours(fs: &Fs, ino: u32) -> Xattrs {
    fs_xattrs(fs, ino)
}

fn kernels(p: &std::path::Path) -> Xattrs {
    xattrs(p).into_iter().collect()
}

/// `n` bytes that differ from one seed to another and do not compress into sharing.
fn value(seed: u64, n: usize) -> Vec<u8> {
    let mut r = xorshift(seed | 1);
    (0..n).map(|_| r() as u8).collect()
}

fn used_inodes(fs: &Fs) -> u64 {
    let s = fs.statfs();
    s.files - s.files_free
}

/// Values the kernel kept in EA inodes (and next to them in the inode and the block) read
/// back equal through uext4, on 4 KiB and 1 KiB blocks; the largest value the VFS allows too.
#[test]
fn kernel_made_ea_inode_values_read_equal() {
    if !can_loop_mount() {
        return;
    }
    for (tag, args) in [
        ("k4k", &["-b", "4096", "-O", "ea_inode"][..]),
        ("k1k", &["-b", "1024", "-O", "ea_inode"][..]),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "64M", args);
        let names = ["f", "g", "h"];
        let expect: BTreeMap<&str, Xattrs> = {
            let m = KernelMount::new(&img.0);
            for n in names {
                std::fs::write(m.dir.join(n), n).unwrap();
            }
            let big = value(1, 60_000);
            for (file, name, v) in [
                ("f", "user.big", big.clone()),
                ("g", "user.big", big.clone()),
                ("f", "user.mid", value(2, 5_000)),
                ("f", "user.small", b"hello".to_vec()),
                ("g", "trusted.t", value(3, 3_000)),
                ("h", "user.max", value(4, 65_536)),
                ("h", "user.block", value(5, 600)),
            ] {
                assert!(set_xattr(&m.dir.join(file), name, &v), "{tag}: set {name}");
            }
            names
                .iter()
                .map(|n| (*n, kernels(&m.dir.join(n))))
                .collect()
        };
        e2fsck_clean(&img.0);
        assert_eq!(expect["h"][&b"user.max"[..]].len(), 65_536);
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        for n in names {
            let ino = fs.lookup(2, n.as_bytes()).unwrap().ino;
            assert_eq!(ours(&fs, ino), expect[n], "{tag}: attributes of {n}");
        }
    }
}

/// uext4 keeps large values in EA inodes, shares equal ones, replaces and removes them and
/// frees an EA inode with its last reference (with the file that held it too): the inode
/// counts say exactly how many EA inodes exist at each step, e2fsck -fn is clean, and the
/// kernel reads the same values, changes them, and uext4 reads the kernel's changes.
#[test]
fn uext4_written_ea_inode_values() {
    for (tag, args) in [
        ("w4k", &["-b", "4096", "-O", "ea_inode"][..]),
        ("w1k128", &["-b", "1024", "-I", "128", "-O", "ea_inode"][..]),
        (
            "w4knocsum",
            &["-b", "4096", "-O", "ea_inode,^metadata_csum"][..],
        ),
    ] {
        let img = scratch(tag);
        mke2fs(&img.0, "64M", args);
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let mk = |n: &str| fs.create(2, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let (f, g, h, k) = (mk("f"), mk("g"), mk("h"), mk("k"));
        let base = used_inodes(&fs);
        let big = value(11, 60_000);
        let set = |ino, name: &str, v: &[u8]| {
            fs.setxattr(ino, name.as_bytes(), v, XattrFlags::Any)
                .unwrap()
        };
        set(f, "user.big", &big);
        assert_eq!(
            used_inodes(&fs),
            base + 1,
            "{tag}: one EA inode for a new value"
        );
        set(g, "user.big", &big);
        set(g, "user.again", &big);
        assert_eq!(used_inodes(&fs), base + 1, "{tag}: equal values share it");
        set(f, "user.mid", &value(12, 5_000));
        set(f, "user.small", b"in the inode");
        set(h, "user.max", &value(13, 65_536));
        assert_eq!(used_inodes(&fs), base + 3, "{tag}");
        // Replacing f's value leaves g's alone; removing the mid value frees its EA inode.
        set(f, "user.big", &value(14, 40_000));
        assert_eq!(
            used_inodes(&fs),
            base + 4,
            "{tag}: a new value, the old still named"
        );
        fs.removexattr(f, b"user.mid").unwrap();
        assert_eq!(used_inodes(&fs), base + 3, "{tag}: the mid value freed");
        // Many values in EA inodes: their entries fill the inode and then the block.
        for i in 0..12 {
            set(
                k,
                &format!("user.many-{i}"),
                &value(100 + i, 4_100 + i as usize),
            );
        }
        assert_eq!(used_inodes(&fs), base + 15, "{tag}");
        fs.removexattr(k, b"user.many-3").unwrap();
        assert_eq!(used_inodes(&fs), base + 14, "{tag}");
        assert!(matches!(
            fs.setxattr(f, b"user.big", &big, XattrFlags::Create),
            Err(Error::Exists)
        ));
        // g goes with its two references to the shared value, which goes with them.
        fs.unlink(2, b"g").unwrap();
        assert_eq!(
            used_inodes(&fs),
            base + 12,
            "{tag}: g and the old big value freed"
        );
        let want: BTreeMap<&str, Xattrs> = ["f", "h", "k"]
            .iter()
            .map(|n| (*n, ours(&fs, fs.lookup(2, n.as_bytes()).unwrap().ino)))
            .collect();
        assert_eq!(want["f"][&b"user.big"[..]], value(14, 40_000));
        assert_eq!(want["k"].len(), 11);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean_when(&img.0, &format!("{tag}: after uext4"));
        // Reopened: the values read back from disk.
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        for (n, w) in &want {
            assert_eq!(
                &ours(&fs, fs.lookup(2, n.as_bytes()).unwrap().ino),
                w,
                "{tag}: {n}"
            );
        }
        drop(fs);
        kernel_round_trip(&img.0, tag, &want);
    }
}

/// The kernel reads what uext4 wrote, changes it (a new shared value, a removal, a file
/// removed), e2fsck stays clean, and uext4 reads the kernel's result.
fn kernel_round_trip(img: &std::path::Path, tag: &str, want: &BTreeMap<&str, Xattrs>) {
    if !can_loop_mount() {
        return;
    }
    let after: BTreeMap<&str, Xattrs> = {
        let m = KernelMount::new(img);
        for (n, w) in want {
            assert_eq!(&kernels(&m.dir.join(n)), w, "{tag}: kernel view of {n}");
        }
        assert!(set_xattr(
            &m.dir.join("f"),
            "user.kernel",
            &value(20, 9_000)
        ));
        sh(&format!(
            "set -e; cd {}; setfattr -x user.many-5 k; rm h",
            m.dir.display()
        ));
        ["f", "k"]
            .iter()
            .map(|n| (*n, kernels(&m.dir.join(n))))
            .collect()
    };
    e2fsck_clean_when(img, &format!("{tag}: after the kernel"));
    let fs = Fs::open_path(img, MountOptions::default()).unwrap();
    for (n, w) in &after {
        assert_eq!(
            &ours(&fs, fs.lookup(2, n.as_bytes()).unwrap().ino),
            w,
            "{tag}: {n}"
        );
    }
    // And uext4 releases what the kernel made.
    fs.unlink(2, b"f").unwrap();
    fs.unlink(2, b"k").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(img, &format!("{tag}: after uext4 removed everything"));
    let fs = Fs::open_path(img, MountOptions::ro()).unwrap();
    let s = fs.statfs();
    assert_eq!(
        s.files - s.files_free,
        11,
        "{tag}: only the reserved inodes and lost+found"
    );
}

/// Threads setting, replacing and removing the same few large values on their own files, and
/// creating and removing files that hold them: the values are shared and released
/// concurrently, and afterwards every reference count is what e2fsck counts and every file
/// holds its last value.
#[test]
fn concurrent_shared_values() {
    let img = scratch("eaconc");
    mke2fs(&img.0, "64M", &["-O", "ea_inode"]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let values: Vec<Vec<u8>> = (0..3)
        .map(|i| value(50 + i, 9_000 + 1000 * i as usize))
        .collect();
    let last: Vec<Option<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (fs, values) = (&fs, &values);
                s.spawn(move || {
                    let name = format!("t{t}");
                    let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    let mut r = xorshift(t + 1);
                    let mut cur = None;
                    for i in 0..60 {
                        let pick = (r() % 4) as usize;
                        if pick == 3 {
                            if cur.take().is_some() {
                                fs.removexattr(ino, b"user.v").unwrap();
                            }
                        } else {
                            fs.setxattr(ino, b"user.v", &values[pick], XattrFlags::Any)
                                .unwrap();
                            cur = Some(pick);
                        }
                        if i % 10 == 0 {
                            let tmp = format!("tmp{t}-{i}");
                            let k = fs.create(2, tmp.as_bytes(), 0o644, 0, 0).unwrap().ino;
                            fs.setxattr(k, b"user.v", &values[i % 3], XattrFlags::Any)
                                .unwrap();
                            fs.unlink(2, tmp.as_bytes()).unwrap();
                        }
                    }
                    cur
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, cur) in last.iter().enumerate() {
        let ino = fs.lookup(2, format!("t{t}").as_bytes()).unwrap().ino;
        match cur {
            Some(i) => assert_eq!(fs.getxattr(ino, b"user.v").unwrap(), values[*i]),
            None => assert!(matches!(fs.getxattr(ino, b"user.v"), Err(Error::NoAttr))),
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after concurrent changes");
}

/// Damaged EA inodes are reported in one line naming the inode and what is wrong, never used:
/// a value hash that does not match, a missing EA_INODE flag, a size that differs from the
/// entry's, an entry naming an inode out of range.
#[test]
fn damaged_ea_inodes_are_reported() {
    if !have(&["debugfs"]) {
        return;
    }
    let img = scratch("eabad");
    mke2fs(&img.0, "64M", &["-O", "ea_inode"]);
    let (f, ea) = {
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        let before = used_inodes(&fs);
        fs.setxattr(f, b"user.big", &value(9, 20_000), XattrFlags::Any)
            .unwrap();
        assert_eq!(used_inodes(&fs), before + 1);
        fs.unmount().unwrap();
        (f, f + 1)
    };
    e2fsck_clean(&img.0);
    let pristine = std::fs::read(&img.0).unwrap();
    for (damage, says) in [
        (format!("sif <{ea}> atime 0x1234"), "value hash"),
        (format!("sif <{ea}> flags 0x80000"), "EA_INODE flag"),
        (format!("sif <{ea}> size 19999"), "holds 19999 bytes"),
    ] {
        std::fs::write(&img.0, &pristine).unwrap();
        sh(&format!(
            "debugfs -w -R '{damage}' {} 2>/dev/null",
            img.0.display()
        ));
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        assert_eq!(fs.listxattr(f).unwrap(), vec![b"user.big".to_vec()]);
        match fs.getxattr(f, b"user.big") {
            Err(Error::Corrupt { detail, .. }) => assert!(
                detail.contains(&format!("EA inode {ea}")) && detail.contains(says),
                "{damage}: {detail}"
            ),
            other => panic!("{damage}: expected Corrupt, got {other:?}"),
        }
    }
    // The entry itself naming an inode past the last: found when the attributes are read.
    // (Written over the inode in its table, where debugfs's imap puts it; on this image
    // without metadata_csum, so that the inode's checksum does not catch it first.)
    let img2 = scratch("eabad2");
    mke2fs(&img2.0, "64M", &["-O", "ea_inode,^metadata_csum"]);
    let fs = Fs::open_path(&img2.0, MountOptions::default()).unwrap();
    let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, b"user.big", &value(9, 20_000), XattrFlags::Any)
        .unwrap();
    let past = fs.statfs().files as u32 + 5;
    fs.unmount().unwrap();
    drop(fs);
    let imap = sh(&format!(
        "debugfs -R 'imap <{f}>' {} 2>/dev/null",
        img2.0.display()
    ));
    let words: Vec<&str> = imap.split_whitespace().collect();
    let blk: u64 = words[words.iter().rposition(|w| *w == "block").unwrap() + 1]
        .trim_end_matches(',')
        .parse()
        .unwrap();
    let off = u64::from_str_radix(words.last().unwrap().trim_start_matches("0x"), 16).unwrap();
    let mut bytes = std::fs::read(&img2.0).unwrap();
    let inode = (blk * 4096 + off) as usize;
    let needle = (f + 1).to_le_bytes();
    // The in-inode entry: name length 3, index 1 (user), offset 0, then e_value_inum.
    let at = inode
        + bytes[inode..inode + 256]
            .windows(8)
            .position(|w| w[..4] == [3, 1, 0, 0] && w[4..] == needle)
            .expect("the entry naming the EA inode");
    bytes[at + 4..at + 8].copy_from_slice(&past.to_le_bytes());
    std::fs::write(&img2.0, &bytes).unwrap();
    let fs = Fs::open_path(&img2.0, MountOptions::ro()).unwrap();
    match fs.listxattr(f) {
        Err(Error::Corrupt { detail, .. }) => {
            assert!(detail.contains("out of range"), "{detail}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A file removed while open keeps its values until its last close; after a crash in between,
/// the next open's orphan processing releases them with it.
#[test]
fn open_unlinked_file_releases_its_values_after_a_crash() {
    let img = scratch("eaorphan");
    mke2fs(&img.0, "64M", &["-O", "ea_inode"]);
    let base = {
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let base = used_inodes(&fs);
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        fs.setxattr(f, b"user.a", &value(31, 30_000), XattrFlags::Any)
            .unwrap();
        fs.setxattr(f, b"user.b", &value(32, 8_000), XattrFlags::Any)
            .unwrap();
        fs.open(f).unwrap();
        fs.unlink(2, b"f").unwrap();
        assert_eq!(fs.getxattr(f, b"user.b").unwrap(), value(32, 8_000));
        assert_eq!(
            used_inodes(&fs),
            base + 3,
            "the file and its two EA inodes, open"
        );
        fs.sync().unwrap();
        // A crash: no release, no unmount.
        base
    };
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_eq!(
        used_inodes(&fs),
        base,
        "the orphan and its EA inodes freed at open"
    );
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after orphan processing");
}
