//! In-memory inodes and the inode cache. An [`Inode`] has two locks. `io_lock` is the
//! kernel's i_rwsem: shared for reads and for overwrites of allocated blocks, exclusive for
//! anything that changes the block mapping or the size (allocation, extension, truncate,
//! punch) and for directory changes. `state` guards the on-disk fields and the extent cache;
//! it is held only for short, non-blocking sections. Reading and writing inodes in the inode
//! table is inode.rs's.

use crate::delalloc_state::Dirty;
use crate::extent_cache::ExtentCache;
use crate::format::inode::RawInode;
use crate::mballoc::Claim;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub struct InodeState {
    pub raw: RawInode,
    /// The file's extents, loaded on first use (None until then).
    pub extents: Option<ExtentCache>,
    /// Set when the inode was unlinked while open: freed at last close.
    pub orphaned: bool,
    /// Set when the inode has been freed (its number may be reused).
    pub deleted: bool,
    /// Set while an unlinked inode nobody has open is freed in pieces (`delete_orphan`): it
    /// can no longer be opened or linked, as if already deleted.
    pub dying: bool,
    /// Set from the moment the number is allocated until the creator has initialised the inode
    /// (namei's create): the inode is in the cache then, so that no one loads the number's old
    /// contents from disk, but a stale number that reaches it gets "no such file".
    pub creating: bool,
    /// Buffered mode: data not yet written back, and the size the device backs (delalloc.rs).
    pub delalloc: Option<Box<Dirty>>,
    /// Known to have no `security.capability` (xattr.rs keeps it): a write skips the look.
    pub no_capability: bool,
    /// An encrypted inode's key, derived at first use and dropped with the inode.
    pub(crate) crypt: Option<std::sync::Arc<crate::crypto::InodeKey>>,
    /// A verity file's descriptor, tree shape and verified tree blocks, read at first use.
    pub(crate) verity: Option<std::sync::Arc<crate::format::verity::VerityInfo>>,
    /// The kernel's EXT4_STATE_MAY_INLINE_DATA: a new inode that may still go inline
    /// (inline_write.rs).
    pub(crate) may_inline: bool,
}

impl InodeState {
    /// The reservation of the buffered writeback run in progress on this inode, if one is:
    /// the allocations for its data and mapping blocks pass it to the allocator.
    pub(crate) fn writeback_claim(&self) -> Option<&Claim> {
        self.delalloc.as_ref()?.claim.as_ref()
    }

    /// The inode as it may go to disk: with buffered data not yet written back, the size the
    /// written data backs rather than the size users see.
    pub(crate) fn disk_view(&self) -> std::borrow::Cow<'_, RawInode> {
        match &self.delalloc {
            Some(d) if d.disk_size < self.raw.size() => {
                let mut r = self.raw.clone();
                r.set_size(d.disk_size);
                std::borrow::Cow::Owned(r)
            }
            _ => std::borrow::Cow::Borrowed(&self.raw),
        }
    }
}

pub struct Inode {
    pub ino: u32,
    pub io_lock: RwLock<()>,
    pub state: Mutex<InodeState>,
    /// Open file handles (FUSE open/release, library open/close).
    pub open_count: AtomicU32,
    /// Transaction id of the last change to this inode (for fsync: commit only if newer than
    /// the last committed).
    pub last_tid: AtomicU64,
    /// Transaction id of the last change that fdatasync must commit (size or mapping).
    pub last_data_tid: AtomicU64,
    /// The transaction whose lazy-inode list already holds this inode (overwrite path).
    pub lazy_tid: AtomicU64,
}

pub type InodeRef = Arc<Inode>;

const SHARDS: usize = 64;

/// The in-memory inodes, by number, in shards. Bounded: when a shard grows past its share of
/// the limit (`MountOptions::inode_cache_limit`), the next inode added to it (read from disk or
/// just allocated) first drops the inodes nothing needs in memory (see `evictable`); a later
/// `iget` reads them back.
pub struct InodeCache {
    shards: Vec<Mutex<Shard>>,
    shard_limit: usize,
    /// EA inodes read or made since the open, by value hash: the kernel's ea_inode mbcache,
    /// which new values equal to one of them share (xattr_inode.rs). A hint only: every
    /// candidate is checked before use.
    ea_by_hash: Mutex<HashMap<u32, Vec<u32>>>,
    /// Held (re-entrantly) from finding or making an EA inode for a value until the
    /// references are counted, and around every drop of references: a value shared from the
    /// cache cannot be freed by another thread's last release in between (the kernel's
    /// mbcache entry references).
    ea_serial: parking_lot::ReentrantMutex<()>,
}

