//! The tree against a model: random inserts, removes, truncations and unwritten conversions
//! through the tree API itself, compared block by block with a map; then the image is
//! committed, checked by e2fsck, reopened and compared again.

use super::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Map the hole at `lblk` (clipped to the hole), physically after the left neighbour
    /// when `contiguous`, else near `goal` (a fraction of the disk).
    Insert {
        lblk: u32,
        len: u32,
        unwritten: bool,
        contiguous: bool,
        goal: u16,
    },
    Remove {
        start: u32,
        len: u32,
    },
    Truncate {
        start: u32,
    },
    Written {
        start: u32,
        len: u32,
    },
}

type Model = BTreeMap<u32, (u64, bool)>;

fn op_strategy(span: u32) -> impl Strategy<Value = Op> {
    let len = prop_oneof![6 => Just(1u32), 3 => 1u32..16, 1 => 1u32..400];
    prop_oneof![
        12 => (0..span, len.clone(), any::<bool>(), any::<bool>(), any::<u16>()).prop_map(
            |(lblk, len, unwritten, contiguous, goal)| Op::Insert {
                lblk,
                len,
                unwritten,
                contiguous,
                goal
            }
        ),
        4 => (0..span, len.clone()).prop_map(|(start, len)| Op::Remove { start, len }),
        1 => (0..span * 2).prop_map(|start| Op::Truncate { start }),
        3 => (0..span, len).prop_map(|(start, len)| Op::Written { start, len }),
    ]
}

fn apply(fs: &Fs, ino: u32, op: &Op, model: &mut Model) {
    let inode = fs.iget(ino).unwrap();
    let mut h = fs.start(64).unwrap();
    let mut st = inode.state.lock();
    fs.ext_load(ino, &mut st).unwrap();
    match *op {
        Op::Insert {
            lblk,
            len,
            unwritten,
            contiguous,
            goal,
        } => {
            let cache = st.extents.as_ref().unwrap();
            if cache.lookup(lblk).is_some() {
                return;
            }
            let room = cache
                .next(lblk)
                .map(|e| e.lblk as u64 - lblk as u64)
                .unwrap_or(u64::MAX);
            let len = (len as u64).min(room) as u32;
            let left = lblk.checked_sub(1).and_then(|l| cache.lookup(l));
            let goal = match left {
                Some(l) if contiguous => l.pblk + (lblk - l.lblk) as u64,
                _ => {
                    fs.geo.first_data_block
                        + goal as u64 * (fs.geo.blocks_count - fs.geo.first_data_block) / 65536
                }
            };
            let (p, got) = fs.alloc_blocks(&mut h, goal, len, None).unwrap();
            let e = Extent {
                lblk,
                len: got,
                pblk: p,
                unwritten,
            };
            fs.ext_insert(&mut h, ino, &mut st, e).unwrap();
            for i in 0..got {
                assert!(model.insert(lblk + i, (p + i as u64, unwritten)).is_none());
            }
        }
        Op::Remove { start, len } => {
            let end = start as u64 + len as u64;
            fs.ext_remove(&mut h, ino, &mut st, start, end).unwrap();
            let gone: Vec<u32> = model.range(start..).map(|(&k, _)| k).collect();
            for k in gone.into_iter().filter(|&k| (k as u64) < end) {
                model.remove(&k);
            }
        }
        Op::Truncate { start } => {
            fs.ext_remove(&mut h, ino, &mut st, start, 1 << 32).unwrap();
            model.retain(|&k, _| k < start);
        }
        Op::Written { start, len } => {
            fs.ext_mark_written(&mut h, ino, &mut st, start, len)
                .unwrap();
            for (_, v) in model
                .range_mut(start..)
                .take_while(|(&k, _)| (k as u64) < start as u64 + len as u64)
            {
                v.1 = false;
            }
        }
    }
    fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
}

fn expand(list: &[Extent]) -> Model {
    let mut m = Model::new();
    for e in list {
        for i in 0..e.len {
            m.insert(e.lblk + i, (e.pblk + i as u64, e.unwritten));
        }
    }
    m
}

