//! `Filesystem`: an image opened (by path, or through a Python file object; a partition or an
//! offset inside it), and what it offers: files, stat, directories, symlinks, xattrs, inodes by
//! number, and a few writes when opened with `readonly=False`.

use crate::device::PyFileDevice;
use crate::dirs::{read_dir, ScandirIterator, Walk};
use crate::file::File;
use crate::types::{Inode, StatResult};
use crate::{fsdecode, fsencode, os_error};
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList};
use std::path::PathBuf;
use std::sync::Arc;
use uext4::blockdev::{BlockDevice, Region};
use uext4::partition::Table;
use uext4::{EncryptionKey, Error, Fs, MountOptions, XattrFlags};

/// What a path argument names: a path (bytes, and whether the caller gave bytes) or, given an
/// int, the inode with that number.
enum Target {
    Path(Vec<u8>, bool),
    Ino(u32),
}

impl Target {
    fn of(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyInt>() {
            return Ok(Target::Ino(obj.extract()?));
        }
        Ok(Target::Path(
            fsencode(obj)?,
            obj.is_instance_of::<PyBytes>(),
        ))
    }

    fn shown(&self) -> Vec<u8> {
        match self {
            Target::Path(p, _) => p.clone(),
            Target::Ino(n) => format!("<{n}>").into_bytes(),
        }
    }

    fn as_bytes(&self) -> bool {
        matches!(self, Target::Path(_, true))
    }
}

/// Where the filesystem lies in what was opened: partition `n`, or from byte `offset`.
fn region_of(
    dev: &dyn BlockDevice,
    partition: Option<u32>,
    offset: u64,
) -> PyResult<Option<Region>> {
    match (partition, offset) {
        (None, 0) => Ok(None),
        (None, o) => Ok(Some(Region {
            offset: o,
            len: None,
        })),
        (Some(_), o) if o != 0 => Err(PyValueError::new_err(
            "give a partition or an offset, not both",
        )),
        (Some(n), _) => match Table::read(dev).map_err(|e| os_error(e, None))? {
            Some(t) => Ok(Some(t.region_of(n).map_err(|e| os_error(e, None))?)),
            None => Err(PyValueError::new_err(format!(
                "no partition table (neither GPT nor MBR), so no partition {n}"
            ))),
        },
    }
}

/// An ext4 (ext2, ext3) filesystem in an image, a partition of one, or a file object; a
/// context manager that closes it on exit.
#[pyclass(module = "uext4", frozen)]
pub struct Filesystem {
    fs: Mutex<Option<Arc<Fs>>>,
    #[pyo3(get)]
    readonly: bool,
}

impl Filesystem {
    fn get(&self) -> PyResult<Arc<Fs>> {
        self.fs
            .lock()
            .clone()
            .ok_or_else(|| PyValueError::new_err("the filesystem is closed"))
    }

    /// The inode `t` names (symlinks at the end followed with `follow`).
    fn resolve(&self, py: Python<'_>, fs: &Fs, t: &Target, follow: bool) -> PyResult<u32> {
        match t {
            Target::Ino(n) => Ok(*n),
            Target::Path(p, _) => py
                .allow_threads(|| fs.lookup_path(2, p, follow))
                .map_err(|e| os_error(e, Some(p))),
        }
    }

    /// The directory a new name goes into, and the name.
    fn parent(&self, py: Python<'_>, fs: &Fs, path: &[u8]) -> PyResult<(u32, Vec<u8>)> {
        let trimmed = path.strip_suffix(b"/").unwrap_or(path);
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(i) => (&trimmed[..i.max(1)], &trimmed[i + 1..]),
            None => (&b"/"[..], trimmed),
        };
        if name.is_empty() || name == b"." || name == b".." {
            return Err(os_error(
                Error::Invalid("needs a file name".into()),
                Some(path),
            ));
        }
        let d = py
            .allow_threads(|| fs.lookup_path(2, dir, true))
            .map_err(|e| os_error(e, Some(path)))?;
        Ok((d, name.to_vec()))
    }

    /// Runs a write on the parent directory of `path` and the new name.
    fn change<T: Send>(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        op: impl FnOnce(&Fs, u32, &[u8]) -> uext4::Result<T> + Send,
    ) -> PyResult<T> {
        let fs = self.get()?;
        let path = fsencode(path)?;
        let (dir, name) = self.parent(py, &fs, &path)?;
        py.allow_threads(|| op(&fs, dir, &name))
            .map_err(|e| os_error(e, Some(&path)))
    }
}

