//! uext4's own mkfs: every supported configuration passes `e2fsck -fn` without a complaint,
//! opens and takes writes in uext4 (and still passes), mounts under the kernel, which can then
//! fill it with a 10,000-entry directory (and e2fsck still passes); and the layout is the one
//! `mke2fs -t ext4` of e2fsprogs 1.47 makes, compared field by field with `dumpe2fs`.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use uext4::blockdev::{BlockDevice, FileDevice, MemDevice};
use uext4::mkfs::{mkfs, MkfsOptions};
use uext4::{Fs, MountOptions};

const MIB: u64 = 1 << 20;

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-V").output().is_ok()
}

/// Makes `path` a sparse file of `size` bytes and runs our mkfs on it.
fn make(path: &Path, size: u64, bs: u32, features: &str) {
    make_with(path, size, bs, 256, 16384, features)
}

fn make_with(path: &Path, size: u64, bs: u32, isz: u16, ratio: u32, features: &str) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let dev = FileDevice::open(path, false).unwrap();
    let mut o = MkfsOptions::default_for(size);
    o.block_size = bs;
    o.inode_size = isz;
    o.inode_ratio = ratio;
    o.assume_zeroed = true;
    o.features.apply(features).unwrap();
    mkfs(&dev, &o).unwrap_or_else(|e| panic!("mkfs {size} {bs} {features:?}: {e}"));
}

/// `e2fsck -fn`: exit status 0 and nothing said beyond the pass headers and the summary.
fn e2fsck_strict(path: &Path, what: &str) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(path)
        .output()
        .expect("e2fsck must be installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let complaints: Vec<&str> = text
        .lines()
        .filter(|l| {
            !(l.is_empty()
                || l.starts_with("e2fsck ")
                || l.starts_with("Pass ")
                || l.contains(" files (")
                // Clock skew on the test machine (e2fsck's own fudge of up to a day), not the
                // image: uext4 stamps the mount and write times with the current time.
                || (l.starts_with("Superblock last ") && l.ends_with(" is in the future."))
                || l.trim_start().starts_with("(by less than a day"))
        })
        .collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "{what}: e2fsck -fn complained about {}:\n{text}",
        path.display()
    );
}

/// Opens the image in uext4, writes a little, unmounts.
fn use_in_uext4(path: &Path, what: &str) {
    let fs = Fs::open_path(path, MountOptions::default())
        .unwrap_or_else(|e| panic!("{what}: Fs::open: {e}"));
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(fs.write(f, 0, &data).unwrap(), data.len());
    let mut back = vec![0u8; data.len()];
    assert_eq!(fs.read(f, 0, &mut back).unwrap(), data.len());
    assert_eq!(back, data, "{what}");
    assert_eq!(fs.lookup(2, b"lost+found").unwrap().ino, 11, "{what}");
    fs.unmount().unwrap();
}

/// A kernel mount that is unmounted (retrying while the kernel says it is busy) before the
/// image is checked, failing the test if it cannot be.
struct Mounted(Option<KernelMount>);

impl Mounted {
    fn new(img: &Path) -> Mounted {
        Mounted(Some(KernelMount::new(img)))
    }
    fn dir(&self) -> &Path {
        &self.0.as_ref().unwrap().dir
    }
    fn unmount(mut self) {
        let m = self.0.take().unwrap();
        assert!(m.try_unmount(), "could not unmount {}", m.dir.display());
        // Unmounted: skip KernelMount's own (second) umount.
        let _ = std::fs::remove_dir(&m.dir);
        std::mem::forget(m);
    }
}

