//! Directories as the `os` module lists them: `DirEntry` and its iterator (`scandir`, with
//! the entries a removal left readable on request), and `Walk` (`os.walk`'s generator,
//! top-down, where the caller may prune `dirnames`, or bottom-up).

use crate::types::StatResult;
use crate::{fsdecode, fsencode, join, os_error};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::VecDeque;
use std::sync::Arc;
use uext4::format::dir_entry::{FT_DIR, FT_REG, FT_SYMLINK, FT_UNKNOWN};
use uext4::format::inode::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use uext4::Fs;

/// One entry of a directory (inode, name, file type), `.` and `..` left out.
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) ino: u32,
    pub(crate) name: Vec<u8>,
    pub(crate) ftype: u8,
    pub(crate) deleted: bool,
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// The live entries of directory `dir`.
pub(crate) fn read_dir(fs: &Fs, dir: u32) -> uext4::Result<Vec<Entry>> {
    if !fs.getattr(dir)?.is_dir() {
        return Err(uext4::Error::NotDir);
    }
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if !is_dot(&e.name) {
            out.push(Entry {
                ino: e.ino,
                name: e.name,
                ftype: e.kind,
                deleted: false,
            });
        }
        true
    })?;
    Ok(out)
}

/// The entries as the directory's blocks hold them, with those removed but still readable.
fn read_dir_raw(fs: &Fs, dir: u32) -> uext4::Result<Vec<Entry>> {
    let rec = fs.inode_record(dir)?;
    if !rec.raw.is_dir() {
        return Err(uext4::Error::NotDir);
    }
    let (entries, _damage) = fs.dir_entries_raw(dir, &rec.raw, true)?;
    Ok(entries
        .into_iter()
        .filter(|e| !is_dot(&e.name) || e.removed)
        .map(|e| Entry {
            ino: e.inode,
            name: e.name,
            ftype: e.file_type,
            deleted: e.removed,
        })
        .collect())
}

fn ftype_of_mode(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFDIR => FT_DIR,
        S_IFREG => FT_REG,
        S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

/// One entry of `Filesystem.scandir`, as `os.DirEntry`: `name`, `path`, `inode()`,
/// `is_dir()`, `is_file()`, `is_symlink()`, `stat()`; `deleted` for an entry a removal left
/// readable (its inode may since have been freed or reused: its `stat()` reads the record as
/// the table holds it).
#[pyclass(module = "uext4", frozen)]
pub struct DirEntry {
    fs: Arc<Fs>,
    dir: u32,
    path: Vec<u8>,
    e: Entry,
    as_bytes: bool,
}

impl DirEntry {
    /// The file type, following a symlink with `follow` (FT_UNKNOWN where it leads nowhere).
    fn kind(&self, py: Python<'_>, follow: bool) -> u8 {
        let (fs, dir, e) = (&self.fs, self.dir, &self.e);
        py.allow_threads(|| {
            if e.deleted {
                return e.ftype;
            }
            if e.ftype == FT_SYMLINK && follow {
                return fs
                    .lookup_path(dir, &e.name, true)
                    .and_then(|i| fs.getattr(i))
                    .map_or(FT_UNKNOWN, |a| ftype_of_mode(a.mode));
            }
            if e.ftype == FT_UNKNOWN {
                return fs
                    .getattr(e.ino)
                    .map_or(FT_UNKNOWN, |a| ftype_of_mode(a.mode));
            }
            e.ftype
        })
    }
}

#[pymethods]
impl DirEntry {
    #[getter]
    fn name<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fsdecode(py, &self.e.name, self.as_bytes)
    }

    #[getter]
    fn path<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fsdecode(py, &self.path, self.as_bytes)
    }

    /// Whether a removal left this entry (readable in its neighbour's slack).
    #[getter]
    fn deleted(&self) -> bool {
        self.e.deleted
    }

    fn inode(&self) -> u32 {
        self.e.ino
    }

    #[pyo3(signature = (*, follow_symlinks = true))]
    fn is_dir(&self, py: Python<'_>, follow_symlinks: bool) -> bool {
        self.kind(py, follow_symlinks) == FT_DIR
    }

    #[pyo3(signature = (*, follow_symlinks = true))]
    fn is_file(&self, py: Python<'_>, follow_symlinks: bool) -> bool {
        self.kind(py, follow_symlinks) == FT_REG
    }

    fn is_symlink(&self, py: Python<'_>) -> bool {
        self.kind(py, false) == FT_SYMLINK
    }

    #[pyo3(signature = (*, follow_symlinks = true))]
    fn stat(&self, py: Python<'_>, follow_symlinks: bool) -> PyResult<StatResult> {
        let (fs, dir, e) = (&self.fs, self.dir, &self.e);
        py.allow_threads(|| {
            if e.deleted {
                let r = fs.inode_record(e.ino)?;
                return Ok(StatResult::from_raw(e.ino, &r.raw, fs.statfs().block_size));
            }
            let ino = if follow_symlinks && e.ftype == FT_SYMLINK {
                fs.lookup_path(dir, &e.name, true)?
            } else {
                e.ino
            };
            Ok(StatResult::from_attr(&fs.getattr(ino)?))
        })
        .map_err(|err| os_error(err, Some(&self.path)))
    }

    fn __fspath__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.path(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<uext4.DirEntry {:?}>",
            String::from_utf8_lossy(&self.e.name)
        )
    }
}

