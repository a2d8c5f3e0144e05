//! uext4: a userspace ext4 engine.
//!
//! It reads and writes ext2/3/4 images (files, block devices, partitions, NBD exports) without
//! the kernel: journaled like the kernel's ext4, so that an image it leaves is one `e2fsck`
//! and the kernel accept.
//!
//! ```
//! use uext4::{Fs, MountOptions};
//!
//! // A new 64 MiB ext4 image, as `mke2fs -t ext4` would make it.
//! let image = std::env::temp_dir().join(format!("uext4-example-{}.img", std::process::id()));
//! uext4::mkfs::make_image(&image, 64 << 20)?;
//!
//! let fs = Fs::open_path(&image, MountOptions::default())?;
//! let file = fs.create(uext4::ROOT_INO, b"hello.txt", 0o644, 0, 0)?;
//! fs.write(file.ino, 0, b"hello, ext4\n")?;
//! fs.fsync(file.ino, false)?;
//! fs.unmount()?; // commits, checkpoints and marks the image clean
//!
//! std::fs::remove_file(&image)?;
//! Ok::<(), uext4::Error>(())
//! ```
//!
//! # The public API
//! - [`Fs`], opened with [`Fs::open_path`] or [`Fs::open_dev`] and [`MountOptions`]: the
//!   filesystem, with its operations (lookup, create, read, write, rename, xattrs, ...) named
//!   as the VFS names them and taking inode numbers, as a FUSE server does. An `Fs` is shared
//!   (`Arc<Fs>`) and safe to call from many threads.
//! - [`Error`] and [`Result`]: every failure, with its errno ([`Error::errno`]).
//! - [`blockdev`]: the device trait and its backends (files, memory, mappings, regions of a
//!   device, NBD); [`image`]: opening one by name; [`partition`]: GPT and MBR tables.
//! - [`ImageName`]: an image as the uext4 command names one (`disk.img`, `disk.img@2` for a
//!   partition, `disk.img@offset=1M`, NBD URIs), opened with [`ImageName::open`].
//! - [`mkfs`]: making a new filesystem, laid out as `mke2fs` lays it out.
//! - `format` (with the `format` feature): the on-disk structures (superblock, group
//!   descriptors, inodes, ...), for tools that inspect an image below the filesystem's API.
//!   It follows the disk, not semver.
//!
//! # Cargo features
//! - `nbd` (default): the NBD client, [`NbdDevice`] and `nbd://` image names. No crate.
//! - `gpt` (default): GPT partition tables (the `gpt` crate). MBR tables are always read.
//! - `mapped` (default): [`blockdev::MappedDevice`], the image mapped into memory (memmap2),
//!   behind `MountOptions::dax` and images on tmpfs.
//! - `format`: the `format` module public.
//!
//! Without one of them, what it would have opened is refused with an error that names the
//! feature.
//!
//! # Layers
//! Inside, bottom to top (see DESIGN.md in the design notes): the device; `format`, on-disk
//! structures without I/O; the geometry and the superblock's counters; the metadata block
//! cache; the jbd2 journal, which knows nothing of ext4, and its checkpointing; transactions,
//! commit, sync and unmount; the block allocator and block and inode allocation, locked per
//! group; the extent tree and its cache; directory entries and the hashed index; extended
//! attributes and ACLs; inline data; the inode cache, namespace operations and file I/O;
//! buffered mode's write-back cache with delayed allocation; multi-mount protection.

#![warn(missing_docs)]

mod acl;
mod atime;
mod attr;
mod balloc;
mod bcache;
mod bigalloc;
mod block_validity;
pub mod blockdev;
mod cache_reserve;
mod cred;
// fscrypt (per-file encryption): the core in crypto/, the engine's side in encrypt.rs.
#[allow(dead_code)]
pub(crate) mod crypto;
mod delalloc;
mod delalloc_state;
mod dir;
mod encrypt;
mod error;
mod extent_cache;
mod extents;
mod fast_commit;
mod file;
pub mod flags;
mod fname;
// The on-disk structures: public with the `format` feature (the uext4 command's raw views),
// private otherwise, so that embedders' semver surface is the API above them.
#[cfg(feature = "format")]
pub mod format;
#[cfg(not(feature = "format"))]
#[allow(dead_code, unreachable_pub)]
mod format;
mod fs;
mod fsync;
mod geometry;
mod holder;
mod htree;
mod ialloc;
mod icache;
pub mod image;
pub mod image_name;
mod inline;
mod inline_write;
mod inode;
mod inspect;
mod label;
// Public but hidden: tests/journal.rs checks the journal on its own (replay against debugfs,
// e2fsck and the kernel); it is no API for users.
#[doc(hidden)]
pub mod journal;
mod journal_history;
mod mballoc;
pub mod mkfs;
mod mmp;
mod namei;
#[cfg(feature = "nbd")]
mod nbd;
mod orphan;
mod overwrite;
pub mod partition;
mod place;
mod quota;
mod reader;
mod recovery;
pub mod sandbox;
mod super_info;
mod sync;
mod transaction;
mod trim;
mod verity;
mod walk;
mod xattr;
mod xattr_inode;

