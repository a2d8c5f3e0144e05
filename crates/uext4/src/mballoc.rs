//! The block allocator's state, as the kernel's mballoc keeps it per filesystem: the block
//! groups (descriptor and allocation lock each), where each group's bitmaps and inode table
//! are, the system zone no file may map, blocks freed by transactions not yet home, and the
//! rotor that spreads new directories. The allocation operations (balloc.rs, ialloc.rs) take
//! their locks through it; a buffered writeback's reservation comes to them as a [`Claim`].

use crate::bcache::BufferCache;
use crate::block_validity::SystemZone;
use crate::error::{Corruption, Error, Result};
use crate::format::group_desc::GroupDesc;
use crate::geometry::Geometry;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Per-group state. The mutex around it is the group's allocation lock.
pub struct GroupState {
    pub desc: GroupDesc,
    /// The block bitmap read from disk was found to cover the system blocks in the group
    /// (`Fs::validate_block_bitmap`): checked once per mount.
    pub bitmap_valid: std::sync::atomic::AtomicBool,
}

/// Blocks freed by transactions not yet home: start -> (length, tid). Not reused until their
/// transaction's blocks are home (the journal's checkpointer releases them). Shared with the
/// checkpointer's hooks; a leaf lock.
#[derive(Clone, Default)]
pub struct PendingFrees(Arc<Mutex<BTreeMap<u64, (u64, u64)>>>);

impl PendingFrees {
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, (u64, u64)>> {
        self.0.lock()
    }

    /// Holds back `len` blocks from `start`, freed by transaction `tid`.
    pub fn insert(&self, start: u64, len: u64, tid: u64) {
        self.0.lock().insert(start, (len, tid));
    }

    /// Whether any freed block is held back.
    pub fn has_any(&self) -> bool {
        !self.0.lock().is_empty()
    }

    /// Lets go of what transactions up to `tid` freed.
    pub fn release(&self, tid: u64) {
        self.0.lock().retain(|_, (_, t)| *t > tid);
    }

    /// The first held-back range overlapping `[blk, blk+len)`, as (start, end). The ranges
    /// are disjoint (a block is freed once until reused).
    pub fn first_overlap(&self, blk: u64, len: u64) -> Option<(u64, u64)> {
        let p = self.0.lock();
        if p.is_empty() || len == 0 {
            return None;
        }
        if let Some((&s, &(l, _))) = p.range(..=blk).next_back() {
            if s + l > blk {
                return Some((s, s + l));
            }
        }
        p.range(blk + 1..blk + len)
            .next()
            .map(|(&s, &(l, _))| (s, s + l))
    }
}

/// A buffered-mode writeback run's space reservation, passed down its allocations (the
/// caller's explicit value, as the kernel's delalloc reservation is claimed when the blocks
/// are allocated): they may use reserved blocks, and each takes what it allocates out of the
/// run's budget and the filesystem-wide reserved count (`pool`) at once, so the free blocks
/// are not counted short by the run twice until it is done.
pub struct Claim {
    /// Reserved blocks of the run not claimed yet.
    left: AtomicU64,
    /// Reserved blocks the run's allocations have claimed.
    claimed: AtomicU64,
    /// The filesystem-wide count of reserved blocks.
    pool: Arc<AtomicU64>,
}

impl Claim {
    pub fn new(budget: u64, pool: Arc<AtomicU64>) -> Self {
        Claim {
            left: AtomicU64::new(budget),
            claimed: AtomicU64::new(0),
            pool,
        }
    }

    /// `n` blocks were allocated for the run.
    pub fn take(&self, n: u64) {
        let left = self.left.load(Ordering::Relaxed);
        let take = left.min(n);
        if take > 0 {
            self.left.store(left - take, Ordering::Relaxed);
            self.claimed.fetch_add(take, Ordering::Relaxed);
            self.pool.fetch_sub(take, Ordering::Relaxed);
        }
    }

    /// Reserved blocks claimed so far.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }
}

/// The block allocator's state (see the module comment).
pub struct BlockAllocator {
    /// Per group: the descriptor, behind the group's allocation lock (rank 6, ascending).
    pub groups: Vec<Mutex<GroupState>>,
    /// Where each group's block bitmap, inode bitmap and inode table are, as read at open
    /// (nothing moves them: no resize). Read without the group locks, so that a group can
    /// build its first block bitmap, which must mark every table flex_bg placed in it, while
    /// holding only its own lock (lock rank 6 takes group locks in ascending order only).
    pub tables: Vec<[u64; 3]>,
    /// The blocks of the filesystem's own structures, which no file may map
    /// (block_validity.rs); the journal's are added once it is loaded.
    pub system_zone: RwLock<SystemZone>,
    /// Blocks freed by transactions not yet home.
    pub pending_free: PendingFrees,
    /// Rotor for spreading new directories over groups.
    pub dir_rotor: AtomicU64,
}

