//! Disk quotas: usage and limits per user, group and project, kept in the quota inodes in
//! the vfsv1 tree format (format/quota.rs), as the kernel's dquot code (fs/quota/dquot.c,
//! quota_tree.c) keeps them for ext4 with the `quota` feature.
//!
//! Usage follows the inodes themselves. What an inode counts for (its [`Charge`]: its three
//! ids and i_blocks in bytes, or nothing while it has no links) is read from the bytes
//! `write_inode` replaces and from the bytes it writes; the difference goes into the quota
//! files in the same handle, so every transaction that changes an inode's blocks, owner,
//! group, project or links carries the matching usage, and a crash replays both or neither.
//! The rule is e2fsck's (lib/support/mkquota.c, quota_compute_usage): inodes with links, the
//! root and those from s_first_ino on, not the quota inodes nor xattr-value inodes.
//!
//! The quota file's blocks are edited through the buffer cache and journaled as metadata,
//! as the kernel's ext4_quota_write does. Its inode's `state` mutex is held while one of its
//! files is read or edited: that mutex serialises the tree's changes, and it is taken after
//! the state of the inode whose charge changes (never the reverse: a quota inode carries no
//! charge of its own).

use crate::bcache::Buffer;
use crate::error::{Corruption, Error, Result};
use crate::format::inode::{RawInode, FL_EA_INODE, GOOD_OLD_INODE_SIZE, ROOT_INO};
use crate::format::quota::{
    entry_offset, header_ok, set_tree_ref, tree_index, tree_ref, DataHeader, Dquot, QuotaInfo,
    QuotaType, ENTRIES_PER_BLOCK, ENTRY_SIZE, QT_BLKSIZE, QT_TREEDEPTH, QT_TREEOFF,
};
use crate::fs::Fs;
use crate::icache::{Inode, InodeState};
use crate::transaction::Handle;
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;

thread_local! {
    /// Whether limits hold for this thread's current request: the kernel asks whether
    /// `current` has CAP_SYS_RESOURCE (ignore_hardlimit); here the entry points that take a
    /// caller's [`Cred`] say so for their call ([`limits_for`]). The calls without one are the
    /// image tools' and the library's, made with root's authority: no limit holds for them.
    static LIMITED: Cell<bool> = const { Cell::new(false) };
}

/// Limits hold for this thread while the guard lives, unless `cred` is privileged.
pub(crate) struct LimitsFor(bool);

/// Makes the limits hold for `cred` (unprivileged) until the guard is dropped.
pub(crate) fn limits_for(cred: &crate::cred::Cred) -> LimitsFor {
    LimitsFor(LIMITED.replace(!cred.privileged))
}

impl Drop for LimitsFor {
    fn drop(&mut self) {
        LIMITED.set(self.0);
    }
}

/// What one inode counts for in the quotas: its user, group and project ids, and its space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charge {
    ids: [u32; 3],
    bytes: u64,
}

/// One quota type's file as `uext4 quota` reports it: the info and every entry, by id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaReport {
    /// Which quotas.
    pub qtype: QuotaType,
    /// The quota inode.
    pub ino: u32,
    /// The file's info (grace periods, tree size).
    pub info: QuotaInfo,
    /// The entries, in id order.
    pub entries: Vec<Dquot>,
}

/// A change to one id's usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Delta {
    space: i64,
    inodes: i64,
}

/// An open quota file: its inode with the state mutex held (see the module comment).
struct QuotaFile<'a> {
    fs: &'a Fs,
    qtype: QuotaType,
    inode: &'a Inode,
    st: &'a mut InodeState,
}

impl Fs {
    /// Whether any quota type is kept (the `quota` feature with a quota inode).
    pub(crate) fn quota_kept(&self) -> bool {
        self.geo.quota_inums != [0; 3]
    }

