//! The crash-consistency checker (DESIGN.md R6).
//!
//! Workloads run on a [`RecordingDevice`], which logs every write and flush. The checker then
//! rebuilds the device as a power cut would have left it, at every flush point and at random
//! points between flushes with a random subset of the unflushed writes lost, recovers it (journal
//! replay and orphan processing on open), and verifies:
//! - `e2fsck -fn` is clean;
//! - everything an fsync acknowledged before that point is there (an unacknowledged change
//!   may show its old or its new version; a truncate in flight, as the kernel's, may also show
//!   the old file with zeros from the new size to the end of that block);
//! - no file shows data that was never written to it (every 8-byte word of file data is zero or
//!   carries the tag of a write made to that file);
//! - every symlink that exists reads back its whole target.
//!
//! A bounded run is part of the tests. A long run: `UEXT4_CRASH_STATES=5000 cargo test --release
//! -p uext4 --test crash -- --nocapture`.

mod common;

use common::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uext4::blockdev::{MemDevice, RecordingDevice};
use uext4::{Fs, MountOptions};
use uext4::{RenameFlags, XattrFlags};

/// Data whose every 8-byte word names the file it was written to and the write's version.
fn tagged(file: u16, version: u16, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u32;
    while v.len() < len {
        v.extend_from_slice(&file.to_le_bytes());
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&(i | 0x8000_0000).to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

#[derive(Clone, Debug)]
enum Fact {
    /// The file at this path has exactly this content.
    Equals(Vec<Vec<u8>>, Vec<u8>),
    /// The file has one of these contents (an update that was not acknowledged yet).
    OneOf(Vec<Vec<u8>>, Vec<Vec<u8>>),
    /// The file has one of these contents, or is gone (its removal was acknowledged later).
    OneOfOrAbsent(Vec<Vec<u8>>, Vec<Vec<u8>>),
    /// Nothing is at this path.
    Absent(Vec<Vec<u8>>),
    /// The file is at one of these paths (a directory above it was being renamed) with this content.
    AtAny(Vec<Vec<Vec<u8>>>, Vec<u8>),
    /// A symlink at this path with this target.
    Link(Vec<Vec<u8>>, Vec<u8>),
    /// A RENAME_WHITEOUT in flight: either the file is still at the first path (the second
    /// absent), or it is at the second and a whiteout at the first; never a mix.
    WhiteoutRename(Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<u8>),
    /// A whiteout (a 0/0 character device, mode 0, one link) at this path.
    Whiteout(Vec<Vec<u8>>),
}

struct Workload {
    /// (log length when acknowledged, fact).
    acks: Vec<(usize, Fact)>,
    /// File id (in the data tags) that each path's content may carry.
    owner: HashMap<Vec<Vec<u8>>, u16>,
    /// The target each symlink path was made with.
    links: HashMap<Vec<Vec<u8>>, Vec<u8>>,
}

fn p(parts: &[&str]) -> Vec<Vec<u8>> {
    parts.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn resolve(fs: &Fs, path: &[Vec<u8>]) -> uext4::Result<u32> {
    let mut ino = 2;
    for c in path {
        ino = fs.lookup(ino, c)?.ino;
    }
    Ok(ino)
}

fn is_whiteout(fs: &Fs, path: &[Vec<u8>]) -> bool {
    resolve(fs, path)
        .and_then(|i| fs.getattr(i))
        .is_ok_and(|a| a.mode == 0o020000 && a.rdev == 0 && a.nlink == 1)
}

/// Runs the workloads of the issue on `fs`, recording what each fsync acknowledged.
/// A directory for the workloads; casefolded on a filesystem with the casefold feature, so
/// that its names are hashed folded and the crash states' indexes are checked that way.
fn mkdir_in(fs: &Fs, parent: u32, name: &[u8]) -> u32 {
    let d = fs.mkdir(parent, name, 0o755, 0, 0).unwrap().ino;
    if casefolded(fs) {
        let f = fs.get_flags(d).unwrap();
        fs.set_flags(d, f | uext4::flags::FL_CASEFOLD).unwrap();
    }
    if fs
        .superblock()
        .has_incompat(uext4::format::features::INCOMPAT_ENCRYPT)
        && parent == uext4::ROOT_INO
    {
        // Encrypted (its subdirectories inherit the policy).
        let p = uext4::EncryptionPolicy::v2(&crash_key()).unwrap();
        fs.set_encryption_policy(d, &p).unwrap();
    }
    d
}

/// The fscrypt master key of the encrypted runs, given to every open (harmless elsewhere).
fn crash_key() -> uext4::EncryptionKey {
    uext4::EncryptionKey::new((0u8..64).map(|i| i.wrapping_mul(29) ^ 0xa5).collect())
}

/// `o` with [`crash_key`].
fn keyed(o: MountOptions) -> MountOptions {
    MountOptions {
        keys: vec![crash_key()],
        ..o
    }
}

fn casefolded(fs: &Fs) -> bool {
    fs.superblock()
        .has_incompat(uext4::format::features::INCOMPAT_CASEFOLD)
}

fn run_workloads(fs: &Fs, dev: &RecordingDevice, scale: usize) -> Workload {
    let mut w = Workload {
        acks: Vec::new(),
        owner: HashMap::new(),
        links: HashMap::new(),
    };
    let ack = |w: &mut Workload, f: Fact| w.acks.push((dev.log_len(), f));
    // 1. create / write / fsync.
    let d = mkdir_in(fs, 2, b"w1");
    fs.fsync(d, false).unwrap();
    for i in 0..(4 * scale) as u16 {
        let name = format!("f{i}");
        let ino = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let data = tagged(100 + i, 1, 3000 + 7000 * (i as usize % 5));
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        let path = p(&["w1", &name]);
        w.owner.insert(path.clone(), 100 + i);
        ack(&mut w, Fact::Equals(path, data));
    }
    // 2. write to a temporary file, fsync, rename over the original, fsync the directory.
    let db = p(&["db"]);
    w.owner.insert(db.clone(), 7);
    let ino = fs.create(2, b"db", 0o644, 0, 0).unwrap().ino;
    let mut cur = tagged(7, 0, 9000);
    fs.write(ino, 0, &cur).unwrap();
    fs.fsync(ino, false).unwrap();
    fs.fsync(2, false).unwrap();
    ack(&mut w, Fact::Equals(db.clone(), cur.clone()));
    for v in 1..(3 * scale) as u16 {
        let next = tagged(7, v, 4000 + 3000 * (v as usize % 4));
        let t = fs.create(2, b"db.tmp", 0o644, 0, 0).unwrap().ino;
        fs.write(t, 0, &next).unwrap();
        fs.fsync(t, false).unwrap();
        ack(
            &mut w,
            Fact::OneOf(db.clone(), vec![cur.clone(), next.clone()]),
        );
        fs.rename(2, b"db.tmp", 2, b"db", RenameFlags::default())
            .unwrap();
        fs.fsync(2, false).unwrap();
        ack(&mut w, Fact::Equals(db.clone(), next.clone()));
        cur = next;
    }
    // 3. unlink of open files.
    for i in 0..scale as u16 {
        let name = format!("open{i}");
        let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.open(ino).unwrap();
        fs.write(ino, 0, &tagged(300 + i, 0, 20000)).unwrap();
        fs.unlink(2, name.as_bytes()).unwrap();
        fs.fsync(ino, false).unwrap();
        ack(&mut w, Fact::Absent(p(&[&name])));
        fs.write(ino, 20000, &tagged(300 + i, 1, 5000)).unwrap();
        fs.release(ino).unwrap();
    }
    // 4. truncate, fallocate and punch.
    let t = p(&["t"]);
    w.owner.insert(t.clone(), 9);
    let ino = fs.create(2, b"t", 0o644, 0, 0).unwrap().ino;
    let mut data = tagged(9, 0, 64 * 1024);
    fs.write(ino, 0, &data).unwrap();
    fs.truncate(ino, 10_000).unwrap();
    data.truncate(10_000);
    fs.fsync(ino, false).unwrap();
    ack(&mut w, Fact::Equals(t.clone(), data.clone()));
    // Another file's data in the blocks the fallocate below will take: written, deleted, and
    // its blocks made reusable (sync drains the checkpoint). Preallocated space must read as
    // zeros in every state that shows the fallocate, whether its extents are unwritten or
    // zeroed and written (then the zeros must be on the device before the commit).
    let junk = p(&["junk"]);
    w.owner.insert(junk.clone(), 13);
    let j = fs.create(2, b"junk", 0o644, 0, 0).unwrap().ino;
    fs.write(j, 0, &tagged(13, 0, 256 * 1024)).unwrap();
    fs.fsync(j, false).unwrap();
    fs.unlink(2, b"junk").unwrap();
    fs.sync().unwrap();
    ack(&mut w, Fact::Absent(junk));
    match fs.fallocate(ino, 0, 0, 100_000) {
        // A file with an indirect block map (ext2/ext3 layout) cannot preallocate: its new
        // end is a hole instead, which reads as the same zeros.
        Err(uext4::Error::NotSupported(m)) if m.contains("indirect block map") => {
            fs.truncate(ino, 100_000).unwrap()
        }
        r => r.unwrap(),
    }
    data.resize(100_000, 0);
    fs.write(ino, 50_000, &tagged(9, 1, 10_000)).unwrap();
    data[50_000..60_000].copy_from_slice(&tagged(9, 1, 10_000));
    fs.fallocate(ino, 0x3, 4096, 8192).unwrap();
    data[4096..12288].fill(0);
    fs.fsync(ino, false).unwrap();
    ack(&mut w, Fact::Equals(t.clone(), data.clone()));
    // 5. directory renames.
    let a = mkdir_in(fs, 2, b"a");
    let b = mkdir_in(fs, a, b"b");
    let f = fs.create(b, b"x", 0o644, 0, 0).unwrap().ino;
    let xd = tagged(11, 0, 5000);
    fs.write(f, 0, &xd).unwrap();
    fs.fsync(f, false).unwrap();
    w.owner.insert(p(&["a", "b", "x"]), 11);
    w.owner.insert(p(&["c", "b", "x"]), 11);
    ack(
        &mut w,
        Fact::AtAny(vec![p(&["a", "b", "x"]), p(&["c", "b", "x"])], xd.clone()),
    );
    fs.rename(2, b"a", 2, b"c", RenameFlags::default()).unwrap();
    fs.fsync(2, false).unwrap();
    ack(&mut w, Fact::Equals(p(&["c", "b", "x"]), xd.clone()));
    ack(&mut w, Fact::Absent(p(&["a"])));
    // 6. many small files in one directory.
    let m = mkdir_in(fs, 2, b"many");
    for i in 0..(60 * scale) as u16 {
        let name = if casefolded(fs) {
            format!("Small-Straße-Ǆ-{i:05}")
        } else {
            format!("small-file-{i:05}")
        };
        let ino = fs.create(m, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let data = tagged(1000 + i, 0, 100 + (i as usize % 7) * 300);
        fs.write(ino, 0, &data).unwrap();
        let path = p(&["many", &name]);
        w.owner.insert(path.clone(), 1000 + i);
        if i % 20 == 19 {
            fs.fsync(ino, false).unwrap();
        }
        w.acks.push((usize::MAX, Fact::Equals(path, data)));
    }
    // 7. symlinks: slow ones (the target in a block) and fast ones (in the inode), the
    // directory fsynced now and then.
    let l = mkdir_in(fs, 2, b"links");
    for i in 0..(6 * scale) {
        let name = format!("l{i}");
        let len = if i % 2 == 0 { 300 + i } else { 20 + i % 30 };
        let target: Vec<u8> = format!("{i}-")
            .bytes()
            .chain(std::iter::repeat(b't'))
            .take(len)
            .collect();
        fs.symlink(l, name.as_bytes(), &target, 0, 0).unwrap();
        let path = p(&["links", &name]);
        w.links.insert(path.clone(), target.clone());
        if i % 3 == 2 {
            fs.fsync(l, false).unwrap();
        }
        w.acks.push((usize::MAX, Fact::Link(path, target)));
    }
    // 8. overlayfs's upper-layer operations: renames that leave a whiteout (within and
    // across directories), and tmpfiles written, then linked in (or never, and released).
    let ov = mkdir_in(fs, 2, b"ov");
    let ow = mkdir_in(fs, 2, b"ovw");
    fs.fsync(2, false).unwrap();
    for i in 0..(2 * scale) as u16 {
        let (src, dst) = (format!("s{i}"), format!("d{i}"));
        let data = tagged(400 + i, 0, 3000 + 5000 * (i as usize % 3));
        let ino = fs.create(ov, src.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        fs.fsync(ov, false).unwrap();
        let (nd, ndname) = if i % 2 == 0 { (ov, "ov") } else { (ow, "ovw") };
        let (from, to) = (p(&["ov", &src]), p(&[ndname, &dst]));
        w.owner.insert(from.clone(), 400 + i);
        w.owner.insert(to.clone(), 400 + i);
        ack(
            &mut w,
            Fact::WhiteoutRename(from.clone(), to.clone(), data.clone()),
        );
        let flags = RenameFlags {
            whiteout: Some((0, 0)),
            ..Default::default()
        };
        fs.rename(ov, src.as_bytes(), nd, dst.as_bytes(), flags)
            .unwrap();
        fs.fsync(ov, false).unwrap();
        fs.fsync(nd, false).unwrap();
        ack(&mut w, Fact::Equals(to, data));
        ack(&mut w, Fact::Whiteout(from));
    }
    for i in 0..(2 * scale) as u16 {
        let t = fs.tmpfile(ov, 0o644, 0, 0).unwrap().ino;
        let data = tagged(450 + i, 0, 6000 + 4000 * (i as usize % 2));
        fs.write(t, 0, &data).unwrap();
        fs.fsync(t, false).unwrap();
        let name = format!("t{i}");
        let path = p(&["ov", &name]);
        w.owner.insert(path.clone(), 450 + i);
        if i % 2 == 0 {
            fs.link(t, ov, name.as_bytes()).unwrap();
            fs.fsync(ov, false).unwrap();
            ack(&mut w, Fact::Equals(path, data));
        } else {
            ack(&mut w, Fact::Absent(path));
        }
        fs.release(t).unwrap();
    }
    // 9. inline data (images prepared by `inline_base`): files and a directory the kernel kept
    // inside their inodes, each converted to a block by its first change.
    if let Ok(il) = resolve(fs, &p(&["il"])) {
        for i in 0..INLINE_FILES {
            let path = p(&["il", &format!("f{i}")]);
            let old = tagged(200 + i, 0, inline_len(i));
            w.owner.insert(path.clone(), 200 + i);
            w.acks.push((0, Fact::Equals(path.clone(), old.clone())));
            let ino = resolve(fs, &path).unwrap();
            let new = if i % 2 == 0 {
                let more = tagged(200 + i, 1, 3000);
                fs.write(ino, old.len() as u64, &more).unwrap();
                [old, more].concat()
            } else {
                fs.truncate(ino, 10).unwrap();
                old[..10].to_vec()
            };
            fs.fsync(ino, false).unwrap();
            ack(&mut w, Fact::Equals(path, new));
        }
        let d = fs.lookup(il, b"d").unwrap().ino;
        for k in 0..3u16 {
            let path = p(&["il", "d", &format!("e{k}")]);
            w.owner.insert(path.clone(), 210 + k);
            if k != 1 {
                // (e1 is removed below: only its removal is a fact.)
                w.acks.push((0, Fact::Equals(path, tagged(210 + k, 0, 30))));
            }
        }
        let ino = fs.create(d, b"new", 0o644, 0, 0).unwrap().ino;
        let data = tagged(213, 0, 5000);
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        fs.fsync(d, false).unwrap();
        let path = p(&["il", "d", "new"]);
        w.owner.insert(path.clone(), 213);
        ack(&mut w, Fact::Equals(path, data));
        fs.unlink(d, b"e1").unwrap();
        fs.fsync(d, false).unwrap();
        ack(&mut w, Fact::Absent(p(&["il", "d", "e1"])));
        // uext4's own inline inodes: a new directory that grows through i_block and
        // "system.data" to a block as names come (36 bytes each: one fits i_block, nine the
        // attribute of a 512-byte inode, the eleventh converts), and new files of 24 to 128
        // bytes written inline (8-byte multiples: the checker reads tags by word), then
        // appended to within what the inode holds or past it (a conversion), or cut: each
        // step one handle.
        let nd = mkdir_in(fs, il, b"new");
        for k in 0..14u16 {
            let name = format!("new-inline-name-{k:02}-{}", "x".repeat(9));
            let path = p(&["il", "new", &name]);
            w.owner.insert(path.clone(), 220 + k);
            let ino = fs.create(nd, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            let mut data = tagged(220 + k, 0, 24 + 8 * k as usize);
            fs.write(ino, 0, &data).unwrap();
            fs.fsync(ino, false).unwrap();
            fs.fsync(nd, false).unwrap();
            ack(&mut w, Fact::Equals(path.clone(), data.clone()));
            match k % 3 {
                0 => {
                    let more = tagged(220 + k, 1, 40 * k as usize + 1);
                    fs.write(ino, data.len() as u64, &more).unwrap();
                    data.extend_from_slice(&more);
                }
                1 => {
                    fs.truncate(ino, 7).unwrap();
                    data.truncate(7);
                }
                _ => continue,
            }
            fs.fsync(ino, false).unwrap();
            ack(&mut w, Fact::Equals(path, data));
        }
    }
    if fs
        .superblock()
        .has_incompat(uext4::format::features::INCOMPAT_EA_INODE)
    {
        ea_inode_workload(fs);
    }
    if fs
        .superblock()
        .has_ro_compat(uext4::format::features::RO_COMPAT_VERITY)
    {
        // Step 10 (verity): files made read-only with a Merkle tree of one, two and three
        // levels. Enabling writes the tree past the end of the file, then the descriptor, then
        // sets the flag in one handle: every crash state shows a plain file or a verity file
        // whose every block verifies (a read of a block the tree does not vouch for fails).
        for (i, len) in [5_000usize, 200_000, 9_000_000].into_iter().enumerate() {
            let name = format!("verity{i}");
            let path = p(&[&name]);
            let data = tagged(300 + i as u16, 0, len);
            let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(ino, 0, &data).unwrap();
            fs.fsync(ino, false).unwrap();
            w.owner.insert(path.clone(), 300 + i as u16);
            fs.enable_verity(ino, &uext4::VerityArgs::default())
                .unwrap();
            fs.fsync(ino, false).unwrap();
            ack(&mut w, Fact::Equals(path, data));
        }
    }
    finish_workload(fs, dev, w)
}

/// Step 9 (ea_inode): values in EA inodes, new, shared by two files, replaced, removed, and
/// released with a removed file; each step one handle, so every crash state must show each
/// EA inode's reference count, hash and size consistent with the entries naming it.
fn ea_inode_workload(fs: &Fs) {
    let big = |seed: u16, n: usize| tagged(400 + seed, 0, n);
    let a = fs.create(2, b"xa", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(2, b"xb", 0o644, 0, 0).unwrap().ino;
    let set = |ino, name: &[u8], v: &[u8]| fs.setxattr(ino, name, v, XattrFlags::Any).unwrap();
    for round in 0..3u16 {
        set(a, b"user.big", &big(round, 20_000 + 1000 * round as usize));
        set(b, b"user.big", &big(round, 20_000 + 1000 * round as usize));
        set(a, b"user.other", &big(10 + round, 6_000));
        fs.fsync(a, false).unwrap();
        fs.removexattr(a, b"user.other").unwrap();
        fs.fsync(b, false).unwrap();
    }
    fs.unlink(2, b"xb").unwrap();
    fs.fsync(2, false).unwrap();
}

/// Ends a workload: a sync makes everything durable (the facts recorded without a point
/// hold from there), and each fact allows the later versions of its path.
fn finish_workload(fs: &Fs, dev: &RecordingDevice, mut w: Workload) -> Workload {
    fs.sync().unwrap(); // syncfs: everything above is durable
    let n = dev.log_len();
    for a in w.acks.iter_mut() {
        if a.0 == usize::MAX {
            a.0 = n;
        }
    }
    // An acknowledged version may be replaced by a later one that reached the disk before its
    // own acknowledgement: each fact also allows every later version of the same path.
    let facts: Vec<Fact> = w.acks.iter().map(|a| a.1.clone()).collect();
    for (i, a) in w.acks.iter_mut().enumerate() {
        let (path, mut allowed) = match &a.1 {
            Fact::Equals(p, c) => (p.clone(), vec![c.clone()]),
            Fact::OneOf(p, cs) => (p.clone(), cs.clone()),
            Fact::Absent(_)
            | Fact::OneOfOrAbsent(..)
            | Fact::AtAny(..)
            | Fact::Link(..)
            | Fact::WhiteoutRename(..)
            | Fact::Whiteout(_) => continue,
        };
        {
            let path = &path;
            for later in &facts[i + 1..] {
                match later {
                    Fact::Equals(p2, c2) if p2 == path => allowed.push(c2.clone()),
                    Fact::OneOf(p2, cs) if p2 == path => allowed.extend(cs.iter().cloned()),
                    _ => {}
                }
            }
            let removed = facts[i + 1..]
                .iter()
                .any(|later| matches!(later, Fact::Absent(p2) if p2 == path));
            if removed {
                a.1 = Fact::OneOfOrAbsent(path.clone(), std::mem::take(&mut allowed));
            } else if allowed.len() > 1 {
                a.1 = Fact::OneOf(path.clone(), std::mem::take(&mut allowed));
            }
        }
    }
    w
}

/// Removals too large for one handle, on a filesystem of many small groups and the smallest
/// journal (1,024 blocks, so a handle may dirty about 127): a truncate, a punched hole, an
/// unlink, the last close of an unlinked file and a rename over a file, each of an 80 MiB
/// file spread over some 320 groups. Each is freed in pieces, a handle each, over several
/// transactions, the inode on the orphan list meanwhile where the file is being cut or
/// deleted: every crash
/// state in between must recover to the old or the new file (or none), e2fsck-clean.
fn run_large_removals(fs: &Fs, dev: &RecordingDevice, _scale: usize) -> Workload {
    let mut w = Workload {
        acks: Vec::new(),
        owner: HashMap::new(),
        links: HashMap::new(),
    };
    let ack = |w: &mut Workload, f: Fact| w.acks.push((dev.log_len(), f));
    let free0 = fs.statfs().blocks_free;
    const BIG: u64 = 80 << 20;
    // A large file: tagged data at both ends, preallocated (unwritten) between. Its content
    // is a fact only for files that are not removed later (a removal is a fact of its own).
    let big = |w: &mut Workload, name: &str, id: u16, stays: bool| -> (u32, Vec<u8>) {
        let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.fallocate(ino, 0, 0, BIG).unwrap();
        let head = tagged(id, 0, 40_000);
        let tail = tagged(id, 1, 8192);
        fs.write(ino, 0, &head).unwrap();
        fs.write(ino, BIG - 8192, &tail).unwrap();
        fs.fsync(ino, false).unwrap();
        fs.fsync(2, false).unwrap();
        let mut data = vec![0u8; BIG as usize];
        data[..head.len()].copy_from_slice(&head);
        data[(BIG - 8192) as usize..].copy_from_slice(&tail);
        let path = p(&[name]);
        w.owner.insert(path.clone(), id);
        if stays {
            ack(w, Fact::Equals(path, data.clone()));
        }
        (ino, data)
    };
    let commits = || fs.txn_stats().commits.load(Ordering::Relaxed);
    let pieces = |before: u64| commits() - before;
    // Truncate: the rest of the new last block zeroed, the new size and an orphan entry,
    // then the blocks in pieces. As with the kernel's truncate, the zeros reach the device
    // ahead of the commit of the new size (so that a crash between pieces cannot leave old
    // bytes past the size): until that commit, the old file may show them.
    let (ino, mut data) = big(&mut w, "trunc", 21, true);
    let mut zeroed = data.clone();
    zeroed[30_000..30_720].fill(0);
    ack(
        &mut w,
        Fact::OneOf(p(&["trunc"]), vec![data.clone(), zeroed]),
    );
    let c0 = commits();
    fs.truncate(ino, 30_000).unwrap();
    fs.fsync(ino, false).unwrap();
    assert!(pieces(c0) > 1, "the truncate was not split");
    data.truncate(30_000);
    ack(&mut w, Fact::Equals(p(&["trunc"]), data));
    // Punch: a hole over nearly the whole file.
    let (ino, mut data) = big(&mut w, "punch", 22, true);
    let c0 = commits();
    fs.fallocate(ino, 0x3, 16_384, BIG - 32_768).unwrap();
    fs.fsync(ino, false).unwrap();
    assert!(pieces(c0) > 1, "the punch was not split");
    data[16_384..(BIG - 16_384) as usize].fill(0);
    ack(&mut w, Fact::Equals(p(&["punch"]), data));
    fs.truncate(ino, 0).unwrap();
    fs.fsync(ino, false).unwrap();
    ack(&mut w, Fact::Equals(p(&["punch"]), Vec::new()));
    // Unlink: the name goes with an orphan entry, the blocks after.
    let _ = big(&mut w, "unlinked", 23, false);
    fs.unlink(2, b"unlinked").unwrap();
    fs.fsync(2, false).unwrap();
    ack(&mut w, Fact::Absent(p(&["unlinked"])));
    // An open file unlinked: its blocks go at the last close.
    let (ino, _) = big(&mut w, "open", 24, false);
    fs.open(ino).unwrap();
    fs.unlink(2, b"open").unwrap();
    fs.fsync(2, false).unwrap();
    ack(&mut w, Fact::Absent(p(&["open"])));
    fs.release(ino).unwrap();
    // A rename over a large file frees it after the rename's handle.
    let _ = big(&mut w, "target", 25, true);
    let small = fs.create(2, b"small", 0o644, 0, 0).unwrap().ino;
    let sd = tagged(25, 7, 5000);
    fs.write(small, 0, &sd).unwrap();
    fs.fsync(small, false).unwrap();
    fs.rename(2, b"small", 2, b"target", RenameFlags::default())
        .unwrap();
    fs.fsync(2, false).unwrap();
    ack(&mut w, Fact::Equals(p(&["target"]), sd));
    let w = finish_workload(fs, dev, w);
    // Everything was freed: the files left hold a few dozen blocks.
    let held = free0 - fs.statfs().blocks_free;
    assert!(held < 100, "{held} blocks still held after the removals");
    assert_eq!(
        fs.txn_stats().unjournaled_commits.load(Ordering::Relaxed),
        0,
        "a transaction bypassed the journal"
    );
    w
}

/// Checks one crash state; returns the violations found.
fn check_state(img: Vec<u8>, w: &Workload, at: usize, file: &Scratch) -> Vec<String> {
    let mut bad = Vec::new();
    // Recover (journal replay, orphans) as a mount would, then leave the image clean.
    let dev = Arc::new(MemDevice::from_vec(img));
    match Fs::open_dev(dev.clone(), keyed(opts::no_timer())) {
        Ok(fs) => {
            if let Err(e) = fs.unmount() {
                bad.push(format!("unmount after recovery failed: {e}"));
            }
        }
        Err(e) => {
            bad.push(format!("recovery failed: {e}"));
            return bad;
        }
    }
    let img = dev.to_vec();
    std::fs::write(&file.0, &img).unwrap();
    let out = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&file.0)
        .output()
        .unwrap();
    if !out.status.success() {
        bad.push(format!(
            "e2fsck -fn: {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .take(8)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    let fs = Fs::open_dev(
        Arc::new(MemDevice::from_vec(img)),
        keyed(MountOptions::ro()),
    )
    .unwrap();
    for (when, fact) in &w.acks {
        if *when > at {
            continue;
        }
        match fact {
            Fact::Equals(path, want) => match resolve(&fs, path) {
                Ok(ino) if read_all(&fs, ino) == *want => {}
                Ok(ino) => {
                    let got = read_all(&fs, ino);
                    let tag = |d: &[u8]| {
                        if d.len() >= 4 {
                            format!(
                                "len {} file {} version {}",
                                d.len(),
                                u16::from_le_bytes([d[0], d[1]]),
                                u16::from_le_bytes([d[2], d[3]])
                            )
                        } else {
                            format!("len {}", d.len())
                        }
                    };
                    bad.push(format!(
                        "{path:?}: acknowledged content differs: want {}, got {}",
                        tag(want),
                        tag(&got)
                    ))
                }
                Err(e) => bad.push(format!("{path:?}: acknowledged file missing ({e})")),
            },
            Fact::OneOf(path, wants) => match resolve(&fs, path) {
                Ok(ino) => {
                    let got = read_all(&fs, ino);
                    if !wants.contains(&got) {
                        bad.push(format!(
                            "{path:?}: content is neither the old nor the new version"
                        ));
                    }
                }
                Err(e) => bad.push(format!("{path:?}: file missing ({e})")),
            },
            Fact::OneOfOrAbsent(path, wants) => {
                if let Ok(ino) = resolve(&fs, path) {
                    if !wants.contains(&read_all(&fs, ino)) {
                        bad.push(format!(
                            "{path:?}: content is none of its versions (and not removed)"
                        ));
                    }
                }
            }
            Fact::AtAny(paths, want) => {
                let ok = paths.iter().any(|path| {
                    resolve(&fs, path)
                        .map(|ino| read_all(&fs, ino) == *want)
                        .unwrap_or(false)
                });
                if !ok {
                    bad.push(format!(
                        "{paths:?}: acknowledged file found at none of its paths"
                    ));
                }
            }
            Fact::Absent(path) => {
                if resolve(&fs, path).is_ok() {
                    bad.push(format!("{path:?}: acknowledged removal undone"));
                }
            }
            Fact::Whiteout(path) => {
                if !is_whiteout(&fs, path) {
                    bad.push(format!("{path:?}: acknowledged whiteout missing"));
                }
            }
            Fact::WhiteoutRename(from, to, want) => {
                let content = |p: &[Vec<u8>]| resolve(&fs, p).ok().map(|i| read_all(&fs, i));
                let before = content(from).as_ref() == Some(want) && resolve(&fs, to).is_err();
                let after = content(to).as_ref() == Some(want) && is_whiteout(&fs, from);
                if !before && !after {
                    bad.push(format!(
                        "{from:?} -> {to:?}: a whiteout rename is neither undone nor whole"
                    ));
                }
            }
            Fact::Link(path, target) => match resolve(&fs, path) {
                Ok(ino) if fs.readlink(ino).ok().as_ref() == Some(target) => {}
                Ok(_) => bad.push(format!("{path:?}: acknowledged symlink's target differs")),
                Err(e) => bad.push(format!("{path:?}: acknowledged symlink missing ({e})")),
            },
        }
    }
    // Every symlink that exists holds its whole target (a slow symlink's block is written
    // before its name is linked).
    for (path, target) in &w.links {
        if let Ok(ino) = resolve(&fs, path) {
            match fs.readlink(ino) {
                Ok(t) if t == *target => {}
                Ok(_) => bad.push(format!("{path:?}: symlink target differs")),
                Err(e) => bad.push(format!("{path:?}: readlink failed ({e})")),
            }
        }
    }
    // No file shows data that was never written to it.
    for (path, &owner) in &w.owner {
        if let Ok(ino) = resolve(&fs, path) {
            let data = read_all(&fs, ino);
            for (i, word) in data.chunks(8).enumerate() {
                if word.iter().all(|&b| b == 0) || word.len() < 8 {
                    continue;
                }
                let id = u16::from_le_bytes([word[0], word[1]]);
                let hi = word[7] & 0x80 != 0;
                if id != owner || !hi {
                    bad.push(format!(
                        "{path:?}: word {i} holds data that was never written to this file"
                    ));
                    break;
                }
            }
        }
    }
    bad
}

#[test]
fn crash_states_recover_consistently() {
    check_crash_states(false, false, 120);
}

/// The same workloads in buffered mode (delayed allocation): what fsync acknowledged survives,
/// and unflushed data never shows as zeros past the size the device backs.
#[test]
fn crash_states_recover_consistently_buffered() {
    check_crash_states(true, false, 60);
}

/// The same workloads on a device that zeroes cheaply, as an image on tmpfs does: fallocate
/// maps zeroed blocks written, and the zeros must be on the device before the commit that
/// points at them (a crash state with the extent but not the zeros would show old bytes).
#[test]
fn crash_states_recover_consistently_zeroed_prealloc() {
    check_crash_states(false, true, 60);
}

/// The same workloads on a filesystem without the extents feature (ext3 layout, 1 KiB
/// blocks): new blocks are mapped through indirect blocks, which are journaled metadata, and
/// the data must still reach the device before the commit whose pointers name it.
#[test]
fn crash_states_recover_consistently_block_maps() {
    check_crash_states_on(false, false, 60, &["-b", "1024", "-O", "^extent,^64bit"]);
}

/// The same workloads in encrypted directories: names and contents stored encrypted, every
/// write and truncate of a partial block re-encrypting it whole.
#[test]
fn crash_states_recover_consistently_encrypt() {
    check_crash_states_on(false, false, 60, &["-O", "encrypt"]);
}

/// The same workloads on a filesystem with fast commits: fsyncs whose transaction holds only
/// changes to regular files' data and fields are answered by records in the journal's
/// fast-commit area (fast_commit/commit.rs), the others by full commits; every crash state
/// replays the log, then the records, and keeps every fsynced file whole.
#[test]
fn crash_states_recover_consistently_fast_commit() {
    check_crash_states_with(
        false,
        false,
        80,
        &["-J", "size=4", "-O", "fast_commit"],
        "32M",
        fast_commit_workload,
    )
}

/// Fast commits: files written and fsynced, then appends, overwrites in place, truncates
/// down and up, each fsynced, and now and then a hole punched, a new file written and
/// fsynced, a file replaced by rename as package managers do, a file removed (fast commits,
/// until the area is full), with now and then a file and a directory made and not fsynced
/// (the directory makes the next fsync a full commit) and a full commit of everything.
fn fast_commit_workload(fs: &Fs, dev: &RecordingDevice, scale: usize) -> Workload {
    let mut w = Workload {
        acks: Vec::new(),
        owner: HashMap::new(),
        links: HashMap::new(),
    };
    let ack = |w: &mut Workload, f: Fact| w.acks.push((dev.log_len(), f));
    let mut files = Vec::new();
    for i in 0..4u16 {
        let name = format!("fc{i}");
        let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let data = tagged(500 + i, 0, 5000 + 9000 * i as usize);
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        let path = p(&[&name]);
        w.owner.insert(path.clone(), 500 + i);
        ack(&mut w, Fact::Equals(path.clone(), data.clone()));
        files.push((ino, path, data));
    }
    let mut made = std::collections::VecDeque::new();
    for k in 1..(40 * scale) as u16 {
        let i = k as usize % files.len();
        let (ino, path, data) = &mut files[i];
        // Offsets and lengths in whole 8-byte words, as the tag check reads them.
        let piece = tagged(500 + i as u16, k, 1024 + 3000 * (k as usize % 3));
        match k % 5 {
            0 | 1 => {
                fs.write(*ino, data.len() as u64, &piece).unwrap();
                data.extend_from_slice(&piece);
            }
            // An overwrite of one aligned 1 KiB block (a device write is whole or not
            // there; a longer one could be torn, which no filesystem prevents).
            2 if data.len() >= 1024 => {
                let at = (k as usize * 997) % (data.len() / 1024) * 1024;
                fs.write(*ino, at as u64, &piece[..1024]).unwrap();
                data[at..at + 1024].copy_from_slice(&piece[..1024]);
            }
            // A truncate to a block boundary: no partial block is zeroed in place before
            // the new size is durable.
            2 | 3 => {
                let len = (data.len() * 2 / 3) & !4095;
                fs.truncate(*ino, len as u64).unwrap();
                data.truncate(len);
            }
            _ => {
                let len = data.len() + 5000;
                fs.truncate(*ino, len as u64).unwrap();
                data.resize(len, 0);
            }
        }
        fs.fsync(*ino, k % 2 == 0).unwrap();
        ack(&mut w, Fact::Equals(path.clone(), data.clone()));
        if k % 7 == 3 {
            // A new file, written and fsynced: a CREAT record after its INODE.
            let name = format!("new{k}");
            let path = p(&[&name]);
            let data = tagged(600 + k, 0, 3000 + 1024 * (k as usize % 4));
            let n = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(n, 0, &data).unwrap();
            fs.fsync(n, false).unwrap();
            w.owner.insert(path.clone(), 600 + k);
            ack(&mut w, Fact::Equals(path, data));
            made.push_back(k);
        }
        if k % 9 == 4 && data.len() >= 3 * 4096 {
            // A hole punched over whole blocks (DEL_RANGE), fsynced.
            let at = 4096 * (k as usize % (data.len() / 4096 - 2));
            let flags = uext4::FALLOC_FL_PUNCH_HOLE | uext4::FALLOC_FL_KEEP_SIZE;
            fs.fallocate(*ino, flags, at as u64, 8192).unwrap();
            data[at..at + 8192].fill(0);
            fs.fsync(*ino, false).unwrap();
            ack(&mut w, Fact::Equals(path.clone(), data.clone()));
        }
        if k % 7 == 5 {
            // A package manager's replace: a new version written and fsynced under a
            // temporary name (CREAT), renamed over the old one and fsynced (UNLINK of the
            // old, which is freed; LINK and UNLINK of the new).
            let (tmp, pkg) = (p(&["pkg.tmp"]), p(&["pkg"]));
            let data = tagged(700, k, 2000 + 1500 * (k as usize % 5));
            let n = fs.create(2, b"pkg.tmp", 0o644, 0, 0).unwrap().ino;
            fs.write(n, 0, &data).unwrap();
            fs.fsync(n, false).unwrap();
            w.owner.insert(tmp, 700);
            w.owner.insert(pkg.clone(), 700);
            fs.rename(2, b"pkg.tmp", 2, b"pkg", uext4::RenameFlags::default())
                .unwrap();
            fs.fsync(n, false).unwrap();
            ack(&mut w, Fact::Equals(pkg, data));
        }
        if k % 13 == 6 {
            // The oldest file made above removed, and the directory fsynced (UNLINK).
            if let Some(old) = made.pop_front() {
                fs.unlink(2, format!("new{old}").as_bytes()).unwrap();
                fs.fsync(2, false).unwrap();
                ack(&mut w, Fact::Absent(p(&[&format!("new{old}")])));
            }
        }
        if k % 11 == 0 {
            // Not fsynced: a new file (a CREAT in the next fast commit), and a directory
            // (not eligible: the next fsync commits in full).
            let name = format!("unsynced{k}");
            fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap();
            let name = format!("dir{k}");
            fs.mkdir(2, name.as_bytes(), 0o755, 0, 0).unwrap();
        }
        if k % 17 == 0 {
            fs.commit().unwrap();
        }
    }
    finish_workload(fs, dev, w)
}

/// The same workloads with every directory casefolded (names hashed by their folding).
#[test]
fn crash_states_recover_consistently_casefold() {
    check_crash_states_on(false, false, 60, &["-O", "casefold"]);
}

/// The same workloads with the ea_inode feature, and values kept in EA inodes (step 9).
#[test]
fn crash_states_recover_consistently_ea_inode() {
    check_crash_states_on(false, false, 60, &["-O", "ea_inode"]);
}

/// The same workloads on a filesystem with user, group and project quotas: usage moves in
/// the handle of each change, so every crash state's quota files agree with its inodes
/// (e2fsck -fn recomputes usage and compares).
#[test]
fn crash_states_recover_consistently_quota() {
    check_crash_states_on(
        false,
        false,
        60,
        &[
            "-O",
            "quota,project",
            "-E",
            "quotatype=usrquota:grpquota:prjquota",
            "-I",
            "256",
        ],
    );
}

/// The same workloads on a filesystem with verity, and files enabled for it (step 10).
#[test]
fn crash_states_recover_consistently_verity() {
    check_crash_states_on(false, false, 60, &["-O", "verity"]);
}

/// The same workloads on a bigalloc filesystem (clusters of 16 KiB on 4 KiB blocks): every
/// allocation takes a cluster, blocks of one logical cluster share it, and a cluster is freed
/// only with its last block, each in the handle of its change; e2fsck -fn checks every
/// crash state's cluster bitmaps, free counts and i_blocks.
#[test]
fn crash_states_recover_consistently_bigalloc() {
    check_crash_states_on(false, false, 60, &["-O", "bigalloc", "-C", "16384"]);
}

/// The bigalloc workloads in buffered mode: a cluster reserved per cached page over a hole,
/// written back in runs that each take their clusters; what fsync acknowledged survives.
#[test]
fn crash_states_recover_consistently_bigalloc_buffered() {
    check_crash_states_on(true, false, 60, &["-O", "bigalloc", "-C", "16384"]);
}

/// Inline files the kernel makes in `inline_base`, and their lengths (all inside the inode;
/// whole 8-byte words, as the checker reads tags by word).
const INLINE_FILES: u16 = 4;
fn inline_len(i: u16) -> usize {
    24 + 40 * i as usize
}

/// The kernel's inline files and directory for workload 8: il/f0.. and il/d/e0..e2.
fn inline_base(img: &std::path::Path) {
    let m = KernelMount::new(img);
    std::fs::create_dir_all(m.dir.join("il/d")).unwrap();
    for i in 0..INLINE_FILES {
        std::fs::write(
            m.dir.join(format!("il/f{i}")),
            tagged(200 + i, 0, inline_len(i)),
        )
        .unwrap();
    }
    for k in 0..3u16 {
        std::fs::write(m.dir.join(format!("il/d/e{k}")), tagged(210 + k, 0, 30)).unwrap();
    }
}

/// The same workloads on a filesystem with inline_data, with small files and a directory the
/// kernel kept inside their inodes, which uext4 converts to blocks as it changes them: each
/// conversion is one handle, so a crash shows the inline form or the converted one.
#[test]
fn crash_states_recover_consistently_inline_data() {
    if !can_loop_mount() {
        return;
    }
    check_crash_states_on(false, false, 60, &["-O", "inline_data", "-I", "512"]);
}

/// Removals too large for one handle, in pieces (`run_large_removals`): 128 MiB of 1 KiB
/// blocks in groups of 256 blocks, and a journal of 1,024 blocks.
#[test]
fn crash_states_recover_consistently_large_removals() {
    check_crash_states_with(
        false,
        false,
        40,
        &["-b", "1024", "-g", "256", "-N", "4096", "-J", "size=1"],
        "128M",
        run_large_removals,
    );
}

fn check_crash_states(buffered: bool, cheap_zeroing: bool, default_states: usize) {
    check_crash_states_on(buffered, cheap_zeroing, default_states, &[])
}

fn check_crash_states_on(
    buffered: bool,
    cheap_zeroing: bool,
    default_states: usize,
    mkfs: &[&str],
) {
    let mut args = vec!["-J", "size=4"];
    args.extend_from_slice(mkfs);
    check_crash_states_with(
        buffered,
        cheap_zeroing,
        default_states,
        &args,
        "32M",
        run_workloads,
    )
}

fn check_crash_states_with(
    buffered: bool,
    cheap_zeroing: bool,
    default_states: usize,
    mkfs: &[&str],
    size: &str,
    workload: fn(&Fs, &RecordingDevice, usize) -> Workload,
) {
    let states: usize = std::env::var("UEXT4_CRASH_STATES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_states);
    let scale = if states > 1000 { 4 } else { 1 };
    let base = scratch("crash-base");
    mke2fs(&base.0, size, mkfs);
    let inline = mkfs.contains(&"inline_data");
    if inline {
        inline_base(&base.0);
        let st = sh(&format!(
            "debugfs -R 'stat il/f3' {} 2>&1",
            base.0.display()
        ));
        assert!(
            st.contains("Size of inline data"),
            "il/f3 is not inline: {st}"
        );
    }
    let image = std::fs::read(&base.0).unwrap();
    let dev = Arc::new(if cheap_zeroing {
        RecordingDevice::with_cheap_zeroing(image)
    } else {
        RecordingDevice::new(image)
    });
    let fs = Fs::open_dev(dev.clone(), keyed(opts::no_timer_buffered(buffered))).unwrap();
    let w = workload(&fs, &dev, scale);
    let fast_commits = fs
        .txn_stats()
        .fast_commits
        .load(std::sync::atomic::Ordering::Relaxed);
    fs.unmount().unwrap();
    drop(fs);
    let fc_mode = mkfs.contains(&"fast_commit");
    assert!(
        !fc_mode || fast_commits > 0,
        "the workload's fsyncs made no fast commit"
    );
    let total = dev.log_len();
    let flushes = dev.flush_points();
    let file = scratch("crash-state");
    let mut rnd = xorshift(0x9E37_79B9_7F4A_7C15u64);
    // Flush points (spread evenly if there are more than the budget), then random points.
    let mut points: Vec<(usize, u64)> = Vec::new();
    let nflush = flushes.len().min(states / 2).max(1);
    for k in 0..nflush {
        let idx = flushes[k * flushes.len() / nflush];
        points.push((idx, 0));
    }
    while points.len() < states {
        points.push(((rnd() as usize) % (total + 1), rnd() | 1));
    }
    let mut violations = 0;
    let mut checked = 0;
    for (at, mask_seed) in points {
        let mut s = mask_seed;
        let img = dev.crash_image(at, &mut |_| {
            if mask_seed == 0 {
                return false;
            }
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % 3 != 0
        });
        if let Ok(dir) = std::env::var("UEXT4_CRASH_DUMP") {
            std::fs::write(format!("{dir}/crash-{at}-{mask_seed:x}.img"), &img).unwrap();
        }
        let bad = check_state(img, &w, at, &file);
        checked += 1;
        if !bad.is_empty() {
            violations += 1;
            if violations <= 5 {
                eprintln!("crash state at log entry {at}/{total} (mask {mask_seed:#x}): {bad:?}");
            }
        }
    }
    let mode = if buffered {
        " (buffered mode)"
    } else if cheap_zeroing {
        " (zeroed preallocation)"
    } else if inline {
        " (inline data)"
    } else if mkfs.iter().any(|a| a.contains("^extent")) {
        " (block maps)"
    } else if mkfs.contains(&"-g") {
        " (large removals)"
    } else if mkfs.contains(&"quota,project") {
        " (quotas)"
    } else if fc_mode {
        " (fast commits)"
    } else {
        ""
    };
    println!("crash checker{mode}: {checked} crash states checked, {violations} violated a rule ({} log entries, {} flushes, {fast_commits} fast commits)", total, flushes.len());
    assert_eq!(
        violations, 0,
        "{violations} of {checked} crash states violated a rule"
    );
}

/// Orphans the kernel left in its orphan file (open files it had unlinked when the machine
/// "crashed"): a small one, an 80 MiB one spread over some 320 groups (freed in pieces, a
/// transaction each) and another small one. uext4 processes them at open on a recording
/// device; a crash at any point of that processing must leave an image that uext4 opens
/// again and e2fsck finds clean after it, and that e2fsck -fy alone repairs to clean (its
/// own orphan processing). Each entry leaves the orphan file in the same transaction as its
/// inode's last change: a freed inode still listed would make the next open fail.
#[test]
fn kernel_orphans_processed_in_pieces_recover_at_every_crash_point() {
    if !can_loop_mount() {
        return;
    }
    let img = scratch("crash-korphan");
    mke2fs(
        &img.0,
        "128M",
        &[
            "-b",
            "1024",
            "-g",
            "256",
            "-N",
            "4096",
            "-J",
            "size=1",
            "-O",
            "orphan_file",
        ],
    );
    let crashed = {
        let m = KernelMount::new(&img.0);
        let mut held = Vec::new();
        for (name, size) in [("s1", 10_000usize), ("big", 0), ("s2", 20_000)] {
            let path = m.dir.join(name);
            if size > 0 {
                std::fs::write(&path, tagged(40, 0, size)).unwrap();
            } else {
                sh(&format!("fallocate -l 80M {}", path.display()));
                sh(&format!(
                    "dd if=/dev/zero of={} bs=64k count=4 conv=notrunc status=none",
                    path.display()
                ));
            }
            held.push(std::fs::File::open(&path).unwrap());
            std::fs::remove_file(&path).unwrap();
        }
        sh("sync");
        let crashed = std::fs::read(&img.0).unwrap();
        drop(held);
        crashed
    };
    let dev = Arc::new(RecordingDevice::new(crashed));
    let fs = Fs::open_dev(dev.clone(), opts::no_timer()).unwrap();
    assert_eq!(
        fs.txn_stats().unjournaled_commits.load(Ordering::Relaxed),
        0,
        "orphan processing bypassed the journal"
    );
    assert!(
        fs.txn_stats().commits.load(Ordering::Relaxed) >= 2,
        "the large orphan was not freed in pieces ({} commits)",
        fs.txn_stats().commits.load(Ordering::Relaxed)
    );
    fs.unmount().unwrap();
    drop(fs);
    let flushes = dev.flush_points();
    let file = scratch("crash-korphan-state");
    let mut bad = Vec::new();
    for &at in &flushes {
        let img = dev.crash_image(at, &mut |_| false);
        let mdev = Arc::new(MemDevice::from_vec(img.clone()));
        match Fs::open_dev(mdev.clone(), MountOptions::default()) {
            Ok(fs) => {
                fs.unmount().unwrap();
                drop(fs);
                std::fs::write(&file.0, mdev.to_vec()).unwrap();
                let out = sh_status(&format!("e2fsck -fn {}", file.0.display()));
                if let Err(o) = out {
                    bad.push(format!("at {at}: after uext4's recovery, e2fsck: {o}"));
                }
            }
            Err(e) => bad.push(format!("at {at}: uext4 cannot open the crash state: {e}")),
        }
        std::fs::write(&file.0, &img).unwrap();
        let _ = sh_status(&format!("e2fsck -fy {}", file.0.display()));
        if let Err(o) = sh_status(&format!("e2fsck -fn {}", file.0.display())) {
            bad.push(format!("at {at}: after e2fsck -fy, e2fsck -fn: {o}"));
        }
    }
    println!(
        "kernel orphans in pieces: {} crash states checked, {} violated a rule",
        flushes.len(),
        bad.len()
    );
    assert!(bad.is_empty(), "{:#?}", &bad[..bad.len().min(5)]);
}

/// Runs a shell command: Ok, or Err with the first lines of its output.
fn sh_status(cmd: &str) -> Result<(), String> {
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .unwrap();
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stdout)
            .lines()
            .take(6)
            .collect::<Vec<_>>()
            .join(" | "))
    }
}
