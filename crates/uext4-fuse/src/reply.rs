//! Encoding: reply bodies written into the transport's output buffer, each function returning
//! the body's length. Offsets are those of include/uapi/linux/fuse.h (abi.rs has the sizes).

use crate::abi::{self, Put};
use std::time::Duration;

/// `struct fuse_attr`: what the kernel caches of an inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// (seconds since 1970, negative before; nanoseconds)
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Creation (STATX only).
    pub crtime: (i64, u32),
    /// File type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number, in the kernel's `new_encode_dev` form.
    pub rdev: u32,
    pub blksize: u32,
}

/// Writes `a` at `at`: ino 0, size 8, blocks 16, atime 24, mtime 32, ctime 40, atimensec 48,
/// mtimensec 52, ctimensec 56, mode 60, nlink 64, uid 68, gid 72, rdev 76, blksize 80,
/// flags 84.
fn put_attr(out: &mut [u8], at: usize, a: &WireAttr) {
    let b = &mut out[at..at + abi::ATTR_LEN];
    b.fill(0);
    let mut p = Put(b);
    p.u64(0, a.ino);
    p.u64(8, a.size);
    p.u64(16, a.blocks);
    p.u64(24, a.atime.0 as u64);
    p.u64(32, a.mtime.0 as u64);
    p.u64(40, a.ctime.0 as u64);
    p.u32(48, a.atime.1);
    p.u32(52, a.mtime.1);
    p.u32(56, a.ctime.1);
    p.u32(60, a.mode);
    p.u32(64, a.nlink);
    p.u32(68, a.uid);
    p.u32(72, a.gid);
    p.u32(76, a.rdev);
    p.u32(80, a.blksize);
}

/// Writes `fuse_entry_out` at `at`: nodeid 0, generation 8, entry_valid 16, attr_valid 24,
/// entry_valid_nsec 32, attr_valid_nsec 36, attr 40.
/// How long the kernel may keep an entry: the name (entry_valid) and the attributes
/// (attr_valid).
#[derive(Clone, Copy, Debug)]
pub struct Ttl {
    /// How long the name's dentry is valid without a new LOOKUP.
    pub entry: Duration,
    /// How long the attributes are valid without a GETATTR.
    pub attr: Duration,
}

impl Ttl {
    /// The same time for both.
    pub fn both(t: Duration) -> Ttl {
        Ttl { entry: t, attr: t }
    }
}

fn put_entry(out: &mut [u8], at: usize, nodeid: u64, generation: u64, ttl: Ttl, a: &WireAttr) {
    let b = &mut out[at..at + abi::ENTRY_OUT_LEN];
    let mut p = Put(b);
    p.u64(0, nodeid);
    p.u64(8, generation);
    p.u64(16, ttl.entry.as_secs());
    p.u64(24, ttl.attr.as_secs());
    p.u32(32, ttl.entry.subsec_nanos());
    p.u32(36, ttl.attr.subsec_nanos());
    put_attr(out, at + 40, a);
}

/// `fuse_entry_out` (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK).
pub fn entry(out: &mut [u8], generation: u64, ttl: Ttl, a: &WireAttr) -> usize {
    put_entry(out, 0, a.ino, generation, ttl, a);
    abi::ENTRY_OUT_LEN
}

/// A LOOKUP's answer for a name that is not there: node id 0, which the kernel keeps as a
/// negative entry for `ttl` (ENOENT would be asked again at every lookup).
pub fn negative_entry(out: &mut [u8], ttl: Duration) -> usize {
    put_entry(out, 0, 0, 0, Ttl::both(ttl), &WireAttr::default());
    abi::ENTRY_OUT_LEN
}

/// `fuse_attr_out` (GETATTR, SETATTR): attr_valid 0, attr_valid_nsec 8, attr 16.
pub fn attr(out: &mut [u8], ttl: Duration, a: &WireAttr) -> usize {
    let mut p = Put(&mut out[..16]);
    p.u64(0, ttl.as_secs());
    p.u32(8, ttl.subsec_nanos());
    p.u32(12, 0);
    put_attr(out, 16, a);
    abi::ATTR_OUT_LEN
}

