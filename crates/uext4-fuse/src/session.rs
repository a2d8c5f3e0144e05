//! A session: mount, the INIT handshake over /dev/fuse, then the loop threads (and FUSE over
//! io_uring when it was agreed), until the kernel lets go of the mount.

use crate::abi::{self, FUSE_OVER_IO_URING};
use crate::adapter::Uext4Fuse;
use crate::dev::{self, Agreed, DevChannel};
use crate::dev_uring::{self, UringServer};
use crate::mount;
use crate::notify::Notifier;
use crate::options::{Options, TransportKind};
use crate::transport::{Answer, Link, Serve, Transport};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use uext4::Fs;

/// A mount being served: the session's threads, and how to take the mount down.
pub struct Served {
    /// The /dev/fuse loop threads; each ends when the kernel lets go of the connection.
    threads: Vec<JoinHandle<io::Result<()>>>,
    /// The io_uring queues, when they serve.
    ring: Option<UringServer>,
    /// Told when everything has ended ([`Serve::ended`]).
    server: Arc<dyn Serve>,
    mountpoint: PathBuf,
}

impl Served {
    /// Unmounts (lazily when the mount is busy: then open files keep working until they are
    /// closed) and waits until the session has ended.
    pub fn unmount_and_join(self) -> io::Result<()> {
        mount::unmount(&self.mountpoint)?;
        self.join()
    }

    /// Whether the session has ended (the kernel let go of the mount).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Whether requests come through FUSE over io_uring.
    pub fn uses_uring(&self) -> bool {
        self.ring.is_some()
    }

    /// Waits until the session ends (someone else unmounted it), then tells the handler.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a loop thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        if let Some(ring) = self.ring {
            ring.join();
        }
        self.server.ended();
        first
    }
}

/// Mounts `image` at `mountpoint` and serves it with `server` from background threads until
/// it is unmounted ([`Served::unmount_and_join`], or `umount`/`fusermount3 -u` from
/// outside). Root mounts directly; other users through the setuid fusermount3, which opens
/// /dev/fuse with the user's rights (so the device must be accessible to them, as it is on
/// most distributions). A mount point `/dev/fd/N` is a /dev/fuse descriptor the caller has
/// mounted.
pub fn serve_with(
    server: Arc<dyn Serve>,
    image: &Path,
    mountpoint: &Path,
    opts: &Options,
) -> io::Result<Served> {
    let dev = mount::mount(image, mountpoint, opts)?;
    start(server.clone(), dev, opts)
        .map(|(threads, ring)| Served {
            threads,
            ring,
            server,
            mountpoint: mountpoint.to_path_buf(),
        })
        .inspect_err(|_| {
            // The kernel waits for an answer we will not give: take the mount down (a mount the
            // caller made through /dev/fd/N is the caller's to take down).
            if mount::fd_path(mountpoint).is_none() {
                let _ = mount::unmount(mountpoint);
            }
        })
}

type Threads = Vec<JoinHandle<io::Result<()>>>;

/// Serves the mounted descriptor `dev`: INIT here, then FUSE over io_uring if INIT agreed
/// it, and the /dev/fuse loop threads.
fn start(
    server: Arc<dyn Serve>,
    dev: OwnedFd,
    opts: &Options,
) -> io::Result<(Threads, Option<UringServer>)> {
    let dev = Arc::new(dev);
    let agreed = handshake(&dev, &*server)?;
    server.started(Link {
        notifier: Arc::new(Notifier::new(dev.clone())),
    });
    let ring = if agreed.flags & FUSE_OVER_IO_URING != 0 {
        let cfg = dev_uring::Config {
            max_write: agreed.max_write,
            max_pages: agreed.max_pages,
            // Kept requests (deferred fsyncs) hold an entry each.
            entries_per_queue: 32,
        };
        dev_uring::start(dev.clone(), &cfg, server.clone())
    } else {
        Err(io::Error::other(
            "the kernel did not agree FUSE_OVER_IO_URING (it needs Linux 6.14+ with the fuse \
             module's enable_uring parameter set)",
        ))
    };
    let (ring, loop_threads) = match ring {
        // FORGET, BATCH_FORGET and INTERRUPT still come through /dev/fuse.
        Ok(r) => (Some(r), 1),
        Err(e) if opts.transport == TransportKind::Uring => {
            return Err(uring_refused(e));
        }
        Err(e) => {
            if agreed.flags & FUSE_OVER_IO_URING != 0 {
                tracing::warn!("FUSE over io_uring: {e}; serving through /dev/fuse");
            }
            (None, opts.threads.max(1))
        }
    };
    let mut fds = vec![dev.clone()];
    for _ in 1..loop_threads {
        fds.push(Arc::new(dev::clone_dev(&dev)?));
    }
    let mut threads = Vec::new();
    for (i, fd) in fds.into_iter().enumerate() {
        let server = server.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("uext4-fuse-{i}"))
                .spawn(move || dev::serve_loop(fd, server, agreed))?,
        );
    }
    Ok((threads, ring))
}

