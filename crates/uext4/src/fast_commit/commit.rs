//! Writing fast commits on fsync, as fs/ext4/fast_commit.c's ext4_fc_commit: instead of a
//! full jbd2 commit, the changes the running transaction's handles declared eligible
//! (transaction.rs's `FcTrack`) are written as records into the journal's fast-commit area
//! after the log, and the fsync is answered once they are on the device. The next full
//! commit makes them stale (the journal forgets the area: journal/fast_commit.rs).
//!
//! What is eligible here is a subset of what the kernel logs: changes to regular files that
//! map their blocks with extents (writes, appends, size changes), each described by the
//! file's INODE record and, for the logical blocks whose mapping changed, ADD_RANGE for what
//! is mapped now and DEL_RANGE for what is not (ext4_fc_write_inode_data); and the names of
//! such files in directories neither encrypted nor casefolded: CREAT for a new file, LINK,
//! UNLINK, and a rename as UNLINK of the name replaced, LINK and UNLINK (ext4_rename's
//! tracking). Every other change makes the transaction ineligible until its full commit (a
//! handle that changes metadata without declaring it does so by itself), as do revoked
//! blocks, which only a full commit's revoke records keep recovery from replaying over
//! reused blocks.
//!
//! Replay (replay.rs, the kernel's and e2fsck's) rebuilds the allocation bitmaps and counts
//! from the inodes the records name, so they need not be written: the data blocks alone
//! must be on the device before the records (`Journal::fc_write` flushes first).

use crate::error::Result;
use crate::format::extent::Extent;
use crate::format::fast_commit::{
    FcEncoder, ADD_RANGE_SIZE, DEL_RANGE_SIZE, DENTRY_INFO_SIZE, TAG_ADD_RANGE, TAG_CREAT,
    TAG_DEL_RANGE, TAG_INODE, TAG_LINK, TAG_UNLINK,
};
use crate::format::features::{COMPAT_FAST_COMMIT, INCOMPAT_EA_INODE};
use crate::format::inode::{FL_EA_INODE, FL_EXTENTS, FL_INLINE_DATA, GOOD_OLD_INODE_SIZE};
use crate::fs::Fs;
use crate::inode::InodeState;
use crate::journal::FcBlocks;
use crate::transaction::{FastCommitEnv, FcDentry, FcTrack, Handle};

/// EXT4_JOURNAL_DATA_FL: data through the journal (the kernel's EXT4_FC_REASON_JOURNAL_FLAG_CHANGE
/// family: never fast-committed).
const FL_JOURNAL_DATA: u32 = 0x4000;
/// EXT4_ENCRYPT_FL.
const FL_ENCRYPT: u32 = 0x800;
/// EXT4_VERITY_FL.
const FL_VERITY: u32 = 0x0010_0000;

impl Fs {
    /// Whether fsync writes fast commits here: the image has the fast_commit feature and the
    /// journal its area, `MountOptions::fast_commit` is on, and nothing the records do not
    /// carry must follow the changes (quota usage). Not with bigalloc: the kernel's replay
    /// (ext4_ext_replay_set_iblocks, 6.18) counts i_blocks in blocks, not clusters, so
    /// e2fsck finds every file a record touched wrong after it (replay.rs counts clusters).
    pub(crate) fn fc_enabled(&self) -> bool {
        self.opts.fast_commit
            && !self.is_read_only()
            && self.geo.cluster_bits == 0
            && !self.quota_kept()
            && self.superblock().has_compat(COMPAT_FAST_COMMIT)
            && self
                .journal
                .get()
                .is_some_and(|j| j.fast_commit_area().is_some())
    }

    /// Declares in `h` that its change to the inode `st` holds is one a fast commit
    /// describes: its fields and the mapping of logical blocks `range` (first, last), or
    /// that it is not (then the transaction commits in full).
    pub(crate) fn fc_track(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &InodeState,
        range: Option<(u32, u32)>,
    ) {
        match Self::fc_describable(st) {
            Ok(()) => h.fc_eligible(ino, range),
            Err(why) => h.fc_ineligible(why),
        }
    }