/// Mounts with the kernel: a 10,000-entry directory (hard links, so that even the smallest
/// image has the inodes), some data, unmount.
fn use_in_kernel(path: &Path, what: &str) {
    let m = Mounted::new(path);
    let dir = m.dir().join("big");
    std::fs::create_dir(&dir).unwrap();
    let target = m.dir().join("target");
    std::fs::write(&target, b"x").unwrap();
    for i in 0..10_000 {
        std::fs::hard_link(&target, dir.join(format!("entry-number-{i}")))
            .unwrap_or_else(|e| panic!("{what}: link {i}: {e}"));
    }
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i ^ (i >> 8)) as u8).collect();
    std::fs::write(m.dir().join("data"), &data).unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 10_000, "{what}");
    assert_eq!(std::fs::read(m.dir().join("data")).unwrap(), data, "{what}");
    assert!(m.dir().join("lost+found").is_dir(), "{what}");
    m.unmount();
}

/// The whole round for one configuration.
fn round(size: u64, bs: u32, feats: &str, kernel: bool) {
    let what = format!("{} MiB, {bs}-byte blocks, features {feats:?}", size / MIB);
    let img = scratch("mkfs");
    make(&img.0, size, bs, feats);
    e2fsck_strict(&img.0, &what);
    use_in_uext4(&img.0, &what);
    e2fsck_strict(&img.0, &format!("{what}, after uext4 wrote"));
    if kernel {
        use_in_kernel(&img.0, &what);
        e2fsck_strict(&img.0, &format!("{what}, after the kernel wrote"));
    }
}

/// The configurations: the mke2fs default, without metadata_csum (uninit_bg then), without
/// 64bit, without resize_inode, with orphan_file and metadata_csum_seed, a few mixes, and
/// ext3, ext2 and ext4 with block maps.
const FEATURES: &[&str] = &[
    "",
    "^metadata_csum",
    "^64bit",
    "^resize_inode",
    "orphan_file,metadata_csum_seed",
    "^64bit,^metadata_csum,^resize_inode",
    "^flex_bg",
    "^metadata_csum,^uninit_bg",
    EXT3,
    EXT2,
    "^extent,^64bit",
];

/// What `mke2fs -t ext3` and `-t ext2` leave out of ext4's features (block maps).
const EXT3: &str =
    "^extent,^64bit,^flex_bg,^huge_file,^dir_nlink,^extra_isize,^metadata_csum,^uninit_bg";
const EXT2: &str = "^has_journal,^extent,^64bit,^flex_bg,^huge_file,^dir_nlink,^extra_isize,\
     ^metadata_csum,^uninit_bg";

fn size_matrix(size: u64, kernel_all: bool) {
    let kernel = can_loop_mount();
    for bs in [1024u32, 4096] {
        for (i, feats) in FEATURES.iter().enumerate() {
            // The kernel round is the slow part: all of it where asked, else a sample.
            let k = kernel && (kernel_all || i % 3 == 0);
            round(size, bs, feats, k);
        }
    }
}

#[test]
fn matrix_8mib() {
    size_matrix(8 * MIB, true);
}

#[test]
fn matrix_64mib() {
    size_matrix(64 * MIB, true);
}

#[test]
fn matrix_600mib() {
    size_matrix(600 * MIB, false);
}

#[test]
fn matrix_5gib() {
    size_matrix(5 << 30, false);
}

