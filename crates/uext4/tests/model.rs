//! Random operation sequences run against the engine and an in-memory model of the same tree;
//! after each sequence the trees must match, the image must pass `e2fsck -fn`, and after a
//! remount they must still match.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use uext4::namei::RenameFlags;
use uext4::{Error, Fs, MountOptions};

#[derive(Clone, Debug)]
enum Node {
    Dir(BTreeMap<Vec<u8>, usize>),
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

#[derive(Default)]
struct Model {
    nodes: Vec<Node>,
    nlink: Vec<u32>,
    parent: Vec<usize>,
    ino: Vec<u32>,
}

impl Model {
    fn dirs(&self) -> Vec<usize> {
        let mut v = vec![0usize];
        let mut i = 0;
        while i < v.len() {
            if let Node::Dir(c) = &self.nodes[v[i]] {
                for &id in c.values() {
                    if matches!(self.nodes[id], Node::Dir(_)) {
                        v.push(id);
                    }
                }
            }
            i += 1;
        }
        v
    }
    fn files(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for d in self.dirs() {
            if let Node::Dir(c) = &self.nodes[d] {
                for &id in c.values() {
                    if matches!(self.nodes[id], Node::File(_)) && !out.contains(&id) {
                        out.push(id);
                    }
                }
            }
        }
        out
    }
    fn children(&self, d: usize) -> &BTreeMap<Vec<u8>, usize> {
        match &self.nodes[d] {
            Node::Dir(c) => c,
            _ => unreachable!(),
        }
    }
    fn add(&mut self, node: Node, parent: usize, ino: u32) -> usize {
        self.nodes.push(node);
        self.nlink.push(1);
        self.parent.push(parent);
        self.ino.push(ino);
        self.nodes.len() - 1
    }
    fn is_ancestor(&self, a: usize, mut d: usize) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == 0 {
                return false;
            }
            d = self.parent[d];
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(u8, u8),
    Mkdir(u8, u8),
    Symlink(u8, u8, u16),
    Write(u8, u32, u16, u8),
    Truncate(u8, u32),
    Punch(u8, u32, u32),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Rename(u8, u8, u8, u8, bool),
    Link(u8, u8, u8),
    Remount,
}

const NAMES: &[&str] = &[
    "a",
    "b",
    "c",
    "dd",
    "eee",
    "f",
    "a-rather-long-file-name-to-fill-directory-blocks-quickly-0123456789",
    "g",
    "h",
    "i",
];

fn name(i: u8) -> Vec<u8> {
    NAMES[i as usize % NAMES.len()].as_bytes().to_vec()
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>()).prop_map(|(d, n)| Op::Create(d, n)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(d, n)| Op::Mkdir(d, n)),
        1 => (any::<u8>(), any::<u8>(), 1u16..300).prop_map(|(d, n, l)| Op::Symlink(d, n, l)),
        6 => (any::<u8>(), prop_oneof![0u32..70_000, 0u32..3_000_000], 1u16..20_000, any::<u8>()).prop_map(|(f, o, l, b)| Op::Write(f, o, l, b)),
        2 => (any::<u8>(), prop_oneof![0u32..70_000, 0u32..3_000_000]).prop_map(|(f, s)| Op::Truncate(f, s)),
        1 => (any::<u8>(), 0u32..200_000, 1u32..100_000).prop_map(|(f, o, l)| Op::Punch(f, o, l)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(d, n)| Op::Unlink(d, n)),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(d, n)| Op::Rmdir(d, n)),
        2 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, c, d, x)| Op::Rename(a, b, c, d, x)),
        1 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(f, d, n)| Op::Link(f, d, n)),
        1 => Just(Op::Remount),
    ]
}

fn pick<T: Copy>(v: &[T], i: u8) -> Option<T> {
    if v.is_empty() {
        None
    } else {
        Some(v[i as usize % v.len()])
    }
}

fn same_kind(a: &Error, b: &Error) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

fn expect_err(r: uext4::Result<impl std::fmt::Debug>, want: Error, op: &Op) {
    match r {
        Err(e) if same_kind(&e, &want) => {}
        other => panic!("{op:?}: expected {want:?}, got {other:?}"),
    }
}

struct Run {
    img: Scratch,
    fs: Arc<Fs>,
    m: Model,
    opts: MountOptions,
}