/// `fuse_open_out` at `at`: fh 0, open_flags 8, backing_id 12.
fn put_open(out: &mut [u8], at: usize, fh: u64, flags: u32) {
    let mut p = Put(&mut out[at..at + abi::OPEN_OUT_LEN]);
    p.u64(0, fh);
    p.u32(8, flags);
    p.u32(12, 0);
}

/// `fuse_open_out` (OPEN, OPENDIR).
pub fn open(out: &mut [u8], fh: u64, flags: u32) -> usize {
    put_open(out, 0, fh, flags);
    abi::OPEN_OUT_LEN
}

/// `fuse_entry_out` then `fuse_open_out` (CREATE, TMPFILE).
pub fn create(
    out: &mut [u8],
    generation: u64,
    ttl: Ttl,
    a: &WireAttr,
    fh: u64,
    flags: u32,
) -> usize {
    put_entry(out, 0, a.ino, generation, ttl, a);
    put_open(out, abi::ENTRY_OUT_LEN, fh, flags);
    abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN
}

/// `fuse_write_out` (WRITE, COPY_FILE_RANGE): size 0.
pub fn written(out: &mut [u8], n: u32) -> usize {
    let mut p = Put(&mut out[..abi::WRITE_OUT_LEN]);
    p.u32(0, n);
    p.u32(4, 0);
    abi::WRITE_OUT_LEN
}

/// `fuse_kstatfs`, as statfs(2) reports it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// `fuse_statfs_out`: blocks 0, bfree 8, bavail 16, files 24, ffree 32, bsize 40,
/// namelen 44, frsize 48.
pub fn statfs(out: &mut [u8], s: &Kstatfs) -> usize {
    let b = &mut out[..abi::STATFS_OUT_LEN];
    b.fill(0);
    let mut p = Put(b);
    p.u64(0, s.blocks);
    p.u64(8, s.bfree);
    p.u64(16, s.bavail);
    p.u64(24, s.files);
    p.u64(32, s.ffree);
    p.u32(40, s.bsize);
    p.u32(44, s.namelen);
    p.u32(48, s.frsize);
    abi::STATFS_OUT_LEN
}

/// `fuse_getxattr_out`: the size a GETXATTR or LISTXATTR with size 0 asks for.
pub fn xattr_size(out: &mut [u8], n: u32) -> usize {
    let mut p = Put(&mut out[..abi::GETXATTR_OUT_LEN]);
    p.u32(0, n);
    p.u32(4, 0);
    abi::GETXATTR_OUT_LEN
}

/// Raw bytes (READ, READLINK, GETXATTR, LISTXATTR).
pub fn data(out: &mut [u8], d: &[u8]) -> usize {
    out[..d.len()].copy_from_slice(d);
    d.len()
}

/// `fuse_init_out`, cut to what a kernel older than 7.23 expects.
pub fn init(out: &mut [u8], o: &abi::InitOut, kernel_minor: u32) -> usize {
    let n = if kernel_minor < 5 {
        8
    } else if kernel_minor < 23 {
        24
    } else {
        abi::INIT_OUT_LEN
    };
    out[..n].copy_from_slice(&o.to_bytes()[..n]);
    n
}

/// `fuse_statx_out`: attr_valid 0, attr_valid_nsec 8, flags 12, spare 16, then `fuse_statx`
/// at 32: mask 0, blksize 4, attributes 8, nlink 16, uid 20, gid 24, mode 28 (u16), ino 32,
/// size 40, blocks 48, attributes_mask 56, atime 64, btime 80, ctime 96, mtime 112 (each
/// seconds i64, nanoseconds u32, reserved), rdev_major 128, rdev_minor 132.
/// `attributes`: (stx_attributes, stx_attributes_mask).
pub fn statx(
    out: &mut [u8],
    ttl: Duration,
    a: &WireAttr,
    mask: u32,
    attributes: (u64, u64),
) -> usize {
    let b = &mut out[..abi::STATX_OUT_LEN];
    b.fill(0);
    let mut p = Put(b);
    p.u64(0, ttl.as_secs());
    p.u32(8, ttl.subsec_nanos());
    let s = 32;
    p.u32(s, mask);
    p.u32(s + 4, a.blksize);
    p.u64(s + 8, attributes.0);
    p.u32(s + 16, a.nlink);
    p.u32(s + 20, a.uid);
    p.u32(s + 24, a.gid);
    p.u16(s + 28, a.mode as u16);
    p.u64(s + 32, a.ino);
    p.u64(s + 40, a.size);
    p.u64(s + 48, a.blocks);
    p.u64(s + 56, attributes.1);
    for (at, t) in [(64, a.atime), (80, a.crtime), (96, a.ctime), (112, a.mtime)] {
        p.u64(s + at, t.0 as u64);
        p.u32(s + at + 8, t.1);
    }
    // The kernel's new_encode_dev form, split as MAJOR()/MINOR() would.
    p.u32(s + 128, (a.rdev & 0xfff00) >> 8);
    p.u32(s + 132, (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00));
    abi::STATX_OUT_LEN
}

