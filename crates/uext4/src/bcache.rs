//! The buffer cache: metadata blocks in memory, shared by every thread.
//!
//! A [`Buffer`] is one block. Readers take its lock shared; a writer takes it exclusively, changes
//! the bytes, and then tells its transaction handle (`Handle::dirty`) so the block is logged and
//! written back. Data blocks never pass through here (they go straight to the device).
//!
//! Locking: each shard's map is a `Mutex` held only for the lookup; the block's bytes have their
//! own `RwLock`. Rank: buffer locks are taken after inode locks and group locks, and a thread
//! holds at most one buffer's write lock while it takes another buffer's (always in ascending
//! block order when it takes two at once).

use crate::blockdev::BlockDevice;
use crate::error::{Corruption, Error, Result};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

const SHARDS: usize = 64;

pub struct Buffer {
    pub blk: u64,
    data: RwLock<Box<[u8]>>,
    /// Set while the block is in a transaction that has not reached its home location.
    pub(crate) dirty: AtomicBool,
    /// The directory whose leaf checksum the bytes were last found (or made) to match; 0 for
    /// none. Any write clears it, so a lookup need not check the same bytes again.
    checked: AtomicU32,
}

impl Buffer {
    fn new(blk: u64, data: Box<[u8]>) -> Buffer {
        Buffer {
            blk,
            data: RwLock::new(data),
            dirty: AtomicBool::new(false),
            checked: AtomicU32::new(0),
        }
    }
    pub fn read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.data.read()
    }
    /// Exclusive access to the bytes. Call `Handle::dirty` after changing them.
    pub fn write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        let g = self.data.write();
        self.checked.store(0, Ordering::Relaxed);
        g
    }
    /// Whether the bytes are a leaf of directory `dir` with a matching checksum, as last seen
    /// (call with the bytes' lock held).
    pub(crate) fn checked_for(&self, dir: u32) -> bool {
        self.checked.load(Ordering::Relaxed) == dir
    }
    /// Records that the bytes are a leaf of `dir` with a matching checksum (call with the
    /// bytes' lock held, after any change under it).
    pub(crate) fn set_checked(&self, dir: u32) {
        self.checked.store(dir, Ordering::Relaxed);
    }
}

pub struct BufferCache {
    dev: Arc<dyn BlockDevice>,
    block_size: usize,
    blocks_count: u64,
    shards: Vec<Mutex<HashMap<u64, Arc<Buffer>>>>,
    /// Soft limit on cached blocks per shard: clean, unreferenced blocks above it are dropped.
    per_shard_limit: usize,
}

impl BufferCache {
    /// A cache of the device's blocks; clean blocks beyond about `limit_bytes` are dropped.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        block_size: usize,
        blocks_count: u64,
        limit_bytes: usize,
    ) -> Self {
        BufferCache {
            dev,
            block_size,
            blocks_count,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard_limit: (limit_bytes / block_size / SHARDS).max(4),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn shard(&self, blk: u64) -> &Mutex<HashMap<u64, Arc<Buffer>>> {
        &self.shards[(blk as usize ^ (blk >> 17) as usize) % SHARDS]
    }

    fn check_range(&self, blk: u64) -> Result<()> {
        if blk >= self.blocks_count {
            return Err(Error::corrupt(
                Corruption::BlockReference,
                format!(
                    "block {blk} is past the end of the filesystem ({} blocks)",
                    self.blocks_count
                ),
            ));
        }
        Ok(())
    }

    /// The cached block, reading it from the device on a miss.
    pub fn get(&self, blk: u64) -> Result<Arc<Buffer>> {
        self.check_range(blk)?;
        if let Some(b) = self.shard(blk).lock().get(&blk) {
            return Ok(b.clone());
        }
        let mut data = vec![0u8; self.block_size].into_boxed_slice();
        self.dev.read_at(blk * self.block_size as u64, &mut data)?;
        Ok(self.insert(blk, data))
    }

    /// A block whose old contents do not matter (newly allocated metadata): zeroed, not read.
    pub fn get_new(&self, blk: u64) -> Result<Arc<Buffer>> {
        self.check_range(blk)?;
        let mut shard = self.shard(blk).lock();
        if let Some(b) = shard.get(&blk).cloned() {
            // Only a damaged image allocates a block still cached; its holder may have it
            // locked while it waits for this shard, so the shard is let go before the lock.
            drop(shard);
            b.write().fill(0);
            return Ok(b);
        }
        let b = Arc::new(Buffer::new(
            blk,
            vec![0u8; self.block_size].into_boxed_slice(),
        ));
        shard.insert(blk, b.clone());
        Ok(b)
    }

    fn insert(&self, blk: u64, data: Box<[u8]>) -> Arc<Buffer> {
        let mut shard = self.shard(blk).lock();
        if let Some(b) = shard.get(&blk) {
            // Another thread read it first: theirs may already be modified, keep it.
            return b.clone();
        }
        if shard.len() >= self.per_shard_limit {
            shard.retain(|_, b| Arc::strong_count(b) > 1 || b.dirty.load(Ordering::Acquire));
        }
        let b = Arc::new(Buffer::new(blk, data));
        shard.insert(blk, b.clone());
        b
    }

    /// Drops a block from the cache (it was freed, or its contents are being replaced from the
    /// device by journal recovery).
    pub fn forget(&self, blk: u64) {
        self.shard(blk).lock().remove(&blk);
    }
}

impl BufferCache {
    /// Clears `blk`'s dirty mark: its transaction is committed and no later one has changed
    /// it (the transaction layer decides that; this cache knows nothing of transactions).
    pub fn mark_clean(&self, blk: u64) {
        if let Some(b) = self.shard(blk).lock().get(&blk) {
            b.dirty.store(false, Ordering::Release);
        }
    }
}
