//! FUSE over io_uring end to end, with a tiny filesystem of its own (a root directory and one
//! 8 MiB file) so that the transport is tested apart from the protocol adapter: mount, INIT
//! over /dev/fuse agreeing FUSE_OVER_IO_URING, then `stat`, `statfs`, big writes and reads
//! and deferred fsync replies through the rings. Needs root, /dev/fuse and a kernel with the
//! fuse module's `enable_uring` switch, which it turns on for the test and restores after.

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use uext4_fuse::dev_uring::{self, Config, ENABLE_PARAM};
use uext4_fuse::transport::{Answer, InHeader, RawRequest, Serve, Transport, OUT_HEADER_LEN};
use uext4_fuse::{Options, TransportKind};

const FILE_LEN: usize = 8 << 20;
const MAX_WRITE: u32 = 1 << 20;

/// Sets the module switch to Y and puts the old value back when dropped.
struct Switch(
    String,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

/// The tests of this file take turns: one's restoring the switch must not fall in another's
/// INIT.
static TURN: Mutex<()> = Mutex::new(());

impl Switch {
    fn on() -> Option<Switch> {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::fs::read_to_string(ENABLE_PARAM).ok()?;
        std::fs::write(ENABLE_PARAM, "Y").ok()?;
        Some(Switch(old.trim().to_string(), turn))
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_PARAM, &self.0);
    }
}

fn usable() -> Option<Switch> {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: FUSE over io_uring needs root and /dev/fuse");
        return None;
    }
    if !Path::new(ENABLE_PARAM).exists() {
        eprintln!("SKIP: no {ENABLE_PARAM}: this kernel has no FUSE over io_uring (6.14+)");
        return None;
    }
    let s = Switch::on();
    if s.is_none() {
        eprintln!("SKIP: cannot set {ENABLE_PARAM} to Y");
    }
    s
}

/// The test's filesystem: root (1) holds "f" (2), an 8 MiB file in memory.
struct Tiny {
    data: Mutex<Vec<u8>>,
    fsyncs: AtomicU64,
    /// Requests served on the rings' threads.
    on_ring: AtomicU64,
}

impl Tiny {
    fn new() -> Tiny {
        Tiny {
            data: Mutex::new(vec![0u8; FILE_LEN]),
            fsyncs: AtomicU64::new(0),
            on_ring: AtomicU64::new(0),
        }
    }
}

fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_ne_bytes());
}
fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}

/// `struct fuse_attr` (88 bytes) of inode `ino` at `b[o..]`.
fn attr(b: &mut [u8], o: usize, ino: u64) {
    b[o..o + 88].fill(0);
    put_u64(b, o, ino);
    let (size, mode, nlink) = if ino == 1 {
        (4096, libc::S_IFDIR | 0o755, 2)
    } else {
        (FILE_LEN as u64, libc::S_IFREG | 0o644, 1)
    };
    put_u64(b, o + 8, size);
    put_u64(b, o + 16, size / 512);
    put_u32(b, o + 60, mode);
    put_u32(b, o + 64, nlink);
    put_u32(b, o + 84, 4096);
}

