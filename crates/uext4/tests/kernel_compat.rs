//! Both ways with the kernel: a tree written by uext4 mounts under the kernel's ext4 and compares
//! equal (content, mode, owner, times, xattrs, links); a tree the kernel wrote reads back equal
//! through uext4. Needs root and loop devices; says so and skips otherwise.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use uext4::format::group_desc::BG_BLOCK_UNINIT;
use uext4::Timestamp;
use uext4::XattrFlags;
use uext4::{Fs, MountOptions};
use uext4::{RenameFlags, SetAttr, TimeSet};

/// What we compare of each file: kind/mode, owner, size, mtime, nlink, content digest or link
/// target, sorted xattrs.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Entry {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, u32),
    nlink: u32,
    content: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A position-sensitive digest of a file's non-zero 4 KiB blocks (FNV-1a 64 over offset and
/// bytes), computed over the data segments only, so sparse files are cheap and hole layout does
/// not matter.
#[derive(Default)]
struct Digest(u64);

impl Digest {
    fn new() -> Self {
        Digest(0xcbf29ce484222325)
    }
    fn add(&mut self, off: u64, data: &[u8]) {
        for (i, blk) in data.chunks(4096).enumerate() {
            if blk.iter().all(|&b| b == 0) {
                continue;
            }
            for b in (off + i as u64 * 4096).to_le_bytes().iter().chain(blk) {
                self.0 ^= *b as u64;
                self.0 = self.0.wrapping_mul(0x100000001b3);
            }
        }
    }
    fn finish(self, size: u64) -> Vec<u8> {
        let mut v = self.0.to_le_bytes().to_vec();
        v.extend_from_slice(&size.to_le_bytes());
        v
    }
}

/// Digest of a host file, reading only its data segments (SEEK_DATA/SEEK_HOLE).
fn host_digest(p: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    let size = f.metadata().unwrap().len();
    let mut d = Digest::new();
    let mut pos = 0i64;
    loop {
        let data = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let mut off = data as u64;
        while off < hole as u64 {
            let n = ((hole as u64 - off).min(1 << 20)) as usize;
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, off).unwrap();
            d.add(off, &buf);
            off += n as u64;
        }
        pos = hole;
    }
    d.finish(size)
}

/// Digest of a file read through uext4, data segments only.
fn uext4_digest(fs: &Fs, ino: u32, size: u64) -> Vec<u8> {
    let mut d = Digest::new();
    let mut pos = 0u64;
    while pos < size {
        let Ok(data) = fs.lseek_data_hole(ino, pos, true) else {
            break;
        };
        let hole = fs.lseek_data_hole(ino, data, false).unwrap();
        let mut off = data;
        while off < hole {
            let n = ((hole - off).min(1 << 20)) as usize;
            let mut buf = vec![0u8; n];
            let got = fs.read(ino, off, &mut buf).unwrap();
            assert_eq!(got, n, "short read");
            d.add(off, &buf);
            off += n as u64;
        }
        pos = hole;
    }
    d.finish(size)
}

fn host_xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut out = BTreeMap::new();
    let mut names = vec![0u8; 65536];
    let n = unsafe {
        libc::llistxattr(
            c.as_ptr(),
            names.as_mut_ptr() as *mut libc::c_char,
            names.len(),
        )
    };
    if n <= 0 {
        return out;
    }
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if name == b"security.selinux" {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut val = vec![0u8; 65536];
        let m = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                val.as_mut_ptr() as *mut libc::c_void,
                val.len(),
            )
        };
        assert!(m >= 0, "lgetxattr {:?}", String::from_utf8_lossy(name));
        val.truncate(m as usize);
        out.insert(name.to_vec(), val);
    }
    out
}

