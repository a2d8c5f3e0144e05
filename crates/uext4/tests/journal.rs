//! The journal against the oracles: transactions debugfs and the kernel's ext4 write replay in
//! uext4 exactly as e2fsck replays them, journals uext4 leaves behind after a crash replay in
//! e2fsck and in a kernel mount to the same tree as in uext4, and failed writes stop the
//! filesystem without reporting lost changes as durable.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use uext4::blockdev::RecordingDevice;
use uext4::{Fs, MountOptions};

fn block(img: &[u8], b: usize) -> &[u8] {
    &img[b * 4096..(b + 1) * 4096]
}

#[test]
fn debugfs_journal_replays_like_e2fsck() {
    for extra in [&[][..], &["-O", "^metadata_csum"][..]] {
        let img = scratch("jdebugfs");
        mke2fs(&img.0, "64M", extra);
        let data = scratch("jdata");
        std::fs::write(
            &data.0,
            (0..8192u32)
                .map(|i| (i * 31 % 251) as u8)
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        let cmds = scratch("jcmds");
        std::fs::write(
            &cmds.0,
            format!(
                "jo\njw -b 3000,3001 {0}\njw -r 3001\njw -b 3002 {0}\njc\n",
                data.0.display()
            ),
        )
        .unwrap();
        sh(&format!(
            "debugfs -w -f {} {} >/dev/null 2>&1",
            cmds.0.display(),
            img.0.display()
        ));
        let a = scratch("je2fsck");
        let b = scratch("juext4");
        std::fs::copy(&img.0, &a.0).unwrap();
        std::fs::copy(&img.0, &b.0).unwrap();
        let _ = std::process::Command::new("e2fsck")
            .arg("-fy")
            .arg(&a.0)
            .output()
            .unwrap();
        let fs = Fs::open_path(&b.0, MountOptions::default()).unwrap();
        fs.unmount().unwrap();
        let (ia, ib) = (std::fs::read(&a.0).unwrap(), std::fs::read(&b.0).unwrap());
        let d = std::fs::read(&data.0).unwrap();
        assert_eq!(block(&ib, 3000), &d[..4096], "logged block replayed");
        assert_eq!(block(&ib, 3002), &d[..4096], "logged block replayed");
        assert!(
            block(&ib, 3001).iter().all(|&x| x == 0),
            "revoked block must not be replayed"
        );
        for blk in 3000..3003 {
            assert_eq!(
                block(&ia, blk),
                block(&ib, blk),
                "block {blk} differs from e2fsck's replay"
            );
        }
        e2fsck_clean(&b.0);
    }
}

fn tree(fs: &Fs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), 2u32)];
    while let Some((p, ino)) = stack.pop() {
        let mut es = Vec::new();
        fs.readdir(ino, 0, &mut |e| {
            es.push(e);
            true
        })
        .unwrap();
        for e in es {
            let n = String::from_utf8_lossy(&e.name).into_owned();
            if n == "." || n == ".." {
                continue;
            }
            let path = format!("{p}/{n}");
            let a = fs.getattr(e.ino).unwrap();
            if a.is_dir() {
                stack.push((path.clone(), e.ino));
                out.insert(path, vec![]);
            } else {
                let mut buf = vec![0u8; a.size as usize];
                let n = fs.read(e.ino, 0, &mut buf).unwrap_or(0);
                buf.truncate(n);
                out.insert(path, buf);
            }
        }
    }
    out
}

#[test]
fn uext4_journal_replays_in_e2fsck_and_kernel() {
    // A journal from mke2fs (no journal checksums) and one from our mkfs (checksum v3).
    let base = scratch("jbase");
    mke2fs(&base.0, "32M", &["-J", "size=4"]);
    replay_case(&base);
    let ours = scratch("jbase-ours");
    {
        let f = std::fs::File::create(&ours.0).unwrap();
        f.set_len(32 << 20).unwrap();
    }
    let dev = uext4::blockdev::FileDevice::open(&ours.0, false).unwrap();
    let mut o = uext4::mkfs::MkfsOptions::default_for(32 << 20);
    o.journal_blocks = Some(1024);
    o.assume_zeroed = true;
    uext4::mkfs::mkfs(&dev, &o).unwrap();
    replay_case(&ours);
}

/// The image in `base` on a recording device, opened with no timed commits (only fsync and
/// the size threshold commit), so the recording is the same on every run.
fn open_recording(base: &Scratch) -> (Arc<RecordingDevice>, Arc<Fs>) {
    let dev = Arc::new(RecordingDevice::new(std::fs::read(&base.0).unwrap()));
    let fs = Fs::open_dev(dev.clone(), opts::no_timer()).unwrap();
    (dev, fs)
}

