//! Fast commits written by the kernel, replayed three ways: an image made with
//! `mke2fs -O fast_commit` is mounted by the kernel with commit=600 (so no periodic full
//! commit happens), changed with an fsync after each change, and copied while still mounted:
//! the copy's journal holds the log's full commits and, after them, fast commits. The tree
//! the kernel's own replay gives (a read-write loop mount of one copy), the one e2fsck -fy
//! gives, and the ones uext4 gives (read-only in memory, leaving the image byte for byte as it
//! was; read-write, then e2fsck -fn clean) must be the same: names, kinds, sizes, modes, link
//! counts, contents. Needs root, loop devices and a kernel with fast_commit; says so and skips
//! otherwise.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use uext4::blockdev::RecordingDevice;
use uext4::{Fs, MountOptions};

/// What is compared of each file.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Entry {
    mode: u32,
    size: u64,
    nlink: u32,
    /// The bytes of a regular file, the target of a symlink, nothing for a directory.
    content: Vec<u8>,
}

type Tree = BTreeMap<String, Entry>;

/// The tree under a host directory (the kernel's mount).
fn host_tree(root: &Path) -> Tree {
    let mut t = Tree::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}/{}", e.file_name().to_string_lossy());
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let content = if m.file_type().is_symlink() {
                std::fs::read_link(e.path())
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push((e.path(), name.clone()));
            }
            t.insert(
                name,
                Entry {
                    mode: m.mode(),
                    size: m.size(),
                    nlink: m.nlink() as u32,
                    content,
                },
            );
        }
    }
    t
}

/// The tree as uext4 reads it.
fn uext4_tree(fs: &Fs) -> Tree {
    let mut t = Tree::new();
    let mut stack = vec![(fs.root_ino(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let mut names = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                names.push((e.ino, e.name));
            }
            true
        })
        .unwrap();
        for (ino, n) in names {
            let name = format!("{rel}/{}", String::from_utf8_lossy(&n));
            let a = fs.getattr(ino).unwrap();
            let kind = a.mode as u32 & 0o170000;
            let content = match kind {
                0o120000 => fs.readlink(ino).unwrap(),
                0o100000 => read_all(fs, ino),
                _ => Vec::new(),
            };
            if kind == 0o040000 {
                stack.push((ino, name.clone()));
            }
            t.insert(
                name,
                Entry {
                    mode: a.mode as u32,
                    size: a.size,
                    nlink: a.nlink,
                    content,
                },
            );
        }
    }
    t
}

/// Runs `cmd`, failing the test with its output if it fails. A mount or umount is tried
/// up to five times, 200 ms apart: loop mounts made by tests running at once can race for a
/// loop device, and a umount can find the mount busy for a moment.
fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    let tries = if cmd == "mount" || cmd == "umount" {
        5
    } else {
        1
    };
    let mut out = Command::new(cmd).args(args).output().unwrap();
    for _ in 1..tries {
        if out.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        out = Command::new(cmd).args(args).output().unwrap();
    }
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn fsync(p: &Path) {
    std::fs::File::open(p).unwrap().sync_all().unwrap();
}

/// Frees `len` bytes at `off` of a file (fallocate PUNCH_HOLE | KEEP_SIZE).
fn punch(p: &Path, off: i64, len: i64) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    let flags = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        unsafe { libc::fallocate(f.as_raw_fd(), flags, off, len) },
        0
    );
    f.sync_all().unwrap();
}

/// A full commit of the whole filesystem (syncfs), as a periodic commit would make.
fn syncfs(p: &Path) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
}

