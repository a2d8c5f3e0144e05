//! The /dev/fuse transport and session with a tiny handler of our own: INIT, GETATTR of the
//! root, STATFS, and GETXATTR answered later from another thread (the deferred replies a group
//! commit sends). Needs root and /dev/fuse; skips with a message otherwise.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use uext4_fuse::transport::{Answer, Link, RawRequest, Serve, Transport};
use uext4_fuse::{Options, TransportKind};

const INIT: u32 = 26;
const GETATTR: u32 = 3;
const STATFS: u32 = 17;
const GETXATTR: u32 = 22;
const VALUE: &[u8] = b"hello";

/// A request kept for later: its id, the size asked for, and the transport it came by.
type Later = (u64, u32, Arc<dyn Transport>);

struct Tiny {
    link: Arc<OnceLock<Link>>,
    later: Mutex<Sender<Later>>,
}

fn put<const N: usize>(out: &mut [u8], at: usize, v: [u8; N]) {
    out[at..at + N].copy_from_slice(&v);
}

impl Serve for Tiny {
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], from: &Arc<dyn Transport>) -> Answer {
        let u32_at = |o: usize| u32::from_ne_bytes(req.fixed[o..o + 4].try_into().unwrap());
        match req.header.opcode {
            INIT => {
                // fuse_init_out: 7.38, FUSE_MAX_PAGES | FUSE_INIT_EXT of what the kernel offers.
                out[..64].fill(0);
                put(out, 0, 7u32.to_ne_bytes());
                put(out, 4, 38u32.to_ne_bytes());
                put(out, 8, u32_at(8).to_ne_bytes());
                put(out, 12, (u32_at(12) & (1 << 22 | 1 << 30)).to_ne_bytes());
                put(out, 16, 16u16.to_ne_bytes());
                put(out, 18, 12u16.to_ne_bytes());
                put(out, 20, (128u32 << 10).to_ne_bytes());
                put(out, 24, 1u32.to_ne_bytes());
                put(out, 28, 32u16.to_ne_bytes());
                Answer::Reply(64)
            }
            GETATTR if req.header.nodeid == 1 => {
                // fuse_attr_out: valid 1 s, then fuse_attr.
                out[..104].fill(0);
                put(out, 0, 1u64.to_ne_bytes());
                put(out, 16, 1u64.to_ne_bytes()); // ino
                put(out, 16 + 60, (libc::S_IFDIR | 0o755).to_ne_bytes());
                put(out, 16 + 64, 2u32.to_ne_bytes()); // nlink
                put(out, 16 + 80, 4096u32.to_ne_bytes()); // blksize
                Answer::Reply(104)
            }
            STATFS => {
                out[..80].fill(0);
                put(out, 0, 1000u64.to_ne_bytes());
                put(out, 8, 600u64.to_ne_bytes());
                put(out, 16, 500u64.to_ne_bytes());
                put(out, 40, 4096u32.to_ne_bytes());
                put(out, 44, 255u32.to_ne_bytes());
                put(out, 48, 4096u32.to_ne_bytes());
                Answer::Reply(80)
            }
            GETXATTR if req.rest.starts_with(b"user.panic\0") => panic!("asked to"),
            GETXATTR => {
                let size = u32_at(0);
                let _ = self
                    .later
                    .lock()
                    .unwrap()
                    .send((req.header.unique, size, from.clone()));
                Answer::None
            }
            _ => Answer::Error(libc::ENOSYS),
        }
    }

    fn started(&self, link: Link) {
        let _ = self.link.set(link);
    }
}

fn getxattr_named(p: &Path, name: &std::ffi::CStr) -> std::io::Result<Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid path and name; the buffer's length is passed.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(buf[..n as usize].to_vec())
}

fn getxattr(p: &Path) -> Vec<u8> {
    getxattr_named(p, c"user.x").unwrap()
}

/// A mount point for test `tag`, and a tiny handler with the receiving end of its kept
/// requests.
fn setup(tag: &str) -> (std::path::PathBuf, Arc<Tiny>, Receiver<Later>) {
    let dir = std::env::temp_dir().join(format!("uext4-devfuse-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (tx, rx) = channel::<Later>();
    let tiny = Arc::new(Tiny {
        link: Arc::new(OnceLock::new()),
        later: Mutex::new(tx),
    });
    (dir, tiny, rx)
}

#[test]
fn tiny_server_over_dev_fuse() {
    if !uext4_testkit::fuse_usable("the /dev/fuse transport test") {
        return;
    }
    let (dir, tiny, rx) = setup("dev");
    let opts = Options {
        threads: 4,
        transport: TransportKind::Dev,
        ..Options::default()
    };
    let served = uext4_fuse::serve_with(tiny.clone(), Path::new("tiny"), &dir, &opts).unwrap();
    // The deferred replies, sent from a thread that reads no descriptor.
    let replier = std::thread::spawn(move || {
        let mut n = 0;
        while let Ok((unique, size, from)) = rx.recv() {
            let r = if size == 0 {
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&(VALUE.len() as u32).to_ne_bytes());
                from.reply_later(unique, Ok(&b))
            } else {
                from.reply_later(unique, Ok(VALUE))
            };
            r.unwrap();
            n += 1;
        }
        n
    });
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        (m.ino(), m.mode(), m.nlink()),
        (1, libc::S_IFDIR | 0o755, 2)
    );
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.starts_with("tiny ") && l.contains(" fuse.uext4 ")),
        "{mounts}"
    );
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs into a zeroed struct.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    assert_eq!((sv.f_blocks, sv.f_bfree, sv.f_bavail), (1000, 600, 500));
    // Many at once: they spread over the loop threads' descriptors, and each deferred reply
    // must go back by the descriptor its request came from.
    std::thread::scope(|s| {
        for _ in 0..32 {
            s.spawn(|| {
                for _ in 0..20 {
                    assert_eq!(getxattr(&dir), VALUE);
                }
            });
        }
    });
    // A handler that panics fails the request; the loop threads go on.
    for _ in 0..8 {
        let e = getxattr_named(&dir, c"user.panic").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
    assert_eq!(getxattr(&dir), VALUE);
    let link = tiny.link.get().unwrap();
    link.notifier.inval_inode(1, 0, 0).unwrap();
    // A name the kernel does not hold: nothing to drop.
    let e = link.notifier.inval_entry(1, b"absent").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = link.notifier.delete(1, 5, b"absent").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert!(link.notifier.inval_entry(1, &[b'a'; 2000]).is_err());
    assert!(!served.is_finished());
    served.unmount_and_join().unwrap();
    drop(tiny);
    assert!(replier.join().unwrap() > 32 * 20);
    let _ = std::fs::remove_dir(&dir);
}

#[test]
fn transport_uring_refuses_a_mount_without_it() {
    if !uext4_testkit::fuse_usable("the /dev/fuse transport test") {
        return;
    }
    // The tiny handler never asks for FUSE_OVER_IO_URING.
    let (dir, tiny, _rx) = setup("uring");
    let opts = Options {
        transport: TransportKind::Uring,
        ..Options::default()
    };
    let e = uext4_fuse::serve_with(tiny, Path::new("tiny-uring"), &dir, &opts)
        .err()
        .expect("transport=uring without io_uring must fail");
    assert!(e.to_string().contains("transport=uring"), "{e}");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.lines().any(|l| l.starts_with("tiny-uring ")),
        "the mount was left behind: {mounts}"
    );
    let _ = std::fs::remove_dir(&dir);
}
