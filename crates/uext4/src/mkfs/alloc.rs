//! The block bitmap of the filesystem being made, with the allocation searches of libext2fs
//! (ext2fs_get_free_blocks2, ext2fs_new_block2), and block maps for files without extents.

use super::layout::Layout;
use crate::format::extent::MAX_INIT_LEN;
use crate::format::put32;

/// The in-memory block bitmap of the whole filesystem while it is laid out, with the
/// allocation searches of libext2fs.
pub(super) struct Blocks {
    bits: Vec<u64>,
    total: u64,
    fdb: u64,
    bpg: u64,
    /// Groups whose blocks were allocated into (their BLOCK_UNINIT flag goes).
    pub(super) touched: Vec<bool>,
    /// log2 of blocks per cluster once the bitmap counts clusters (`count_clusters`): a block
    /// marked then marks its whole cluster. 0 while the tables are placed block by block.
    cluster_bits: u32,
}

impl Blocks {
    /// The bitmap of a new filesystem with its fixed structures marked: block 0 before a
    /// 1 KiB-block filesystem, and each superblock copy with its descriptor table and reserved
    /// GDT blocks. The last group counts as allocated into: it is never left BLOCK_UNINIT (its
    /// bitmap needs padding).
    pub(super) fn new(l: &Layout) -> Blocks {
        let mut bm = Blocks {
            bits: vec![0u64; l.blocks.div_ceil(64) as usize],
            total: l.blocks,
            fdb: l.first_data_block,
            bpg: l.blocks_per_group as u64,
            touched: vec![false; l.groups as usize],
            cluster_bits: 0,
        };
        if l.block_size == 1024 {
            bm.set(0);
        }
        for g in 0..l.groups {
            if l.has_super(g) {
                bm.mark(l.super_at(g), l.super_blocks(), false);
            }
        }
        bm.touched[l.groups as usize - 1] = true;
        bm
    }

    /// Blocks in use.
    pub(super) fn used(&self) -> u64 {
        (0..self.total).filter(|&b| self.test(b)).count() as u64
    }

    /// Free blocks in group `g`.
    pub(super) fn free_in(&self, l: &Layout, g: u32) -> u64 {
        (l.group_first(g)..=l.group_last(g))
            .filter(|&b| !self.test(b))
            .count() as u64
    }

    pub(super) fn test(&self, b: u64) -> bool {
        self.bits[(b / 64) as usize] & (1 << (b % 64)) != 0
    }
    pub(super) fn set(&mut self, b: u64) {
        let mask = (1u64 << self.cluster_bits) - 1;
        for x in b & !mask..((b | mask) + 1).min(self.total) {
            self.bits[(x / 64) as usize] |= 1 << (x % 64);
        }
    }

    /// From here on the bitmap counts clusters, as mke2fs converts its block-grained bitmap
    /// once the group tables are placed (ext2fs_convert_subcluster_bitmap): a cluster holding
    /// any used block is used whole, and the searches give cluster-aligned blocks.
    pub(super) fn count_clusters(&mut self, cluster_bits: u32) {
        self.cluster_bits = cluster_bits;
        let ratio = 1u64 << cluster_bits;
        for c in (0..self.total).step_by(ratio as usize) {
            if (c..(c + ratio).min(self.total)).any(|b| self.test(b)) {
                self.set(c);
            }
        }
    }
    pub(super) fn group_of(&self, b: u64) -> u32 {
        ((b.max(self.fdb) - self.fdb) / self.bpg) as u32
    }
    pub(super) fn range_free(&self, start: u64, n: u64) -> bool {
        (start..start + n).all(|b| !self.test(b))
    }
    /// Marks a range used; `touch`: it counts as an allocation in its groups.
    pub(super) fn mark(&mut self, start: u64, n: u64, touch: bool) {
        for b in start..start + n {
            self.set(b);
        }
        if touch && n > 0 {
            for g in self.group_of(start)..=self.group_of(start + n - 1) {
                self.touched[g as usize] = true;
            }
        }
    }
    /// ext2fs_get_free_blocks2: the first `num` free blocks starting in [start, finish).
    pub(super) fn get_free(&self, start: u64, finish: u64, num: u64) -> Option<u64> {
        let mut b = if start == 0 { self.fdb } else { start };
        let finish = if finish == 0 { b } else { finish };
        let num = num.max(1);
        let mut steps = 0u64;
        loop {
            if b + num > self.total {
                if finish > start {
                    return None;
                }
                b = self.fdb;
            }
            if self.range_free(b, num) {
                return Some(b);
            }
            b += 1;
            steps += 1;
            if b == finish || steps > self.total {
                return None;
            }
        }
    }
    /// The first free block at or after `goal`, wrapping around (ext2fs_new_block2).
    pub(super) fn new_block(&self, goal: u64) -> Option<u64> {
        let goal = if goal < self.fdb || goal >= self.total {
            self.fdb
        } else {
            goal
        } >> self.cluster_bits
            << self.cluster_bits;
        (goal..self.total)
            .chain(self.fdb..goal)
            .find(|&b| !self.test(b))
    }
    /// Allocates `n` blocks from `goal` on, in as few runs as the free space allows; returns
    /// the runs (each at most MAX_INIT_LEN long).
    pub(super) fn alloc_runs(&mut self, goal: u64, n: u64) -> Option<Vec<(u64, u64)>> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut got = 0u64;
        let mut at = goal;
        while got < n {
            let start = self.new_block(at)?;
            let mut len = 0u64;
            while got + len < n
                && start + len < self.total
                && !self.test(start + len)
                && len < MAX_INIT_LEN as u64
            {
                len += 1;
            }
            self.mark(start, len, true);
            runs.push((start, len));
            got += len;
            at = start + len;
        }
        Some(runs)
    }
}