/// `fuse_ioctl_out` (result 0, flags 4, in_iovs 8, out_iovs 12) and the data the ioctl
/// returns.
pub fn ioctl(out: &mut [u8], result: i32, d: &[u8]) -> usize {
    let mut p = Put(&mut out[..abi::IOCTL_OUT_LEN]);
    p.u32(0, result as u32);
    p.u32(4, 0);
    p.u32(8, 0);
    p.u32(12, 0);
    out[abi::IOCTL_OUT_LEN..abi::IOCTL_OUT_LEN + d.len()].copy_from_slice(d);
    abi::IOCTL_OUT_LEN + d.len()
}

/// `fuse_lseek_out`.
pub fn lseek(out: &mut [u8], offset: u64) -> usize {
    Put(&mut out[..abi::LSEEK_OUT_LEN]).u64(0, offset);
    abi::LSEEK_OUT_LEN
}

/// A READDIR or READDIRPLUS reply being filled: entries are packed, each padded to 8 bytes,
/// until the next would pass the size the kernel asked for.
pub struct Dirents<'a> {
    out: &'a mut [u8],
    len: usize,
    limit: usize,
}

impl<'a> Dirents<'a> {
    /// A reply of at most `size` bytes (the request's) in `out`.
    pub fn new(out: &'a mut [u8], size: u32) -> Self {
        let limit = out.len().min(size as usize);
        Dirents { out, len: 0, limit }
    }

    /// The body's length so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `fuse_dirent` at `at`: ino 0, off 8, namelen 16, type 20, name 24.
    fn put_dirent(&mut self, at: usize, ino: u64, off: u64, mode: u32, name: &[u8]) {
        let mut p = Put(&mut self.out[at..at + abi::DIRENT_LEN]);
        p.u64(0, ino);
        p.u64(8, off);
        p.u32(16, name.len() as u32);
        p.u32(20, (mode & libc::S_IFMT) >> 12);
        let n = at + abi::DIRENT_LEN;
        self.out[n..n + name.len()].copy_from_slice(name);
        let end = (n + name.len()).next_multiple_of(8);
        self.out[n + name.len()..end].fill(0);
        self.len = end;
    }

    /// Adds an entry of type `mode` (its S_IFMT bits) whose successor starts at `off`;
    /// false (nothing added) when it does not fit.
    pub fn add(&mut self, ino: u64, off: u64, mode: u32, name: &[u8]) -> bool {
        let size = (abi::DIRENT_LEN + name.len()).next_multiple_of(8);
        if self.len + size > self.limit {
            return false;
        }
        self.put_dirent(self.len, ino, off, mode, name);
        true
    }

    /// Adds a READDIRPLUS entry: the entry's `fuse_entry_out`, then its dirent; false
    /// (nothing added) when it does not fit.
    pub fn add_plus(
        &mut self,
        generation: u64,
        ttl: Ttl,
        a: &WireAttr,
        off: u64,
        name: &[u8],
    ) -> bool {
        let size = (abi::ENTRY_OUT_LEN + abi::DIRENT_LEN + name.len()).next_multiple_of(8);
        if self.len + size > self.limit {
            return false;
        }
        let at = self.len;
        put_entry(self.out, at, a.ino, generation, ttl, a);
        self.put_dirent(at + abi::ENTRY_OUT_LEN, a.ino, off, a.mode, name);
        true
    }
}

#[cfg(test)]
mod tests;