fn replay_case(base: &Scratch) {
    let (dev, fs) = open_recording(base);
    let d = fs.mkdir(2, b"dir", 0o755, 0, 0).unwrap().ino;
    for i in 0..40u32 {
        let f = fs
            .create(d, format!("file{i}").as_bytes(), 0o644, 0, 0)
            .unwrap()
            .ino;
        fs.write(f, 0, &vec![i as u8 + 1; 3000 + i as usize * 500])
            .unwrap();
        if i % 3 == 0 {
            fs.fsync(f, false).unwrap();
        }
        if i % 7 == 6 {
            fs.unlink(d, format!("file{}", i - 3).as_bytes()).unwrap();
        }
    }
    drop(fs); // a crash: no unmount
    let flushes = dev.flush_points();
    // States right after a commit block reached the log, before the blocks went home.
    let mut checked = 0;
    for (k, &at) in flushes.iter().enumerate().step_by(3) {
        let img = dev.crash_image(at, &mut |_| false);
        let ours = scratch("jours");
        let e2 = scratch("je2");
        std::fs::write(&ours.0, &img).unwrap();
        std::fs::write(&e2.0, &img).unwrap();
        let fs = Fs::open_path(&ours.0, MountOptions::default())
            .unwrap_or_else(|e| panic!("flush {k}: {e}"));
        fs.unmount().unwrap();
        e2fsck_clean(&ours.0);
        let out = std::process::Command::new("e2fsck")
            .arg("-fy")
            .arg(&e2.0)
            .output()
            .unwrap();
        assert!(
            out.status.code().unwrap_or(8) <= 1,
            "e2fsck -fy: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let a = tree(&Fs::open_path(&ours.0, MountOptions::ro()).unwrap());
        let b = tree(&Fs::open_path(&e2.0, MountOptions::ro()).unwrap());
        assert_eq!(a, b, "flush point {k}: uext4 and e2fsck replays differ");
        if can_loop_mount() && k % 9 == 0 {
            let kimg = scratch("jkernel");
            std::fs::write(&kimg.0, &img).unwrap();
            {
                let _m = KernelMount::new(&kimg.0);
            }
            e2fsck_clean(&kimg.0);
            let c = tree(&Fs::open_path(&kimg.0, MountOptions::ro()).unwrap());
            assert_eq!(a, c, "flush point {k}: uext4 and kernel replays differ");
        }
        checked += 1;
    }
    assert!(checked > 3);
}

// ---- The journal module on its own, against debugfs, e2fsck and the kernel ----

use uext4::blockdev::{BlockDevice, FileDevice};
use uext4::journal::{Journal, JournalMap, RecoveryReport};

/// The journal inode's runs, from `debugfs -R "stat <8>"` ("(0-1023):1234-2257, ...").
fn journal_map(img: &std::path::Path) -> JournalMap {
    let out = sh(&format!(
        "debugfs -R 'stat <8>' {} 2>/dev/null",
        img.display()
    ));
    let ext = out
        .split("EXTENTS:")
        .nth(1)
        .expect("journal inode has extents");
    let mut runs = Vec::new();
    for item in ext.split([',', '\n']) {
        let item = item.trim();
        let Some((l, p)) = item.strip_prefix('(').and_then(|s| s.split_once("):")) else {
            continue;
        };
        if l.starts_with("ETB") {
            continue;
        }
        let (l0, l1) = l.split_once('-').unwrap_or((l, l));
        let (p0, _) = p.split_once('-').unwrap_or((p, p));
        let (l0, l1): (u32, u32) = (l0.parse().unwrap(), l1.parse().unwrap());
        runs.push((l0, p0.trim().parse::<u64>().unwrap(), l1 - l0 + 1));
    }
    assert!(!runs.is_empty(), "no journal extents in {out}");
    JournalMap(runs)
}

fn block_size_of(img: &std::path::Path) -> u32 {
    let b = std::fs::read(img).unwrap();
    1024 << u32::from_le_bytes(b[1024 + 0x18..1024 + 0x1C].try_into().unwrap())
}

fn open_journal(img: &std::path::Path) -> (Arc<FileDevice>, Journal) {
    let dev = Arc::new(FileDevice::open(img, false).unwrap());
    let j = Journal::open(dev.clone(), block_size_of(img), journal_map(img)).unwrap();
    (dev, j)
}

fn our_recover(img: &std::path::Path) -> RecoveryReport {
    open_journal(img).1.recover().unwrap()
}

/// Sets or clears needs_recovery in the primary superblock (checksum updated).
fn set_needs_recovery(img: &std::path::Path, on: bool) {
    use uext4::format::features::INCOMPAT_RECOVER;
    let dev = FileDevice::open(img, false).unwrap();
    let mut raw = vec![0u8; 1024];
    dev.read_at(1024, &mut raw).unwrap();
    let mut sb = uext4::format::superblock::Superblock::from_bytes(&raw);
    let f = sb.feature_incompat();
    sb.set_feature_incompat(if on {
        f | INCOMPAT_RECOVER
    } else {
        f & !INCOMPAT_RECOVER
    });
    sb.set_csum();
    dev.write_at(1024, sb.bytes()).unwrap();
    dev.flush().unwrap();
}

fn e2fsck_fy(img: &std::path::Path) -> String {
    let out = std::process::Command::new("e2fsck")
        .arg("-fy")
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.code().unwrap_or(8) <= 1,
        "e2fsck -fy {}: {text}",
        img.display()
    );
    text
}

/// Block numbers where two images differ.
fn differing_blocks(a: &[u8], b: &[u8], bs: usize) -> Vec<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len() / bs)
        .filter(|&i| a[i * bs..(i + 1) * bs] != b[i * bs..(i + 1) * bs])
        .collect()
}

/// e2fsck -fy on one copy (it replays), our `recover` on the other and then e2fsck -fy
/// (which finds nothing to replay): the two images must be identical, byte for byte.
fn replay_both_and_compare(img: &std::path::Path, what: &str) -> (RecoveryReport, Vec<u8>) {
    let a = scratch("jcmp-e2fsck");
    let b = scratch("jcmp-ours");
    std::fs::copy(img, &a.0).unwrap();
    std::fs::copy(img, &b.0).unwrap();
    let text = e2fsck_fy(&a.0);
    let report = our_recover(&b.0);
    assert!(!open_journal(&b.0).1.needs_recovery());
    set_needs_recovery(&b.0, false);
    let text_b = e2fsck_fy(&b.0);
    let (mut ia, mut ib) = (std::fs::read(&a.0).unwrap(), std::fs::read(&b.0).unwrap());
    let unmasked = ib.clone();
    // The only fields allowed to differ: s_wtime and s_lastcheck (the clock may tick between
    // the two runs), s_kbytes_written (what each tool wrote) and so the checksum.
    for i in [&mut ia, &mut ib] {
        i[1024 + 0x30..1024 + 0x34].fill(0);
        i[1024 + 0x40..1024 + 0x44].fill(0);
        i[1024 + 0x178..1024 + 0x180].fill(0);
        i[1024 + 0x3FC..1024 + 0x400].fill(0);
    }
    let bs = block_size_of(img) as usize;
    let d = differing_blocks(&ia, &ib, bs);
    assert!(
        d.is_empty(),
        "{what}: blocks {d:?} differ between e2fsck's replay and ours\ne2fsck:\n{text}\nours then e2fsck:\n{text_b}"
    );
    e2fsck_clean(&b.0);
    (report, unmasked)
}

