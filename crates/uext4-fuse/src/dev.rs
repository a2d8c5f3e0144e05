//! The /dev/fuse transport (fs/fuse/dev.c): each loop thread reads whole requests from its
//! own descriptor (a clone of the session's, FUSE_DEV_IOC_CLONE, so the kernel keeps a
//! processing queue per thread), hands them to [`Serve`], and writes the reply with one
//! `writev` of header and body. A read failing with ENODEV means the mount is gone: the
//! thread ends.

use crate::abi;
use crate::transport::{Answer, InHeader, RawRequest, Serve, Transport};
use crate::transport::{OutHeader, IN_HEADER_LEN, OUT_HEADER_LEN};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// FUSE_DEV_IOC_CLONE: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// The length of the fixed argument struct the kernel puts before names and data, per opcode
/// (include/uapi/linux/fuse.h; 0 for opcodes without one, or not known here). SETXATTR's is
/// the long form (16 bytes) once FUSE_SETXATTR_EXT was agreed; INIT's grew with the protocol
/// (a request may hold less of it).
pub(crate) fn fixed_len(opcode: u32, setxattr_ext: bool) -> usize {
    use abi::*;
    match opcode {
        SETXATTR if setxattr_ext => 16,
        FORGET | OPEN | OPENDIR | MKDIR | RENAME | LINK | GETXATTR | LISTXATTR | SETXATTR
        | ACCESS | INTERRUPT | SYNCFS | BATCH_FORGET => 8,
        GETATTR | MKNOD | CREATE | TMPFILE | FSYNC | FSYNCDIR | RENAME2 | BMAP => 16,
        RELEASE | RELEASEDIR | FLUSH | LSEEK | STATX | POLL => 24,
        FALLOCATE | IOCTL => 32,
        READ | READDIR | READDIRPLUS | WRITE | NOTIFY_REPLY | SETUPMAPPING => 40,
        GETLK | SETLK | SETLKW => 48,
        // COPY_FILE_RANGE and COPY_FILE_RANGE_64 (53).
        COPY_FILE_RANGE | 53 => 56,
        SETATTR => 88,
        REMOVEMAPPING => 4,
        INIT => INIT_IN_LEN,
        _ => 0,
    }
}

/// Splits one request read from /dev/fuse (`b` is exactly what the read returned) into its
/// header, fixed arguments and the rest; None when it is shorter than its header says.
pub(crate) fn split(b: &[u8], setxattr_ext: bool) -> Option<RawRequest<'_>> {
    let header = InHeader::parse(b)?;
    let len = header.len as usize;
    if len < IN_HEADER_LEN || len > b.len() {
        return None;
    }
    let args = &b[IN_HEADER_LEN..len];
    let f = fixed_len(header.opcode, setxattr_ext).min(args.len());
    Some(RawRequest {
        header,
        fixed: &args[..f],
        rest: &args[f..],
    })
}

/// Writes one message (a reply or a notification, at most 4 parts) with a single `writev`:
/// the kernel takes a message only whole.
pub(crate) fn send(fd: &OwnedFd, parts: &[&[u8]]) -> io::Result<()> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 4];
    if parts.len() > iov.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (v, p) in iov.iter_mut().zip(parts) {
        v.iov_base = p.as_ptr() as *mut libc::c_void;
        v.iov_len = p.len();
    }
    let n = parts.len();
    loop {
        // SAFETY: the first `n` iovecs point into slices that outlive the call.
        let r = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), n as i32) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Sends the reply to request `unique`: `body`, or an errno (one the kernel accepts: 1..999).
pub(crate) fn reply(fd: &OwnedFd, unique: u64, body: Result<&[u8], i32>) -> io::Result<()> {
    let (error, body) = match body {
        Ok(b) => (0, b),
        Err(e) if (1..1000).contains(&e) => (-e, &[][..]),
        Err(_) => (-libc::EIO, &[][..]),
    };
    let h = OutHeader {
        len: (OUT_HEADER_LEN + body.len()) as u32,
        error,
        unique,
    }
    .to_bytes();
    send(fd, &[&h, body])
}

/// A copy of the session's descriptor that the kernel gives its own processing queue.
pub(crate) fn clone_dev(session: &OwnedFd) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new("/dev/fuse").expect("no NUL");
    // SAFETY: a valid path; the descriptor returned is checked before it is owned.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own.
    let new = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut src = session.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads a u32 descriptor number from the pointer.
    if unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut src) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(new)
}

/// Reads one request into `buf`. EINTR, and ENOENT (the request was interrupted while it was
/// being copied), are retried; ENODEV (unmounted) is returned.
pub(crate) fn read_request(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR | libc::ENOENT | libc::EAGAIN) => continue,
            _ => return Err(e),
        }
    }
}

