//! The metadata workload family: what containers and CI do to a mount all day. On one fresh
//! image per system, each timed separately and in this order:
//!
//! - `untar`: unpack a tree as tar does (mkdir; create, write, fchown, fchmod, futimens, close;
//!   symlink, lchown, utimensat; link; the directories' attributes last), then syncfs;
//! - `stat-walk`: list every directory and lstat every entry, as `find -printf '%s %m'` does;
//! - `read-all`: list every directory and read every regular file, as `grep -r` does;
//! - `cp-a`: copy the tree within the mount as `cp -a` does (lstat and listxattr every source
//!   entry; read and write the data; the same owner, mode and times; hard links kept);
//! - `pkg-install`: the package manager's pattern for up to 2,000 files (200 with --quick): write
//!   a temporary file beside the target, fsync, rename over the target, chmod, chown, utimes;
//! - `rm-rf`: remove both trees (list, unlink, rmdir), then syncfs.
//!
//! The operations are made here (std::fs and libc calls, single-threaded as tar, cp and find
//! are), so they are the same for every system and need no external tool; uext4-lib makes the
//! same sequence through the engine's API (lookups where the kernel would look a name up, open
//! and release around data). Data moves in 128 KiB calls, as cp and grep do.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;
use uext4::Fs;

mod engine;
mod perf;
mod posix;

pub use engine::Lib;
pub use perf::PerfCounter;
pub use posix::Posix;

/// The family, in the order it runs.
pub const WORKLOADS: &[&str] = &[
    "untar",
    "stat-walk",
    "read-all",
    "cp-a",
    "pkg-install",
    "rm-rf",
];

/// The systems that run the family: the kernel's ext4, fuse2fs, uext4 through FUSE (default
/// options and writeback_cache) and in-process, tmpfs (raw: the storage's ceiling) and the
/// in-memory FUSE server (fuse-mem: the transport's ceiling).
pub const SYSTEMS: &[&str] = &[
    "raw",
    "fuse-mem",
    "kernel",
    "fuse2fs",
    "uext4-fuse",
    "uext4-fuse-wbc",
    "uext4-fuse-dev",
    "uext4-fuse-uring",
    "uext4-fuse-noopen",
    "uext4-lib",
];

/// The size of a data call (cp's and grep's buffer).
const CHUNK: usize = 128 << 10;

// ---------------------------------------------------------------------------------------------
// The tree

#[derive(Clone, Debug)]
pub enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
    /// A hard link to an earlier entry (its index).
    HardLink(usize),
}

#[derive(Clone, Debug)]
pub struct Entry {
    /// Relative, '/'-separated, parents before children.
    pub path: String,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
}

pub struct Tree {
    pub entries: Vec<Entry>,
    /// Where it came from, for the report.
    pub source: String,
}

