//! Tests of the block mapping: the cache alone, the tree and the indirect map through the
//! dispatch point against models, e2fsprogs and the kernel.

use crate::error::{Error, Result};
use crate::extent_cache::ExtentCache;
use crate::format::extent::*;
use crate::format::{le32, put32};
use crate::fs::{Fs, MountOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

mod cache;
mod corruption;
mod image;
mod indirect;
mod kernel;
mod merge;
mod model;

struct Img(PathBuf);
impl Drop for Img {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn mkimg(tag: &str, size: &str, extra: &[&str]) -> Img {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = dir.join(format!("uext4-extm-{tag}-{}-{n}.img", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let st = Command::new("mke2fs")
        .args(["-q", "-F"])
        .args(extra)
        .arg(&p)
        .arg(size)
        .status()
        .expect("mke2fs (e2fsprogs) must be installed");
    assert!(st.success(), "mke2fs {extra:?}");
    Img(p)
}

fn e2fsck_clean(p: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(p).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn complains:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn open(p: &Path, read_only: bool) -> Arc<Fs> {
    Fs::open_path(
        p,
        MountOptions {
            commit_interval_secs: 0,
            read_only,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The leaf extents of an inode as e2fsprogs reads them (`debugfs -R "ex -l <ino>"`).
fn debugfs_extents(p: &Path, ino: u32) -> Vec<Extent> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("ex -l <{ino}>"))
        .arg(p)
        .output()
        .expect("debugfs (e2fsprogs) must be installed");
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    while text.contains("/ ") {
        text = text.replace("/ ", "/");
    }
    let mut v = Vec::new();
    for line in text.lines().skip(1) {
        let toks: Vec<&str> = line.split_whitespace().skip(2).collect();
        let nums: Vec<u64> = toks.iter().filter_map(|t| t.parse().ok()).collect();
        let (l, p, len) = match nums.len() {
            5 => (nums[0], nums[2], nums[4]),
            4 => (nums[0], nums[2], nums[3]),
            3 => (nums[0], nums[1], nums[2]),
            _ => panic!("debugfs line {line:?}"),
        };
        v.push(Extent {
            lblk: l as u32,
            len: len as u32,
            pblk: p,
            unwritten: toks.contains(&"Uninit"),
        });
    }
    v
}

/// Blocks of the on-disk tree below the root, counted by walking it.
fn tree_blocks(fs: &Fs, root: &[u8]) -> u64 {
    let hdr = ExtentHeader::read(root);
    if hdr.depth == 0 {
        return 0;
    }
    let mut n = 0;
    for i in 0..hdr.entries as usize {
        let x = ExtentIdx::read(&root[HEADER_SIZE + i * ENTRY_SIZE..]);
        let child = fs.bcache.get(x.leaf).unwrap().read().to_vec();
        n += 1 + tree_blocks(fs, &child);
    }
    n
}