impl Run {
    fn new(extra: &[&str]) -> Run {
        Run::with_options(extra, MountOptions::default())
    }

    fn with_options(extra: &[&str], opts: MountOptions) -> Run {
        let img = scratch("model");
        mke2fs(&img.0, "48M", extra);
        let fs = Fs::open_path(&img.0, opts.clone()).unwrap();
        let mut m = Model::default();
        m.add(Node::Dir(BTreeMap::new()), 0, 2);
        m.nlink[0] = 3; // ".", "..", lost+found's ".."
        Run { img, fs, m, opts }
    }

    fn apply(&mut self, op: &Op) {
        let fs = &self.fs;
        let m = &mut self.m;
        match *op {
            Op::Create(d, n) | Op::Mkdir(d, n) | Op::Symlink(d, n, _) => {
                let dir = pick(&m.dirs(), d).unwrap();
                let nm = name(n);
                let dino = m.ino[dir];
                let r = match *op {
                    Op::Create(..) => fs.create(dino, &nm, 0o644, 0, 0),
                    Op::Mkdir(..) => fs.mkdir(dino, &nm, 0o755, 0, 0),
                    Op::Symlink(_, _, l) => fs.symlink(dino, &nm, &vec![b'x'; l as usize], 0, 0),
                    _ => unreachable!(),
                };
                if m.children(dir).contains_key(&nm) {
                    return expect_err(r, Error::Exists, op);
                }
                let attr = r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
                let node = match *op {
                    Op::Create(..) => Node::File(Vec::new()),
                    Op::Mkdir(..) => Node::Dir(BTreeMap::new()),
                    Op::Symlink(_, _, l) => Node::Symlink(vec![b'x'; l as usize]),
                    _ => unreachable!(),
                };
                let is_dir = matches!(node, Node::Dir(_));
                let id = m.add(node, dir, attr.ino);
                if is_dir {
                    m.nlink[id] = 2;
                    m.nlink[dir] += 1;
                }
                if let Node::Dir(c) = &mut m.nodes[dir] {
                    c.insert(nm, id);
                }
            }
            Op::Write(f, off, len, byte) => {
                let Some(id) = pick(&m.files(), f) else {
                    return;
                };
                let data = vec![byte | 1; len as usize];
                let n = fs
                    .write(m.ino[id], off as u64, &data)
                    .unwrap_or_else(|e| panic!("{op:?}: {e}"));
                assert_eq!(n, data.len());
                if let Node::File(v) = &mut m.nodes[id] {
                    let end = off as usize + data.len();
                    if v.len() < end {
                        v.resize(end, 0);
                    }
                    v[off as usize..end].copy_from_slice(&data);
                }
            }
            Op::Truncate(f, size) => {
                let Some(id) = pick(&m.files(), f) else {
                    return;
                };
                fs.truncate(m.ino[id], size as u64)
                    .unwrap_or_else(|e| panic!("{op:?}: {e}"));
                if let Node::File(v) = &mut m.nodes[id] {
                    v.resize(size as usize, 0);
                }
            }
            Op::Punch(f, off, len) => {
                let Some(id) = pick(&m.files(), f) else {
                    return;
                };
                fs.fallocate(m.ino[id], 0x01 | 0x02, off as u64, len as u64)
                    .unwrap_or_else(|e| panic!("{op:?}: {e}"));
                if let Node::File(v) = &mut m.nodes[id] {
                    let s = (off as usize).min(v.len());
                    let e = (off as usize + len as usize).min(v.len());
                    v[s..e].fill(0);
                }
            }
            Op::Unlink(d, n) | Op::Rmdir(d, n) => {
                let dir = pick(&m.dirs(), d).unwrap();
                let names: Vec<Vec<u8>> = m.children(dir).keys().cloned().collect();
                let nm = pick(&names.iter().collect::<Vec<_>>(), n)
                    .cloned()
                    .unwrap_or_else(|| name(n));
                let dino = m.ino[dir];
                let target = m.children(dir).get(&nm).copied();
                let rmdir = matches!(op, Op::Rmdir(..));
                let r = if rmdir {
                    fs.rmdir(dino, &nm)
                } else {
                    fs.unlink(dino, &nm)
                };
                let Some(id) = target else {
                    return expect_err(r, Error::NotFound, op);
                };
                let is_dir = matches!(m.nodes[id], Node::Dir(_));
                if rmdir && !is_dir {
                    return expect_err(r, Error::NotDir, op);
                }
                if !rmdir && is_dir {
                    return expect_err(r, Error::IsDir, op);
                }
                if is_dir && !m.children(id).is_empty() {
                    return expect_err(r, Error::NotEmpty, op);
                }
                r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
                if let Node::Dir(c) = &mut m.nodes[dir] {
                    c.remove(&nm);
                }
                if is_dir {
                    m.nlink[dir] -= 1;
                } else {
                    m.nlink[id] -= 1;
                }
            }
            Op::Link(f, d, n) => {
                let Some(id) = pick(&m.files(), f) else {
                    return;
                };
                let dir = pick(&m.dirs(), d).unwrap();
                let nm = name(n);
                let r = fs.link(m.ino[id], m.ino[dir], &nm);
                if m.children(dir).contains_key(&nm) {
                    return expect_err(r, Error::Exists, op);
                }
                r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
                m.nlink[id] += 1;
                if let Node::Dir(c) = &mut m.nodes[dir] {
                    c.insert(nm, id);
                }
            }
            Op::Rename(sd, sn, dd, dn, noreplace) => {
                let dirs = m.dirs();
                let sdir = pick(&dirs, sd).unwrap();
                let ddir = pick(&dirs, dd).unwrap();
                let names: Vec<Vec<u8>> = m.children(sdir).keys().cloned().collect();
                let Some(snm) = pick(&names.iter().collect::<Vec<_>>(), sn).cloned() else {
                    return;
                };
                let dnm = name(dn);
                let src = m.children(sdir)[&snm];
                let dst = m.children(ddir).get(&dnm).copied();
                let flags = RenameFlags {
                    noreplace,
                    exchange: false,
                };
                let r = fs.rename(m.ino[sdir], &snm, m.ino[ddir], &dnm, flags);
                let src_dir = matches!(m.nodes[src], Node::Dir(_));
                if dst == Some(src) {
                    if noreplace {
                        return expect_err(r, Error::Exists, op);
                    }
                    return r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
                }
                if noreplace && dst.is_some() {
                    return expect_err(r, Error::Exists, op);
                }
                if src_dir && sdir != ddir && m.is_ancestor(src, ddir) {
                    return expect_err(r, Error::Loop, op);
                }
                if let Some(t) = dst {
                    let t_dir = matches!(m.nodes[t], Node::Dir(_));
                    if src_dir && !t_dir {
                        return expect_err(r, Error::NotDir, op);
                    }
                    if !src_dir && t_dir {
                        return expect_err(r, Error::IsDir, op);
                    }
                    if t_dir && !m.children(t).is_empty() {
                        return expect_err(r, Error::NotEmpty, op);
                    }
                }
                r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
                if let Node::Dir(c) = &mut m.nodes[sdir] {
                    c.remove(&snm);
                }
                if let Some(t) = dst {
                    if matches!(m.nodes[t], Node::Dir(_)) {
                        m.nlink[ddir] -= 1;
                    } else {
                        m.nlink[t] -= 1;
                    }
                }
                if let Node::Dir(c) = &mut m.nodes[ddir] {
                    c.insert(dnm, src);
                }
                if src_dir {
                    m.nlink[sdir] -= 1;
                    m.nlink[ddir] += 1;
                    m.parent[src] = ddir;
                }
            }
            Op::Remount => self.remount(),
        }
    }

