//! FUSE over io_uring (fs/fuse/dev_uring.c, Linux 6.14 and later).
//!
//! After INIT agreed FUSE_OVER_IO_URING, the kernel hands requests to the server through ring
//! entries instead of `read`s of /dev/fuse. The kernel keeps one queue per possible CPU and
//! puts a request on the queue of the CPU its caller runs on; it uses the rings only once
//! every queue has an entry registered. Each queue here is one thread, pinned to its CPU (the
//! caller sleeps there while the server works, so the request is served from a warm cache),
//! with its own io_uring of 128-byte SQEs, which `IORING_OP_URING_CMD` needs for the
//! 80-byte command area. An entry is a `struct fuse_uring_req_header` (the in/out header,
//! the opcode's fixed arguments and `fuse_uring_ent_in_out`) and a payload buffer at least
//! as large as the biggest request or reply the connection agreed. The thread registers its
//! entries (`FUSE_IO_URING_CMD_REGISTER`); each completion is one request in its entry; the
//! reply goes back into the same entry and `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` both ends
//! the request and gives the entry back for the next one: one `io_uring_enter` per request.
//!
//! What still travels over /dev/fuse: FORGET, BATCH_FORGET and INTERRUPT, and notifications
//! (the kernel sends the first three there and takes the last only there), so the session
//! keeps reading /dev/fuse beside the rings.
//!
//! A request the handler keeps ([`Answer::None`], a deferred fsync) holds its entry until
//! [`Transport::reply_later`] sends the reply: the call puts the reply in the queue's
//! mailbox and wakes the queue's thread through an eventfd, and that thread commits it, as
//! a ring takes its submissions from one thread.

use crate::transport::{
    Answer, InHeader, OutHeader, RawRequest, Serve, Transport, IN_HEADER_LEN, OUT_HEADER_LEN,
};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// FUSE_OVER_IO_URING, bit 41 of the INIT flags (bit 9 of `flags2`).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;

/// The fuse module's switch; the kernel offers FUSE_OVER_IO_URING only while it is Y.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for `fuse_in_header` / `fuse_out_header`.
const IN_OUT_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for the opcode's fixed argument struct.
const OP_IN_SZ: usize = 128;
/// `FUSE_IO_URING_CMD_REGISTER`: hand an entry to the kernel.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: end the entry's request, take the next one.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel's smallest payload buffer (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;
/// A request whose payload is at most this long is copied out of the entry, so the handler
/// writes its reply straight into the entry; a longer one (a big write, whose reply is
/// small) is read in place and the reply copied in.
const COPY_IN_MAX: usize = 64 * 1024;
/// The `user_data` of the eventfd read that wakes a queue for deferred replies.
const WAKE: u64 = u64::MAX;

/// `struct fuse_uring_ent_in_out`: 32 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct EntInOut {
    /// Offset 0: unused (0).
    flags: u64,
    /// Offset 8: the request's unique, which the commit names.
    commit_id: u64,
    /// Offset 16: bytes of payload: the request's on fetch, the reply's on commit.
    payload_sz: u32,
    /// Offset 20.
    padding: u32,
    /// Offset 24.
    reserved: u64,
}

/// `struct fuse_uring_req_header`: `iov[0]` of an entry, 288 bytes.
#[repr(C)]
struct ReqHeader {
    /// Offset 0: `fuse_in_header` on fetch, `fuse_out_header` on commit.
    in_out: [u8; IN_OUT_SZ],
    /// Offset 128: the opcode's fixed argument struct (`in_args[0]`), when it has one.
    op_in: [u8; OP_IN_SZ],
    /// Offset 256.
    ent: EntInOut,
}

const _: () = assert!(std::mem::size_of::<EntInOut>() == 32);
const _: () = assert!(std::mem::size_of::<ReqHeader>() == 288);
// The SQE's `len` is patched by offset (see `with_len`).
const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

/// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area: flags (0), the commit id
/// at offset 8, the queue at offset 16.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Sets `len` (offset 24 of `struct io_uring_sqe`), which REGISTER reads as the number of
/// iovecs and the io-uring crate's `UringCmd80` does not set.
fn with_len(mut e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is #[repr(C)] and begins with the kernel's `struct io_uring_sqe`,
    // whose u32 `len` lies at byte 24 (include/uapi/linux/io_uring.h); the size is asserted.
    unsafe {
        let p = (&mut e as *mut squeue::Entry128).cast::<u8>();
        p.add(24).cast::<u32>().write_unaligned(len);
    }
    e
}

/// How the rings are laid out.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `max_write` INIT agreed.
    pub max_write: u32,
    /// The `max_pages` INIT agreed.
    pub max_pages: u16,
    /// Entries per queue: how many requests of one CPU can be in the server at once,
    /// deferred ones included (beyond that the kernel keeps them queued).
    pub entries_per_queue: usize,
}

impl Config {
    /// The payload buffer of an entry: what the kernel demands (`max_payload_sz`), plus a
    /// page so that the handler's output buffer holds `max_write + 4096` bytes as
    /// [`Serve::serve`] promises; a whole number of pages.
    fn payload_len(&self) -> usize {
        let page = page_size();
        let need = MIN_PAYLOAD
            .max(self.max_write as usize)
            .max(self.max_pages as usize * page);
        need.max(self.max_write as usize + 4096).div_ceil(page) * page
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Whether FUSE over io_uring can be used here: the fuse module has the switch and it is on,
/// and this process may create an io_uring with 128-byte SQEs. Check it before agreeing
/// FUSE_OVER_IO_URING at INIT: once agreed, the kernel holds every request until the rings
/// are registered or a registration fails, and without a ring neither can happen.
pub fn available() -> io::Result<()> {
    let v = std::fs::read_to_string(ENABLE_PARAM).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{ENABLE_PARAM}: {e} (the kernel has no FUSE over io_uring: Linux 6.14+)"),
        )
    })?;
    if v.trim() != "Y" {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{ENABLE_PARAM} is {} (echo Y > it, as root)", v.trim()),
        ));
    }
    IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    Ok(())
}