/// Reads the kernel's INIT, has the handler answer it, and reads from the answer what was
/// agreed.
fn handshake(dev: &Arc<OwnedFd>, server: &dyn Serve) -> io::Result<Agreed> {
    let from: Arc<dyn Transport> = Arc::new(DevChannel { fd: dev.clone() });
    // Before INIT the kernel's request size limit is not known; INIT itself is small.
    let first = Agreed {
        max_write: 1 << 20,
        max_pages: 256,
        flags: 0,
    };
    let mut inbuf = vec![0u8; first.read_buf_len()];
    let mut out = vec![0u8; first.out_buf_len()];
    loop {
        let n = dev::read_request(dev, &mut inbuf)?;
        let Some(req) = dev::split(&inbuf[..n], false) else {
            continue;
        };
        if req.header.opcode != abi::INIT {
            // Nothing else comes before INIT is answered; refuse whatever does.
            dev::answer_request(dev, &req.header, Answer::Error(libc::EIO), &out);
            continue;
        }
        let answer = server.serve(&req, &mut out, &from);
        let body = match answer {
            Answer::Reply(n) => &out[..n],
            Answer::Error(e) => {
                let _ = dev::reply(dev, req.header.unique, Err(e));
                return Err(io::Error::other(format!(
                    "the server refused the kernel's INIT: {}",
                    io::Error::from_raw_os_error(e)
                )));
            }
            Answer::None => return Err(io::Error::other("the server did not answer INIT")),
        };
        let agreed = parse_init_out(body)
            .ok_or_else(|| io::Error::other("the server's INIT reply is too short"))?;
        dev::reply(dev, req.header.unique, Ok(body))?;
        return Ok(agreed);
    }
}

/// What the transports need from `struct fuse_init_out`, read as the kernel reads it
/// (fs/fuse/inode.c, process_init_reply): flags2 only with FUSE_INIT_EXT, max_pages only with
/// FUSE_MAX_PAGES, at least 4 KiB of write.
pub(crate) fn parse_init_out(b: &[u8]) -> Option<Agreed> {
    // Up to max_write at least.
    if b.len() < 24 {
        return None;
    }
    let o = abi::InitOut::parse(b);
    let mut flags = o.flags;
    if flags & abi::FUSE_INIT_EXT == 0 {
        flags &= u64::from(u32::MAX);
    }
    let max_pages = match o.max_pages {
        p if flags & abi::FUSE_MAX_PAGES != 0 && p > 0 => p,
        _ => 32,
    };
    Some(Agreed {
        max_write: o.max_write.max(4096),
        max_pages,
        flags,
    })
}

/// `-o transport=uring` where FUSE over io_uring cannot serve: the mount is refused
/// (ErrorKind::Unsupported).
fn uring_refused(why: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("transport=uring: {why}"),
    )
}

/// Whether a handler's INIT should ask for FUSE over io_uring under `opts`: unless
/// `transport=dev`, where this process can serve the rings. Once the kernel agrees, it holds
/// every request until the rings are registered (or a registration fails), so it is asked for
/// only where they can be.
pub fn asks_uring(opts: &Options) -> bool {
    opts.transport != TransportKind::Dev && dev_uring::available().is_ok()
}

/// Mounts `image` at `mountpoint` and serves `fs` (the adapter, [`Uext4Fuse`]) until it is
/// unmounted, as [`serve_with`]; INIT asks for FUSE over io_uring where [`asks_uring`] says
/// so, and `transport=uring` is refused where it cannot.
pub fn serve(fs: Arc<Fs>, image: &Path, mountpoint: &Path, opts: &Options) -> io::Result<Served> {
    if opts.transport == TransportKind::Uring {
        dev_uring::available().map_err(uring_refused)?;
    }
    let server = Uext4Fuse::new(fs, opts.clone()).with_uring(asks_uring(opts));
    serve_with(Arc::new(server), image, mountpoint, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_out_is_read_as_the_kernel_reads_it() {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[12..16]
            .copy_from_slice(&((abi::FUSE_INIT_EXT | abi::FUSE_MAX_PAGES) as u32).to_ne_bytes());
        b[20..24].copy_from_slice(&(1u32 << 20).to_ne_bytes());
        b[28..30].copy_from_slice(&256u16.to_ne_bytes());
        b[32..36].copy_from_slice(&((FUSE_OVER_IO_URING >> 32) as u32).to_ne_bytes());
        let a = parse_init_out(&b).unwrap();
        assert_eq!((a.max_write, a.max_pages), (1 << 20, 256));
        assert!(a.flags & FUSE_OVER_IO_URING != 0);
        // Without FUSE_INIT_EXT flags2 is not read; without FUSE_MAX_PAGES the default holds.
        b[12..16].copy_from_slice(&0u32.to_ne_bytes());
        let a = parse_init_out(&b).unwrap();
        assert_eq!((a.max_pages, a.flags), (32, 0));
        assert!(parse_init_out(&b[..16]).is_none());
    }
}