pub use acl::Umask;
// Hidden: tests/acl.rs checks the POSIX ACL rules on their own; they are no API for users.
#[doc(hidden)]
pub use acl::{chmod as acl_chmod, create_masq as acl_create_masq};
#[doc(hidden)]
pub use acl::{is_equivalent_to_mode as acl_is_equivalent_to_mode, mode_bits as acl_mode_bits};
pub use attr::{SetAttr, TimeSet};
pub use cred::{Cred, Groups};
pub use crypto::{EncryptionKey, EncryptionPolicy};
pub use encrypt::EncryptionStatus;
pub use error::{Corruption, Error, Result};
pub use extents::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
pub use file::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
pub use flags::{flags_to_xflags, xflags_to_flags, FsXattr};
pub use format::inode::{
    Timestamp, ROOT_INO, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
pub use fs::{AtimeMode, AtimePolicy, ErrorsBehaviour, Fs, FsStats, MountOptions, StatFs};
pub use fsync::FsyncQueue;
pub use geometry::Geometry;
pub use image_name::{ImageName, Within};
pub use inspect::{BlockMap, BlockRun, InodeRecord, MapEntry, RawDirEntry};
pub use journal_history::{
    BlockUse, DeletedFile, JournalHistory, LoggedBlock, LoggedInode, LoggedState, LoggedTransaction,
};
// At the root, not in `blockdev`: nbd implements `BlockDevice`, and a re-export there would
// close an import circle.
pub use inode::Attr;
pub use label::LABEL_MAX;
pub use namei::{
    DirEntry, RenameFlags, FT_BLKDEV, FT_CHRDEV, FT_DIR, FT_FIFO, FT_REG, FT_SOCK, FT_SYMLINK,
    FT_UNKNOWN, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT,
};
#[cfg(feature = "nbd")]
pub use nbd::NbdDevice;
pub use place::Placed;
pub use quota::QuotaReport;
pub use reader::{FileHandle, FileReader};
pub use transaction::TxnStats;
pub use trim::Trimmed;
pub use verity::VerityArgs;
pub use walk::{Walk, WalkEntry};
pub use xattr::XattrFlags;

#[cfg(test)]
mod tests {
    /// The README's "Using the library" example is the crate docs' example, which runs as a
    /// doctest: the README's copy must not drift from it.
    #[test]
    fn readme_example_is_the_crate_example() {
        let code = |text: &str, prefix: &str| -> String {
            let lines: Vec<&str> = text
                .lines()
                .map(|l| match l.strip_prefix(prefix) {
                    Some(r) => r.strip_prefix(' ').unwrap_or(r),
                    None => l,
                })
                .collect();
            let start = lines
                .iter()
                .position(|l| l.trim_end() == "```rust" || l.trim_end() == "```")
                .unwrap();
            let len = lines[start + 1..]
                .iter()
                .position(|l| l.trim_end() == "```")
                .unwrap();
            lines[start + 1..start + 1 + len]
                .iter()
                .map(|l| l.trim_end().to_string() + "\n")
                .collect()
        };
        let readme = include_str!("../../../README.md");
        let section = &readme[readme.find("## Using the library").unwrap()..];
        assert_eq!(code(section, ""), code(include_str!("lib.rs"), "//!"));
    }

    /// Counts the warnings logged on this thread.
    #[derive(Default)]
    struct Warnings(std::sync::atomic::AtomicUsize);

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, e: &tracing::Event<'_>) {
            if *e.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// How many warnings `f` logs on this thread.
    fn warnings(f: impl FnOnce()) -> usize {
        let w = std::sync::Arc::new(Warnings::default());
        tracing::subscriber::with_default(w.clone(), f);
        w.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A read-write `Fs` dropped without unmount warns once; after unmount, read-only, or
    /// through `Fs::crash`, it does not.
    #[test]
    fn drop_without_unmount_warns_once() {
        use crate::blockdev::MemDevice;
        use crate::{Fs, MountOptions};
        use std::sync::Arc;
        let dev = Arc::new(MemDevice::new(8 << 20));
        crate::mkfs::mkfs(&*dev, &crate::mkfs::MkfsOptions::like_mke2fs(8 << 20, None)).unwrap();
        let open = |opts: MountOptions| Fs::open_dev(dev.clone(), opts).unwrap();
        assert_eq!(warnings(|| drop(open(MountOptions::default()))), 1);
        assert_eq!(warnings(|| open(MountOptions::default()).crash()), 0);
        assert_eq!(warnings(|| drop(open(MountOptions::ro()))), 0);
        let unmounted = warnings(|| {
            let fs = open(MountOptions::default());
            fs.unmount().unwrap();
        });
        assert_eq!(unmounted, 0);
    }
}
