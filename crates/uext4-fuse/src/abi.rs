//! The parts of the kernel's FUSE protocol (include/uapi/linux/fuse.h, protocol 7.44) this
//! server speaks: opcodes, flags, the sizes of the fixed structs, and the INIT structs, which
//! the session reads too. Every struct is read and written field by field at its offset in
//! native byte order, as the kernel lays it out; request.rs decodes the rest and reply.rs
//! encodes the replies.

/// The protocol's major version.
pub const KERNEL_VERSION: u32 = 7;
/// The newest minor version this server knows (FUSE_OVER_IO_URING is 7.42, STATX 7.39).
pub const KERNEL_MINOR_VERSION: u32 = 44;
/// FUSE's inode number of the mount's root.
pub const ROOT_ID: u64 = 1;

// Opcodes (enum fuse_opcode).
pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const SETXATTR: u32 = 21;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const REMOVEXATTR: u32 = 24;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const GETLK: u32 = 31;
pub const SETLK: u32 = 32;
pub const SETLKW: u32 = 33;
pub const ACCESS: u32 = 34;
pub const CREATE: u32 = 35;
pub const INTERRUPT: u32 = 36;
pub const BMAP: u32 = 37;
pub const DESTROY: u32 = 38;
pub const IOCTL: u32 = 39;
pub const POLL: u32 = 40;
pub const NOTIFY_REPLY: u32 = 41;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;
pub const LSEEK: u32 = 46;
pub const COPY_FILE_RANGE: u32 = 47;
pub const SETUPMAPPING: u32 = 48;
pub const REMOVEMAPPING: u32 = 49;
pub const SYNCFS: u32 = 50;
pub const TMPFILE: u32 = 51;
pub const STATX: u32 = 52;

// Notification codes (enum fuse_notify_code), sent as the error of a reply with unique 0.
pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;
pub const NOTIFY_DELETE: i32 = 6;

// INIT flags: bits 0..31 in `flags`, bits 32..63 in `flags2` (with FUSE_INIT_EXT).
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
pub const FUSE_POSIX_LOCKS: u64 = 1 << 1;
pub const FUSE_ATOMIC_O_TRUNC: u64 = 1 << 3;
pub const FUSE_EXPORT_SUPPORT: u64 = 1 << 4;
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_DONT_MASK: u64 = 1 << 6;
pub const FUSE_FLOCK_LOCKS: u64 = 1 << 10;
pub const FUSE_HAS_IOCTL_DIR: u64 = 1 << 11;
pub const FUSE_AUTO_INVAL_DATA: u64 = 1 << 12;
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
pub const FUSE_HANDLE_KILLPRIV: u64 = 1 << 19;
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_CACHE_SYMLINKS: u64 = 1 << 23;
pub const FUSE_NO_OPENDIR_SUPPORT: u64 = 1 << 24;
pub const FUSE_NO_OPEN_SUPPORT: u64 = 1 << 17;
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
pub const FUSE_ALLOW_IDMAP: u64 = 1 << 40;
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;

/// The uid and gid of a request the kernel sends without the caller's ids (with
/// FUSE_ALLOW_IDMAP, every request but those that create an inode).
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;

// fuse_open_out.open_flags.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

// fuse_setattr_in.valid.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_CTIME: u32 = 1 << 10;
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// fuse_write_in.write_flags.
pub const FUSE_WRITE_CACHE: u32 = 1 << 0;
/// fuse_getattr_in.getattr_flags: `fh` names the open file the kernel asks for.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// fuse_fsync_in.fsync_flags: data only.
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;

// statx masks (include/uapi/linux/stat.h).
pub const STATX_BASIC_STATS: u32 = 0x7ff;
pub const STATX_BTIME: u32 = 0x800;

// Sizes of the fixed structs on the wire.
pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
pub const OPEN_OUT_LEN: usize = 16;
pub const WRITE_OUT_LEN: usize = 8;
pub const STATFS_OUT_LEN: usize = 80;
pub const GETXATTR_OUT_LEN: usize = 8;
pub const INIT_IN_LEN: usize = 64;
pub const INIT_OUT_LEN: usize = 64;
pub const STATX_LEN: usize = 256;
pub const STATX_OUT_LEN: usize = 32 + STATX_LEN;
pub const IOCTL_OUT_LEN: usize = 16;
pub const LSEEK_OUT_LEN: usize = 8;
/// `struct fuse_dirent` before its name.
pub const DIRENT_LEN: usize = 24;
/// `struct fuse_forget_one`.
pub const FORGET_ONE_LEN: usize = 16;