impl Tree {
    pub fn data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match &e.kind {
                Kind::File(d) => d.len() as u64,
                _ => 0,
            })
            .sum()
    }

    /// "10,000 entries (1,000 directories, 8,800 files, 180 symlinks, 20 hard links), 70 MB".
    pub fn summary(&self) -> String {
        let mut c = [0usize; 4];
        for e in &self.entries {
            c[match e.kind {
                Kind::Dir => 0,
                Kind::File(_) => 1,
                Kind::Symlink(_) => 2,
                Kind::HardLink(_) => 3,
            }] += 1;
        }
        format!(
            "{} entries ({} directories, {} files, {} symlinks, {} hard links), {:.1} MB of data",
            self.entries.len(),
            c[0],
            c[1],
            c[2],
            c[3],
            self.data_bytes() as f64 / 1e6
        )
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A standard normal deviate (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(1e-12);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

const EXTS: &[&str] = &[
    ".rs", ".c", ".h", ".py", ".md", ".txt", ".json", ".toml", ".js", ".go", "", ".html", ".sh",
];
const STEMS: &[&str] = &[
    "mod", "lib", "util", "test", "main", "config", "parser", "index", "types", "error", "io",
    "build", "README", "setup", "core", "handler", "client", "server", "data", "common",
];

/// A source tree made deterministically from `seed`, with about `entries` entries in the shape
/// of a real one: 10% directories (nested up to 10 deep, unevenly filled), 2% symbolic links,
/// 0.3% hard links, the rest regular files whose sizes are log-normal around a median of
/// 4 KiB (2% empty, 0.2% of 256 KiB to 1 MiB); owner 1000:1000, modes 644 (10% 755) and 755.
pub fn generate(entries: usize, seed: u64) -> Tree {
    let mut rng = Rng(seed | 1);
    let ndirs = (entries / 10).max(2);
    let nsym = entries / 50;
    let nhard = (entries / 300).max(1);
    let nfiles = entries.saturating_sub(ndirs + nsym + nhard).max(1);
    let parent = dir_parents(&mut rng, ndirs);
    // What goes into each directory: files skewed towards some directories (squared draw).
    #[derive(Clone, Copy)]
    enum Slot {
        File,
        Sym,
        Hard,
    }
    let mut slots: Vec<Vec<Slot>> = vec![Vec::new(); ndirs + 1];
    let mut weights: Vec<u64> = (0..=ndirs).map(|_| 1 + rng.below(8).pow(2)).collect();
    weights[0] += 8;
    let total: u64 = weights.iter().sum();
    let pick = |rng: &mut Rng| {
        let mut x = rng.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        0
    };
    for (n, s) in [(nfiles, Slot::File), (nsym, Slot::Sym), (nhard, Slot::Hard)] {
        for _ in 0..n {
            let d = pick(&mut rng);
            slots[d].push(s);
        }
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); ndirs + 1];
    for d in 1..=ndirs {
        children[parent[d]].push(d);
    }
    let mut out: Vec<Entry> = Vec::with_capacity(entries);
    let mut files_so_far: Vec<usize> = Vec::new();
    let base_time = 1_700_000_000i64;
    // Depth first, as tar lists a directory: the directory, its files, then its subdirectories.
    let mut stack: Vec<(usize, String)> = vec![(0, String::new())];
    let mut counter = 0usize;
    while let Some((d, path)) = stack.pop() {
        let join = |name: &str| {
            if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}/{name}")
            }
        };
        if d > 0 {
            out.push(Entry {
                path: path.clone(),
                kind: Kind::Dir,
                mode: 0o755,
                uid: 1000,
                gid: 1000,
                mtime: base_time + rng.below(10_000_000) as i64,
            });
        }
        let mut siblings: Vec<String> = Vec::new();
        for s in slots[d].clone() {
            counter += 1;
            let mtime = base_time + rng.below(10_000_000) as i64;
            let stem = STEMS[rng.below(STEMS.len() as u64) as usize];
            match s {
                Slot::File => {
                    let ext = EXTS[rng.below(EXTS.len() as u64) as usize];
                    let name = format!("{stem}_{counter}{ext}");
                    let data = file_data(&mut rng);
                    files_so_far.push(out.len());
                    siblings.push(name.clone());
                    out.push(Entry {
                        path: join(&name),
                        kind: Kind::File(data),
                        mode: if rng.below(10) == 0 { 0o755 } else { 0o644 },
                        uid: 1000,
                        gid: 1000,
                        mtime,
                    });
                }
                Slot::Sym => {
                    let target = match siblings.len() {
                        0 => format!("../{stem}_{counter}.missing"),
                        n => siblings[rng.below(n as u64) as usize].clone(),
                    };
                    out.push(Entry {
                        path: join(&format!("{stem}_{counter}.link")),
                        kind: Kind::Symlink(target.into_bytes()),
                        mode: 0o777,
                        uid: 1000,
                        gid: 1000,
                        mtime,
                    });
                }
                Slot::Hard if !files_so_far.is_empty() => {
                    let t = files_so_far[rng.below(files_so_far.len() as u64) as usize];
                    let e = &out[t];
                    let (mode, mt) = (e.mode, e.mtime);
                    out.push(Entry {
                        path: join(&format!("{stem}_{counter}.hard")),
                        kind: Kind::HardLink(t),
                        mode,
                        uid: 1000,
                        gid: 1000,
                        mtime: mt,
                    });
                }
                Slot::Hard => {}
            }
        }
        for &c in children[d].iter().rev() {
            let name = format!("{}_{c}", STEMS[rng.below(STEMS.len() as u64) as usize]);
            stack.push((c, join(&name)));
        }
    }
    Tree {
        entries: out,
        source: format!("generated (seed {seed})"),
    }
}

/// The parent of each directory of a generated tree: directory d > 0 hangs under an earlier
/// one, most often a recent one (depth), at most 10 deep. Directory 0 is the tree's top (not
/// an entry).
fn dir_parents(rng: &mut Rng, ndirs: usize) -> Vec<usize> {
    let mut parent = vec![0usize; ndirs + 1];
    let mut depth = vec![0usize; ndirs + 1];
    for d in 1..=ndirs {
        let mut p = if rng.below(2) == 0 {
            d - 1 - rng.below(d.min(6) as u64) as usize
        } else {
            rng.below(d as u64) as usize
        };
        while depth[p] >= 10 {
            p = parent[p];
        }
        parent[d] = p;
        depth[d] = depth[p] + 1;
    }
    parent
}