    fn remount(&mut self) {
        self.fs.unmount().unwrap();
        self.fs = Fs::open_path(&self.img.0, self.opts.clone()).unwrap();
    }

    fn compare(&self) {
        let fs = &self.fs;
        let m = &self.m;
        for d in m.dirs() {
            let mut seen = BTreeMap::new();
            let mut off = 0;
            loop {
                let mut batch = Vec::new();
                fs.readdir(m.ino[d], off, &mut |e| {
                    batch.push(e);
                    batch.len() < 7
                })
                .unwrap();
                if batch.is_empty() {
                    break;
                }
                off = batch.last().unwrap().next_offset;
                for e in batch {
                    if e.name != b"." && e.name != b".." && !(d == 0 && e.name == b"lost+found") {
                        assert!(
                            seen.insert(e.name.clone(), e.ino).is_none(),
                            "readdir returned {:?} twice",
                            e.name
                        );
                    }
                }
            }
            let want: BTreeMap<Vec<u8>, u32> = m
                .children(d)
                .iter()
                .map(|(k, &v)| (k.clone(), m.ino[v]))
                .collect();
            assert_eq!(seen, want, "directory listing of model node {d}");
            for (nm, &id) in m.children(d) {
                let a = fs.lookup(m.ino[d], nm).unwrap();
                assert_eq!(a.ino, m.ino[id]);
                assert_eq!(
                    a.nlink,
                    m.nlink[id],
                    "nlink of {:?}",
                    String::from_utf8_lossy(nm)
                );
                match &m.nodes[id] {
                    Node::File(data) => {
                        assert_eq!(
                            a.size,
                            data.len() as u64,
                            "size of {:?}",
                            String::from_utf8_lossy(nm)
                        );
                        let mut buf = vec![0u8; data.len() + 10];
                        let n = fs.read(a.ino, 0, &mut buf).unwrap();
                        assert_eq!(n, data.len());
                        assert!(
                            buf[..n] == data[..],
                            "content of {:?} differs",
                            String::from_utf8_lossy(nm)
                        );
                    }
                    Node::Symlink(t) => assert_eq!(&fs.readlink(a.ino).unwrap(), t),
                    Node::Dir(_) => assert!(a.is_dir()),
                }
            }
        }
    }
}

