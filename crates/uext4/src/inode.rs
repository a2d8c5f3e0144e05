//! In-memory inodes and the inode cache; reading and writing inodes in the inode table.
//!
//! An [`Inode`] has two locks. `io_lock` is the kernel's i_rwsem: shared for reads and for
//! overwrites of allocated blocks, exclusive for anything that changes the block mapping or the
//! size (allocation, extension, truncate, punch) and for directory changes. `state` guards the
//! on-disk fields and the extent cache; it is held only for short, non-blocking sections.

use crate::error::{Corruption, Error, Result};

use crate::extent_cache::ExtentCache;
use crate::format::inode::{RawInode, Timestamp, ROOT_INO};
use crate::fs::Fs;
pub use crate::icache::{Inode, InodeRef, InodeState};
use crate::transaction::Handle;
use parking_lot::{Mutex, RwLock};

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

impl Fs {
    /// Where inode `ino` lives: (block, byte offset in block).
    pub(crate) fn inode_location(&self, ino: u32) -> Result<(u64, usize)> {
        if ino == 0 || ino > self.geo.inodes_count {
            return Err(Error::corrupt(
                Corruption::Inode,
                format!(
                    "inode number {ino} is out of range (1..={})",
                    self.geo.inodes_count
                ),
            ));
        }
        let g = self.geo.ino_group(ino);
        let index = (ino - 1) % self.geo.inodes_per_group;
        let table = self.balloc.tables[g as usize][2];
        let byte = index as u64 * self.geo.inode_size as u64;
        let blk = table + byte / self.geo.block_size as u64;
        Ok((blk, (byte % self.geo.block_size as u64) as usize))
    }

    /// Reads inode `ino` from its table and verifies it.
    pub(crate) fn read_raw_inode(&self, ino: u32) -> Result<RawInode> {
        let (blk, off) = self.inode_location(ino)?;
        self.read_raw_inode_at(ino, blk, off)
    }

    /// Reads and verifies inode `ino`, found at `off` in table block `blk` (inode_location).
    fn read_raw_inode_at(&self, ino: u32, blk: u64, off: usize) -> Result<RawInode> {
        let buf = self.bcache.get(blk)?;
        let data = buf.read();
        let raw = RawInode(data[off..off + self.geo.inode_size as usize].to_vec());
        drop(data);
        if self.geo.inode_size > 128 {
            let extra = raw.extra_isize() as u32;
            if extra > self.geo.inode_size - 128 || !extra.is_multiple_of(4) {
                return Err(self.fail(
                    Error::corrupt(
                        Corruption::Inode,
                        format!("inode {ino}: i_extra_isize {extra} is invalid"),
                    ),
                    ino,
                    blk,
                    "read_inode",
                ));
            }
        }
        if self.geo.metadata_csum
            && !raw.verify_csum(self.geo.csum_seed, ino)
            && !is_all_zero(&raw.0)
        {
            return Err(self.fail(
                Error::bad_checksum(Corruption::Inode, format!("inode {ino} (in block {blk})")),
                ino,
                blk,
                "read_inode",
            ));
        }
        Ok(raw)
    }

    /// The in-memory inode, read from disk on first use. Fails for inodes that are not in use.
    pub fn iget(&self, ino: u32) -> Result<InodeRef> {
        if let Some(i) = self.icache.get_cached(ino) {
            return live(i);
        }
        // The bitmap bit and the cache entry change together under the group's lock (see
        // alloc_inode and free_inode), so the bit is checked and the inode cached under it: a
        // freed number is never cached from its old contents, and a number being created is
        // found in the cache, never read back from disk half made. The inode is read under
        // the cache shard's lock: one read before could miss a change made and finished by
        // another thread whose copy then left the cache.
        let (blk, off) = self.inode_location(ino)?;
        // The table block is read into the buffer cache (and held there) before the locks, so
        // a device read does not hold up the group's allocations; under them it is a cache hit.
        // Its contents are read again under the locks, so nothing read here is trusted.
        let _table = self.bcache.get(blk).ok();
        let cached = {
            let g = self.geo.ino_group(ino);
            let st = self.balloc.groups[g as usize].lock();
            // The reserved inodes (the root, the journal...) are in use whatever their bit
            // says, as the kernel's iget takes them: a damaged inode bitmap must not hide the
            // whole tree. (Numbers below s_first_ino are never handed out.)
            if ino >= self.geo.first_ino && !self.inode_bit(&st, ino)? {
                return Err(Error::NotFound);
            }
            let mut shard = self.icache.shard(ino).lock();
            match shard.map.get(&ino) {
                Some(i) => i.clone(),
                None => {
                    let raw = self.read_raw_inode_at(ino, blk, off)?;
                    if raw.links_count() == 0 && raw.mode() == 0 {
                        // Marked in use but never written: callers see "no such file".
                        return Err(Error::NotFound);
                    }
                    // As the kernel's iget ("bad i_size value"): a size past the largest a
                    // file can have is damage, not a file to read (a reader of one with a
                    // 2^48-byte size streamed zeros without end).
                    let max = self.max_size_of(&raw);
                    if raw.size() > max {
                        let e = Error::corrupt(
                            Corruption::Inode,
                            format!(
                                "inode {ino}: size {} is past the largest a file can have here \
                                 ({max}); run e2fsck -f",
                                raw.size()
                            ),
                        );
                        return Err(self.fail(e, ino, blk, "iget"));
                    }
                    let inode = new_inode(ino, raw, None, false);
                    let committed = self.txn.committed.load(Ordering::Acquire);
                    self.icache.put(&mut shard, inode.clone(), committed);
                    inode
                }
            }
        };
        live(cached)
    }