fn walk_host(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if rel.is_empty() && name == "lost+found" {
                continue;
            }
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let content = if md.file_type().is_symlink() {
                std::fs::read_link(e.path())
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if md.is_file() {
                host_digest(&e.path())
            } else {
                Vec::new()
            };
            if md.is_dir() {
                stack.push(path.clone());
            }
            out.insert(
                path,
                Entry {
                    mode: md.mode(),
                    uid: md.uid(),
                    gid: md.gid(),
                    size: if md.is_dir() { 0 } else { md.size() },
                    mtime: (md.mtime(), md.mtime_nsec() as u32),
                    nlink: if md.is_dir() { 0 } else { md.nlink() as u32 },
                    content,
                    xattrs: host_xattrs(&e.path()),
                },
            );
        }
    }
    out
}

fn walk_uext4(fs: &Fs) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), 2u32)];
    while let Some((rel, ino)) = stack.pop() {
        let mut entries = Vec::new();
        fs.readdir(ino, 0, &mut |e| {
            entries.push(e);
            true
        })
        .unwrap();
        for e in entries {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "." || name == ".." || (rel.is_empty() && name == "lost+found") {
                continue;
            }
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let a = fs.getattr(e.ino).unwrap();
            let kind = a.mode as u32 & 0o170000;
            let content = if kind == 0o120000 {
                fs.readlink(e.ino).unwrap()
            } else if kind == 0o100000 {
                uext4_digest(fs, e.ino, a.size)
            } else {
                Vec::new()
            };
            if kind == 0o040000 {
                stack.push((path.clone(), e.ino));
            }
            let mut xattrs = BTreeMap::new();
            for n in fs.listxattr(e.ino).unwrap() {
                let v = fs.getxattr(e.ino, &n).unwrap();
                xattrs.insert(n, v);
            }
            out.insert(
                path,
                Entry {
                    mode: a.mode as u32,
                    uid: a.uid,
                    gid: a.gid,
                    size: if kind == 0o040000 { 0 } else { a.size },
                    mtime: (a.mtime.sec, a.mtime.nsec),
                    nlink: if kind == 0o040000 { 0 } else { a.nlink },
                    content,
                    xattrs,
                },
            );
        }
    }
    out
}

fn assert_trees_equal(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) {
    assert_eq!(a.len(), b.len(), "different number of files");
    for (k, v) in a {
        let w = b
            .get(k)
            .unwrap_or_else(|| panic!("{k} missing on one side"));
        assert_eq!(v, w, "{k} differs");
    }
}