/// What INIT agreed on, as far as the transports care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// The largest WRITE's data.
    pub max_write: u32,
    /// The largest READ is `max_pages` pages.
    pub max_pages: u16,
    /// The INIT flags both sides agreed on (`flags | flags2 << 32`).
    pub flags: u64,
}

impl Agreed {
    /// The read buffer a loop thread needs: the header, the largest fixed struct, then the
    /// larger of a WRITE's data and an extended attribute's value with its name.
    pub fn read_buf_len(&self) -> usize {
        IN_HEADER_LEN + 128 + (self.max_write as usize).max(128 << 10) + 4096
    }

    /// The reply buffer: the larger of a READ's data and a WRITE's (what [`Serve`] promises),
    /// and room for directory listings and headers.
    pub fn out_buf_len(&self) -> usize {
        (self.max_write as usize).max(self.max_pages as usize * 4096) + 4096
    }
}

/// One loop thread's descriptor, as the transport its requests came by: the kernel takes a
/// reply only on the descriptor its request was read from.
pub(crate) struct DevChannel {
    pub(crate) fd: Arc<OwnedFd>,
}

impl Transport for DevChannel {
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> io::Result<()> {
        reply(&self.fd, unique, body)
    }
}

/// Serves requests read from `fd` until the mount is gone.
pub(crate) fn serve_loop(
    fd: Arc<OwnedFd>,
    serve: Arc<dyn Serve>,
    agreed: Agreed,
) -> io::Result<()> {
    let from: Arc<dyn Transport> = Arc::new(DevChannel { fd: fd.clone() });
    let ext = agreed.flags & abi::FUSE_SETXATTR_EXT != 0;
    let mut inbuf = vec![0u8; agreed.read_buf_len()];
    let mut out = vec![0u8; agreed.out_buf_len()];
    loop {
        let n = match read_request(&fd, &mut inbuf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(req) = split(&inbuf[..n], ext) else {
            tracing::warn!("/dev/fuse: a request of {n} bytes shorter than its header says");
            continue;
        };
        // A handler that panics fails its request (EIO) rather than leave its caller waiting
        // forever with one loop thread fewer; errors=panic stops the process in its hook
        // before this.
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve.serve(&req, &mut out, &from)
        }))
        .unwrap_or_else(|_| {
            tracing::error!(
                "opcode {}: the handler panicked; answered EIO",
                req.header.opcode
            );
            Answer::Error(libc::EIO)
        });
        answer_request(&fd, &req.header, answer, &out);
    }
}

/// Sends what the handler answered. A reply the kernel no longer waits for (the request was
/// interrupted, or the connection is going) is dropped; one it refuses is a bug, logged.
pub(crate) fn answer_request(fd: &OwnedFd, h: &InHeader, answer: Answer, out: &[u8]) {
    if matches!(h.opcode, abi::FORGET | abi::BATCH_FORGET | abi::INTERRUPT) {
        return;
    }
    let r = match answer {
        Answer::None => return,
        Answer::Reply(n) if n <= out.len() => reply(fd, h.unique, Ok(&out[..n])),
        Answer::Reply(n) => {
            tracing::error!(
                "opcode {}: a reply of {n} bytes, beyond the buffer",
                h.opcode
            );
            reply(fd, h.unique, Err(libc::EIO))
        }
        Answer::Error(e) => reply(fd, h.unique, Err(e)),
    };
    match r {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {}
        Err(e) => tracing::error!("/dev/fuse: reply to opcode {}: {e}", h.opcode),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_split_at_their_fixed_struct() {
        let mut b = vec![0u8; IN_HEADER_LEN + 40 + 5];
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[4..8].copy_from_slice(&16u32.to_ne_bytes()); // WRITE
        b[8..16].copy_from_slice(&7u64.to_ne_bytes());
        b[IN_HEADER_LEN + 40..].copy_from_slice(b"hello");
        let r = split(&b, true).unwrap();
        assert_eq!((r.header.opcode, r.header.unique), (16, 7));
        assert_eq!((r.fixed.len(), r.rest), (40, &b"hello"[..]));
        // LOOKUP: the name only.
        b[4..8].copy_from_slice(&1u32.to_ne_bytes());
        let r = split(&b, true).unwrap();
        assert_eq!((r.fixed.len(), r.rest.len()), (0, 45));
        // SETXATTR's struct depends on FUSE_SETXATTR_EXT.
        b[4..8].copy_from_slice(&21u32.to_ne_bytes());
        assert_eq!(split(&b, true).unwrap().fixed.len(), 16);
        assert_eq!(split(&b, false).unwrap().fixed.len(), 8);
        // INIT: as much of fuse_init_in as there is.
        b[4..8].copy_from_slice(&26u32.to_ne_bytes());
        assert_eq!(split(&b, false).unwrap().fixed.len(), 45);
        assert_eq!(fixed_len(26, false), 64);
        // A header claiming more than was read.
        assert!(split(&b[..50], true).is_none());
    }
}
