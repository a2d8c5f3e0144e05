//! Notifications: messages the server sends the kernel unasked, to drop what it caches about
//! an inode or a name (include/uapi/linux/fuse.h, `enum fuse_notify_code`; fs/fuse/dev.c,
//! fuse_notify). They are written to /dev/fuse like replies, with `unique` 0 and the code in
//! the header's `error` field; they travel through /dev/fuse even when requests come by
//! io_uring.

use crate::abi::{NOTIFY_DELETE, NOTIFY_INVAL_ENTRY, NOTIFY_INVAL_INODE};
use crate::dev::send;
use crate::transport::{Notify, OutHeader, OUT_HEADER_LEN};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// The kernel's limit on a name in a notification (FUSE_NAME_MAX).
const NAME_MAX: usize = 1024;

/// Sends notifications on the connection's /dev/fuse descriptor.
#[derive(Clone)]
pub struct Notifier {
    dev: Arc<OwnedFd>,
}

impl Notifier {
    pub(crate) fn new(dev: Arc<OwnedFd>) -> Notifier {
        Notifier { dev }
    }

    /// Drops the kernel's cached attributes of `nodeid` (a FUSE node id: the root is 1) and,
    /// with `off` >= 0, its cached pages from `off` for `len` bytes (`len` <= 0: to the end).
    /// ENOENT when the kernel does not hold the inode.
    pub fn inval_inode(&self, nodeid: u64, off: i64, len: i64) -> io::Result<()> {
        // struct fuse_notify_inval_inode_out { u64 ino; s64 off; s64 len; }
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&nodeid.to_ne_bytes());
        b[8..16].copy_from_slice(&off.to_ne_bytes());
        b[16..24].copy_from_slice(&len.to_ne_bytes());
        self.notify(NOTIFY_INVAL_INODE, &[&b])
    }

    /// Drops the kernel's cached entry `name` in directory `parent`.
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        // struct fuse_notify_inval_entry_out { u64 parent; u32 namelen; u32 flags; }
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&parent.to_ne_bytes());
        b[8..12].copy_from_slice(&name_len(name)?.to_ne_bytes());
        self.notify(NOTIFY_INVAL_ENTRY, &[&b, name, b"\0"])
    }

    /// Tells the kernel that `name` in `parent`, which named `child`, was removed: the entry
    /// goes and, if the kernel holds `child`, so does that inode's link to it.
    pub fn delete(&self, parent: u64, child: u64, name: &[u8]) -> io::Result<()> {
        // struct fuse_notify_delete_out { u64 parent; u64 child; u32 namelen; u32 padding; }
        let mut b = [0u8; 24];
        b[0..8].copy_from_slice(&parent.to_ne_bytes());
        b[8..16].copy_from_slice(&child.to_ne_bytes());
        b[16..20].copy_from_slice(&name_len(name)?.to_ne_bytes());
        self.notify(NOTIFY_DELETE, &[&b, name, b"\0"])
    }

    fn notify(&self, code: i32, parts: &[&[u8]]) -> io::Result<()> {
        let len = OUT_HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let h = OutHeader {
            len: len as u32,
            error: code,
            unique: 0,
        }
        .to_bytes();
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&h);
        all.extend_from_slice(parts);
        send(&self.dev, &all)
    }
}

impl Notify for Notifier {
    fn inval_inode(&self, nodeid: u64, offset: i64, len: i64) -> io::Result<()> {
        Notifier::inval_inode(self, nodeid, offset, len)
    }

    fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        Notifier::inval_entry(self, parent, name)
    }

    fn delete(&self, parent: u64, child: u64, name: &[u8]) -> io::Result<()> {
        Notifier::delete(self, parent, child, name)
    }
}

fn name_len(name: &[u8]) -> io::Result<u32> {
    if name.len() > NAME_MAX || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(name.len() as u32)
}