/// Lines of `dumpe2fs` that do not depend on the UUID, the hash seed or the time.
fn dumpe2fs_stable(path: &Path) -> Vec<String> {
    let out = Command::new("dumpe2fs").arg(path).output().unwrap();
    assert!(out.status.success(), "dumpe2fs {}", path.display());
    let skip = [
        "UUID",
        "Hash Seed",
        "created",
        "time",
        "Last checked",
        "Checksum:",
        "Checksum seed",
        "Journal features",
        "Journal checksum",
        "Journal users",
        "Lifetime writes",
    ];
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !skip.iter().any(|s| l.contains(s)))
        .map(|l| {
            // Checksums differ with the UUID (and any of them may be zero by chance); whether a
            // group is initialised shows in its flags.
            l.split(' ')
                .map(|w| if w.starts_with("0x") { "CSUM" } else { w })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn debugfs(path: &Path, req: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", req])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn layout_matches_mke2fs() {
    if !have("mke2fs") || !have("dumpe2fs") || !have("debugfs") {
        eprintln!("SKIP: e2fsprogs (mke2fs, dumpe2fs, debugfs) not installed");
        return;
    }
    let cases: &[(u64, u32, u16, u32, &str, &str)] = &[
        (8 * MIB, 1024, 256, 16384, "", ""),
        (8 * MIB, 4096, 256, 16384, "", ""),
        (64 * MIB, 4096, 256, 16384, "", ""),
        (600 * MIB, 1024, 256, 16384, "", ""),
        (600 * MIB, 4096, 256, 16384, "", ""),
        (5 << 30, 4096, 256, 16384, "", ""),
        (5 << 30, 1024, 256, 16384, "^flex_bg", "^flex_bg"),
        (
            600 * MIB,
            1024,
            256,
            16384,
            "^metadata_csum",
            "^metadata_csum,uninit_bg",
        ),
        (600 * MIB, 4096, 256, 16384, "^64bit", "^64bit"),
        (
            600 * MIB,
            1024,
            256,
            16384,
            "^resize_inode",
            "^resize_inode",
        ),
        (64 * MIB, 1024, 256, 16384, "orphan_file", "orphan_file"),
        // The journal grows by its fast-commit area (a 64th of the default log).
        (8 * MIB, 1024, 256, 16384, "fast_commit", "fast_commit"),
        (64 * MIB, 4096, 256, 16384, "fast_commit", "fast_commit"),
        (5 << 30, 4096, 256, 16384, "fast_commit", "fast_commit"),
        (64 * MIB, 4096, 256, 16384, "verity", "verity"),
        (600 * MIB, 1024, 256, 16384, "verity", "verity"),
        (64 * MIB, 4096, 256, 16384, "inline_data", "inline_data"),
        (600 * MIB, 1024, 256, 16384, "inline_data", "inline_data"),
        (64 * MIB, 4096, 256, 16384, "ea_inode", "ea_inode"),
        (600 * MIB, 1024, 256, 16384, "ea_inode", "ea_inode"),
        (600 * MIB, 4096, 256, 16384, "orphan_file", "orphan_file"),
        (
            64 * MIB,
            4096,
            256,
            16384,
            "^metadata_csum,^uninit_bg",
            "^metadata_csum",
        ),
        // mke2fs's "small" type: inode tables of a flex group run past the first group.
        (600 * MIB, 1024, 256, 4096, "", ""),
        (64 * MIB, 1024, 128, 4096, "", ""),
        (600 * MIB, 2048, 256, 16384, "", ""),
        (
            300 * MIB,
            4096,
            512,
            8192,
            "^64bit,^metadata_csum",
            "^64bit,^metadata_csum,uninit_bg",
        ),
        // Block maps: the journal's indirect blocks among its data, as mke2fs allocates them.
        (600 * MIB, 1024, 256, 16384, EXT3, EXT3),
        (5 << 30, 4096, 256, 16384, EXT3, EXT3),
        (600 * MIB, 4096, 128, 8192, EXT2, EXT2),
    ];
    for &(size, bs, isz, ratio, ours, theirs) in cases {
        let what = format!("{} MiB, {bs}, inode {isz}/{ratio}, {ours:?}", size / MIB);
        let reference = scratch("mkfs-ref");
        std::fs::File::create(&reference.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let mut cmd = Command::new("mke2fs");
        cmd.args(["-q", "-F", "-t", "ext4"])
            .args(["-I", &isz.to_string(), "-i", &ratio.to_string()])
            .args(["-b", &bs.to_string()]);
        if !theirs.is_empty() {
            cmd.args(["-O", theirs]);
        }
        let st = cmd.arg(&reference.0).status().unwrap();
        assert!(st.success(), "mke2fs for {what}");
        let ours_img = scratch("mkfs-ours");
        make_with(&ours_img.0, size, bs, isz, ratio, ours);
        assert_same_layout(&reference.0, &ours_img.0, &what);
    }
}

/// Our image passes e2fsck, and dumpe2fs and the special inodes' blocks equal mke2fs's.
fn assert_same_layout(reference: &Path, ours: &Path, what: &str) {
    e2fsck_strict(ours, what);
    let a = dumpe2fs_stable(reference);
    let b = dumpe2fs_stable(ours);
    let diffs: Vec<String> = a
        .iter()
        .zip(b.iter())
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("mke2fs: {x}\nuext4:  {y}"))
        .take(10)
        .collect();
    assert!(
        diffs.is_empty() && a.len() == b.len(),
        "{what}: dumpe2fs differs ({} vs {} lines):\n{}",
        a.len(),
        b.len(),
        diffs.join("\n")
    );
    // The same blocks for the quota files, the resize inode, the journal, lost+found, and
    // the orphan file and the project quota file (12 and 13).
    for ino in [3, 4, 7, 8, 11, 12, 13] {
        let req = format!("blocks <{ino}>");
        assert_eq!(
            debugfs(reference, &req),
            debugfs(ours, &req),
            "{what}: blocks of inode {ino}"
        );
    }
}

/// bigalloc (`-O bigalloc -C N`): groups of a bitmap block's bits of clusters, group 0 from
/// block 0, the tables placed block by block and everything after them (root, lost+found,
/// the resize inode's block, the journal) in whole clusters, free counts in clusters and
/// s_overhead_clusters, as mke2fs 1.47 makes them; then uext4 and the kernel write to it.
#[test]
fn bigalloc_layout_matches_mke2fs() {
    if !have("mke2fs") || !have("dumpe2fs") || !have("debugfs") {
        eprintln!("SKIP: e2fsprogs (mke2fs, dumpe2fs, debugfs) not installed");
        return;
    }
    let cases: &[(u64, u32, u32, u32, &str)] = &[
        (64 * MIB, 1024, 16384, 16384, "bigalloc"),
        (64 * MIB, 1024, 4096, 4096, "bigalloc"),
        (300 * MIB, 1024, 4096, 4096, "bigalloc"),
        (64 * MIB, 4096, 16384, 16384, "bigalloc"),
        (600 * MIB, 4096, 65536, 65536, "bigalloc"),
        (3 << 30, 4096, 16384, 16384, "bigalloc"),
        (600 * MIB, 4096, 8192, 16384, "bigalloc"),
        // Quota files charged in clusters, the orphan file in whole clusters after them.
        (
            64 * MIB,
            4096,
            16384,
            16384,
            "bigalloc,quota,project,orphan_file",
        ),
        (300 * MIB, 1024, 4096, 4096, "bigalloc,quota"),
        (64 * MIB, 1024, 16384, 16384, "bigalloc,orphan_file"),
        (64 * MIB, 4096, 16384, 16384, "bigalloc,inline_data"),
        (300 * MIB, 1024, 4096, 4096, "bigalloc,inline_data,quota"),
    ];
    for &(size, bs, cluster, ratio, feats) in cases {
        let what = format!("{} MiB, {bs}, cluster {cluster}, {feats}", size / MIB);
        let reference = scratch("mkfs-ref");
        std::fs::File::create(&reference.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let st = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-O", feats])
            .args(["-C", &cluster.to_string(), "-i", &ratio.to_string()])
            .args(["-b", &bs.to_string()])
            .arg(&reference.0)
            .status()
            .unwrap();
        assert!(st.success(), "mke2fs for {what}");
        let ours = scratch("mkfs-ours");
        std::fs::File::create(&ours.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let dev = FileDevice::open(&ours.0, false).unwrap();
        let mut o = MkfsOptions::default_for(size);
        o.block_size = bs;
        o.inode_ratio = ratio;
        o.assume_zeroed = true;
        o.features.apply(feats).unwrap();
        o.cluster_size = Some(cluster);
        mkfs(&dev, &o).unwrap_or_else(|e| panic!("{what}: {e}"));
        drop(dev);
        assert_same_layout(&reference.0, &ours.0, &what);
        use_in_uext4(&ours.0, &what);
        e2fsck_strict(&ours.0, &format!("{what}, after uext4 wrote"));
        // This host's kernel mounts no quota image (no CONFIG_QFMT_V2); e2fsck has checked
        // the usage uext4 kept.
        if can_loop_mount() && !feats.contains("quota") {
            use_in_kernel(&ours.0, &what);
            e2fsck_strict(&ours.0, &format!("{what}, after the kernel wrote"));
        }
    }
}

/// With no options, block size and inode count follow mke2fs's usage types (floppy below
/// 3 MiB, small below 512 MiB, default above), as plain `mke2fs -t ext4` picks them.
#[test]
fn defaults_follow_mke2fs_usage_types() {
    if !have("mke2fs") || !have("dumpe2fs") || !have("debugfs") {
        eprintln!("SKIP: e2fsprogs (mke2fs, dumpe2fs, debugfs) not installed");
        return;
    }
    for size in [2 * MIB, 64 * MIB, 511 * MIB, 512 * MIB] {
        let what = format!("{} MiB, defaults", size / MIB);
        let reference = scratch("mkfs-ref");
        std::fs::File::create(&reference.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let st = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&reference.0)
            .status()
            .unwrap();
        assert!(st.success(), "mke2fs for {what}");
        let ours = scratch("mkfs-ours");
        std::fs::File::create(&ours.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let dev = FileDevice::open(&ours.0, false).unwrap();
        let mut o = MkfsOptions::like_mke2fs(size, None);
        o.assume_zeroed = true;
        mkfs(&dev, &o).unwrap_or_else(|e| panic!("{what}: {e}"));
        drop(dev);
        assert_same_layout(&reference.0, &ours.0, &what);
    }
}

#[test]
fn bad_options_are_errors() {
    let dev = MemDevice::new(64 * MIB);
    let mut o = MkfsOptions::default_for(0);
    o.block_size = 512;
    assert!(mkfs(&dev, &o).is_err());
    let mut o = MkfsOptions::default_for(0);
    o.inode_size = 96;
    assert!(mkfs(&dev, &o).is_err());
    let mut o = MkfsOptions::default_for(128 * MIB);
    assert!(mkfs(&dev, &o).is_err(), "larger than the device");
    o.size = 0;
    o.journal_blocks = Some(10);
    assert!(mkfs(&dev, &o).is_err(), "journal under 1024 blocks");
    o.journal_blocks = Some(15000);
    assert!(mkfs(&dev, &o).is_err(), "journal over half the filesystem");
    let tiny = MemDevice::new(40 << 10);
    assert!(mkfs(&tiny, &MkfsOptions::default_for(0)).is_err());
    let mut f = MkfsOptions::default_for(0).features;
    assert!(f.apply("^extent").is_err());
    assert!(f.apply("no_such_feature").is_err());
}

#[test]
fn journal_and_inode_options_are_honoured() {
    let img = scratch("mkfs-opts");
    let size = 256 * MIB;
    std::fs::File::create(&img.0)
        .unwrap()
        .set_len(size)
        .unwrap();
    let dev = FileDevice::open(&img.0, false).unwrap();
    let mut o = MkfsOptions::default_for(0);
    o.journal_blocks = Some(2048);
    o.inode_size = 512;
    o.inode_ratio = 65536;
    o.label = "uext4-label".into();
    o.uuid = Some(*b"0123456789abcdef");
    mkfs(&dev, &o).unwrap();
    assert!(dev.size() == size);
    drop(dev);
    e2fsck_strict(&img.0, "options");
    let h = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&img.0)
        .output()
        .unwrap();
    let h = String::from_utf8_lossy(&h.stdout);
    let field = |name: &str| {
        h.lines()
            .find(|l| l.starts_with(name))
            .map(|l| {
                l[name.len()..]
                    .trim()
                    .trim_start_matches(':')
                    .trim()
                    .to_string()
            })
            .unwrap_or_default()
    };
    assert_eq!(field("Total journal blocks"), "2048");
    assert_eq!(field("Inode size"), "512");
    assert_eq!(field("Inode count"), (size / 65536).to_string());
    assert_eq!(field("Filesystem volume name"), "uext4-label");
    assert_eq!(
        field("Filesystem UUID"),
        "30313233-3435-3637-3839-616263646566"
    );
    // No journal.
    let dev = FileDevice::open(&img.0, false).unwrap();
    o.journal_blocks = Some(0);
    o.uuid = None;
    mkfs(&dev, &o).unwrap();
    drop(dev);
    e2fsck_strict(&img.0, "no journal");
    let h = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&img.0)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&h.stdout).contains("has_journal"));
    use_in_uext4(&img.0, "no journal");
    e2fsck_strict(&img.0, "no journal, after uext4 wrote");
}

/// A device with garbage on it (not a fresh sparse file): mkfs zeroes what it must.
#[test]
fn dirty_device_is_overwritten() {
    let img = scratch("mkfs-dirty");
    let size = 64 * MIB;
    let junk: Vec<u8> = (0..size as usize).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&img.0, &junk).unwrap();
    drop(junk);
    let dev = FileDevice::open(&img.0, false).unwrap();
    let mut o = MkfsOptions::default_for(0);
    o.block_size = 1024;
    mkfs(&dev, &o).unwrap();
    drop(dev);
    e2fsck_strict(&img.0, "dirty device");
    use_in_uext4(&img.0, "dirty device");
    e2fsck_strict(&img.0, "dirty device, after uext4 wrote");
    if can_loop_mount() {
        use_in_kernel(&img.0, "dirty device");
        e2fsck_strict(&img.0, "dirty device, after the kernel wrote");
    }
}