/// A generated file's contents: text-like bytes, their length log-normal around 4 KiB (2%
/// empty, 0.2% of 256 KiB to 1 MiB).
fn file_data(rng: &mut Rng) -> Vec<u8> {
    let r = rng.below(1000);
    let size = if r < 20 {
        0
    } else if r < 22 {
        (256 << 10) + rng.below(768 << 10) as usize
    } else {
        ((4096.0 * (1.0 * rng.normal()).exp()) as usize).clamp(1, 1 << 20)
    };
    let mut data = Vec::with_capacity(size + 8);
    while data.len() < size {
        let v = rng.next();
        // Text-like bytes.
        data.extend(v.to_le_bytes().iter().map(|b| b' ' + (b % 94)));
    }
    data.truncate(size);
    data
}

/// Checks a relative path from a tarball or a folder: no absolute paths, no "..".
fn clean_path(p: &Path) -> Result<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(s) => parts.push(
                s.to_str()
                    .ok_or_else(|| anyhow!("{}: the name is not UTF-8", p.display()))?
                    .to_string(),
            ),
            std::path::Component::CurDir | std::path::Component::RootDir => {}
            _ => bail!("{}: a path with \"..\" is not extracted", p.display()),
        }
    }
    Ok(parts.join("/"))
}

/// The tree given by `--tree`: a folder (read whole into memory) or an uncompressed tarball.
pub fn load(path: &Path) -> Result<Tree> {
    let md = std::fs::metadata(path).with_context(|| format!("--tree {}", path.display()))?;
    let mut b = Builder::default();
    if md.is_dir() {
        b.walk_dir(path, "")?;
    } else {
        let f = std::fs::File::open(path).with_context(|| format!("--tree {}", path.display()))?;
        b.read_tar(f).with_context(|| {
            format!(
                "--tree {}: not a readable tar archive (compressed ones: decompress first)",
                path.display()
            )
        })?;
    }
    if b.entries.is_empty() {
        bail!("--tree {}: nothing to unpack", path.display());
    }
    Ok(Tree {
        entries: b.entries,
        source: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    })
}

#[derive(Default)]
struct Builder {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    /// (device, inode) of the folder's multiply-linked files already taken.
    inodes: HashMap<(u64, u64), usize>,
}

impl Builder {
    fn push(&mut self, e: Entry) -> Result<()> {
        if e.path.is_empty() {
            return Ok(());
        }
        if let Some((parent, _)) = e.path.rsplit_once('/') {
            if !self.index.contains_key(parent) {
                self.push(Entry {
                    path: parent.to_string(),
                    kind: Kind::Dir,
                    mode: 0o755,
                    uid: e.uid,
                    gid: e.gid,
                    mtime: e.mtime,
                })?;
            }
        }
        match self.index.get(&e.path) {
            // A directory listed after an entry inside it (or twice): its attributes.
            Some(&i)
                if matches!(self.entries[i].kind, Kind::Dir) && matches!(e.kind, Kind::Dir) =>
            {
                self.entries[i] = e;
            }
            Some(_) => bail!("{}: listed twice", e.path),
            None => {
                self.index.insert(e.path.clone(), self.entries.len());
                self.entries.push(e);
            }
        }
        Ok(())
    }

