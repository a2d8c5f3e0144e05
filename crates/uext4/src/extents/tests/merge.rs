//! Extents merge as the kernel merges them.

use super::*;

#[test]
fn appends_merge_up_to_the_length_limits() {
    // 4 KiB blocks, 32768 per group; groups 2 and 6 have no superblock backup (and the
    // journal sits in group 4).
    let img = mkimg("merge", "1G", &["-t", "ext4", "-b", "4096"]);
    let fs = open(&img.0, false);
    // Group 2 (from block 65536) and group 6 (from 196608) are wholly free: chunks of 256
    // fill 32768 exactly, chunks of 151 fill 32767.
    for (name, unwritten, goal0, chunk) in [
        (&b"w"[..], false, 65536, 256),
        (&b"u"[..], true, 196608, 151),
    ] {
        let ino = fs.create(2, name, 0o100644, 0, 0).unwrap().ino;
        let inode = fs.iget(ino).unwrap();
        let mut lblk = 0u32;
        let mut goal = goal0;
        while lblk < 40000 {
            let mut h = fs.start(16).unwrap();
            let mut st = inode.state.lock();
            let (p, got) = fs.alloc_blocks(&mut h, goal, chunk, None).unwrap();
            let e = Extent {
                lblk,
                len: got,
                pblk: p,
                unwritten,
            };
            fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
            if !unwritten {
                st.raw.set_size((lblk + got) as u64 * 4096);
            }
            fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
            lblk += got;
            goal = p + got as u64;
        }
        let list = fs.ext_list(ino).unwrap();
        let max = Extent::max_len(unwritten);
        assert!(list.iter().any(|e| e.len == max), "{list:?}");
        for w in list.windows(2) {
            let contiguous =
                w[0].end() == w[1].lblk as u64 && w[0].pblk + w[0].len as u64 == w[1].pblk;
            assert!(
                !contiguous || w[0].len + w[1].len > max,
                "left unmerged: {w:?}"
            );
        }
        assert!(list
            .iter()
            .all(|e| e.len <= max && e.unwritten == unwritten));
        assert_eq!(list.iter().map(|e| e.len as u64).sum::<u64>(), lblk as u64);
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Unwritten conversion in the middle of an extent splits it in three, and converting the
/// rest merges nothing wrongly: the written pieces stay apart from unwritten neighbours.
#[test]
fn mark_written_splits() {
    let img = mkimg("split", "64M", &["-t", "ext4", "-b", "1024"]);
    let fs = open(&img.0, false);
    let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
    let inode = fs.iget(ino).unwrap();
    let p;
    {
        let mut h = fs.start(16).unwrap();
        let mut st = inode.state.lock();
        let (p0, got) = fs.alloc_blocks(&mut h, 0, 100, None).unwrap();
        assert_eq!(got, 100);
        p = p0;
        let e = Extent {
            lblk: 0,
            len: 100,
            pblk: p,
            unwritten: true,
        };
        fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
        fs.ext_mark_written(&mut h, ino, &mut st, 40, 10).unwrap();
        st.raw.set_size(100 * 1024);
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
    }
    let ext = |lblk, len, pblk, unwritten| Extent {
        lblk,
        len,
        pblk,
        unwritten,
    };
    assert_eq!(
        fs.ext_list(ino).unwrap(),
        vec![
            ext(0, 40, p, true),
            ext(40, 10, p + 40, false),
            ext(50, 50, p + 50, true)
        ]
    );
    {
        let mut h = fs.start(16).unwrap();
        let mut st = inode.state.lock();
        fs.ext_mark_written(&mut h, ino, &mut st, 0, 1000).unwrap();
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
        let l: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
        assert!(l.iter().all(|e| !e.unwritten));
        assert_eq!(l.iter().map(|e| e.len).sum::<u32>(), 100);
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Writing a preallocated (unwritten) range piece by piece, in any order, converges to
/// one written extent: converted pieces join their written neighbours.
#[test]
fn conversions_merge_back() {
    let img = mkimg("conv", "64M", &["-t", "ext4", "-b", "1024"]);
    let fs = open(&img.0, false);
    let mut s = 5u64;
    for (name, order) in [(&b"fwd"[..], 0), (&b"back"[..], 1), (&b"random"[..], 2)] {
        let ino = fs.create(2, name, 0o100644, 0, 0).unwrap().ino;
        let inode = fs.iget(ino).unwrap();
        let n = 600u32;
        let mut h = fs.start(16).unwrap();
        let mut st = inode.state.lock();
        let (p, got) = fs.alloc_blocks(&mut h, 0, n, None).unwrap();
        assert_eq!(got, n);
        let e = Extent {
            lblk: 0,
            len: n,
            pblk: p,
            unwritten: true,
        };
        fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
        let mut idx: Vec<u32> = (0..n).collect();
        if order == 1 {
            idx.reverse();
        } else if order == 2 {
            for i in (1..idx.len()).rev() {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                idx.swap(i, (s >> 33) as usize % (i + 1));
            }
        }
        let mut peak = 0;
        for i in idx {
            fs.ext_mark_written(&mut h, ino, &mut st, i, 1).unwrap();
            peak = peak.max(st.extents.as_ref().unwrap().map.len());
        }
        let l: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
        assert_eq!(
            l,
            vec![Extent {
                lblk: 0,
                len: n,
                pblk: p,
                unwritten: false
            }],
            "order {order}"
        );
        if order < 2 {
            assert!(peak <= 2, "order {order}: {peak} extents at the peak");
        }
        st.raw.set_size(n as u64 * 1024);
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
