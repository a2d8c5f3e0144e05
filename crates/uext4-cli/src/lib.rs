//! The `uext4` command's modules, as a library for the fuzz harnesses (fuzz/: the tar reader
//! of `mkfs -d` and `cp --from-tar`, genext2fs device tables). It is no API: the binary
//! (main.rs) is the only other user.

#![doc(hidden)]

pub mod host;
pub mod image;
pub mod log;
pub mod mount;
pub mod sandbox;
pub mod serve;
pub mod tools;

/// Whether this process was started as mount(8)'s helper (`mount.uext4`,
/// `mount.fuse.uext4`), whose exit statuses are mount(8)'s: 32 for a failed mount, 1 for a
/// usage mistake.
pub static MOUNT_HELPER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The exit status of a usage mistake: 2, as coreutils' and e2fsprogs' (1 from mount(8)'s
/// helper, where 2 would read "system error").
pub fn usage_status() -> i32 {
    if MOUNT_HELPER.load(std::sync::atomic::Ordering::Relaxed) {
        1
    } else {
        2
    }
}
