//! What the writing steps of mkfs share: the device with a count of the bytes written (for
//! s_kbytes_written), the inode tables, and the block maps of new files (an extent tree, or
//! indirect blocks without the extent feature).

use super::alloc::{BlockMap, Blocks};
use super::layout::Layout;
use super::place::too_small;
use super::tables::GroupTables;
use super::MkfsOptions;
use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::extent::{
    node_capacity, set_node_csum, Extent, ExtentHeader, ExtentIdx, ENTRY_SIZE, EXTENT_MAGIC,
    HEADER_SIZE,
};
use crate::format::inode::{RawInode, Timestamp, FL_EXTENTS, I_BLOCK_SIZE};
use crate::format::put32;

/// The device, counting what is written through `put`.
pub(super) struct Writer<'a> {
    dev: &'a dyn BlockDevice,
    block_size: u64,
    pub written: u64,
}

impl<'a> Writer<'a> {
    pub(super) fn new(dev: &'a dyn BlockDevice, block_size: u32) -> Self {
        Writer {
            dev,
            block_size: block_size as u64,
            written: 0,
        }
    }

    pub(super) fn put(&mut self, off: u64, data: &[u8]) -> Result<()> {
        self.dev.write_at(off, data)?;
        self.written += data.len() as u64;
        Ok(())
    }

    pub(super) fn put_block(&mut self, blk: u64, data: &[u8]) -> Result<()> {
        self.put(blk * self.block_size, data)
    }

    /// Zeroes `n` blocks from `start` (not counted: mke2fs counts it neither).
    pub(super) fn zero(&self, start: u64, n: u64) -> Result<()> {
        let total = n * self.block_size;
        let zero = vec![0u8; total.min(1 << 20) as usize];
        let mut off = 0u64;
        while off < total {
            let len = (total - off).min(zero.len() as u64) as usize;
            self.dev
                .write_at(start * self.block_size + off, &zero[..len])?;
            off += len as u64;
        }
        Ok(())
    }

    pub(super) fn flush(&self) -> Result<()> {
        Ok(self.dev.flush()?)
    }
}

/// The state the writing steps share.
pub(super) struct Maker<'a> {
    pub l: Layout,
    pub opts: &'a MkfsOptions,
    pub bm: Blocks,
    pub tables: GroupTables,
    pub w: Writer<'a>,
    /// The filesystem's checksum seed (used with metadata_csum).
    pub csum_seed: u32,
    pub now: Timestamp,
}