/// The caller, who owns what is made (as through a mount).
fn caller() -> (u32, u32) {
    // SAFETY: plain getters without arguments.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

#[pymethods]
impl Filesystem {
    /// Opens `source`: a path (str, bytes, path-like) or a binary file object (read-only);
    /// `partition` N of a whole-disk image (GPT or MBR, numbered from 1) or the filesystem at
    /// byte `offset`; `keys`, raw fscrypt master keys (bytes).
    #[new]
    #[pyo3(signature = (source, partition = None, offset = 0, readonly = true, keys = None))]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        partition: Option<u32>,
        offset: u64,
        readonly: bool,
        keys: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut raw_keys = Vec::new();
        if let Some(keys) = keys {
            for k in keys.try_iter()? {
                let k = k?;
                let b = k.downcast::<PyBytes>().map_err(|_| {
                    PyTypeError::new_err("keys are bytes (raw fscrypt master keys)")
                })?;
                raw_keys.push(EncryptionKey::new(b.as_bytes().to_vec()));
            }
        }
        let mut opts = MountOptions {
            read_only: readonly,
            commit_interval_secs: 0,
            keys: raw_keys,
            ..Default::default()
        };
        let path = source.extract::<PathBuf>().ok();
        let fs = match path {
            Some(p) => {
                let shown = p.as_os_str().as_encoded_bytes().to_vec();
                let err = |e| os_error(e, Some(&shown));
                if partition.is_some() || offset != 0 {
                    let dev = py
                        .allow_threads(|| uext4::image::open_image(&p, true))
                        .map_err(err)?;
                    opts.region = region_of(&*dev, partition, offset)?;
                }
                py.allow_threads(|| Fs::open_path(&p, opts)).map_err(err)?
            }
            None if source.hasattr("read")? && source.hasattr("seek")? => {
                if !readonly {
                    return Err(PyValueError::new_err(
                        "a file object is opened read-only; give a path to write",
                    ));
                }
                let dev: Arc<dyn BlockDevice> = Arc::new(PyFileDevice::new(source)?);
                opts.region = region_of(&*dev, partition, offset)?;
                py.allow_threads(|| Fs::open_dev(dev, opts))
                    .map_err(|e| os_error(e, None))?
            }
            None => {
                return Err(PyTypeError::new_err(
                    "expected a path or a binary file object (with read and seek)",
                ))
            }
        };
        if !readonly && fs.is_read_only() {
            let why = fs.read_only_reason().unwrap_or("read-only").to_string();
            return Err(os_error(Error::ReadOnly(why), None));
        }
        Ok(Filesystem {
            fs: Mutex::new(Some(fs)),
            readonly,
        })
    }

    /// Closes the filesystem: written, it is left clean (committed, the journal empty).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let fs = self.fs.lock().take();
        if let Some(fs) = fs {
            py.allow_threads(|| fs.unmount())
                .map_err(|e| os_error(e, None))?;
        }
        Ok(())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.fs.lock().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// A path's status, as os.stat (os.lstat with follow_symlinks=False); an int names an
    /// inode by number.
    #[pyo3(signature = (path, *, follow_symlinks = true))]
    fn stat(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<StatResult> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        let ino = self.resolve(py, &fs, &t, follow_symlinks)?;
        let a = py
            .allow_threads(|| fs.getattr(ino))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        Ok(StatResult::from_attr(&a))
    }

    /// os.lstat: the status of a symlink itself.
    fn lstat(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<StatResult> {
        self.stat(py, path, false)
    }

    /// Whether `path` names something (a symlink that leads nowhere does not).
    fn exists(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<bool> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        Ok(match self.resolve(py, &fs, &t, true) {
            Ok(ino) => py.allow_threads(|| fs.getattr(ino)).is_ok(),
            Err(_) => false,
        })
    }

    /// Opens a file for reading: an io.BufferedReader, as open(path, "rb") gives, or with
    /// buffering=0 the raw uext4.File. An int names an inode by number.
    #[pyo3(signature = (path, mode = "rb", buffering = -1))]
    fn open(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        mode: &str,
        buffering: i64,
    ) -> PyResult<PyObject> {
        if mode != "rb" && mode != "r" {
            return Err(PyValueError::new_err(format!(
                "mode {mode:?}: files open for reading in binary (\"rb\"); write with write_file"
            )));
        }
        let fs = self.get()?;
        let t = Target::of(path)?;
        let ino = self.resolve(py, &fs, &t, true)?;
        let reader = py
            .allow_threads(|| fs.open_reader(ino))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        let name = match &t {
            Target::Path(..) => path.clone().unbind(),
            Target::Ino(n) => n.into_pyobject(py)?.into_any().unbind(),
        };
        let raw = Py::new(py, File::new(reader, name))?;
        if buffering == 0 {
            return Ok(raw.into_any());
        }
        let io = py.import("io")?;
        let size = if buffering > 0 { buffering } else { 128 << 10 };
        Ok(io.getattr("BufferedReader")?.call1((raw, size))?.unbind())
    }

    /// A directory's names (without . and ..), as os.listdir; bytes for a bytes path.
    #[pyo3(signature = (path = None))]
    fn listdir<'py>(
        &self,
        py: Python<'py>,
        path: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let fs = self.get()?;
        let t = match path {
            Some(p) => Target::of(p)?,
            None => Target::Path(b"/".to_vec(), false),
        };
        let ino = self.resolve(py, &fs, &t, true)?;
        let entries = py
            .allow_threads(|| read_dir(&fs, ino))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        let names = entries
            .iter()
            .map(|e| fsdecode(py, &e.name, t.as_bytes()))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, names)
    }

    /// A directory's entries, as os.scandir; with `deleted`, as its blocks hold them, the
    /// entries a removal left readable too (`DirEntry.deleted`).
    #[pyo3(signature = (path = None, *, deleted = false))]
    fn scandir(
        &self,
        py: Python<'_>,
        path: Option<&Bound<'_, PyAny>>,
        deleted: bool,
    ) -> PyResult<ScandirIterator> {
        let fs = self.get()?;
        let t = match path {
            Some(p) => Target::of(p)?,
            None => Target::Path(b"/".to_vec(), false),
        };
        let ino = self.resolve(py, &fs, &t, true)?;
        let shown = match &t {
            Target::Path(p, _) => p.clone(),
            Target::Ino(_) => t.shown(),
        };
        ScandirIterator::new(py, &fs, ino, &shown, deleted, t.as_bytes())
    }

    /// os.walk over the image: (dirpath, dirnames, filenames) for each directory under `top`.
    #[pyo3(signature = (top = None, topdown = true, onerror = None, followlinks = false))]
    fn walk(
        &self,
        py: Python<'_>,
        top: Option<&Bound<'_, PyAny>>,
        topdown: bool,
        onerror: Option<PyObject>,
        followlinks: bool,
    ) -> PyResult<Walk> {
        let fs = self.get()?;
        let t = match top {
            Some(p) => Target::of(p)?,
            None => Target::Path(b"/".to_vec(), false),
        };
        let start = match self.resolve(py, &fs, &t, true) {
            Ok(i) => vec![(t.shown(), i)],
            Err(e) => {
                if let Some(f) = &onerror {
                    f.call1(py, (e.into_value(py),))?;
                }
                Vec::new()
            }
        };
        Ok(Walk::new(
            fs,
            start,
            topdown,
            followlinks,
            onerror,
            t.as_bytes(),
        ))
    }

    /// A symlink's target (bytes for a bytes path).
    fn readlink<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        let ino = self.resolve(py, &fs, &t, false)?;
        let target = py
            .allow_threads(|| fs.readlink(ino))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        fsdecode(py, &target, t.as_bytes())
    }

    /// Inode `number` as its table holds it, used or not, with its extents (or block-map
    /// runs): see uext4.Inode.
    fn inode(&self, py: Python<'_>, number: u32) -> PyResult<Inode> {
        let fs = self.get()?;
        let (rec, map) = py
            .allow_threads(|| {
                let rec = fs.inode_record(number)?;
                let map = fs.block_map(&rec.raw)?;
                Ok((rec, map))
            })
            .map_err(|e| os_error(e, Some(format!("<{number}>").as_bytes())))?;
        Ok(Inode::new(py, &rec, &map, fs.statfs().block_size))
    }

    /// The transactions the journal's log still holds, checkpointed or not, by sequence:
    /// see uext4.Transaction (`uext4 journal` prints the same).
    fn journal(&self, py: Python<'_>) -> PyResult<Vec<crate::journal::Transaction>> {
        let fs = self.get()?;
        let h = py
            .allow_threads(|| fs.journal_history())
            .map_err(|e| os_error(e, None))?;
        Ok(h.transactions
            .iter()
            .map(crate::journal::Transaction::of)
            .collect())
    }

    /// The older copies of inode `number` that the journal's log holds, oldest first, each
    /// as (transaction sequence, uext4.Inode as that transaction logged it).
    fn logged_inodes(&self, py: Python<'_>, number: u32) -> PyResult<Vec<(u32, Inode)>> {
        let fs = self.get()?;
        let (now, copies) = py
            .allow_threads(|| {
                let h = fs.journal_history()?;
                Ok((
                    fs.inode_record(number)?,
                    fs.logged_inode_copies(&h, number)?,
                ))
            })
            .map_err(|e| os_error(e, Some(format!("<{number}>").as_bytes())))?;
        let bs = fs.statfs().block_size;
        let mut out = Vec::new();
        for c in copies {
            let rec = uext4::InodeRecord {
                raw: c.raw,
                checksum_ok: None,
                allocated: false,
                ..now.clone()
            };
            let map = fs.block_map(&rec.raw).unwrap_or_default();
            out.push((c.sequence, Inode::new(py, &rec, &map, bs)));
        }
        Ok(out)
    }

    /// An extended attribute's value ("user.x", "security.selinux", ...).
    #[pyo3(signature = (path, name, *, follow_symlinks = true))]
    fn getxattr<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        name: &Bound<'py, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        let name = fsencode(name)?;
        let ino = self.resolve(py, &fs, &t, follow_symlinks)?;
        let v = py
            .allow_threads(|| fs.getxattr(ino, &name))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        Ok(PyBytes::new(py, &v))
    }

    /// The names of a file's extended attributes.
    #[pyo3(signature = (path, *, follow_symlinks = true))]
    fn listxattr<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        let ino = self.resolve(py, &fs, &t, follow_symlinks)?;
        let names = py
            .allow_threads(|| fs.listxattr(ino))
            .map_err(|e| os_error(e, Some(&t.shown())))?;
        let names = names
            .iter()
            .map(|n| fsdecode(py, n, false))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, names)
    }

    /// Writes `data` as the whole of file `path` (made with `mode` if new). Needs
    /// readonly=False.
    #[pyo3(signature = (path, data, mode = 0o644))]
    fn write_file(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        data: Vec<u8>,
        mode: u32,
    ) -> PyResult<()> {
        let (uid, gid) = caller();
        self.change(py, path, |fs, dir, name| {
            let ino = match fs.lookup(dir, name) {
                Ok(a) if a.is_dir() => return Err(Error::IsDir),
                Ok(a) => {
                    fs.truncate(a.ino, 0)?;
                    a.ino
                }
                Err(Error::NotFound) => {
                    fs.create(dir, name, 0o100000 | (mode & 0o7777), uid, gid)?
                        .ino
                }
                Err(e) => return Err(e),
            };
            fs.write_all(ino, 0, &data)
        })
    }

    /// Makes directory `path`. Needs readonly=False.
    #[pyo3(signature = (path, mode = 0o755))]
    fn mkdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32) -> PyResult<()> {
        let (uid, gid) = caller();
        self.change(py, path, |fs, dir, name| {
            fs.mkdir(dir, name, mode & 0o7777, uid, gid).map(drop)
        })
    }

    /// Makes symlink `path` pointing at `target`. Needs readonly=False.
    fn symlink(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        path: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (uid, gid) = caller();
        let target = fsencode(target)?;
        self.change(py, path, |fs, dir, name| {
            fs.symlink(dir, name, &target, uid, gid).map(drop)
        })
    }

    /// Removes a file (not a directory: rmdir). Needs readonly=False.
    fn remove(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        self.change(py, path, |fs, dir, name| {
            if fs.lookup(dir, name)?.is_dir() {
                return Err(Error::IsDir);
            }
            fs.unlink(dir, name)
        })
    }

    /// Removes an empty directory. Needs readonly=False.
    fn rmdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        self.change(py, path, |fs, dir, name| fs.rmdir(dir, name))
    }

    /// Sets an extended attribute. Needs readonly=False.
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        value: Vec<u8>,
    ) -> PyResult<()> {
        let fs = self.get()?;
        let t = Target::of(path)?;
        let name = fsencode(name)?;
        let ino = self.resolve(py, &fs, &t, true)?;
        py.allow_threads(|| fs.setxattr(ino, &name, &value, XattrFlags::Any))
            .map_err(|e| os_error(e, Some(&t.shown())))
    }

    fn __repr__(&self) -> String {
        let state = if self.fs.lock().is_none() {
            "closed"
        } else if self.readonly {
            "read-only"
        } else {
            "read-write"
        };
        format!("<uext4.Filesystem {state}>")
    }
}

impl Drop for Filesystem {
    /// Left open, a written filesystem is still closed clean.
    fn drop(&mut self) {
        if let Some(fs) = self.fs.lock().take() {
            let _ = fs.unmount();
        }
    }
}
