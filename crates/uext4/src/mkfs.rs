//! Making a new filesystem: our own mkfs, laid out the way `mke2fs -t ext4` of e2fsprogs 1.47
//! lays it out (the same geometry, the same placement of every structure), so that `dumpe2fs`
//! of the two differs only in times, UUIDs and hash seeds.
//!
//! [`mkfs`] takes mke2fs's steps, one module each:
//! 1. layout.rs: the shape (as ext2fs_initialize): block and inode counts per group, reserved
//!    GDT blocks, the groups that keep superblock copies;
//! 2. tables.rs: where each group's bitmaps and inode table go (ext2fs_allocate_group_table);
//! 3. place.rs: the blocks of the root directory, lost+found, the resize inode, the journal and
//!    the orphan file, in mke2fs's order (alloc.rs holds the block bitmap and its searches);
//! 4. superblock.rs: the identity and the superblock;
//! 5. files.rs: the inode tables and the first inodes with their contents (writer.rs holds
//!    the device writer, the inode writer and the block maps);
//! 6. groups.rs: bitmaps and group descriptors;
//! 7. superblock.rs again: the superblock and descriptor table copies.
//!
//! Every on-disk structure is encoded by format/ (directory entries and tails, extent nodes,
//! inodes, superblock, group descriptors, orphan file blocks), as the engine encodes it.

mod alloc;
mod files;
mod groups;
mod layout;
mod options;
mod place;
mod superblock;
mod tables;
mod writer;

pub use layout::{layout, Layout};
pub use options::{default_journal_blocks, default_orphan_file_blocks, FeatureSet, MkfsOptions};
pub use superblock::journal_superblock;

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::group_desc::GdCsum;
use alloc::Blocks;
use superblock::{build_superblock, Identity};
use writer::{Maker, Writer};

/// Makes the image file `path`, `size` bytes long, holding a new ext4 filesystem with the
/// defaults `mke2fs -t ext4` picks for that size ([`MkfsOptions::like_mke2fs`]), as
/// `uext4 mkfs` does for a plain file. An existing file is grown to `size` if shorter and
/// overwritten.
///
/// ```
/// let image = std::env::temp_dir().join(format!("uext4-mkfs-doc-{}.img", std::process::id()));
/// uext4::mkfs::make_image(&image, 16 << 20)?;
/// assert_eq!(std::fs::metadata(&image)?.len(), 16 << 20);
/// let fs = uext4::Fs::open_path(&image, uext4::MountOptions::ro())?;
/// assert!(fs.lookup(uext4::ROOT_INO, b"lost+found").is_ok());
/// # drop(fs);
/// # std::fs::remove_file(&image)?;
/// # Ok::<(), uext4::Error>(())
/// ```
///
/// # Errors
/// What creating, sizing or writing the file reports, and [`crate::Error::Unsupported`] for
/// a size too small for a filesystem.
pub fn make_image(path: &std::path::Path, size: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let fresh = f.metadata()?.len() == 0;
    if f.metadata()?.len() < size {
        f.set_len(size)?;
    }
    drop(f);
    let dev = crate::blockdev::FileDevice::open(path, false)?;
    let mut opts = MkfsOptions::like_mke2fs(size, None);
    // A file just created reads as zeros, so mkfs need not zero the inode tables.
    opts.assume_zeroed = fresh;
    mkfs(&dev, &opts)?;
    dev.flush()?;
    Ok(())
}

/// Writes a new filesystem on `dev`.
pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
    let f = &opts.features;
    f.check()?;
    if f.inline_data && opts.inode_size as usize <= crate::format::inode::GOOD_OLD_INODE_SIZE {
        // As mke2fs: the data past i_block needs room for attributes in the inode.
        return Err(Error::Invalid(format!(
            "{}-byte inodes are too small for inline_data (use -I 256)",
            opts.inode_size
        )));
    }
    if f.project && opts.inode_size as usize <= crate::format::inode::GOOD_OLD_INODE_SIZE {
        // As mke2fs: i_projid lies past the old inode.
        return Err(Error::Invalid(format!(
            "{}-byte inodes have no room for project ids (use -I 256)",
            opts.inode_size
        )));
    }
    let l = layout(dev.size(), opts)?;
    let mut bm = Blocks::new(&l);
    let tables = tables::place_group_tables(&mut bm, &l, f.flex_bg)?;
    // From here on with bigalloc the bitmap counts clusters, as mke2fs's does.
    bm.count_clusters(l.cluster_bits);
    // Everything so far is fixed overhead, and so is the journal (in clusters, as
    // s_overhead_clusters; blocks without bigalloc).
    let overhead = bm.used() >> l.cluster_bits;
    let files = place::place_files(&mut bm, &l, opts)?;
    let id = Identity::new(opts);
    let mut sb = build_superblock(
        &l,
        opts,
        &id,
        files.journal.blocks,
        overhead + files.journal.blocks.div_ceil(l.cluster_ratio()),
    );
    let csum_seed = sb.csum_seed();
    let gd_kind = if f.metadata_csum {
        GdCsum::Crc32c { seed: csum_seed }
    } else if f.uninit_bg {
        GdCsum::Crc16 { uuid: id.uuid }
    } else {
        GdCsum::None
    };
    let mut m = Maker {
        w: Writer::new(dev, l.block_size),
        l,
        opts,
        bm,
        tables,
        csum_seed,
        now: id.now,
    };
    m.zero_inode_tables()?;
    m.write_reserved_inodes(&files)?;
    m.write_directories(&files)?;
    m.write_resize_inode(&files)?;
    m.write_journal(&files, id.uuid, &mut sb)?;
    m.write_quota_files(&files)?;
    m.write_orphan_file(&files)?;
    let totals = m.write_groups(&files, gd_kind)?;
    sb.set_free_blocks_count(totals.free_blocks);
    sb.set_free_inodes_count(totals.free_inodes as u32);
    m.write_superblocks(sb, &totals.table)?;
    m.w.flush()
}

#[cfg(test)]
mod tests;
