//! Multi-mount protection (the `mmp` feature) against e2fsprogs and the kernel: images made
//! with `mke2fs -O mmp` open read-write and are left with a clean MMP block; a second
//! read-write open (in this process, or debugfs -w, or the kernel) is refused while one holds
//! the image; a node that keeps updating the block, and e2fsck's sequence, are refused; a
//! block left by a crashed node is taken after the wait; a running filesystem whose block
//! another node takes stops writing.
//!
//! The protocol sleeps by design: with `mmp_update_interval=1` the check interval is the
//! kernel's minimum of 5 s, so a wait is 2 × 5 + 1 = 11 s.

mod common;

use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::format::mmp::*;
use uext4::format::superblock::Superblock;
use uext4::Corruption;
use uext4::{Error, Fs, MountOptions};

/// The wait of the protocol for these images (update interval 1 s, check interval 5 s).
const WAIT: Duration = Duration::from_secs(11);

fn mmp_image(tag: &str, extra: &[&str]) -> Scratch {
    let img = scratch(tag);
    let mut args = vec!["-O", "mmp", "-E", "mmp_update_interval=1"];
    args.extend_from_slice(extra);
    mke2fs(&img.0, "64M", &args);
    img
}

fn superblock(img: &Path) -> Superblock {
    let b = std::fs::read(img).unwrap();
    Superblock::from_bytes(&b[1024..2048])
}

/// The MMP block as on disk now, and the byte offset it lives at.
fn read_mmp(img: &Path) -> (MmpBlock, u64) {
    let sb = superblock(img);
    let off = sb.mmp_block() * sb.block_size() as u64;
    let f = std::fs::File::open(img).unwrap();
    let mut b = vec![0u8; MMP_SIZE];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, off).unwrap();
    (MmpBlock::from_bytes(&b), off)
}

/// Writes the MMP block as another node would (checksum set as e2fsprogs does).
fn write_mmp(img: &Path, seq: u32, node: &str, dev: &str) {
    let sb = superblock(img);
    let (mut m, off) = read_mmp(img);
    m.set_seq(seq);
    m.set_nodename(node);
    m.set_bdevname(dev);
    m.set_time(1_800_000_000);
    m.set_csum(sb.has_metadata_csum().then(|| sb.csum_seed()));
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, m.bytes(), off).unwrap();
    f.sync_data().unwrap();
}

/// `debugfs -R dump_mmp`'s sequence line, as e2fsprogs reads the block.
fn debugfs_seq(img: &Path) -> String {
    let out = sh(&format!("debugfs -R dump_mmp {} 2>&1", img.display()));
    assert!(out.contains("magic: 0x4d4d50"), "debugfs dump_mmp:\n{out}");
    out.lines()
        .find_map(|l| l.strip_prefix("sequence: "))
        .unwrap_or_else(|| panic!("no sequence in dump_mmp:\n{out}"))
        .trim()
        .to_string()
}

fn hostname() -> String {
    sh("hostname").trim().to_string()
}

fn write_file(fs: &Fs, name: &str, len: usize) {
    let a = fs.create(2, name.as_bytes(), 0o100644, 0, 0).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
    assert_eq!(fs.write(a.ino, 0, &data).unwrap(), len);
}

#[test]
fn mmp_images_open_read_write_and_unmount_clean() {
    for extra in [&[][..], &["-O", "^metadata_csum", "-b", "1024"][..]] {
        let img = mmp_image("mmpclean", extra);
        assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
        let t = Instant::now();
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        // A clean block is taken at once, as the kernel takes it.
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        let (m, _) = read_mmp(&img.0);
        assert!(m.seq() <= MMP_SEQ_MAX, "in use: {:#x}", m.seq());
        assert_eq!(m.nodename(), hostname());
        let first = m.seq();
        write_file(&fs, "a", 100_000);
        fs.mkdir(2, b"d", 0o40755, 0, 0).unwrap();
        // The thread rewrites the block every second.
        std::thread::sleep(Duration::from_millis(2500));
        let (m, _) = read_mmp(&img.0);
        assert_ne!(m.seq(), first, "the MMP block is being updated");
        assert!(m.seq() <= MMP_SEQ_MAX);
        assert_eq!(m.check_interval(), 5);
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(
            debugfs_seq(&img.0),
            "ff4d4d50",
            "unmount leaves the block clean"
        );
        e2fsck_clean(&img.0);
        // And again: the data is there, and a second open is as quick.
        let t = Instant::now();
        let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
        assert!(t.elapsed() < Duration::from_secs(3));
        let a = fs.lookup(2, b"a").unwrap();
        assert_eq!(a.size, 100_000);
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
        e2fsck_clean(&img.0);
    }
}