impl Serve for Tiny {
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], from: &Arc<dyn Transport>) -> Answer {
        let h = &req.header;
        let on_ring = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("uext4-uring"));
        if on_ring {
            self.on_ring.fetch_add(1, Ordering::Relaxed);
        }
        match h.opcode {
            26 => Answer::Reply(init_out(req.fixed, out).0),
            // LOOKUP: entry_out of "f".
            1 if h.nodeid == 1 && req.rest.starts_with(b"f\0") => {
                out[..128].fill(0);
                put_u64(out, 0, 2);
                attr(out, 40, 2);
                Answer::Reply(128)
            }
            1 => Answer::Error(libc::ENOENT),
            // GETATTR, SETATTR: attr_out.
            3 | 4 => {
                out[..104].fill(0);
                attr(out, 16, h.nodeid);
                Answer::Reply(104)
            }
            // OPEN, OPENDIR: open_out, no handle.
            14 | 27 => {
                out[..16].fill(0);
                Answer::Reply(16)
            }
            // READ: read_in at fixed, offset 8 / size 16.
            15 => {
                let (off, size) = (get_u64(req.fixed, 8) as usize, get_u32(req.fixed, 16));
                let data = self.data.lock().unwrap();
                let end = (off + size as usize).min(FILE_LEN);
                let n = end.saturating_sub(off);
                out[..n].copy_from_slice(&data[off..off + n]);
                Answer::Reply(n)
            }
            // WRITE: write_in at fixed, offset 8 / size 16; the data is `rest`.
            16 => {
                let (off, size) = (get_u64(req.fixed, 8) as usize, get_u32(req.fixed, 16));
                let n = (size as usize).min(req.rest.len());
                if off + n > FILE_LEN {
                    return Answer::Error(libc::EFBIG);
                }
                self.data.lock().unwrap()[off..off + n].copy_from_slice(&req.rest[..n]);
                out[..8].fill(0);
                put_u32(out, 0, n as u32);
                Answer::Reply(8)
            }
            // STATFS: kstatfs.
            17 => {
                out[..80].fill(0);
                put_u64(out, 0, 1000);
                put_u64(out, 8, 500);
                put_u64(out, 16, 500);
                put_u32(out, 40, 4096);
                put_u32(out, 44, 255);
                put_u32(out, 48, 4096);
                Answer::Reply(80)
            }
            // FSYNC: kept, answered later from another thread.
            // fdatasync: answered through the transport before serve even returns, as a
            // group commit that finished at once would.
            20 if get_u32(req.fixed, 8) & 1 != 0 => {
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
                from.reply_later(h.unique, Ok(&[])).expect("early reply");
                Answer::None
            }
            20 => {
                let unique = h.unique;
                let r = from.clone();
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    r.reply_later(unique, Ok(&[])).expect("deferred reply");
                });
                Answer::None
            }
            // READDIR: empty; RELEASE, FLUSH, RELEASEDIR, ACCESS, DESTROY: done.
            28 | 18 | 25 | 29 | 34 | 38 => Answer::Reply(0),
            _ => Answer::Error(libc::ENOSYS),
        }
    }
}

fn mount(dev: &OwnedFd, mnt: &Path) {
    let src = CString::new("uringtest").unwrap();
    let target = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let fstype = CString::new("fuse.uringtest").unwrap();
    let data = CString::new(format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        dev.as_raw_fd()
    ))
    .unwrap();
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(r, 0, "mount: {}", std::io::Error::last_os_error());
}

/// Writes the body of the INIT reply for `init_in` into `out`, agreeing FUSE_OVER_IO_URING
/// when the kernel offered it; returns its length and whether it was agreed.
fn init_out(init_in: &[u8], out: &mut [u8]) -> (usize, bool) {
    let a = init_in;
    let (major, minor, readahead, flags) =
        (get_u32(a, 0), get_u32(a, 4), get_u32(a, 8), get_u32(a, 12));
    let flags2 = if flags & (1 << 30) != 0 {
        get_u32(a, 16)
    } else {
        0
    };
    let offered = (u64::from(flags2) << 32 | u64::from(flags)) & dev_uring::FUSE_OVER_IO_URING;
    assert_eq!(major, 7);
    out[..64].fill(0);
    put_u32(out, 0, 7);
    put_u32(out, 4, minor);
    put_u32(out, 8, readahead);
    // ASYNC_READ, BIG_WRITES, MAX_PAGES, INIT_EXT.
    put_u32(out, 12, 1 | (1 << 5) | (1 << 22) | (1 << 30));
    out[16..18].copy_from_slice(&16u16.to_ne_bytes());
    out[18..20].copy_from_slice(&12u16.to_ne_bytes());
    put_u32(out, 20, MAX_WRITE);
    put_u32(out, 24, 1);
    out[28..30].copy_from_slice(&256u16.to_ne_bytes());
    if offered != 0 {
        put_u32(out, 32, (dev_uring::FUSE_OVER_IO_URING >> 32) as u32);
    }
    (64, offered != 0)
}

