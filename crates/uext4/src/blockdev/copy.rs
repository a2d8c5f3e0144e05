//! Copying a source file's bytes into a device (`BlockDevice::copy_new_from`): by the kernel
//! between two files (copy_file_range), else through a buffer.

use super::BlockDevice;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The trait's default `copy_new_from`: pread into a buffer, then `write_new_at`.
pub(super) fn copy_through_buffer<D: BlockDevice + ?Sized>(
    dev: &D,
    off: u64,
    src: &File,
    src_off: u64,
    len: u64,
) -> io::Result<u64> {
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let got = match src.read_at(&mut buf[..want], src_off + done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dev.write_new_at(off + done, &buf[..got])?;
        done += got as u64;
    }
    Ok(done)
}

/// `len` bytes of `src` from `src_off` into `file` (the backing file of `dev`) at `off`, copied
/// by the kernel; through a buffer where the kernel will not copy between these two files.
pub(super) fn kernel_copy<D: BlockDevice + ?Sized>(
    dev: &D,
    file: &File,
    off: u64,
    src: &File,
    src_off: u64,
    len: u64,
) -> io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let mut from = (src_off + done) as libc::loff_t;
        let mut to = (off + done) as libc::loff_t;
        let want = (len - done).min(1 << 30) as usize;
        // SAFETY: two descriptors we hold and offsets on our stack; no memory is passed.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut from,
                file.as_raw_fd(),
                &mut to,
                want,
                0,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as u64,
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Not between these two files (another filesystem, a kernel without it):
                    // the rest through a buffer.
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                        let rest = len - done;
                        return copy_through_buffer(dev, off + done, src, src_off + done, rest)
                            .map(|n| done + n);
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(done)
}