/// A read-write open of the image as another node sharing its storage would make it: the
/// device itself, without this host's writer claim (holder.rs), so MMP alone decides.
fn open_as_another_node(path: &Path) -> uext4::Result<Arc<Fs>> {
    let dev = uext4::blockdev::FileDevice::open(path, false)?;
    Fs::open_dev(Arc::new(dev), MountOptions::default())
}

#[test]
fn a_second_read_write_open_is_refused_while_one_holds_the_image() {
    let img = mmp_image("mmpheld", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    write_file(&fs, "a", 5000);
    fs.sync().unwrap();
    let before = std::fs::read(&img.0).unwrap();
    let (_, mmp_off) = read_mmp(&img.0);

    // Another process honouring MMP (debugfs -w) and a second open in this process, at once.
    let path = img.0.clone();
    let debugfs = std::thread::spawn(move || {
        std::process::Command::new("debugfs")
            .args(["-w", "-R", "mkdir /x"])
            .arg(&path)
            .output()
            .unwrap()
    });
    // (A read-only open of a held image waits for nothing and writes nothing: see
    // e2fsck_sequence_is_refused_at_once. Here the journal is in use, which a read-only
    // open refuses as needing recovery.)
    // On this host the writer claim refuses at once; MMP is for another node sharing the
    // storage, which this open stands for (the device opened without the claim).
    assert!(matches!(
        Fs::open_path(&img.0, MountOptions::default()),
        Err(Error::InUse(_))
    ));
    let t = Instant::now();
    let err = match open_as_another_node(&img.0) {
        Ok(_) => panic!("a second read-write open succeeded"),
        Err(e) => e,
    };
    let waited = t.elapsed();
    assert!(waited >= WAIT, "refused after {waited:?}");
    match &err {
        Error::MmpBusy { node, fsck, .. } => {
            assert_eq!(node, &hostname());
            assert!(!fsck);
        }
        e => panic!("wrong error: {e}"),
    }
    let msg = err.to_string();
    eprintln!("refused after {waited:?}: {msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(
        msg.contains(&format!("in use by node {}", hostname())),
        "{msg}"
    );
    assert!(msg.contains("run e2fsck"), "{msg}");
    assert_eq!(err.errno(), libc_ebusy());

    let out = debugfs.join().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MMP"),
        "debugfs -w was not refused by MMP:\n{text}"
    );

    // Nothing but the MMP block changed while the others were refused.
    let after = std::fs::read(&img.0).unwrap();
    let o = mmp_off as usize;
    assert!(before[..o] == after[..o] && before[o + 4096..] == after[o + 4096..]);
    assert!(fs.lookup(2, b"x").is_err());

    write_file(&fs, "b", 3000);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
    e2fsck_clean(&img.0);
}

fn libc_ebusy() -> i32 {
    16
}

#[test]
fn e2fsck_sequence_is_refused_at_once() {
    let img = mmp_image("mmpfsck", &[]);
    write_mmp(&img.0, MMP_SEQ_FSCK, "fscknode", "sdq");
    let before = std::fs::read(&img.0).unwrap();
    let t = Instant::now();
    let err = Fs::open_path(&img.0, MountOptions::default())
        .err()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    let msg = err.to_string();
    assert!(matches!(err, Error::MmpBusy { fsck: true, .. }), "{msg}");
    assert!(
        msg.contains("e2fsck is running") && msg.contains("fscknode"),
        "{msg}"
    );
    assert!(std::fs::read(&img.0).unwrap() == before, "nothing written");
    // A read-only open still works (and writes nothing).
    let ro = Fs::open_path(&img.0, opts::read_only()).unwrap();
    drop(ro);
    assert!(std::fs::read(&img.0).unwrap() == before, "nothing written");
}

#[test]
fn a_node_that_keeps_updating_the_block_is_detected() {
    let img = mmp_image("mmplive", &[]);
    write_mmp(&img.0, 1000, "othernode", "sdz");
    let before = std::fs::read(&img.0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let updater = {
        let (path, stop) = (img.0.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 1000;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                seq += 1;
                write_mmp(&path, seq, "othernode", "sdz");
            }
        })
    };
    let t = Instant::now();
    let err = Fs::open_path(&img.0, MountOptions::default())
        .err()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    updater.join().unwrap();
    let msg = err.to_string();
    eprintln!("refused after {:?}: {msg}", t.elapsed());
    assert!(t.elapsed() >= WAIT);
    assert!(
        msg.contains("in use by node othernode (device sdz)"),
        "{msg}"
    );
    // Only the other node wrote: everything but its MMP block is as before.
    let after = std::fs::read(&img.0).unwrap();
    let (_, off) = read_mmp(&img.0);
    let o = off as usize;
    assert!(before[..o] == after[..o] && before[o + 4096..] == after[o + 4096..]);
}

