//! The journal against the oracles: transactions debugfs writes replay in uext4 exactly as
//! e2fsck replays them, and journals uext4 leaves behind after a crash replay in e2fsck and in a
//! kernel mount to the same tree as in uext4.

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

fn replay_case(base: &Scratch) {
    let dev = Arc::new(RecordingDevice::new(std::fs::read(&base.0).unwrap()));
    let fs = Fs::open_dev(
        dev.clone(),
        MountOptions {
            commit_interval_secs: 0,
            ..Default::default()
        },
    )
    .unwrap();
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
        let a = tree(
            &Fs::open_path(
                &ours.0,
                MountOptions {
                    read_only: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let b = tree(
            &Fs::open_path(
                &e2.0,
                MountOptions {
                    read_only: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        assert_eq!(a, b, "flush point {k}: uext4 and e2fsck replays differ");
        if can_loop_mount() && k % 9 == 0 {
            let kimg = scratch("jkernel");
            std::fs::write(&kimg.0, &img).unwrap();
            {
                let _m = KernelMount::new(&kimg.0);
            }
            e2fsck_clean(&kimg.0);
            let c = tree(
                &Fs::open_path(
                    &kimg.0,
                    MountOptions {
                        read_only: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            );
            assert_eq!(a, c, "flush point {k}: uext4 and kernel replays differ");
        }
        checked += 1;
    }
    assert!(checked > 3);
}