/// A tree written by uext4 reads back identically under the kernel.
#[test]
fn uext4_tree_mounts_equal_under_kernel() {
    if !can_loop_mount() {
        return;
    }
    let big = std::env::var("UEXT4_QUICK").is_err();
    let img = scratch("kcompat-w");
    mke2fs(&img.0, "2G", &[]);
    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.mkdir(2, b"dir", 0o750, 1000, 100).unwrap().ino;
    let f = fs.create(d, b"file", 0o640, 1000, 100).unwrap().ino;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(f, 0, &data).unwrap();
    fs.link(f, 2, b"hardlink").unwrap();
    fs.symlink(d, b"fast", b"file", 0, 0).unwrap();
    fs.symlink(d, b"slow", "long/".repeat(30).as_bytes(), 0, 0)
        .unwrap();
    fs.setxattr(f, b"user.small", b"v", XattrFlags::Any)
        .unwrap();
    fs.setxattr(f, b"user.big", &vec![b'z'; 3000], XattrFlags::Any)
        .unwrap();
    fs.setxattr(d, b"trusted.t", b"tt", XattrFlags::Any)
        .unwrap();
    fs.mknod(d, b"fifo", 0o010644, 0, 0, 0).unwrap();
    // A sparse file past 64 GiB with a deep extent tree: many discontiguous blocks.
    let s = fs.create(2, b"sparse", 0o600, 0, 0).unwrap().ino;
    let nblocks = if big { 3000u64 } else { 1500 };
    for i in 0..nblocks {
        fs.write(s, i * 2 * 4096 * 7, &[i as u8 | 1; 100]).unwrap();
    }
    fs.write(s, 65 << 30, b"end of a sparse file past 64 GiB")
        .unwrap();
    let depth = fs.ext_list(s).unwrap().len();
    assert!(
        depth as u64 > 4 * 340,
        "expected enough extents for a depth-2 tree, got {depth}"
    );
    // A big directory.
    let n = if big { 100_000 } else { 5_000 };
    let bd = fs.mkdir(2, b"big", 0o755, 0, 0).unwrap().ino;
    for i in 0..n {
        fs.create(bd, format!("entry-{i:06}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    let t = Timestamp {
        sec: 1_600_000_000,
        nsec: 123_456_789,
    };
    fs.setattr(
        f,
        &SetAttr {
            mtime: Some(TimeSet::At(t)),
            atime: Some(TimeSet::At(t)),
            ..Default::default()
        },
    )
    .unwrap();
    let ours = walk_uext4(&fs);
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
    let theirs = {
        let m = KernelMount::new(&img.0);
        walk_host(&m.dir)
    };
    assert_trees_equal(&ours, &theirs);
    e2fsck_clean(&img.0);
}

/// A tree the kernel wrote reads back identically through uext4.
#[test]
fn kernel_tree_reads_equal_in_uext4() {
    if !can_loop_mount() {
        return;
    }
    let img = scratch("kcompat-r");
    mke2fs(&img.0, "512M", &[]);
    let theirs = {
        let m = KernelMount::new(&img.0);
        let r = m.dir.display();
        sh(&format!(
            "set -e; cd {r}; mkdir -p a/b/c big; \
             for i in $(seq 1 20000); do : > big/name-with-some-length-$i; done; \
             for i in $(seq 1 400); do head -c 4096 /dev/urandom >> frag1; head -c 4096 /dev/urandom >> frag2; sync frag1; done; \
             dd if=/dev/urandom of=a/b/c/data bs=1M count=3 status=none; \
             ln -s ../../frag1 a/b/link; ln frag2 a/hard; mkfifo a/fifo; \
             python3 -c \"import os; os.setxattr('frag1', 'user.k', b'v'*10); os.setxattr('frag2', 'user.big', b'q'*2000); os.setxattr('a', 'trusted.x', b'1')\"; \
             truncate -s 10G sparse; echo tail >> sparse; \
             touch -d '2001-02-03 04:05:06.789' a/b/c/data"
        ));
        walk_host(&m.dir)
    };
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let ours = walk_uext4(&fs);
    assert_trees_equal(&theirs, &ours);
}

/// ext3 (1 KiB blocks) and ext2 (4 KiB, no journal): filesystems without the extents feature,
/// whose files map their blocks with the indirect block map. uext4 writes files through every
/// level of it (direct, single, double and triple indirect blocks), a directory past its
/// twelve direct blocks, a slow symlink, a truncation and a punched hole; refuses preallocation
/// and sizes past the map's reach as the kernel does; the kernel's ext4 reads the same tree,
/// adds to it, and uext4 reads the kernel's additions back. e2fsck -fn clean at every step.
#[test]
fn block_mapped_filesystems_both_ways() {
    if !can_loop_mount() {
        return;
    }
    for (kind, bs) in [("ext3", 1024u64), ("ext2", 4096)] {
        let img = scratch(&format!("kcompat-{kind}"));
        sh(&format!(
            "mke2fs -q -F -t {kind} -b {bs} {} 256M",
            img.0.display()
        ));
        let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let per = bs / 4;
        // The first logical blocks of the double and the triple indirect trees.
        let (double_at, triple_at) = (12 + per, 12 + per + per * per);
        let pat = |n: u64, seed: u64| -> Vec<u8> {
            (0..n).map(|i| ((i * 31 + seed) % 251) as u8).collect()
        };
        let d = fs.mkdir(2, b"dir", 0o755, 0, 0).unwrap().ino;
        for i in 0..2000 {
            fs.create(d, format!("name-{i:05}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        let direct = fs.create(2, b"direct", 0o644, 0, 0).unwrap().ino;
        fs.write(direct, 0, &pat(5000, 1)).unwrap();
        // Into the double indirect tree in 64 KiB writes, cut back, written past the new end
        // over a hole, and punched.
        let double = fs.create(2, b"double", 0o644, 0, 0).unwrap().ino;
        let len = (double_at + 3 * per) * bs + 77;
        let all = pat(len, 2);
        for off in (0..len).step_by(65536) {
            let end = (off + 65536).min(len);
            fs.write(double, off, &all[off as usize..end as usize])
                .unwrap();
        }
        fs.truncate(double, len / 2).unwrap();
        fs.write(double, len / 2 + 10 * bs, &pat(3000, 3)).unwrap();
        fs.fallocate(double, 3, 3 * bs, 20 * bs).unwrap();
        // Sparse, out into the triple indirect tree.
        let sparse = fs.create(2, b"sparse", 0o600, 0, 0).unwrap().ino;
        fs.write(sparse, 0, b"head").unwrap();
        fs.write(sparse, triple_at * bs + 5, &pat(2 * bs, 4))
            .unwrap();
        fs.write(sparse, (triple_at + per * per + 7) * bs, b"far")
            .unwrap();
        fs.symlink(2, b"slow", "long/".repeat(30).as_bytes(), 0, 0)
            .unwrap();
        // No unwritten blocks in a block map; the map's reach bounds the size.
        let err = fs.fallocate(sparse, 0, 0, bs).unwrap_err();
        assert!(
            matches!(&err, uext4::Error::NotSupported(m) if m.contains("indirect block map")),
            "{kind}: {err}"
        );
        let max = fs.blockmap_max_size();
        assert!(max < fs.max_file_size(), "{kind}: {max}");
        assert!(matches!(
            fs.truncate(sparse, max + 1),
            Err(uext4::Error::FileTooBig)
        ));
        let edge = fs.create(2, b"edge", 0o644, 0, 0).unwrap().ino;
        assert_eq!(fs.write(edge, max - 10, &[9u8; 100]).unwrap(), 10);
        assert!(matches!(
            fs.write(edge, max, b"x"),
            Err(uext4::Error::FileTooBig)
        ));
        let ours = walk_uext4(&fs);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        // Block maps, not extents, and every level in use.
        let stat = |p: &str| sh(&format!("debugfs -R 'stat {p}' {} 2>&1", img.0.display()));
        assert!(stat("/double").contains("(DIND)"), "{kind}");
        assert!(stat("/sparse").contains("(TIND)"), "{kind}");
        assert!(stat("/dir").contains("(IND)"), "{kind}");
        assert!(!stat("/double").contains("EXTENTS"), "{kind}");
        let theirs = {
            let m = KernelMount::new(&img.0);
            let t = walk_host(&m.dir);
            assert_trees_equal(&ours, &t);
            sh(&format!(
                "set -e; cd {}; head -c 3000000 /dev/urandom > kernel-file; \
                 head -c 70000 /dev/urandom >> double; rm dir/name-0000*; \
                 mkdir kdir; echo x > kdir/y",
                m.dir.display()
            ));
            walk_host(&m.dir)
        };
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        assert_trees_equal(&theirs, &walk_uext4(&fs));
    }
}

/// Blocks at the start of each group that dumpe2fs lists as superblock, group descriptors or
/// reserved GDT blocks.
fn dumpe2fs_group_overheads(img: &Path) -> Vec<u32> {
    let out = sh(&format!("dumpe2fs {} 2>/dev/null", img.display()));
    let mut per_group = Vec::new();
    for line in out.lines() {
        if line.starts_with("Group ") && line.contains("(Blocks ") {
            per_group.push(0u32);
            continue;
        }
        let Some(n) = per_group.last_mut() else {
            continue;
        };
        for part in line.trim().split(", ") {
            let at = |p: &str| -> Option<u32> {
                let r = part.strip_prefix(p)?;
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                Some((b.parse::<u64>().ok()? - a.parse::<u64>().ok()? + 1) as u32)
            };
            if part.starts_with("Primary superblock at") || part.starts_with("Backup superblock at")
            {
                *n += 1;
            } else if let Some(k) = at("Group descriptor at ")
                .or_else(|| at("Group descriptors at "))
                .or_else(|| at("Reserved GDT blocks at "))
            {
                *n += k;
            }
        }
    }
    per_group
}

/// meta_bg: descriptor block n lives in the first group of the n-th run of descs_per_block
/// groups (copies in the run's second and last groups), not after the superblock. uext4 finds
/// each group's descriptor there, reserves the same blocks as dumpe2fs lists when it builds a
/// group's first bitmap, and fills the filesystem through every group; e2fsck finds it clean,
/// the kernel reads the tree equal and adds to it, uext4 reads that back. Three layouts, in small
/// groups so that a small image has several meta groups: 1 KiB blocks with 64-byte
/// descriptors (16 per block), 4 KiB blocks with 32-byte descriptors (128 per block, a short
/// last meta group), and 4 KiB without flex_bg.
#[test]
fn meta_bg_filesystems_both_ways() {
    if !can_loop_mount() {
        return;
    }
    for (name, size, opts) in [
        ("1k", "150M", "-b 1024 -g 2048 -O meta_bg,^resize_inode"),
        (
            "4k-32",
            "300M",
            "-b 4096 -g 256 -O meta_bg,^resize_inode,^64bit",
        ),
        (
            "4k-noflex",
            "150M",
            "-b 4096 -g 256 -O meta_bg,^resize_inode,^flex_bg",
        ),
    ] {
        let img = scratch(&format!("kcompat-metabg-{name}"));
        sh(&format!(
            "mke2fs -q -F -t ext4 {opts} {} {size}",
            img.0.display()
        ));
        let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let geo = fs.geo.clone();
        assert_eq!(geo.first_meta_bg, Some(0), "{name}");
        assert!(
            geo.gdt_blocks >= 3,
            "{name}: {} meta groups",
            geo.gdt_blocks
        );
        let listed = dumpe2fs_group_overheads(&img.0);
        assert_eq!(listed.len(), geo.group_count as usize, "{name}");
        for g in 0..geo.group_count {
            assert_eq!(
                geo.group_overhead(g),
                listed[g as usize],
                "{name}: group {g}"
            );
        }
        // Fill the filesystem until it is full: files in many directories, 1 MiB at a time,
        // so that every group's first bitmap is built.
        let bs = geo.block_size as u64;
        let dirs = 24u64;
        let per = fs.statfs().blocks_free * bs / dirs + (1 << 20);
        let mut full = false;
        for d in 0..dirs {
            let dir = fs
                .mkdir(2, format!("d{d}").as_bytes(), 0o755, 0, 0)
                .unwrap()
                .ino;
            for i in 0..20 {
                let f = fs
                    .create(dir, format!("s{i}").as_bytes(), 0o644, 0, 0)
                    .unwrap()
                    .ino;
                fs.write(f, 0, format!("small {d} {i}").as_bytes()).unwrap();
            }
            let f = fs.create(dir, b"big", 0o644, 0, 0).unwrap().ino;
            let chunk: Vec<u8> = (0..1u64 << 20)
                .map(|i| ((i * 13 + d) % 251) as u8)
                .collect();
            for off in (0..per).step_by(1 << 20) {
                match fs.write(f, off, &chunk) {
                    Ok(_) => {}
                    Err(uext4::Error::NoSpace) => {
                        full = true;
                        break;
                    }
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            if full {
                break;
            }
        }
        assert!(full, "{name}: never ran out of space");
        for g in 0..geo.group_count {
            let flags = fs.group_desc(g).flags();
            assert_eq!(flags & BG_BLOCK_UNINIT, 0, "{name}: group {g} never used");
        }
        let ours = walk_uext4(&fs);
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let theirs = {
            let m = KernelMount::new(&img.0);
            assert_trees_equal(&ours, &walk_host(&m.dir));
            sh(&format!(
                "set -e; cd {}; rm -r d1 d2; head -c 3000000 /dev/urandom > kernel-file; \
                 mkdir kdir; echo x > kdir/y",
                m.dir.display()
            ));
            walk_host(&m.dir)
        };
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        assert_trees_equal(&theirs, &walk_uext4(&fs));
        // What the kernel freed is written again through uext4.
        let f = fs.create(2, b"again", 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; per as usize / 2]).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
    }
}

/// Names of a directory read in pieces of `step` entries, each readdir resuming from the last
/// entry's cookie.
fn names_in_steps(fs: &Fs, dir: u32, step: usize) -> Vec<String> {
    let (mut names, mut off) = (Vec::new(), 0u64);
    loop {
        let mut got = 0;
        fs.readdir(dir, off, &mut |e| {
            names.push(String::from_utf8_lossy(&e.name).into_owned());
            off = e.next_offset;
            got += 1;
            got < step
        })
        .unwrap();
        if got < step {
            return names;
        }
    }
}

/// inline_data: the kernel keeps small files, symlinks and directories inside their inodes
/// (i_block and the "system.data" attribute). uext4 reads them equal to the kernel (readdir
/// resumed from every cookie too, and across a conversion), and changes them as the kernel
/// does: an append and a truncate that fit stay inline, a write past the inode's room and a
/// punched hole convert to a block; attributes set; names added to (inline while they fit,
/// then converting), removed from and renamed out of inline directories (their entries in
/// i_block and in the attribute), an inline directory moved to a new parent and one removed.
/// e2fsck finds each step clean, the kernel reads uext4's changes equal, and uext4 reads the
/// kernel's next changes back.
#[test]
fn inline_data_filesystems_both_ways() {
    if !can_loop_mount() {
        return;
    }
    let img = scratch("kcompat-inline");
    sh(&format!(
        "mke2fs -q -F -t ext4 -O inline_data -I 512 {} 64M",
        img.0.display()
    ));
    let theirs = {
        let m = KernelMount::new(&img.0);
        sh(&format!(
            "set -e; cd {}; mkdir -p d empty empty2 parent/child many; \
             head -c 30 /dev/urandom > d/victim; \
             : > d/zero; printf hello > d/tiny; head -c 60 /dev/urandom > d/sixty; \
             head -c 150 /dev/urandom > d/onefifty; head -c 100 /dev/urandom > d/punch; head -c 5000 /dev/urandom > d/blocks; \
             ln -s $(printf 'y%.0s' $(seq 1 90)) d/longlink; ln -s short d/shortlink; \
             echo c > parent/child/f; \
             for i in 1 2 3 4 5 6 7 8 9; do echo $i > many/name-number-$i; done; \
             for g in 0 1 2 3 4 5 6 7; do mkdir gappy$g; \
               for i in 1 2 3 4 5 6 7 8 9; do : > gappy$g/entry-$i; done; \
               rm gappy$g/entry-2 gappy$g/entry-5 gappy$g/entry-6; done; \
             setfattr -n user.k -v v d/tiny",
            m.dir.display()
        ));
        walk_host(&m.dir)
    };
    e2fsck_clean(&img.0);
    let inline_size = |p: &str| {
        sh(&format!("debugfs -R 'stat {p}' {} 2>&1", img.0.display()))
            .lines()
            .find_map(|l| l.strip_prefix("Size of inline data: "))
            .map(|v| v.trim().parse::<u32>().unwrap())
    };
    // The kernel did keep these inline, some past i_block (in the attribute).
    assert_eq!(inline_size("d/tiny"), Some(60));
    assert!(inline_size("d/onefifty").unwrap() > 60);
    assert!(inline_size("many").unwrap() > 60);
    assert!(inline_size("empty").is_some());
    assert!(inline_size("d/victim").is_some());
    assert_eq!(inline_size("d/blocks"), None);
    for g in 0..=7 {
        assert!(inline_size(&format!("gappy{g}")).is_some(), "gappy{g}");
    }

    let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_trees_equal(&theirs, &walk_uext4(&fs));
    let many = fs.lookup(2, b"many").unwrap().ino;
    let mut all = names_in_steps(&fs, many, 1000);
    all.sort();
    for step in [1, 2, 3] {
        let mut got = names_in_steps(&fs, many, step);
        got.sort();
        assert_eq!(got, all, "readdir in steps of {step}");
    }
    assert_eq!(all.len(), 11);
    assert!(matches!(
        fs.listxattr(fs.lookup(2, b"d").unwrap().ino),
        Ok(v) if v.is_empty()
    ));

    // Changes: some stay inline, some convert (see above).
    let d = fs.lookup(2, b"d").unwrap().ino;
    let ino = |dir: u32, n: &str| fs.lookup(dir, n.as_bytes()).unwrap().ino;
    fs.write(ino(d, "tiny"), 5, b", world").unwrap();
    let big: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    fs.write(ino(d, "sixty"), 30, &big).unwrap();
    fs.truncate(ino(d, "onefifty"), 70).unwrap();
    fs.fallocate(ino(d, "punch"), 3, 10, 20).unwrap();
    fs.truncate(ino(d, "zero"), 3).unwrap();
    fs.setxattr(ino(d, "shortlink"), b"trusted.t", b"1", XattrFlags::Any)
        .unwrap();
    fs.setxattr(ino(d, "longlink"), b"trusted.t", b"2", XattrFlags::Any)
        .unwrap();
    fs.create(many, b"added-by-uext4", 0o644, 0, 0).unwrap();
    // A readdir begun on the inline form and resumed after a create converted the directory
    // goes on where it stopped, from every stopping point: no name twice, none missing.
    // The kernel left gaps in these (names removed), which the conversion keeps in place.
    for g in 0..=7u32 {
        let dir = ino(2, &format!("gappy{g}"));
        let all = names_in_steps(&fs, dir, 1000);
        let (mut seen, mut cookie) = (Vec::new(), 0u64);
        fs.readdir(dir, 0, &mut |e| {
            seen.push(String::from_utf8_lossy(&e.name).into_owned());
            cookie = e.next_offset;
            seen.len() < g as usize + 1
        })
        .unwrap();
        // Enough names that the directory outgrows its 512-byte inode and converts.
        for k in 0..24 {
            fs.create(dir, format!("added-{k}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        fs.readdir(dir, cookie, &mut |e| {
            seen.push(String::from_utf8_lossy(&e.name).into_owned());
            true
        })
        .unwrap();
        seen.retain(|n| !n.starts_with("added")); // POSIX leaves it to the filesystem
        let (mut seen, mut all) = (seen, all);
        seen.sort();
        all.sort();
        assert_eq!(
            seen,
            all,
            "gappy{g}: readdir resumed after {} entries",
            g + 1
        );
    }
    fs.unlink(many, b"name-number-8").unwrap();
    fs.unlink(many, b"name-number-2").unwrap();
    let parent = ino(2, "parent");
    fs.rename(parent, b"child", d, b"moved-child", RenameFlags::default())
        .unwrap();
    fs.rmdir(2, b"empty").unwrap();
    // Inline inodes freed as they are: a file unlinked, a directory renamed over.
    fs.unlink(d, b"victim").unwrap();
    let fresh = fs.mkdir(2, b"fresh", 0o755, 0, 0).unwrap().ino;
    fs.create(fresh, b"in-fresh", 0o644, 0, 0).unwrap();
    fs.rename(2, b"fresh", 2, b"empty2", RenameFlags::default())
        .unwrap();
    let ours = walk_uext4(&fs);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    // As the kernel: what still fits stays inline.
    assert_eq!(inline_size("d/tiny"), Some(60));
    assert_eq!(inline_size("d/onefifty"), Some(70));
    assert!(inline_size("many").unwrap() > 60);
    assert_eq!(inline_size("d/sixty"), None);
    assert_eq!(inline_size("d/punch"), None);
    for g in 0..=7 {
        assert_eq!(
            inline_size(&format!("gappy{g}")),
            None,
            "gappy{g} converted"
        );
    }
    let theirs = {
        let m = KernelMount::new(&img.0);
        assert_trees_equal(&ours, &walk_host(&m.dir));
        sh(&format!(
            "set -e; cd {}; echo k > many/kernel; mkdir small; echo s > small/s; \
             rm d/moved-child/f",
            m.dir.display()
        ));
        walk_host(&m.dir)
    };
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    assert_trees_equal(&theirs, &walk_uext4(&fs));
}

/// The largest file size, for extent trees and block maps, with and without huge_file, at 1 KiB
/// and 4 KiB blocks, is the kernel's to the byte: the kernel truncates a file to uext4's limit
/// and refuses one byte more (EFBIG), and uext4 does the same, and cuts a write crossing the
/// limit short there as the kernel's write checks do.
#[test]
fn largest_file_size_is_the_kernels() {
    if !can_loop_mount() {
        return;
    }
    for (kind, opts) in [
        ("ext4", "-b 4096"),
        ("ext4", "-b 1024"),
        ("ext4", "-b 4096 -O ^huge_file"),
        ("ext3", "-b 4096"),
        ("ext3", "-b 4096 -O huge_file"),
        ("ext3", "-b 1024"),
    ] {
        let tag = format!("{kind} {opts}");
        let img = scratch("maxsize");
        sh(&format!(
            "mke2fs -q -F -t {kind} {opts} {} 64M",
            img.0.display()
        ));
        let fs: Arc<Fs> = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        let f = fs.create(2, b"f", 0o644, 0, 0).unwrap().ino;
        let max = if kind == "ext3" {
            fs.blockmap_max_size()
        } else {
            fs.max_file_size()
        };
        fs.truncate(f, max).unwrap_or_else(|e| panic!("{tag}: {e}"));
        assert!(
            matches!(fs.truncate(f, max + 1), Err(uext4::Error::FileTooBig)),
            "{tag}"
        );
        fs.truncate(f, 0).unwrap();
        assert_eq!(fs.write(f, max - 10, &[7u8; 100]).unwrap(), 10, "{tag}");
        assert!(
            matches!(fs.write(f, max, b"x"), Err(uext4::Error::FileTooBig)),
            "{tag}"
        );
        fs.unmount().unwrap();
        drop(fs);
        e2fsck_clean(&img.0);
        let m = KernelMount::new(&img.0);
        let p = m.dir.join("k");
        let fits = |n: u64| {
            std::process::Command::new("truncate")
                .arg("-s")
                .arg(n.to_string())
                .arg(&p)
                .output()
                .unwrap()
                .status
                .success()
        };
        assert!(fits(max), "{tag}: the kernel refuses {max}");
        assert!(!fits(max + 1), "{tag}: the kernel allows {}", max + 1);
        let written = sh(&format!(
            "xfs_io -c 'pwrite -q {} 100' -c 'stat' {} | grep -i 'stat.size'",
            max - 10,
            m.dir.join("f").display()
        ));
        assert!(written.contains(&max.to_string()), "{tag}: {written}");
        drop(m);
        e2fsck_clean(&img.0);
    }
}
