//! uext4: a userspace ext4 engine.
//!
//! Layers, bottom to top (see DESIGN.md in the shared design notes and the README):
//! - [`blockdev`]: the device trait and its backends; [`image`]: opening one by name;
//! - [`format`]: on-disk structures, no I/O;
//! - [`geometry`], [`super_info`]: the layout, and the superblock with its counters and flags;
//! - [`bcache`]: metadata blocks in memory;
//! - [`journal`]: jbd2, knowing nothing of ext4, with its own checkpointing;
//! - [`transaction`]: handles and commit; [`sync`]: the filesystem's commit, sync, unmount;
//! - [`mballoc`]: the block allocator's state; [`balloc`], [`ialloc`]: block and inode
//!   allocation, locked per group;
//! - [`extents`]: the extent tree and the in-memory extent cache;
//! - [`dir`], [`htree`]: directory entries and the hashed index;
//! - [`xattr`]: extended attributes;
//! - [`inline`]: inline data (small files and directories kept in the inode);
//! - [`icache`], [`inode`], [`namei`], [`file`]: the inode cache, inodes in the table,
//!   namespace operations, file I/O;
//! - [`delalloc_state`], [`delalloc`]: buffered mode's write-back cache with delayed
//!   allocation (its state, and writeback);
//! - [`mkfs`]: making a new filesystem;
//! - [`mmp`]: multi-mount protection (the MMP block and its updating thread).
//! - [`partition`]: GPT and MBR partition tables, and what a device or partition holds.
//! - [`nbd`]: an NBD client as a block device (images served by nbdkit, qemu-nbd, ...).

pub mod acl;
pub mod attr;
pub mod balloc;
pub mod bcache;
pub mod block_validity;
pub mod blockdev;
pub mod cred;
pub mod delalloc;
pub mod delalloc_state;
pub mod dir;
pub mod error;
pub mod extents;
pub mod file;
pub mod format;
pub mod fs;
pub mod fsync;
pub mod geometry;
pub mod holder;
pub mod htree;
pub mod ialloc;
pub mod icache;
pub mod image;
pub mod inline;
pub mod inode;
pub mod journal;
pub mod mballoc;
pub mod mkfs;
pub mod mmp;
pub mod namei;
pub mod nbd;
pub mod orphan;
pub mod partition;
pub mod super_info;
pub mod sync;
pub mod transaction;
pub mod xattr;

pub use cred::Cred;
pub use error::{Error, Result};
pub use fs::{Fs, MountOptions, StatFs};
pub use inode::Attr;
