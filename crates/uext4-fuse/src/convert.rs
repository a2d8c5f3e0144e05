//! Translation between the engine's forms and FUSE's: inode numbers, times, attributes, and
//! errors (one mapping, [`errno`], over the engine's exhaustive `Error::errno`).

use crate::reply::WireAttr;
use uext4::S_IFMT;
use uext4::{Attr, Error, Timestamp};

/// The one mapping from engine errors to errno.
pub fn errno(e: &Error) -> i32 {
    e.errno()
}

/// The engine's inode number for FUSE's node id (FUSE's root 1 is ext4's root 2).
pub(crate) fn to_ext(nodeid: u64) -> u32 {
    match nodeid {
        1 => 2,
        x => x as u32,
    }
}

/// FUSE's node id for the engine's inode number.
pub(crate) fn to_fuse(ino: u32) -> u64 {
    if ino == 2 {
        1
    } else {
        ino as u64
    }
}

/// A time as the kernel sends it (seconds, negative before 1970; nanoseconds).
pub(crate) fn timestamp((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}

fn wire_time(t: Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// The file type bits the kernel is told: an inode whose type bits are none of the seven is
/// shown as a regular file.
pub(crate) fn file_type(mode: u16) -> u32 {
    match (mode & S_IFMT) as u32 {
        t @ (0o040000 | 0o120000 | 0o020000 | 0o060000 | 0o010000 | 0o140000 | 0o100000) => t,
        _ => 0o100000,
    }
}

/// The type bits of a directory entry's file type (EXT4_FT_*).
pub(crate) fn type_of_ft(ft: u8) -> u32 {
    match ft {
        2 => 0o040000,
        7 => 0o120000,
        3 => 0o020000,
        4 => 0o060000,
        5 => 0o010000,
        6 => 0o140000,
        _ => 0o100000,
    }
}

pub(crate) fn wire_attr(a: &Attr) -> WireAttr {
    WireAttr {
        ino: to_fuse(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: wire_time(a.atime),
        mtime: wire_time(a.mtime),
        ctime: wire_time(a.ctime),
        crtime: wire_time(a.crtime),
        mode: file_type(a.mode) | (a.mode & 0o7777) as u32,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.block_size,
    }
}

#[cfg(test)]
mod tests;
