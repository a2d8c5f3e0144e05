//! fsync with and without fast commits, one process per measurement, for `farm-bench A --vs B`
//! (BENCHMARKS.md, "Fast commits"). Makes a fresh fast_commit image with mke2fs in `--dir`,
//! sets up the files and commits them in full, then times `--ops` operations of one
//! workload through the library, with `MountOptions::fast_commit` as `--fast-commit` says,
//! and prints one line: the workload, the setting, operations per second, and the fast and full
//! commits made.
//!
//! - `append`: 4 KiB appended to one of four files in turn, then fsync (a new block: ADD_RANGE
//!   and INODE records);
//! - `randwrite`: 16 KiB written at a random 16 KiB-aligned place in a 64 MiB file, then fsync
//!   (an overwrite: the new mtime is the INODE record);
//! - `pkg-install`: a new file written beside its target, fsync (CREAT, ADD_RANGE and INODE
//!   records), renamed over the target, fsync of the directory (UNLINK of the old file,
//!   which is freed, LINK and UNLINK of the new: the durable replace package managers do).

//!
//! `--kernel` runs the same operations through the kernel's ext4 instead (root: the image is
//! loop-mounted in `--dir`), the fast_commit feature on the image or not as `--fast-commit`
//! says, so that the kernel's ratio stands beside uext4's.

use anyhow::{bail, Context, Result};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;
use uext4::{Fs, MountOptions, RenameFlags};

fn main() -> Result<()> {
    let mut workload = String::from("append");
    let mut fast = true;
    let mut ops = 2000u64;
    let mut dir = std::env::temp_dir();
    let mut kernel = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--workload" => workload = val()?,
            "--fast-commit" => {
                fast = match val()?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => bail!("--fast-commit takes on or off, not {v}"),
                }
            }
            "--ops" => ops = val()?.parse().context("--ops takes a count")?,
            "--dir" => dir = val()?.into(),
            "--kernel" => kernel = true,
            _ => bail!("unknown argument {a} (--workload append|randwrite|pkg-install, --fast-commit on|off, --ops N, --dir D, --kernel)"),
        }
    }
    let img = dir.join(format!("fc-fsync-{}.img", std::process::id()));
    // The kernel's fast commits are the image's feature; uext4's, the mount option.
    let features = if fast || !kernel {
        "fast_commit"
    } else {
        "^fast_commit"
    };
    let st = std::process::Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", features])
        .arg(&img)
        .arg("256M")
        .status()
        .context("running mke2fs")?;
    if !st.success() {
        bail!("mke2fs failed: {st}");
    }
    if kernel {
        let r = run_kernel(&img, &workload, ops);
        std::fs::remove_file(&img)?;
        let secs = r?;
        println!(
            "{workload} kernel fast_commit={} ops/s {:.0}",
            if fast { "on" } else { "off" },
            ops as f64 / secs
        );
        return Ok(());
    }
    let opts = MountOptions {
        fast_commit: fast,
        commit_interval_secs: 0,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&img, opts)?;
    let r = run(&fs, &workload, ops);
    fs.unmount()?;
    drop(fs);
    std::fs::remove_file(&img)?;
    let (secs, fast_commits, full) = r?;
    println!(
        "{workload} fast_commit={} ops/s {:.0} fast {fast_commits} full {full}",
        if fast { "on" } else { "off" },
        ops as f64 / secs
    );
    Ok(())
}

