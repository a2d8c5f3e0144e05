use super::*;
use crate::format::inode::FL_INDEX;

fn e(hash: u32, len: usize) -> Hashed {
    (hash, 0, vec![b'n'; len], 11, FT_REG)
}

/// A filesystem in memory (1 KiB blocks, metadata_csum) with an empty directory "d".
fn mem_fs() -> (std::sync::Arc<Fs>, u32) {
    let dev = crate::blockdev::MemDevice::new(32 << 20);
    let mut o = crate::mkfs::MkfsOptions::default_for(0);
    o.block_size = 1024;
    o.inode_ratio = 4096;
    crate::mkfs::mkfs(&dev, &o).unwrap();
    let fs = Fs::open_dev(std::sync::Arc::new(dev), Default::default()).unwrap();
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    (fs, d)
}

/// Only 6 distinct major hashes (minor hashes distinct): runs of equal hashes span many
/// leaves, so splits set the collision bit, lookups follow continued leaves, readdir merges
/// them, and index nodes split inside runs.
#[test]
fn hash_collisions_span_leaves() {
    fn weak(name: &[u8]) -> (u32, u32) {
        let c = crate::format::csum::crc32c(0, name);
        ((c % 6) << 20, c | 1)
    }
    TEST_HASH.with(|c| c.set(Some(weak)));
    let (fs, d) = mem_fs();
    let name = |i: usize| format!("collide-{i}-{}", "x".repeat(i % 30)).into_bytes();
    let n = 6000;
    let mut inos = Vec::new();
    for i in 0..n {
        inos.push(fs.create(d, &name(i), 0o644, 0, 0).unwrap().ino);
    }
    for i in (0..n).step_by(5) {
        fs.unlink(d, &name(i)).unwrap();
    }
    let dir = fs.iget(d).unwrap();
    let mut st = dir.state.lock();
    assert!(st.raw.flags() & FL_INDEX != 0);
    // Continued leaves exist: some index entry has the collision bit.
    let (_, root, node) = fs.read_dx(d, &mut st, 0).unwrap();
    let mut bits = node.entries.iter().filter(|e| e.0 & 1 == 1).count();
    for &(_, b) in &node.entries {
        if root[ROOT_INDIRECT_LEVELS] > 0 {
            let (_, _, n2) = fs.read_dx(d, &mut st, b).unwrap();
            bits += n2.entries.iter().filter(|e| e.0 & 1 == 1).count();
        }
    }
    assert!(bits > 0, "no collision bits set");
    assert_eq!(root[ROOT_INDIRECT_LEVELS], 1, "two index levels");
    for (i, &ino) in inos.iter().enumerate() {
        let want = if i % 5 == 0 {
            None
        } else {
            Some((ino, FT_REG))
        };
        assert_eq!(fs.dir_lookup(d, &mut st, &name(i)).unwrap(), want, "{i}");
    }
    // readdir in batches of 7 returns every name once, in cookie order.
    let mut seen = std::collections::BTreeMap::new();
    let mut off = 0u64;
    loop {
        let mut got = 0;
        let mut last = off;
        fs.dir_iter(d, &mut st, off, &mut |next, _, _, nm, _| {
            if got == 7 {
                return false;
            }
            got += 1;
            assert!(next >= last, "cookies go backwards");
            last = next;
            *seen.entry(nm.to_vec()).or_insert(0) += 1;
            true
        })
        .unwrap();
        if got == 0 {
            break;
        }
        off = last;
    }
    assert_eq!(seen.len(), n - n / 5 + 2);
    assert!(seen.values().all(|&c| c == 1));
    assert!(fs.dir_is_empty(d, &mut st).is_ok_and(|e| !e));
    drop(st);
    TEST_HASH.with(|c| c.set(None));
}

#[test]
fn split_by_size_with_collision_bit() {
    // Distinct hashes: the halves split by bytes, the index hash is the right's first.
    let v: Vec<Hashed> = (0..10).map(|i| e(i * 16, 4)).collect();
    let (l, r, h) = Fs::split_sorted(v, false);
    assert_eq!((l.len(), r.len(), h), (5, 5, 80));
    // A run of one hash across the split point: the collision bit is set.
    let v: Vec<Hashed> = vec![e(2, 4), e(8, 4), e(8, 4), e(8, 4), e(8, 4), e(10, 4)];
    let (l, r, h) = Fs::split_sorted(v, false);
    assert_eq!(l.last().unwrap().0, 8);
    assert_eq!(r.first().unwrap().0, 8);
    assert_eq!(h, 8 | 1);
    // Sizes matter: one big entry balances several small ones; never an empty half.
    let v = vec![e(2, 200), e(4, 4), e(6, 4), e(8, 4)];
    let (l, r, h) = Fs::split_sorted(v, false);
    assert_eq!((l.len(), r.len(), h), (1, 3, 4));
    let (l, r, _) = Fs::split_sorted(vec![e(2, 4), e(4, 200)], false);
    assert_eq!((l.len(), r.len()), (1, 1));
}
