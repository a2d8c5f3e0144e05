//! The engine's error type. Every failure the library can report is one of these variants;
//! the FUSE adapter maps them to an errno in one exhaustive match (`Error::errno`).

use std::io;

/// What was found corrupt, so that a message names the structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// A checksum did not match: what, and where.
    Checksum(String),
    /// A structure violates the format: what, and where.
    Structure(String),
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// (Not marked as the error's source: its text is already in this one's, and a report
    /// that walks the chain printed it twice.)
    #[error("I/O error: {0}")]
    Io(io::Error),
    #[error("not an ext2/3/4 filesystem: {0}")]
    NotExt4(String),
    /// An incompat feature flag we do not implement: refuse to open.
    #[error("unsupported incompatible feature: {0}")]
    UnsupportedIncompat(String),
    /// Something else we do not implement (names it).
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("corrupt filesystem: bad checksum: {0}")]
    BadChecksum(String),
    #[error("corrupt filesystem: {0}")]
    Corrupt(String),
    #[error("filesystem is read-only{0}")]
    ReadOnly(String),
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on device")]
    NoSpace,
    #[error("no free inodes left on device")]
    NoInodes,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    FileTooBig,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value too large")]
    Range,
    #[error("operation not permitted")]
    Perm,
    #[error("operation not supported: {0}")]
    NotSupported(String),
    #[error("cross-directory move of a directory into its own subtree")]
    Loop,
    #[error("filesystem has stopped writing after an error: {0}")]
    Stopped(String),
    /// lseek SEEK_DATA/SEEK_HOLE past the end, or no more data.
    #[error("no such device or address (offset past the end of the data)")]
    Nxio,
    #[error("device or resource busy")]
    Busy,
    /// A read-write open of an image that another program writes or holds (holder.rs).
    #[error("in use: {0}")]
    InUse(crate::holder::Holder),
    /// Multi-mount protection refused a read-write open: the MMP block shows the filesystem
    /// in use by another node (`fsck`: e2fsck, or another e2fsprogs tool, holds it). What the
    /// block last said: the node, its device name and the time of its last update.
    #[error("{}", crate::mmp::busy_message(*fsck, node, device, *time))]
    MmpBusy {
        node: String,
        device: String,
        time: u64,
        fsck: bool,
    },
    /// A partition table that cannot be used, or a partition it does not have.
    #[error("{0}")]
    PartitionTable(String),
    /// An NBD server that cannot be reached, has no such export, or broke the handshake
    /// (nbd.rs); the text names the URI and the reason.
    #[error("{0}")]
    Nbd(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }

    /// True for errors that mean the on-disk structures are damaged.
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt(_) | Error::BadChecksum(_))
    }

    /// The errno a POSIX caller expects for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::NotExt4(_) => libc::EINVAL,
            Error::UnsupportedIncompat(_) | Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::BadChecksum(_) => libc::EBADMSG,
            Error::Corrupt(_) => libc::EUCLEAN,
            Error::ReadOnly(_) => libc::EROFS,
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NoSpace | Error::NoInodes => libc::ENOSPC,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Invalid(_) => libc::EINVAL,
            Error::TooManyLinks => libc::EMLINK,
            Error::FileTooBig => libc::EFBIG,
            Error::NoAttr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::Perm => libc::EPERM,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Loop => libc::EINVAL,
            Error::Stopped(_) => libc::EROFS,
            Error::Nxio => libc::ENXIO,
            Error::Busy | Error::InUse(_) | Error::MmpBusy { .. } => libc::EBUSY,
            Error::PartitionTable(_) => libc::EINVAL,
            Error::Nbd(_) => libc::EIO,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
