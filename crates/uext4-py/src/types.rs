//! What stat and inode return: `StatResult` (os.stat_result's fields, and ext4's birth time,
//! flags and generation), and `Inode`, the record as its table holds it, with its extents.

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use uext4::format::inode::{RawInode, Timestamp};
use uext4::{Attr, BlockMap, InodeRecord};

fn ns(t: Timestamp) -> i128 {
    t.sec as i128 * 1_000_000_000 + t.nsec as i128
}

fn secs(t: Timestamp) -> f64 {
    t.sec as f64 + t.nsec as f64 * 1e-9
}

/// A file's status, as `os.stat` gives it, plus ext4's own: `st_birthtime` (crtime),
/// `flags` (chattr's) and `generation`.
#[pyclass(module = "uext4", frozen, get_all)]
pub struct StatResult {
    st_mode: u32,
    st_ino: u64,
    st_dev: u64,
    st_nlink: u64,
    st_uid: u32,
    st_gid: u32,
    st_size: u64,
    st_atime: f64,
    st_mtime: f64,
    st_ctime: f64,
    st_atime_ns: i128,
    st_mtime_ns: i128,
    st_ctime_ns: i128,
    st_birthtime: Option<f64>,
    st_birthtime_ns: Option<i128>,
    st_blocks: u64,
    st_blksize: u32,
    st_rdev: u32,
    flags: u32,
    generation: u32,
    st_flags: u32,
    st_gen: u32,
}

impl StatResult {
    /// From the engine's attributes (a live inode).
    pub(crate) fn from_attr(a: &Attr) -> Self {
        StatResult {
            st_mode: a.mode as u32,
            st_ino: a.ino as u64,
            st_dev: 0,
            st_nlink: a.nlink as u64,
            st_uid: a.uid,
            st_gid: a.gid,
            st_size: a.size,
            st_atime: secs(a.atime),
            st_mtime: secs(a.mtime),
            st_ctime: secs(a.ctime),
            st_atime_ns: ns(a.atime),
            st_mtime_ns: ns(a.mtime),
            st_ctime_ns: ns(a.ctime),
            st_birthtime: Some(secs(a.crtime)),
            st_birthtime_ns: Some(ns(a.crtime)),
            st_blocks: a.blocks,
            st_blksize: a.block_size,
            st_rdev: a.rdev,
            flags: a.flags,
            generation: a.generation,
            st_flags: a.flags,
            st_gen: a.generation,
        }
    }

    /// From an inode's record as its table holds it (a deleted entry's inode).
    pub(crate) fn from_raw(ino: u32, raw: &RawInode, block_size: u32) -> Self {
        StatResult {
            st_mode: raw.mode() as u32,
            st_ino: ino as u64,
            st_dev: 0,
            st_nlink: raw.links_count() as u64,
            st_uid: raw.uid(),
            st_gid: raw.gid(),
            st_size: raw.size(),
            st_atime: secs(raw.atime()),
            st_mtime: secs(raw.mtime()),
            st_ctime: secs(raw.ctime()),
            st_atime_ns: ns(raw.atime()),
            st_mtime_ns: ns(raw.mtime()),
            st_ctime_ns: ns(raw.ctime()),
            st_birthtime: raw.crtime().map(secs),
            st_birthtime_ns: raw.crtime().map(ns),
            st_blocks: raw.blocks_512(block_size),
            st_blksize: block_size,
            st_rdev: 0,
            flags: raw.flags(),
            generation: raw.generation(),
            st_flags: raw.flags(),
            st_gen: raw.generation(),
        }
    }

    fn item(&self, py: Python<'_>, i: usize) -> PyResult<PyObject> {
        let v = match i {
            0 => self.st_mode.into_pyobject(py)?,
            1 => self.st_ino.into_pyobject(py)?,
            2 => self.st_dev.into_pyobject(py)?,
            3 => self.st_nlink.into_pyobject(py)?,
            4 => self.st_uid.into_pyobject(py)?,
            5 => self.st_gid.into_pyobject(py)?,
            6 => self.st_size.into_pyobject(py)?,
            7 => (self.st_atime_ns.div_euclid(1_000_000_000) as i64).into_pyobject(py)?,
            8 => (self.st_mtime_ns.div_euclid(1_000_000_000) as i64).into_pyobject(py)?,
            9 => (self.st_ctime_ns.div_euclid(1_000_000_000) as i64).into_pyobject(py)?,
            _ => return Err(PyIndexError::new_err("stat_result index out of range")),
        };
        Ok(v.into_any().unbind())
    }
}