impl Maker<'_> {
    pub(super) fn block_size(&self) -> usize {
        self.l.block_size as usize
    }

    /// A new inode with its mode, link count and times.
    pub(super) fn new_inode(&self, mode: u16, links: u16) -> RawInode {
        let mut r = RawInode::new(self.opts.inode_size as usize);
        r.set_mode(mode);
        r.set_links_count(links);
        r.set_atime(self.now);
        r.set_mtime(self.now);
        r.set_ctime(self.now);
        r.set_crtime(self.now);
        r
    }

    /// The checksum seed of inode `ino` (generation 0), for the blocks it owns; None without
    /// metadata_csum.
    pub(super) fn inode_seed(&self, ino: u32) -> Option<u32> {
        self.opts
            .features
            .metadata_csum
            .then(|| RawInode::csum_seed(self.csum_seed, ino, 0))
    }

    /// Writes inode `ino` into its group's inode table (checksummed with metadata_csum).
    pub(super) fn write_inode(&mut self, ino: u32, raw: &mut RawInode) -> Result<()> {
        if self.opts.features.metadata_csum {
            raw.set_csum(self.csum_seed, ino);
        }
        let ipg = self.l.inodes_per_group;
        let g = ((ino - 1) / ipg) as usize;
        let idx = ((ino - 1) % ipg) as u64;
        let at = self.tables.inode_table[g] * self.l.block_size as u64
            + idx * self.opts.inode_size as u64;
        self.w.put(at, raw.bytes())
    }

    /// Maps `runs` in the inode: an extent tree with the extent feature, else the block map
    /// allocated with the data (`map`) or direct pointers alone. Returns the blocks of the map
    /// itself (leaf or indirect blocks).
    pub(super) fn map_blocks(
        &mut self,
        ino: u32,
        raw: &mut RawInode,
        runs: &[(u64, u64)],
        map: Option<&BlockMap>,
    ) -> Result<u64> {
        if self.opts.features.extents {
            self.extent_tree(ino, raw, runs)
        } else {
            self.block_map(raw, runs, map)
        }
    }

    /// An extent tree over `runs`: in i_block if it fits, else one leaf block below it.
    fn extent_tree(&mut self, ino: u32, raw: &mut RawInode, runs: &[(u64, u64)]) -> Result<u64> {
        raw.set_flags(raw.flags() | FL_EXTENTS);
        let mut exts = Vec::new();
        let mut lblk = 0u64;
        for &(s, l) in runs {
            exts.push(Extent {
                lblk: lblk as u32,
                len: l as u32,
                pblk: s,
                unwritten: false,
            });
            lblk += l;
        }
        let root_max = node_capacity(I_BLOCK_SIZE, true);
        if exts.len() <= root_max as usize {
            write_node(raw.i_block_mut(), root_max, 0, &exts);
            return Ok(0);
        }
        let max = node_capacity(self.block_size(), false);
        if exts.len() > max as usize {
            return Err(Error::Invalid(
                "free space too fragmented for the journal".into(),
            ));
        }
        // As libext2fs: the leaf goes after the data it maps.
        let (ls, ll) = runs[runs.len() - 1];
        let leaf = self.bm.new_block(ls + ll).ok_or_else(too_small)?;
        self.bm.mark(leaf, 1, true);
        let mut b = vec![0u8; self.block_size()];
        write_node(&mut b, max, 0, &exts);
        if let Some(seed) = self.inode_seed(ino) {
            set_node_csum(&mut b, seed);
        }
        self.w.put_block(leaf, &b)?;
        let root = raw.i_block_mut();
        root.fill(0);
        ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: 1,
            max: root_max,
            depth: 1,
            generation: 0,
        }
        .write(root);
        ExtentIdx { lblk: 0, leaf }.write(&mut root[HEADER_SIZE..HEADER_SIZE + ENTRY_SIZE]);
        Ok(1)
    }

    /// Without the extent feature: the block map allocated with the data (journal, orphan
    /// file), or direct pointers alone (the directories' twelve blocks at most).
    fn block_map(
        &mut self,
        raw: &mut RawInode,
        runs: &[(u64, u64)],
        map: Option<&BlockMap>,
    ) -> Result<u64> {
        let root = raw.i_block_mut();
        root.fill(0);
        if let Some(m) = map {
            for (i, &p) in m.i_block.iter().enumerate() {
                put32(root, 4 * i, p);
            }
            for (blk, data) in &m.nodes {
                self.w.put_block(*blk, data)?;
            }
            return Ok(m.nodes.len() as u64);
        }
        let blocks = runs.iter().flat_map(|&(s, l)| s..s + l);
        for (i, b) in blocks.enumerate() {
            if i >= 12 {
                return Err(Error::Invalid("directory of more than 12 blocks".into()));
            }
            put32(root, 4 * i, b as u32);
        }
        Ok(0)
    }
}

/// Writes an extent tree leaf node (`max` entries of room) holding `exts`; the rest of `b`
/// is zeroed.
fn write_node(b: &mut [u8], max: u16, depth: u16, exts: &[Extent]) {
    b.fill(0);
    ExtentHeader {
        magic: EXTENT_MAGIC,
        entries: exts.len() as u16,
        max,
        depth,
        generation: 0,
    }
    .write(b);
    for (i, e) in exts.iter().enumerate() {
        let o = HEADER_SIZE + ENTRY_SIZE * i;
        e.write(&mut b[o..o + ENTRY_SIZE]);
    }
}