#[test]
fn a_block_left_by_a_crashed_node_is_taken_after_the_wait() {
    let img = mmp_image("mmpcrash", &[]);
    // A node that died mounted: its sequence stays, nobody updates it.
    write_mmp(&img.0, 4242, "deadnode", "sdy");
    let t = Instant::now();
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let waited = t.elapsed();
    eprintln!("opened after {waited:?}");
    // Once to see that nobody updates the block, once after writing this node's sequence.
    assert!(waited >= 2 * WAIT, "{waited:?}");
    assert!(waited < 2 * WAIT + Duration::from_secs(5), "{waited:?}");
    let (m, _) = read_mmp(&img.0);
    assert_eq!(m.nodename(), hostname());
    write_file(&fs, "after-crash", 10_000);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
    e2fsck_clean(&img.0);
}

#[test]
fn a_running_filesystem_stops_when_another_node_takes_the_block() {
    let img = mmp_image("mmptaken", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    write_file(&fs, "a", 20_000);
    fs.sync().unwrap();
    write_file(&fs, "b", 20_000);
    // Another node, ignoring MMP, writes its own sequence.
    write_mmp(&img.0, 7, "intruder", "sdx");
    std::thread::sleep(Duration::from_millis(2500));
    let e = fs
        .create(2, b"c", 0o100644, 0, 0)
        .expect_err("writes stopped");
    assert!(e.to_string().contains("MMP"), "{e}");
    assert!(fs.unmount().is_err(), "nothing more is committed");
    drop(fs);
    // This node did not write the block clean over the other's.
    let (m, _) = read_mmp(&img.0);
    assert_eq!((m.seq(), m.nodename().as_str()), (7, "intruder"));
    // The other node goes away cleanly; the next open recovers what was committed.
    write_mmp(&img.0, MMP_SEQ_CLEAN, "intruder", "sdx");
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(2, b"a").unwrap().size, 20_000);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
    e2fsck_clean(&img.0);
}

#[test]
fn a_corrupt_mmp_block_refuses_the_open_with_a_clear_error() {
    let img = mmp_image("mmpbad", &[]);
    let (_, off) = read_mmp(&img.0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&img.0)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xAB; 16], off).unwrap();
    drop(f);
    let before = std::fs::read(&img.0).unwrap();
    let e = Fs::open_path(&img.0, MountOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("MMP block"), "{e}");
    assert!(std::fs::read(&img.0).unwrap() == before, "nothing written");
    // A read-only open, which never writes the block, only warns.
    let ro = Fs::open_path(&img.0, opts::read_only()).unwrap();
    drop(ro);
    assert!(std::fs::read(&img.0).unwrap() == before, "nothing written");
    // A damaged checksum too.
    let img = mmp_image("mmpbadcsum", &[]);
    let (_, off) = read_mmp(&img.0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&img.0)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"x", off + 0x200).unwrap();
    drop(f);
    let e = Fs::open_path(&img.0, MountOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            Error::BadChecksum {
                kind: Corruption::Mmp,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_kernel_takes_an_image_uext4_left_and_each_refuses_the_other() {
    if !can_loop_mount() {
        return;
    }
    let img = mmp_image("mmpkernel", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    write_file(&fs, "from-uext4", 12_345);
    // The kernel's mount waits (11 s) and fails while uext4 holds the image.
    let dir = std::env::temp_dir().join(format!("uext4-mmp-kmnt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = Instant::now();
    let out = std::process::Command::new("mount")
        .args(["-t", "ext4", "-o", "loop"])
        .arg(&img.0)
        .arg(&dir)
        .output()
        .unwrap();
    if out.status.success() {
        let _ = std::process::Command::new("umount").arg(&dir).status();
        panic!("the kernel mounted an image uext4 holds");
    }
    eprintln!(
        "kernel refused after {:?}: {}",
        t.elapsed(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let _ = std::fs::remove_dir(&dir);
    fs.unmount().unwrap();
    drop(fs);
    {
        let m = KernelMount::new(&img.0);
        let data = std::fs::read(m.dir.join("from-uext4")).unwrap();
        assert_eq!(data.len(), 12_345);
        std::fs::write(m.dir.join("from-kernel"), b"hello").unwrap();
        // While the kernel holds it, uext4 is refused.
        let t = Instant::now();
        let e = open_as_another_node(&img.0).err().unwrap();
        eprintln!("uext4 refused after {:?}: {e}", t.elapsed());
        assert!(matches!(e, Error::MmpBusy { fsck: false, .. }), "{e}");
        drop(m);
    }
    assert_eq!(debugfs_seq(&img.0), "ff4d4d50");
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(2, b"from-kernel").unwrap().size, 5);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
