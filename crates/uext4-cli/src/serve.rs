//! `uext4 serve --vhost-user-fs SOCKET IMAGE`: serves an image to a virtual machine as a
//! vhost-user-fs (virtio-fs) back end, the host's kernel never parsing it.
//!
//! The image is read as `uext4 mount` reads it (IMAGE@N, offsets, NBD URIs, the same `-o`
//! list, keys) and opened the same way; the requests are served by the mount's handler
//! (`uext4_fuse::Uext4Fuse`, told that its callers are a guest's) over the virtio-fs
//! transport (`uext4_fuse::virtio_fs`). It stays in the foreground, as virtiofsd does, for one
//! connection: it ends when the monitor disconnects (the guest powered off, or the monitor
//! died) or on SIGINT/SIGTERM/SIGHUP, and then commits everything and marks the image clean,
//! as an unmount does. Once the monitor has connected it contains itself as the mount's
//! server does (unless `-o nosandbox`).

use crate::mount::{asked_rw, block_stop_signals, open_served, target, Opened, Target};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use uext4_fuse::virtio_fs::Config;
use uext4_fuse::Uext4Fuse;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Serve as a vhost-user-fs back end on this Unix socket (made here; a socket already
    /// there is replaced): `qemu-system-x86_64 -chardev socket,id=c,path=SOCKET -device
    /// vhost-user-fs-pci,chardev=c,tag=TAG` with the guest's memory shared
    /// (`-object memory-backend-memfd,id=mem,size=...,share=on -numa node,memdev=mem`),
    /// then `mount -t virtiofs TAG /mnt` in the guest.
    #[arg(long = "vhost-user-fs", value_name = "SOCKET", required = true)]
    vhost_user_fs: PathBuf,
    /// Comma-separated options, as for `uext4 mount` where they make sense: ro, rw,
    /// partition=N, offset=BYTES, size=BYTES, key=FILE, commit=SECONDS, errors=..., noacl,
    /// delalloc, the atime policy, ...; threads=N is the number of request queues offered
    /// (the monitor's num-request-queues may use fewer), each served by a thread.
    #[arg(short = 'o')]
    options: Vec<String>,
    /// The image file or block device (IMAGE@N, IMAGE@offset=BYTES, an NBD URI).
    image: PathBuf,
}

pub fn run_serve(a: ServeArgs) -> Result<()> {
    let Target {
        img,
        region,
        options,
        sandbox,
        opts,
        ..
    } = target(&a.image, &a.options, "serve")?;
    if sandbox == crate::sandbox::Mode::Required {
        if let Some(m) = crate::sandbox::missing_here().first() {
            bail!("sandbox=required: {m}");
        }
    }
    let image = if uext4::image::is_nbd_uri(&img.path) {
        img.path.clone()
    } else {
        std::fs::canonicalize(&img.path).with_context(|| img.path.display().to_string())?
    };
    let asked_rw = asked_rw(&options);
    let set = block_stop_signals();
    let Opened {
        fs,
        opts,
        lock: _lock,
    } = open_served(&image, region, &opts, asked_rw)?;
    let cfg = Config {
        request_queues: opts.threads.clamp(1, 64),
        ..Config::default()
    };
    let server = Arc::new(Uext4Fuse::new(fs.clone(), opts).for_guest(true));
    let session = match uext4_fuse::serve_vhost_user(server, &a.vhost_user_fs, cfg) {
        Ok(s) => s,
        Err(e) => {
            fs.unmount().context("writing the filesystem back")?;
            bail!("vhost-user-fs: {e}");
        }
    };
    eprintln!(
        "uext4: serving {} as a vhost-user-fs back end on {}",
        image.display(),
        a.vhost_user_fs.display()
    );
    let mut contained = sandbox == crate::sandbox::Mode::Off;
    loop {
        if !contained && session.is_connected() {
            contained = true;
            if let Err(e) = contain(&image, fs.is_read_only()) {
                session.stop();
                let _ = session.join();
                fs.unmount().context("writing the filesystem back")?;
                return Err(e);
            }
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // SAFETY: `set` is a valid signal set; a null info pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig > 0 {
            session.stop();
        }
        if session.is_finished() {
            break;
        }
    }
    let served = session.join();
    fs.unmount().context("writing the filesystem back")?;
    served.context("vhost-user-fs")
}

/// Contains the back end as a mount's server is contained (docs/SECURITY.md), once the
/// monitor has connected: nothing is accepted after that, and what the session still does
/// (vhost-user messages with the guest's memory as descriptors, mapping it, eventfds, epoll,
/// the image) is on the mount server's allowlist.
fn contain(image: &std::path::Path, read_only: bool) -> Result<()> {
    crate::log::prepare();
    let probe = crate::sandbox::start_probe();
    let local = (!uext4::image::is_nbd_uri(image)).then_some(image);
    crate::sandbox::contain(local, read_only, Vec::new())?;
    drop(probe);
    Ok(())
}
