//! What this machine offers a test. Each check prints one `SKIP:` line naming what is missing
//! (and how to get it) and returns false; the test then returns early and passes.

use std::path::Path;
use std::process::{Command, Stdio};

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: a plain getter.
    unsafe { libc::geteuid() == 0 }
}

/// Whether every program in `tools` is on PATH; names the missing ones otherwise.
pub fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {t}"))
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "SKIP: not installed: {} (scripts/install-deps.sh installs them)",
            missing.join(", ")
        );
    }
    missing.is_empty()
}

/// Whether loop mounts of ext4 work here (root, loop devices).
pub fn can_loop_mount() -> bool {
    if !is_root() {
        eprintln!("SKIP: not root, kernel loop-mount comparison not run");
        return false;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIP: no /dev/loop-control, kernel loop-mount comparison not run");
        return false;
    }
    true
}

/// Whether FUSE mounts work here: root and /dev/fuse. `what` names the test part skipped.
pub fn fuse_usable(what: &str) -> bool {
    let missing = match (is_root(), Path::new("/dev/fuse").exists()) {
        (true, true) => return true,
        (false, true) => "root",
        (true, false) => "/dev/fuse",
        (false, false) => "root and /dev/fuse",
    };
    eprintln!("SKIP: {what} needs {missing}");
    false
}

/// Whether the kernel has overlayfs and loop devices (for its own ext4 as a reference), besides
/// what [`fuse_usable`] asks.
pub fn overlay_usable(what: &str) -> bool {
    if !fuse_usable(what) {
        return false;
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("\toverlay")) {
        eprintln!("SKIP: {what} needs overlayfs in this kernel");
        return false;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIP: {what} needs loop devices for the kernel's ext4 reference");
        return false;
    }
    true
}