    /// The quota types whose limits hold (`MountOptions::quota_limits`).
    fn quota_limited(&self) -> impl Iterator<Item = QuotaType> + '_ {
        QuotaType::ALL
            .into_iter()
            .filter(|t| self.opts.quota_limits[t.index()])
    }

    /// The quota inode of type `t`, if that type is kept.
    pub fn quota_inum(&self, t: QuotaType) -> Option<u32> {
        Some(self.geo.quota_inums[t.index()]).filter(|&i| i != 0)
    }

    /// What inode `ino` with fields `raw` counts for (module comment), None for nothing.
    pub(crate) fn charge_of(&self, ino: u32, raw: &RawInode) -> Option<Charge> {
        if raw.links_count() == 0
            || (ino != ROOT_INO && ino < self.geo.first_ino)
            || self.geo.quota_inums.contains(&ino)
            || raw.flags() & FL_EA_INODE != 0
        {
            return None;
        }
        Some(Charge {
            ids: ids_of(raw),
            bytes: raw.blocks_512(self.geo.block_size) * 512,
        })
    }

    /// How many of `want` new blocks inode `ino` (fields `raw`, with `pending` bytes already
    /// promised to it and not yet counted) may take, as the kernel's ext4_mb_new_blocks asks
    /// dquot_alloc_block for less and less: [`Error::QuotaExceeded`] when not one.
    pub(crate) fn quota_allow_blocks(
        &self,
        ino: u32,
        raw: &RawInode,
        want: u32,
        pending: u64,
    ) -> Result<u32> {
        if !self.quota_kept() || !LIMITED.get() {
            return Ok(want);
        }
        let Some(c) = self.charge_of(ino, raw) else {
            return Ok(want);
        };
        let bs = self.geo.block_size as u64;
        let now = self.now().sec.max(0) as u64;
        let mut n = want as u64;
        for t in self.quota_limited() {
            let Some(q) = self.dquot(t, c.ids[t.index()])? else {
                continue;
            };
            let used = q.curspace + pending;
            // check_bdq: the hard limit, and the soft limit once its grace period is over.
            let mut cap = |limit: u64| n = n.min(limit.saturating_sub(used) / bs);
            if q.bhardlimit != 0 {
                cap(q.bhardlimit);
            }
            if q.bsoftlimit != 0 && q.btime != 0 && now >= q.btime {
                cap(q.bsoftlimit);
            }
            if n == 0 {
                return Err(Error::QuotaExceeded(format!(
                    "{} {}: space",
                    t.name(),
                    q.id
                )));
            }
        }
        Ok(n as u32)
    }

    /// Refuses a new inode with fields `raw` past an inode limit (the kernel's check_idq).
    pub(crate) fn quota_allow_inode(&self, raw: &RawInode) -> Result<()> {
        if !self.quota_kept() || !LIMITED.get() {
            return Ok(());
        }
        let now = self.now().sec.max(0) as u64;
        let ids = ids_of(raw);
        for t in self.quota_limited() {
            let Some(q) = self.dquot(t, ids[t.index()])? else {
                continue;
            };
            let after = q.curinodes + 1;
            let over_soft =
                q.isoftlimit != 0 && after > q.isoftlimit && q.itime != 0 && now >= q.itime;
            if (q.ihardlimit != 0 && after > q.ihardlimit) || over_soft {
                return Err(Error::QuotaExceeded(format!(
                    "{} {}: inodes",
                    t.name(),
                    q.id
                )));
            }
        }
        Ok(())
    }

    /// Moves inode `ino`'s usage from what `old` counted for to what `new` counts for, in
    /// handle `h` (write_inode calls it with the bytes it replaced and wrote).
    pub(crate) fn quota_recharge(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        old: &RawInode,
        new: &RawInode,
    ) -> Result<()> {
        let (was, now) = (self.charge_of(ino, old), self.charge_of(ino, new));
        if was == now {
            return Ok(());
        }
        for t in QuotaType::ALL {
            let Some(qino) = self.quota_inum(t) else {
                continue;
            };
            let i = t.index();
            let mut deltas: Vec<(u32, Delta)> = Vec::with_capacity(2);
            let mut add = |id: u32, space: i64, inodes: i64| match deltas
                .iter_mut()
                .find(|(x, _)| *x == id)
            {
                Some((_, d)) => {
                    d.space += space;
                    d.inodes += inodes;
                }
                None => deltas.push((id, Delta { space, inodes })),
            };
            if let Some(c) = was {
                add(c.ids[i], -(c.bytes as i64), -1);
            }
            if let Some(c) = now {
                add(c.ids[i], c.bytes as i64, 1);
            }
            for (id, d) in deltas {
                if d != Delta::default() {
                    self.dquot_change(h, t, qino, id, d)?;
                }
            }
        }
        Ok(())
    }

    /// Adds `d` to id `id`'s usage in quota file `qino`, making its entry if it has none,
    /// and starts or stops the grace periods as the usage crosses the soft limits.
    fn dquot_change(
        &self,
        h: &mut Handle<'_>,
        t: QuotaType,
        qino: u32,
        id: u32,
        d: Delta,
    ) -> Result<()> {
        let qi = self.iget(qino)?;
        let mut st = qi.state.lock();
        let mut f = QuotaFile {
            fs: self,
            qtype: t,
            inode: &qi,
            st: &mut st,
        };
        let info = f.info()?;
        let off = match f.find(&info, id)? {
            Some(o) => o,
            None => f.insert(h, id)?,
        };
        let mut q = f.entry(off)?;
        q.curspace = (q.curspace as i128 + d.space as i128).max(0) as u64;
        q.curinodes = (q.curinodes as i128 + d.inodes as i128).max(0) as u64;
        let now = self.now().sec.max(0) as u64;
        update_grace(&mut q, &info, now);
        f.put_entry(h, off, &q)
    }

    /// The entries of quota type `t`, or None when that type is not kept.
    ///
    /// # Errors
    /// Corruption of the quota file (a bad header, a reference past its end, a missing
    /// entry) and I/O errors.
    pub fn quota_report(&self, t: QuotaType) -> Result<Option<QuotaReport>> {
        let Some(qino) = self.quota_inum(t) else {
            return Ok(None);
        };
        let qi = self.iget(qino)?;
        let mut st = qi.state.lock();
        let mut f = QuotaFile {
            fs: self,
            qtype: t,
            inode: &qi,
            st: &mut st,
        };
        let info = f.info()?;
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        f.walk(&info, QT_TREEOFF, 0, &mut seen, &mut entries)?;
        entries.sort_by_key(|q| q.id);
        Ok(Some(QuotaReport {
            qtype: t,
            ino: qino,
            info,
            entries,
        }))
    }

    /// Id `id`'s entry in quota type `t` (None: no entry, or the type is not kept).
    ///
    /// # Errors
    /// As [`Fs::quota_report`].
    pub fn dquot(&self, t: QuotaType, id: u32) -> Result<Option<Dquot>> {
        let Some(qino) = self.quota_inum(t) else {
            return Ok(None);
        };
        let qi = self.iget(qino)?;
        let mut st = qi.state.lock();
        let mut f = QuotaFile {
            fs: self,
            qtype: t,
            inode: &qi,
            st: &mut st,
        };
        let info = f.info()?;
        match f.find(&info, id)? {
            Some(off) => f.entry(off).map(Some),
            None => Ok(None),
        }
    }

    /// Sets id `id`'s limits in quota type `t` (`setquota`): `limits` gives the four limits
    /// (space in bytes); usage is kept. The grace periods start or stop as usage now stands.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the type is not kept; corruption and I/O errors.
    pub fn set_dquot_limits(&self, t: QuotaType, id: u32, limits: &Dquot) -> Result<Dquot> {
        self.edit_quota_file(t, 24, |f, h| {
            let info = f.info()?;
            let off = match f.find(&info, id)? {
                Some(o) => o,
                None => f.insert(h, id)?,
            };
            let mut q = f.entry(off)?;
            q.bhardlimit = limits.bhardlimit;
            q.bsoftlimit = limits.bsoftlimit;
            q.ihardlimit = limits.ihardlimit;
            q.isoftlimit = limits.isoftlimit;
            let now = self.now().sec.max(0) as u64;
            update_grace(&mut q, &info, now);
            f.put_entry(h, off, &q)?;
            Ok(q)
        })
    }
}