/// Reads native-endian fields at their offsets; a field past the end reads as 0 (an INIT
/// from an older kernel is shorter than today's struct).
#[derive(Clone, Copy)]
pub struct Fields<'a>(pub &'a [u8]);

impl Fields<'_> {
    pub fn u16(&self, at: usize) -> u16 {
        self.0
            .get(at..at + 2)
            .map_or(0, |b| u16::from_ne_bytes(b.try_into().unwrap()))
    }
    pub fn u32(&self, at: usize) -> u32 {
        self.0
            .get(at..at + 4)
            .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap()))
    }
    pub fn u64(&self, at: usize) -> u64 {
        self.0
            .get(at..at + 8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()))
    }
}

/// Writes native-endian fields at their offsets into a zeroed area.
pub struct Put<'a>(pub &'a mut [u8]);

impl Put<'_> {
    pub fn u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_ne_bytes());
    }
    pub fn u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    pub fn u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

/// `struct fuse_init_in`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags`, with `flags2` above it when the kernel set FUSE_INIT_EXT.
    pub flags: u64,
}

impl InitIn {
    /// Reads the struct (offsets: major 0, minor 4, max_readahead 8, flags 12, flags2 16).
    pub fn parse(b: &[u8]) -> InitIn {
        let f = Fields(b);
        let mut flags = f.u32(12) as u64;
        if flags & FUSE_INIT_EXT != 0 {
            flags |= (f.u32(16) as u64) << 32;
        }
        InitIn {
            major: f.u32(0),
            minor: f.u32(4),
            max_readahead: f.u32(8),
            flags,
        }
    }
}

/// `struct fuse_init_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags` and `flags2` as one (FUSE_INIT_EXT included when flags2 is used).
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    /// Time granularity in nanoseconds.
    pub time_gran: u32,
    pub max_pages: u16,
}

impl InitOut {
    /// The struct's bytes (offsets: major 0, minor 4, max_readahead 8, flags 12,
    /// max_background 16, congestion_threshold 18, max_write 20, time_gran 24, max_pages 28,
    /// map_alignment 30, flags2 32, max_stack_depth 36, request_timeout 40).
    pub fn to_bytes(&self) -> [u8; INIT_OUT_LEN] {
        let mut b = [0u8; INIT_OUT_LEN];
        let mut p = Put(&mut b);
        p.u32(0, self.major);
        p.u32(4, self.minor);
        p.u32(8, self.max_readahead);
        p.u32(12, self.flags as u32);
        p.u16(16, self.max_background);
        p.u16(18, self.congestion_threshold);
        p.u32(20, self.max_write);
        p.u32(24, self.time_gran);
        p.u16(28, self.max_pages);
        p.u32(32, (self.flags >> 32) as u32);
        b
    }

    /// Reads a reply this server wrote (the session learns what was agreed from it).
    pub fn parse(b: &[u8]) -> InitOut {
        let f = Fields(b);
        InitOut {
            major: f.u32(0),
            minor: f.u32(4),
            max_readahead: f.u32(8),
            flags: f.u32(12) as u64 | (f.u32(32) as u64) << 32,
            max_background: f.u16(16),
            congestion_threshold: f.u16(18),
            max_write: f.u32(20),
            time_gran: f.u32(24),
            max_pages: f.u16(28),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_out_round_trips_with_flags2() {
        let o = InitOut {
            major: 7,
            minor: 44,
            max_readahead: 1 << 20,
            flags: FUSE_INIT_EXT | FUSE_OVER_IO_URING | FUSE_MAX_PAGES,
            max_background: 64,
            congestion_threshold: 48,
            max_write: 1 << 20,
            time_gran: 1,
            max_pages: 256,
        };
        assert_eq!(InitOut::parse(&o.to_bytes()), o);
    }

    #[test]
    fn init_in_reads_flags2_only_with_init_ext() {
        let mut b = [0u8; INIT_IN_LEN];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[12..16].copy_from_slice(&(FUSE_ASYNC_READ as u32).to_ne_bytes());
        b[16..20].copy_from_slice(&2u32.to_ne_bytes());
        assert_eq!(InitIn::parse(&b).flags, FUSE_ASYNC_READ);
        b[12..16].copy_from_slice(&((FUSE_ASYNC_READ | FUSE_INIT_EXT) as u32).to_ne_bytes());
        assert_eq!(
            InitIn::parse(&b).flags,
            FUSE_ASYNC_READ | FUSE_INIT_EXT | (2 << 32)
        );
        // A kernel older than 7.36 sends 16 bytes.
        assert_eq!(InitIn::parse(&b[..16]).major, 7);
    }
}
