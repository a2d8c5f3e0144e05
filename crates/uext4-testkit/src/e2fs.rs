//! e2fsprogs as the oracle: images made by `mke2fs`, and `e2fsck -fn` that fails the test on
//! any complaint.

use std::path::Path;
use std::process::Command;

/// Makes an ext4 image with mke2fs, `size` like "64M", extra args like `["-b", "1024"]`.
pub fn mke2fs(path: &Path, size: &str, extra: &[&str]) {
    let _ = std::fs::remove_file(path);
    // mke2fs picks 1 KiB blocks for images under 512 MiB ("small"): default to 4 KiB unless the
    // caller asks.
    let bs: &[&str] = if extra.contains(&"-b") {
        &[]
    } else {
        &["-b", "4096"]
    };
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .args(bs)
        .args(extra)
        .arg(path)
        .arg(size)
        .status()
        .expect("mke2fs must be installed (e2fsprogs)");
    assert!(st.success(), "mke2fs failed for {}", path.display());
}

/// Runs `e2fsck -fn` and panics with its output on any complaint.
pub fn e2fsck_clean(path: impl AsRef<Path>) {
    let path = path.as_ref();
    e2fsck_clean_when(path, &path.display().to_string());
}

/// [`e2fsck_clean`], naming the moment in the panic message (like "after uext4 cp").
pub fn e2fsck_clean_when(path: impl AsRef<Path>, when: &str) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(path.as_ref())
        .output()
        .expect("e2fsck must be installed (e2fsprogs)");
    assert!(
        out.status.success(),
        "e2fsck -fn found problems ({when}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
