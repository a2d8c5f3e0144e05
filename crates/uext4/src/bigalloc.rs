//! bigalloc: allocation in clusters of 2^n blocks (Documentation/filesystems/ext4/bigalloc.rst).
//!
//! With bigalloc the block bitmap has one bit per cluster, the group descriptors' free counts
//! are in clusters (the superblock's free count stays in blocks), each group holds
//! `s_clusters_per_group` clusters, group 0 starts at block 0 whatever the block size, and
//! extents still map blocks. This module holds the cluster arithmetic and the checks at open.
//! The allocator (balloc.rs) takes and frees whole clusters; which cluster a file's block
//! lives in, when a partly used cluster is freed and how i_blocks counts clusters is the
//! block map's (extents/cluster.rs).

use crate::error::{Corruption, Error, Result};
use crate::format::features::{names, INCOMPAT_EXTENTS, RO_COMPAT_BIGALLOC, RO_COMPAT_NAMES};
use crate::format::superblock::Superblock;

/// The kernel's EXT4_MAX_CLUSTER_LOG_SIZE: clusters of at most 1 GiB.
const MAX_CLUSTER_LOG_SIZE: u32 = 30;

/// log2 of blocks per cluster the superblock describes (0 without bigalloc), checked as the
/// kernel's ext4_fill_super checks it.
pub fn cluster_bits(sb: &Superblock) -> Result<u32> {
    if !sb.has_ro_compat(RO_COMPAT_BIGALLOC) {
        return Ok(0);
    }
    let bad = |m: String| {
        Err(Error::corrupt(
            Corruption::Superblock,
            format!("superblock: {m}"),
        ))
    };
    let (log_c, log_b) = (sb.log_cluster_size(), sb.log_block_size());
    if log_c < log_b || log_c + 10 > MAX_CLUSTER_LOG_SIZE {
        return bad(format!(
            "cluster size 2^(10+{log_c}) is invalid for block size 2^(10+{log_b})"
        ));
    }
    if !sb.has_incompat(INCOMPAT_EXTENTS) {
        return Err(Error::Unsupported(
            "bigalloc without the extent feature (the kernel refuses it too)".into(),
        ));
    }
    Ok(log_c - log_b)
}

/// Blocks the filesystem's own metadata takes, for statfs, where the superblock records it
/// (`s_overhead_clusters`, which mke2fs sets for bigalloc): the kernel then uses it rather
/// than counting.
pub fn recorded_overhead_blocks(sb: &Superblock, cluster_bits: u32) -> Option<u64> {
    let c = sb.overhead_clusters() as u64;
    (c != 0).then_some(c << cluster_bits)
}

/// Why a filesystem with read-only-compatible features uext4 does not maintain (`unknown`)
/// opens read-only.
pub fn read_only_reason(unknown: u32) -> String {
    format!(
        "unsupported read-only-compatible feature: {}",
        names(unknown, RO_COMPAT_NAMES).join(", ")
    )
}
