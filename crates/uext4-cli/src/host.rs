//! Reading host files as the tools copy them: data segments (holes skipped) and extended
//! attributes.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Host data segments of a file: (offset, length), via SEEK_DATA/SEEK_HOLE.
pub(crate) fn host_segments(f: &std::fs::File, size: u64) -> Vec<(u64, u64)> {
    use std::os::unix::io::AsRawFd;
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: plain lseek on an open descriptor.
        let d = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        let h = unsafe { libc::lseek(f.as_raw_fd(), d, libc::SEEK_HOLE) };
        let h = if h < 0 { size as i64 } else { h };
        out.push((d as u64, (h - d) as u64));
        pos = h;
    }
    out
}

/// The extended attributes of a host path (not following a symlink): (name, value) pairs.
pub(crate) fn host_xattrs(p: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use std::ffi::CString;
    let c = CString::new(p.as_os_str().as_bytes())?;
    let mut names = vec![0u8; 4096];
    let n = loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name)?;
        let mut val = vec![0u8; 65536];
        // SAFETY: valid C strings and a buffer valid for its length.
        let got =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        val.truncate(got as usize);
        out.push((name.to_vec(), val));
    }
    Ok(out)
}