pub(crate) struct Shard {
    pub(crate) map: HashMap<u32, InodeRef>,
    /// Size at which the next insert trims this shard.
    trim_at: usize,
}

impl InodeCache {
    pub fn new(limit: usize) -> Self {
        let shard_limit = (limit / SHARDS).max(1);
        InodeCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        trim_at: shard_limit,
                    })
                })
                .collect(),
            shard_limit,
            ea_by_hash: Mutex::new(HashMap::new()),
            ea_serial: parking_lot::ReentrantMutex::new(()),
        }
    }

    /// Serialises EA inode reference changes (see `ea_serial`).
    pub(crate) fn ea_serialize(&self) -> parking_lot::ReentrantMutexGuard<'_, ()> {
        self.ea_serial.lock()
    }

    /// Remembers EA inode `ino` as holding a value with hash `hash`.
    pub(crate) fn ea_remember(&self, hash: u32, ino: u32) {
        let mut m = self.ea_by_hash.lock();
        let v = m.entry(hash).or_default();
        if !v.contains(&ino) {
            v.push(ino);
        }
    }

    /// EA inodes remembered with value hash `hash`.
    pub(crate) fn ea_candidates(&self, hash: u32) -> Vec<u32> {
        self.ea_by_hash
            .lock()
            .get(&hash)
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets EA inode `ino` (freed).
    pub(crate) fn ea_forget(&self, ino: u32) {
        let mut m = self.ea_by_hash.lock();
        m.retain(|_, v| {
            v.retain(|&i| i != ino);
            !v.is_empty()
        });
    }
    pub(crate) fn shard(&self, ino: u32) -> &Mutex<Shard> {
        &self.shards[ino as usize % SHARDS]
    }
    pub fn get_cached(&self, ino: u32) -> Option<InodeRef> {
        self.shard(ino).lock().map.get(&ino).cloned()
    }
    /// Drops `ino` from the cache (with its group's lock held: see ialloc's free_inode).
    pub(crate) fn remove(&self, ino: u32) {
        self.shard(ino).lock().map.remove(&ino);
    }
    /// Caches a new inode (with its group's lock held: see ialloc's alloc_inode). `committed`:
    /// the last committed transaction.
    pub(crate) fn insert(&self, inode: InodeRef, committed: u64) {
        self.put(&mut self.shard(inode.ino).lock(), inode, committed);
    }
    /// Adds `inode` to its (locked) shard, first dropping what can go if the shard is full.
    pub(crate) fn put(&self, shard: &mut Shard, inode: InodeRef, committed: u64) {
        if shard.map.len() >= shard.trim_at {
            shard.map.retain(|_, i| !evictable(i, committed));
            // The next trim after as many inserts again as what stayed: a shard of inodes all
            // in use is not scanned on every insert.
            let kept = shard.map.len();
            shard.trim_at = kept + kept.max(self.shard_limit) / 2;
        }
        shard.map.insert(inode.ino, inode);
    }
    /// How many inodes are in memory.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

/// Whether a cached inode can leave memory and be read back from its table block later as
/// it is now: nobody holds or has it open, and nothing about it lives only in memory (no
/// change newer than the last commit, whose table block write and fsync bookkeeping a reload
/// would lose, an overwrite's lazily logged times included, as they raise `last_tid` too; no
/// buffered data; not an orphan; not being created). With the shard's lock
/// held, so that nobody can take a new reference meanwhile; the state is only tried, never
/// waited for (lock rank: the state mutex comes before the shard lock).
fn evictable(i: &InodeRef, committed: u64) -> bool {
    if Arc::strong_count(i) > 1
        || i.open_count.load(Ordering::Acquire) > 0
        || i.last_tid.load(Ordering::Acquire) > committed
        || i.last_data_tid.load(Ordering::Acquire) > committed
    {
        return false;
    }
    match i.state.try_lock() {
        Some(st) => !st.orphaned && !st.creating && st.delalloc.is_none(),
        None => false,
    }
}
