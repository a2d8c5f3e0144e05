//! On-disk bytes only, no I/O. One module per ext4 structure; each struct wraps the raw bytes
//! and exposes little-endian field accessors named after the kernel's fields, with the byte
//! offset of each field beside it. Split high/low fields are reached only through combining
//! accessors.
//!
//! Public for tools and tests that inspect an image below the filesystem's API (`uext4
//! info`, checks of what mkfs or a commit wrote): using a filesystem needs none of it. Its
//! setters are the engine's and mkfs's; a change made through them reaches no device.

pub mod casefold;
pub mod csum;
pub mod dir_entry;
pub mod dx_hash;
pub mod extent;
pub mod fast_commit;
pub mod features;
pub mod group_desc;
pub mod htree;
pub mod inode;
pub mod mmp;
pub mod orphan_file;
pub mod quota;
pub mod superblock;
pub mod verity;
pub mod xattr;

/// Little-endian readers and writers over byte slices.
#[inline]
pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
/// Reads a little-endian u32 at `off`.
#[inline]
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
/// Reads a little-endian u64 at `off`.
#[inline]
pub fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
/// Writes `v` as a little-endian u16 at `off`.
#[inline]
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes())
}
/// Writes `v` as a little-endian u32 at `off`.
#[inline]
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes())
}
/// Writes `v` as a little-endian u64 at `off`.
#[inline]
pub fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes())
}

/// Declares a getter and setter pair for a little-endian field at a fixed byte offset of
/// `self.0` (or of the byte slice the struct derefs to).
macro_rules! le_field {
    ($(#[$m:meta])* $get:ident, $set:ident, u8, $off:expr) => {
        $(#[$m])*
        #[doc = concat!("The field at byte offset ", stringify!($off), ".")]
        #[inline] pub fn $get(&self) -> u8 { self.bytes()[$off] }
        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        #[inline] pub fn $set(&mut self, v: u8) { self.bytes_mut()[$off] = v }
    };
    ($(#[$m:meta])* $get:ident, $set:ident, u16, $off:expr) => {
        $(#[$m])*
        #[doc = concat!("The field at byte offset ", stringify!($off), ".")]
        #[inline] pub fn $get(&self) -> u16 { $crate::format::le16(self.bytes(), $off) }
        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        #[inline] pub fn $set(&mut self, v: u16) { $crate::format::put16(self.bytes_mut(), $off, v) }
    };
    ($(#[$m:meta])* $get:ident, $set:ident, u32, $off:expr) => {
        $(#[$m])*
        #[doc = concat!("The field at byte offset ", stringify!($off), ".")]
        #[inline] pub fn $get(&self) -> u32 { $crate::format::le32(self.bytes(), $off) }
        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        #[inline] pub fn $set(&mut self, v: u32) { $crate::format::put32(self.bytes_mut(), $off, v) }
    };
    ($(#[$m:meta])* $get:ident, $set:ident, u64, $off:expr) => {
        $(#[$m])*
        #[doc = concat!("The field at byte offset ", stringify!($off), ".")]
        #[inline] pub fn $get(&self) -> u64 { $crate::format::le64(self.bytes(), $off) }
        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        #[inline] pub fn $set(&mut self, v: u64) { $crate::format::put64(self.bytes_mut(), $off, v) }
    };
}
pub(crate) use le_field;