/// The list is sorted, disjoint, within the length limits; the cache equals a fresh load
/// of the on-disk tree; i_blocks counts data and tree blocks. Returns the list.
fn check(fs: &Fs, ino: u32, model: &Model) -> Vec<Extent> {
    let list = fs.ext_list(ino).unwrap();
    for w in list.windows(2) {
        assert!(w[0].end() <= w[1].lblk as u64, "overlap: {w:?}");
    }
    for e in &list {
        assert!(e.len >= 1 && e.len <= Extent::max_len(e.unwritten), "{e:?}");
    }
    assert!(expand(&list) == *model, "extents differ from the model");
    let inode = fs.iget(ino).unwrap();
    let mut st = inode.state.lock();
    st.extents = None;
    fs.ext_load(ino, &mut st).unwrap();
    let reloaded: Vec<Extent> = st.extents.as_ref().unwrap().map.values().copied().collect();
    assert_eq!(reloaded, list, "the cache differs from the on-disk tree");
    let tree = tree_blocks(fs, st.raw.i_block());
    let spb = fs.geo.block_size as u64 / 512;
    assert_eq!(
        st.raw.blocks_512(fs.geo.block_size),
        (model.len() as u64 + tree) * spb,
        "i_blocks ({} data blocks, {tree} tree blocks)",
        model.len()
    );
    list
}

/// Runs `ops` on a new file of a new image, checks against the model, then commits, runs
/// e2fsck, reopens, compares, deletes the file and checks that every block came back.
fn run_case(extra: &[&str], ops: &[Op], check_every: usize) -> (u16, u16) {
    let img = mkimg("model", "64M", extra);
    let fs = open(&img.0, false);
    let free0 = fs.statfs().blocks_free;
    let ino = fs.create(2, b"f", 0o100644, 0, 0).unwrap().ino;
    let mut model = Model::new();
    let mut peak = 0;
    for (i, op) in ops.iter().enumerate() {
        apply(&fs, ino, op, &mut model);
        peak = peak.max(fs.ext_tree_depth(ino).unwrap());
        if check_every > 0 && i % check_every == 0 {
            check(&fs, ino, &model);
        }
    }
    let list = check(&fs, ino, &model);
    let depth = fs.ext_tree_depth(ino).unwrap();
    // e2fsck wants i_size to cover every written block.
    {
        let inode = fs.iget(ino).unwrap();
        let mut h = fs.start(4).unwrap();
        let mut st = inode.state.lock();
        let end = list.last().map(|e| e.end()).unwrap_or(0);
        st.raw.set_size(end * fs.geo.block_size as u64);
        fs.mark_inode_dirty(&mut h, &inode, &mut st).unwrap();
    }
    fs.commit().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert!(
        debugfs_extents(&img.0, ino) == list,
        "debugfs reads other extents"
    );
    let fs = open(&img.0, false);
    assert_eq!(fs.ext_list(ino).unwrap(), list, "after reopening");
    check(&fs, ino, &model);
    fs.unlink(2, b"f").unwrap();
    fs.unmount().unwrap();
    assert_eq!(fs.statfs().blocks_free, free0, "blocks leaked");
    drop(fs);
    e2fsck_clean(&img.0);
    (peak, depth)
}

const CONFIGS: [&[&str]; 3] = [
    &["-t", "ext4", "-b", "1024"],
    &["-t", "ext4", "-b", "4096"],
    &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
];

proptest! {
    #![proptest_config(ProptestConfig {
        // UEXT4_EXTENT_CASES=500 for a longer run.
        cases: std::env::var("UEXT4_EXTENT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]
    #[test]
    fn tree_matches_model(
        cfg in 0usize..3,
        ops in prop::collection::vec(op_strategy(3000), 1..600),
    ) {
        run_case(CONFIGS[cfg], &ops, 50);
    }
}

/// 2500 discontiguous one-block extents in a shuffled order: depth 2 with 1 KiB blocks;
/// then random removals take it apart again.
#[test]
fn deep_tree_then_removals() {
    for cfg in [CONFIGS[0], CONFIGS[2]] {
        let mut ops = Vec::new();
        let mut order: Vec<u32> = (0..2500).collect();
        let mut s = 99u64;
        let mut rnd = |n: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % n
        };
        for i in (1..order.len()).rev() {
            order.swap(i, rnd(i as u64 + 1) as usize);
        }
        for &i in &order {
            ops.push(Op::Insert {
                lblk: i * 2,
                len: 1,
                unwritten: i % 3 == 0,
                contiguous: false,
                goal: rnd(65536) as u16,
            });
        }
        for _ in 0..300 {
            let start = rnd(5000) as u32;
            ops.push(Op::Remove {
                start,
                len: 1 + rnd(40) as u32,
            });
            ops.push(Op::Written {
                start: rnd(5000) as u32,
                len: 1 + rnd(30) as u32,
            });
        }
        ops.push(Op::Truncate { start: 3000 });
        // Down to at most 3 extents: the tree folds back into i_block.
        ops.push(Op::Truncate { start: 6 });
        let (peak, depth) = run_case(cfg, &ops, 500);
        eprintln!("deep tree {cfg:?}: depth {peak}, then {depth}");
        assert_eq!((peak, depth), (2, 0));
    }
}