fn run_case(ops: &[Op], extra: &[&str]) {
    run_case_with(ops, extra, MountOptions::default())
}

fn run_case_with(ops: &[Op], extra: &[&str], opts: MountOptions) {
    let mut r = Run::with_options(extra, opts);
    for op in ops {
        r.apply(op);
    }
    r.compare();
    r.fs.unmount().unwrap();
    e2fsck_clean(&r.img.0);
    r.fs = Fs::open_path(&r.img.0, MountOptions::default()).unwrap();
    r.compare();
    r.fs.unmount().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 200, ..ProptestConfig::default() })]
    #[test]
    fn random_ops_4k(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        run_case(&ops, &[]);
    }
    #[test]
    // pread/pwrite on the image (the other cases, on /dev/shm, map it).
    fn random_ops_1k_no_csum(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        run_case_with(&ops, &["-b", "1024", "-O", "^metadata_csum,^64bit"], MountOptions {
            map_tmpfs: false,
            ..MountOptions::default()
        });
    }
    #[test]
    fn random_ops_csum_seed_orphan_file(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        run_case(&ops, &["-O", "metadata_csum_seed,orphan_file"]);
    }
    /// Buffered mode (delayed allocation), with a 64 KiB cache limit so that writes also
    /// trigger writeback of their own and other files.
    #[test]
    fn random_ops_buffered(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        run_case_with(&ops, &[], MountOptions {
            buffered: true,
            buffered_limit_bytes: 64 << 10,
            ..MountOptions::default()
        });
    }
    #[test]
    fn random_ops_uninit_bg_no_64bit(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        run_case(&ops, &["-O", "^metadata_csum,uninit_bg,^64bit,^flex_bg"]);
    }
}

#[test]
fn many_names_in_one_directory() {
    let mut r = Run::new(&[]);
    let names: HashMap<u32, Vec<u8>> = (0..3000u32)
        .map(|i| {
            (
                i,
                format!("file-{i:05}-{}", "x".repeat((i % 40) as usize)).into_bytes(),
            )
        })
        .collect();
    let d = r.fs.mkdir(2, b"big", 0o755, 0, 0).unwrap().ino;
    for i in 0..3000u32 {
        r.fs.create(d, &names[&i], 0o644, 0, 0).unwrap();
    }
    for i in (0..3000u32).step_by(3) {
        r.fs.unlink(d, &names[&i]).unwrap();
    }
    for i in 0..3000u32 {
        let res = r.fs.lookup(d, &names[&i]);
        if i % 3 == 0 {
            assert!(matches!(res, Err(Error::NotFound)));
        } else {
            res.unwrap();
        }
    }
    r.fs.unmount().unwrap();
    e2fsck_clean(&r.img.0);
    let _ = &mut r.m;
}