/// The kernel puts an open, unlinked file in our orphan file; the image is copied as if the
/// machine had crashed; uext4 replays the journal, processes the orphan file (freeing the
/// file) and leaves orphan blocks whose checksums e2fsck accepts.
#[test]
fn kernel_orphan_in_our_orphan_file() {
    if !can_loop_mount() {
        return;
    }
    let img = scratch("mkfs-orphan");
    make(&img.0, 64 * MIB, 4096, "orphan_file");
    let crashed = scratch("mkfs-orphan-crash");
    {
        let m = Mounted::new(&img.0);
        let victim = m.dir().join("victim");
        std::fs::write(&victim, vec![5u8; 2 << 20]).unwrap();
        let held = std::fs::File::open(&victim).unwrap();
        std::fs::remove_file(&victim).unwrap();
        sh("sync");
        std::fs::copy(&img.0, &crashed.0).unwrap();
        drop(held);
        m.unmount();
    }
    let h = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&crashed.0)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&h.stdout).contains("orphan_present"),
        "the kernel should have listed the file in the orphan file"
    );
    use_in_uext4(&crashed.0, "after a crash with an orphan");
    e2fsck_strict(&crashed.0, "after uext4 processed the orphan file");
}

/// Size, block size, features, quota types, and mke2fs's -E quotatype for the same.
type QuotaCase<'a> = (u64, u32, &'a str, Option<[bool; 3]>, &'a str);