/// The changes made under the kernel, each followed by an fsync of what it changed (fast
/// commits: create, write, append, link, unlink, rename, truncate, punch). With
/// `new_dir_and_symlink` a directory and a symlink are made among them too (this kernel,
/// 6.18, commits those in full: the fast commits after them hold a file created in the new
/// directory); without, the directory is fully committed (syncfs) before the fast commits
/// and there is no symlink, and e2fsck's replay is compared too: e2fsck 1.47's replay fails
/// on images where either follows the first fast commit ("Ext2 inode is not a directory").
fn make_changes(m: &Path, new_dir_and_symlink: bool) {
    let w = |name: &str, data: &[u8]| {
        std::fs::write(m.join(name), data).unwrap();
        fsync(&m.join(name));
    };
    w("base", b"before the first fsync\n");
    std::fs::create_dir(m.join("dir")).unwrap();
    fsync(&m.join("dir"));
    if !new_dir_and_symlink {
        syncfs(m);
    }
    w("small", b"hello\n");
    let big: Vec<u8> = (0..40 * 4096u32).map(|i| (i * 13 % 251) as u8).collect();
    w("big", &big);
    w("dir/inner", b"in a directory\n");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.join("small"))
            .unwrap();
        f.write_all(&[b'a'; 9000]).unwrap();
        f.sync_all().unwrap();
    }
    std::fs::hard_link(m.join("small"), m.join("small-link")).unwrap();
    fsync(&m.join("small"));
    w("gone", b"to be removed\n");
    std::fs::hard_link(m.join("gone"), m.join("gone-link")).unwrap();
    fsync(&m.join("gone"));
    std::fs::remove_file(m.join("gone-link")).unwrap();
    fsync(&m.join("gone"));
    std::fs::rename(m.join("dir/inner"), m.join("dir/renamed")).unwrap();
    fsync(&m.join("dir/renamed"));
    punch(&m.join("big"), 8192, 16384);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.join("big"))
        .unwrap();
    f.set_len(100_000).unwrap();
    f.sync_all().unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.join("big"))
            .unwrap();
        f.write_at(b"overwritten in place", 30_000).unwrap();
        f.sync_all().unwrap();
    }
    if new_dir_and_symlink {
        std::os::unix::fs::symlink("small", m.join("sym")).unwrap();
        fsync(&m.join("small"));
        std::fs::create_dir(m.join("dir/sub")).unwrap();
        fsync(&m.join("dir/sub"));
        w("dir/sub/deep", b"in a new directory\n");
    }
    w("last", b"the last fast commit\n");
}