/// Sets up, then times `ops` operations; returns seconds and the fast and full commits made.
fn run(fs: &Fs, workload: &str, ops: u64) -> Result<(f64, u64, u64)> {
    let root = fs.root_ino();
    let mut files = Vec::new();
    let block = vec![0x5au8; 16 << 10];
    match workload {
        "append" => {
            for i in 0..4 {
                files.push(
                    fs.create(root, format!("log{i}").as_bytes(), 0o644, 0, 0)?
                        .ino,
                );
            }
        }
        "randwrite" => {
            let f = fs.create(root, b"data", 0o644, 0, 0)?.ino;
            for i in 0..(64 << 20) / block.len() as u64 {
                fs.write(f, i * block.len() as u64, &block)?;
            }
            files.push(f);
        }
        "pkg-install" => {}
        w => bail!("unknown workload {w} (append, randwrite, pkg-install)"),
    }
    fs.commit()?;
    let t = fs.txn_stats();
    let (f0, c0) = (
        t.fast_commits.load(Ordering::Relaxed),
        t.commits.load(Ordering::Relaxed),
    );
    let mut rnd = 0x9E37_79B9_7F4A_7C15u64;
    let start = Instant::now();
    for i in 0..ops {
        match workload {
            "append" => {
                let f = files[(i % 4) as usize];
                let at = fs.getattr(f)?.size;
                fs.write(f, at, &block[..4096])?;
                fs.fsync(f, false)?;
            }
            "randwrite" => {
                rnd ^= rnd << 13;
                rnd ^= rnd >> 7;
                rnd ^= rnd << 17;
                let at = rnd % ((64 << 20) / block.len() as u64) * block.len() as u64;
                fs.write(files[0], at, &block)?;
                fs.fsync(files[0], false)?;
            }
            _ => {
                let name = format!("pkg{}", i % 200);
                let tmp = format!("{name}.tmp");
                let f = fs.create(root, tmp.as_bytes(), 0o644, 0, 0)?.ino;
                fs.write(f, 0, &block[..8192])?;
                fs.fsync(f, false)?;
                fs.rename(
                    root,
                    tmp.as_bytes(),
                    root,
                    name.as_bytes(),
                    RenameFlags::default(),
                )?;
                fs.fsync(root, false)?;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((
        secs,
        t.fast_commits.load(Ordering::Relaxed) - f0,
        t.commits.load(Ordering::Relaxed) - c0,
    ))
}

/// The same operations through the kernel's ext4: `img` loop-mounted beside itself, set up
/// and synced, then `ops` operations timed; unmounted after. Returns the seconds.
fn run_kernel(img: &Path, workload: &str, ops: u64) -> Result<f64> {
    let mnt = img.with_extension("mnt");
    std::fs::create_dir_all(&mnt)?;
    let st = std::process::Command::new("mount")
        .args(["-o", "loop"])
        .arg(img)
        .arg(&mnt)
        .status()
        .context("running mount")?;
    if !st.success() {
        bail!("mount -o loop failed (root?): {st}");
    }
    let r = kernel_ops(&mnt, workload, ops);
    let st = std::process::Command::new("umount").arg(&mnt).status()?;
    std::fs::remove_dir(&mnt)?;
    if !st.success() {
        bail!("umount failed: {st}");
    }
    r
}

fn kernel_ops(mnt: &Path, workload: &str, ops: u64) -> Result<f64> {
    use std::fs::{File, OpenOptions};
    let block = vec![0x5au8; 16 << 10];
    let mut files = Vec::new();
    match workload {
        "append" => {
            for i in 0..4 {
                files.push(
                    OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(mnt.join(format!("log{i}")))?,
                );
            }
        }
        "randwrite" => {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(mnt.join("data"))?;
            for _ in 0..(64 << 20) / block.len() {
                f.write_all(&block)?;
            }
            files.push(f);
        }
        "pkg-install" => {}
        w => bail!("unknown workload {w} (append, randwrite, pkg-install)"),
    }
    let dir = File::open(mnt)?;
    sync_fs(mnt)?;
    let mut rnd = 0x9E37_79B9_7F4A_7C15u64;
    let start = Instant::now();
    for i in 0..ops {
        match workload {
            "append" => {
                let f = &mut files[(i % 4) as usize];
                f.write_all(&block[..4096])?;
                f.sync_all()?;
            }
            "randwrite" => {
                rnd ^= rnd << 13;
                rnd ^= rnd >> 7;
                rnd ^= rnd << 17;
                let at = rnd % ((64 << 20) / block.len() as u64) * block.len() as u64;
                let f = &mut files[0];
                f.seek(SeekFrom::Start(at))?;
                f.write_all(&block)?;
                f.sync_all()?;
            }
            _ => {
                let name = mnt.join(format!("pkg{}", i % 200));
                let tmp = mnt.join(format!("pkg{}.tmp", i % 200));
                let mut f = File::create(&tmp)?;
                f.write_all(&block[..8192])?;
                f.sync_all()?;
                std::fs::rename(&tmp, &name)?;
                dir.sync_all()?;
            }
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The setup made durable before the timing: `sync`, as the library run commits in full.
fn sync_fs(mnt: &Path) -> Result<()> {
    let st = std::process::Command::new("sync")
        .arg("-f")
        .arg(mnt)
        .status()?;
    if !st.success() {
        bail!("sync -f failed: {st}");
    }
    Ok(())
}
