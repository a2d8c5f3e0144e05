//! Step 6 of mkfs: each group's block and inode bitmaps and its descriptor, with
//! BLOCK_UNINIT / INODE_UNINIT / ITABLE_ZEROED and bg_itable_unused, bitmap checksums (none for
//! uninitialised bitmaps, as mke2fs) and descriptor checksums (crc32c with metadata_csum, crc16
//! with uninit_bg).

use super::place::Placement;
use super::writer::Maker;
use crate::error::Result;
use crate::format::group_desc::{
    GdCsum, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED,
};

/// What the groups add up to, for the superblock.
pub(super) struct GroupTotals {
    pub free_blocks: u64,
    pub free_inodes: u64,
    /// The descriptor table as written after each superblock copy.
    pub table: Vec<u8>,
}

impl Maker<'_> {
    /// Writes every group's bitmaps and returns the descriptor table.
    pub(super) fn write_groups(&mut self, p: &Placement, gd_kind: GdCsum) -> Result<GroupTotals> {
        let mut t = GroupTotals {
            free_blocks: 0,
            free_inodes: 0,
            table: vec![0u8; self.l.desc_blocks as usize * self.block_size()],
        };
        let ds = self.l.desc_size as usize;
        for g in 0..self.l.groups {
            let in_use = if g == 0 { p.used_inodes } else { 0 };
            let (d, free) = self.write_group(g, in_use, gd_kind)?;
            // The superblock counts blocks, the descriptors clusters.
            t.free_blocks += free << self.l.cluster_bits;
            t.free_inodes += (self.l.inodes_per_group - in_use) as u64;
            let off = g as usize * ds;
            t.table[off..off + ds].copy_from_slice(d.as_bytes());
        }
        Ok(t)
    }

    /// Writes group `g`'s bitmaps (`in_use` inodes taken) and returns its descriptor and free
    /// blocks (clusters with bigalloc: the block bitmap has a bit per cluster).
    fn write_group(&mut self, g: u32, in_use: u32, gd_kind: GdCsum) -> Result<(GroupDesc, u64)> {
        let f = &self.opts.features;
        let gd_csum = f.gd_csum();
        let bs = self.block_size();
        let cb = self.l.cluster_bits;
        let (cpg, ipg) = (self.l.blocks_per_group >> cb, self.l.inodes_per_group);
        let first = self.l.group_first(g);
        let n = (self.l.group_last(g) - first + 1) >> cb;
        let mut bmp = vec![0u8; bs];
        let mut used_n = 0u64;
        // A group may stay BLOCK_UNINIT only if the kernel would rebuild its bitmap exactly:
        // its superblock copy, descriptors, reserved GDT and own tables.
        let mut plain = true;
        let sb_at = self.l.super_at(g);
        for i in 0..n {
            let c = first + (i << cb);
            if self.bm.test(c) {
                bmp[(i / 8) as usize] |= 1 << (i % 8);
                used_n += 1;
                let mine = |b: u64| {
                    (self.l.has_super(g) && b >= first && b < sb_at + self.l.super_blocks())
                        || self.tables.owns(&self.l, g, b)
                };
                if !(c..c + (1 << cb)).any(mine) {
                    plain = false;
                }
            }
        }
        if !plain {
            self.bm.touched[g as usize] = true;
        }
        for i in n as usize..bs * 8 {
            bmp[i / 8] |= 1 << (i % 8);
        }
        let block_uninit = gd_csum && !self.bm.touched[g as usize];
        let (bb, ib) = (
            self.tables.block_bitmap[g as usize],
            self.tables.inode_bitmap[g as usize],
        );
        self.w.put_block(bb, &bmp)?;

        let inode_uninit = gd_csum && in_use == 0;
        let mut ibmp = vec![0u8; bs];
        for i in (0..in_use as usize).chain(ipg as usize..bs * 8) {
            ibmp[i / 8] |= 1 << (i % 8);
        }
        self.w.put_block(ib, &ibmp)?;

        let mut d = GroupDesc::new(self.l.desc_size as usize);
        d.set_block_bitmap(bb);
        d.set_inode_bitmap(ib);
        d.set_inode_table(self.tables.inode_table[g as usize]);
        d.set_free_blocks_count(n - used_n);
        d.set_free_inodes_count((ipg - in_use) as u64);
        d.set_used_dirs_count(if g == 0 { 2 } else { 0 });
        if gd_csum {
            d.set_itable_unused((ipg - in_use) as u64);
            let mut flags = BG_INODE_ZEROED;
            if block_uninit {
                flags |= BG_BLOCK_UNINIT;
            }
            if inode_uninit {
                flags |= BG_INODE_UNINIT;
            }
            d.set_flags(flags);
        }
        if f.metadata_csum {
            if !block_uninit {
                d.set_block_bitmap_csum(self.csum_seed, &bmp[..cpg as usize / 8]);
            }
            if !inode_uninit {
                d.set_inode_bitmap_csum(self.csum_seed, &ibmp[..ipg as usize / 8]);
            }
        }
        d.set_csum(gd_kind, g);
        Ok((d, n - used_n))
    }
}