/// What `Filesystem.scandir` returns: an iterator of `DirEntry`, and a context manager, as
/// `os.scandir`'s is.
#[pyclass(module = "uext4")]
pub struct ScandirIterator {
    entries: VecDeque<Py<DirEntry>>,
}

impl ScandirIterator {
    /// The entries of directory `dir` (at `path`), deleted ones too with `deleted`.
    pub(crate) fn new(
        py: Python<'_>,
        fs: &Arc<Fs>,
        dir: u32,
        path: &[u8],
        deleted: bool,
        as_bytes: bool,
    ) -> PyResult<Self> {
        let list = py
            .allow_threads(|| {
                if deleted {
                    read_dir_raw(fs, dir)
                } else {
                    read_dir(fs, dir)
                }
            })
            .map_err(|e| os_error(e, Some(path)))?;
        let entries = list
            .into_iter()
            .map(|e| {
                let d = DirEntry {
                    fs: fs.clone(),
                    dir,
                    path: join(path, &e.name),
                    e,
                    as_bytes,
                };
                Py::new(py, d)
            })
            .collect::<PyResult<_>>()?;
        Ok(ScandirIterator { entries })
    }
}

#[pymethods]
impl ScandirIterator {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&mut self) -> Option<Py<DirEntry>> {
        self.entries.pop_front()
    }

    fn close(&mut self) {
        self.entries.clear();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close();
        false
    }
}

/// A directory's names split as os.walk splits them: directories (symlinks to directories
/// too), then everything else.
fn split(fs: &Fs, dir: u32, entries: Vec<Entry>) -> (Vec<Entry>, Vec<Entry>) {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for e in entries {
        let t = match e.ftype {
            FT_SYMLINK => fs
                .lookup_path(dir, &e.name, true)
                .and_then(|i| fs.getattr(i))
                .map_or(FT_UNKNOWN, |a| ftype_of_mode(a.mode)),
            FT_UNKNOWN => fs
                .getattr(e.ino)
                .map_or(FT_UNKNOWN, |a| ftype_of_mode(a.mode)),
            t => t,
        };
        if t == FT_DIR {
            dirs.push(e);
        } else {
            files.push(e);
        }
    }
    (dirs, files)
}

/// `Filesystem.walk`'s generator: `(dirpath, dirnames, filenames)` for each directory, as
/// os.walk yields them. Top-down, the directories walked next are those left in `dirnames`
/// when the next item is asked for; symlinks to directories are listed in `dirnames` but
/// walked only with `followlinks`. Errors go to `onerror` (an OSError), if given, and the
/// walk goes on.
#[pyclass(module = "uext4")]
pub struct Walk {
    fs: Arc<Fs>,
    stack: Vec<(Vec<u8>, u32)>,
    /// The directory last yielded (top-down): its path, inode and dirnames list.
    last: Option<(Vec<u8>, u32, Py<PyList>)>,
    topdown: bool,
    followlinks: bool,
    onerror: Option<PyObject>,
    as_bytes: bool,
    /// Bottom-up, everything, found at the first step.
    bottom_up: Option<VecDeque<PyObject>>,
}

