//! Damaged trees are refused with errors that name the damage, never a panic.

use super::*;
use crate::error::Corruption;
use crate::format::{le16, put16};
use std::os::unix::fs::FileExt;

/// A file of `n` discontiguous one-block extents; returns (ino, its inode's byte offset in
/// the image).
fn build(fs: &Fs, n: u32) -> (u32, u64) {
    let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
    let inode = fs.iget(ino).unwrap();
    for i in 0..n {
        let mut h = fs.start(16).unwrap();
        let mut st = inode.state.lock();
        let (p, _) = fs.alloc_blocks(&mut h, 0, 1, None).unwrap();
        let e = Extent {
            lblk: i * 2,
            len: 1,
            pblk: p,
            unwritten: false,
        };
        fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
        st.raw
            .set_size((i as u64 * 2 + 1) * fs.geo.block_size as u64);
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
    }
    let (blk, off) = fs.inode_location(ino).unwrap();
    (ino, blk * fs.geo.block_size as u64 + off as u64)
}

/// The first index entry's child of a node.
fn child(node: &[u8], i: usize) -> u64 {
    ExtentIdx::read(&node[HEADER_SIZE + i * ENTRY_SIZE..]).leaf
}

fn message(r: Result<Vec<Extent>>) -> (Error, String) {
    let e = match r {
        Ok(l) => panic!("a corrupt tree loaded ({} extents)", l.len()),
        Err(e) => e,
    };
    let m = e.to_string();
    (e, m)
}

/// Magic and checksum damage written into the image file, found by a fresh open.
#[test]
fn bad_magic_and_bad_checksum_in_the_image() {
    let img = mkimg("corrupt", "64M", &["-t", "ext4", "-b", "1024"]);
    let fs = open(&img.0, false);
    let (ino, _) = build(&fs, 200);
    let root = fs.iget(ino).unwrap().state.lock().raw.i_block().to_vec();
    assert_eq!(ExtentHeader::read(&root).depth, 1);
    let leaf = child(&root, 1);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img.0)
        .unwrap();
    let at = leaf * 1024;
    let mut orig = [0u8; 32];
    f.read_exact_at(&mut orig, at).unwrap();

    // A byte of an entry: the checksum catches it.
    let mut b = orig;
    b[HEADER_SIZE + 3] ^= 0x40;
    f.write_all_at(&b, at).unwrap();
    let fs = open(&img.0, true);
    let (e, m) = message(fs.ext_list(ino));
    assert!(
        matches!(
            e,
            Error::BadChecksum {
                kind: Corruption::ExtentTree,
                ..
            }
        ),
        "{m}"
    );
    assert!(
        m.contains(&format!("inode {ino}")) && m.contains(&format!("extent block {leaf}")),
        "{m}"
    );
    drop(fs);

    // The magic: a structural error, recorded in the superblock on a writable mount.
    let mut b = orig;
    b[0] = 0;
    f.write_all_at(&b, at).unwrap();
    let fs = open(&img.0, false);
    let (e, m) = message(fs.ext_list(ino));
    assert!(
        matches!(
            e,
            Error::Corrupt {
                kind: Corruption::ExtentTree,
                ..
            }
        ),
        "{m}"
    );
    assert!(
        m.contains(&format!("inode {ino}"))
            && m.contains(&format!("extent block {leaf}"))
            && m.contains("magic"),
        "{m}"
    );
    let sb = fs.superblock();
    assert_eq!(sb.first_error_ino(), ino);
    assert_eq!(sb.first_error_block(), leaf);
    drop(fs);
    // e2fsck sees the same damage.
    let out = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&img.0)
        .output()
        .unwrap();
    assert!(!out.status.success(), "e2fsck missed the damage");
}