impl Fs {
    /// Sets the grace periods of quota type `t` (`setquota -t`), in seconds: how long usage
    /// may stay over a soft limit. Grace periods already running keep their end.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the type is not kept; corruption and I/O errors.
    pub fn set_quota_grace(&self, t: QuotaType, bgrace: u32, igrace: u32) -> Result<()> {
        self.edit_quota_file(t, 4, |f, h| {
            let mut info = f.info()?;
            info.bgrace = bgrace;
            info.igrace = igrace;
            f.put_info(h, &info)
        })
    }
}

impl Fs {
    /// [`Fs::statfs`] as seen from inode `ino` (`df DIR`): in a directory that passes on its
    /// project id (PROJINHERIT), the project's limits stand in for the filesystem's size and
    /// its usage for what is taken, as the kernel's ext4_statfs_project does, so that `df`
    /// on a project directory shows its quota.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an inode not in use; corruption and I/O errors of the quota
    /// file.
    pub fn statfs_of(&self, ino: u32) -> Result<crate::StatFs> {
        let mut s = self.statfs();
        if self.quota_inum(QuotaType::Project).is_none()
            || !self.opts.quota_limits[QuotaType::Project.index()]
        {
            return Ok(s);
        }
        let raw = self.iget(ino)?.state.lock().raw.clone();
        if raw.flags() & crate::flags::FL_PROJINHERIT == 0 {
            return Ok(s);
        }
        let Some(q) = self.dquot(QuotaType::Project, ids_of(&raw)[2])? else {
            return Ok(s);
        };
        let min_not_zero = |a: u64, b: u64| if a == 0 || (b != 0 && b < a) { b } else { a };
        let bs = self.geo.block_size as u64;
        let limit = min_not_zero(q.bsoftlimit, q.bhardlimit) / bs;
        if limit != 0 && s.blocks > limit {
            s.blocks = limit;
            s.blocks_free = limit.saturating_sub(q.curspace / bs);
            s.blocks_avail = s.blocks_free;
        }
        let limit = min_not_zero(q.isoftlimit, q.ihardlimit);
        if limit != 0 && s.files > limit {
            s.files = limit;
            s.files_free = limit.saturating_sub(q.curinodes);
        }
        Ok(s)
    }
}

