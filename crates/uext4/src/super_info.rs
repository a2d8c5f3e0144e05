//! Superblock state, as the kernel's `ext4_sb_info`: the in-memory superblock, the free block
//! and inode counters, whether the filesystem is read-only (and why), and the stop flag.
//!
//! The stop flag is an atomic read without a lock on every write path; the reason a
//! filesystem stopped sits behind a lock taken only when stopping and when reporting it.
//! [`encode_superblock`] is the one place a superblock is turned into bytes for writing.

use crate::error::{Error, Result};
use crate::format::superblock::{Superblock, SUPERBLOCK_SIZE};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The superblock's bytes as they go to the device: checksummed after every change.
pub fn encode_superblock(sb: &mut Superblock) -> Vec<u8> {
    sb.set_csum();
    sb.bytes().to_vec()
}

/// Where the superblock (byte 1024) lies for the buffer cache: block 1 with 1 KiB blocks,
/// inside block 0 otherwise. Returns (block, offset in it).
pub fn superblock_location(block_size: u32) -> (u64, usize) {
    if block_size == 1024 {
        (1, 0)
    } else {
        (0, 1024)
    }
}

/// The owner of the superblock and the filesystem-wide counters and flags.
pub struct SuperInfo {
    /// The in-memory superblock; the free counts live in the atomics below and are stored
    /// when it is encoded with them. A leaf lock.
    sb: Mutex<Superblock>,
    pub(crate) free_blocks: AtomicU64,
    pub(crate) free_inodes: AtomicU64,
    read_only: AtomicBool,
    /// Why the open was forced read-only, if it was.
    ro_reason: Option<String>,
    /// Set after a corruption error or a lost commit: no more writes.
    stopped: AtomicBool,
    /// The first reason it stopped (written once, before `stopped` is raised).
    stop_reason: Mutex<Option<String>>,
}

impl SuperInfo {
    pub fn new(
        sb: Superblock,
        free_blocks: u64,
        free_inodes: u64,
        read_only: bool,
        ro_reason: Option<String>,
    ) -> Self {
        SuperInfo {
            sb: Mutex::new(sb),
            free_blocks: AtomicU64::new(free_blocks),
            free_inodes: AtomicU64::new(free_inodes),
            read_only: AtomicBool::new(read_only),
            ro_reason,
            stopped: AtomicBool::new(false),
            stop_reason: Mutex::new(None),
        }
    }

    /// The in-memory superblock, locked.
    pub fn lock(&self) -> MutexGuard<'_, Superblock> {
        self.sb.lock()
    }

    /// Encodes the in-memory superblock for writing after `edit` changed it; `with_counts`
    /// first stores the current free block and inode counts in it.
    pub fn encode(&self, with_counts: bool, edit: impl FnOnce(&mut Superblock)) -> Vec<u8> {
        let mut sb = self.sb.lock();
        if with_counts {
            sb.set_free_blocks_count(self.free_blocks.load(Ordering::Relaxed));
            sb.set_free_inodes_count(self.free_inodes.load(Ordering::Relaxed) as u32);
        }
        edit(&mut sb);
        let bytes = encode_superblock(&mut sb);
        debug_assert_eq!(bytes.len(), SUPERBLOCK_SIZE);
        bytes
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }

    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    pub fn read_only_reason(&self) -> Option<&str> {
        self.ro_reason.as_deref()
    }

    /// Stops the filesystem writing (the first reason is kept).
    pub fn stop(&self, why: &str) {
        let mut s = self.stop_reason.lock();
        if s.is_none() {
            tracing::error!("filesystem stopped: {why}");
            *s = Some(why.to_string());
            self.stopped.store(true, Ordering::Release);
        }
    }

    /// Whether the filesystem stopped writing: one atomic load, no lock.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Why it stopped, if it did.
    pub fn stop_reason(&self) -> Option<String> {
        if !self.is_stopped() {
            return None;
        }
        self.stop_reason.lock().clone()
    }

    /// Fails if the filesystem may not be written. Lock-free unless it may not.
    pub fn check_writable(&self) -> Result<()> {
        if self.is_stopped() {
            if let Some(why) = self.stop_reason() {
                return Err(Error::Stopped(why));
            }
        }
        if self.is_read_only() {
            return Err(Error::ReadOnly(match &self.ro_reason {
                Some(r) => format!(" ({r})"),
                None => String::new(),
            }));
        }
        Ok(())
    }
}
