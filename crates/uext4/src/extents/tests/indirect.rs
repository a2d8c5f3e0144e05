//! Files with the old indirect block map (written by debugfs on an ext3 image): read through
//! the cache, refused for new mappings, truncated and deleted cleanly.

use super::*;
use std::os::unix::fs::FileExt;
use std::process::Command;

fn have(cmd: &str) -> bool {
    Command::new(cmd).arg("-V").output().is_ok()
}

/// A source file: nonzero 1 KiB blocks at `blocks` (a pattern naming the block), holes
/// elsewhere, `size` bytes.
fn source(path: &std::path::Path, blocks: &[u64], size: u64) {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    for &b in blocks {
        f.write_all_at(&pattern(b), b * 1024).unwrap();
    }
    f.set_len(size).unwrap();
}

fn pattern(b: u64) -> Vec<u8> {
    (0..1024u64)
        .map(|i| ((b * 7 + i * 13) % 251) as u8 + 1)
        .collect()
}

#[test]
fn indirect_block_maps() {
    if !have("debugfs") {
        eprintln!("skipped: debugfs (e2fsprogs) is not installed");
        return;
    }
    let img = mkimg("ext3", "128M", &["-t", "ext3", "-b", "1024"]);
    let dir = img.0.parent().unwrap().to_path_buf();
    let tag = format!("{}", std::process::id());
    // Direct only; into the double-indirect tree (12 + 256 = 268 blocks); sparse, out to
    // the triple-indirect tree (from block 12 + 256 + 65536).
    let small: Vec<u64> = (0..5).collect();
    let medium: Vec<u64> = (0..1000).collect();
    let sparse: Vec<u64> = [0u64, 1, 11, 12, 13, 200, 267, 268, 269, 5000, 65803, 65804]
        .into_iter()
        .chain(66000..66100)
        .chain([70000, 100000])
        .collect();
    let files: [(&str, &Vec<u64>, u64); 3] = [
        ("small", &small, 5 * 1024 - 100),
        ("medium", &medium, 1000 * 1024),
        ("sparse", &sparse, 100001 * 1024),
    ];
    for (name, blocks, size) in files {
        let src = dir.join(format!("uext4-extm-src-{name}-{tag}"));
        source(&src, blocks, size);
        let out = Command::new("debugfs")
            .arg("-w")
            .arg("-R")
            .arg(format!("write {} {name}", src.display()))
            .arg(&img.0)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&src);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    e2fsck_clean(&img.0);

    let fs = open(&img.0, false);
    let free0 = fs.statfs().blocks_free;
    for (name, blocks, size) in files {
        let ino = fs.lookup(2, name.as_bytes()).unwrap().ino;
        let list = fs.ext_list(ino).unwrap();
        let mapped: Vec<u64> = list.iter().flat_map(|e| e.lblk as u64..e.end()).collect();
        assert_eq!(&mapped, blocks, "{name}: mapped blocks");
        // Runs of physically contiguous blocks became single extents.
        for w in list.windows(2) {
            assert!(
                w[0].end() != w[1].lblk as u64 || w[0].pblk + w[0].len as u64 != w[1].pblk,
                "{name}: unjoined run {w:?}"
            );
        }
        for &b in blocks.iter() {
            let mut buf = vec![0u8; 1024];
            let n = fs.read(ino, b * 1024, &mut buf).unwrap();
            let want = pattern(b);
            let n2 = (size - b * 1024).min(1024) as usize;
            assert_eq!(n, n2);
            assert_eq!(&buf[..n], &want[..n], "{name}: block {b}");
        }
        // A hole reads as zeros.
        if name == "sparse" {
            let mut buf = vec![1u8; 1024];
            fs.read(ino, 4000 * 1024, &mut buf).unwrap();
            assert!(buf.iter().all(|&x| x == 0));
        }
    }
    // Preallocation is refused by name (the kernel's EOPNOTSUPP); nothing changes.
    let sparse_ino = fs.lookup(2, b"sparse").unwrap().ino;
    let err = fs.fallocate(sparse_ino, 0, 3000 * 1024, 1024).unwrap_err();
    assert!(
        matches!(&err, Error::NotSupported(m) if m.contains("indirect block map")),
        "{err}"
    );
    // Writing maps new blocks through the indirect blocks, here into the double indirect
    // tree's hole at block 3000 (the punch below takes it out again).
    assert_eq!(fs.write(sparse_ino, 3000 * 1024 + 5, b"new").unwrap(), 3);
    let mut buf = vec![0u8; 8];
    fs.read(sparse_ino, 3000 * 1024 + 3, &mut buf).unwrap();
    assert_eq!(&buf, b"\0\0new\0\0\0");
    assert!(fs
        .ext_map(
            sparse_ino,
            &mut fs.iget(sparse_ino).unwrap().state.lock(),
            3000
        )
        .unwrap()
        .is_some());
    // Truncate the medium file into its single-indirect range, punch the sparse one,
    // delete the small one.
    let medium_ino = fs.lookup(2, b"medium").unwrap().ino;
    let blocks_before = fs.getattr(medium_ino).unwrap().blocks;
    fs.truncate(medium_ino, 100 * 1024 + 10).unwrap();
    let a = fs.getattr(medium_ino).unwrap();
    // 101 data blocks + the single-indirect block stay.
    assert_eq!(
        a.blocks,
        (101 + 1) * 2,
        "i_blocks after truncation (was {blocks_before})"
    );
    let mut buf = vec![0u8; 1024];
    fs.read(medium_ino, 99 * 1024, &mut buf).unwrap();
    assert_eq!(buf, pattern(99));
    assert_eq!(fs.ext_list(medium_ino).unwrap().last().unwrap().end(), 101);
    fs.fallocate(sparse_ino, 0x3, 13 * 1024, (66050 - 13) * 1024)
        .unwrap();
    let left: Vec<u64> = fs
        .ext_list(sparse_ino)
        .unwrap()
        .iter()
        .flat_map(|e| e.lblk as u64..e.end())
        .collect();
    let want: Vec<u64> = sparse
        .iter()
        .copied()
        .filter(|&b| !(13..66050).contains(&b))
        .collect();
    assert_eq!(left, want);
    fs.unlink(2, b"small").unwrap();
    fs.unmount().unwrap();
    let freed = fs.statfs().blocks_free - free0;
    assert!(freed > 900, "only {freed} blocks freed");
    drop(fs);
    e2fsck_clean(&img.0);
    // The survivors read back after a fresh open, from the tree on disk.
    let fs = open(&img.0, true);
    assert_eq!(
        fs.ext_list(sparse_ino)
            .unwrap()
            .iter()
            .flat_map(|e| e.lblk as u64..e.end())
            .collect::<Vec<_>>(),
        want
    );
    let mut buf = vec![0u8; 1024];
    fs.read(sparse_ino, 70000 * 1024, &mut buf).unwrap();
    assert_eq!(buf, pattern(70000));
    drop(fs);
    // Delete the rest: every block of the three files comes back.
    let fs = open(&img.0, false);
    fs.unlink(2, b"medium").unwrap();
    fs.unlink(2, b"sparse").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let out = Command::new("debugfs")
        .arg("-R")
        .arg("ls -l /")
        .arg(&img.0)
        .output()
        .unwrap();
    let ls = String::from_utf8_lossy(&out.stdout);
    assert!(!ls.contains("sparse") && !ls.contains("medium"), "{ls}");
}
