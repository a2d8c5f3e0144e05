//! Helpers shared by uext4's tests, so that each test file says what it checks and not how to
//! make an image or read e2fsck's verdict.
//!
//! - [`scratch`](mod@scratch): paths removed on drop (images, directories, a whole tree);
//! - [`e2fs`]: `mke2fs` images and `e2fsck -fn` that fails on any complaint;
//! - [`needs`]: root, loop devices, FUSE, overlayfs and installed tools, each check saying what
//!   is missing;
//! - [`cli`]: running the `uext4` binary, with one-line error checks;
//! - [`opts`]: the [`MountOptions`](uext4::MountOptions) presets tests use;
//! - [`stats`]: snapshots of the engine's counters and their deltas;
//! - [`host`]: host extended attributes and shell commands;
//! - [`mount`]: waiting for a FUSE server to finish;
//! - [`faulty`]: a device that fails on demand, and a kernel loop mount;
//! - [`nbd`]: nbdkit and qemu-nbd servers.

pub mod cli;
pub mod e2fs;
pub mod faulty;
pub mod host;
pub mod mount;
pub mod nbd;
pub mod needs;
pub mod opts;
pub mod scratch;
pub mod stats;

pub use cli::Cli;
pub use e2fs::{e2fsck_clean, e2fsck_clean_when, mke2fs};
pub use faulty::{
    open_faulty, FaultyDevice, KernelMount, FAIL_ALL, FAIL_NONE, FAIL_READS, FAIL_SUPERBLOCK,
    PANIC_ON_WRITE,
};
pub use host::{fixture_script, fs_xattrs, hex, read_all, set_xattr, sh, unhex, xattrs, xorshift};
pub use mount::{idmapped_mount, uext4_mount, umount_and_wait, wait_server_gone, MountPlace};
pub use nbd::{free_port, NbdServer};
pub use needs::{can_loop_mount, fuse_usable, have, is_root, overlay_usable};
pub use scratch::{scratch, Scratch};
pub use stats::Stats;