impl BlockAllocator {
    /// Reads and checks every group descriptor. Returns the allocator and the free block and
    /// inode counts the descriptors add up to.
    pub fn load(geo: &Geometry, bcache: &BufferCache) -> Result<(BlockAllocator, u64, u64)> {
        let mut groups = Vec::with_capacity(geo.group_count as usize);
        let mut tables = Vec::with_capacity(geo.group_count as usize);
        let mut free_blocks = 0u64;
        let mut free_inodes = 0u64;
        for g in 0..geo.group_count {
            let blk = geo.gdt_block_of(g);
            let buf = bcache.get(blk)?;
            let data = buf.read();
            let off = (g % geo.descs_per_block) as usize * geo.desc_size as usize;
            let desc = GroupDesc::from_bytes(&data[off..off + geo.desc_size.min(64) as usize]);
            drop(data);
            if !desc.verify_csum(geo.gd_csum, g) {
                return Err(Error::bad_checksum(
                    Corruption::GroupDescriptor,
                    format!("group descriptor {g} (in block {blk})"),
                ));
            }
            check_desc(geo, g, &desc)?;
            // Descriptors count free clusters.
            free_blocks += desc.free_blocks_count() << geo.cluster_bits;
            free_inodes += desc.free_inodes_count();
            tables.push([desc.block_bitmap(), desc.inode_bitmap(), desc.inode_table()]);
            groups.push(Mutex::new(GroupState {
                desc,
                bitmap_valid: AtomicBool::new(false),
            }));
        }
        let system_zone = RwLock::new(SystemZone::new(geo, &tables));
        let balloc = BlockAllocator {
            groups,
            tables,
            system_zone,
            pending_free: PendingFrees::default(),
            dir_rotor: AtomicU64::new(0),
        };
        Ok((balloc, free_blocks, free_inodes))
    }

    /// The first range of blocks freed by a transaction not yet home that overlaps
    /// `[blk, blk+len)`, as (start, end); such blocks are free in the bitmap but must not be
    /// reused yet.
    pub fn pending_overlap(&self, blk: u64, len: u64) -> Option<(u64, u64)> {
        self.pending_free.first_overlap(blk, len)
    }
}

fn check_desc(geo: &Geometry, g: u32, d: &GroupDesc) -> Result<()> {
    let itb = (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size as u64);
    // In 64 bits a damaged descriptor can name a block near 2^64: the end is checked, not
    // summed into a wrap.
    let in_fs = |b: u64, n: u64| {
        b > geo.first_data_block && b.checked_add(n).is_some_and(|end| end <= geo.blocks_count)
    };
    if !in_fs(d.block_bitmap(), 1) {
        return Err(Error::corrupt(
            Corruption::GroupDescriptor,
            format!(
                "group {g}: block bitmap at block {} is outside the filesystem",
                d.block_bitmap()
            ),
        ));
    }
    if !in_fs(d.inode_bitmap(), 1) {
        return Err(Error::corrupt(
            Corruption::GroupDescriptor,
            format!(
                "group {g}: inode bitmap at block {} is outside the filesystem",
                d.inode_bitmap()
            ),
        ));
    }
    if !in_fs(d.inode_table(), itb) {
        return Err(Error::corrupt(
            Corruption::GroupDescriptor,
            format!(
                "group {g}: inode table at block {} is outside the filesystem",
                d.inode_table()
            ),
        ));
    }
    if d.free_blocks_count() > geo.blocks_per_group as u64 {
        return Err(Error::corrupt(
            Corruption::GroupDescriptor,
            format!(
                "group {g}: free block count {} exceeds blocks per group",
                d.free_blocks_count()
            ),
        ));
    }
    if d.free_inodes_count() > geo.inodes_per_group as u64 {
        return Err(Error::corrupt(
            Corruption::GroupDescriptor,
            format!(
                "group {g}: free inode count {} exceeds inodes per group",
                d.free_inodes_count()
            ),
        ));
    }
    Ok(())
}