/// `-O quota[,project]` (with `-E quotatype=...` through the options' `quota_types`): the
/// layout, the quota inodes' blocks and the quota files' bytes equal mke2fs's, and the image
/// opens read-write and stays e2fsck-clean.
#[test]
fn quota_files_match_mke2fs() {
    if !have("mke2fs") || !have("dumpe2fs") || !have("debugfs") {
        eprintln!("SKIP: e2fsprogs (mke2fs, dumpe2fs, debugfs) not installed");
        return;
    }
    let all = Some([true, true, true]);
    let ext3q = format!("{EXT3},quota");
    let cases: &[QuotaCase] = &[
        (
            64 * MIB,
            1024,
            "quota,project",
            all,
            "usrquota:grpquota:prjquota",
        ),
        (
            64 * MIB,
            4096,
            "quota,project",
            all,
            "usrquota:grpquota:prjquota",
        ),
        (64 * MIB, 4096, "quota", None, ""),
        (600 * MIB, 2048, "quota,project", None, ""),
        (
            600 * MIB,
            1024,
            "quota",
            Some([false, true, false]),
            "grpquota",
        ),
        (600 * MIB, 4096, &ext3q, None, ""),
        // The orphan file after the quota files: inode 13 after a project quota file.
        (
            64 * MIB,
            4096,
            "quota,project,orphan_file",
            all,
            "usrquota:grpquota:prjquota",
        ),
        (600 * MIB, 1024, "quota,orphan_file", None, ""),
    ];
    for &(size, bs, feats, types, quotatype) in cases {
        let what = format!("{} MiB, {bs}, {feats:?} {quotatype:?}", size / MIB);
        let reference = scratch("mkfs-qref");
        std::fs::File::create(&reference.0)
            .unwrap()
            .set_len(size)
            .unwrap();
        let mut cmd = Command::new("mke2fs");
        cmd.args(["-q", "-F", "-t", "ext4", "-I", "256", "-i", "16384"])
            .args(["-b", &bs.to_string(), "-O", feats]);
        if !quotatype.is_empty() {
            cmd.args(["-E", &format!("quotatype={quotatype}")]);
        }
        assert!(
            cmd.arg(&reference.0).status().unwrap().success(),
            "mke2fs for {what}"
        );
        let ours = scratch("mkfs-qours");
        let f = std::fs::File::create(&ours.0).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let dev = FileDevice::open(&ours.0, false).unwrap();
        let mut o = MkfsOptions::default_for(size);
        o.block_size = bs;
        o.assume_zeroed = true;
        o.features.apply(feats).unwrap();
        o.features.quota_types = types;
        mkfs(&dev, &o).unwrap_or_else(|e| panic!("mkfs {what}: {e}"));
        drop(dev);
        assert_same_layout(&reference.0, &ours.0, &what);
        // The orphan file's block tails hold checksums seeded by the (random) UUID: its
        // blocks are compared, the quota files' bytes too.
        let orphan = dumpe2fs_field(&reference.0, "Orphan file inode");
        for ino in [3, 4, 12, 13] {
            let mut reqs = vec![format!("blocks <{ino}>")];
            if orphan.as_deref() != Some(&*ino.to_string()) {
                reqs.push(format!("cat <{ino}>"));
            }
            for req in reqs {
                assert_eq!(
                    debugfs(&reference.0, &req),
                    debugfs(&ours.0, &req),
                    "{what}: {req}"
                );
            }
        }
        let fs = uext4::Fs::open_path(&ours.0, Default::default()).unwrap();
        assert!(!fs.is_read_only(), "{what}: {:?}", fs.read_only_reason());
        fs.mkdir(uext4::ROOT_INO, b"d", 0o755, 1000, 1000).unwrap();
        fs.unmount().unwrap();
        e2fsck_strict(&ours.0, &format!("{what}, after a mkdir"));
    }
}

/// A field of `dumpe2fs -h` ("Orphan file inode" -> "13"), None when it is not listed.
fn dumpe2fs_field(img: &Path, name: &str) -> Option<String> {
    let o = Command::new("dumpe2fs")
        .arg("-h")
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_string())
    })
}