#[pymethods]
impl StatResult {
    /// As os.stat_result's tuple: mode, ino, dev, nlink, uid, gid, size, and the three times
    /// in whole seconds.
    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<PyObject> {
        let i = if i < 0 { i + 10 } else { i };
        self.item(py, usize::try_from(i).unwrap_or(usize::MAX))
    }

    fn __len__(&self) -> usize {
        10
    }

    fn __repr__(&self) -> String {
        format!(
            "uext4.StatResult(st_mode=0o{:o}, st_ino={}, st_nlink={}, st_uid={}, st_gid={}, \
             st_size={}, st_mtime_ns={})",
            self.st_mode,
            self.st_ino,
            self.st_nlink,
            self.st_uid,
            self.st_gid,
            self.st_size,
            self.st_mtime_ns
        )
    }
}

/// A run of an inode's blocks: `length` blocks from logical block `logical` lie at physical
/// block `physical`; `unwritten` ones (preallocated) read as zeros.
#[pyclass(module = "uext4", frozen, get_all)]
#[derive(Clone)]
pub struct Extent {
    logical: u64,
    physical: u64,
    length: u64,
    unwritten: bool,
}

#[pymethods]
impl Extent {
    fn __repr__(&self) -> String {
        format!(
            "uext4.Extent(logical={}, physical={}, length={}, unwritten={})",
            self.logical,
            self.physical,
            self.length,
            if self.unwritten { "True" } else { "False" }
        )
    }
}

/// An inode as its table holds it, whatever its state (in use, deleted, never used): the
/// examiner's view (debugfs's `stat <N>`). Times are nanoseconds since the epoch; `dtime` is
/// the deletion time in seconds (0: none).
#[pyclass(module = "uext4", frozen, get_all)]
pub struct Inode {
    number: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    links_count: u32,
    flags: u32,
    generation: u32,
    atime_ns: i128,
    mtime_ns: i128,
    ctime_ns: i128,
    crtime_ns: Option<i128>,
    dtime: u32,
    blocks: u64,
    allocated: bool,
    checksum_ok: Option<bool>,
    group: u32,
    table_block: u64,
    table_offset: usize,
    uses_extents: bool,
    inline_data: bool,
    extents: Vec<Extent>,
    map_blocks: Vec<u64>,
    map_damage: Option<String>,
    raw: Py<PyBytes>,
}

impl Inode {
    pub(crate) fn new(py: Python<'_>, r: &InodeRecord, map: &BlockMap, block_size: u32) -> Self {
        let raw = &r.raw;
        let extents = map
            .runs()
            .map(|x| Extent {
                logical: x.lblk,
                physical: x.pblk,
                length: x.len,
                unwritten: x.unwritten,
            })
            .collect();
        let map_blocks = map
            .entries
            .iter()
            .filter_map(|e| match e {
                uext4::MapEntry::Map { pblk, .. } => Some(*pblk),
                uext4::MapEntry::Data(_) => None,
            })
            .collect();
        Inode {
            number: r.ino,
            mode: raw.mode() as u32,
            uid: raw.uid(),
            gid: raw.gid(),
            size: raw.size(),
            links_count: raw.links_count() as u32,
            flags: raw.flags(),
            generation: raw.generation(),
            atime_ns: ns(raw.atime()),
            mtime_ns: ns(raw.mtime()),
            ctime_ns: ns(raw.ctime()),
            crtime_ns: raw.crtime().map(ns),
            dtime: raw.dtime(),
            blocks: raw.blocks_512(block_size),
            allocated: r.allocated,
            checksum_ok: r.checksum_ok,
            group: r.group,
            table_block: r.table_block,
            table_offset: r.offset,
            uses_extents: map.extents,
            inline_data: raw.flags() & uext4::flags::FL_INLINE_DATA != 0,
            extents,
            map_blocks,
            map_damage: map.damage.clone(),
            raw: PyBytes::new(py, raw.bytes()).unbind(),
        }
    }
}

#[pymethods]
impl Inode {
    fn __repr__(&self) -> String {
        format!(
            "uext4.Inode(number={}, mode=0o{:o}, size={}, links_count={}, allocated={}, \
             dtime={})",
            self.number,
            self.mode,
            self.size,
            self.links_count,
            if self.allocated { "True" } else { "False" },
            self.dtime
        )
    }
}
