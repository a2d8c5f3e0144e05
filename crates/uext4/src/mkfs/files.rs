//! Step 5 of mkfs: the first inodes and their contents: the reserved inodes, the root directory
//! (inode 2) and lost+found (inode 11), the resize inode (7: a double-indirect map whose
//! indirect blocks are the primary reserved GDT blocks, each listing its backups), the journal
//! (inode 8), the quota files (3, 4, 12) and the orphan file (inode 12).

use super::layout::backup_groups;
use super::place::{orphan_ino, Placement};
use super::superblock::journal_superblock;
use super::writer::Maker;
use crate::error::Result;
use crate::format::dir_entry::{put_dirent, set_rec_len, set_tail_csum, FT_DIR};
use crate::format::inode::*;
use crate::format::orphan_file;
use crate::format::put32;
use crate::format::superblock::Superblock;

impl Maker<'_> {
    /// Zeroes the inode tables (unless the device reads as zeros already).
    pub(super) fn zero_inode_tables(&mut self) -> Result<()> {
        if self.opts.assume_zeroed {
            return Ok(());
        }
        for &t in &self.tables.inode_table {
            self.w.zero(t, self.l.inode_table_blocks as u64)?;
        }
        Ok(())
    }

    /// The reserved inodes below the first ordinary one that no file of ours uses: empty, the
    /// bad blocks inode (1) with times, as ext2fs_update_bb_inode.
    pub(super) fn write_reserved_inodes(&mut self, p: &Placement) -> Result<()> {
        for ino in 1..GOOD_OLD_FIRST_INO {
            if ino == ROOT_INO
                || (ino == JOURNAL_INO && p.journal.blocks > 0)
                || (ino == RESIZE_INO && self.l.resize_inode)
            {
                continue;
            }
            let mut r = RawInode::new(self.opts.inode_size as usize);
            if ino == 1 {
                r.set_atime(self.now);
                r.set_mtime(self.now);
                r.set_ctime(self.now);
            }
            self.write_inode(ino, &mut r)?;
        }
        Ok(())
    }

    /// The root directory (".", "..", "lost+found") and lost+found (".", "..", then empty
    /// blocks), their inodes and blocks.
    pub(super) fn write_directories(&mut self, p: &Placement) -> Result<()> {
        let bs = self.block_size();
        let sectors = bs as u64 / 512;
        let mut root = self.new_inode(S_IFDIR | 0o755, 3);
        // With bigalloc i_blocks counts whole clusters.
        let ratio = self.l.cluster_ratio();
        let clusters = |blocks: u64| blocks.div_ceil(ratio) * ratio;
        root.set_uid(self.opts.root_owner.0);
        root.set_gid(self.opts.root_owner.1);
        self.map_blocks(ROOT_INO, &mut root, &[(p.root, 1)], None)?;
        root.set_size(bs as u64);
        root.set_blocks_512(clusters(1) * sectors);
        self.write_inode(ROOT_INO, &mut root)?;

        let lpf_ino = GOOD_OLD_FIRST_INO;
        let mut lpf = self.new_inode(S_IFDIR | 0o700, 2);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &b in &p.lost_found {
            match runs.last_mut() {
                Some((s, l)) if *s + *l == b => *l += 1,
                _ => runs.push((b, 1)),
            }
        }
        let extra = self.map_blocks(lpf_ino, &mut lpf, &runs, None)?;
        let n = p.lost_found.len() as u64;
        lpf.set_size(n * bs as u64);
        lpf.set_blocks_512((clusters(n) + extra * ratio) * sectors);
        self.write_inode(lpf_ino, &mut lpf)?;

        let space = bs
            - if self.opts.features.metadata_csum {
                12
            } else {
                0
            };
        let mut b = vec![0u8; bs];
        put_dirent(&mut b, 0, ROOT_INO, 12, b".", FT_DIR);
        put_dirent(&mut b, 12, ROOT_INO, 12, b"..", FT_DIR);
        put_dirent(&mut b, 24, lpf_ino, space - 24, b"lost+found", FT_DIR);
        self.put_dir_block(ROOT_INO, p.root, &mut b)?;
        for (i, &blk) in p.lost_found.iter().enumerate() {
            let mut b = vec![0u8; bs];
            if i == 0 {
                put_dirent(&mut b, 0, lpf_ino, 12, b".", FT_DIR);
                put_dirent(&mut b, 12, ROOT_INO, space - 12, b"..", FT_DIR);
            } else {
                set_rec_len(&mut b, 0, space);
            }
            self.put_dir_block(lpf_ino, blk, &mut b)?;
        }
        Ok(())
    }

    /// Writes a directory leaf block, with its checksum tail under metadata_csum.
    fn put_dir_block(&mut self, dir: u32, blk: u64, b: &mut [u8]) -> Result<()> {
        if let Some(seed) = self.inode_seed(dir) {
            set_tail_csum(b, seed);
        }
        self.w.put_block(blk, b)
    }

    /// The resize inode: i_block[13] (double indirect) -> the primary reserved GDT blocks ->
    /// their backups (ext2fs_create_resize_inode); the backups' reserved GDT blocks zeroed.
    pub(super) fn write_resize_inode(&mut self, p: &Placement) -> Result<()> {
        let Some(dind) = p.resize_dind else {
            return Ok(());
        };
        let bs = self.block_size();
        let apb = (bs / 4) as u64;
        let gdtb = self.l.desc_blocks as u64;
        let rsv = self.l.reserved_gdt_blocks as u64;
        let backups = backup_groups(self.l.groups, self.opts.features.sparse_super);
        let mut r = self.new_inode(S_IFREG | 0o600, 1);
        let mut dbuf = vec![0u8; bs];
        let mut nblocks = 1u64;
        // As ext2fs_create_resize_inode: the primary superblock's block, and each backup
        // that far into its group.
        let sb_blk = self.l.super_at(0);
        for k in 0..rsv {
            let grp_blk = sb_blk + 1 + gdtb + k;
            let slot = ((gdtb + k) % apb) as usize;
            put32(&mut dbuf, 4 * slot, grp_blk as u32);
            nblocks += 1;
            let mut ind = vec![0u8; bs];
            for (i, &g) in backups.iter().enumerate().take(apb as usize) {
                let copy = grp_blk + g as u64 * self.l.blocks_per_group as u64;
                put32(&mut ind, 4 * i, copy as u32);
                nblocks += 1;
            }
            self.w.put_block(grp_blk, &ind)?;
        }
        self.w.put_block(dind, &dbuf)?;
        put32(r.i_block_mut(), 4 * 13, dind as u32);
        r.set_size((apb * apb + apb + 12) * bs as u64);
        // Each block counts as a cluster with bigalloc (ext2fs_iblk_add_blocks).
        r.set_blocks_512(nblocks * self.l.cluster_ratio() * (bs as u64 / 512));
        self.write_inode(RESIZE_INO, &mut r)?;
        if !self.opts.assume_zeroed {
            for &g in &backups {
                self.w.zero(self.l.group_first(g) + 1 + gdtb, rsv)?;
            }
        }
        Ok(())
    }

    /// The journal inode, its zeroed blocks and its superblock; the superblock keeps a copy of
    /// its block map (s_jnl_blocks).
    pub(super) fn write_journal(
        &mut self,
        p: &Placement,
        uuid: [u8; 16],
        sb: &mut Superblock,
    ) -> Result<()> {
        let j = &p.journal;
        if j.blocks == 0 {
            return Ok(());
        }
        let bs = self.block_size();
        let mut r = self.new_inode(S_IFREG | 0o600, 1);
        let extra = self.map_blocks(JOURNAL_INO, &mut r, &j.runs, j.map.as_ref())?;
        r.set_size(j.blocks * bs as u64);
        let ratio = self.l.cluster_ratio();
        r.set_blocks_512((j.blocks.div_ceil(ratio) + extra) * ratio * (bs as u64 / 512));
        let mut ib60 = [0u8; I_BLOCK_SIZE];
        ib60.copy_from_slice(r.i_block());
        sb.set_jnl_blocks(&ib60, r.size_high(), r.size_lo());
        self.write_inode(JOURNAL_INO, &mut r)?;
        if !self.opts.assume_zeroed {
            for &(s, l) in &j.runs {
                self.w.zero(s, l)?;
            }
        }
        let f = &self.opts.features;
        let mut blk0 = vec![0u8; bs];
        blk0[..1024].copy_from_slice(&journal_superblock(
            bs as u32,
            j.blocks as u32,
            uuid,
            f.metadata_csum,
            f.has_64bit,
            if f.fast_commit {
                super::options::fast_commit_blocks(self.l.blocks)
            } else {
                0
            },
        ));
        self.w.put_block(j.runs[0].0, &blk0)
    }

    /// The orphan file inode and its blocks, empty with their tails.
    pub(super) fn write_orphan_file(&mut self, p: &Placement) -> Result<()> {
        let o = &p.orphan;
        if o.blocks == 0 {
            return Ok(());
        }
        let bs = self.block_size();
        let ino = orphan_ino(&self.opts.features);
        let mut r = self.new_inode(S_IFREG | 0o600, 1);
        let extra = self.map_blocks(ino, &mut r, &o.runs, o.map.as_ref())?;
        r.set_size(o.blocks * bs as u64);
        r.set_blocks_512((o.blocks + extra) * (bs as u64 / 512));
        self.write_inode(ino, &mut r)?;
        let seed = self.inode_seed(ino);
        for &(s, l) in &o.runs {
            for blk in s..s + l {
                let mut b = vec![0u8; bs];
                orphan_file::put_tail(&mut b, seed, blk);
                self.w.put_block(blk, &b)?;
            }
        }
        Ok(())
    }

    /// The quota files' inodes (regular, 0600, immutable, as e2fsprogs makes them) and
    /// blocks.
    pub(super) fn write_quota_files(&mut self, p: &Placement) -> Result<()> {
        let bs = self.block_size();
        for q in &p.quotas {
            let mut r = self.new_inode(S_IFREG | 0o600, 1);
            r.set_flags(r.flags() | FL_IMMUTABLE);
            let extra = self.map_blocks(q.ino, &mut r, &q.runs, None)?;
            // Whole clusters with bigalloc (the blocks of one share it).
            let ratio = self.l.cluster_ratio();
            let clusters: std::collections::BTreeSet<u64> = q
                .runs
                .iter()
                .flat_map(|&(s, l)| s..s + l)
                .map(|b| b / ratio)
                .collect();
            let n = clusters.len() as u64 * ratio;
            r.set_size(q.bytes.len() as u64);
            r.set_blocks_512((n + extra) * (bs as u64 / 512));
            self.write_inode(q.ino, &mut r)?;
            let mut chunks = q.bytes.chunks(bs);
            for &(s, l) in &q.runs {
                for blk in s..s + l {
                    let mut b = vec![0u8; bs];
                    if let Some(c) = chunks.next() {
                        b[..c.len()].copy_from_slice(c);
                    }
                    self.w.put_block(blk, &b)?;
                }
            }
        }
        Ok(())
    }
}