#[test]
fn debugfs_transactions_replay_byte_for_byte_like_e2fsck() {
    for (bs, extra, jo) in [
        ("4096", &[][..], "jo -c"),
        ("4096", &["-O", "^metadata_csum"][..], "jo"),
        ("1024", &[][..], "jo -c"),
        ("1024", &["-O", "^metadata_csum,^64bit"][..], "jo"),
    ] {
        let what = format!("bs {bs} {extra:?} {jo}");
        let img = scratch("jdbg");
        let mut args = vec!["-b", bs];
        args.extend_from_slice(extra);
        mke2fs(&img.0, "64M", &args);
        let bsz: u64 = bs.parse().unwrap();
        let base = (64 << 20) / bsz - 64; // free data blocks at the end of the last group
        let d1 = scratch("jd1");
        let d2 = scratch("jd2");
        std::fs::write(
            &d1.0,
            (0..2 * bsz)
                .map(|i| (i * 7 % 253) as u8)
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        // A block beginning with the jbd2 magic: escaped in the log.
        let mut m = vec![0xC0, 0x3B, 0x39, 0x98];
        m.extend((4..bsz).map(|i| (i % 13) as u8));
        std::fs::write(&d2.0, &m).unwrap();
        let cmds = scratch("jcmds");
        let (b0, b1, b2, b3, b4) = (base, base + 1, base + 2, base + 3, base + 4);
        std::fs::write(
            &cmds.0,
            format!(
                "{jo}\njw -b {b0},{b1} {d1}\njc\njo\njw -b {b2} {d2}\njw -r {b0}\njc\njo\njw -b {b3},{b0} {d1}\njc\njo\njw -b {b4} {d1}\njc\n",
                d1 = d1.0.display(),
                d2 = d2.0.display()
            ),
        )
        .unwrap();
        sh(&format!(
            "debugfs -w -f {} {} >/dev/null 2>&1",
            cmds.0.display(),
            img.0.display()
        ));
        // Tear the last transaction: zero its commit block (found through our own reader of
        // the log: the last block before the end of the log that is a commit block).
        let (dev, j) = open_journal(&img.0);
        let sb = j.superblock();
        assert!(j.needs_recovery(), "{what}: debugfs left no transactions");
        let map = journal_map(&img.0);
        let mut last_commit = None;
        for jb in sb.first..sb.maxlen {
            let p = map
                .0
                .iter()
                .find(|r| jb >= r.0 && jb < r.0 + r.2)
                .map(|r| r.1 + (jb - r.0) as u64)
                .unwrap();
            let mut b = vec![0u8; bsz as usize];
            dev.read_at(p * bsz, &mut b).unwrap();
            if b[..4] == [0xC0, 0x3B, 0x39, 0x98] && b[7] == 2 {
                last_commit = Some(p);
            }
        }
        drop(j);
        let torn = scratch("jtorn");
        std::fs::copy(&img.0, &torn.0).unwrap();
        let p = last_commit.unwrap();
        let t = FileDevice::open(&torn.0, false).unwrap();
        t.write_at(p * bsz, &vec![0u8; bsz as usize]).unwrap();
        drop(t);

        // Whole log: 5 transactions.
        let (r, ib) = replay_both_and_compare(&img.0, &what);
        assert_eq!(r.transactions, 5, "{what}: {r:?}");
        assert_eq!(r.blocks_revoked, 1, "{what}: {r:?}");
        assert_eq!(r.blocks_replayed, 5, "{what}: {r:?}");
        let blk = |i: u64| &ib[(i * bsz) as usize..((i + 1) * bsz) as usize];
        let dd1 = std::fs::read(&d1.0).unwrap();
        let bsu = bsz as usize;
        assert!(blk(b2) == &m[..], "{what}: escaped block restored");
        assert!(blk(b1) == &dd1[bsu..], "{what}: block of T1");
        assert!(
            blk(b0) == &dd1[bsu..],
            "{what}: re-logged (second of T4) after its revoke"
        );
        assert!(blk(b4) == &dd1[..bsu], "{what}: T5");
        // Torn last transaction: discarded by both.
        let (r, ib) = replay_both_and_compare(&torn.0, &format!("{what}, torn"));
        assert_eq!(r.transactions, 4, "{what}: {r:?}");
        let blk = |i: u64| &ib[(i * bsz) as usize..((i + 1) * bsz) as usize];
        assert!(
            blk(b4).iter().all(|&x| x == 0),
            "{what}: torn transaction replayed"
        );

        // The kernel replays the same blocks.
        if can_loop_mount() {
            let k = scratch("jdbg-kernel");
            std::fs::copy(&img.0, &k.0).unwrap();
            {
                let _m = KernelMount::new(&k.0);
            }
            e2fsck_clean(&k.0);
            let ik = std::fs::read(&k.0).unwrap();
            let (r, ib) = replay_both_and_compare(&img.0, &what);
            assert_eq!(r.transactions, 5);
            for b in [b0, b1, b2, b3, b4] {
                let r = (b * bsz) as usize..((b + 1) * bsz) as usize;
                assert!(
                    ik[r.clone()] == ib[r],
                    "{what}: block {b} differs from the kernel's replay"
                );
            }
        }
    }
}

/// The tree under a kernel mount point, keyed like `tree`.
fn kernel_tree(dir: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), dir.to_path_buf())];
    while let Some((p, d)) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let path = format!("{p}/{}", e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                stack.push((path.clone(), e.path()));
                out.insert(path, vec![]);
            } else {
                out.insert(path, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn ro_tree(img: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    tree(&Fs::open_path(img, MountOptions::ro()).unwrap())
}

fn read_blocks(img: &std::path::Path, bs: u64, blocks: &[u64]) -> Vec<(u64, Vec<u8>)> {
    let all = std::fs::read(img).unwrap();
    blocks
        .iter()
        .map(|&b| (b, all[(b * bs) as usize..((b + 1) * bs) as usize].to_vec()))
        .collect()
}

/// Finds the device block of the commit block of `tid` in the log.
fn commit_block_of(img: &std::path::Path, tid: u32) -> u64 {
    let (dev, j) = open_journal(img);
    let sb = j.superblock();
    let map = journal_map(img);
    let bs = sb.block_size as u64;
    for jb in sb.first..sb.maxlen {
        let p = map
            .0
            .iter()
            .find(|r| jb >= r.0 && jb < r.0 + r.2)
            .map(|r| r.1 + (jb - r.0) as u64)
            .unwrap();
        let mut b = vec![0u8; bs as usize];
        dev.read_at(p * bs, &mut b).unwrap();
        if b[..4] == [0xC0, 0x3B, 0x39, 0x98] && b[7] == 2 && b[8..12] == tid.to_be_bytes() {
            return p;
        }
    }
    panic!("no commit block for transaction {tid}");
}

#[test]
fn uext4_commits_replay_in_e2fsck_and_kernel() {
    for (bs, extra, csum) in [
        ("4096", &[][..], true),
        ("1024", &["-O", "^metadata_csum"][..], false),
        ("4096", &["-O", "^metadata_csum"][..], false),
    ] {
        let what = format!("bs {bs} {extra:?}");
        let bsz: u64 = bs.parse().unwrap();
        let base = scratch("jc-base");
        let mut args = vec!["-b", bs];
        args.extend_from_slice(extra);
        mke2fs(&base.0, "64M", &args);
        // The change to log: what debugfs does to a copy.
        let after = scratch("jc-after");
        std::fs::copy(&base.0, &after.0).unwrap();
        let d1 = scratch("jc-d1");
        let d2 = scratch("jc-d2");
        std::fs::write(
            &d1.0,
            (0..50_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
        )
        .unwrap();
        let mut m = vec![0xC0, 0x3B, 0x39, 0x98]; // a data block that needs escaping
        m.extend((0..9000u32).map(|i| (i % 7) as u8));
        std::fs::write(&d2.0, &m).unwrap();
        sh(&format!(
            "debugfs -w -R 'mkdir dir' {0} && debugfs -w -R 'write {1} dir/f1' {0} && debugfs -w -R 'write {2} f2' {0} && debugfs -w -R 'mkdir dir/sub' {0}",
            after.0.display(),
            d1.0.display(),
            d2.0.display()
        ));
        e2fsck_clean(&after.0);
        let (ib, ia) = (
            std::fs::read(&base.0).unwrap(),
            std::fs::read(&after.0).unwrap(),
        );
        let changed: Vec<u64> = differing_blocks(&ib, &ia, bsz as usize)
            .into_iter()
            .map(|b| b as u64)
            .collect();
        assert!(changed.len() > 8, "{what}: {changed:?}");
        let blocks = read_blocks(&after.0, bsz, &changed);
        let spare = (64 << 20) / bsz - 10; // a free block: logged, then revoked
        let img = scratch("jc-logged");
        std::fs::copy(&base.0, &img.0).unwrap();
        {
            let dev = Arc::new(FileDevice::open(&img.0, false).unwrap());
            let mut j = Journal::open(dev, bsz as u32, journal_map(&img.0)).unwrap();
            if csum {
                // What the kernel does at mount for metadata_csum and 64bit.
                j.set_features(true, true).unwrap();
            }
            let third = blocks.len() / 3;
            let mut t1 = blocks[..third].to_vec();
            t1.push((spare, vec![0xEE; bsz as usize]));
            let a = j.commit(1, &t1, &[]).unwrap();
            let b = j.commit(2, &blocks[third..2 * third], &[spare]).unwrap();
            let c = j.commit(3, &blocks[2 * third..], &[]).unwrap();
            assert_eq!((a + 1, b + 1), (b, c));
            // A torn fourth transaction: its commit block never made it.
            let d = j
                .commit(4, &[(spare - 1, vec![0xDD; bsz as usize])], &[])
                .unwrap();
            drop(j);
            let p = commit_block_of(&img.0, d);
            FileDevice::open(&img.0, false)
                .unwrap()
                .write_at(p * bsz, &vec![0u8; bsz as usize])
                .unwrap();
        }
        set_needs_recovery(&img.0, true);

        let (r, replayed) = replay_both_and_compare(&img.0, &what);
        assert_eq!(r.transactions, 3, "{what}: {r:?}");
        assert_eq!(r.blocks_revoked, 1, "{what}: {r:?}");
        assert_eq!(r.blocks_replayed, changed.len() as u64, "{what}: {r:?}");
        let blk = |i: u64| &replayed[(i * bsz) as usize..((i + 1) * bsz) as usize];
        assert!(
            blk(spare).iter().all(|&x| x == 0),
            "{what}: revoked block replayed"
        );
        assert!(
            blk(spare - 1).iter().all(|&x| x == 0),
            "{what}: torn transaction replayed"
        );
        let ours = scratch("jc-ours");
        std::fs::write(&ours.0, &replayed).unwrap();
        let want = ro_tree(&after.0);
        assert_eq!(ro_tree(&ours.0), want, "{what}: replayed tree");
        assert_eq!(want["/dir/f1"], std::fs::read(&d1.0).unwrap());
        assert_eq!(want["/f2"], m);

        if can_loop_mount() {
            let k = scratch("jc-kernel");
            std::fs::copy(&img.0, &k.0).unwrap();
            {
                let mnt = KernelMount::new(&k.0);
                assert_eq!(kernel_tree(&mnt.dir), want, "{what}: the kernel's replay");
            }
            e2fsck_clean(&k.0);
            let ik = std::fs::read(&k.0).unwrap();
            for &b in changed.iter().filter(|&&b| b > 1) {
                let r = (b * bsz) as usize..((b + 1) * bsz) as usize;
                // Metadata the kernel rewrites at mount and unmount may move on (bitmaps,
                // descriptors, the superblock, inode-table timestamps); file data must not.
                if ia[r.clone()] != ik[r.clone()] && replayed[r.clone()] == ia[r.clone()] {
                    continue;
                }
                assert!(ik[r.clone()] == replayed[r], "{what}: block {b}");
            }
            assert!(ik[(spare * bsz) as usize..((spare + 1) * bsz) as usize]
                .iter()
                .all(|&x| x == 0));
        }
    }
}

#[test]
fn wrap_around_in_a_1mib_journal() {
    // 1 MiB is 1024 blocks of 1 KiB, the smallest journal mke2fs makes.
    for (bs, extra) in [("1024", &[][..]), ("1024", &["-O", "^metadata_csum"][..])] {
        let what = format!("bs {bs} {extra:?}");
        let bsz: u64 = bs.parse().unwrap();
        let img = scratch("jwrap");
        let mut args = vec!["-b", bs, "-J", "size=1"];
        args.extend_from_slice(extra);
        mke2fs(&img.0, "64M", &args);
        let dev = Arc::new(FileDevice::open(&img.0, false).unwrap());
        let mut j = Journal::open(dev.clone(), bsz as u32, journal_map(&img.0)).unwrap();
        if extra.is_empty() {
            j.set_features(true, true).unwrap();
        }
        let log_len = j.log_len() as u64;
        let top = (64 << 20) / bsz - 100; // 60 free blocks at the end
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut logged = 0u64;
        let mut gen = 0u32;
        let mut pending = Vec::new();
        while logged < 4 * log_len {
            gen += 1;
            let n = 5 + gen as u64 % 17;
            let blocks: Vec<(u64, Vec<u8>)> = (0..n)
                .map(|i| {
                    let b = top + (gen as u64 * 7 + i * 3) % 60;
                    let mut d: Vec<u8> = (0..bsz)
                        .map(|x| (x as u32 ^ gen ^ b as u32) as u8)
                        .collect();
                    if (gen + i as u32).is_multiple_of(4) {
                        d[..4].copy_from_slice(&[0xC0, 0x3B, 0x39, 0x98]);
                    }
                    (b, d)
                })
                .collect();
            let tid = j.commit(gen as u64, &blocks, &[]).unwrap();
            logged += j.blocks_needed(blocks.len(), 0);
            for (b, d) in &blocks {
                model.insert(*b, d.clone());
            }
            pending.push((tid, blocks));
            // The engine writes home and checkpoints, except for the last transactions: a
            // crash leaves those in the log only.
            if logged < 4 * log_len - 3 * 22 {
                for (tid, blocks) in pending.drain(..) {
                    for (b, d) in &blocks {
                        dev.write_at(b * bsz, d).unwrap();
                    }
                    dev.flush().unwrap();
                    j.checkpointed(tid);
                }
            }
        }
        assert!(!pending.is_empty());
        assert_eq!(
            j.checkpoint_waits
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        drop(j);
        set_needs_recovery(&img.0, true);
        let (r, replayed) = replay_both_and_compare(&img.0, &what);
        assert!(r.transactions as usize >= pending.len(), "{what}: {r:?}");
        for (b, d) in &model {
            let got = &replayed[(b * bsz) as usize..((b + 1) * bsz) as usize];
            assert!(got == &d[..], "{what}: block {b} after {gen} transactions");
        }
        if can_loop_mount() {
            let k = scratch("jwrap-kernel");
            std::fs::copy(&img.0, &k.0).unwrap();
            {
                let _m = KernelMount::new(&k.0);
            }
            e2fsck_clean(&k.0);
            let ik = std::fs::read(&k.0).unwrap();
            for b in model.keys() {
                let r = (b * bsz) as usize..((b + 1) * bsz) as usize;
                assert!(
                    ik[r.clone()] == replayed[r],
                    "{what}: block {b} differs from the kernel's replay"
                );
            }
        }
    }
}

/// A journal left behind by a crash, then damaged: bytes flipped in its superblock and its
/// first log blocks. Opening the image (which replays the log) and reading it give Ok or an
/// error, never a panic or a hang, with journal checksums (v3, metadata_csum) and without
/// them (where only the structure checks stand between a flipped tag and a replay). Longer:
/// `FUZZ_ITER=2000 cargo test --release --test journal damaged_journals -- --nocapture`
/// (`FUZZ_SHOW=1` prints why each refused image was refused).
#[test]
fn damaged_journals_never_panic() {
    let iterations: u64 = std::env::var("FUZZ_ITER")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    for extra in [&[][..], &["-O", "^metadata_csum"][..]] {
        let base = scratch("jfuzz-base");
        mke2fs(&base.0, "32M", extra);
        let (dev, fs) = open_recording(&base);
        let d = fs.mkdir(2, b"dir", 0o755, 0, 0).unwrap().ino;
        for i in 0..30u32 {
            let f = fs
                .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write(f, 0, &vec![i as u8; 5000]).unwrap();
            if i % 4 == 0 {
                fs.fsync(f, false).unwrap();
            }
        }
        drop(fs); // a crash: no unmount
        let at = *dev.flush_points().last().unwrap();
        let crashed = dev.crash_image(at, &mut |_| false);
        std::fs::write(&base.0, &crashed).unwrap();
        let map = journal_map(&base.0);
        let img = scratch("jfuzz");
        // Undamaged, the crashed image recovers to an e2fsck-clean filesystem.
        std::fs::write(&img.0, &crashed).unwrap();
        Fs::open_path(&img.0, MountOptions::default())
            .unwrap()
            .unmount()
            .unwrap();
        e2fsck_clean(&img.0);
        let mut rnd = xorshift(0x51_7cc1_b727_220au64);
        let (mut panics, mut slow, mut opened) = (Vec::new(), Vec::new(), 0);
        for it in 0..iterations {
            let mut bytes = crashed.clone();
            for _ in 0..1 + rnd() % 4 {
                // The superblock (journal block 0) or one of the first 48 log blocks.
                let jblk = if rnd().is_multiple_of(4) {
                    0
                } else {
                    1 + rnd() % 48
                } as u32;
                let at = map.phys(jblk).unwrap() as usize * 4096 + (rnd() % 4096) as usize;
                bytes[at] ^= (rnd() as u8) | 1;
            }
            std::fs::write(&img.0, &bytes).unwrap();
            let began = std::time::Instant::now();
            let r = std::panic::catch_unwind(|| {
                let fs = match Fs::open_path(&img.0, MountOptions::default()) {
                    Ok(f) => f,
                    Err(e) => {
                        if std::env::var_os("FUZZ_SHOW").is_some() {
                            eprintln!("refused: {e}");
                        }
                        return None;
                    }
                };
                let mut n = 0;
                let _ = fs.readdir(d, 0, &mut |_| {
                    n += 1;
                    true
                });
                let _ = fs.unmount();
                Some(n)
            });
            match r {
                Err(_) => panics.push(it),
                Ok(Some(_)) => opened += 1,
                Ok(None) => {}
            }
            if began.elapsed().as_secs() >= 10 {
                slow.push(it);
            }
        }
        assert!(
            panics.is_empty() && slow.is_empty(),
            "{extra:?}: of {iterations} damaged journals, these panicked: {panics:?}; these took over 10 s: {slow:?}"
        );
        // Most damage is refused or skipped with a clear error; some lands where the log is
        // not read (past its end). Either way some images must still open.
        eprintln!("{extra:?}: {opened} of {iterations} damaged journals opened");
        assert!(opened > 0, "{extra:?}: no damaged image opened at all");
    }
}

// ---- Failed writes: the filesystem stops, fsync never reports a lost change as durable ----

/// A commit whose log write fails loses its transaction: that fsync fails, and so does every
/// later one, though nothing new is running (it used to find an empty transaction and report
/// success for the change that was lost). What was fsynced before is recovered intact.
#[test]
fn failed_commit_fails_every_later_fsync() {
    let img = scratch("jfault-commit");
    mke2fs(&img.0, "32M", &["-J", "size=4"]);
    let (dev, fs) = open_faulty(&img.0, false);
    let kept = fs.create(2, b"kept", 0o644, 0, 0).unwrap().ino;
    fs.write(kept, 0, &[7u8; 10000]).unwrap();
    fs.fsync(kept, false).unwrap();
    let lost = fs.create(2, b"lost", 0o644, 0, 0).unwrap().ino;
    fs.write(lost, 0, &[9u8; 5000]).unwrap();
    dev.fail(FAIL_ALL);
    assert!(
        fs.fsync(lost, false).is_err(),
        "the commit's log writes fail"
    );
    dev.fail(FAIL_NONE);
    for _ in 0..2 {
        let e = fs.fsync(lost, false).unwrap_err();
        assert!(matches!(e, uext4::Error::Stopped(_)), "{e}");
        assert!(e.to_string().contains("could not be committed"), "{e}");
    }
    assert!(fs.create(2, b"after", 0o644, 0, 0).is_err(), "stopped");
    assert!(
        fs.unmount().is_err(),
        "a stopped filesystem is not marked clean"
    );
    drop(fs);
    // The crash path: the journal (or e2fsck) brings back what was fsynced.
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let kept = fs.lookup(2, b"kept").unwrap().ino;
    let mut buf = vec![0u8; 10000];
    assert_eq!(fs.read(kept, 0, &mut buf).unwrap(), 10000);
    assert!(buf.iter().all(|&b| b == 7));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// A commit that panics after taking its transaction out of `running` loses it as an error
/// does: every later fsync fails (it used to find an empty transaction and succeed).
#[test]
fn panicked_commit_fails_every_later_fsync() {
    let img = scratch("jpanic-commit");
    mke2fs(&img.0, "32M", &["-J", "size=4"]);
    let (dev, fs) = open_faulty(&img.0, false);
    let lost = fs.create(2, b"lost", 0o644, 0, 0).unwrap().ino;
    fs.write(lost, 0, &[9u8; 5000]).unwrap();
    dev.fail(PANIC_ON_WRITE);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.fsync(lost, false)));
    assert!(r.is_err(), "the commit's log write panics");
    dev.fail(FAIL_NONE);
    let e = fs.fsync(lost, false).unwrap_err();
    assert!(matches!(e, uext4::Error::Stopped(_)), "{e}");
    assert!(e.to_string().contains("panicked"), "{e}");
    assert!(fs.create(2, b"after", 0o644, 0, 0).is_err(), "stopped");
    drop(fs);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// A checkpoint write that fails stops the filesystem and aborts the journal: later fsyncs
/// fail with the checkpoint's error (none waits for log space the checkpointer cannot free),
/// and the log keeps every committed transaction for recovery.
#[test]
fn failed_checkpoint_stops_and_recovery_restores_what_was_fsynced() {
    let img = scratch("jfault-ckpt");
    mke2fs(&img.0, "32M", &["-J", "size=4"]);
    let (dev, fs) = open_faulty(&img.0, false);
    dev.fail(FAIL_SUPERBLOCK);
    let mut durable = Vec::new();
    let mut failed = None;
    for i in 0..2000u32 {
        let name = format!("f{i}");
        let r = fs
            .create(2, name.as_bytes(), 0o644, 0, 0)
            .and_then(|a| fs.write(a.ino, 0, &[i as u8; 3000]).map(|_| a.ino))
            .and_then(|ino| fs.fsync(ino, false));
        match r {
            Ok(()) => durable.push(i),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        if i % 50 == 49 {
            // Let the checkpointer run into the failing write.
            let _ = fs.sync();
        }
    }
    let e = failed.expect("a checkpoint failed, so something must fail");
    assert!(e.to_string().contains("checkpoint failed"), "{e}");
    assert!(!durable.is_empty());
    assert!(fs.sync().is_err());
    drop(fs);
    dev.fail(FAIL_NONE);
    drop(dev);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    for i in &durable {
        let ino = fs
            .lookup(2, format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("f{i} was fsynced: {e}"))
            .ino;
        let mut buf = vec![0u8; 3000];
        assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), 3000);
        assert!(buf.iter().all(|&b| b == *i as u8), "f{i}");
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

// ---- Journals the kernel wrote ----

/// The kernel's own jbd2 transactions, not debugfs's: the kernel's ext4 (commit interval 300 s,
/// so only `sync` commits) builds a tree, removes part of it (revoke records for freed
/// metadata blocks) and syncs; a copy of the image taken while it is still mounted holds those
/// transactions in the log, not yet checkpointed. uext4 replays that log byte for byte as
/// e2fsck does, and opening the copy shows the tree the kernel showed.
#[test]
fn kernel_written_journals_replay_in_uext4() {
    if !can_loop_mount() {
        return;
    }
    // Checksum v3 with 64-bit tags (the default), and no journal checksums with 1 KiB blocks.
    for (what, opts) in [
        ("4 KiB, metadata_csum", &[][..]),
        (
            "1 KiB, no checksums",
            &["-b", "1024", "-O", "^metadata_csum,^64bit"][..],
        ),
    ] {
        kernel_written_journal_case(what, opts);
    }
}

fn kernel_written_journal_case(what: &str, opts: &[&str]) {
    let img = scratch("jkernel-live");
    mke2fs(&img.0, "64M", opts);
    let dir =
        std::env::temp_dir().join(format!("uext4-jlive-{}-{}", std::process::id(), opts.len()));
    std::fs::create_dir_all(&dir).unwrap();
    sh(&format!(
        "mount -t ext4 -o loop,commit=300 {} {}",
        img.0.display(),
        dir.display()
    ));
    let copy = scratch("jkernel-copy");
    let result = std::panic::catch_unwind(|| {
        sh(&format!(
            "set -e; cd {}; mkdir -p a/b/c big gone; \
             for i in $(seq 1 300); do head -c $((i * 37)) /dev/urandom > big/f$i; done; \
             for i in $(seq 1 40); do echo $i > gone/x$i; done; \
             head -c 3000000 /dev/urandom > a/b/c/large; ln a/b/c/large a/hard; \
             sync; \
             rm -r gone; mv big/f1 a/moved; truncate -s 1000 a/b/c/large; \
             for i in $(seq 301 340); do echo $i > big/f$i; done; \
             sync",
            dir.display()
        ));
        let expected = kernel_tree(&dir);
        std::fs::copy(&img.0, &copy.0).unwrap();
        expected
    });
    sh(&format!("umount {}", dir.display()));
    let _ = std::fs::remove_dir(&dir);
    let expected = result.unwrap();
    e2fsck_clean(&img.0);
    assert!(
        open_journal(&copy.0).1.needs_recovery(),
        "{what}: the kernel checkpointed everything before the copy: nothing to replay"
    );
    let (report, _) = replay_both_and_compare(&copy.0, what);
    assert!(report.transactions >= 2, "{what}: {report:?}");
    assert!(report.blocks_revoked >= 1, "{what}: {report:?}");
    let fs = Fs::open_path(&copy.0, MountOptions::default()).unwrap();
    assert_eq!(
        tree(&fs),
        expected,
        "{what}: uext4 after replaying the kernel's journal"
    );
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&copy.0);
}

/// A directory's blocks go through the journal; when the directory is removed they are
/// revoked, so that a crash before the journal's tail moves past their logged copies does
/// not replay those over a file that reuses the blocks (the kernel's ext4 frees directory
/// blocks as metadata for this). They were freed as data: files fsynced after the rmdir
/// came back, after a crash, holding the old directory's entries. Checked on the image as
/// the crash leaves it, recovered by uext4 and by e2fsck -fy, in both layouts (extents and
/// block maps).
#[test]
fn removed_directory_blocks_are_not_replayed_over_new_files() {
    for extra in [&[][..], &["-O", "^extent,^64bit"][..]] {
        let img = scratch("revoke-dir");
        let mut args = vec!["-b", "4096"];
        args.extend_from_slice(extra);
        mke2fs(&img.0, "64M", &args);
        let dev = Arc::new(uext4::blockdev::MemDevice::from_vec(
            std::fs::read(&img.0).unwrap(),
        ));
        let fs = Fs::open_dev(dev.clone(), opts::no_timer()).unwrap();
        // A directory of several blocks, logged.
        let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
        for i in 0..400 {
            let name = format!("entry-with-a-longish-name-{i:04}");
            fs.create(a, name.as_bytes(), 0o644, 0, 0).unwrap();
        }
        fs.fsync(a, false).unwrap();
        fs.fsync(2, false).unwrap();
        for i in 0..400 {
            let name = format!("entry-with-a-longish-name-{i:04}");
            fs.unlink(a, name.as_bytes()).unwrap();
        }
        fs.rmdir(2, b"a").unwrap();
        fs.fsync(2, false).unwrap();
        // Its transaction goes home in the background and its blocks become reusable; the
        // journal's start on disk moves later.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let z = vec![b'Z'; 4096 * 4];
        let mut files = Vec::new();
        for i in 0..8 {
            let name = format!("f{i}");
            let f = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(f, 0, &z).unwrap();
            fs.fsync(f, false).unwrap();
            files.push(name);
        }
        fs.fsync(2, false).unwrap();
        // The crash: the device as it is now, the filesystem never unmounted.
        let crashed = dev.to_vec();
        drop(fs);
        let check = |fs: &Fs, who: &str| {
            for name in &files {
                let ino = fs.lookup(2, name.as_bytes()).unwrap().ino;
                let mut buf = vec![0u8; z.len()];
                assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), z.len());
                assert!(
                    buf == z,
                    "{extra:?}: {name} after recovery by {who} holds other bytes"
                );
            }
        };
        let rec = Arc::new(uext4::blockdev::MemDevice::from_vec(crashed.clone()));
        let fs = Fs::open_dev(rec.clone(), MountOptions::default()).unwrap();
        check(&fs, "uext4");
        fs.unmount().unwrap();
        drop(fs);
        std::fs::write(&img.0, &crashed).unwrap();
        e2fsck_fy(&img.0);
        e2fsck_clean(&img.0);
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        check(&fs, "e2fsck");
    }
}

/// Many threads fsyncing at once, and others asking for commits when there is often nothing
/// to commit: every call returns (a watchdog fails the test on a hang: a waiter that missed
/// its wake-up), fsyncs share commits (some find theirs already committed by another
/// thread's), and what each thread last wrote is there after a remount, e2fsck clean.
#[test]
fn concurrent_fsyncs_all_return_and_share_commits() {
    let img = scratch("jfsyncs");
    mke2fs(&img.0, "128M", &[]);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    const WRITERS: usize = 24;
    const ROUNDS: u64 = 150;
    let inos: Vec<u32> = (0..WRITERS)
        .map(|t| {
            let ino = fs
                .create(2, format!("f{t}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            fs.write_all(ino, 0, &[0u8; 16 * 4096]).unwrap();
            ino
        })
        .collect();
    fs.commit().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for (t, &ino) in inos.iter().enumerate() {
        let fs = fs.clone();
        let done = done_tx.clone();
        threads.push(std::thread::spawn(move || {
            let mut next = xorshift(t as u64 + 1);
            let mut last = vec![0u8; 16 * 4096];
            for round in 0..ROUNDS {
                let blk = (next() % 16) as usize;
                let data = vec![(round as u8) ^ (t as u8) | 1; 4096];
                fs.write_all(ino, blk as u64 * 4096, &data).unwrap();
                // Every other round also a metadata change, which the fsync must commit (the
                // overwrite alone changes only timestamps, logged lazily).
                if round % 2 == 0 {
                    fs.setxattr(
                        ino,
                        b"user.round",
                        &round.to_le_bytes(),
                        uext4::XattrFlags::Any,
                    )
                    .unwrap();
                }
                fs.fsync(ino, round % 3 == 0).unwrap();
                last[blk * 4096..(blk + 1) * 4096].copy_from_slice(&data);
            }
            done.send(()).unwrap();
            last
        }));
    }
    let committers: Vec<_> = (0..2)
        .map(|_| {
            let fs = fs.clone();
            let done = done_tx.clone();
            std::thread::spawn(move || {
                for _ in 0..300 {
                    fs.commit().unwrap();
                }
                done.send(()).unwrap();
            })
        })
        .collect();
    for _ in 0..WRITERS + 2 {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a thread did not return from fsync or commit within 120 s");
    }
    let expect: Vec<Vec<u8>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    for c in committers {
        c.join().unwrap();
    }
    let stats = fs.stats_json();
    let count = |key: &str| -> u64 {
        let at = stats.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
        stats[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        count("fsync_already_committed") > 0,
        "no fsync found its change committed by another's commit: {stats}"
    );
    fs.unmount().unwrap();
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    for (t, want) in expect.iter().enumerate() {
        let ino = fs.lookup(2, format!("f{t}").as_bytes()).unwrap().ino;
        let mut got = vec![0u8; want.len()];
        fs.read(ino, 0, &mut got).unwrap();
        assert!(got == *want, "file f{t} holds what its thread last wrote");
    }
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

/// A filesystem inside a region of a bigger device (a partition), left with its journal to
/// replay: a read-only open replays it in memory (the device keeps its bytes), a read-write
/// open replays it into the region only, and the neighbours before and after stay intact.
#[test]
fn a_journal_inside_a_partition_replays_there_only() {
    let img = scratch("jregion");
    mke2fs(&img.0, "32M", &[]);
    let fsbytes = std::fs::read(&img.0).unwrap();
    let head = vec![0x5au8; 1 << 20];
    let tail = vec![0xa5u8; 1 << 20];
    let region = uext4::blockdev::Region {
        offset: head.len() as u64,
        len: Some(fsbytes.len() as u64),
    };
    let disk: Vec<u8> = [head.clone(), fsbytes, tail.clone()].concat();
    let dev = Arc::new(uext4::blockdev::MemDevice::from_vec(disk));
    let opts = |read_only| MountOptions {
        read_only,
        region: Some(region),
        ..opts::no_timer()
    };
    // A writer that commits and vanishes without unmounting.
    let fs = Fs::open_dev(dev.clone(), opts(false)).unwrap();
    fs.mkdir(fs.root_ino(), b"committed", 0o755, 0, 0).unwrap();
    let f = fs.create(fs.root_ino(), b"file", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[7u8; 100_000]).unwrap();
    fs.commit().unwrap();
    let crashed = dev.to_vec();
    std::mem::forget(fs);
    let dev = Arc::new(uext4::blockdev::MemDevice::from_vec(crashed.clone()));
    {
        let fs = Fs::open_dev(dev.clone(), opts(true)).unwrap();
        assert!(fs.lookup(fs.root_ino(), b"committed").is_ok());
        fs.unmount().unwrap();
    }
    assert!(dev.to_vec() == crashed, "a read-only open wrote the device");
    {
        let fs = Fs::open_dev(dev.clone(), opts(false)).unwrap();
        assert!(fs.lookup(fs.root_ino(), b"committed").is_ok());
        let mut back = vec![0u8; 100_000];
        fs.read(f, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 7));
        fs.unmount().unwrap();
    }
    let after = dev.to_vec();
    let (h, rest) = after.split_at(head.len());
    let (fsb, t) = rest.split_at(rest.len() - tail.len());
    assert!(
        h == head && t == tail,
        "a neighbour of the region was written"
    );
    std::fs::write(&img.0, fsb).unwrap();
    e2fsck_clean(&img.0);
}

/// The background committer commits once the filesystem goes quiet after a change, long
/// before its period: what a burst did survives a crash a moment after it (a FUSE mount's
/// `sync` never reaches the server, so this is its durability window).
#[test]
fn a_burst_of_changes_is_committed_once_the_filesystem_goes_quiet() {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let img = scratch("idle-commit");
    mke2fs(&img.0, "32M", &[]);
    let opened = Instant::now();
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert!(MountOptions::default().commit_interval_secs >= 5);
    let commits = || fs.txn_stats().commits.load(Ordering::Relaxed);
    let c0 = commits();
    for i in 0..20 {
        fs.create(2, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    while commits() == c0 && opened.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        commits() > c0,
        "nothing was committed {:?} after the burst (the period is {} s)",
        opened.elapsed(),
        MountOptions::default().commit_interval_secs
    );
    fs.crash();
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    for i in 0..20 {
        fs.lookup(2, format!("f{i}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

/// Files still open at unmount are closed by it: unlinked ones (and tmpfiles) are freed, so
/// the image passes e2fsck at once instead of waiting for the next open to empty the orphan
/// list. (A FUSE unmount aborts the connection, dropping the RELEASEs the kernel had not sent.)
#[test]
fn unmount_frees_unlinked_files_still_open() {
    let img = scratch("close-orphans");
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    for i in 0..50 {
        let name = format!("f{i}");
        let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &vec![i as u8; 20_000]).unwrap();
        fs.open(ino).unwrap();
        fs.unlink(2, name.as_bytes()).unwrap();
        let t = fs.tmpfile(2, 0o600, 0, 0).unwrap().ino;
        fs.open(t).unwrap();
    }
    let free_before = fs.statfs().files_free;
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    assert!(fs.statfs().files_free >= free_before + 100);
    fs.unmount().unwrap();
}

/// Many open unlinked files released at once from several threads: each release takes its
/// inode off the orphan chain and rewrites its neighbour's link while others do the same to
/// theirs; no freed inode may be left with a link of the chain in its i_dtime (e2fsck:
/// "part of a corrupted orphan linked list"), and none may stay allocated.
#[test]
fn concurrent_releases_of_neighbouring_orphans_leave_a_clean_chain() {
    let img = scratch("orphan-race");
    mke2fs(&img.0, "64M", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let threads = 4;
    let per = 300;
    // Interleaved on the chain: thread t's files sit between the other threads' ones.
    let mut inos = vec![Vec::new(); threads];
    for _ in 0..per {
        for v in inos.iter_mut() {
            let t = fs.tmpfile(2, 0o600, 0, 0).unwrap().ino;
            fs.open(t).unwrap();
            v.push(t);
        }
    }
    let barrier = Arc::new(std::sync::Barrier::new(threads));
    let hs: Vec<_> = inos
        .into_iter()
        .map(|v| {
            let fs = fs.clone();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                for ino in v {
                    // Opened twice (tmpfile's own open and ours): released twice.
                    fs.release(ino).unwrap();
                    fs.release(ino).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
