//! Decoding: a [`RawRequest`] to a typed [`Op`], one variant per opcode this server serves.
//! Fixed structs are read field by field at their offsets (abi.rs); names are the
//! NUL-terminated strings that follow them. A request too short for what its opcode carries
//! is refused with EINVAL rather than read past its end.

use crate::abi::{self, Fields};
use crate::transport::RawRequest;

/// A time in a SETATTR as the kernel sent it: seconds (negative before 1970), nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeArg {
    Now,
    At(i64, u32),
}

/// `fuse_setattr_in`, with only the fields its `valid` bits name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeArg>,
    pub mtime: Option<TimeArg>,
    pub ctime: Option<(i64, u32)>,
    /// FATTR_KILL_SUIDGID: the caller lacks CAP_FSETID (with HANDLE_KILLPRIV_V2).
    pub kill_suidgid: bool,
}

/// One request, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Init(abi::InitIn),
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    /// `fuse_forget_one` entries: (nodeid, nlookup) pairs, read with [`forgets`].
    BatchForget {
        entries: &'a [u8],
    },
    /// `fh` is the open file's when `getattr_flags` has FUSE_GETATTR_FH (the kernel asks on
    /// behalf of a descriptor: before a cached write, a read past the size, SEEK_END).
    Getattr {
        getattr_flags: u32,
        fh: u64,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release,
    Fsync {
        datasync: bool,
    },
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
    },
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush,
    Opendir {
        flags: u32,
    },
    Readdir {
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir,
    Fsyncdir {
        datasync: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a [u8],
        flags: u32,
        mode: u32,
        umask: u32,
    },
    Tmpfile {
        flags: u32,
        mode: u32,
        umask: u32,
    },
    Interrupt,
    /// `data`: the `in_size` bytes the caller's argument points to (what a setter passes).
    Ioctl {
        cmd: u32,
        flags: u32,
        out_size: u32,
        data: &'a [u8],
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    CopyFileRange {
        off_in: u64,
        nodeid_out: u64,
        off_out: u64,
        len: u64,
    },
    Syncfs,
    Statx {
        getattr_flags: u32,
        sx_flags: u32,
        sx_mask: u32,
    },
    /// An opcode this server does not serve (answered ENOSYS).
    Unknown(u32),
}

/// The (nodeid, nlookup) pairs of a BATCH_FORGET.
pub fn forgets(entries: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    entries.chunks_exact(abi::FORGET_ONE_LEN).map(|e| {
        let f = Fields(e);
        (f.u64(0), f.u64(8))
    })
}

/// Splits a NUL-terminated name off the front of `b`.
fn name(b: &[u8]) -> Result<(&[u8], &[u8]), i32> {
    let end = b.iter().position(|&c| c == 0).ok_or(libc::EINVAL)?;
    Ok((&b[..end], &b[end + 1..]))
}

impl<'a> Op<'a> {
    /// Decodes `req`; Err(errno) when it is shorter than its opcode needs.
    pub fn decode(req: &RawRequest<'a>) -> Result<Op<'a>, i32> {
        use abi::*;
        let op = req.header.opcode;
        // The struct's size as /dev/fuse lays it out (SETXATTR's short form reads the same
        // fields as the long one); INIT's grew with the protocol, and only its first two
        // fields are needed.
        let need = match op {
            INIT => 8,
            _ => crate::dev::fixed_len(op, false),
        };
        if req.fixed.len() < need {
            return Err(libc::EINVAL);
        }
        let f = Fields(req.fixed);
        // Request extensions (security context, supplementary groups) follow the arguments;
        // this server asks for none, but does not take them for a name or data.
        let ext = req.header.total_extlen as usize * 8;
        let rest = &req.rest[..req.rest.len().saturating_sub(ext)];
        Ok(match op {
            LOOKUP => Op::Lookup {
                name: name(rest)?.0,
            },
            BATCH_FORGET => {
                let n = (f.u32(0) as usize).saturating_mul(FORGET_ONE_LEN);
                Op::BatchForget {
                    entries: rest.get(..n).ok_or(libc::EINVAL)?,
                }
            }
            SYMLINK => {
                let (name, r) = name(rest)?;
                Op::Symlink {
                    name,
                    target: self::name(r)?.0,
                }
            }
            MKNOD => Op::Mknod {
                name: name(rest)?.0,
                mode: f.u32(0),
                rdev: f.u32(4),
                umask: f.u32(8),
            },
            MKDIR => Op::Mkdir {
                name: name(rest)?.0,
                mode: f.u32(0),
                umask: f.u32(4),
            },
            UNLINK => Op::Unlink {
                name: name(rest)?.0,
            },
            RMDIR => Op::Rmdir {
                name: name(rest)?.0,
            },
            RENAME | RENAME2 => {
                let (name, r) = name(rest)?;
                Op::Rename {
                    newdir: f.u64(0),
                    flags: if op == RENAME2 { f.u32(8) } else { 0 },
                    name,
                    newname: self::name(r)?.0,
                }
            }
            LINK => Op::Link {
                oldnodeid: f.u64(0),
                newname: name(rest)?.0,
            },
            IOCTL => Op::Ioctl {
                flags: f.u32(8),
                cmd: f.u32(12),
                out_size: f.u32(28),
                data: rest.get(..f.u32(24) as usize).ok_or(libc::EINVAL)?,
            },
            WRITE => {
                let size = f.u32(16) as usize;
                Op::Write {
                    offset: f.u64(8),
                    write_flags: f.u32(20),
                    data: rest.get(..size).ok_or(libc::EINVAL)?,
                }
            }
            SETXATTR => {
                let (name, r) = name(rest)?;
                let size = f.u32(0) as usize;
                Op::Setxattr {
                    name,
                    value: r.get(..size).ok_or(libc::EINVAL)?,
                    flags: f.u32(4),
                }
            }
            GETXATTR => Op::Getxattr {
                name: name(rest)?.0,
                size: f.u32(0),
            },
            REMOVEXATTR => Op::Removexattr {
                name: name(rest)?.0,
            },
            CREATE | TMPFILE => {
                let (flags, mode, umask) = (f.u32(0), f.u32(4), f.u32(8));
                if op == TMPFILE {
                    Op::Tmpfile { flags, mode, umask }
                } else {
                    Op::Create {
                        name: name(rest)?.0,
                        flags,
                        mode,
                        umask,
                    }
                }
            }
            other => plain(other, req.fixed),
        })
    }
}

/// An opcode whose arguments are all in its fixed struct (`f`).
fn plain(op: u32, f: &[u8]) -> Op<'_> {
    use abi::*;
    let fixed = f;
    let f = Fields(f);
    match op {
        INIT => Op::Init(InitIn::parse(fixed)),
        DESTROY => Op::Destroy,
        FORGET => Op::Forget { nlookup: f.u64(0) },
        GETATTR => Op::Getattr {
            getattr_flags: f.u32(0),
            fh: f.u64(8),
        },
        SETATTR => Op::Setattr(setattr(f)),
        READLINK => Op::Readlink,
        OPEN => Op::Open { flags: f.u32(0) },
        OPENDIR => Op::Opendir { flags: f.u32(0) },
        READ => Op::Read {
            offset: f.u64(8),
            size: f.u32(16),
        },
        READDIR | READDIRPLUS => Op::Readdir {
            offset: f.u64(8),
            size: f.u32(16),
            plus: op == READDIRPLUS,
        },
        STATFS => Op::Statfs,
        RELEASE => Op::Release,
        RELEASEDIR => Op::Releasedir,
        FSYNC | FSYNCDIR => {
            let datasync = f.u32(8) & FUSE_FSYNC_FDATASYNC != 0;
            if op == FSYNC {
                Op::Fsync { datasync }
            } else {
                Op::Fsyncdir { datasync }
            }
        }
        LISTXATTR => Op::Listxattr { size: f.u32(0) },
        FLUSH => Op::Flush,
        ACCESS => Op::Access { mask: f.u32(0) },
        INTERRUPT => Op::Interrupt,
        FALLOCATE => Op::Fallocate {
            offset: f.u64(8),
            length: f.u64(16),
            mode: f.u32(24),
        },
        LSEEK => Op::Lseek {
            offset: f.u64(8),
            whence: f.u32(16),
        },
        COPY_FILE_RANGE => Op::CopyFileRange {
            off_in: f.u64(8),
            nodeid_out: f.u64(16),
            off_out: f.u64(32),
            len: f.u64(40),
        },
        SYNCFS => Op::Syncfs,
        STATX => Op::Statx {
            getattr_flags: f.u32(0),
            sx_flags: f.u32(16),
            sx_mask: f.u32(20),
        },

        other => Op::Unknown(other),
    }
}

/// `fuse_setattr_in`: valid 0, fh 8, size 16, lock_owner 24, atime 32, mtime 40, ctime 48,
/// atimensec 56, mtimensec 60, ctimensec 64, mode 68, uid 76, gid 80.
fn setattr(f: Fields<'_>) -> SetattrIn {
    use abi::*;
    let valid = f.u32(0);
    let has = |bit: u32| valid & bit != 0;
    let time = |set: u32, now: u32, sec: usize, nsec: usize| {
        if has(now) {
            Some(TimeArg::Now)
        } else if has(set) {
            Some(TimeArg::At(f.u64(sec) as i64, f.u32(nsec)))
        } else {
            None
        }
    };
    SetattrIn {
        mode: has(FATTR_MODE).then(|| f.u32(68)),
        uid: has(FATTR_UID).then(|| f.u32(76)),
        gid: has(FATTR_GID).then(|| f.u32(80)),
        size: has(FATTR_SIZE).then(|| f.u64(16)),
        atime: time(FATTR_ATIME, FATTR_ATIME_NOW, 32, 56),
        mtime: time(FATTR_MTIME, FATTR_MTIME_NOW, 40, 60),
        ctime: has(FATTR_CTIME).then(|| (f.u64(48) as i64, f.u32(64))),
        kill_suidgid: has(FATTR_KILL_SUIDGID),
    }
}

#[cfg(test)]
mod tests;
