//! Translation between the engine's forms and FUSE's: inode numbers, times, file types,
//! attributes, and errors (one mapping, [`errno`], over the engine's exhaustive
//! `Error::errno`).

use fuser::{Errno, FileAttr, FileType, INodeNo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uext4::{Attr, Error};
use uext4::{Timestamp, S_IFMT};

/// The one mapping from engine errors to errno.
pub fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

pub(crate) fn to_ext(ino: INodeNo) -> u32 {
    match ino.0 {
        1 => 2,
        x => x as u32,
    }
}

pub(crate) fn to_fuse(ino: u32) -> INodeNo {
    INodeNo(if ino == 2 { 1 } else { ino as u64 })
}

pub(crate) fn systime(t: Timestamp) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs((-t.sec) as u64) + Duration::from_nanos(t.nsec as u64)
    }
}

/// A time the kernel sent in a SETATTR, as fuser 0.17 hands it over. The kernel sends
/// seconds and nanoseconds (-2, 250000000 for -1.75 s); fuser builds a time before the epoch
/// as the epoch minus both (-2.25 s: its `system_time_from_time`, marked TODO there), so
/// `touch -d '1960-01-01 00:00:00.25'` stored 23:59:59.75 the day before. Both are taken back
/// here as the kernel sent them. (Replies convert correctly: `systime`.) The mount test
/// `times_before_1970_and_out_of_range_as_the_kernel` catches a fuser that changes this.
pub(crate) fn setattr_time(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => timestamp(t),
        Err(e) => Timestamp {
            sec: -(e.duration().as_secs() as i64),
            nsec: e.duration().subsec_nanos(),
        },
    }
}

pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                Timestamp { sec: -s, nsec: 0 }
            } else {
                Timestamp {
                    sec: -s - 1,
                    nsec: 1_000_000_000 - n,
                }
            }
        }
    }
}

pub(crate) fn kind_of(mode: u16) -> FileType {
    match mode & S_IFMT {
        0o040000 => FileType::Directory,
        0o120000 => FileType::Symlink,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o010000 => FileType::NamedPipe,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn kind_of_ft(ft: u8) -> FileType {
    match ft {
        2 => FileType::Directory,
        7 => FileType::Symlink,
        3 => FileType::CharDevice,
        4 => FileType::BlockDevice,
        5 => FileType::NamedPipe,
        6 => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: to_fuse(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: systime(a.atime),
        mtime: systime(a.mtime),
        ctime: systime(a.ctime),
        crtime: systime(a.crtime),
        kind: kind_of(a.mode),
        perm: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.block_size,
        flags: 0,
    }
}

#[cfg(test)]
mod tests;
