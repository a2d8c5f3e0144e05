//! Block mapping: which physical block holds each logical block of a file, as the kernel
//! splits it between extents_status.c, extents.c, indirect.c and ext4_map_blocks.
//!
//! - [`crate::extent_cache`]: the in-memory extent cache, a state module of its own. Every
//!   file's extents are loaded once, on first use, into an
//!   [`ExtentCache`](crate::extent_cache::ExtentCache) (a sorted map from
//!   first logical block to extent); lookups never read map blocks again (DESIGN.md R1). It is
//!   state the inode holds, and imports no filesystem operations.
//! - `tree`: the extent tree, loaded into the cache and edited one leaf at a time.
//! - `indirect`: the indirect block map of ext2/ext3 files, loaded into the same cache.
//! - `cluster`: bigalloc's rules for which cluster a file's block lives in, and when a
//!   cluster is freed and counted.
//! - `map`: the one dispatch point. Callers ask it (`Fs::ext_map`, `ext_insert`,
//!   `ext_remove`, ...) and it picks the tree or the indirect map for the inode.

mod cluster;
mod indirect;
mod map;
mod tree;

pub use tree::shift::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};

#[cfg(test)]
mod tests;
