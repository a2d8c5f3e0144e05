//! The engine's error type. Every failure the library can report is one of these variants;
//! the FUSE adapter maps them to an errno in one exhaustive match (`Error::errno`).

use std::io;

/// The on-disk structure a corruption error found damaged, as the kernel's EXT4_ERROR_INODE and
/// EXT4_ERROR_BLOCK name it, so that callers and tests act on the kind rather than the text.
/// More kinds may come as checks are added, hence non-exhaustive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Corruption {
    /// The superblock: a field out of range, or its checksum.
    Superblock,
    /// A group descriptor: a location or count out of range, or its checksum.
    GroupDescriptor,
    /// A block bitmap: its checksum, padding, or a bit that contradicts the allocator.
    BlockBitmap,
    /// An inode bitmap: its checksum, or a bit that contradicts the allocator.
    InodeBitmap,
    /// An inode: its number, fields or checksum (the root inode included).
    Inode,
    /// An extent tree node: header, entries, order, depth or checksum.
    ExtentTree,
    /// A directory: an entry block, its checksum, or the tree's shape ('..', cycles).
    Directory,
    /// Extended attributes, in the inode or in an xattr block (ACLs included).
    Xattr,
    /// Inline data kept in the inode.
    InlineData,
    /// The orphan list.
    Orphan,
    /// The journal: its inode, superblock, or the log.
    Journal,
    /// The multi-mount protection block.
    Mmp,
    /// An indirect block map (i_block and its indirect blocks).
    BlockMap,
    /// A block number outside the filesystem or inside its own metadata (the system zone),
    /// where no structure holding it is known.
    BlockReference,
    /// A quota file: its header, tree or entries.
    Quota,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Corruption::Superblock => "superblock",
            Corruption::GroupDescriptor => "group descriptor",
            Corruption::BlockBitmap => "block bitmap",
            Corruption::InodeBitmap => "inode bitmap",
            Corruption::Inode => "inode",
            Corruption::ExtentTree => "extent tree",
            Corruption::Directory => "directory",
            Corruption::Xattr => "extended attributes",
            Corruption::InlineData => "inline data",
            Corruption::Orphan => "orphan list",
            Corruption::Journal => "journal",
            Corruption::Mmp => "MMP block",
            Corruption::BlockMap => "block map",
            Corruption::BlockReference => "block reference",
            Corruption::Quota => "quota file",
        })
    }
}