/// Reads INIT from /dev/fuse and answers it; whether FUSE_OVER_IO_URING was agreed.
fn init(dev: &OwnedFd) -> bool {
    let mut buf = vec![0u8; MAX_WRITE as usize + 8192];
    // SAFETY: reads into a live buffer of its length.
    let n = unsafe { libc::read(dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "read INIT: {}", std::io::Error::last_os_error());
    let h = InHeader::parse(&buf).unwrap();
    assert_eq!(h.opcode, 26);
    let mut out = vec![0u8; OUT_HEADER_LEN + 64];
    let (n, agreed) = init_out(&buf[40..], &mut out[OUT_HEADER_LEN..]);
    put_u32(&mut out, 0, (OUT_HEADER_LEN + n) as u32);
    put_u64(&mut out, 8, h.unique);
    // SAFETY: writes a live buffer of its length.
    let w = unsafe { libc::write(dev.as_raw_fd(), out.as_ptr().cast(), out.len()) };
    assert_eq!(w, out.len() as isize, "{}", std::io::Error::last_os_error());
    agreed
}

/// Serves what still comes over /dev/fuse (FORGET, INTERRUPT): no reply for those, ENOSYS
/// for anything else, counting the others. Ends at ENODEV (unmounted).
fn dev_loop(dev: Arc<OwnedFd>, others: Arc<AtomicU64>) {
    let mut buf = vec![0u8; MAX_WRITE as usize + 8192];
    loop {
        // SAFETY: reads into a live buffer of its length.
        let n = unsafe { libc::read(dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                _ => return,
            }
        }
        let h = InHeader::parse(&buf[..n as usize]).unwrap();
        if matches!(h.opcode, 2 | 36 | 42) {
            continue;
        }
        others.fetch_add(1, Ordering::Relaxed);
        let mut out = [0u8; OUT_HEADER_LEN];
        put_u32(&mut out, 0, OUT_HEADER_LEN as u32);
        out[4..8].copy_from_slice(&(-libc::ENOSYS).to_ne_bytes());
        put_u64(&mut out, 8, h.unique);
        // SAFETY: writes a live buffer of its length.
        unsafe { libc::write(dev.as_raw_fd(), out.as_ptr().cast(), out.len()) };
    }
}

/// stat, statfs, 1 MiB writes and direct reads, then more fsyncs at once than a queue has
/// entries.
fn exercise(mnt: &Path, tiny: &Tiny) {
    let md = std::fs::metadata(mnt).unwrap();
    assert!(md.is_dir());
    let f = mnt.join("f");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), FILE_LEN as u64);
    assert!(std::fs::metadata(mnt.join("g")).is_err());
    // SAFETY: statvfs into a zeroed struct, with a valid path.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    let p = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut sv) }, 0);
    assert_eq!(sv.f_blocks, 1000);

    // Big writes (the handler reads them in place) and direct reads of 1 MiB.
    let pattern: Vec<u8> = (0..4 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all(&pattern).unwrap();
    w.sync_all().unwrap();
    assert_eq!(&tiny.data.lock().unwrap()[..pattern.len()], &pattern[..]);
    let mut r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&f)
        .unwrap();
    r.seek(SeekFrom::Start(0)).unwrap();
    let mut back = vec![0u8; pattern.len()];
    r.read_exact(&mut back).unwrap();
    assert!(back == pattern, "read back differs");

    // Deferred replies: more fsyncs at once than entries on a queue.
    let jobs: Vec<_> = (0..24)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                let w = std::fs::OpenOptions::new().write(true).open(f).unwrap();
                w.sync_all().unwrap();
                w.sync_data().unwrap();
            })
        })
        .collect();
    for j in jobs {
        j.join().unwrap();
    }
    assert!(tiny.fsyncs.load(Ordering::Relaxed) >= 49);
}

