//! A read-only block device over a Python file object (anything with `seek` and `read`: an
//! open file, `io.BytesIO`, a dfVFS file-like object): each read seeks and reads under the
//! GIL. Reads are serialised by a lock taken before the GIL, and the engine is only ever
//! called with the GIL released, so the two cannot wait on each other.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::io;
use uext4::blockdev::BlockDevice;

pub(crate) struct PyFileDevice {
    file: Py<PyAny>,
    size: u64,
    lock: Mutex<()>,
}

impl PyFileDevice {
    /// Wraps `file`; its size is where `seek(0, 2)` lands.
    pub(crate) fn new(file: &Bound<'_, PyAny>) -> PyResult<Self> {
        let size: u64 = file.call_method1("seek", (0, 2))?.extract()?;
        Ok(PyFileDevice {
            file: file.clone().unbind(),
            size,
            lock: Mutex::new(()),
        })
    }

    fn read_into(&self, py: Python<'_>, off: u64, buf: &mut [u8]) -> PyResult<()> {
        let f = self.file.bind(py);
        f.call_method1("seek", (off,))?;
        let mut done = 0;
        while done < buf.len() {
            let chunk = f.call_method1("read", (buf.len() - done,))?;
            let n = match chunk.downcast::<PyBytes>() {
                Ok(b) => copy(b.as_bytes(), &mut buf[done..]),
                Err(_) => copy(&chunk.extract::<Vec<u8>>()?, &mut buf[done..]),
            };
            if n == 0 {
                return Err(pyo3::exceptions::PyEOFError::new_err(format!(
                    "the file object ends before byte {}",
                    off + buf.len() as u64
                )));
            }
            done += n;
        }
        Ok(())
    }
}

fn copy(from: &[u8], to: &mut [u8]) -> usize {
    let n = from.len().min(to.len());
    to[..n].copy_from_slice(&from[..n]);
    n
}

impl BlockDevice for PyFileDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let _g = self.lock.lock();
        Python::with_gil(|py| self.read_into(py, off, buf))
            .map_err(|e| io::Error::new(io::ErrorKind::UnexpectedEof, format!("file object: {e}")))
    }

    fn write_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        true
    }
}