impl Walk {
    pub(crate) fn new(
        fs: Arc<Fs>,
        start: Vec<(Vec<u8>, u32)>,
        topdown: bool,
        followlinks: bool,
        onerror: Option<PyObject>,
        as_bytes: bool,
    ) -> Self {
        Walk {
            fs,
            stack: start,
            last: None,
            topdown,
            followlinks,
            onerror,
            as_bytes,
            bottom_up: None,
        }
    }

    /// Directory `ino` at `path`, listed and split; an error goes to onerror (None then).
    fn visit(
        &self,
        py: Python<'_>,
        path: &[u8],
        ino: u32,
    ) -> PyResult<Option<(Vec<Entry>, Vec<Entry>)>> {
        let fs = &self.fs;
        match py.allow_threads(|| read_dir(fs, ino).map(|l| split(fs, ino, l))) {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                if let Some(f) = &self.onerror {
                    f.call1(py, (os_error(e, Some(path)).into_value(py),))?;
                }
                Ok(None)
            }
        }
    }

    /// The children of `dir` to walk: `names`, resolved, symlinks only with followlinks.
    fn children(
        &self,
        py: Python<'_>,
        path: &[u8],
        dir: u32,
        names: &[Vec<u8>],
    ) -> Vec<(Vec<u8>, u32)> {
        let (fs, follow) = (&self.fs, self.followlinks);
        py.allow_threads(|| {
            names
                .iter()
                .filter_map(|n| {
                    let a = fs.lookup(dir, n).ok()?;
                    let ino = if a.mode & S_IFMT == S_IFLNK {
                        if !follow {
                            return None;
                        }
                        fs.lookup_path(dir, n, true).ok()?
                    } else {
                        a.ino
                    };
                    Some((join(path, n), ino))
                })
                .collect()
        })
    }

    fn item<'py>(
        &self,
        py: Python<'py>,
        path: &[u8],
        dirs: &[Entry],
        files: &[Entry],
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyList>)> {
        let names = |l: &[Entry]| -> PyResult<Bound<'py, PyList>> {
            let v = l
                .iter()
                .map(|e| fsdecode(py, &e.name, self.as_bytes))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, v)
        };
        let d = names(dirs)?;
        let t = PyTuple::new(
            py,
            [
                fsdecode(py, path, self.as_bytes)?,
                d.clone().into_any(),
                names(files)?.into_any(),
            ],
        )?;
        Ok((t, d))
    }

    fn walk_bottom_up(
        &self,
        py: Python<'_>,
        path: &[u8],
        ino: u32,
        out: &mut VecDeque<PyObject>,
    ) -> PyResult<()> {
        let Some((dirs, files)) = self.visit(py, path, ino)? else {
            return Ok(());
        };
        let names: Vec<Vec<u8>> = dirs.iter().map(|e| e.name.clone()).collect();
        for (p, i) in self.children(py, path, ino, &names) {
            self.walk_bottom_up(py, &p, i, out)?;
        }
        out.push_back(self.item(py, path, &dirs, &files)?.0.into_any().unbind());
        Ok(())
    }
}

#[pymethods]
impl Walk {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if !self.topdown {
            if self.bottom_up.is_none() {
                let mut out = VecDeque::new();
                for (p, i) in std::mem::take(&mut self.stack) {
                    self.walk_bottom_up(py, &p, i, &mut out)?;
                }
                self.bottom_up = Some(out);
            }
            return Ok(self.bottom_up.as_mut().and_then(|q| q.pop_front()));
        }
        if let Some((path, ino, list)) = self.last.take() {
            let names = list
                .bind(py)
                .iter()
                .map(|n| fsencode(&n))
                .collect::<PyResult<Vec<_>>>()?;
            let mut kids = self.children(py, &path, ino, &names);
            kids.reverse();
            self.stack.extend(kids);
        }
        while let Some((path, ino)) = self.stack.pop() {
            if let Some((dirs, files)) = self.visit(py, &path, ino)? {
                let (t, d) = self.item(py, &path, &dirs, &files)?;
                self.last = Some((path, ino, d.unbind()));
                return Ok(Some(t.into_any().unbind()));
            }
        }
        Ok(None)
    }
}