fn scratch_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uext4-uring-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn serves_through_the_rings() {
    let Some(_switch) = usable() else { return };
    let mnt = scratch_dir("raw");
    // SAFETY: a plain open of a device node.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a descriptor open just returned.
    let dev = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    mount(&dev, &mnt);
    let guard = Unmount(mnt.clone());
    assert!(init(&dev), "the kernel did not offer FUSE_OVER_IO_URING");
    let tiny = Arc::new(Tiny::new());
    let cfg = Config {
        max_write: MAX_WRITE,
        max_pages: 256,
        entries_per_queue: 4,
    };
    let server = dev_uring::start(dev.clone(), &cfg, tiny.clone()).expect("start");
    let others = Arc::new(AtomicU64::new(0));
    let dev_thread = {
        let (dev, others) = (dev.clone(), others.clone());
        std::thread::spawn(move || dev_loop(dev, others))
    };

    exercise(&mnt, &tiny);
    assert!(server.served() > 0, "nothing came through the rings");
    // A unique the rings do not hold is left to /dev/fuse.
    let e = server.replier().reply_later(3, Ok(&[])).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert_eq!(
        others.load(Ordering::Relaxed),
        0,
        "requests came over /dev/fuse"
    );
    drop(guard);
    dev_thread.join().unwrap();
    server.join();
    let _ = std::fs::remove_dir(&mnt);
}

/// A registration the kernel refuses (here: payload buffers smaller than INIT's max_write)
/// must leave the connection to /dev/fuse: start fails, and requests, which the kernel held
/// for the rings until then, arrive on /dev/fuse instead of hanging.
#[test]
fn refused_registration_falls_back_to_dev_fuse() {
    let Some(_switch) = usable() else { return };
    let mnt = scratch_dir("refused");
    // SAFETY: a plain open of a device node.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a descriptor open just returned.
    let dev = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    mount(&dev, &mnt);
    let guard = Unmount(mnt.clone());
    assert!(init(&dev), "the kernel did not offer FUSE_OVER_IO_URING");
    let too_small = Config {
        max_write: 4096,
        max_pages: 1,
        entries_per_queue: 2,
    };
    let e = dev_uring::start(dev.clone(), &too_small, Arc::new(Tiny::new()));
    assert!(
        e.is_err(),
        "the kernel took payload buffers below max_write"
    );
    let others = Arc::new(AtomicU64::new(0));
    let dev_thread = {
        let (dev, others) = (dev.clone(), others.clone());
        std::thread::spawn(move || dev_loop(dev, others))
    };
    // The stat gets an answer (ENOSYS from the /dev/fuse loop) instead of waiting forever.
    let (tx, rx) = std::sync::mpsc::channel();
    let m = mnt.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::metadata(m).is_ok());
    });
    let answered = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert!(
        answered.is_ok(),
        "a request hung after the refused registration"
    );
    assert!(others.load(Ordering::Relaxed) > 0);
    drop(guard);
    dev_thread.join().unwrap();
    let _ = std::fs::remove_dir(&mnt);
}

#[test]
fn session_serves_through_the_rings() {
    let Some(_switch) = usable() else { return };
    let mnt = scratch_dir("session");
    let tiny = Arc::new(Tiny::new());
    let opts = Options {
        threads: 2,
        transport: TransportKind::Uring,
        ..Options::default()
    };
    let served = uext4_fuse::serve_with(tiny.clone(), Path::new("tiny"), &mnt, &opts).unwrap();
    let guard = Unmount(mnt.clone());
    exercise(&mnt, &tiny);
    assert!(
        tiny.on_ring.load(Ordering::Relaxed) > 0,
        "nothing came through the rings"
    );
    drop(guard);
    served.join().unwrap();
    let _ = std::fs::remove_dir(&mnt);
}

/// Unmounts on drop, so a failed assertion does not leave the mount behind.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
