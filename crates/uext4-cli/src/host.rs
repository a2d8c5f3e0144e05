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
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    read_xattrs(
        // SAFETY: a valid C string and a buffer valid for its length.
        |b| unsafe { libc::llistxattr(c.as_ptr(), b.as_mut_ptr().cast(), b.len()) },
        // SAFETY: valid C strings and a buffer valid for its length.
        |n, b| unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), b.as_mut_ptr().cast(), b.len()) },
    )
}

/// The extended attributes of an open file or directory: (name, value) pairs.
pub(crate) fn fd_xattrs(fd: std::os::fd::RawFd) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    read_xattrs(
        // SAFETY: a buffer valid for its length.
        |b| unsafe { libc::flistxattr(fd, b.as_mut_ptr().cast(), b.len()) },
        // SAFETY: a valid C string and a buffer valid for its length.
        |n, b| unsafe { libc::fgetxattr(fd, n.as_ptr(), b.as_mut_ptr().cast(), b.len()) },
    )
}

/// Lists and reads extended attributes with the system calls given (by path or by
/// descriptor), growing the buffers on ERANGE; none where the filesystem has no support.
/// The list is first asked for its length: most files have none, and then nothing is
/// allocated.
fn read_xattrs(
    mut list: impl FnMut(&mut [u8]) -> isize,
    mut get: impl FnMut(&std::ffi::CStr, &mut [u8]) -> isize,
) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = Vec::new();
    let n = loop {
        let n = list(&mut names);
        if n == 0 {
            return Ok(Vec::new());
        }
        if n > 0 && names.is_empty() {
            // The length asked for: now the names (the list may grow meanwhile: ERANGE).
            names.resize(n as usize, 0);
            continue;
        }
        if n > 0 {
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
        let cn = std::ffi::CString::new(name)?;
        let mut val = vec![0u8; 256];
        let got = loop {
            let got = get(&cn, &mut val);
            if got >= 0 {
                break got as usize;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) if val.len() < 1 << 16 => val.resize(1 << 16, 0),
                _ => return Err(e),
            }
        };
        val.truncate(got);
        out.push((name.to_vec(), val));
    }
    Ok(out)
}