/// A file's block map (no extent feature) as mke2fs lays one out: data and indirect blocks
/// allocated in one pass from a goal, each indirect block just before the first data block
/// it maps (the order ext2fs_bmap allocates them in).
pub(super) struct BlockMap {
    pub(super) i_block: [u32; 15],
    /// The indirect blocks and their contents.
    pub(super) nodes: Vec<(u64, Vec<u8>)>,
    /// The data blocks, as runs.
    pub(super) runs: Vec<(u64, u64)>,
}

impl Blocks {
    /// The next free block after `cur`, taken; `cur` moves to it.
    pub(super) fn take_next(&mut self, cur: &mut u64) -> Option<u64> {
        let b = self.new_block(*cur)?;
        self.mark(b, 1, true);
        *cur = b;
        Some(b)
    }

    /// Allocates `n` data blocks from `goal` on with the indirect blocks that map them (twelve
    /// direct pointers, then single, double and triple indirect blocks of `bs / 4` pointers).
    /// None when the space (or the triple indirect block's reach) runs out.
    pub(super) fn alloc_block_mapped(&mut self, goal: u64, n: u64, bs: u32) -> Option<BlockMap> {
        let apb = bs as u64 / 4;
        let mut m = BlockMap {
            i_block: [0; 15],
            nodes: Vec::new(),
            runs: Vec::new(),
        };
        let mut cur = goal;
        // The indirect blocks being filled, top first (indices into `m.nodes`).
        let mut path: Vec<usize> = Vec::new();
        for l in 0..n {
            // Where block l's pointer goes: an i_block slot, then an index at each level.
            let (slot, idx): (usize, Vec<u64>) = match l.checked_sub(12) {
                None => (l as usize, vec![]),
                Some(r) if r < apb => (12, vec![r]),
                Some(r) if r - apb < apb * apb => {
                    let r = r - apb;
                    (13, vec![r / apb, r % apb])
                }
                Some(r) => {
                    let r = r - apb - apb * apb;
                    if r >= apb * apb * apb {
                        return None;
                    }
                    (14, vec![r / (apb * apb), r / apb % apb, r % apb])
                }
            };
            // An indirect block starts where every index from its level down is zero.
            for k in 0..idx.len() {
                if idx[k..].iter().all(|&i| i == 0) {
                    let b = self.take_next(&mut cur)?;
                    m.nodes.push((b, vec![0u8; bs as usize]));
                    match k.checked_sub(1) {
                        None => m.i_block[slot] = b as u32,
                        Some(up) => put32(&mut m.nodes[path[up]].1, 4 * idx[up] as usize, b as u32),
                    }
                    path.truncate(k);
                    path.push(m.nodes.len() - 1);
                }
            }
            let d = self.take_next(&mut cur)?;
            match idx.last() {
                None => m.i_block[slot] = d as u32,
                Some(&i) => put32(
                    &mut m.nodes[path[idx.len() - 1]].1,
                    4 * i as usize,
                    d as u32,
                ),
            }
            match m.runs.last_mut() {
                Some((s, len)) if *s + *len == d => *len += 1,
                _ => m.runs.push((d, 1)),
            }
        }
        Some(m)
    }
}
