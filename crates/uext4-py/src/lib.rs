//! The `uext4` Python module: an ext4 image (a file, a partition or an offset in one, or any
//! Python file object) opened through the uext4 engine, with Python's conventions: a
//! `Filesystem` that is a context manager, file objects, `os.stat_result`-like results,
//! `listdir`/`scandir`/`walk` as the `os` module has them, and `OSError`s with their errno.
//! Inodes by number, their extents and deleted directory entries are there for examiners
//! (a dfVFS back end is a thin adapter: examples/dfvfs_adapter.py).
//!
//! Every call into the engine runs with the GIL released; a file-object device takes the GIL
//! back for each read (device.rs).

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

mod device;
mod dirs;
mod file;
mod filesystem;
mod journal;
mod types;

/// `uext4::Error` as the `OSError` Python's own calls raise: CPython picks the subclass from
/// the errno (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, ...).
pub(crate) fn os_error(e: uext4::Error, path: Option<&[u8]>) -> PyErr {
    let errno = e.errno();
    let msg = e.to_string();
    match path {
        Some(p) => PyOSError::new_err((errno, msg, String::from_utf8_lossy(p).into_owned())),
        None => PyOSError::new_err((errno, msg)),
    }
}

/// A name or path as given: `str` (encoded as `os.fsencode` does), `bytes`, or a path-like.
pub(crate) fn fsencode(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        if let Ok(s) = s.to_cow() {
            return Ok(s.as_bytes().to_vec());
        }
    }
    let b = obj.py().import("os")?.call_method1("fsencode", (obj,))?;
    Ok(b.downcast::<PyBytes>()?.as_bytes().to_vec())
}

/// A name or path for Python: `bytes` when the caller gave bytes, else `str` (decoded as
/// `os.fsdecode` does: bytes that are not UTF-8 become surrogate escapes).
pub(crate) fn fsdecode<'py>(
    py: Python<'py>,
    b: &[u8],
    as_bytes: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if as_bytes {
        return Ok(PyBytes::new(py, b).into_any());
    }
    match std::str::from_utf8(b) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => py
            .import("os")?
            .call_method1("fsdecode", (PyBytes::new(py, b),)),
    }
}

/// `dir/name` (`/name` under the root).
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[pymodule]
#[pyo3(name = "uext4")]
fn uext4_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<filesystem::Filesystem>()?;
    m.add_class::<file::File>()?;
    m.add_class::<types::StatResult>()?;
    m.add_class::<types::Inode>()?;
    m.add_class::<types::Extent>()?;
    m.add_class::<dirs::DirEntry>()?;
    m.add_class::<dirs::ScandirIterator>()?;
    m.add_class::<dirs::Walk>()?;
    m.add_class::<journal::Transaction>()?;
    m.add_class::<journal::LoggedBlock>()?;
    // A File is a raw binary stream: io.RawIOBase's virtual subclass, so that isinstance()
    // checks and io.BufferedReader accept it.
    let raw_io = m.py().import("io")?.getattr("RawIOBase")?;
    raw_io.call_method1("register", (m.getattr("File")?,))?;
    Ok(())
}