    /// [`Fs::iget`] for the data paths, which look at whether the inode is live ([`gone`])
    /// under the state lock they take anyway: a cached inode then costs no lock of its own
    /// (threads sharing one file meet on that lock once per request, not twice).
    pub(crate) fn iget_for_io(&self, ino: u32) -> Result<InodeRef> {
        match self.icache.get_cached(ino) {
            Some(i) => Ok(i),
            None => self.iget(ino),
        }
    }

    /// Writes an inode's fields into its inode-table block, through the handle.
    pub(crate) fn write_inode(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        raw: &mut RawInode,
    ) -> Result<()> {
        if self.geo.metadata_csum {
            raw.set_csum(self.geo.csum_seed, ino);
        }
        let (blk, off) = self.inode_location(ino)?;
        let buf = self.bcache.get(blk)?;
        let replaced = {
            let mut data = buf.write();
            let slot = &mut data[off..off + raw.0.len()];
            let old = self.quota_kept().then(|| RawInode(slot.to_vec()));
            slot.copy_from_slice(&raw.0);
            old
        };
        h.dirty(&buf);
        match replaced {
            // Usage moves with the inode, in this handle (quota.rs).
            Some(old) => self.quota_recharge(h, ino, &old, raw),
            None => Ok(()),
        }
    }

    /// Writes the in-memory inode through the handle and records the transaction in it.
    pub(crate) fn mark_inode_dirty(
        &self,
        h: &mut Handle<'_>,
        inode: &Inode,
        st: &mut InodeState,
    ) -> Result<()> {
        if st.orphaned {
            st.raw.set_dtime(self.orphan_next(inode.ino));
        }
        if st.delalloc.is_some() {
            let mut disk = st.disk_view().into_owned();
            self.write_inode(h, inode.ino, &mut disk)?;
        } else {
            self.write_inode(h, inode.ino, &mut st.raw)?;
        }
        inode.last_tid.fetch_max(h.tid(), Ordering::AcqRel);
        Ok(())
    }

    /// Copies an in-memory inode into its table block without a handle: only at commit, with
    /// the transaction barrier held exclusively (see transaction.rs).
    pub(crate) fn write_inode_at_commit(
        &self,
        ino: u32,
    ) -> Result<Option<Arc<crate::bcache::Buffer>>> {
        let Some(inode) = self.icache.get_cached(ino) else {
            return Ok(None);
        };
        let mut st = inode.state.lock();
        if st.deleted || st.creating {
            return Ok(None);
        }
        if st.orphaned {
            let next = self.orphan_next(ino);
            st.raw.set_dtime(next);
        }
        let mut disk = st.disk_view().into_owned();
        if self.geo.metadata_csum {
            disk.set_csum(self.geo.csum_seed, ino);
        }
        let (blk, off) = self.inode_location(ino)?;
        let buf = self.bcache.get(blk)?;
        let mut data = buf.write();
        let slot = &mut data[off..off + disk.0.len()];
        if self.quota_kept()
            && self.charge_of(ino, &RawInode(slot.to_vec())) != self.charge_of(ino, &disk)
        {
            // Only times change lazily; usage moves in handles (quota.rs).
            tracing::error!(ino, "an inode's quota charge changed outside a handle");
        }
        slot.copy_from_slice(&disk.0);
        drop(data);
        Ok(Some(buf))
    }
}

/// A cached inode as `iget` hands it out: one freed or still being created is "no such file".
pub(crate) fn live(i: InodeRef) -> Result<InodeRef> {
    if gone(&i.state.lock()) {
        return Err(Error::NotFound);
    }
    Ok(i)
}

/// Freed, or not yet made: callers see "no such file".
pub(crate) fn gone(st: &InodeState) -> bool {
    st.deleted || st.creating
}

/// Freed, or being freed in pieces (`delete_orphan`): no longer to be opened or read as the
/// file it was.
pub(crate) fn freed(st: &InodeState) -> bool {
    st.deleted || st.dying
}