/// Every failure an operation reports; [`Error::errno`] gives its errno.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// (Not marked as the error's source: its text is already in this one's, and a report
    /// that walks the chain printed it twice.)
    #[error("I/O error: {0}")]
    Io(io::Error),
    /// Not an ext2/3/4 filesystem (no magic, or a superblock that makes no sense): why.
    #[error("not an ext2/3/4 filesystem: {0}")]
    NotExt4(String),
    /// An incompat feature flag we do not implement: refuse to open.
    #[error("unsupported incompatible feature: {0}")]
    UnsupportedIncompat(String),
    /// Something else we do not implement (names it).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A checksum did not match: `kind` names the structure, `detail` what and where (inode,
    /// block), as the message shows it.
    #[error("corrupt filesystem: bad checksum: {detail}")]
    BadChecksum {
        /// The structure that failed its checksum.
        kind: Corruption,
        /// Which one and where (inode, block), as the message shows it.
        detail: String,
    },
    /// A structure violates the format: `kind` names it, `detail` says what and where.
    #[error("corrupt filesystem: {detail}")]
    Corrupt {
        /// The damaged structure.
        kind: Corruption,
        /// What is wrong and where (inode, block), as the message shows it.
        detail: String,
    },
    /// A write to a filesystem opened or turned read-only (why, where known).
    #[error("filesystem is read-only{0}")]
    ReadOnly(String),
    /// ENOENT.
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST.
    #[error("file exists")]
    Exists,
    /// ENOTDIR.
    #[error("not a directory")]
    NotDir,
    /// EISDIR.
    #[error("is a directory")]
    IsDir,
    /// ENOTEMPTY.
    #[error("directory not empty")]
    NotEmpty,
    /// ENOSPC: no free blocks.
    #[error("no space left on device")]
    NoSpace,
    /// ENOSPC: no free inodes.
    #[error("no free inodes left on device")]
    NoInodes,
    /// ENAMETOOLONG: a name over 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// EINVAL: what was invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// EMLINK.
    #[error("too many links")]
    TooManyLinks,
    /// EFBIG: past the largest file the filesystem holds.
    #[error("file too large")]
    FileTooBig,
    /// ENODATA: no such extended attribute.
    #[error("no such attribute")]
    NoAttr,
    /// ERANGE: a value too large for the buffer or the filesystem.
    #[error("attribute value too large")]
    Range,
    /// EPERM (and EACCES where the caller lacks a permission).
    #[error("operation not permitted")]
    Perm,
    /// EACCES: the caller is neither the owner nor privileged, where the kernel says so
    /// with EACCES rather than EPERM (inode_owner_or_capable in fscrypt's ioctls).
    #[error("permission denied")]
    Access,
    /// EOPNOTSUPP: the operation or flag (names it).
    #[error("operation not supported: {0}")]
    NotSupported(String),
    /// EXDEV: a link or rename between directories of different encryption policies.
    #[error("invalid cross-device link: the encryption policies differ")]
    CrossDevice,
    /// ENOKEY: the encryption key of the file or directory is not given (names the key by
    /// its public descriptor or identifier; never any key material).
    #[error("required key not available: {0}")]
    NoKey(String),
    /// EINVAL: a directory moved into its own subtree.
    #[error("cross-directory move of a directory into its own subtree")]
    Loop,
    /// EIO: the filesystem stopped writing after an error (errors=remount-ro, or a failed journal):
    /// the first error.
    #[error("filesystem has stopped writing after an error: {0}")]
    Stopped(String),
    /// lseek SEEK_DATA/SEEK_HOLE past the end, or no more data.
    #[error("no such device or address (offset past the end of the data)")]
    Nxio,
    /// EBUSY.
    #[error("device or resource busy")]
    Busy,
    /// A read-write open of an image that another program writes or holds (holder.rs).
    #[error("in use: {0}")]
    InUse(Holder),
    /// Multi-mount protection refused a read-write open: the MMP block shows the filesystem
    /// in use by another node (`fsck`: e2fsck, or another e2fsprogs tool, holds it). What the
    /// block last said: the node, its device name and the time of its last update.
    #[error("{}", busy_message(*fsck, node, device, *time))]
    MmpBusy {
        /// The node that holds it.
        node: String,
        /// Its device name there.
        device: String,
        /// When the block was last updated (seconds since the epoch).
        time: u64,
        /// An e2fsprogs tool holds it.
        fsck: bool,
    },
    /// A partition table that cannot be used, or a partition it does not have.
    #[error("{0}")]
    PartitionTable(String),
    /// An NBD server that cannot be reached, has no such export, or broke the handshake
    /// (nbd.rs); the text names the URI and the reason.
    #[error("{0}")]
    Nbd(String),
    /// EIO: a verity file's data or Merkle tree does not hash to what its tree and
    /// descriptor say (fs/verity/verify.c's verification failure); the text names the inode
    /// and the block.
    #[error("fs-verity: {0}")]
    Verity(String),
    /// EMSGSIZE: a verity salt or signature larger than the kernel allows.
    #[error("too large: {0}")]
    MsgSize(String),
    /// EDQUOT: the change would take a user, group or project past its hard limit, or past
    /// its soft limit once the grace period is over (quota.rs).
    #[error("disk quota exceeded: {0}")]
    QuotaExceeded(String),
}