/// Fast commits the image's journal holds, as debugfs's logdump lists them after the log.
fn logdump_tails(img: &Path) -> usize {
    let out = run("debugfs", &["-R", "logdump", &img.display().to_string()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some(area) = text.split("*** Fast Commit Area ***").nth(1) else {
        return 0;
    };
    eprintln!("fast-commit area of {}:{area}", img.display());
    area.lines().filter(|l| l.starts_with("tag TAIL")).count()
}

/// Whether the kernel, the tools and loop mounts are here; says what is missing.
fn usable() -> bool {
    if !can_loop_mount() || !have(&["mke2fs", "e2fsck", "debugfs", "mount", "umount"]) {
        return false;
    }
    if !Path::new("/sys/fs/ext4/features/fast_commit").exists() {
        eprintln!("SKIP: the kernel's ext4 has no fast_commit");
        return false;
    }
    true
}

#[test]
fn kernel_fast_commits_replay_as_the_kernel_and_e2fsck_replay_them() {
    if usable() {
        replay_three_ways(false);
    }
}

#[test]
fn kernel_fast_commits_among_full_commits_of_a_directory_and_symlink_replay_as_the_kernel_does() {
    if usable() {
        replay_three_ways(true);
    }
}

/// The kernel's fast commits on a bigalloc filesystem (16 KiB clusters): uext4's replay
/// gives the tree the kernel's gives, and leaves the image e2fsck-clean. The kernel's own
/// replay is not: it counts i_blocks in blocks (ext4_ext_replay_set_iblocks), where e2fsck
/// wants whole clusters, so only its tree is the oracle; e2fsck's replay is not compared.
#[test]
fn kernel_fast_commits_on_bigalloc_replay_as_the_kernel_does() {
    if usable() {
        replay_on(false, &["-O", "fast_commit,bigalloc", "-C", "16384"]);
    }
}

/// The scenario of the module comment; e2fsck's replay is compared unless
/// `new_dir_and_symlink` (see `make_changes`).
fn replay_three_ways(new_dir_and_symlink: bool) {
    replay_on(new_dir_and_symlink, &["-O", "fast_commit"])
}

/// `replay_three_ways` on an image mke2fs makes with `mkfs`; with bigalloc, the kernel's
/// replay gives the tree but is not e2fsck-checked, and e2fsck's is not compared.
fn replay_on(new_dir_and_symlink: bool, mkfs: &[&str]) {
    let bigalloc = mkfs.iter().any(|o| o.contains("bigalloc"));
    let img = scratch("fc-live");
    mke2fs(&img.0, "64M", mkfs);
    let mnt = MountPlace::new(
        match (new_dir_and_symlink, bigalloc) {
            (_, true) => "fc-bigalloc",
            (true, false) => "fc-dirs",
            (false, false) => "fc",
        },
        &["live", "kernel"],
    );
    let live = mnt.point(0);
    let imgs = img.0.display().to_string();
    run(
        "mount",
        &["-o", "loop,commit=600", &imgs, &live.display().to_string()],
    );
    make_changes(&live, new_dir_and_symlink);
    // The copy, while the kernel still has the image mounted: what a power cut leaves.
    let crash = scratch("fc-crash");
    std::fs::copy(&img.0, &crash.0).unwrap();
    run("umount", &[&live.display().to_string()]);
    let tails = logdump_tails(&crash.0);
    assert!(tails > 0, "the copy holds no fast commits");

    // The kernel's replay.
    let k = scratch("fc-kernel");
    std::fs::copy(&crash.0, &k.0).unwrap();
    let kmnt = mnt.point(1);
    run(
        "mount",
        &[
            "-o",
            "loop",
            &k.0.display().to_string(),
            &kmnt.display().to_string(),
        ],
    );
    let want = host_tree(&kmnt);
    run("umount", &[&kmnt.display().to_string()]);
    for name in [
        "/base",
        "/small",
        "/small-link",
        "/big",
        "/gone",
        "/last",
        "/dir/renamed",
    ] {
        assert!(
            want.contains_key(name),
            "{name} missing after the kernel's replay: {want:?}"
        );
    }
    assert!(!want.contains_key("/gone-link") && !want.contains_key("/dir/inner"));

    if new_dir_and_symlink {
        assert!(want.contains_key("/sym") && want.contains_key("/dir/sub/deep"));
    } else if !bigalloc {
        replay_by_e2fsck(&crash.0, &want);
    }
    if !new_dir_and_symlink {
        power_cuts_during_replay(&crash.0, &want);
    }
    replay_by_uext4(&crash.0, &want);
}

/// A read-write replay on a recording device, cut at every flush and at points between
/// (writes after the last flush kept, or every other one kept): every state opens to `want`
/// (the replay resumes or is done over), and a read-write open of it leaves it e2fsck-clean.
fn power_cuts_during_replay(crash: &Path, want: &Tree) {
    use uext4::blockdev::{MemDevice, Record, RecordingDevice};
    let rec = Arc::new(RecordingDevice::new(std::fs::read(crash).unwrap()));
    let fs = Fs::open_dev(rec.clone(), MountOptions::default()).unwrap();
    assert_eq!(&uext4_tree(&fs), want);
    let bs = fs.statfs().block_size as u64;
    let jsb = fs.ext_list(8).unwrap()[0].pblk * bs;
    fs.unmount().unwrap();
    drop(fs);
    // The journal is marked empty only once every replayed block is on the device: a flush
    // lies between the last other write and the first write of the journal's superblock.
    let log = rec.log();
    let first_jsb = log
        .iter()
        .position(|r| matches!(r, Record::Write { off, .. } if *off == jsb))
        .expect("the journal's superblock is written");
    let last_other = log[..first_jsb]
        .iter()
        .rposition(|r| matches!(r, Record::Write { off, .. } if *off >= 2048))
        .expect("the replay wrote blocks");
    assert!(
        log[last_other..first_jsb]
            .iter()
            .any(|r| matches!(r, Record::Flush)),
        "the journal was marked empty before the replayed blocks were flushed"
    );
    let n = rec.log_len();
    let mut points = rec.flush_points();
    points.extend((1..n).step_by(n.div_ceil(40).max(1)));
    let cut = scratch("fc-cut");
    for (k, &upto) in points.iter().enumerate() {
        for every_other in [false, true] {
            let img = rec.crash_image(upto, &mut |i| !every_other || i % 2 == 0);
            let dev = Arc::new(MemDevice::from_vec(img.clone()));
            let fs = Fs::open_dev(dev, MountOptions::ro()).unwrap();
            assert_eq!(
                &uext4_tree(&fs),
                want,
                "cut {k} at write {upto} of {n} (every other: {every_other})"
            );
            drop(fs);
            if k % 4 == 0 {
                std::fs::write(&cut.0, &img).unwrap();
                let fs = Fs::open_path(&cut.0, MountOptions::default()).unwrap();
                fs.unmount().unwrap();
                drop(fs);
                e2fsck_clean_when(&cut.0, &format!("cut at write {upto}, then opened"));
            }
        }
    }
}

/// e2fsck -fy's replay of a copy of `crash` must give `want`.
fn replay_by_e2fsck(crash: &Path, want: &Tree) {
    let e = scratch("fc-e2fsck");
    std::fs::copy(crash, &e.0).unwrap();
    let st = Command::new("e2fsck")
        .args(["-fy", &e.0.display().to_string()])
        .output()
        .unwrap();
    assert!(st.status.code().unwrap_or(8) <= 1, "e2fsck -fy: {st:?}");
    e2fsck_clean(&e.0);
    let fs = Fs::open_path(&e.0, MountOptions::ro()).unwrap();
    assert_eq!(
        &uext4_tree(&fs),
        want,
        "e2fsck's replay differs from the kernel's"
    );
}

/// uext4's replays of `crash`, read-only in memory then read-write, must give `want`.
fn replay_by_uext4(crash: &Path, want: &Tree) {
    let before = std::fs::read(crash).unwrap();
    let fs = Fs::open_path(crash, MountOptions::ro()).unwrap();
    assert!(fs.journal_replayed_in_memory());
    assert_eq!(&uext4_tree(&fs), want, "uext4's in-memory replay differs");
    drop(fs);
    assert!(
        std::fs::read(crash).unwrap() == before,
        "a read-only open changed the image"
    );
    // Read-write: the replay written, the image clean, the tree the same again.
    let fs = Fs::open_path(crash, MountOptions::default()).unwrap();
    assert_eq!(&uext4_tree(&fs), want, "uext4's read-write replay differs");
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(crash, "after uext4's read-write replay");
    let fs = Fs::open_path(crash, MountOptions::ro()).unwrap();
    assert!(!fs.journal_replayed_in_memory());
    assert_eq!(
        &uext4_tree(&fs),
        want,
        "the replayed image reads back differently"
    );
}

/// The number after `"key":` in a flat JSON object.
fn json_u64(json: &str, key: &str) -> u64 {
    let at = json.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
    json[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

/// uext4's own full commits on a fast_commit filesystem (fast commits turned off) go round
/// the log several times and never write the fast-commit area (the journal's last
/// s_num_fc_blks blocks, zero as mke2fs left them, and the block before it); the read-write
/// open sets the journal's fast_commit feature as the kernel's mount does (mke2fs leaves it
/// clear), and the image stays e2fsck-clean.
#[test]
fn our_log_wraps_before_the_fast_commit_area() {
    if !have(&["mke2fs", "e2fsck"]) {
        return;
    }
    let img = scratch("fc-wrap");
    mke2fs(&img.0, "32M", &["-O", "fast_commit"]);
    let opts = MountOptions {
        fast_commit: false,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&img.0, opts).unwrap();
    let (log_len, fc) = {
        let mut b = vec![0u8; 4096];
        fs.read(8, 0, &mut b).unwrap();
        let js = uext4::journal::format::JournalSuperblock::parse(&b).unwrap();
        assert_eq!(js.num_fc_blks, 16, "mke2fs's area for 32 MiB");
        (
            js.maxlen - js.num_fc_blks - 1,
            js.maxlen - js.num_fc_blks + 1..js.maxlen,
        )
    };
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut i = 0u64;
    while json_u64(&fs.stats_json(), "log_blocks") < 3 * log_len as u64 {
        fs.write(f, (i % 64) * 4096, &[i as u8; 4096]).unwrap();
        fs.fsync(f, false).unwrap();
        i += 1;
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let mut b = vec![0u8; 4096];
    fs.read(8, 0, &mut b).unwrap();
    let js = uext4::journal::format::JournalSuperblock::parse(&b).unwrap();
    assert!(
        js.fc_blocks() == Some(16),
        "the journal's fast_commit feature is set at a read-write open, as the kernel sets it"
    );
    for blk in fc.start - 1..fc.end {
        fs.read(8, blk as u64 * 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "journal block {blk} (fast-commit area {fc:?}) was written"
        );
    }
}

/// Fast commits written here by hand after an empty log (s_start set, no transaction):
/// records naming inodes the filesystem does not have, or a name that is not there, are
/// skipped; a LINK and a DEL_RANGE are replayed, read-only in memory and read-write (then
/// e2fsck -fn clean). Needs no root.
#[test]
fn hand_written_fast_commits_replay_and_bad_records_are_skipped() {
    use std::os::unix::fs::FileExt;
    use uext4::format::fast_commit::*;
    if !have(&["mke2fs", "e2fsck"]) {
        return;
    }
    let img = scratch("fc-hand");
    mke2fs(&img.0, "32M", &["-O", "fast_commit"]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[7u8; 3 * 4096]).unwrap();
    // The journal's blocks on the device (mke2fs may lay it out in pieces).
    let jext = fs.ext_list(8).unwrap();
    let jphys = |l: u32| {
        let e = jext
            .iter()
            .find(|e| (e.lblk..e.lblk + e.len).contains(&l))
            .unwrap();
        (e.pblk + (l - e.lblk) as u64) * 4096
    };
    fs.unmount().unwrap();
    drop(fs);
    // The journal: an empty log to recover (s_start = s_first, nothing there), so the fast
    // commits must carry s_sequence.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img.0)
        .unwrap();
    let mut b = vec![0u8; 4096];
    file.read_exact_at(&mut b, jphys(0)).unwrap();
    let mut js = uext4::journal::format::JournalSuperblock::parse(&b).unwrap();
    let (tid, area) = (js.sequence, js.maxlen - js.num_fc_blks + 1);
    js.start = js.first;
    file.write_all_at(&js.to_bytes(), jphys(0)).unwrap();
    file.write_all_at(&[0u8; 4096], jphys(js.first)).unwrap();
    let dentry = |parent: u32, ino: u32, name: &[u8]| {
        let mut v = parent.to_le_bytes().to_vec();
        v.extend_from_slice(&ino.to_le_bytes());
        v.extend_from_slice(name);
        v
    };
    let mut rec = Vec::new();
    let head: Vec<u8> = [0u32, tid].iter().flat_map(|x| x.to_le_bytes()).collect();
    encode(&mut rec, TAG_HEAD, &head);
    encode(&mut rec, TAG_LINK, &dentry(2, f, b"alias"));
    encode(&mut rec, TAG_UNLINK, &dentry(2, f, b"not-there"));
    encode(&mut rec, TAG_LINK, &dentry(2, 0, b"zero"));
    let del: Vec<u8> = [f, 1, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
    encode(&mut rec, TAG_DEL_RANGE, &del);
    let bogus: Vec<u8> = [9_999_999u32, 0, 5]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    encode(&mut rec, TAG_DEL_RANGE, &bogus);
    let start = rec.len();
    rec.extend_from_slice(&TAG_TAIL.to_le_bytes());
    rec.extend_from_slice(&((4096 - start - TL_SIZE) as u16).to_le_bytes());
    rec.extend_from_slice(&tid.to_le_bytes());
    let crc = uext4::format::csum::crc32c(0, &rec[..start + TL_SIZE + 4]);
    rec.extend_from_slice(&crc.to_le_bytes());
    rec.resize(4096, 0);
    file.write_all_at(&rec, jphys(area)).unwrap();
    drop(file);
    let check = |fs: &Fs| {
        let a = fs.lookup(fs.root_ino(), b"alias").unwrap();
        assert_eq!((a.ino, a.nlink), (f, 2));
        let ext = fs.ext_list(f).unwrap();
        assert!(
            ext.iter().all(|e| !(e.lblk..e.lblk + e.len).contains(&1)),
            "block 1 unmapped: {ext:?}"
        );
        let mut d = vec![0u8; 3 * 4096];
        fs.read(f, 0, &mut d).unwrap();
        assert!(d[4096..8192].iter().all(|&x| x == 0) && d[..4096].iter().all(|&x| x == 7));
    };
    let before = std::fs::read(&img.0).unwrap();
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    check(&fs);
    drop(fs);
    assert!(
        std::fs::read(&img.0).unwrap() == before,
        "read-only open changed the image"
    );
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    check(&fs);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean_when(&img.0, "after the replay of hand-written fast commits");
}

/// uext4's own fast commits, for each workload (`WORKLOADS`): on an image with fast_commit,
/// files are changed and fsynced after a full commit; every fsync is answered by a fast
/// commit (no full commit after the setup), and the device as it is then (a power cut:
/// nothing more reaches it) is replayed by the kernel and by uext4 (read-only in memory and
/// read-write) to the tree uext4 showed before the cut, e2fsck -fn clean after either;
/// e2fsck -fy's replay is only reported (`report_e2fsck_replay`).
#[test]
fn our_fast_commits_replay_as_the_kernel_replays_them() {
    if !usable() {
        return;
    }
    for (name, workload, tails) in WORKLOADS {
        eprintln!("workload: {name}");
        let (rec, fs) = recorded_fast_commit_fs("fc-ours");
        let want = workload(&fs, &|| {});
        let crash = scratch("fc-ours-crash");
        std::fs::write(&crash.0, rec.crash_image(rec.log_len(), &mut |_| true)).unwrap();
        fs.crash();
        assert_eq!(
            logdump_tails(&crash.0),
            tails,
            "{name}: debugfs sees the last {tails} fast commits"
        );

        let k = scratch("fc-ours-kernel");
        std::fs::copy(&crash.0, &k.0).unwrap();
        let mnt = MountPlace::new("fc-ours", &["kernel"]);
        let kmnt = mnt.point(0);
        let (ks, km) = (k.0.display().to_string(), kmnt.display().to_string());
        run("mount", &["-o", "loop", &ks, &km]);
        let kernel = host_tree(&kmnt);
        run("umount", &[&km]);
        assert_eq!(
            kernel, want,
            "{name}: the kernel's replay of uext4's fast commits differs"
        );
        e2fsck_clean_when(
            &k.0,
            &format!("{name}: after the kernel replayed uext4's fast commits"),
        );
        report_e2fsck_replay(&crash.0, &want);
        replay_by_uext4(&crash.0, &want);
    }
}

/// A fresh `mke2fs -O fast_commit` image on a recording device (every write kept, for
/// crash states), opened read-write without a periodic commit.
fn recorded_fast_commit_fs(tag: &str) -> (Arc<RecordingDevice>, Arc<Fs>) {
    let img = scratch(tag);
    mke2fs(&img.0, "64M", &["-O", "fast_commit"]);
    let rec = Arc::new(RecordingDevice::new(std::fs::read(&img.0).unwrap()));
    let opts = MountOptions {
        commit_interval_secs: 0,
        ..MountOptions::default()
    };
    let fs = Fs::open_dev(rec.clone(), opts).unwrap();
    (rec, fs)
}

/// A workload on a fast_commit filesystem: it calls its second argument after its setup's
/// full commit, and returns the tree uext4 shows at its end.
type Workload = fn(&Fs, &dyn Fn()) -> Tree;

/// The workloads of the tests of uext4's own fast commits, each with the number of fast
/// commits the area holds at its end.
const WORKLOADS: [(&str, Workload, usize); 2] = [
    ("data", fast_commit_workload_marked, 11),
    ("names", fast_commit_names_workload, 7),
];

/// e2fsck -fy's replay of a copy of `crash`, reported, not asserted: e2fsck 1.47.0's
/// fast-commit replay damages these images (records about files that existed at the last
/// full commit: it has lost the mapping of /a's first block and the directory /d, whose
/// file it then puts in lost+found), where the kernel's replay and uext4's agree. Prints
/// the paths whose entry differs from `want`.
fn report_e2fsck_replay(crash: &Path, want: &Tree) {
    let e = scratch("fc-e2fsck-report");
    std::fs::copy(crash, &e.0).unwrap();
    let st = Command::new("e2fsck")
        .args(["-fy", &e.0.display().to_string()])
        .output()
        .unwrap();
    eprintln!("e2fsck -fy: exit {:?}", st.status.code());
    let Ok(fs) = Fs::open_path(&e.0, MountOptions::ro()) else {
        eprintln!("e2fsck's replay: the image does not open");
        return;
    };
    let got = uext4_tree(&fs);
    for k in want.keys().chain(got.keys()) {
        if want.get(k) != got.get(k) {
            eprintln!("e2fsck's replay differs from the kernel's at {k}");
        }
    }
}

/// The data workload: a full commit of the starting tree, then writes, truncates, a chmod,
/// creates, a punched hole and a preallocation, each fsynced, that must all be fast commits (calling `setup_done` after the
/// setup's full commit). Returns the tree.
fn fast_commit_workload_marked(fs: &Fs, setup_done: &dyn Fn()) -> Tree {
    let root = fs.root_ino();
    let mk = |dir: u32, name: &[u8], data: &[u8]| {
        let f = fs.create(dir, name, 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, data).unwrap();
        f
    };
    let a = mk(root, b"a", b"first line\n");
    let b = mk(root, b"b", &[b'b'; 8 * 4096]);
    let big = mk(root, b"big", &[7u8; 40 * 4096]);
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = mk(d, b"f", b"in d\n");
    let log = mk(root, b"log", b"");
    fs.commit().unwrap();
    setup_done();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let t = fs.txn_stats();
    let before = l(&t.commits);
    for i in 0..40u64 {
        let line = format!("line {i} of the log, fsynced on its own\n");
        let at = fs.getattr(log).unwrap().size;
        fs.write(log, at, line.repeat(1 + (i as usize % 7) * 20).as_bytes())
            .unwrap();
        fs.fsync(log, i % 2 == 0).unwrap();
    }
    // Each fast commit ends on a block boundary, and the area's last block is a guard
    // (journal/fast_commit.rs), so the 15 blocks of this area hold 14; the fsync that finds
    // it full commits in full (as the kernel's), which empties it.
    let (fast, full) = (l(&t.fast_commits), l(&t.commits) - before);
    assert_eq!(fast + full, 40, "one commit per fsync");
    assert_eq!(full, l(&t.fast_commit_fallbacks));
    assert_eq!(full, 40 / 15, "only a full area may cause a full commit");
    // After a full commit, nine fast commits, all in the area after the crash.
    fs.commit().unwrap();
    fs.write(a, 11, &[b'a'; 9000]).unwrap();
    fs.fsync(a, false).unwrap();
    fs.write(b, 4096 + 10, b"overwritten in place").unwrap();
    fs.fsync(b, false).unwrap();
    fs.write(big, 200 * 4096 + 5, b"far past the end").unwrap();
    fs.fsync(big, true).unwrap();
    fs.write(f, 5, &[b'f'; 5000]).unwrap();
    fs.fsync(f, false).unwrap();
    // Truncates down (DEL_RANGE to the last block) and up (the size only), a chmod.
    fs.truncate(big, 10 * 4096 + 100).unwrap();
    fs.fsync(big, false).unwrap();
    fs.truncate(b, 20 * 4096).unwrap();
    fs.fsync(b, true).unwrap();
    let chmod = uext4::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(a, &chmod).unwrap();
    fs.fsync(a, false).unwrap();
    // New files (CREAT after their INODE), one in the root and one in d, with data.
    let n1 = mk(root, b"new1", b"created, then fsynced\n");
    fs.fsync(n1, false).unwrap();
    let n2 = mk(d, b"new2", &[b'n'; 3 * 4096 + 17]);
    fs.fsync(n2, true).unwrap();
    // A hole punched across blocks 2-4 of /big (DEL_RANGE, partial blocks zeroed), and
    // unwritten blocks preallocated past the end of /b (ADD_RANGE of unwritten extents).
    use uext4::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
    fs.fallocate(
        big,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        2 * 4096 - 100,
        3 * 4096 + 200,
    )
    .unwrap();
    fs.fsync(big, false).unwrap();
    fs.fallocate(b, FALLOC_FL_KEEP_SIZE, 20 * 4096, 8 * 4096)
        .unwrap();
    fs.fsync(b, false).unwrap();
    assert_eq!(l(&t.fast_commits), fast + 11);
    assert_eq!(l(&t.commits), before + full + 1);
    uext4_tree(fs)
}

/// The names workload (LINK and UNLINK records): after the setup's full commit, a package
/// manager's pattern (a new file written and fsynced under a temporary name, renamed over
/// the old one, fsynced), a hard link into another directory, one of two names removed, a
/// file removed (freed), a file moved into another directory, a file removed while open;
/// each followed by an fsync that must be a fast commit. Returns the tree.
fn fast_commit_names_workload(fs: &Fs, setup_done: &dyn Fn()) -> Tree {
    use uext4::RenameFlags;
    let root = fs.root_ino();
    let mk = |dir: u32, name: &[u8], data: &[u8]| {
        let f = fs.create(dir, name, 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, data).unwrap();
        f
    };
    mk(root, b"pkg.so", &[1u8; 3 * 4096 + 5]);
    mk(root, b"doomed", &[2u8; 5000]);
    let pair = mk(root, b"pair", b"two names\n");
    fs.link(pair, root, b"pair2").unwrap();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let mover = mk(root, b"mover", &[3u8; 9000]);
    let held = mk(root, b"held", &[4u8; 4096]);
    fs.commit().unwrap();
    setup_done();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let t = fs.txn_stats();
    let (fast, full) = (l(&t.fast_commits), l(&t.commits));
    let tmp = mk(root, b".pkg.so.tmp", &[5u8; 2 * 4096 + 1]);
    fs.fsync(tmp, false).unwrap();
    fs.rename(
        root,
        b".pkg.so.tmp",
        root,
        b"pkg.so",
        RenameFlags::default(),
    )
    .unwrap();
    fs.fsync(tmp, false).unwrap();
    fs.link(mover, d, b"mover-link").unwrap();
    fs.fsync(mover, false).unwrap();
    fs.unlink(root, b"pair2").unwrap();
    fs.fsync(pair, false).unwrap();
    fs.unlink(root, b"doomed").unwrap();
    fs.fsync(root, false).unwrap();
    fs.rename(root, b"mover", d, b"moved", RenameFlags::default())
        .unwrap();
    fs.fsync(mover, false).unwrap();
    fs.open(held).unwrap();
    fs.unlink(root, b"held").unwrap();
    fs.fsync(root, false).unwrap();
    assert_eq!(l(&t.fast_commits) - fast, 7, "every fsync a fast commit");
    assert_eq!(l(&t.commits), full, "no full commit after the setup");
    uext4_tree(fs)
}

/// The kernel as the oracle of power cuts during uext4's fast commits: each workload of
/// `WORKLOADS` on a recording device, cut at its flush points after the setup's full commit
/// (every third one); in each state uext4's replay (read-only, in memory) and the kernel's
/// (loop mount) give the same tree, and the image is e2fsck-clean after the kernel's replay
/// and unmount.
#[test]
fn power_cuts_during_our_fast_commits_replay_as_the_kernel_replays_them() {
    use uext4::blockdev::MemDevice;
    if !usable() {
        return;
    }
    for (name, workload, _) in WORKLOADS {
        let (rec, fs) = recorded_fast_commit_fs("fc-cuts");
        let setup_done = std::sync::atomic::AtomicUsize::new(0);
        workload(&fs, &|| {
            setup_done.store(rec.log_len(), std::sync::atomic::Ordering::Relaxed)
        });
        fs.crash();
        let from = setup_done.load(std::sync::atomic::Ordering::Relaxed);
        let points: Vec<usize> = rec
            .flush_points()
            .into_iter()
            .filter(|&p| p >= from)
            .step_by(3)
            .collect();
        assert!(
            points.len() >= 4,
            "{name}: only {} cut points",
            points.len()
        );
        let mnt = MountPlace::new("fc-cuts", &["kernel"]);
        let km = mnt.point(0).display().to_string();
        let cut = scratch("fc-cut-state");
        let cs = cut.0.display().to_string();
        for &at in &points {
            let state = rec.crash_image(at, &mut |_| true);
            let dev = Arc::new(MemDevice::from_vec(state.clone()));
            let ours = uext4_tree(&Fs::open_dev(dev, MountOptions::ro()).unwrap());
            std::fs::write(&cut.0, &state).unwrap();
            run("mount", &["-o", "loop", &cs, &km]);
            let kernel = host_tree(Path::new(&km));
            run("umount", &[&km]);
            assert_eq!(
                ours, kernel,
                "{name}: cut at write {at}: uext4's replay differs from the kernel's"
            );
            e2fsck_clean_when(
                &cut.0,
                &format!("{name}: cut at write {at}, replayed by the kernel"),
            );
        }
    }
}