    /// Declares in `h` the new regular file `ino` named `name` in `dir` (a CREAT record
    /// after its INODE), or that the create is not one fast commits describe. `st` is the
    /// new inode's state, whole.
    pub(crate) fn fc_track_create(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        name: &[u8],
        ino: u32,
        st: &InodeState,
    ) {
        if h.fc_tracked() {
            let ok = Self::fc_describable(st);
            Self::fc_name(h, ok, TAG_CREAT, dir, name, ino, true);
        }
    }

    /// Declares in `h` the removal of `ino`'s name `name` from `dir` (an UNLINK record, as
    /// ext4_fc_track_unlink), `st` being the inode's state once it lost the link and before
    /// it is freed or made an orphan; `dir_flags` are the directory's. An inode left with
    /// links is logged too: its INODE record carries the count. One left with none needs no
    /// record of its own, as the kernel's eviction drops it from the fast-commit queue:
    /// replay frees an inode whose last name an UNLINK took, so it must hold nothing replay
    /// cannot free (`fc_forgettable`).
    pub(crate) fn fc_track_unlink(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        dir_flags: u32,
        name: &[u8],
        ino: u32,
        st: &InodeState,
    ) {
        if !h.fc_tracked() {
            return;
        }
        let linked = st.raw.links_count() > 0;
        let ok = Self::fc_dir_describable(dir_flags).and_then(|()| {
            if linked {
                Self::fc_describable(st)
            } else {
                self.fc_forgettable(&st.raw)
            }
        });
        Self::fc_name(h, ok, TAG_UNLINK, dir, name, ino, linked);
    }

    /// Declares in `h` a new name `name` in `dir` for the existing inode `ino` (a LINK record
    /// and the inode's INODE record, as ext4_fc_track_link), or that it is not one fast
    /// commits describe. `st` is the inode's state after the link.
    pub(crate) fn fc_track_link(
        &self,
        h: &mut Handle<'_>,
        dir: u32,
        dir_flags: u32,
        name: &[u8],
        ino: u32,
        st: &InodeState,
    ) {
        if h.fc_tracked() {
            let ok = Self::fc_dir_describable(dir_flags).and_then(|()| Self::fc_describable(st));
            Self::fc_name(h, ok, TAG_LINK, dir, name, ino, true);
        }
    }

    /// The common end of the name declarations: if `ok`, the entry `tag` (`dir`, `name`,
    /// `ino`) in order, and the inode's INODE record where `log_inode`; else the reason the
    /// transaction commits in full.
    fn fc_name(
        h: &mut Handle<'_>,
        ok: std::result::Result<(), &'static str>,
        tag: u16,
        dir: u32,
        name: &[u8],
        ino: u32,
        log_inode: bool,
    ) {
        if let Err(why) = ok {
            return h.fc_ineligible(why);
        }
        if log_inode {
            h.fc_eligible(ino, None);
        }
        h.fc_dentry(FcDentry {
            tag,
            parent: dir,
            ino,
            name: name.to_vec(),
        });
    }

    /// Declares that the changes of `h`, which frees the inode `st` holds (it has no link
    /// left), need no record: the UNLINK that took its last name is in a fast commit (replay
    /// frees it) or in the log with the inode an orphan (recovery frees it). Only for a
    /// handle that does nothing else.
    pub(crate) fn fc_track_forget(&self, h: &mut Handle<'_>, st: &InodeState) {
        if !h.fc_tracked() {
            return;
        }
        match self.fc_forgettable(&st.raw) {
            Ok(()) => h.fc_no_record(),
            Err(why) => h.fc_ineligible(why),
        }
    }