/// A new in-memory inode.
pub(crate) fn new_inode(
    ino: u32,
    raw: RawInode,
    extents: Option<ExtentCache>,
    creating: bool,
) -> InodeRef {
    Arc::new(Inode {
        ino,
        io_lock: RwLock::new(()),
        state: Mutex::new(InodeState {
            raw,
            extents,
            orphaned: false,
            deleted: false,
            dying: false,
            creating,
            delalloc: None,
            no_capability: false,
            crypt: None,
            verity: None,
            may_inline: false,
        }),
        open_count: AtomicU32::new(0),
        last_tid: AtomicU64::new(0),
        last_data_tid: AtomicU64::new(0),
        lazy_tid: AtomicU64::new(0),
    })
}

fn is_all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// File attributes, as getattr returns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The inode number.
    pub ino: u32,
    /// File type and permission bits.
    pub mode: u16,
    /// Hard links.
    pub nlink: u32,
    /// The owner.
    pub uid: u32,
    /// The group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte sectors allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification of the contents.
    pub mtime: Timestamp,
    /// Last change of the inode.
    pub ctime: Timestamp,
    /// Creation.
    pub crtime: Timestamp,
    /// The device number, for a device node.
    pub rdev: u32,
    /// The inode generation (for NFS file handles).
    pub generation: u32,
    /// The inode flags (`chattr`'s).
    pub flags: u32,
    /// The filesystem's block size (the preferred I/O size).
    pub block_size: u32,
}

impl Attr {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & crate::format::inode::S_IFMT == crate::format::inode::S_IFDIR
    }
}

/// Device number stored in i_block of character and block device inodes (old or new encoding).
pub fn decode_rdev(raw: &RawInode) -> u32 {
    let b = raw.i_block();
    let old = u32::from_le_bytes(b[0..4].try_into().unwrap());
    if old != 0 {
        // old 16-bit encoding: major in bits 8-15, minor in 0-7
        let major = (old >> 8) & 0xff;
        let minor = old & 0xff;
        return libc_makedev(major, minor);
    }
    let new = u32::from_le_bytes(b[4..8].try_into().unwrap());
    let major = (new & 0xfff00) >> 8;
    let minor = (new & 0xff) | ((new >> 12) & 0xfff00);
    libc_makedev(major, minor)
}

/// Stores a device number in i_block (the kernel's encoding: old format when it fits).
pub fn encode_rdev(raw: &mut RawInode, rdev: u32) {
    let (major, minor) = (rdev_major(rdev), rdev_minor(rdev));
    let b = raw.i_block_mut();
    b[..12].fill(0);
    if major < 256 && minor < 256 {
        b[0..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
    } else {
        let new = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
        b[4..8].copy_from_slice(&new.to_le_bytes());
    }
}

/// Linux's dev_t as FUSE passes it (32-bit "new_encode_dev" form: major 12 bits, minor 20 bits).
pub fn libc_makedev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}
pub fn rdev_major(dev: u32) -> u32 {
    (dev & 0xfff00) >> 8
}
pub fn rdev_minor(dev: u32) -> u32 {
    (dev & 0xff) | ((dev >> 12) & 0xfff00)
}

impl Fs {
    /// Attributes of an in-memory inode.
    pub(crate) fn attr_of(&self, ino: u32, st: &InodeState) -> Attr {
        let raw = &st.raw;
        // Blocks that buffered pages will take once written back count already, as the
        // kernel's ext4 counts its delayed-allocation reservations: tools that judge a file
        // sparse from st_blocks (tar --sparse, cp) otherwise took fresh data for holes.
        let pending = st.delalloc.as_ref().map_or(0, |d| {
            d.reserved_blocks() * (self.geo.block_size as u64 / 512)
        });
        let ft = raw.file_type();
        let rdev = if ft == crate::format::inode::S_IFCHR || ft == crate::format::inode::S_IFBLK {
            decode_rdev(raw)
        } else {
            0
        };
        let links = raw.links_count() as u32;
        Attr {
            ino,
            mode: raw.mode(),
            // dir_nlink: a directory with more than 65000 subdirectories stores 1.
            nlink: if raw.is_dir() && links == 1 { 1 } else { links },
            uid: raw.uid(),
            gid: raw.gid(),
            size: raw.size(),
            blocks: raw.blocks_512(self.geo.block_size) + pending,
            atime: raw.atime(),
            mtime: raw.mtime(),
            ctime: raw.ctime(),
            crtime: raw.crtime().unwrap_or_default(),
            rdev,
            generation: raw.generation(),
            flags: raw.flags(),
            block_size: self.geo.block_size,
        }
    }

    /// The attributes of `ino`.
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound) for an inode not in use; corruption and I/O
    /// errors.
    pub fn getattr(&self, ino: u32) -> Result<Attr> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        Ok(self.attr_of(ino, &st))
    }

    /// The root directory's inode number ([`ROOT_INO`](crate::ROOT_INO)).
    pub fn root_ino(&self) -> u32 {
        ROOT_INO
    }
}
