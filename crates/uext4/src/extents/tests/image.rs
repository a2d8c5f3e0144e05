//! Scattered writes through the file API build deep trees that read back and stay in step.

use super::*;
use crate::format::inode::{Timestamp, S_IFREG};

/// A file written at scattered offsets (thousands of extents: a depth-2 tree with 1 KiB
/// blocks) reads back as written; punching and truncating keep the tree and the cache in
/// step; freeing the inode leaves an e2fsck-clean image.
fn scattered(tag: &str, extra: &[&str], n: u64) {
    let img = mkimg(tag, "256M", &[&["-t", "ext4"], extra].concat());
    let fs = open(&img.0, false);
    let bs = fs.geo.block_size as u64;
    let ino = {
        let mut h = fs.start(16).unwrap();
        let mut raw = fs.new_raw_inode();
        raw.set_mode(S_IFREG | 0o644);
        raw.set_links_count(1);
        raw.set_mtime(Timestamp::now());
        crate::extents::tree::init_root(&mut raw);
        let inode = fs.alloc_inode(&mut h, 2, false, raw).unwrap();
        let ino = inode.ino;
        let mut st = inode.state.lock();
        st.creating = false;
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        ino
    };
    let mut model = std::collections::BTreeMap::new();
    // Every other block in a permuted order, so inserts land all over the tree.
    let mut order: Vec<u64> = (0..n).collect();
    let mut s = 12345u64;
    for i in (1..order.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (s >> 33) as usize % (i + 1));
    }
    for &i in &order {
        let data = vec![(i % 251) as u8 + 1; 16];
        fs.write(ino, i * 2 * bs, &data).unwrap();
        model.insert(i * 2, data);
    }
    let depth = fs.ext_tree_depth(ino).unwrap();
    assert!(depth >= if n > 1000 { 2 } else { 1 }, "depth {depth}");
    // Drop the cache: reload from disk must give the same extents.
    let before = fs.ext_list(ino).unwrap();
    assert_eq!(before.len() as u64, n);
    fs.icache.get_cached(ino).unwrap().state.lock().extents = None;
    assert_eq!(fs.ext_list(ino).unwrap(), before);
    for (&b, data) in model.iter().step_by(7) {
        let mut buf = vec![0u8; 16];
        fs.read(ino, b * bs, &mut buf).unwrap();
        assert_eq!(&buf, data);
    }
    // Punch a range in the middle, truncate the tail.
    fs.fallocate(ino, 0x3, 10 * bs, 400 * bs).unwrap();
    assert!(fs
        .ext_list(ino)
        .unwrap()
        .iter()
        .all(|e| e.lblk < 10 || e.lblk >= 410));
    fs.truncate(ino, (n / 2) * 2 * bs).unwrap();
    fs.icache.get_cached(ino).unwrap().state.lock().extents = None;
    assert!(fs
        .ext_list(ino)
        .unwrap()
        .iter()
        .all(|e| (e.lblk as u64) < n));
    // Free everything.
    {
        let inode = fs.iget(ino).unwrap();
        let mut h = fs.start(64).unwrap();
        let mut st = inode.state.lock();
        st.raw.set_links_count(0);
        fs.evict_blocks(&mut h, &inode, &mut st).unwrap();
        assert_eq!(
            st.raw.blocks_512(fs.geo.block_size),
            0,
            "i_blocks after freeing everything"
        );
        st.raw.set_dtime(Timestamp::now().sec as u32);
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        st.deleted = true;
        fs.free_inode(&mut h, ino, false).unwrap();
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

#[test]
fn scattered_1k_depth2() {
    scattered("1k", &["-b", "1024"], 3000);
}

#[test]
fn scattered_4k_no_csum() {
    scattered("4k", &["-b", "4096", "-O", "^metadata_csum"], 1500);
}
