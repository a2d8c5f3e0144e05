//! Extended attribute values kept in inodes of their own (the ea_inode feature), as the
//! kernel's ext4_xattr_inode_* in fs/ext4/xattr.c.
//!
//! An entry whose value is in an EA inode has `e_value_inum` set, no value in the list, and an
//! `e_hash` over its name and the value's crc32c. The EA inode is a regular file flagged
//! `EXT4_EA_INODE_FL` holding the value as its data; its fields carry what the kernel keeps
//! there: the value's crc32c (seeded with the filesystem's checksum seed) in i_atime, the
//! reference count split over i_ctime (high 32 bits) and i_version (low 32 bits).
//!
//! References are held by places, not by inodes: each in-inode entry naming an EA inode is
//! one, and each xattr block is one for every entry it holds (a block shared by many inodes
//! still counts once, as e2fsck counts). Identical values are shared as the kernel's ea_inode
//! mbcache shares them: EA inodes read or made since the open are remembered by value hash
//! ([`crate::icache::InodeCache`]), and a new value equal to one of them takes a reference on
//! it instead of a new inode. An EA inode whose count reaches zero is freed in the same
//! handle as the change that dropped the last reference (the kernel puts it on the orphan list
//! and frees it at eviction; a crash there leaves an orphan, here nothing to recover).
//!
//! The inode holding the entries is charged the EA inode's blocks in i_blocks (the kernel's
//! ext4_xattr_inode_alloc_quota charges them to its quota, which adds to i_blocks): the value's
//! length rounded up to a cluster, per referencing entry, as e2fsck's check_blocks expects.
//!
//! Locking: the parent inode's `state` is held while an EA inode's is taken (EA inodes are never
//! parents of anything, so the order cannot be reversed). Between the two sits the inode
//! cache's EA serialisation lock (`Fs::ea_guard`), taken re-entrantly by a change from the
//! lookup of a shareable value until its references are counted, and by every release: no
//! value found in the cache is freed before the reference that shares it is taken.

use crate::error::{Corruption, Error, Result};
use crate::format::features::INCOMPAT_EA_INODE;
use crate::format::inode::{RawInode, Timestamp, FL_EA_INODE, S_IFREG};
use crate::format::xattr::{
    ea_entry_hash, ea_entry_hash_signed, ea_value_hash, EaRef, XattrEntry, BLOCK_HEADER_LEN,
};
use crate::fs::Fs;
use crate::icache::InodeState;
use crate::transaction::Handle;
use std::collections::BTreeMap;

/// The kernel's EXT4_XATTR_MIN_LARGE_EA_SIZE: a value whose padded length is above this goes
/// to an EA inode at once (a block minus its header, one entry with a 3-byte name, the list's
/// terminator).
pub(crate) fn min_large_value(block_size: usize) -> usize {
    block_size - BLOCK_HEADER_LEN - 20 - 4
}

/// The EA inode's reference count (i_ctime's seconds, high; i_version's low word, low).
fn ref_count(raw: &RawInode) -> u64 {
    (raw.ctime_lo() as u64) << 32 | raw.version_lo() as u64
}

fn set_ref_count(raw: &mut RawInode, n: u64) {
    raw.set_ctime(Timestamp {
        sec: (n >> 32) as i64,
        nsec: 0,
    });
    raw.set_version_lo(n as u32);
}

impl Fs {
    /// Whether the filesystem keeps large values in inodes of their own.
    pub(crate) fn ea_inode_enabled(&self) -> bool {
        self.sb.lock().has_incompat(INCOMPAT_EA_INODE)
    }