    /// Whether names in a directory with these flags are ones records carry: not encrypted
    /// (the kernel's EXT4_FC_REASON_ENCRYPTED_FILENAME) nor casefolded (replay finds names
    /// by lookup, and a rename between two spellings of one name would lose the file).
    fn fc_dir_describable(dir_flags: u32) -> std::result::Result<(), &'static str> {
        if dir_flags & FL_ENCRYPT != 0 {
            return Err("a name in an encrypted directory");
        }
        if dir_flags & crate::flags::FL_CASEFOLD != 0 {
            return Err("a name in a casefolded directory");
        }
        Ok(())
    }

    /// Whether replay can free an inode with no links from an UNLINK record alone
    /// (fc_set_bitmaps in replay.rs): not a directory, its blocks (if any) mapped by
    /// extents, no xattr block and no EA inodes, which replay does not free.
    fn fc_forgettable(
        &self,
        raw: &crate::format::inode::RawInode,
    ) -> std::result::Result<(), &'static str> {
        if raw.is_dir() {
            return Err("a directory removed");
        }
        if raw.file_acl() != 0 || self.superblock().has_incompat(INCOMPAT_EA_INODE) {
            return Err("a file with an xattr block or EA inodes freed");
        }
        if Self::has_data_blocks(raw) && raw.flags() & FL_EXTENTS == 0 {
            return Err("a file with mapped blocks freed");
        }
        Ok(())
    }

    /// Whether records describe the inode: a live regular file mapped by extents, with no
    /// data in the journal, inline, encrypted or verified, and not an EA inode.
    fn fc_describable(st: &InodeState) -> std::result::Result<(), &'static str> {
        let raw = &st.raw;
        let flags = raw.flags();
        if !raw.is_reg() {
            return Err("a change to an inode that is not a regular file");
        }
        if flags & FL_EXTENTS == 0
            || flags & (FL_INLINE_DATA | FL_JOURNAL_DATA | FL_ENCRYPT | FL_VERITY | FL_EA_INODE)
                != 0
        {
            return Err("a change to a file fast commits do not describe");
        }
        if raw.links_count() == 0 || st.orphaned || st.deleted || st.dying || st.creating {
            return Err("a change to an unlinked or orphaned file");
        }
        Ok(())
    }

    /// ADD_RANGE and DEL_RANGE records for the logical blocks `first..=last` of the inode as
    /// its extent cache maps them now (ext4_fc_write_inode_data). False if one does not fit.
    fn fc_add_ranges(
        &self,
        enc: &mut FcEncoder,
        ino: u32,
        st: &mut InodeState,
        first: u32,
        last: u32,
    ) -> Result<bool> {
        let (mut cur, last) = (first as u64, last as u64);
        while cur <= last {
            let next = self.ext_next(ino, st, cur as u32)?;
            match next {
                Some(e) if (e.lblk as u64) <= cur => {
                    let end = (e.end() - 1).min(last);
                    let max = Extent::max_len(e.unwritten) as u64;
                    while cur <= end {
                        let n = (end - cur + 1).min(max);
                        let piece = Extent {
                            lblk: cur as u32,
                            len: n as u32,
                            pblk: e.pblk + (cur - e.lblk as u64),
                            unwritten: e.unwritten,
                        };
                        let mut v = vec![0u8; ADD_RANGE_SIZE];
                        v[..4].copy_from_slice(&ino.to_le_bytes());
                        piece.write(&mut v[4..]);
                        if !enc.add(TAG_ADD_RANGE, &v) {
                            return Ok(false);
                        }
                        cur += n;
                    }
                }
                other => {
                    let hole_end = match other {
                        Some(e) if (e.lblk as u64) <= last => e.lblk as u64 - 1,
                        _ => last,
                    };
                    let mut v = Vec::with_capacity(DEL_RANGE_SIZE);
                    for x in [ino, cur as u32, (hole_end - cur + 1) as u32] {
                        v.extend_from_slice(&x.to_le_bytes());
                    }
                    if !enc.add(TAG_DEL_RANGE, &v) {
                        return Ok(false);
                    }
                    cur = hole_end + 1;
                }
            }
        }
        Ok(true)
    }

    /// The INODE record: the inode as its table block will hold it at the next commit
    /// (128 bytes and i_extra_isize, as ext4_fc_write_inode copies it), checksum set.
    fn fc_add_inode(&self, enc: &mut FcEncoder, ino: u32, st: &InodeState) -> bool {
        let mut raw = st.disk_view().into_owned();
        if self.geo.metadata_csum {
            raw.set_csum(self.geo.csum_seed, ino);
        }
        let len = (GOOD_OLD_INODE_SIZE + raw.extra_isize() as usize).min(raw.0.len());
        let mut v = Vec::with_capacity(4 + len);
        v.extend_from_slice(&ino.to_le_bytes());
        v.extend_from_slice(&raw.0[..len]);
        enc.add(TAG_INODE, &v)
    }
}

