//! `File`: an open file of the image as a raw binary stream (io.RawIOBase's methods: read,
//! readall, readinto, seek, tell, close; a context manager). `Filesystem.open` hands it out
//! wrapped in `io.BufferedReader`, as Python's `open(path, "rb")` does, unless `buffering=0`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PySlice};
use std::io::{Read, Seek, SeekFrom};
use uext4::FileReader;

#[pyclass(module = "uext4")]
pub struct File {
    reader: Option<FileReader>,
    #[pyo3(get)]
    name: PyObject,
}

impl File {
    pub(crate) fn new(reader: FileReader, name: PyObject) -> Self {
        File {
            reader: Some(reader),
            name,
        }
    }

    fn reader(&mut self) -> PyResult<&mut FileReader> {
        self.reader
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("I/O operation on closed file"))
    }

    /// Reads up to `n` bytes (to the end with None), the GIL released.
    fn read_n(&mut self, py: Python<'_>, n: Option<usize>) -> PyResult<Vec<u8>> {
        let r = self.reader()?;
        py.allow_threads(|| {
            let mut buf = Vec::new();
            match n {
                None => {
                    r.read_to_end(&mut buf)?;
                }
                Some(n) => {
                    buf.resize(n, 0);
                    let mut done = 0;
                    while done < n {
                        let k = r.read(&mut buf[done..])?;
                        if k == 0 {
                            break;
                        }
                        done += k;
                    }
                    buf.truncate(done);
                }
            }
            Ok::<_, std::io::Error>(buf)
        })
        .map_err(PyErr::from)
    }
}

#[pymethods]
impl File {
    /// Up to `size` bytes from the position (all that is left with -1 or None).
    #[pyo3(signature = (size = -1))]
    fn read<'py>(&mut self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        let n = size.filter(|&s| s >= 0).map(|s| s as usize);
        let data = self.read_n(py, n)?;
        Ok(PyBytes::new(py, &data))
    }

    /// All that is left.
    fn readall<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.read_n(py, None)?;
        Ok(PyBytes::new(py, &data))
    }

    /// Reads into a writable buffer (bytearray, memoryview): how many bytes.
    fn readinto(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        // Through a byte view of it (the stable ABI before 3.11 has no buffer protocol).
        let view = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((buffer,))?
            .call_method1("cast", ("B",))?;
        if view.getattr("readonly")?.extract::<bool>()? {
            return Err(PyValueError::new_err("readinto needs a writable buffer"));
        }
        let data = self.read_n(py, Some(view.len()?))?;
        let n = data.len();
        view.set_item(PySlice::new(py, 0, n as isize, 1), PyBytes::new(py, &data))?;
        Ok(n)
    }

    /// Moves the position: from the start (whence 0), the position (1) or the end (2).
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&mut self, offset: i64, whence: i32) -> PyResult<u64> {
        let to = match whence {
            0 if offset >= 0 => SeekFrom::Start(offset as u64),
            0 => {
                return Err(PyValueError::new_err(format!(
                    "negative seek position {offset}"
                )))
            }
            1 => SeekFrom::Current(offset),
            2 => SeekFrom::End(offset),
            _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
        };
        Ok(self.reader()?.seek(to)?)
    }

    fn tell(&mut self) -> PyResult<u64> {
        Ok(self.reader()?.position())
    }

    fn readable(&mut self) -> PyResult<bool> {
        self.reader().map(|_| true)
    }

    fn seekable(&mut self) -> PyResult<bool> {
        self.reader().map(|_| true)
    }

    fn writable(&mut self) -> PyResult<bool> {
        self.reader().map(|_| false)
    }

    fn isatty(&self) -> bool {
        false
    }

    fn flush(&self) {}

    /// There is no descriptor: io.UnsupportedOperation, as for io.BytesIO.
    fn fileno(&self, py: Python<'_>) -> PyResult<()> {
        let unsupported = py.import("io")?.getattr("UnsupportedOperation")?;
        Err(PyErr::from_value(unsupported.call1(("fileno",))?))
    }

    /// The inode read.
    #[getter]
    fn inode(&mut self) -> PyResult<u32> {
        Ok(self.reader()?.ino())
    }

    #[getter]
    fn mode(&self) -> &'static str {
        "rb"
    }

    #[getter]
    fn closed(&self) -> bool {
        self.reader.is_none()
    }

    fn close(&mut self) {
        self.reader = None;
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