/// Who holds an image that a read-write open was refused.
#[derive(Debug, Clone)]
pub struct Holder {
    /// One line: "fuse2fs (pid 42) has it open for writing".
    pub who: String,
    /// The holder is another uext4 (its claim, or a read-only mount's shared lock).
    pub by_uext4: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.who)
    }
}

/// The one-line message of `Error::MmpBusy`.
pub fn busy_message(fsck: bool, node: &str, device: &str, time: u64) -> String {
    let node = if node.is_empty() { "?" } else { node };
    let device = if device.is_empty() { "?" } else { device };
    if fsck {
        format!(
            "MMP: e2fsck is running on it (node {node}, device {device}, since {}); wait for \
             it to finish, or if it was killed, run e2fsck again",
            utc(time)
        )
    } else {
        format!(
            "MMP: in use by node {node} (device {device}), last updated {}; if that node is \
             gone, run e2fsck",
            utc(time)
        )
    }
}

/// Seconds since the epoch as "YYYY-MM-DD HH:MM:SS UTC".
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian, eras of 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The result of every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A structure of kind `kind` violates the format; `detail` says what and where.
    pub fn corrupt(kind: Corruption, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            kind,
            detail: detail.into(),
        }
    }

    /// A structure of kind `kind` fails its checksum; `detail` says which and where.
    pub fn bad_checksum(kind: Corruption, detail: impl Into<String>) -> Self {
        Error::BadChecksum {
            kind,
            detail: detail.into(),
        }
    }

    /// The damaged structure, for errors that mean the on-disk structures are damaged.
    pub fn corruption(&self) -> Option<Corruption> {
        match self {
            Error::Corrupt { kind, .. } | Error::BadChecksum { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// True for errors that mean the on-disk structures are damaged.
    pub fn is_corruption(&self) -> bool {
        self.corruption().is_some()
    }

    /// True for a checksum mismatch (a corruption error whose data failed its checksum).
    pub fn is_bad_checksum(&self) -> bool {
        matches!(self, Error::BadChecksum { .. })
    }

    /// The errno a POSIX caller expects for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::NotExt4(_) => libc::EINVAL,
            Error::UnsupportedIncompat(_) | Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::BadChecksum { .. } => libc::EBADMSG,
            Error::Corrupt { .. } => libc::EUCLEAN,
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
            Error::Access => libc::EACCES,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::NoKey(_) => libc::ENOKEY,
            Error::CrossDevice => libc::EXDEV,
            Error::Loop => libc::EINVAL,
            Error::Stopped(_) => libc::EROFS,
            Error::Nxio => libc::ENXIO,
            Error::Busy | Error::InUse(_) | Error::MmpBusy { .. } => libc::EBUSY,
            Error::PartitionTable(_) => libc::EINVAL,
            Error::Nbd(_) | Error::Verity(_) => libc::EIO,
            Error::MsgSize(_) => libc::EMSGSIZE,
            Error::QuotaExceeded(_) => libc::EDQUOT,
        }
    }
}

impl From<crate::crypto::CryptoError> for Error {
    fn from(e: crate::crypto::CryptoError) -> Self {
        use crate::crypto::CryptoError as C;
        match e {
            C::NoKey(k) => Error::NoKey(format!("encryption key {k}")),
            C::NameTooLong => Error::NameTooLong,
            C::BadNokeyName => Error::NotFound,
            C::Corrupt(why) => Error::corrupt(Corruption::Inode, format!("encrypted data: {why}")),
            C::InvalidContext(why) => Error::corrupt(
                Corruption::Xattr,
                format!("invalid encryption context: {why}"),
            ),
            C::Unsupported(why) => Error::NotSupported(format!("encryption policy: {why}")),
            C::BadKeySize(n) => {
                Error::Invalid(format!("encryption key of {n} bytes (16 to 64 needed)"))
            }
            C::WrongKind(why) => Error::Invalid(format!("encryption: {why}")),
            C::Random => Error::Io(io::Error::other("random number generator failed")),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