/// The possible CPUs (`/sys/devices/system/cpu/possible`, "0-3,5"): the kernel has a queue
/// for each id below the highest plus one.
fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let last = s
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max();
    match last {
        Some(n) => n + 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// What the queues' threads and [`Transport::reply_later`] share.
struct Shared {
    /// Unique of each kept (deferred) ring request, to its queue; filled by the queue's
    /// thread when the handler answered [`Answer::None`], emptied by `reply_later`.
    parked: Mutex<HashMap<u64, u16>>,
    queues: Vec<QueueShared>,
    /// Requests served through the rings.
    served: AtomicU64,
    /// Set by [`UringServer::join`]: the connection is gone, end even with kept requests.
    stop: AtomicBool,
}

/// A deferred reply on its way to the queue's thread: the request's unique, and the body or
/// an errno.
type Mail = (u64, Result<Vec<u8>, i32>);

/// One queue's part of [`Shared`].
struct QueueShared {
    /// The unique of the request the queue's thread is serving now (0: none). A deferred
    /// reply can come before the handler has even returned [`Answer::None`].
    serving: AtomicU64,
    /// Deferred replies for the thread to commit: unique, and body or errno.
    mailbox: Mutex<Vec<Mail>>,
    /// Written to wake the thread when the mailbox has something.
    wake: OwnedFd,
    /// The thread has ended: replies can no longer be sent.
    closed: AtomicBool,
}

impl Shared {
    /// Which queue holds request `unique`, if it came through a ring. The order matters: a
    /// thread records a kept request in `parked` before it clears `serving`, so a request
    /// missed in `serving` here is found in `parked`.
    fn queue_of(&self, unique: u64) -> Option<u16> {
        for (qid, q) in self.queues.iter().enumerate() {
            if q.serving.load(Ordering::SeqCst) == unique {
                return Some(qid as u16);
            }
        }
        self.parked.lock().remove(&unique)
    }
}

/// Sends deferred replies for requests that came through the rings; it is the `from` every
/// ring request is served with. For any other unique (a request read from /dev/fuse)
/// `reply_later` fails with ENOENT, so a session that routes all deferred replies through
/// one transport can try the ring first and /dev/fuse next.
pub struct UringReplier(Arc<Shared>);

impl Transport for UringReplier {
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> io::Result<()> {
        let Some(qid) = self.0.queue_of(unique) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let q = &self.0.queues[qid as usize];
        if q.closed.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        q.mailbox.lock().push((unique, body.map(|b| b.to_vec())));
        wake(&q.wake)
    }
}

fn wake(fd: &OwnedFd) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The rings being served: one thread per queue.
pub struct UringServer {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl UringServer {
    /// The transport for deferred replies of ring requests.
    pub fn replier(&self) -> Arc<dyn Transport> {
        Arc::new(UringReplier(self.shared.clone()))
    }

    /// How many queues (and threads) serve.
    pub fn queues(&self) -> usize {
        self.threads.len()
    }

    /// Requests served through the rings so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// Waits until the kernel has taken every queue's entries back (the connection ended).
    /// A queue whose entries all hold kept requests when that happens learns it only when
    /// their replies fail: use [`UringServer::join`] once the /dev/fuse side has ended.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Waits for the queues' threads, once the connection has ended (the /dev/fuse side saw
    /// ENODEV): each ends when the kernel has taken its entries back.
    pub fn join(self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for q in &self.shared.queues {
            let _ = wake(&q.wake);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts serving the connection of /dev/fuse descriptor `dev` (any descriptor of it, kept
/// open while the queues run) through io_uring: one pinned thread per possible CPU, each registering `cfg.entries_per_queue`
/// entries. Call it after the INIT reply that agreed FUSE_OVER_IO_URING was written. On an
/// error the kernel has been told to go on with /dev/fuse alone (a failed registration turns
/// the connection's io_uring off), and the session serves over /dev/fuse.
pub fn start(dev: Arc<OwnedFd>, cfg: &Config, serve: Arc<dyn Serve>) -> io::Result<UringServer> {
    // A ring of our own first: if a queue cannot start, a deliberately failing registration
    // through it releases the requests the kernel holds for the rings.
    let probe = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    let n = possible_cpus();
    let mut queues = Vec::with_capacity(n);
    for _ in 0..n {
        // SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        queues.push(QueueShared {
            serving: AtomicU64::new(0),
            mailbox: Mutex::new(Vec::new()),
            // SAFETY: a descriptor eventfd just returned, owned by nothing else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            closed: AtomicBool::new(false),
        });
    }
    let shared = Arc::new(Shared {
        parked: Mutex::new(HashMap::new()),
        queues,
        served: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::with_capacity(n);
    for qid in 0..n {
        let (cfg, serve, shared, tx) = (cfg.clone(), serve.clone(), shared.clone(), tx.clone());
        let dev = dev.clone();
        let t = std::thread::Builder::new()
            .name(format!("uext4-uring-{qid}"))
            .spawn(move || queue_main(qid as u16, dev, &cfg, serve, shared, tx))?;
        threads.push(t);
    }
    drop(tx);
    let mut first_err = None;
    for r in rx.iter().take(n) {
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        turn_off(&probe, dev.as_raw_fd());
        return Err(e);
    }
    Ok(UringServer { shared, threads })
}

/// A queue's thread: sets the queue up, says how that went on `tx`, then serves.
fn queue_main(
    qid: u16,
    dev: Arc<OwnedFd>,
    cfg: &Config,
    serve: Arc<dyn Serve>,
    shared: Arc<Shared>,
    tx: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let fail = |e: io::Error| {
        shared.queues[qid as usize]
            .closed
            .store(true, Ordering::SeqCst);
        let _ = tx.send(Err(io::Error::new(
            e.kind(),
            format!("FUSE over io_uring, queue {qid}: {e}"),
        )));
    };
    let mut q = match Queue::new(qid, dev, cfg, serve, shared.clone()) {
        Ok(q) => q,
        Err(e) => return fail(e),
    };
    if let Err(e) = q.register() {
        // Entries registered before the refusal may still be handed requests (when the other
        // queues had made the ring ready): their memory must stay, so the queue is leaked.
        std::mem::forget(q);
        return fail(e);
    }
    let _ = tx.send(Ok(()));
    q.run();
}

/// Makes the kernel give up on the rings of this connection: a registration for a queue
/// that does not exist fails, and a failed registration clears the connection's io_uring
/// flag and wakes the requests that waited for the rings.
fn turn_off(ring: &IoUring<squeue::Entry128, cqueue::Entry>, dev: RawFd) {
    let iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let sqe = opcode::UringCmd80::new(types::Fd(dev), CMD_REGISTER)
        .cmd(cmd_req(0, u16::MAX))
        .addr(Some(iov.as_ptr() as u64))
        .build();
    let sqe = with_len(sqe, 2).user_data(0);
    // SAFETY: the iovecs outlive the submission, which completes before this returns.
    if unsafe { ring.submission_shared().push(&sqe) }.is_ok() {
        let _ = ring.submit_and_wait(1);
    }
}

/// Where an entry is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Its command is with the kernel (registered or committed, waiting for a request).
    Kernel,
    /// It holds a request the handler kept; the reply comes through the mailbox.
    Parked,
    /// The kernel released it (the connection is ending).
    Dead,
}

/// One ring entry's memory and state.
struct Ent {
    header: *mut ReqHeader,
    payload: *mut u8,
    /// The REGISTER command's `iov[0]` (header) and `iov[1]` (payload).
    iov: [libc::iovec; 2],
    state: State,
}

/// An anonymous mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced (the ring that lent it to
        // the kernel is dropped before the mappings: see Queue's field order).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One queue: its ring, entries and thread-local buffers. Fields drop in order: the ring
/// (which ends the kernel's use of the entries) before the mappings it points into.
struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    qid: u16,
    /// The /dev/fuse descriptor the commands name (`fd` is its number).
    _dev: Arc<OwnedFd>,
    fd: RawFd,
    /// `fd` is the ring's registered file 0.
    fixed_dev: bool,
    ents: Vec<Ent>,
    payload_len: usize,
    serve: Arc<dyn Serve>,
    shared: Arc<Shared>,
    /// What the handler answers kept requests through ([`UringReplier`]).
    from: Arc<dyn Transport>,
    /// Unique of each kept request, to its entry.
    parked: HashMap<u64, usize>,
    /// Entries whose command is with the kernel.
    in_kernel: usize,
    /// The kernel said the connection is ending.
    down: bool,
    /// A small request's payload, copied out of the entry.
    copy_in: Vec<u8>,
    /// A big request's reply, copied into the entry.
    copy_out: Vec<u8>,
    /// Where the eventfd read lands.
    wake_buf: Box<u64>,
    _headers: Mapping,
    _payloads: Mapping,
}

// SAFETY: the raw pointers in `ents` point into the queue's own mappings, which move with it
// to its thread and are only used there.
unsafe impl Send for Queue {}

impl Queue {
    fn new(
        qid: u16,
        dev: Arc<OwnedFd>,
        cfg: &Config,
        serve: Arc<dyn Serve>,
        shared: Arc<Shared>,
    ) -> io::Result<Queue> {
        pin_to_cpu(qid as usize);
        let n = cfg.entries_per_queue.max(1);
        let depth = (n + 2).next_power_of_two() as u32;
        // One thread submits and reaps, so the kernel may run the entries' work (copying a
        // request into an entry) when that thread waits, not by interrupting it.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(depth * 2)
            .build(depth)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(depth))?;
        let payload_len = cfg.payload_len();
        let hsz = std::mem::size_of::<ReqHeader>();
        let headers = Mapping::new((n * hsz).div_ceil(page_size()) * page_size())?;
        let payloads = Mapping::new(n * payload_len)?;
        let ents = (0..n)
            .map(|i| {
                // SAFETY: in bounds of the mappings just made (n entries each).
                let (header, payload) = unsafe {
                    (
                        headers.ptr.add(i * hsz).cast::<ReqHeader>(),
                        payloads.ptr.add(i * payload_len),
                    )
                };
                Ent {
                    header,
                    payload,
                    iov: [
                        libc::iovec {
                            iov_base: header.cast(),
                            iov_len: hsz,
                        },
                        libc::iovec {
                            iov_base: payload.cast(),
                            iov_len: payload_len,
                        },
                    ],
                    state: State::Kernel,
                }
            })
            .collect();
        let fixed_dev = ring.submitter().register_files(&[dev.as_raw_fd()]).is_ok();
        Ok(Queue {
            ring,
            qid,
            fd: dev.as_raw_fd(),
            fixed_dev,
            _dev: dev,
            ents,
            payload_len,
            serve,
            from: Arc::new(UringReplier(shared.clone())),
            shared,
            parked: HashMap::new(),
            in_kernel: 0,
            down: false,
            copy_in: Vec::with_capacity(COPY_IN_MAX),
            copy_out: vec![0u8; payload_len],
            wake_buf: Box::new(0),
            _headers: headers,
            _payloads: payloads,
        })
    }

    /// Registers every entry and arms the wake-up read. A registration the kernel refuses
    /// fails at once; EAGAIN (INIT not processed yet) is retried for a while.
    fn register(&mut self) -> io::Result<()> {
        let mut todo: Vec<usize> = (0..self.ents.len()).collect();
        for attempt in 0.. {
            for &i in &todo {
                self.push_register(i)?;
            }
            self.in_kernel += todo.len();
            self.ring.submit()?;
            // Runs the deferred completion work, so refusals are in the completion queue.
            self.ring.submitter().submit_and_wait(0)?;
            let mut again = Vec::new();
            let mut cq = self.ring.completion();
            cq.sync();
            let cqes: Vec<cqueue::Entry> = cq.collect();
            for c in cqes {
                let i = c.user_data() as usize;
                self.in_kernel -= 1;
                match -c.result() {
                    libc::EAGAIN if attempt < 200 => again.push(i),
                    e => return Err(io::Error::from_raw_os_error(e)),
                }
            }
            if again.is_empty() {
                break;
            }
            todo = again;
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.arm_wake()?;
        self.ring.submit()?;
        Ok(())
    }

    fn push_register(&mut self, i: usize) -> io::Result<()> {
        let e = &self.ents[i];
        let sqe = self
            .uring_cmd(CMD_REGISTER)
            .cmd(cmd_req(0, self.qid))
            .addr(Some(e.iov.as_ptr() as u64))
            .build();
        self.ents[i].state = State::Kernel;
        self.push(with_len(sqe, 2).user_data(i as u64))
    }

    /// A command on the /dev/fuse descriptor: the ring's registered file when it has one
    /// (saves looking the descriptor up on every request).
    fn uring_cmd(&self, op: u32) -> opcode::UringCmd80 {
        if self.fixed_dev {
            opcode::UringCmd80::new(types::Fixed(0), op)
        } else {
            opcode::UringCmd80::new(types::Fd(self.fd), op)
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let fd = self.shared.queues[self.qid as usize].wake.as_raw_fd();
        let sqe = opcode::Read::new(types::Fd(fd), (&mut *self.wake_buf as *mut u64).cast(), 8)
            .build()
            .user_data(WAKE);
        self.push(sqe.into())
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: every buffer an SQE names (iovecs, entry memory, the wake buffer) lives
        // in this queue, which outlives its ring.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Serves until the kernel has taken every entry back.
    fn run(&mut self) {
        let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(self.ents.len() + 1);
        loop {
            let stop = self.shared.stop.load(Ordering::SeqCst);
            if self.in_kernel == 0 && (self.down || stop) {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    tracing::error!("FUSE over io_uring, queue {}: {e}", self.qid);
                    break;
                }
            }
            cqes.clear();
            cqes.extend(self.ring.completion());
            for (k, c) in cqes.iter().enumerate() {
                self.complete(c);
                // Hand finished replies to the kernel before serving the next request, so
                // their callers wake now.
                if k + 1 < cqes.len() && !self.ring.submission().is_empty() {
                    let _ = self.ring.submit();
                }
            }
        }
        self.shared.queues[self.qid as usize]
            .closed
            .store(true, Ordering::SeqCst);
    }

    fn complete(&mut self, c: &cqueue::Entry) {
        if c.user_data() == WAKE {
            self.deliver_mail();
            if !self.down && !self.shared.stop.load(Ordering::SeqCst) {
                let _ = self.arm_wake();
            }
            return;
        }
        let i = c.user_data() as usize;
        self.in_kernel -= 1;
        match -c.result() {
            0 => self.serve_entry(i),
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                self.ents[i].state = State::Dead;
                self.down = true;
            }
            e => {
                // The commit found no request (it was aborted): the kernel keeps the entry
                // as in userspace, so lend it the same memory as a new entry.
                tracing::warn!(
                    "FUSE over io_uring, queue {}: commit: {}",
                    self.qid,
                    io::Error::from_raw_os_error(e)
                );
                if self.push_register(i).is_ok() {
                    self.in_kernel += 1;
                }
            }
        }
    }

    /// Serves the request the kernel put in entry `i` and commits the reply, or parks the
    /// entry when the handler keeps the request.
    fn serve_entry(&mut self, i: usize) {
        if self.ents[i].state != State::Kernel {
            tracing::error!("FUSE over io_uring: a request in an entry the server holds");
            return;
        }
        self.shared.served.fetch_add(1, Ordering::Relaxed);
        let e = &self.ents[i];
        // SAFETY: the kernel completed this entry's command: until the commit below it
        // neither reads nor writes the entry's memory, which this thread alone uses.
        let (hdr, payload) = unsafe {
            (
                &mut *e.header,
                std::slice::from_raw_parts_mut(e.payload, self.payload_len),
            )
        };
        let Some(header) = InHeader::parse(&hdr.in_out[..IN_HEADER_LEN]) else {
            return;
        };
        let unique = header.unique;
        let n = (hdr.ent.payload_sz as usize).min(self.payload_len);
        let mine = &self.shared.queues[self.qid as usize];
        mine.serving.store(unique, Ordering::SeqCst);
        let answer = if n <= COPY_IN_MAX {
            self.copy_in.clear();
            self.copy_in.extend_from_slice(&payload[..n]);
            let req = RawRequest {
                header,
                fixed: &hdr.op_in,
                rest: &self.copy_in,
            };
            self.serve.serve(&req, payload, &self.from)
        } else {
            let req = RawRequest {
                header,
                fixed: &hdr.op_in,
                rest: &payload[..n],
            };
            let a = self.serve.serve(&req, &mut self.copy_out, &self.from);
            if let Answer::Reply(m) = a {
                if m <= self.payload_len {
                    payload[..m].copy_from_slice(&self.copy_out[..m]);
                }
            }
            a
        };
        if answer == Answer::None {
            self.ents[i].state = State::Parked;
            self.parked.insert(unique, i);
            self.shared.parked.lock().insert(unique, self.qid);
        }
        mine.serving.store(0, Ordering::SeqCst);
        match answer {
            Answer::Reply(m) => self.commit(i, unique, Ok(m)),
            Answer::Error(errno) => self.commit(i, unique, Err(errno)),
            Answer::None => {}
        }
    }

    /// Commits the deferred replies in the mailbox.
    fn deliver_mail(&mut self) {
        let mail = std::mem::take(&mut *self.shared.queues[self.qid as usize].mailbox.lock());
        if !mail.is_empty() {
            // A reply that came while its request was still being served was routed by
            // `serving` and left the request's `parked` record behind.
            let mut parked = self.shared.parked.lock();
            for (unique, _) in &mail {
                parked.remove(unique);
            }
        }
        for (unique, body) in mail {
            let Some(i) = self
                .parked
                .remove(&unique)
                .filter(|&i| self.ents[i].state == State::Parked)
            else {
                tracing::warn!("FUSE over io_uring: a reply for {unique}, which is not kept");
                continue;
            };
            let reply = match body {
                Ok(b) if b.len() <= self.payload_len => {
                    // SAFETY: the entry is parked: the kernel does not touch it until the
                    // commit below.
                    let p =
                        unsafe { std::slice::from_raw_parts_mut(self.ents[i].payload, b.len()) };
                    p.copy_from_slice(&b);
                    Ok(b.len())
                }
                Ok(_) => Err(libc::EIO),
                Err(errno) => Err(errno),
            };
            self.commit(i, unique, reply);
        }
    }

    /// Writes the out header and commits entry `i`'s reply: `Ok(n)`, a body of `n` bytes
    /// already in the payload, or an errno.
    fn commit(&mut self, i: usize, unique: u64, reply: Result<usize, i32>) {
        let (n, error) = match reply {
            Ok(n) if n <= self.payload_len => (n, 0),
            Ok(n) => {
                tracing::error!("FUSE over io_uring: a reply of {n} bytes, beyond the entry");
                (0, -libc::EIO)
            }
            Err(errno) => (0, -errno.abs()),
        };
        // SAFETY: the entry is with this thread (served or parked) until the commit.
        let hdr = unsafe { &mut *self.ents[i].header };
        let oh = OutHeader {
            len: (OUT_HEADER_LEN + n) as u32,
            error,
            unique,
        };
        hdr.in_out[..OUT_HEADER_LEN].copy_from_slice(&oh.to_bytes());
        hdr.ent.payload_sz = n as u32;
        let sqe = self
            .uring_cmd(CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(unique, self.qid))
            .build()
            .user_data(i as u64);
        self.ents[i].state = State::Kernel;
        if self.push(sqe).is_ok() {
            self.in_kernel += 1;
        }
    }
}

/// Pins the calling thread to `cpu` when it is online and allowed; otherwise leaves it free
/// (a queue of a CPU that is not online gets no requests anyway).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays in its bounds for
    // cpu < CPU_SETSIZE, checked; sched_setaffinity reads the set only.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(std::mem::offset_of!(ReqHeader, op_in), 128);
        assert_eq!(std::mem::offset_of!(ReqHeader, ent), 256);
        assert_eq!(std::mem::offset_of!(EntInOut, payload_sz), 16);
        let c = cmd_req(0x1122, 3);
        assert_eq!(u64::from_ne_bytes(c[8..16].try_into().unwrap()), 0x1122);
        assert_eq!(u16::from_ne_bytes(c[16..18].try_into().unwrap()), 3);
    }

    #[test]
    fn sqe_len_patched() {
        let sqe = opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER)
            .addr(Some(0x1000))
            .build();
        let sqe = with_len(sqe, 2);
        // SAFETY: reading the bytes of a plain 128-byte repr(C) value.
        let b: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_ne_bytes(b[16..24].try_into().unwrap()), 0x1000);
        assert_eq!(b[0], io_uring::opcode::UringCmd80::CODE);
    }

    #[test]
    fn payload_is_big_enough() {
        let c = Config {
            max_write: 1 << 20,
            max_pages: 256,
            entries_per_queue: 1,
        };
        assert!(c.payload_len() >= (1 << 20) + 4096);
        assert_eq!(c.payload_len() % page_size(), 0);
        let small = Config {
            max_write: 4096,
            max_pages: 1,
            entries_per_queue: 1,
        };
        assert!(small.payload_len() >= MIN_PAYLOAD);
    }

    #[test]
    fn cpus() {
        assert!(possible_cpus() >= 1);
    }
}
