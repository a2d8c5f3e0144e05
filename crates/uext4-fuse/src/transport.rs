//! What every transport hands the request handler, and what it takes back.
//!
//! A FUSE request reaches the server by one of two transports: a `read` of /dev/fuse
//! (fs/fuse/dev.c), where the whole request (header, the opcode's fixed arguments, then names
//! and data) lies in one buffer, or a FUSE-over-io_uring ring entry (fs/fuse/dev_uring.c),
//! where the header, the fixed arguments (`op_in`) and the rest (the payload) lie in three
//! places. [`RawRequest`] is the same view of both: the handler decodes the opcode's fixed
//! struct from `fixed` and its names and data from `rest`, never caring where they came from.
//! The reply is the same both ways: the handler writes its body into memory the transport
//! owns (the ring entry's payload, or the thread's write buffer) and says how it ended
//! ([`Answer`]); the transport adds the `fuse_out_header` and sends it.

use std::sync::Arc;

/// `struct fuse_in_header` (include/uapi/linux/fuse.h), 40 bytes on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct InHeader {
    /// The whole request's length in bytes, header included (/dev/fuse only; 0 in a ring).
    pub len: u32,
    /// FUSE_LOOKUP, FUSE_GETATTR, ...
    pub opcode: u32,
    /// The request's id, echoed in its reply.
    pub unique: u64,
    /// The inode the request is about (FUSE's numbering: the root is 1).
    pub nodeid: u64,
    /// The caller's filesystem user id.
    pub uid: u32,
    /// The caller's filesystem group id.
    pub gid: u32,
    /// The caller's thread group id (0 for requests the kernel makes on its own).
    pub pid: u32,
    /// Length of the extensions after the arguments, in units of 8 bytes.
    pub total_extlen: u16,
    /// Unused.
    pub padding: u16,
}

/// Size of [`InHeader`] on the wire.
pub const IN_HEADER_LEN: usize = 40;

/// `struct fuse_out_header`, 16 bytes on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct OutHeader {
    /// The whole reply's length in bytes, header included.
    pub len: u32,
    /// 0, or a negated errno.
    pub error: i32,
    /// The request's id.
    pub unique: u64,
}

/// Size of [`OutHeader`] on the wire.
pub const OUT_HEADER_LEN: usize = 16;

const _: () = assert!(std::mem::size_of::<InHeader>() == IN_HEADER_LEN);
const _: () = assert!(std::mem::size_of::<OutHeader>() == OUT_HEADER_LEN);

impl InHeader {
    /// Reads a header from the first [`IN_HEADER_LEN`] bytes of `b` (native byte order, as the
    /// kernel writes it); None when `b` is shorter.
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        let b = b.get(..IN_HEADER_LEN)?;
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let u16_at = |o: usize| u16::from_ne_bytes(b[o..o + 2].try_into().unwrap());
        Some(InHeader {
            len: u32_at(0),
            opcode: u32_at(4),
            unique: u64_at(8),
            nodeid: u64_at(16),
            uid: u32_at(24),
            gid: u32_at(28),
            pid: u32_at(32),
            total_extlen: u16_at(36),
            padding: u16_at(38),
        })
    }
}

impl OutHeader {
    /// The header's wire bytes (native byte order).
    pub fn to_bytes(&self) -> [u8; OUT_HEADER_LEN] {
        let mut b = [0u8; OUT_HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_ne_bytes());
        b[4..8].copy_from_slice(&self.error.to_ne_bytes());
        b[8..16].copy_from_slice(&self.unique.to_ne_bytes());
        b
    }
}

/// One request as a transport received it.
#[derive(Debug)]
pub struct RawRequest<'a> {
    /// The request's header.
    pub header: InHeader,
    /// The opcode's fixed argument struct (`fuse_read_in`, `fuse_setattr_in`, ...). It may be
    /// longer than the struct (a ring's `op_in` area is 128 bytes); it is empty for opcodes
    /// without one (LOOKUP, UNLINK, READLINK, ...).
    pub fixed: &'a [u8],
    /// What follows the fixed struct: NUL-terminated names, written data, xattr values.
    pub rest: &'a [u8],
}

/// How the handler ended a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Success: the reply's body is the first `n` bytes of the output buffer.
    Reply(usize),
    /// Failure with this (positive) errno; no body.
    Error(i32),
    /// No reply is sent (FORGET, BATCH_FORGET, INTERRUPT), or the handler kept the request
    /// to answer later through [`Transport::reply_later`].
    None,
}

/// Serves requests: the protocol decoding and the filesystem behind it.
pub trait Serve: Send + Sync {
    /// Serves one request, writing the reply body (if any) into `out`, which holds at least
    /// `max_write + 4096` bytes. `from` is the transport the request came by: a request kept
    /// for later ([`Answer::None`]) is answered through it, since a request read from
    /// /dev/fuse cannot be answered in a ring entry, nor the other way round, and both may
    /// serve the same mount (requests sent before the ring is ready come by /dev/fuse).
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], from: &Arc<dyn Transport>) -> Answer;

    /// Called once by the session, after the INIT reply was sent and before any other request
    /// is served: what the handler may use beyond replies.
    fn started(&self, _link: Link) {}

    /// Called once by the session when the connection has ended (every loop thread is done):
    /// the handler makes everything durable. The kernel sends FUSE_DESTROY only to fuseblk
    /// servers, so this is where an ordinary mount's server learns that it is over.
    fn ended(&self) {}
}

/// What the session hands the handler once the connection is up.
#[derive(Clone)]
pub struct Link {
    /// Tells the kernel about changes it did not ask for.
    pub notifier: Arc<dyn Notify>,
}

/// What a transport offers the handler beyond the request/reply loop.
pub trait Transport: Send + Sync {
    /// Sends a reply for a request the handler answered [`Answer::None`] to and kept
    /// (a deferred fsync in a group commit, say): `body` is the reply's body, or an errno.
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> std::io::Result<()>;
}

/// Notifications the server sends the kernel unasked (FUSE_NOTIFY_*, written on /dev/fuse
/// whichever transport serves requests).
pub trait Notify: Send + Sync {
    /// FUSE_NOTIFY_INVAL_INODE: the kernel drops its cached attributes of `nodeid` (FUSE's
    /// numbering) and its cached data from `offset` for `len` bytes (a negative `offset`
    /// drops no data; `len` 0 means to the end).
    fn inval_inode(&self, nodeid: u64, offset: i64, len: i64) -> std::io::Result<()>;

    /// FUSE_NOTIFY_INVAL_ENTRY: the kernel drops its cached entry `name` in `parent`.
    fn inval_entry(&self, _parent: u64, _name: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }

    /// FUSE_NOTIFY_DELETE: `name` in `parent`, which named `child`, is gone.
    fn delete(&self, _parent: u64, _child: u64, _name: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }
}