/// Structural damage to the root and to blocks (no metadata_csum, so only the structure
/// checks can catch it), made in memory on a read-only mount.
#[test]
fn structural_damage_is_named() {
    let img = mkimg(
        "struct",
        "64M",
        &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
    );
    let fs = open(&img.0, false);
    let (ino, _) = build(&fs, 1000);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = open(&img.0, true);
    let inode = fs.iget(ino).unwrap();
    let root = inode.state.lock().raw.i_block().to_vec();
    assert_eq!(ExtentHeader::read(&root).depth, 2);
    let mid = child(&root, 0);
    let mid_data = fs.bcache.get(mid).unwrap().read().to_vec();
    let leaf = child(&mid_data, 0);
    let leaf2 = child(&mid_data, 1);
    let leaf_data = fs.bcache.get(leaf).unwrap().read().to_vec();
    let count = fs.geo.blocks_count;

    // (what is damaged, the node the message must name, the damage)
    type Damage = Box<dyn Fn(&mut Vec<u8>, &mut Vec<u8>, &mut Vec<u8>)>;
    let cases: Vec<(&str, String, Damage)> = vec![
        (
            "root magic",
            "extent root".into(),
            Box::new(|r, _, _| r[0] = 0),
        ),
        (
            "root depth 6",
            "extent root".into(),
            Box::new(|r, _, _| r[6] = 6),
        ),
        (
            "root eh_max 5",
            "extent root".into(),
            Box::new(|r, _, _| r[4] = 5),
        ),
        (
            "root entries > max",
            "extent root".into(),
            Box::new(|r, _, _| r[2] = 5),
        ),
        (
            "root index outside the disk",
            "extent root".into(),
            Box::new(move |r, _, _| put32(r, HEADER_SIZE + 4, count as u32 + 7)),
        ),
        (
            "index keys out of order",
            format!("extent block {mid}"),
            Box::new(|_, m, _| {
                let k = le32(m, HEADER_SIZE + ENTRY_SIZE);
                put32(m, HEADER_SIZE, k + 1)
            }),
        ),
        (
            "index node points to itself",
            format!("extent block {mid}"),
            Box::new(move |_, m, _| put32(m, HEADER_SIZE + 4, mid as u32)),
        ),
        (
            "leaf magic",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| l[1] = 0),
        ),
        (
            "leaf depth",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| l[6] = 1),
        ),
        (
            "leaf eh_max",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| put16(l, 4, 300)),
        ),
        (
            "leaf entries > max",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| put16(l, 2, 85)),
        ),
        (
            "leaf extent outside the disk",
            format!("extent block {leaf}"),
            Box::new(move |_, _, l| put32(l, HEADER_SIZE + 8, count as u32 + 10)),
        ),
        (
            "leaf extent of length 0",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| put16(l, HEADER_SIZE + 4, 0)),
        ),
        (
            "leaf extents out of order",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| {
                let k = le32(l, HEADER_SIZE + ENTRY_SIZE);
                put32(l, HEADER_SIZE, k + 1)
            }),
        ),
        (
            "last extent of a leaf overlaps the next leaf",
            format!("extent block {leaf}"),
            Box::new(|_, _, l| {
                let n = le16(l, 2) as usize;
                put16(l, HEADER_SIZE + (n - 1) * ENTRY_SIZE + 4, 3)
            }),
        ),
        (
            "extent before its parent's key",
            format!("extent block {leaf2}"),
            Box::new(|_, _, _| {}),
        ),
    ];
    for (what, node, damage) in cases {
        let mut r = root.clone();
        let mut m = mid_data.clone();
        let mut l = leaf_data.clone();
        let mut l2 = None;
        if what == "extent before its parent's key" {
            let mut d = fs.bcache.get(leaf2).unwrap().read().to_vec();
            let k = le32(&d, HEADER_SIZE);
            put32(&mut d, HEADER_SIZE, k - 1);
            l2 = Some(d);
        } else {
            damage(&mut r, &mut m, &mut l);
        }
        let orig2 = fs.bcache.get(leaf2).unwrap().read().to_vec();
        {
            let mut st = inode.state.lock();
            st.raw.i_block_mut().copy_from_slice(&r);
            st.extents = None;
        }
        fs.bcache.get(mid).unwrap().write().copy_from_slice(&m);
        fs.bcache.get(leaf).unwrap().write().copy_from_slice(&l);
        if let Some(d) = &l2 {
            fs.bcache.get(leaf2).unwrap().write().copy_from_slice(d);
        }
        let (e, msg) = message(fs.ext_list(ino));
        assert!(
            matches!(
                e,
                Error::Corrupt {
                    kind: Corruption::ExtentTree,
                    ..
                }
            ),
            "{what}: {msg}"
        );
        assert!(
            msg.contains(&format!("inode {ino}:")) && msg.contains(&node),
            "{what}: {msg} (should name {node})"
        );
        // Put everything back: the undamaged tree loads again.
        {
            let mut st = inode.state.lock();
            st.raw.i_block_mut().copy_from_slice(&root);
            st.extents = None;
        }
        fs.bcache
            .get(mid)
            .unwrap()
            .write()
            .copy_from_slice(&mid_data);
        fs.bcache
            .get(leaf)
            .unwrap()
            .write()
            .copy_from_slice(&leaf_data);
        fs.bcache
            .get(leaf2)
            .unwrap()
            .write()
            .copy_from_slice(&orig2);
        assert_eq!(fs.ext_list(ino).unwrap().len(), 1000, "{what}: restore");
    }
}

