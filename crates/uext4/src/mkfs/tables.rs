//! Step 2 of mkfs: where each group's block bitmap, inode bitmap and inode table go, as
//! ext2fs_allocate_group_table places them. With flex_bg the block bitmaps of 16 groups sit
//! together, then their inode bitmaps, then their inode tables, at the first free blocks of the
//! flex group; without it each group's tables sit at its own first free blocks.

use super::alloc::Blocks;
use super::layout::Layout;
use crate::error::{Error, Result};

/// Groups per flex group when flex_bg is on (s_log_groups_per_flex 4).
pub(super) const FLEX_GROUPS: u32 = 16;

/// Each group's block bitmap, inode bitmap and first inode table block.
pub(super) struct GroupTables {
    pub block_bitmap: Vec<u64>,
    pub inode_bitmap: Vec<u64>,
    pub inode_table: Vec<u64>,
}

impl GroupTables {
    /// Whether block `b` is one of group `g`'s own bitmaps or inode table blocks.
    pub(super) fn owns(&self, l: &Layout, g: u32, b: u64) -> bool {
        let g = g as usize;
        let it = self.inode_table[g];
        b == self.block_bitmap[g]
            || b == self.inode_bitmap[g]
            || (it..it + l.inode_table_blocks as u64).contains(&b)
    }
}

/// Places every group's tables, marking them in `bm`.
pub(super) fn place_group_tables(
    bm: &mut Blocks,
    l: &Layout,
    flex_bg: bool,
) -> Result<GroupTables> {
    let flex = if flex_bg { FLEX_GROUPS } else { 0 };
    let n = l.groups as usize;
    let mut t = GroupTables {
        block_bitmap: vec![0; n],
        inode_bitmap: vec![0; n],
        inode_table: vec![0; n],
    };
    let itb = l.inode_table_blocks as u64;
    let no_room = || Error::Invalid("filesystem too small for its metadata".into());
    for g in 0..l.groups {
        let gi = g as usize;
        let group_blk = l.group_first(g);
        let mut last_blk = l.group_last(g);
        let mut start_blk = group_blk;
        let mut table_offset = 0u64;
        let mut rem = 1;
        if flex > 0 {
            let last_grp = (g | (flex - 1)).min(l.groups - 1);
            rem = last_grp - g + 1;
            // As mke2fs: the last flex group keeps its tables contiguous, except when it
            // has a single group.
            table_offset = match last_grp % flex {
                r if g % flex == 0 && last_grp == l.groups - 1 && r != 0 => r as u64 + 1,
                _ => flex as u64,
            };
            let prev = if g % flex != 0 {
                t.block_bitmap[gi - 1] + 1
            } else {
                0
            };
            start_blk = flexbg_offset(bm, l, flex, g, prev, rem, 1);
            last_blk = l.group_last(last_grp);
        }
        let b = bm
            .get_free(start_blk, last_blk, 1)
            .or_else(|| bm.get_free(group_blk, last_blk, 1))
            .ok_or_else(no_room)?;
        bm.mark(b, 1, flex > 0);
        t.block_bitmap[gi] = b;

        if flex > 0 {
            let prev = if g % flex != 0 {
                t.inode_bitmap[gi - 1] + 1
            } else {
                t.block_bitmap[gi] + table_offset
            };
            start_blk = flexbg_offset(bm, l, flex, g, prev, rem, 1);
        }
        let b = bm
            .get_free(start_blk, last_blk, 1)
            .or_else(|| bm.get_free(group_blk, last_blk, 1))
            .ok_or_else(no_room)?;
        bm.mark(b, 1, flex > 0);
        t.inode_bitmap[gi] = b;

        let mut itable_start = group_blk;
        if flex > 0 {
            let prev = if g % flex != 0 {
                t.inode_table[gi - 1] + itb
            } else {
                t.inode_bitmap[gi] + table_offset
            };
            itable_start = flexbg_offset(bm, l, flex, g, prev, rem, itb);
        }
        let b = bm
            .get_free(itable_start, last_blk, itb)
            .ok_or_else(no_room)?;
        bm.mark(b, itb, flex > 0);
        t.inode_table[gi] = b;
    }
    Ok(t)
}

/// Where the next table of a flex group goes (libext2fs flexbg_offset): right after the
/// previous group's (`prev`) when there is room for the `rem` groups left, else the first
/// free run in the flex group.
fn flexbg_offset(
    bm: &Blocks,
    l: &Layout,
    flex: u32,
    group: u32,
    prev: u64,
    rem: u32,
    elem: u64,
) -> u64 {
    let size = (rem as u64 * elem).min(l.blocks_per_group as u64 / 4);
    if prev != 0 && prev < l.blocks {
        if let Some(b) = bm.get_free(prev, prev + size, elem) {
            return b;
        }
    }
    let first_g = group / flex * flex;
    let start = l.group_first(first_g);
    let last_grp = (group | (flex - 1)).min(l.groups - 1);
    let last_blk = l.group_last(last_grp);
    bm.get_free(start, last_blk, size)
        .or_else(|| bm.get_free(start, last_blk, elem))
        .or_else(|| bm.get_free(0, last_blk, elem))
        .unwrap_or(0)
}
