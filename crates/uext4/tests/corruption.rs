//! Corrupted images: bytes flipped in the superblock, group descriptors, inode table, extent and
//! directory blocks give a clear error naming the structure, never a panic or a hang.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use uext4::Corruption;
use uext4::{Error, Fs, MountOptions};

fn flip(path: &Path, off: u64, xor: u8) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= xor;
    f.write_all_at(&b, off).unwrap();
}

fn put(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Walks the whole tree, reading everything; returns the first error.
fn walk(fs: &Fs) -> uext4::Result<usize> {
    let mut stack = vec![2u32];
    let mut n = 0usize;
    // A corrupt entry can lead back to a directory already listed.
    let mut seen = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        let mut entries = Vec::new();
        fs.readdir(d, 0, &mut |e| {
            entries.push(e);
            entries.len() < 100_000
        })?;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            n += 1;
            if n > 200_000 {
                return Ok(n);
            }
            let a = fs.lookup(d, &e.name)?;
            let kind = a.mode & 0o170000;
            if kind == 0o040000 {
                stack.push(a.ino);
            } else if kind == 0o100000 {
                let mut buf = vec![0u8; 65536];
                let mut off = 0;
                while off < a.size.min(1 << 22) {
                    let r = fs.read(a.ino, off, &mut buf)?;
                    if r == 0 {
                        break;
                    }
                    off += r as u64;
                }
            } else if kind == 0o120000 {
                fs.readlink(a.ino)?;
            }
            let _ = fs.listxattr(a.ino)?;
        }
    }
    Ok(n)
}