    /// Held while EA inodes are found, made, shared or released (with ea_inode; None
    /// without): see [`crate::icache::InodeCache::ea_serialize`].
    pub(crate) fn ea_guard(&self) -> Option<parking_lot::ReentrantMutexGuard<'_, ()>> {
        self.ea_inode_enabled().then(|| self.icache.ea_serialize())
    }

    /// Checks an entry's EA inode reference as the kernel's check_xattrs does before any use.
    pub(crate) fn ea_check_ref(&self, parent: u32, e: &XattrEntry) -> Result<()> {
        let Some(r) = e.ea else {
            return Ok(());
        };
        let why = if !self.ea_inode_enabled() {
            Some("names an EA inode without the ea_inode feature".to_string())
        } else if r.inum < self.geo.first_ino || r.inum > self.geo.inodes_count || r.inum == parent
        {
            Some(format!("names EA inode {}, out of range", r.inum))
        } else if r.size == 0 || r.size as usize > crate::format::xattr::VALUE_MAX {
            Some(format!("has an EA inode value of {} bytes", r.size))
        } else {
            None
        };
        match why {
            Some(w) => Err(self.fail(
                Error::corrupt(
                    Corruption::Xattr,
                    format!(
                        "inode {parent}: attribute {:?} {w}",
                        String::from_utf8_lossy(&e.name)
                    ),
                ),
                parent,
                0,
                "ea_check_ref",
            )),
            None => Ok(()),
        }
    }

    /// The value of entry `e` of inode `parent`: its own bytes, or those of its EA inode,
    /// checked as the kernel's ext4_xattr_inode_get checks them (the flag, the size, the value
    /// hash in i_atime, the entry hash). A checked EA inode is remembered for sharing.
    pub(crate) fn xattr_value(&self, parent: u32, e: &XattrEntry) -> Result<Vec<u8>> {
        let Some(r) = e.ea else {
            return Ok(e.value.clone());
        };
        self.ea_check_ref(parent, e)?;
        let bad = |why: String| {
            self.fail(
                Error::corrupt(
                    Corruption::Xattr,
                    format!("inode {parent}: EA inode {}: {why}", r.inum),
                ),
                parent,
                0,
                "xattr_value",
            )
        };
        let ea = self
            .iget(r.inum)
            .map_err(|e| bad(format!("unreadable: {e}")))?;
        let (flags, size, stored_hash) = {
            let st = ea.state.lock();
            (st.raw.flags(), st.raw.size(), st.raw.atime_lo())
        };
        if flags & FL_EA_INODE == 0 {
            return Err(bad("lacks the EA_INODE flag".into()));
        }
        if size != r.size as u64 {
            return Err(bad(format!(
                "holds {size} bytes, the entry says {}",
                r.size
            )));
        }
        let mut value = vec![0u8; r.size as usize];
        self.read_mapped(&ea, 0, &mut value)?;
        let hash = ea_value_hash(self.geo.csum_seed, &value);
        if hash != stored_hash {
            return Err(bad(format!(
                "value hash {hash:#x} differs from the stored {stored_hash:#x}"
            )));
        }
        if ea_entry_hash(&e.name, hash) != r.hash && ea_entry_hash_signed(&e.name, hash) != r.hash {
            return Err(bad(format!("entry hash {:#x} does not match", r.hash)));
        }
        self.icache.ea_remember(hash, r.inum);
        Ok(value)
    }

    /// An entry for `index`.`name` with `value` kept in an EA inode: one already holding this
    /// value (remembered by hash, compared byte for byte), else a new one made in handle `h`
    /// near `parent` and owned as it is. The reference itself is taken when the entry is laid
    /// out ([`Fs::ea_refs_apply`]): a new EA inode has count 0 until then.
    pub(crate) fn ea_entry_new(
        &self,
        h: &mut Handle<'_>,
        parent: u32,
        owner: &RawInode,
        index: u8,
        name: &[u8],
        value: &[u8],
    ) -> Result<XattrEntry> {
        let hash = ea_value_hash(self.geo.csum_seed, value);
        let entry = |inum: u32| XattrEntry {
            index,
            name: name.to_vec(),
            value: Vec::new(),
            ea: Some(EaRef {
                inum,
                size: value.len() as u32,
                hash: ea_entry_hash(name, hash),
            }),
        };
        for cand in self.icache.ea_candidates(hash) {
            if cand != parent && self.ea_holds(cand, hash, value) {
                return Ok(entry(cand));
            }
        }
        let inum = self.ea_inode_create(h, parent, owner, hash, value)?;
        self.icache.ea_remember(hash, inum);
        Ok(entry(inum))
    }

    /// Whether live EA inode `ino` holds exactly `value` with value hash `hash`.
    fn ea_holds(&self, ino: u32, hash: u32, value: &[u8]) -> bool {
        let Ok(ea) = self.iget(ino) else {
            self.icache.ea_forget(ino);
            return false;
        };
        {
            // Not waited for: a number remembered here that was freed and reused (by orphan
            // processing) may name an inode whose holder waits for this thread's EA lock.
            let Some(st) = ea.state.try_lock() else {
                return false;
            };
            if st.raw.flags() & FL_EA_INODE == 0
                || st.raw.size() != value.len() as u64
                || st.raw.atime_lo() != hash
                || ref_count(&st.raw) == u64::MAX
            {
                return false;
            }
        }
        let mut have = vec![0u8; value.len()];
        self.read_mapped(&ea, 0, &mut have).is_ok() && have == value
    }

    /// Makes an EA inode holding `value` (hash `hash`), count 0, in handle `h`: as the kernel's
    /// ext4_xattr_inode_create, a regular file of mode 0600 owned as the parent, flagged
    /// EA_INODE, its value hash in i_atime; its data blocks written before they are mapped.
    fn ea_inode_create(
        &self,
        h: &mut Handle<'_>,
        parent: u32,
        owner: &RawInode,
        hash: u32,
        value: &[u8],
    ) -> Result<u32> {
        let now = self.now();
        let mut raw = self.fresh_raw_inode(S_IFREG | 0o600, owner.uid(), owner.gid(), now);
        raw.set_atime(Timestamp {
            sec: hash as i64,
            nsec: 0,
        });
        // Without an extra field the time would be clamped; the hash is the low word.
        raw.set_atime_lo(hash);
        set_ref_count(&mut raw, 0);
        self.init_block_map(&mut raw);
        raw.set_flags(raw.flags() | FL_EA_INODE);
        let inode = self.alloc_inode(h, parent, false, raw)?;
        let mut st = inode.state.lock();
        let r = self.ea_inode_fill(h, inode.ino, &mut st, value);
        let r = r.and_then(|()| self.mark_inode_dirty(h, &inode, &mut st));
        if let Err(e) = r {
            st.raw.set_links_count(0);
            st.creating = false;
            let _ = self.delete_inode(h, &inode, &mut st);
            return Err(e);
        }
        st.creating = false;
        Ok(inode.ino)
    }

    /// Allocates and writes the EA inode's data blocks, and sets its size.
    fn ea_inode_fill(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        st: &mut InodeState,
        value: &[u8],
    ) -> Result<()> {
        let bs = self.geo.block_size as u64;
        let last = (value.len() as u64).div_ceil(bs) - 1;
        let mut lblk = 0;
        while lblk <= last {
            let start = lblk;
            let n = self.map_hole(h, ino, st, lblk, last, false, &mut |p, n| {
                let from = (start * bs) as usize;
                let to = ((start + n as u64) * bs).min(value.len() as u64) as usize;
                let mut data = value[from..to].to_vec();
                data.resize((n as u64 * bs) as usize, 0);
                self.dev.write_new_at(p * bs, &data)?;
                Ok(false)
            })?;
            lblk += n as u64;
        }
        st.raw.set_size(value.len() as u64);
        Ok(())
    }

    /// Applies reference count changes, `deltas` by EA inode, in handle `h`: increments
    /// first, so a value moving between places never passes through zero; an EA inode left
    /// with no reference is freed.
    pub(crate) fn ea_refs_apply(
        &self,
        h: &mut Handle<'_>,
        parent: u32,
        deltas: &BTreeMap<u32, i64>,
    ) -> Result<()> {
        // A zero change still frees an EA inode left at count 0 (one made for a change that
        // then failed).
        let mut order: Vec<(u32, i64)> = deltas.iter().map(|(i, d)| (*i, *d)).collect();
        order.sort_by_key(|&(_, d)| std::cmp::Reverse(d.signum()));
        for (ino, d) in order {
            h.extend(6);
            let ea = self.iget(ino)?;
            let mut st = ea.state.lock();
            if st.raw.flags() & FL_EA_INODE == 0 {
                drop(st);
                return Err(self.fail(
                    Error::corrupt(
                        Corruption::Xattr,
                        format!("inode {parent}: EA inode {ino} lacks the EA_INODE flag"),
                    ),
                    parent,
                    0,
                    "ea_refs_apply",
                ));
            }
            let n = ref_count(&st.raw) as i64 + d;
            if n > 0 && d == 0 {
                continue;
            }
            if n > 0 {
                set_ref_count(&mut st.raw, n as u64);
                self.mark_inode_dirty(h, &ea, &mut st)?;
            } else {
                set_ref_count(&mut st.raw, 0);
                st.raw.set_links_count(0);
                self.icache.ea_forget(ino);
                self.delete_inode(h, &ea, &mut st)?;
            }
        }
        Ok(())
    }

    /// What the EA-inode values of `entries` cost the inode naming them, in 512-byte units:
    /// each value's length rounded up to a cluster (e2fsck's size_to_quota_blocks).
    pub(crate) fn ea_charge(&self, entries: &[XattrEntry]) -> u64 {
        let cluster = self.geo.block_size as u64 * self.geo.cluster_ratio() as u64;
        entries
            .iter()
            .filter_map(|e| e.ea)
            .map(|r| (r.size as u64).div_ceil(cluster) * cluster / 512)
            .sum()
    }
}

/// Adds `sign` for each EA inode that `entries` name to `deltas`.
pub(crate) fn count_refs(deltas: &mut BTreeMap<u32, i64>, entries: &[XattrEntry], sign: i64) {
    for r in entries.iter().filter_map(|e| e.ea) {
        *deltas.entry(r.inum).or_default() += sign;
    }
}