    fn walk_dir(&mut self, dir: &Path, rel: &str) -> Result<()> {
        let mut names: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
            .with_context(|| dir.display().to_string())?
            .collect::<std::io::Result<_>>()
            .with_context(|| dir.display().to_string())?;
        names.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for de in names {
            let p = de.path();
            let md = std::fs::symlink_metadata(&p).with_context(|| p.display().to_string())?;
            let name = clean_path(Path::new(&de.file_name()))?;
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                subdirs.push((p.clone(), path.clone()));
                Kind::Dir
            } else if ft.is_symlink() {
                Kind::Symlink(
                    std::fs::read_link(&p)
                        .with_context(|| p.display().to_string())?
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else if ft.is_file() {
                match self.inodes.get(&(md.dev(), md.ino())) {
                    Some(&i) => Kind::HardLink(i),
                    None => {
                        if md.nlink() > 1 {
                            self.inodes.insert((md.dev(), md.ino()), self.entries.len());
                        }
                        Kind::File(std::fs::read(&p).with_context(|| p.display().to_string())?)
                    }
                }
            } else {
                continue; // devices, fifos and sockets are not part of a source tree
            };
            self.push(Entry {
                path,
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                mtime: md.mtime(),
            })?;
        }
        // Depth first, as tar lists: this folder's entries, then each subfolder's.
        for (p, path) in subdirs {
            self.walk_dir(&p, &path)?;
        }
        Ok(())
    }

    fn read_tar(&mut self, f: std::fs::File) -> Result<()> {
        let mut ar = tar::Archive::new(std::io::BufReader::new(f));
        for e in ar.entries()? {
            let mut e = e?;
            let path = clean_path(&e.path()?)?;
            let h = e.header();
            let (mode, uid, gid, mtime) = (
                h.mode()? & 0o7777,
                h.uid()? as u32,
                h.gid()? as u32,
                h.mtime()? as i64,
            );
            let kind = match h.entry_type() {
                tar::EntryType::Directory => Kind::Dir,
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mut data = Vec::with_capacity(e.size() as usize);
                    e.read_to_end(&mut data)?;
                    Kind::File(data)
                }
                tar::EntryType::Symlink => Kind::Symlink(
                    e.link_name_bytes()
                        .ok_or_else(|| anyhow!("{path}: a symlink without a target"))?
                        .to_vec(),
                ),
                tar::EntryType::Link => {
                    let target = e
                        .link_name()?
                        .ok_or_else(|| anyhow!("{path}: a hard link without a target"))?;
                    let target = clean_path(&target)?;
                    let i = *self.index.get(&target).ok_or_else(|| {
                        anyhow!("{path}: hard link to {target}, which comes later or not at all")
                    })?;
                    let i = match self.entries[i].kind {
                        Kind::HardLink(j) => j,
                        Kind::File(_) => i,
                        _ => bail!("{path}: hard link to {target}, which is not a file"),
                    };
                    Kind::HardLink(i)
                }
                _ => continue, // devices, fifos, PAX and GNU headers the crate did not fold in
            };
            self.push(Entry {
                path,
                kind,
                mode,
                uid,
                gid,
                mtime,
            })?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The operations, through a mount (paths) or the engine (inode numbers)

/// A node: its path for a mount, its inode number for the engine.
#[derive(Clone, Debug)]
pub struct H {
    path: PathBuf,
    ino: u32,
}

impl H {
    fn child(&self, name: &str, ino: u32) -> H {
        H {
            path: self.path.join(name),
            ino,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EKind {
    Dir,
    File,
    Symlink,
    Other,
}

#[derive(Clone, Copy, Debug)]
pub struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
}

#[derive(Clone, Copy, Debug)]
pub struct Stat {
    ino: u64,
    nlink: u64,
    kind: EKind,
    attrs: Attrs,
}

/// The calls the workloads make, each one system call (or its engine equivalent).
pub trait Ops {
    fn top(&self) -> H;
    fn mkdir(&self, parent: &H, name: &str, mode: u32) -> Result<H>;
    /// tar's and cp's file: create exclusively, write, fchown, fchmod, futimens, close.
    fn put_file(&self, parent: &H, name: &str, data: &[u8], a: &Attrs) -> Result<H>;
    /// symlink, lchown, utimensat without following.
    fn symlink(&self, parent: &H, name: &str, target: &[u8], a: &Attrs) -> Result<H>;
    fn link(&self, target: &H, parent: &H, name: &str) -> Result<H>;
    /// chown, chmod, utimensat by path (a directory's attributes after its contents).
    fn set_attrs(&self, h: &H, a: &Attrs) -> Result<()>;
    /// The directory's entries (getdents: names and types, no stat).
    fn list(&self, dir: &H) -> Result<Vec<(String, EKind, H)>>;
    fn lstat(&self, parent: &H, name: &str, h: &H) -> Result<Stat>;
    /// open, read to the end in CHUNK calls, close; the data lands in `buf`.
    fn read_file(&self, h: &H, buf: &mut Vec<u8>) -> Result<()>;
    fn readlink(&self, h: &H) -> Result<Vec<u8>>;
    fn listxattr(&self, h: &H) -> Result<()>;
    /// The package manager's: write `tmp`, fsync, close, rename over `name`, chmod, chown, utimes.
    fn replace_file(&self, dir: &H, tmp: &str, name: &str, data: &[u8], a: &Attrs) -> Result<()>;
    fn unlink(&self, parent: &H, name: &str) -> Result<()>;
    fn rmdir(&self, parent: &H, name: &str) -> Result<()>;
    fn syncfs(&self) -> Result<()>;
    /// What went wrong without stopping the workload since the last call (a syncfs error).
    fn take_warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

// ---------------------------------------------------------------------------------------------
// The workloads

/// The folder the tree is unpacked into, and the copy's.
const TOP: &str = "tree";
const COPY: &str = "tree.copy";

fn attrs_of(e: &Entry) -> Attrs {
    Attrs {
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        mtime: (e.mtime, 0),
    }
}

/// What `untar` leaves for `pkg-install`: each regular file's directory and name.
pub struct Unpacked {
    files: Vec<(H, String, usize)>,
}

fn untar(ops: &dyn Ops, tree: &Tree) -> Result<Unpacked> {
    let top = ops.mkdir(&ops.top(), TOP, 0o755)?;
    let mut handles: Vec<Option<H>> = vec![None; tree.entries.len()];
    let mut dirs: HashMap<&str, H> = HashMap::new();
    dirs.insert("", top.clone());
    let mut dir_attrs: Vec<(H, Attrs)> = Vec::new();
    let mut files = Vec::new();
    for (i, e) in tree.entries.iter().enumerate() {
        let (parent, name) = e.path.rsplit_once('/').unwrap_or(("", e.path.as_str()));
        let p = dirs
            .get(parent)
            .ok_or_else(|| anyhow!("{}: its folder is not in the tree", e.path))?
            .clone();
        let a = attrs_of(e);
        let h = match &e.kind {
            Kind::Dir => {
                let h = ops.mkdir(&p, name, 0o700)?;
                dirs.insert(e.path.as_str(), h.clone());
                dir_attrs.push((h.clone(), a));
                h
            }
            Kind::File(data) => {
                files.push((p.clone(), name.to_string(), i));
                ops.put_file(&p, name, data, &a)?
            }
            Kind::Symlink(t) => ops.symlink(&p, name, t, &a)?,
            Kind::HardLink(t) => {
                let target = handles[*t]
                    .as_ref()
                    .ok_or_else(|| anyhow!("{}: hard link before its target", e.path))?;
                ops.link(target, &p, name)?
            }
        };
        handles[i] = Some(h);
    }
    // tar sets a directory's attributes once its contents are in (deepest first).
    for (h, a) in dir_attrs.iter().rev() {
        ops.set_attrs(h, a)?;
    }
    ops.syncfs()?;
    Ok(Unpacked { files })
}

fn stat_walk(ops: &dyn Ops, dir: &H) -> Result<u64> {
    let mut n = 0;
    for (name, _, h) in ops.list(dir)? {
        let st = ops.lstat(dir, &name, &h)?;
        n += 1;
        if st.kind == EKind::Dir {
            n += stat_walk(ops, &h)?;
        }
    }
    Ok(n)
}

fn read_all(ops: &dyn Ops, dir: &H, buf: &mut Vec<u8>) -> Result<(u64, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for (_, kind, h) in ops.list(dir)? {
        n += 1;
        match kind {
            EKind::Dir => {
                let (a, b) = read_all(ops, &h, buf)?;
                n += a;
                bytes += b;
            }
            EKind::File => {
                ops.read_file(&h, buf)?;
                bytes += buf.len() as u64;
            }
            _ => {}
        }
    }
    Ok((n, bytes))
}

/// cp -a's copy of `src` (a directory) into the new `dst`: every entry lstat'ed and its xattrs
/// listed; hard links kept (by the source's inode number).
fn copy_tree(
    ops: &dyn Ops,
    src: &H,
    dst: &H,
    links: &mut HashMap<u64, H>,
    buf: &mut Vec<u8>,
) -> Result<u64> {
    let mut n = 0;
    for (name, _, h) in ops.list(src)? {
        let st = ops.lstat(src, &name, &h)?;
        ops.listxattr(&h)?;
        n += 1;
        match st.kind {
            EKind::Dir => {
                let d = ops.mkdir(dst, &name, 0o700)?;
                n += copy_tree(ops, &h, &d, links, buf)?;
                ops.set_attrs(&d, &st.attrs)?;
            }
            EKind::File => {
                if let Some(t) = links.get(&st.ino) {
                    ops.link(t, dst, &name)?;
                    continue;
                }
                ops.read_file(&h, buf)?;
                let c = ops.put_file(dst, &name, buf, &st.attrs)?;
                if st.nlink > 1 {
                    links.insert(st.ino, c);
                }
            }
            EKind::Symlink => {
                let t = ops.readlink(&h)?;
                ops.symlink(dst, &name, &t, &st.attrs)?;
            }
            EKind::Other => {}
        }
    }
    Ok(n)
}

fn cp_a(ops: &dyn Ops, buf: &mut Vec<u8>) -> Result<u64> {
    let root = ops.top();
    let src = top_of(ops)?;
    let st = ops.lstat(&root, TOP, &src)?;
    ops.listxattr(&src)?;
    let dst = ops.mkdir(&root, COPY, 0o700)?;
    let n = copy_tree(ops, &src, &dst, &mut HashMap::new(), buf)?;
    ops.set_attrs(&dst, &st.attrs)?;
    Ok(n + 1)
}

/// How many files pkg-install replaces: evenly spread over the tree's regular files.
pub fn pkg_count(quick: bool) -> usize {
    if quick {
        200
    } else {
        2000
    }
}

fn pkg_install(ops: &dyn Ops, tree: &Tree, u: &Unpacked, quick: bool) -> Result<u64> {
    let want = pkg_count(quick).min(u.files.len());
    if want == 0 {
        return Ok(0);
    }
    let step = u.files.len() / want;
    let mut n = 0;
    for (k, (dir, name, i)) in u.files.iter().step_by(step.max(1)).take(want).enumerate() {
        let e = &tree.entries[*i];
        let Kind::File(data) = &e.kind else { continue };
        let tmp = format!(".{name}.tmp{k}");
        ops.replace_file(dir, &tmp, name, data, &attrs_of(e))?;
        n += 1;
    }
    Ok(n)
}

fn rm_tree(ops: &dyn Ops, dir: &H) -> Result<u64> {
    let mut n = 0;
    for (name, kind, h) in ops.list(dir)? {
        n += 1;
        if kind == EKind::Dir {
            n += rm_tree(ops, &h)?;
            ops.rmdir(dir, &name)?;
        } else {
            ops.unlink(dir, &name)?;
        }
    }
    Ok(n)
}

fn rm_rf(ops: &dyn Ops) -> Result<u64> {
    let root = ops.top();
    let mut n = 0;
    for (name, _, h) in ops.list(&root)? {
        if name == TOP || name == COPY {
            n += rm_tree(ops, &h)? + 1;
            ops.rmdir(&root, &name)?;
        }
    }
    ops.syncfs()?;
    Ok(n)
}

/// One workload's result: seconds, and the entries (files for pkg-install) it went through.
pub struct Timed {
    pub workload: &'static str,
    /// Warnings (see `Ops::take_warnings`), "; "-joined; empty when none.
    pub note: String,
    pub secs: f64,
    pub entries: u64,
    pub requests: Option<BTreeMap<String, u64>>,
}

/// Something that counts what a workload sends to the server (`ReqCounter`).
pub trait Counter {
    fn start(&mut self) -> Result<()>;
    fn stop(&mut self) -> Result<BTreeMap<String, u64>>;
}

/// A family's workloads up to the last one `selected` (each needs the ones before it).
pub fn up_to_last<'a>(family: &'a [&'a str], selected: &[String]) -> &'a [&'a str] {
    let last = family
        .iter()
        .rposition(|w| selected.iter().any(|s| s == w))
        .unwrap_or(0);
    &family[..=last]
}

/// Runs the family on `ops`: every workload in order (each needs the ones before it), and
/// returns those in `selected`. `counter`, when given, counts each one's FUSE requests.
pub fn run_family(
    ops: &dyn Ops,
    tree: &Tree,
    selected: &[String],
    quick: bool,
    mut counter: Option<&mut dyn Counter>,
) -> Result<Vec<Timed>> {
    let mut out = Vec::new();
    let mut unpacked = None;
    let mut buf = Vec::with_capacity(1 << 20);
    for &w in up_to_last(WORKLOADS, selected) {
        if let Some(c) = counter.as_mut() {
            c.start()?;
        }
        let t0 = Instant::now();
        let entries = match w {
            "untar" => {
                unpacked = Some(untar(ops, tree)?);
                tree.entries.len() as u64
            }
            "stat-walk" => stat_walk(ops, &top_of(ops)?)?,
            "read-all" => read_all(ops, &top_of(ops)?, &mut buf)?.0,
            "cp-a" => cp_a(ops, &mut buf)?,
            "pkg-install" => pkg_install(
                ops,
                tree,
                unpacked
                    .as_ref()
                    .ok_or_else(|| anyhow!("pkg-install before untar"))?,
                quick,
            )?,
            "rm-rf" => rm_rf(ops)?,
            _ => unreachable!("not a metadata workload"),
        };
        let secs = t0.elapsed().as_secs_f64();
        let requests = match counter.as_mut() {
            Some(c) => Some(c.stop()?),
            None => None,
        };
        let note = ops.take_warnings().join("; ");
        if selected.iter().any(|s| s == w) {
            out.push(Timed {
                note,
                workload: w,
                secs,
                entries,
                requests,
            });
        }
    }
    Ok(out)
}

/// The unpacked tree's top: found by listing the root (for the engine, its inode number).
fn top_of(ops: &dyn Ops) -> Result<H> {
    let root = ops.top();
    ops.list(&root)?
        .into_iter()
        .find(|(n, _, _)| n == TOP)
        .map(|(_, _, h)| h)
        .ok_or_else(|| anyhow!("the unpacked tree is gone"))
}

// ---------------------------------------------------------------------------------------------
// Counting FUSE requests from outside the server

// ---------------------------------------------------------------------------------------------
// The report

/// The metadata family's section of the report: seconds per workload and system, uext4's
/// ratios, e2fsck, and requests per entry where they were counted.
/// A Markdown table's first two lines: "workload" and one column per item.
fn table_header<T: std::fmt::Display>(s: &mut String, cols: impl Iterator<Item = T>) {
    s.push_str("| workload |");
    let mut n = 0;
    for c in cols {
        s.push_str(&format!(" {c} |"));
        n += 1;
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(n));
    s.push('\n');
}

/// The metadata family's introduction to its table.
pub fn intro(tree: &str, pkg: usize) -> String {
    format!(
        "## Metadata workloads (seconds, lower is better)\n\nTree: {tree}. One fresh image per \
         system; the workloads run in this order, single-threaded, each timed apart: untar \
         (+ syncfs), stat-walk, read-all, cp-a (within the mount), pkg-install ({pkg} files: \
         temp file, fsync, rename over, chmod, chown, utimes), rm-rf (+ syncfs). raw is a \
         tmpfs folder (the storage's ceiling), fuse-mem an in-memory FUSE server (the \
         transport's ceiling)."
    )
}

/// A one-image-per-system family's section of the report (this family's, or the tools
/// family's: `family` its workloads, `intro` its heading and paragraph).
pub fn report(
    records: &[super::Record],
    family: &[&str],
    intro: &str,
    repeat: usize,
    count_note: Option<&str>,
) -> String {
    let rs: Vec<&super::Record> = records
        .iter()
        .filter(|r| family.contains(&r.workload.as_str()))
        .collect();
    let mut s = String::new();
    s.push_str(intro);
    if repeat > 1 {
        s.push_str(&format!(
            " Each cell is the median of {repeat} runs, the systems rotated every round."
        ));
    }
    s.push_str("\n\n");
    let mut systems: Vec<&str> = SYSTEMS
        .iter()
        .copied()
        .filter(|s| rs.iter().any(|r| r.system == *s))
        .collect();
    // The reference systems first, as in the tables.
    let order = [
        "kernel",
        "fuse2fs",
        "uext4-fuse",
        "uext4-fuse-wbc",
        "uext4-fuse-dev",
        "uext4-fuse-uring",
        "uext4-fuse-noopen",
        "uext4-lib",
        "fuse-mem",
        "raw",
    ];
    systems.sort_by_key(|s| order.iter().position(|o| o == s).unwrap_or(order.len()));
    let workloads: Vec<&str> = family
        .iter()
        .copied()
        .filter(|w| rs.iter().any(|r| r.workload == *w))
        .collect();
    let secs = |sys: &str, w: &str| {
        rs.iter()
            .find(|r| r.system == sys && r.workload == w)
            .and_then(|r| r.seconds)
            .filter(|&v| v > 0.0)
    };
    let total =
        |sys: &str| -> Option<f64> { workloads.iter().map(|w| secs(sys, w)).sum::<Option<f64>>() };
    table_header(&mut s, systems.iter());
    let cell = |v: Option<f64>| match v {
        Some(v) => format!(" {v:.3} |"),
        None => " - |".to_string(),
    };
    for w in &workloads {
        s.push_str(&format!("| {w} |"));
        for sys in &systems {
            s.push_str(&cell(secs(sys, w)));
        }
        s.push('\n');
    }
    s.push_str("| total |");
    for sys in &systems {
        s.push_str(&cell(total(sys)));
    }
    s.push_str("\n\n");
    // Ratios: each uext4 system's time over the kernel's, fuse2fs's and the FUSE ceiling's.
    let mut cols: Vec<(&str, &str)> = Vec::new();
    for sys in systems.iter().filter(|s| s.starts_with("uext4")) {
        for other in ["kernel", "fuse2fs", "fuse-mem"] {
            if systems.contains(&other) && (other == "kernel" || sys.starts_with("uext4-fuse")) {
                cols.push((sys, other));
            }
        }
    }
    if !cols.is_empty() {
        table_header(&mut s, cols.iter().map(|(a, b)| format!("{a} / {b}")));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!(" {:.2}x |", a / b),
            _ => " - |".to_string(),
        };
        for w in &workloads {
            s.push_str(&format!("| {w} |"));
            for (a, b) in &cols {
                s.push_str(&ratio(secs(a, w), secs(b, w)));
            }
            s.push('\n');
        }
        s.push_str("| total |");
        for (a, b) in &cols {
            s.push_str(&ratio(total(a), total(b)));
        }
        s.push_str("\n\n");
    }
    let fsck: Vec<String> = systems
        .iter()
        .filter_map(|sys| {
            rs.iter()
                .filter(|r| r.system == *sys && r.fsck != "-")
                .map(|r| r.fsck.clone())
                .find(|f| f != "clean")
                .or_else(|| {
                    rs.iter()
                        .find(|r| r.system == *sys && r.fsck != "-")
                        .map(|r| r.fsck.clone())
                })
                .map(|f| format!("{sys} {f}"))
        })
        .collect();
    if !fsck.is_empty() {
        s.push_str(&format!(
            "e2fsck -fn after each run: {}.\n\n",
            fsck.join(", ")
        ));
    }
    if repeat > 1 {
        every_run(&mut s, &rs, &systems, &workloads);
    }
    requests_per_entry(&mut s, &rs, &systems, &workloads, count_note);
    for r in rs.iter().filter(|r| !r.note.is_empty()) {
        s.push_str(&format!("- {} {}: {}\n", r.system, r.workload, r.note));
    }
    s
}

/// Every run's seconds, so that a noisy machine shows (the median of two is the slower one),
/// and each system's spread.
fn every_run(s: &mut String, rs: &[&super::Record], systems: &[&str], workloads: &[&str]) {
    // Every run, so that a noisy machine shows: the median of two is the slower one.
    s.push_str("Every run, seconds, in measuring order:\n\n");
    table_header(s, systems.iter());
    let runs_of = |sys: &str, w: &str| -> Vec<f64> {
        rs.iter()
            .find(|r| r.system == sys && r.workload == w)
            .map(|r| r.runs.clone())
            .unwrap_or_default()
    };
    for w in workloads {
        s.push_str(&format!("| {w} |"));
        for sys in systems {
            let runs = runs_of(sys, w);
            let v: Vec<String> = runs.iter().map(|x| format!("{x:.3}")).collect();
            s.push_str(&format!(" {} |", v.join(", ")));
        }
        s.push('\n');
    }
    s.push('\n');
    s.push_str("Spread (slowest run / fastest), by workload:\n\n");
    for sys in systems {
        let sp: Vec<String> = workloads
            .iter()
            .map(|w| {
                let runs = runs_of(sys, w);
                let lo = runs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = runs.iter().copied().fold(0.0, f64::max);
                if lo > 0.0 && lo.is_finite() {
                    format!("{:.2}", hi / lo)
                } else {
                    "-".into()
                }
            })
            .collect();
        s.push_str(&format!("- {sys}: {}\n", sp.join(", ")));
    }
    s.push('\n');
}

/// FUSE requests per entry, where counted, and by opcode for uext4's FUSE systems.
fn requests_per_entry(
    s: &mut String,
    rs: &[&super::Record],
    systems: &[&str],
    workloads: &[&str],
    count_note: Option<&str>,
) {
    // FUSE requests per entry, where counted.
    let counted: Vec<&str> = systems
        .iter()
        .copied()
        .filter(|sys| rs.iter().any(|r| r.system == *sys && r.requests.is_some()))
        .collect();
    if !counted.is_empty() {
        s.push_str(
            "FUSE requests per entry (perf, fuse:fuse_request_send, a separate untimed run):\n\n",
        );
        table_header(s, counted.iter());
        for w in workloads {
            s.push_str(&format!("| {w} |"));
            for sys in &counted {
                let r = rs.iter().find(|r| r.system == *sys && r.workload == *w);
                match r.and_then(|r| Some((r.requests.as_ref()?.get("total")?, r.entries?))) {
                    Some((t, e)) if e > 0 => s.push_str(&format!(" {:.1} |", *t as f64 / e as f64)),
                    _ => s.push_str(" - |"),
                }
            }
            s.push('\n');
        }
        s.push('\n');
        for sys in counted.iter().filter(|s| s.starts_with("uext4-fuse")) {
            s.push_str(&format!("{sys}, per entry by opcode:\n\n"));
            for w in workloads {
                let Some(r) = rs.iter().find(|r| r.system == *sys && r.workload == *w) else {
                    continue;
                };
                let (Some(req), Some(e)) = (&r.requests, r.entries) else {
                    continue;
                };
                let mut ops: Vec<(&String, &u64)> =
                    req.iter().filter(|(k, _)| k.as_str() != "total").collect();
                ops.sort_by(|a, b| b.1.cmp(a.1));
                let e = e.max(1) as f64;
                let parts: Vec<String> = ops
                    .iter()
                    .filter(|(_, &n)| n as f64 / e >= 0.05)
                    .map(|(k, &n)| format!("{k} {:.2}", n as f64 / e))
                    .collect();
                s.push_str(&format!("- {w}: {}\n", parts.join(", ")));
            }
            s.push('\n');
        }
    } else if let Some(n) = count_note {
        s.push_str(&format!("{n}\n\n"));
    }
}
