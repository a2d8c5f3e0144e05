//! Data requests (read, write, fallocate, copy_file_range, ioctl) and directory listings.

use super::*;

impl Uext4Fuse {
    /// Reads straight into the reply (the kernel asks for at most max_pages pages, which the
    /// transport's buffer holds).
    pub(super) fn read(&self, ino: u32, offset: u64, size: u32, out: &mut [u8]) -> Reply {
        let n = (size as usize).min(out.len());
        self.fs
            .read(ino, offset, &mut out[..n])
            .map_err(|e| errno(&e))
    }

    pub(super) fn write(
        &self,
        h: &InHeader,
        ino: u32,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        out: &mut [u8],
    ) -> Reply {
        // A write from the page cache (writeback_cache, or a shared mapping's pages) is
        // whole or an error: the kernel's writeback takes a short count for the whole
        // request and marks its pages clean, so the rest would be lost without an error for
        // fsync to report. A program's own write may come back short, as pwrite(2) does.
        let kill = write_flags & abi::FUSE_WRITE_KILL_SUIDGID != 0;
        let cred = self.data_cred(h, Some(kill));
        let r = match (&cred, write_flags & abi::FUSE_WRITE_CACHE != 0) {
            (Some(c), true) => self
                .fs
                .write_all_as(c, ino, offset, data)
                .map(|m| (data.len(), m)),
            (Some(c), false) => self.fs.write_as(c, ino, offset, data),
            (None, true) => self
                .fs
                .write_all(ino, offset, data)
                .map(|()| (data.len(), false)),
            (None, false) => self.fs.write(ino, offset, data).map(|n| (n, false)),
        };
        let (n, changed) = r.map_err(|e| errno(&e))?;
        if changed {
            self.mode_changed(ino);
        }
        Ok(reply::written(out, n as u32))
    }

    pub(super) fn readdir(
        &self,
        ino: u32,
        offset: u64,
        size: u32,
        plus: bool,
        out: &mut [u8],
    ) -> Reply {
        if plus {
            return self.readdirplus(ino, offset, size, out);
        }
        let mut d = reply::Dirents::new(out, size);
        self.fs
            .readdir(ino, offset, &mut |e| {
                d.add(to_fuse(e.ino), e.next_offset, type_of_ft(e.kind), &e.name)
            })
            .map_err(|e| errno(&e))?;
        Ok(d.len())
    }

    fn readdirplus(&self, ino: u32, offset: u64, size: u32, out: &mut [u8]) -> Reply {
        let mut entries = Vec::new();
        self.fs
            .readdir(ino, offset, &mut |e| {
                entries.push(e);
                entries.len() < 512
            })
            .map_err(|e| errno(&e))?;
        let mut d = reply::Dirents::new(out, size);
        for e in entries {
            let Ok(a) = self.fs.getattr(e.ino) else {
                continue;
            };
            let dot = e.name == b"." || e.name == b"..";
            if !d.add_plus(
                a.generation as u64,
                TTL,
                &wire_attr(&a),
                e.next_offset,
                &e.name,
            ) {
                break;
            }
            // The kernel takes no lookup for "." and "..".
            if !dot {
                self.counted(&a);
            }
        }
        Ok(d.len())
    }

    pub(super) fn fallocate(
        &self,
        h: &InHeader,
        ino: u32,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> Reply {
        let mode = mode as i32;
        // Any fallocate changes the file as a write does: the engine takes away what a write
        // by this caller would.
        let r = match self.data_cred(h, None) {
            Some(c) => self
                .fs
                .fallocate_as(&c, ino, mode, offset, length)
                .map(|changed| {
                    if changed {
                        self.mode_changed(ino);
                    }
                }),
            None => self.fs.fallocate(ino, mode, offset, length),
        };
        empty(r)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_file_range(
        &self,
        h: &InHeader,
        src: u32,
        offset_in: u64,
        dst: u32,
        offset_out: u64,
        len: u64,
        out: &mut [u8],
    ) -> Reply {
        // Copied here in 1 MiB pieces: one request instead of a read and a write per page.
        let len = len.min(1 << 30);
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0u64;
        let cred = self.data_cred(h, None);
        let mut changed = false;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let n = match self.fs.read(src, offset_in + done, &mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(errno(&e)),
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            let w = match &cred {
                Some(c) => self.fs.write_as(c, dst, offset_out + done, &buf[..n]),
                None => self
                    .fs
                    .write(dst, offset_out + done, &buf[..n])
                    .map(|w| (w, false)),
            };
            match w {
                Ok((w, c)) => {
                    done += w as u64;
                    changed |= c;
                }
                Err(e) if done == 0 => return Err(errno(&e)),
                Err(_) => break,
            }
            if n < want {
                break;
            }
        }
        if changed {
            self.mode_changed(dst);
        }
        Ok(reply::written(out, done as u32))
    }

    pub(super) fn ioctl(&self, ino: u32, cmd: u32, out_size: u32, out: &mut [u8]) -> Reply {
        // lsattr's FS_IOC_GETFLAGS and FS_IOC_GETVERSION (both sizes of their argument); the
        // kernel writes an int for either, so 4 bytes come back.
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const GETVERSION: [u32; 2] = [0x8008_7601, 0x8004_7601];
        // The inode flags the kernel's ext4 shows to users (EXT4_FL_USER_VISIBLE).
        const USER_VISIBLE: u32 = 0x705B_DFFF;
        if !GETFLAGS.contains(&cmd) && !GETVERSION.contains(&cmd) {
            return Err(libc::ENOTTY);
        }
        if out_size < 4 {
            return Err(libc::EINVAL);
        }
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        let value = if GETFLAGS.contains(&cmd) {
            a.flags & USER_VISIBLE
        } else {
            a.generation
        };
        Ok(reply::ioctl(out, 0, &value.to_le_bytes()))
    }
}