/// The user, group and project ids an inode counts for. e2fsck reads i_projid wherever
/// i_extra_isize reaches it, feature or not.
fn ids_of(raw: &RawInode) -> [u32; 3] {
    let projid = if raw.0.len() > GOOD_OLD_INODE_SIZE
        && GOOD_OLD_INODE_SIZE + raw.extra_isize() as usize >= 0x9C + 4
    {
        raw.projid()
    } else {
        0
    };
    [raw.uid(), raw.gid(), projid]
}

/// Starts a grace period when usage is over a soft limit and none runs, and ends it when
/// usage is back under (the kernel's check_bdq/check_idq and dquot_decr_space/inodes).
fn update_grace(q: &mut Dquot, info: &QuotaInfo, now: u64) {
    if q.bsoftlimit != 0 && q.curspace > q.bsoftlimit {
        if q.btime == 0 {
            q.btime = now + info.bgrace as u64;
        }
    } else {
        q.btime = 0;
    }
    if q.isoftlimit != 0 && q.curinodes > q.isoftlimit {
        if q.itime == 0 {
            q.itime = now + info.igrace as u64;
        }
    } else {
        q.itime = 0;
    }
}

impl QuotaFile<'_> {
    fn bad(&self, what: String) -> Error {
        Error::corrupt(
            Corruption::Quota,
            format!(
                "{} quota file (inode {}): {what}; run e2fsck -f",
                self.qtype.name(),
                self.inode.ino
            ),
        )
    }

    /// Where quota block `n` lies: its buffer and the byte offset in it.
    fn block(&mut self, n: u32) -> Result<(Arc<Buffer>, usize)> {
        let bs = self.fs.geo.block_size as u64;
        let byte = n as u64 * QT_BLKSIZE as u64;
        let lblk = (byte / bs) as u32;
        let ino = self.inode.ino;
        match self.fs.ext_map(ino, self.st, lblk)? {
            Some(e) if !e.unwritten && lblk >= e.lblk && lblk - e.lblk < e.len => {
                let pblk = e.pblk + (lblk - e.lblk) as u64;
                Ok((self.fs.bcache.get(pblk)?, (byte % bs) as usize))
            }
            _ => Err(self.bad(format!("quota block {n} is not mapped"))),
        }
    }

    /// A copy of quota block `n`.
    fn read(&mut self, n: u32) -> Result<Vec<u8>> {
        let (buf, off) = self.block(n)?;
        let data = buf.read();
        Ok(data[off..off + QT_BLKSIZE].to_vec())
    }

    /// Writes quota block `n` through the handle.
    fn write(&mut self, h: &mut Handle<'_>, n: u32, b: &[u8]) -> Result<()> {
        let (buf, off) = self.block(n)?;
        buf.write()[off..off + QT_BLKSIZE].copy_from_slice(b);
        h.dirty(&buf);
        Ok(())
    }

    /// The info of block 0, after checking the header.
    fn info(&mut self) -> Result<QuotaInfo> {
        let b0 = self.read(0)?;
        if !header_ok(&b0, self.qtype) {
            return Err(self.bad("bad header (magic or version)".into()));
        }
        let info = QuotaInfo::decode(&b0);
        if info.blocks <= QT_TREEOFF {
            return Err(self.bad(format!("{} blocks, no tree root", info.blocks)));
        }
        Ok(info)
    }

    fn put_info(&mut self, h: &mut Handle<'_>, info: &QuotaInfo) -> Result<()> {
        let mut b0 = self.read(0)?;
        info.encode(&mut b0);
        self.write(h, 0, &b0)
    }

    /// Checks a reference found in the tree.
    fn check_ref(&self, info: &QuotaInfo, blk: u32) -> Result<u32> {
        if blk >= info.blocks || blk <= QT_TREEOFF {
            return Err(self.bad(format!(
                "reference to block {blk} (the file has {})",
                info.blocks
            )));
        }
        Ok(blk)
    }

    /// The byte offset in the file of id `id`'s entry, None when it has none.
    fn find(&mut self, info: &QuotaInfo, id: u32) -> Result<Option<u64>> {
        let mut blk = QT_TREEOFF;
        for depth in 0..QT_TREEDEPTH {
            let b = self.read(blk)?;
            match tree_ref(&b, tree_index(id, depth)) {
                0 => return Ok(None),
                r => blk = self.check_ref(info, r)?,
            }
        }
        let b = self.read(blk)?;
        for i in 0..ENTRIES_PER_BLOCK {
            let at = entry_offset(i);
            if Dquot::decode(&b[at..at + ENTRY_SIZE]).is_some_and(|q| q.id == id) {
                return Ok(Some(blk as u64 * QT_BLKSIZE as u64 + at as u64));
            }
        }
        Err(self.bad(format!("id {id} is referenced but has no entry")))
    }

    fn entry(&mut self, off: u64) -> Result<Dquot> {
        let (n, at) = split(off);
        let b = self.read(n)?;
        Dquot::decode(&b[at..at + ENTRY_SIZE]).ok_or_else(|| self.bad("an empty entry".into()))
    }

    fn put_entry(&mut self, h: &mut Handle<'_>, off: u64, q: &Dquot) -> Result<()> {
        let (n, at) = split(off);
        let mut b = self.read(n)?;
        q.encode(&mut b[at..at + ENTRY_SIZE]);
        self.write(h, n, &b)
    }

    /// Collects the entries under tree block `blk` at `depth` (e2fsprogs' report_tree).
    fn walk(
        &mut self,
        info: &QuotaInfo,
        blk: u32,
        depth: u32,
        seen: &mut HashSet<u32>,
        out: &mut Vec<Dquot>,
    ) -> Result<()> {
        if !seen.insert(blk) {
            // A block reached twice is a shared data block (as the format allows) or a damaged
            // tree; either way its entries are already taken.
            return Ok(());
        }
        let b = self.read(blk)?;
        if depth == QT_TREEDEPTH {
            for i in 0..ENTRIES_PER_BLOCK {
                let at = entry_offset(i);
                out.extend(Dquot::decode(&b[at..at + ENTRY_SIZE]));
            }
            return Ok(());
        }
        for i in 0..QT_BLKSIZE / 4 {
            let r = tree_ref(&b, i);
            if r != 0 {
                let r = self.check_ref(info, r)?;
                self.walk(info, r, depth + 1, seen, out)?;
            }
        }
        Ok(())
    }

    /// Makes an (empty) entry for `id`, which has none: the tree path to a data block with
    /// a free slot (e2fsprogs' do_insert_tree). Returns its byte offset in the file.
    fn insert(&mut self, h: &mut Handle<'_>, id: u32) -> Result<u64> {
        h.extend(16);
        let mut info = self.info()?;
        let mut blk = QT_TREEOFF;
        for depth in 0..QT_TREEDEPTH {
            let mut b = self.read(blk)?;
            let i = tree_index(id, depth);
            let r = tree_ref(&b, i);
            if depth == QT_TREEDEPTH - 1 {
                if r != 0 {
                    return Err(self.bad(format!("id {id}'s data block is referenced twice")));
                }
                let (dblk, off) = self.free_entry(h, &mut info, id)?;
                set_tree_ref(&mut b, i, dblk);
                self.write(h, blk, &b)?;
                self.put_info(h, &info)?;
                return Ok(off);
            }
            blk = match r {
                0 => {
                    let nb = self.free_block(h, &mut info)?;
                    set_tree_ref(&mut b, i, nb);
                    self.write(h, blk, &b)?;
                    nb
                }
                r => self.check_ref(&info, r)?,
            };
        }
        unreachable!("the loop returns at the last level")
    }

    /// A slot for `id` in a data block with room (find_free_dqentry): the block and the
    /// entry's byte offset in the file. The slot gets an entry with the id and nothing else.
    fn free_entry(
        &mut self,
        h: &mut Handle<'_>,
        info: &mut QuotaInfo,
        id: u32,
    ) -> Result<(u32, u64)> {
        let (dblk, mut b) = if info.free_entry != 0 {
            let d = self.check_ref(info, info.free_entry)?;
            (d, self.read(d)?)
        } else {
            let d = self.free_block(h, info)?;
            info.free_entry = d;
            (d, vec![0u8; QT_BLKSIZE])
        };
        let mut hd = DataHeader::decode(&b);
        if hd.entries as usize + 1 >= ENTRIES_PER_BLOCK {
            // It fills up: off the list of blocks with free slots.
            self.unlink_free_entry(h, info, &hd)?;
            hd.next_free = 0;
            hd.prev_free = 0;
        }
        hd.entries += 1;
        hd.encode(&mut b);
        let slot = (0..ENTRIES_PER_BLOCK)
            .find(|&i| Dquot::decode(&b[entry_offset(i)..entry_offset(i) + ENTRY_SIZE]).is_none())
            .ok_or_else(|| self.bad(format!("data block {dblk} is full but listed free")))?;
        let at = entry_offset(slot);
        Dquot {
            id,
            ..Default::default()
        }
        .encode(&mut b[at..at + ENTRY_SIZE]);
        self.write(h, dblk, &b)?;
        Ok((dblk, dblk as u64 * QT_BLKSIZE as u64 + at as u64))
    }

    /// Takes data block `hd` (its header) off the free-entry list (remove_free_dqentry).
    fn unlink_free_entry(
        &mut self,
        h: &mut Handle<'_>,
        info: &mut QuotaInfo,
        hd: &DataHeader,
    ) -> Result<()> {
        if hd.next_free != 0 {
            let n = self.check_ref(info, hd.next_free)?;
            let mut b = self.read(n)?;
            let mut x = DataHeader::decode(&b);
            x.prev_free = hd.prev_free;
            x.encode(&mut b);
            self.write(h, n, &b)?;
        }
        if hd.prev_free != 0 {
            let p = self.check_ref(info, hd.prev_free)?;
            let mut b = self.read(p)?;
            let mut x = DataHeader::decode(&b);
            x.next_free = hd.next_free;
            x.encode(&mut b);
            self.write(h, p, &b)?;
        } else {
            info.free_entry = hd.next_free;
        }
        Ok(())
    }

    /// A zeroed block for the tree: one off the free list, or a new one at the end of the
    /// file, which grows (get_free_dqblk).
    fn free_block(&mut self, h: &mut Handle<'_>, info: &mut QuotaInfo) -> Result<u32> {
        let blk = if info.free_blk != 0 {
            let b = self.check_ref(info, info.free_blk)?;
            info.free_blk = DataHeader::decode(&self.read(b)?).next_free;
            b
        } else {
            let b = info.blocks;
            self.grow(h, b)?;
            info.blocks += 1;
            b
        };
        self.write(h, blk, &[0u8; QT_BLKSIZE])?;
        Ok(blk)
    }

    /// Makes quota block `n` part of the file: maps a filesystem block for it where it has
    /// none, and moves i_size past it.
    fn grow(&mut self, h: &mut Handle<'_>, n: u32) -> Result<()> {
        let fs = self.fs;
        let bs = fs.geo.block_size as u64;
        let end = (n as u64 + 1) * QT_BLKSIZE as u64;
        let lblk = ((end - 1) / bs) as u32;
        let ino = self.inode.ino;
        if fs
            .ext_map(ino, self.st, lblk)?
            .is_none_or(|e| lblk >= e.lblk + e.len)
        {
            let last = match lblk.checked_sub(1) {
                Some(l) => fs.ext_map(ino, self.st, l)?,
                None => None,
            };
            let goal = last.map_or(fs.geo.group_first_block(fs.geo.ino_group(ino)), |e| {
                e.pblk + e.len as u64
            });
            h.extend(4);
            let (p, _) = fs.alloc_for(h, ino, self.st, lblk, 1, goal, false)?;
            let e = crate::format::extent::Extent {
                lblk,
                len: 1,
                pblk: p,
                unwritten: false,
            };
            if let Err(err) = fs.ext_insert(h, ino, self.st, e) {
                let _ = fs.free_for(h, ino, self.st, lblk as u64, p, 1, true);
                return Err(err);
            }
            let buf = fs.bcache.get_new(p)?;
            buf.write().fill(0);
            h.dirty(&buf);
        }
        if self.st.raw.size() < end {
            self.st.raw.set_size(end);
        }
        fs.mark_inode_dirty(h, self.inode, self.st)
    }
}

/// A byte offset in a quota file as (quota block, offset in it).
fn split(off: u64) -> (u32, usize) {
    (
        (off / QT_BLKSIZE as u64) as u32,
        (off % QT_BLKSIZE as u64) as usize,
    )
}

impl Fs {
    /// Runs `edit` on quota type `t`'s file in a handle of `credits`, the file's inode locked:
    /// the common start of the commands that change limits and grace periods.
    fn edit_quota_file<R>(
        &self,
        t: QuotaType,
        credits: usize,
        edit: impl FnOnce(&mut QuotaFile<'_>, &mut crate::transaction::Handle<'_>) -> Result<R>,
    ) -> Result<R> {
        self.check_writable()?;
        let Some(qino) = self.quota_inum(t) else {
            return Err(Error::NotSupported(format!(
                "this filesystem keeps no {} quotas",
                t.name()
            )));
        };
        let mut h = self.txn.start(credits);
        let qi = self.iget(qino)?;
        let mut st = qi.state.lock();
        let mut f = QuotaFile {
            fs: self,
            qtype: t,
            inode: &qi,
            st: &mut st,
        };
        edit(&mut f, &mut h)
    }
}