impl FastCommitEnv for Fs {
    fn fc_ready(&self) -> bool {
        self.journal.get().and_then(|j| j.fc_slot()).is_some()
    }

    fn fc_prepare(&self, track: &FcTrack) -> Result<Option<FcBlocks>> {
        let Some(slot) = self.journal.get().and_then(|j| j.fc_slot()) else {
            return Ok(None);
        };
        let mut enc = FcEncoder::new(self.geo.block_size as usize);
        if slot.first == 0 {
            enc.head(slot.tid);
        }
        // Entries first, in order; a new inode's INODE record before its CREAT, so that
        // replay makes the inode, then names it (ext4_fc_write_dentries).
        for d in &track.dentries {
            if d.tag == TAG_CREAT {
                let inode = match self.iget(d.ino) {
                    Ok(i) => i,
                    Err(crate::error::Error::NotFound) => return Ok(None),
                    Err(e) => return Err(e),
                };
                let st = inode.state.lock();
                if Self::fc_describable(&st).is_err() || !self.fc_add_inode(&mut enc, d.ino, &st) {
                    return Ok(None);
                }
            }
            let mut v = Vec::with_capacity(DENTRY_INFO_SIZE + d.name.len());
            v.extend_from_slice(&d.parent.to_le_bytes());
            v.extend_from_slice(&d.ino.to_le_bytes());
            v.extend_from_slice(&d.name);
            if !enc.add(d.tag, &v) {
                return Ok(None);
            }
        }
        for (&ino, &range) in &track.inodes {
            // An inode freed since (its last name went in an UNLINK, or in the log with it
            // an orphan) has no record, as the kernel's ext4_fc_del drops it from the queue.
            let inode = match self.iget(ino) {
                Ok(i) => i,
                Err(crate::error::Error::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let mut st = inode.state.lock();
            if st.deleted {
                continue;
            }
            if Self::fc_describable(&st).is_err() {
                return Ok(None);
            }
            if let Some((first, last)) = range {
                if !self.fc_add_ranges(&mut enc, ino, &mut st, first, last)? {
                    return Ok(None);
                }
            }
            if !self.fc_add_inode(&mut enc, ino, &st) || enc.blocks() > slot.room as usize {
                return Ok(None);
            }
        }
        for &ino in &track.lazy {
            let Ok(inode) = self.iget(ino) else {
                continue;
            };
            let st = inode.state.lock();
            if Self::fc_describable(&st).is_ok() && !self.fc_add_inode(&mut enc, ino, &st) {
                return Ok(None);
            }
        }
        if enc.blocks() > slot.room as usize {
            return Ok(None);
        }
        enc.tail(slot.tid);
        let blocks = enc.finish();
        if blocks.len() > slot.room as usize {
            return Ok(None);
        }
        Ok(Some(FcBlocks { slot, blocks }))
    }

    fn fc_write(&self, p: FcBlocks) -> Result<()> {
        match self.journal.get() {
            Some(j) => j.fc_write(&p),
            None => Err(crate::error::Error::Invalid(
                "a fast commit without a journal".into(),
            )),
        }
    }

    fn fc_flush(&self) -> Result<()> {
        Ok(self.dev.flush()?)
    }
}