/// Random byte damage in the root and the tree blocks: an error or a tree whose every
/// extent is inside the disk, never a panic.
#[test]
fn random_damage_never_panics() {
    let img = mkimg(
        "fuzz",
        "64M",
        &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
    );
    let fs = open(&img.0, false);
    let (ino, _) = build(&fs, 1000);
    fs.unmount().unwrap();
    drop(fs);
    let fs = open(&img.0, true);
    let inode = fs.iget(ino).unwrap();
    let root = inode.state.lock().raw.i_block().to_vec();
    let mut blocks = vec![];
    let mut todo = vec![child(&root, 0), child(&root, 1)];
    while let Some(b) = todo.pop() {
        let d = fs.bcache.get(b).unwrap().read().to_vec();
        if ExtentHeader::read(&d).depth > 0 {
            for i in 0..le16(&d, 2) as usize {
                todo.push(child(&d, i));
            }
        }
        blocks.push((b, d));
    }
    let mut s = 7u64;
    let mut rnd = |n: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % n
    };
    let (mut errors, mut loads) = (0, 0);
    for _ in 0..600 {
        let mut r = root.clone();
        let target = rnd(blocks.len() as u64 + 1) as usize;
        let hits = 1 + rnd(4);
        let mut damaged = None;
        if target == blocks.len() {
            for _ in 0..hits {
                r[rnd(60) as usize] = rnd(256) as u8;
            }
        } else {
            let (b, d) = &blocks[target];
            let mut d = d.clone();
            for _ in 0..hits {
                // Mostly the header and the first entries, where damage matters most.
                let at = if rnd(2) == 0 { rnd(64) } else { rnd(1024) } as usize;
                d[at] = rnd(256) as u8;
            }
            fs.bcache.get(*b).unwrap().write().copy_from_slice(&d);
            damaged = Some(*b);
        }
        {
            let mut st = inode.state.lock();
            st.raw.i_block_mut().copy_from_slice(&r);
            st.extents = None;
        }
        match fs.ext_list(ino) {
            Ok(list) => {
                loads += 1;
                for e in &list {
                    assert!(e.pblk > 0 && e.pblk + e.len as u64 <= fs.geo.blocks_count);
                }
                for w in list.windows(2) {
                    assert!(w[0].end() <= w[1].lblk as u64);
                }
            }
            Err(e) => {
                errors += 1;
                assert!(e.to_string().contains(&format!("inode {ino}")), "{e}");
            }
        }
        if let Some(b) = damaged {
            let orig = &blocks.iter().find(|x| x.0 == b).unwrap().1;
            fs.bcache.get(b).unwrap().write().copy_from_slice(orig);
        }
    }
    assert!(errors > 100 && loads > 10, "{errors} errors, {loads} loads");
}