/// An image with a few files and directories, made with mke2fs and debugfs.
fn base_image(extra: &[&str]) -> Scratch {
    let img = scratch("corrupt");
    mke2fs(&img.0, "16M", extra);
    let src = scratch("corrupt-src");
    std::fs::write(
        &src.0,
        (0..200_000u32).map(|i| i as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    let cmds = format!(
        "mkdir d\nwrite {0} d/f\nwrite {0} g\nsymlink s /some/where\nmkdir d/e\nwrite {0} d/e/h\nea_set g user.a hello\n",
        src.0.display()
    );
    let script = scratch("corrupt-cmds");
    std::fs::write(&script.0, cmds).unwrap();
    sh(&format!(
        "debugfs -w -f {} {} >/dev/null 2>&1",
        script.0.display(),
        img.0.display()
    ));
    e2fsck_clean(&img.0);
    img
}

fn open_rw(p: &Path) -> uext4::Result<std::sync::Arc<Fs>> {
    Fs::open_path(p, MountOptions::default())
}

#[test]
fn bad_superblock_magic_is_named() {
    let img = base_image(&[]);
    put(&img.0, 1024 + 0x38, &[0, 0]);
    match open_rw(&img.0) {
        Err(Error::NotExt4(m)) => assert!(m.contains("magic"), "{m}"),
        other => panic!("expected NotExt4, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn superblock_checksum_mismatch_is_named() {
    let img = base_image(&[]);
    flip(&img.0, 1024 + 0x78, 0x55); // volume name: only the checksum notices
    match open_rw(&img.0) {
        Err(Error::BadChecksum {
            kind: Corruption::Superblock,
            ..
        }) => {}
        other => panic!("expected BadChecksum, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn group_descriptor_corruption_is_named() {
    let img = base_image(&[]);
    // 4 KiB blocks: descriptors start at block 1. Break group 0's inode table pointer.
    flip(&img.0, 4096 + 0x8, 0xff);
    match open_rw(&img.0) {
        Err(e) if e.corruption() == Some(Corruption::GroupDescriptor) => {}
        other => panic!(
            "expected a group descriptor error, got {:?}",
            other.map(|_| ())
        ),
    }
    // Without metadata_csum (and no gdt_csum) the pointer itself is checked.
    let img = base_image(&["-O", "^metadata_csum,^uninit_bg"]);
    put(&img.0, 4096 + 0x8, &0xFFFF_FF00u32.to_le_bytes());
    match open_rw(&img.0) {
        Err(Error::Corrupt {
            kind: Corruption::GroupDescriptor,
            detail,
        }) => assert!(detail.contains("group 0"), "{detail}"),
        other => panic!("expected Corrupt, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn inode_corruption_names_the_inode() {
    let img = base_image(&[]);
    let fs = open_rw(&img.0).unwrap();
    let table = fs.group_desc(0).inode_table();
    let d = fs.lookup(2, b"d").unwrap().ino;
    assert!(d < fs.superblock().inodes_per_group());
    drop(fs);
    // Directory d's inode, in group 0's table (256-byte inodes); flip a byte of its mode.
    let keep = std::fs::read(&img.0).unwrap();
    flip(&img.0, table * 4096 + (d as u64 - 1) * 256, 0x40);
    let fs = open_rw(&img.0).unwrap();
    let e = fs.lookup(2, b"d").unwrap_err();
    assert_eq!(e.corruption(), Some(Corruption::Inode), "{e}");
    assert!(e.is_bad_checksum(), "{e}");
    assert!(e.to_string().contains(&format!("inode {d}")), "{e}");
    // The error is recorded in the superblock as the kernel does.
    let sb = fs.superblock();
    assert!(
        sb.error_count() >= 1 && sb.first_error_ino() == d,
        "error not recorded"
    );
    // As EXT4_ERR_EFSBADCRC (4), which dumpe2fs names; not an errno.
    assert_eq!(sb.first_error_errcode(), 4);
    drop(fs);
    let o = std::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(&img.0)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("EFSBADCRC"), "{out}");
    // The root inode (2) damaged the same way: the open itself is refused, naming it, as
    // the kernel's mount is ("get root inode failed").
    std::fs::write(&img.0, &keep).unwrap();
    flip(&img.0, table * 4096 + 256, 0x40);
    let e = open_rw(&img.0).map(|_| ()).unwrap_err();
    assert_eq!(e.corruption(), Some(Corruption::Inode), "{e}");
    assert!(e.to_string().contains("inode 2"), "{e}");
}

#[test]
fn directory_block_corruption_is_an_error() {
    let img = base_image(&["-O", "^metadata_csum"]);
    let fs = open_rw(&img.0).unwrap();
    let root_blk = fs.ext_list(2).unwrap()[0].pblk;
    drop(fs);
    // First entry's rec_len: make it overrun the block.
    put(&img.0, root_blk * 4096 + 4, &0xFFF0u16.to_le_bytes());
    let fs = open_rw(&img.0).unwrap();
    let e = walk(&fs).unwrap_err();
    assert_eq!(e.corruption(), Some(Corruption::Directory), "{e}");
}

/// Random byte flips over the metadata area: every operation returns Ok or an error; no panic,
/// no hang.
#[test]
fn random_metadata_flips_never_panic() {
    let base = base_image(&[]);
    let pristine = std::fs::read(&base.0).unwrap();
    let img = scratch("flip");
    let mut rnd = xorshift(0x1234_5678_9abc_def0u64);
    let mut panics = 0;
    let iterations = 150;
    for _ in 0..iterations {
        let mut bytes = pristine.clone();
        // Metadata lives in the first ~2 MiB here (superblock, descriptors, bitmaps, inode tables,
        // directory and extent blocks).
        for _ in 0..8 {
            let off = 1024 + (rnd() % (2 << 20)) as usize;
            bytes[off] ^= (rnd() as u8) | 1;
        }
        std::fs::write(&img.0, &bytes).unwrap();
        let r = std::panic::catch_unwind(|| {
            if let Ok(fs) = Fs::open_path(&img.0, MountOptions::ro()) {
                let _ = walk(&fs);
            }
        });
        if r.is_err() {
            panics += 1;
        }
    }
    assert_eq!(
        panics, 0,
        "{panics} of {iterations} corrupted images made the engine panic"
    );
}

/// Flips in an image without metadata checksums (so the structure checks, not the checksums,
/// meet the damage), aimed at the inode table, the directories' blocks, an xattr block and the
/// first 2 MiB, opened read-write: walking, creating, writing, truncating, setting and removing
/// xattrs, renaming and removing return Ok or an error; no panic, and no iteration takes long
/// (a hang shows as the test not ending).
/// A longer run: `FUZZ_ITER=3000 FUZZ_FLIPS=8 FUZZ_SEED=N cargo test --release --test
/// corruption flips_without_checksums -- --nocapture`.
#[test]
fn flips_without_checksums_read_write_never_panic() {
    flips_read_write(&["-O", "^metadata_csum"]);
}

/// The same without the extents feature (ext3 layout): the files' indirect blocks are damaged
/// too, and writes map new blocks through them.
#[test]
fn flips_in_block_maps_read_write_never_panic() {
    flips_read_write(&["-O", "^metadata_csum,^extent,^64bit"]);
}

/// The same on an image with inline_data: small files, a symlink and a directory kept in
/// their inodes, read and then converted to blocks by the changes.
#[test]
fn flips_in_inline_data_read_write_never_panic() {
    flips_read_write(&["-O", "^metadata_csum,inline_data"]);
}

fn flips_read_write(mkfs: &[&str]) {
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<u64>().ok());
    let base = base_image(mkfs);
    // And a directory large enough for an htree index (e2fsck -D builds it).
    let script = scratch("flip-rw-cmds");
    // An xattr too big for the inode, so g has an xattr block too.
    let big = scratch("flip-rw-xattr");
    std::fs::write(&big.0, vec![b'x'; 2000]).unwrap();
    let mut cmds = format!("ea_set -f {} g user.big\nmkdir big\n", big.0.display());
    let inline = mkfs.iter().any(|o| o.contains("inline_data"));
    if inline {
        // Files and a directory kept inside their inodes: the kernel makes them (debugfs
        // writes no inline files).
        if !can_loop_mount() {
            return;
        }
        let m = KernelMount::new(&base.0);
        sh(&format!(
            "set -e; cd {}; head -c 100 /dev/zero | tr '\\0' s > tiny; mkdir sd; \
             echo a > sd/a; echo b > sd/b; ln -s {} sd/l",
            m.dir.display(),
            "t".repeat(100)
        ));
    }
    for i in 0..400 {
        cmds += &format!("write /dev/null big/file-with-a-longer-name-{i}\n");
    }
    std::fs::write(&script.0, cmds).unwrap();
    sh(&format!(
        "debugfs -w -f {} {} >/dev/null 2>&1; e2fsck -fyD {} >/dev/null 2>&1; true",
        script.0.display(),
        base.0.display(),
        base.0.display()
    ));
    e2fsck_clean(&base.0);
    if inline {
        for p in ["tiny", "sd"] {
            let st = sh(&format!("debugfs -R 'stat {p}' {} 2>&1", base.0.display()));
            assert!(
                st.contains("Size of inline data"),
                "{p} is not inline: {st}"
            );
        }
    }
    let pristine = std::fs::read(&base.0).unwrap();
    let img = scratch("flip-rw");
    // 4 KiB blocks (common::mke2fs): group 0's inode table, and the directories' blocks.
    let itable = sh(&format!(
        "dumpe2fs {} 2>/dev/null | awk '/Inode table at/{{split($4,a,\"-\"); print a[1]; exit}}'",
        base.0.display()
    ))
    .trim()
    .parse::<usize>()
    .unwrap()
        * 4096;
    let mut blocks = Vec::new();
    for d in ["/", "d", "d/e", "lost+found", "big"] {
        let out = sh(&format!(
            "debugfs -R 'blocks {d}' {} 2>/dev/null",
            base.0.display()
        ));
        blocks.extend(
            out.split_whitespace()
                .filter_map(|w| w.parse::<usize>().ok()),
        );
    }
    assert!(blocks.len() >= 4, "directory blocks: {blocks:?}");
    // g's xattr block is damaged too.
    let acl = sh(&format!(
        "debugfs -R 'stat g' {} 2>/dev/null",
        base.0.display()
    ));
    let xblock = acl
        .split("File ACL:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|w| w.parse::<usize>().ok())
        .filter(|&b| b != 0)
        .expect("g has an xattr block");
    blocks.push(xblock);
    // Indirect blocks, where the files have them (block maps).
    for f in ["g", "d/f", "d/e/h"] {
        let st = sh(&format!(
            "debugfs -R 'stat {f}' {} 2>/dev/null",
            base.0.display()
        ));
        for part in st.split("(IND):").skip(1) {
            if let Some(b) = part
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|w| w.parse::<usize>().ok())
            {
                blocks.push(b);
            }
        }
    }
    let mut rnd = xorshift(env("FUZZ_SEED").unwrap_or(0x9e37_79b9_7f4a_7c15));
    let iterations = env("FUZZ_ITER").unwrap_or(200);
    let flips = env("FUZZ_FLIPS").unwrap_or(6);
    let (mut panics, mut slow) = (Vec::new(), Vec::new());
    for it in 0..iterations {
        let mut bytes = pristine.clone();
        for _ in 0..flips {
            let off = match rnd() % 3 {
                0 => 1024 + (rnd() % (2 << 20)) as usize,
                1 => itable + (rnd() % (32 * 256)) as usize,
                _ => {
                    let b = blocks[(rnd() % blocks.len() as u64) as usize];
                    b * 4096 + (rnd() % 4096) as usize
                }
            };
            bytes[off] ^= (rnd() as u8) | 1;
        }
        std::fs::write(&img.0, &bytes).unwrap();
        let began = std::time::Instant::now();
        let r = std::panic::catch_unwind(|| {
            let Ok(fs) = open_rw(&img.0) else { return };
            let _ = walk(&fs);
            if let Ok(a) = fs.create(2, b"new", 0o100644, 0, 0) {
                let _ = fs.write(a.ino, 0, &vec![7u8; 70_000]);
                let _ = fs.truncate(a.ino, 5000);
            }
            let _ = fs.mkdir(2, b"nd", 0o40755, 0, 0);
            if let Ok(d) = fs.lookup(2, b"d") {
                let _ = fs.create(d.ino, b"x", 0o100644, 0, 0);
                let _ = fs.unlink(d.ino, b"f");
            }
            if let Ok(b) = fs.lookup(2, b"big") {
                for i in (0..400).step_by(37) {
                    let name = format!("file-with-a-longer-name-{i}");
                    let _ = fs.lookup(b.ino, name.as_bytes());
                    let _ = fs.unlink(b.ino, name.as_bytes());
                    let _ = fs.create(b.ino, format!("n{i}").as_bytes(), 0o100644, 0, 0);
                }
            }
            if let Ok(g) = fs.lookup(2, b"g") {
                // New blocks past the end, and over a hole punched inside.
                let _ = fs.write(g.ino, 250_000, &[3u8; 9000]);
                let _ = fs.fallocate(g.ino, 3, 60_000, 20_000);
                let _ = fs.write(g.ino, 61_000, &[4u8; 5000]);
                let _ = fs.getxattr(g.ino, b"user.big");
                let _ = fs.setxattr(g.ino, b"user.c", &[5u8; 300], uext4::XattrFlags::Any);
                let _ = fs.removexattr(g.ino, b"user.a");
            }
            // Inline inodes (where the image has them): read, then converted by changes.
            if let Ok(t) = fs.lookup(2, b"tiny") {
                let _ = fs.write(t.ino, 10, &[6u8; 5000]);
            }
            if let Ok(sd) = fs.lookup(2, b"sd") {
                let _ = fs.create(sd.ino, b"c", 0o100644, 0, 0);
                let _ = fs.unlink(sd.ino, b"a");
            }
            let _ = fs.rename(2, b"g", 2, b"g2", Default::default());
            let _ = fs.unlink(2, b"g2");
            let _ = fs.rmdir(2, b"d");
            let _ = walk(&fs);
            let _ = fs.unmount();
        });
        if r.is_err() {
            panics.push(it);
        }
        // Generous (debug builds, a loaded machine): an iteration takes milliseconds.
        if began.elapsed().as_secs() >= 10 {
            slow.push(it);
        }
    }
    assert!(
        panics.is_empty() && slow.is_empty(),
        "of {iterations} corrupted images, these panicked: {panics:?}; these took over 10 s: {slow:?}"
    );
}

/// A directory whose i_size claims billions of blocks past the one it maps: listing it skips
/// the hole in one step (it took a lookup per missing block: minutes).
#[test]
fn directory_size_far_past_its_blocks_lists_at_once() {
    let base = base_image(&["-O", "^metadata_csum"]);
    // i_size of directory d (inode 12 here): lo at 0x4, hi at 0x6C.
    let (blk, off) = {
        let out = sh(&format!(
            "debugfs -R 'imap d' {} 2>/dev/null",
            base.0.display()
        ));
        let nums: Vec<u64> = out
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter_map(|w| {
                w.strip_prefix("0x")
                    .map_or_else(|| w.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
            })
            .collect();
        (nums[nums.len() - 2], nums[nums.len() - 1])
    };
    let at = blk * 4096 + off;
    put(&base.0, at + 0x4, &0xFFFF_F000u32.to_le_bytes());
    put(&base.0, at + 0x6C, &0x0000_0FFFu32.to_le_bytes());
    let fs = Fs::open_path(&base.0, MountOptions::ro()).unwrap();
    let d = fs.lookup(2, b"d").unwrap();
    assert!(d.size > 1 << 40, "size {}", d.size);
    let began = std::time::Instant::now();
    let mut names = Vec::new();
    fs.readdir(d.ino, 0, &mut |e| {
        names.push(String::from_utf8_lossy(&e.name).into_owned());
        true
    })
    .unwrap();
    names.sort();
    assert_eq!(names, [".", "..", "e", "f"]);
    assert!(fs.lookup(d.ino, b"nothing").is_err());
    assert!(
        began.elapsed().as_secs() < 10,
        "listing took {:?}",
        began.elapsed()
    );
}

/// Directory entries that name their own directory or an ancestor (made with debugfs's `ln`,
/// which links directories): rmdir and rename of such a name fail with a corruption error
/// naming the entry, where they locked the directory a second time and hung (or inverted the
/// parent-child lock order against an rmdir higher up).
#[test]
fn directory_aliases_are_refused_not_deadlocked() {
    let base = base_image(&["-O", "^metadata_csum"]);
    sh(&format!(
        "debugfs -w -R 'ln d d/me' {0} && debugfs -w -R 'ln d d/e/up' {0}",
        base.0.display()
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    let p = base.0.clone();
    std::thread::spawn(move || {
        // errors=continue: every operation below reaches its own check (with remount-ro
        // the first corruption would stop the rest with its message).
        let opts = MountOptions {
            errors: uext4::ErrorsBehaviour::Continue,
            ..Default::default()
        };
        let fs = Fs::open_path(&p, opts).unwrap();
        let d = fs.lookup(2, b"d").unwrap().ino;
        let e = fs.lookup(d, b"e").unwrap().ino;
        let results = vec![
            fs.rmdir(d, b"me"),
            fs.rmdir(e, b"up"),
            fs.rename(d, b"me", 2, b"moved", Default::default()),
            fs.rename(e, b"up", e, b"up2", Default::default()),
            fs.rename(d, b"f", e, b"up", Default::default()),
        ];
        tx.send(
            results
                .into_iter()
                .map(|r| r.map_err(|e| (e.corruption(), e.to_string())))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    });
    let results = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("operations on directory aliases hung");
    for r in &results {
        match r {
            Err((kind, m)) => assert!(
                *kind == Some(Corruption::Directory) && m.contains("names directory"),
                "{m}"
            ),
            Ok(()) => panic!("an operation on a directory alias succeeded: {results:?}"),
        }
    }
}

/// `dumpe2fs` of group 0: (block bitmap, first inode-table block).
fn group0_tables(img: &Path) -> (u64, u64) {
    let out = sh(&format!("dumpe2fs {} 2>/dev/null", img.display()));
    let num = |key: &str| -> u64 {
        let l = out.lines().find(|l| l.contains(key)).unwrap();
        let after = &l[l.find(key).unwrap() + key.len()..];
        after
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num("Block bitmap at "), num("Inode table at "))
}

/// A damaged extent that points into the inode table (the checksum made good, as a careless
/// tool or a bit flip before checksumming leaves it) is refused when read: the read fails
/// naming it, and the unlink that would free those blocks fails too. Before, the read
/// returned inode-table bytes and the unlink freed the table's blocks, so that later
/// allocations overwrote every inode (block_validity).
#[test]
fn extents_into_the_filesystems_own_blocks_are_refused() {
    let img = scratch("sysext");
    mke2fs(&img.0, "64M", &[]);
    let (_, itable) = group0_tables(&img.0);
    {
        let fs = open_rw(&img.0).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        let k = fs.create(d, b"keep", 0o644, 0, 0).unwrap().ino;
        fs.write(k, 0, b"hello").unwrap();
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, &[7u8; 40960]).unwrap();
        fs.unmount().unwrap();
    }
    sh(&format!(
        "debugfs -w -R 'sif /f block[5] {itable}' {} 2>&1",
        img.0.display()
    ));
    let fs = open_rw(&img.0).unwrap();
    let f = fs.lookup(2, b"f").unwrap().ino;
    let mut buf = vec![0u8; 4096];
    let e = fs.read(f, 0, &mut buf).unwrap_err();
    assert_eq!(e.corruption(), Some(Corruption::ExtentTree), "{e}");
    assert!(e.to_string().contains("own structures"), "{e}");
    drop(fs);
    // errors=continue, so that the unlink is attempted on a filesystem that keeps writing.
    let fs = Fs::open_path(
        &img.0,
        MountOptions {
            errors: uext4::ErrorsBehaviour::Continue,
            ..opts::no_timer()
        },
    )
    .unwrap();
    assert!(
        fs.unlink(2, b"f").is_err(),
        "the unlink freed the inode table"
    );
    let g = fs.create(2, b"g", 0o644, 0, 0).unwrap().ino;
    let _ = fs.write(g, 0, &vec![0x55u8; 1 << 20]);
    fs.unmount().unwrap();
    drop(fs);
    sh(&format!(
        "e2fsck -fy {} >/dev/null 2>&1; true",
        img.0.display()
    ));
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let d = fs.lookup(2, b"d").unwrap().ino;
    let k = fs.lookup(d, b"keep").unwrap().ino;
    let mut b = [0u8; 5];
    fs.read(k, 0, &mut b).unwrap();
    assert_eq!(&b, b"hello");
}

/// A zeroed block bitmap (no checksums to catch it) would hand out the group's inode table:
/// the first allocation from it fails, naming the bitmap, and nothing is written over the
/// table. Before, one mkdir overwrote the inode table that held the root.
#[test]
fn a_bitmap_that_frees_system_blocks_is_refused() {
    let img = scratch("sysbitmap");
    mke2fs(&img.0, "64M", &["-O", "^metadata_csum"]);
    let (bitmap, _) = group0_tables(&img.0);
    {
        let fs = open_rw(&img.0).unwrap();
        let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
        let k = fs.create(d, b"keep", 0o644, 0, 0).unwrap().ino;
        fs.write(k, 0, b"precious").unwrap();
        fs.unmount().unwrap();
    }
    put(&img.0, bitmap * 4096, &[0u8; 4096]);
    for errors in [
        uext4::ErrorsBehaviour::RemountRo,
        uext4::ErrorsBehaviour::Continue,
    ] {
        let fs = Fs::open_path(
            &img.0,
            MountOptions {
                errors,
                ..opts::no_timer()
            },
        )
        .unwrap();
        let e = fs.mkdir(2, b"x", 0o755, 0, 0).unwrap_err();
        assert_eq!(e.corruption(), Some(Corruption::BlockBitmap), "{e}");
        let _ = fs.unmount();
    }
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let d = fs.lookup(2, b"d").unwrap().ino;
    let k = fs.lookup(d, b"keep").unwrap().ino;
    let mut b = [0u8; 8];
    fs.read(k, 0, &mut b).unwrap();
    assert_eq!(&b, b"precious");
}

/// A root directory that was deleted, or is not a directory, refuses the open with an error
/// naming it, as the kernel's mount refuses it ("get root inode failed", "corrupt root
/// inode"): before, a deleted root showed an empty tree without a word, and a root that is a
/// file mounted with the mount point giving EIO. The image is not changed by the attempt.
#[test]
fn an_unusable_root_directory_refuses_the_open() {
    for (set, why) in [
        ("links_count 0", "no links"),
        ("mode 0100644", "not a directory"),
        ("size 0", "empty"),
    ] {
        let img = base_image(&[]);
        sh(&format!(
            "debugfs -w -R 'sif <2> {set}' {} >/dev/null 2>&1",
            img.0.display()
        ));
        let before = std::fs::read(&img.0).unwrap();
        for ro in [false, true] {
            let r = Fs::open_path(
                &img.0,
                MountOptions {
                    read_only: ro,
                    ..Default::default()
                },
            );
            match r {
                Err(Error::Corrupt {
                    kind: Corruption::Inode,
                    detail,
                }) => assert!(detail.contains(why), "{set}: {detail}"),
                other => panic!("{set}: expected Corrupt, got {:?}", other.map(|_| ())),
            }
        }
        assert!(
            std::fs::read(&img.0).unwrap() == before,
            "{set}: the refused open changed the image"
        );
    }
}

/// An inode whose size is past the largest a file can have is damage, as the kernel's iget
/// says ("bad i_size value"): reading it is refused with its number, where a reader streamed
/// zeros without end. The rest of the tree stays readable.
#[test]
fn a_size_past_the_largest_file_is_refused() {
    let img = base_image(&[]);
    sh(&format!(
        "debugfs -w -R 'sif /g size 0xffffffffffff' {} >/dev/null 2>&1",
        img.0.display()
    ));
    let g = sh(&format!(
        "debugfs -R 'stat /g' {} 2>/dev/null",
        img.0.display()
    ));
    let g: u32 = g
        .split("Inode: ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("debugfs names g's inode");
    let fs = open_rw(&img.0).unwrap();
    match fs.lookup(2, b"g") {
        Err(Error::Corrupt {
            kind: Corruption::Inode,
            detail,
        }) => assert!(detail.contains("size 281474976710655"), "{detail}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Recorded in the superblock, as the kernel records its iget errors.
    assert_eq!(fs.superblock().first_error_ino(), g);
    let d = fs.lookup(2, b"d").unwrap().ino;
    let f = fs.lookup(d, b"f").unwrap();
    assert_eq!(f.size, 200_000);
    drop(fs);
}

/// The kind and checksum flag of a corruption error, or what else came back.
fn kind_of<T>(r: uext4::Result<T>) -> std::result::Result<(Corruption, bool), String> {
    match r {
        Err(e) => e
            .corruption()
            .map(|k| (k, e.is_bad_checksum()))
            .ok_or_else(|| format!("not a corruption error: {e}")),
        Ok(_) => Err("no error".into()),
    }
}

/// Each damaged structure gives a corruption error of its own kind, with the checksum flag
/// set exactly when a checksum caught it: callers and tests act on the kind, not the text.
#[test]
fn each_damaged_structure_gives_its_kind() {
    use Corruption::*;
    let sb = 1024u64;
    let ino_at = |fs: &Fs, ino: u32| fs.group_desc(0).inode_table() * 4096 + (ino as u64 - 1) * 256;
    let ro = |p: &Path| Fs::open_path(p, MountOptions::ro()).unwrap();

    // With metadata_csum: the checksums catch the damage first.
    let img = base_image(&[]);
    let pristine = std::fs::read(&img.0).unwrap();
    let restore = || std::fs::write(&img.0, &pristine).unwrap();
    let (d, root_blk, ibitmap, d_at) = {
        let fs = ro(&img.0);
        let d = fs.lookup(2, b"d").unwrap().ino;
        let at = ino_at(&fs, d);
        (
            d,
            fs.ext_list(2).unwrap()[0].pblk,
            fs.group_desc(0).inode_bitmap(),
            at,
        )
    };
    flip(&img.0, sb + 0x78, 0x55);
    assert_eq!(
        kind_of(open_rw(&img.0)),
        Ok((Superblock, true)),
        "superblock"
    );
    restore();
    flip(&img.0, 4096 + 0x8, 0xff);
    assert_eq!(
        kind_of(open_rw(&img.0)),
        Ok((GroupDescriptor, true)),
        "descriptor"
    );
    restore();
    flip(&img.0, d_at, 0x40);
    assert_eq!(
        kind_of(ro(&img.0).lookup(2, b"d")),
        Ok((Inode, true)),
        "inode {d}"
    );
    restore();
    flip(&img.0, root_blk * 4096 + 40, 0x20);
    assert_eq!(
        kind_of(walk(&ro(&img.0))),
        Ok((Directory, true)),
        "directory"
    );
    restore();
    flip(&img.0, ibitmap * 4096 + 1, 0x01);
    let fs = open_rw(&img.0).unwrap();
    assert_eq!(
        kind_of(fs.create(2, b"new", 0o644, 0, 0)),
        Ok((InodeBitmap, true)),
        "inode bitmap"
    );
    drop(fs);

    // Without checksums: the structures' own checks.
    let img = base_image(&["-O", "^metadata_csum"]);
    let pristine = std::fs::read(&img.0).unwrap();
    let restore = || std::fs::write(&img.0, &pristine).unwrap();
    let (g_at, root_blk, bbitmap, journal) = {
        let fs = ro(&img.0);
        let g = fs.lookup(2, b"g").unwrap().ino;
        let at = ino_at(&fs, g);
        (
            at,
            fs.ext_list(2).unwrap()[0].pblk,
            fs.group_desc(0).block_bitmap(),
            fs.ext_list(8).unwrap()[0].pblk,
        )
    };
    // The extent header's magic in g's i_block (at 0x28).
    put(&img.0, g_at + 0x28, &[0, 0]);
    let fs = ro(&img.0);
    let g = fs.lookup(2, b"g").map(|a| a.ino);
    let r = g.and_then(|g| fs.read(g, 0, &mut [0u8; 16]));
    assert_eq!(kind_of(r), Ok((ExtentTree, false)), "extent header");
    drop(fs);
    restore();
    // The root directory's first rec_len overruns its block.
    put(&img.0, root_blk * 4096 + 4, &0xFFF0u16.to_le_bytes());
    assert_eq!(
        kind_of(walk(&ro(&img.0))),
        Ok((Directory, false)),
        "dir entry"
    );
    restore();
    // A zeroed block bitmap would hand out the group's own metadata.
    put(&img.0, bbitmap * 4096, &[0u8; 4096]);
    let fs = open_rw(&img.0).unwrap();
    assert_eq!(
        kind_of(fs.mkdir(2, b"x", 0o755, 0, 0)),
        Ok((BlockBitmap, false)),
        "block bitmap"
    );
    drop(fs);
    restore();
    // The journal superblock's magic.
    put(&img.0, journal * 4096, &[0, 0, 0, 0]);
    assert_eq!(kind_of(open_rw(&img.0)), Ok((Journal, false)), "journal");
    restore();
    // An orphan list head past the last inode.
    put(&img.0, sb + 0xE8, &0x0FFF_FFF0u32.to_le_bytes());
    assert_eq!(kind_of(open_rw(&img.0)), Ok((Orphan, false)), "orphan list");
    restore();
    // An xattr block's magic.
    let g = {
        let fs = open_rw(&img.0).unwrap();
        let g = fs.lookup(2, b"g").unwrap().ino;
        let flags = uext4::XattrFlags::Any;
        fs.setxattr(g, b"user.big", &[5u8; 2000], flags).unwrap();
        fs.unmount().unwrap();
        g
    };
    let stat = sh(&format!(
        "debugfs -R 'stat /g' {} 2>/dev/null",
        img.0.display()
    ));
    let acl: u64 = stat
        .split("File ACL: ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("debugfs names g's xattr block");
    put(&img.0, acl * 4096, &[0, 0, 0, 0]);
    let r = ro(&img.0).getxattr(g, b"user.big");
    assert_eq!(kind_of(r), Ok((Xattr, false)), "xattr block");

    // A block map (no extents) whose first pointer lies outside the filesystem.
    let img = base_image(&["-O", "^metadata_csum,^extent,^64bit"]);
    let g_at = {
        let fs = ro(&img.0);
        let g = fs.lookup(2, b"g").unwrap().ino;
        ino_at(&fs, g)
    };
    put(&img.0, g_at + 0x28, &0x0FFF_FFF0u32.to_le_bytes());
    let fs = ro(&img.0);
    let g = fs.lookup(2, b"g").map(|a| a.ino);
    let r = g.and_then(|g| fs.read(g, 0, &mut [0u8; 16]));
    assert_eq!(kind_of(r), Ok((BlockMap, false)), "block map");
}
