//! The virtio-fs transport: a vhost-user-fs back end that a virtual machine monitor (QEMU's
//! `vhost-user-fs-pci`, Cloud Hypervisor's `--fs`) attaches to by a Unix socket, so that a
//! guest's kernel mounts the image (`mount -t virtiofs TAG /mnt`) without the host's kernel
//! parsing it.
//!
//! virtio-fs carries FUSE (the virtio spec, "File System Device"; Linux fs/fuse/virtio_fs.c):
//! each request is one descriptor chain whose device-readable part is the request as
//! /dev/fuse would hand it over (`fuse_in_header`, the opcode's fixed struct, names and data)
//! and whose device-writable part receives the reply (`fuse_out_header` and the body). So the
//! handler is the one the FUSE mount uses ([`Serve`]): this module only moves bytes between
//! descriptor chains and the handler's buffers, as `dev` does with read(2) and writev(2).
//! The vhost-user protocol (memory tables, vring setup, kicks and calls) is the rust-vmm
//! crates' (vhost, vhost-user-backend, virtio-queue, vm-memory); nothing of it is written here.
//!
//! Queues: queue 0 is the high-priority queue (the guest sends FORGET there, with no
//! writable part to answer into), 1..=N the request queues; N is what this back end offers
//! (the monitor's `num-request-queues` picks how many the guest sees; Linux 6.1, the guest
//! tested, uses only the first). Each queue has a thread of its own, serving its chains in order.
//! A FORGET on the high-priority queue is served at once but its chain goes back to the guest
//! later, with others (see [`FORGET_DELAY`]): the guest's driver only frees the buffer, and
//! one interrupt for many FORGETs instead of one each is what makes a removal cheaper.
//! Differences from /dev/fuse, each handled here:
//! - no mount step: the guest's first request is INIT, answered by the handler as on
//!   /dev/fuse; until then other requests fail (EIO), as in the /dev/fuse handshake;
//! - a request kept for later (a queued fsync, [`Answer::None`]) keeps its chain: the chain
//!   is filed under the request's `unique` before the handler sees it, and whichever thread
//!   answers ([`Transport::reply_later`]) writes the reply into it and returns it to its
//!   queue;
//! - notifications (FUSE_NOTIFY_*) would go over the notification queue
//!   (VIRTIO_FS_F_NOTIFICATION), which neither Linux's driver nor QEMU implements: the
//!   feature is not offered, and the handler's [`Notify`] answers ENOSYS (the guest's caches
//!   then expire by their time to live, which is how they behave under virtiofsd too);
//! - the DAX window (shared memory for file pages, FUSE_SETUPMAPPING) is not offered: the
//!   guest reads and writes through the queues.

use crate::abi;
use crate::dev::{split, Agreed};
use crate::session::parse_init_out;
use crate::transport::{Answer, InHeader, Link, Notify, Serve, Transport};
use crate::transport::{OutHeader, IN_HEADER_LEN, OUT_HEADER_LEN};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringMutex, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::EventNotifier;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag};
use vmm_sys_util::timerfd::TimerFd;

/// How long a served FORGET's chain may wait before it goes back to the guest, with the
/// others served meanwhile (sooner when half the ring is waiting). The guest's driver
/// (Linux's virtio_fs_hiprio_done_work) does nothing with a returned FORGET but free it,
/// yet returning each at once costs the guest an interrupt and a work item per removed
/// inode: in an `rm -r` of 2,000 files under TCG, a third of the guest's virtio-fs
/// interrupts. Held, the engine's state is unchanged (the FORGET itself is served on
/// arrival); only the guest's buffers come back later. The guest waits for them only when
/// its high-priority ring is full (it retries a jiffy later; half the ring returns the
/// batch before that) and at unmount (it drains the queues: at most this long).
pub const FORGET_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// What the back end offers the monitor.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Request queues offered (besides the high-priority queue), one thread each.
    pub request_queues: usize,
    /// The most descriptors a queue may have (the monitor's `queue-size`, 128 by default in
    /// QEMU, must not exceed it).
    pub queue_size: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            request_queues: 1,
            queue_size: 1024,
        }
    }
}

/// The guest's memory as the monitor shared it.
type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
/// A request's descriptor chain, holding the memory map it was found in (a chain kept for a
/// later reply stays writable even if the monitor changes the memory table meanwhile).
type Chain = DescriptorChain<Arc<GuestMemoryMmap>>;

/// A request's chain, waiting for its reply.
struct Kept {
    chain: Chain,
    vring: VringMutex,
}

/// The requests whose replies are owed, by `unique` (the guest numbers its requests across
/// all queues); the transport that [`Serve`] answers kept requests through.
#[derive(Default)]
struct Owed {
    chains: Mutex<HashMap<u64, Kept>>,
}

impl Transport for Owed {
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> io::Result<()> {
        let kept = self.chains.lock().remove(&unique);
        let k = kept.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        complete(&k.vring, k.chain, unique, body)
    }
}

/// Notifications have no queue to go by (see the module's comment).
struct NoNotificationQueue;

impl Notify for NoNotificationQueue {
    fn inval_inode(&self, _nodeid: u64, _offset: i64, _len: i64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}

/// One queue thread's buffers: the request copied out of the chain, the reply's body.
struct Buffers {
    request: Vec<u8>,
    reply: Vec<u8>,
    /// The thread serves the high-priority queue (queue 0): its FORGETs' chains are held.
    hiprio: bool,
}

/// The vhost-user-fs device: what the queue threads share.
struct Device {
    server: Arc<dyn Serve>,
    cfg: Config,
    /// The guest's memory (set by the monitor's memory table).
    mem: RwLock<Option<Mem>>,
    /// VIRTIO_RING_F_EVENT_IDX was agreed.
    event_idx: AtomicBool,
    owed: Arc<Owed>,
    /// `owed`, as the handler takes it.
    from: Arc<dyn Transport>,
    /// What INIT agreed on; None before it.
    agreed: RwLock<Option<Agreed>>,
    /// [`Serve::started`] is called once, after the first INIT.
    started: Once,
    /// Per queue thread.
    buffers: Vec<Mutex<Buffers>>,
    /// The high-priority queue's chains whose FORGET was served, not yet given back (see
    /// [`FORGET_DELAY`]); only its thread touches them.
    held: Mutex<Vec<u16>>,
    /// Fires [`FORGET_DELAY`] after a chain was held, in the high-priority queue's thread
    /// ([`Device::forget_timer_event`]); None where no timer could be made (chains then go back at once).
    forget_timer: Option<Mutex<TimerFd>>,
}

/// Until INIT says otherwise, as in the /dev/fuse handshake.
const BEFORE_INIT: Agreed = Agreed {
    max_write: 1 << 20,
    max_pages: 256,
    flags: 0,
};

impl Device {
    fn new(server: Arc<dyn Serve>, cfg: Config) -> Device {
        let owed = Arc::new(Owed::default());
        let buffers = (0..=cfg.request_queues)
            .map(|q| {
                Mutex::new(Buffers {
                    request: vec![0; BEFORE_INIT.read_buf_len()],
                    reply: vec![0; BEFORE_INIT.out_buf_len()],
                    hiprio: q == 0,
                })
            })
            .collect();
        Device {
            server,
            cfg,
            mem: RwLock::new(None),
            event_idx: AtomicBool::new(false),
            from: owed.clone(),
            owed,
            agreed: RwLock::new(None),
            started: Once::new(),
            buffers,
            held: Mutex::new(Vec::new()),
            forget_timer: TimerFd::new().ok().map(Mutex::new),
        }
    }

    /// The epoll event of [`Device::forget_timer`] (above the queues and the exit event).
    fn forget_timer_event(&self) -> u16 {
        self.num_queues() as u16 + 1
    }

    /// After the high-priority queue was drained: gives the held chains back when half its
    /// ring is held, else makes sure the timer will.
    fn settle_forgets(&self, vring: &VringMutex) {
        let n = self.held.lock().len();
        let Some(timer) = &self.forget_timer else {
            return;
        };
        if n == 0 {
            return;
        }
        let size = vring.get_ref().get_queue().size() as usize;
        if n >= (size / 2).max(1) {
            self.give_back_forgets(vring);
            return;
        }
        let mut t = timer.lock();
        if !t.is_armed().unwrap_or(false) {
            if let Err(e) = t.reset(FORGET_DELAY, None) {
                drop(t);
                tracing::warn!("virtio-fs: arming the FORGET timer: {e}");
                self.give_back_forgets(vring);
            }
        }
    }

    /// Gives every held chain back, telling the guest once.
    fn give_back_forgets(&self, vring: &VringMutex) {
        let held = std::mem::take(&mut *self.held.lock());
        if held.is_empty() {
            return;
        }
        for head in held {
            if let Err(e) = vring.add_used(head, 0) {
                tracing::error!("virtio-fs: returning a FORGET to the guest: used ring: {e}");
            }
        }
        if vring.needs_notification().unwrap_or(true) {
            log_failure(vring.signal_used_queue());
        }
    }

    /// Serves every chain waiting in `vring`.
    fn drain(&self, vring: &VringMutex, bufs: &mut Buffers) {
        let Some(mem) = self.mem.read().clone() else {
            return;
        };
        loop {
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.memory().into_inner());
            let Some(chain) = chain else {
                return;
            };
            self.serve_chain(vring, chain, bufs);
        }
    }

    /// Serves one request: copies it out of the chain, has the handler answer it, and
    /// writes the reply back (now, or later for a request the handler keeps).
    fn serve_chain(&self, vring: &VringMutex, chain: Chain, bufs: &mut Buffers) {
        let agreed = *self.agreed.read();
        let sizes = agreed.unwrap_or(BEFORE_INIT);
        if bufs.request.len() < sizes.read_buf_len() {
            bufs.request.resize(sizes.read_buf_len(), 0);
        }
        if bufs.reply.len() < sizes.out_buf_len() {
            bufs.reply.resize(sizes.out_buf_len(), 0);
        }
        let n = match read_request(&chain, &mut bufs.request) {
            Ok(n) => n,
            Err((unique, why)) => {
                tracing::warn!("virtio-fs: a request the guest sent is unusable: {why}");
                let r = match unique {
                    Some(u) => complete(vring, chain, u, Err(libc::EINVAL)),
                    None => give_back(vring, chain.head_index(), 0),
                };
                log_failure(r);
                return;
            }
        };
        let ext = agreed.is_some_and(|a| a.flags & abi::FUSE_SETXATTR_EXT != 0);
        // The guest's driver lays a request out as /dev/fuse does (`len` counts it all).
        let Some(req) = split(&bufs.request[..n], ext) else {
            let h = InHeader::parse(&bufs.request[..n]).unwrap_or_default();
            log_failure(complete(vring, chain, h.unique, Err(libc::EINVAL)));
            return;
        };
        let h = req.header;
        let no_reply = matches!(h.opcode, abi::FORGET | abi::BATCH_FORGET | abi::INTERRUPT);
        if agreed.is_none() && h.opcode != abi::INIT {
            // Nothing but INIT is served before INIT, as on /dev/fuse.
            let r = if no_reply {
                give_back(vring, chain.head_index(), 0)
            } else {
                complete(vring, chain, h.unique, Err(libc::EIO))
            };
            log_failure(r);
            return;
        }
        let head = chain.head_index();
        if !no_reply {
            // Filed before the handler runs: it may answer from another thread before
            // `serve` returns.
            let mut owed = self.owed.chains.lock();
            if owed.contains_key(&h.unique) {
                drop(owed);
                tracing::warn!("virtio-fs: two requests in flight numbered {}", h.unique);
                log_failure(complete(vring, chain, h.unique, Err(libc::EINVAL)));
                return;
            }
            let vring = vring.clone();
            owed.insert(h.unique, Kept { chain, vring });
        }
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.server.serve(&req, &mut bufs.reply, &self.from)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("opcode {}: the handler panicked; answered EIO", h.opcode);
            Answer::Error(libc::EIO)
        });
        if h.opcode == abi::INIT {
            self.init_answered(answer, &bufs.reply);
        }
        let body = match answer {
            // A FORGET's chain on the high-priority queue waits for others (FORGET_DELAY).
            _ if no_reply && bufs.hiprio && self.forget_timer.is_some() => {
                return self.held.lock().push(head)
            }
            _ if no_reply => return log_failure(give_back(vring, head, 0)),
            // Kept: answered through `Owed` (perhaps already).
            Answer::None => return,
            Answer::Reply(n) if n <= bufs.reply.len() => Ok(&bufs.reply[..n]),
            Answer::Reply(n) => {
                tracing::error!(
                    "opcode {}: a reply of {n} bytes, beyond the buffer",
                    h.opcode
                );
                Err(libc::EIO)
            }
            Answer::Error(e) => Err(e),
        };
        let kept = self.owed.chains.lock().remove(&h.unique);
        if let Some(k) = kept {
            log_failure(complete(&k.vring, k.chain, h.unique, body));
        }
    }

    /// After the handler answered INIT: what was agreed sizes the buffers and says how
    /// SETXATTR is laid out; the handler learns the link once.
    fn init_answered(&self, answer: Answer, reply: &[u8]) {
        let Answer::Reply(n) = answer else {
            return;
        };
        let Some(agreed) = reply.get(..n).and_then(parse_init_out) else {
            return;
        };
        *self.agreed.write() = Some(agreed);
        self.started.call_once(|| {
            self.server.started(Link {
                notifier: Arc::new(NoNotificationQueue),
            })
        });
    }
}

/// Copies the device-readable part of `chain` (the request) into `buf`; its length, or why
/// it cannot be served (with the request's `unique` when the header was readable).
fn read_request(chain: &Chain, buf: &mut [u8]) -> Result<usize, (Option<u64>, String)> {
    let mem = chain.memory();
    let mut r = chain
        .clone()
        .reader(mem)
        .map_err(|e| (None, format!("descriptor chain: {e}")))?;
    let n = r.available_bytes();
    if n < IN_HEADER_LEN {
        return Err((None, format!("{n} bytes, shorter than a fuse_in_header")));
    }
    r.read_exact(&mut buf[..IN_HEADER_LEN])
        .map_err(|e| (None, format!("reading the header: {e}")))?;
    let unique = InHeader::parse(buf).map(|h| h.unique);
    if n > buf.len() {
        return Err((unique, format!("{n} bytes, beyond the agreed sizes")));
    }
    r.read_exact(&mut buf[IN_HEADER_LEN..n])
        .map_err(|e| (unique, format!("reading the request: {e}")))?;
    Ok(n)
}

/// Writes the reply to request `unique` (`body`, or an errno) into the chain's writable
/// part and returns the chain to its queue. A reply that does not fit the guest's buffers
/// is sent as EIO, as the kernel's /dev/fuse refuses one longer than the request allows.
fn complete(
    vring: &VringMutex,
    chain: Chain,
    unique: u64,
    body: Result<&[u8], i32>,
) -> io::Result<()> {
    let head = chain.head_index();
    let mem = chain.memory();
    let mut w = chain
        .clone()
        .writer(mem)
        .map_err(|e| io::Error::other(format!("descriptor chain: {e}")))?;
    let (mut error, mut body) = match body {
        Ok(b) => (0, b),
        Err(e) if (1..1000).contains(&e) => (-e, &[][..]),
        Err(_) => (-libc::EIO, &[][..]),
    };
    if OUT_HEADER_LEN + body.len() > w.available_bytes() {
        (error, body) = (-libc::EIO, &[][..]);
    }
    if OUT_HEADER_LEN <= w.available_bytes() {
        let h = OutHeader {
            len: (OUT_HEADER_LEN + body.len()) as u32,
            error,
            unique,
        };
        w.write_all(&h.to_bytes())?;
        w.write_all(body)?;
    }
    give_back(vring, head, w.bytes_written() as u32)
}

/// Returns chain `head` to the guest with `len` bytes written, and tells it so unless it
/// asked not to be told yet (VIRTIO_RING_F_EVENT_IDX).
fn give_back(vring: &VringMutex, head: u16, len: u32) -> io::Result<()> {
    vring
        .add_used(head, len)
        .map_err(|e| io::Error::other(format!("used ring: {e}")))?;
    if vring.needs_notification().unwrap_or(true) {
        vring.signal_used_queue()?;
    }
    Ok(())
}

fn log_failure(r: io::Result<()>) {
    if let Err(e) = r {
        tracing::error!("virtio-fs: returning a request to the guest: {e}");
    }
}

impl VhostUserBackend for Device {
    type Bitmap = ();
    type Vring = VringMutex;

    fn num_queues(&self) -> usize {
        1 + self.cfg.request_queues
    }

    fn max_queue_size(&self) -> usize {
        self.cfg.queue_size as usize
    }

    fn features(&self) -> u64 {
        use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
        use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
        // Indirect descriptors: a large READ or WRITE has a descriptor per page, more than
        // a small ring holds directly.
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        *self.mem.write() = Some(mem);
        Ok(())
    }

    /// A thread per queue.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.num_queues()).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringMutex],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!(
                "virtio-fs: unexpected event {evset:?}"
            )));
        }
        if device_event == self.forget_timer_event() {
            // Only the high-priority queue's thread listens to the timer: its one vring.
            if let (Some(t), Some(vring)) = (&self.forget_timer, vrings.first()) {
                let _ = t.lock().wait();
                self.give_back_forgets(vring);
            }
            return Ok(());
        }
        // This thread's queues, of which it has one: `device_event` is its index among them.
        let (Some(vring), Some(bufs)) = (
            vrings.get(device_event as usize),
            self.buffers.get(thread_id),
        ) else {
            return Ok(());
        };
        let mut bufs = bufs.lock();
        if !self.event_idx.load(Ordering::Relaxed) {
            self.drain(vring, &mut bufs);
        } else {
            // With event indexes, the guest is told not to kick while the queue is being
            // drained; chains it adds meanwhile are found when kicks are enabled again.
            loop {
                let _ = vring.disable_notification();
                self.drain(vring, &mut bufs);
                match vring.enable_notification() {
                    Ok(true) => continue,
                    _ => break,
                }
            }
        }
        if bufs.hiprio {
            self.settle_forgets(vring);
        }
        Ok(())
    }
}

/// What stops a session: the connection, once there is one.
#[derive(Default)]
struct Stop {
    asked: bool,
    conn: Option<vhost_user_backend::ShutdownHandle>,
}

/// A vhost-user-fs back end being served ([`serve_vhost_user`]).
pub struct VirtioFs {
    thread: Option<JoinHandle<io::Result<()>>>,
    stop: Arc<Mutex<Stop>>,
    socket: PathBuf,
    server: Arc<dyn Serve>,
}

impl VirtioFs {
    /// Whether the session has ended (the monitor disconnected, or it was stopped).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Whether a monitor has connected (the socket's path is gone then: one connection is
    /// served, and nothing is accepted after it).
    pub fn is_connected(&self) -> bool {
        self.stop.lock().conn.is_some()
    }

    /// Ends the session: the connection is shut (queue threads finish the request they
    /// serve), or, before a monitor connected, the wait for one.
    pub fn stop(&self) {
        let mut s = self.stop.lock();
        s.asked = true;
        match &s.conn {
            Some(c) => c.shutdown(),
            // The session's thread waits in accept(2): a connection that closes at once
            // wakes it, and it sees that it was asked to stop.
            None => drop(std::os::unix::net::UnixStream::connect(&self.socket)),
        }
    }

    /// Waits until the session ends, then tells the handler ([`Serve::ended`]): the engine
    /// commits everything and marks the image clean. Replies still owed are not sent.
    pub fn join(mut self) -> io::Result<()> {
        let r = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the session's thread panicked"))),
            None => Ok(()),
        };
        self.server.ended();
        r
    }
}

/// Serves `server` as a vhost-user-fs back end on the Unix socket `socket` (made here; a
/// socket already there is replaced, anything else refused) for one connection: the
/// session ends when the monitor disconnects (the guest powered off, or the monitor died)
/// or [`VirtioFs::stop`] is called. Returns once the socket listens.
pub fn serve_vhost_user(
    server: Arc<dyn Serve>,
    socket: &Path,
    cfg: Config,
) -> io::Result<VirtioFs> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(socket) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists and is not a socket", socket.display()),
            ))
        }
        _ => {}
    }
    let vhost_err =
        |what: &str, e: &dyn std::fmt::Display| io::Error::other(format!("{what}: {e}"));
    let mut listener =
        Listener::new(socket, true).map_err(|e| vhost_err(&socket.display().to_string(), &e))?;
    let device = Arc::new(Device::new(server.clone(), cfg));
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("uext4-vhost-user".into(), device.clone(), mem)
        .map_err(|e| vhost_err("vhost-user back end", &e))?;
    if let Some(t) = &device.forget_timer {
        // The high-priority queue's thread (the first) gives held FORGETs back when it fires.
        use std::os::fd::AsRawFd;
        let handlers = daemon.get_epoll_handlers();
        let h = handlers
            .first()
            .ok_or_else(|| io::Error::other("vhost-user back end: no queue thread"))?;
        h.register_listener(
            t.lock().as_raw_fd(),
            EventSet::IN,
            u64::from(device.forget_timer_event()),
        )
        .map_err(|e| vhost_err("the FORGET timer", &e))?;
    }
    let stop = Arc::new(Mutex::new(Stop::default()));
    let stopper = stop.clone();
    let path = socket.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("uext4-vhost-user".into())
        .spawn(move || -> io::Result<()> {
            daemon
                .start(&mut listener)
                .map_err(|e| vhost_err("accepting the monitor", &e))?;
            // Nothing more is accepted: the path goes now, while this process may still
            // remove files (a contained server may not).
            let _ = std::fs::remove_file(&path);
            {
                let mut s = stopper.lock();
                if s.asked {
                    daemon.request_shutdown();
                }
                s.conn = daemon.shutdown_handle();
            }
            let r = match daemon.wait() {
                // The monitor went away: the session's ordinary end.
                Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected
                    | vhost::vhost_user::Error::PartialMessage,
                )) => Ok(()),
                r => r.map_err(|e| vhost_err("vhost-user", &e)),
            };
            for h in daemon.get_epoll_handlers() {
                h.send_exit_event();
            }
            // Dropping the daemon joins the queue threads: no request is being served once
            // this thread ends.
            drop(daemon);
            r
        })?;
    Ok(VirtioFs {
        thread: Some(thread),
        stop,
        socket: socket.to_path_buf(),
        server,
    })
}

#[cfg(test)]
mod tests {
    //! The chain handling without a monitor: descriptor chains laid out in guest memory as a
    //! driver lays them out (virtio-queue's mock split queue), served through the device's
    //! queue loop by a handler that answers in known ways.
    use super::*;
    use crate::abi::InitOut;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::split::Descriptor as SplitDescriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    /// Answers INIT; LOOKUP with its name reversed (a name starting "meet" only once another
    /// such LOOKUP is being served too, ETIMEDOUT after 10 s alone); FSYNC later from another
    /// thread; READ with 200 bytes; FORGET with nothing.
    #[derive(Default)]
    struct Fake {
        later: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
        started: AtomicBool,
        /// The "meet" LOOKUPs that arrived, and their wake-up.
        met: std::sync::Mutex<usize>,
        meeting: std::sync::Condvar,
    }

    impl Fake {
        /// Waits until a second "meet" arrives: whether it did within 10 s.
        fn meet(&self) -> bool {
            let mut n = self.met.lock().unwrap();
            *n += 1;
            self.meeting.notify_all();
            let (n, _) = self
                .meeting
                .wait_timeout_while(n, std::time::Duration::from_secs(10), |n| *n < 2)
                .unwrap();
            *n >= 2
        }
    }

    impl Serve for Fake {
        fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], from: &Arc<dyn Transport>) -> Answer {
            match req.header.opcode {
                abi::INIT => {
                    let o = InitOut {
                        major: 7,
                        minor: 31,
                        max_write: 1 << 20,
                        ..InitOut::default()
                    };
                    Answer::Reply(crate::reply::init(out, &o, 31))
                }
                abi::LOOKUP => {
                    if req.rest.starts_with(b"meet") && !self.meet() {
                        return Answer::Error(libc::ETIMEDOUT);
                    }
                    let n = req.rest.len();
                    for (o, b) in out.iter_mut().zip(req.rest.iter().rev()) {
                        *o = *b;
                    }
                    Answer::Reply(n)
                }
                abi::FSYNC => {
                    let (from, unique) = (from.clone(), req.header.unique);
                    self.later.lock().push(std::thread::spawn(move || {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        from.reply_later(unique, Ok(b"done")).unwrap();
                    }));
                    Answer::None
                }
                abi::READ => Answer::Reply(200),
                abi::FORGET => Answer::None,
                _ => Answer::Error(libc::ENOSYS),
            }
        }

        fn started(&self, _link: Link) {
            self.started.store(true, Ordering::SeqCst);
        }
    }

    use crate::transport::RawRequest;

    fn header(len: usize, opcode: u32, unique: u64) -> Vec<u8> {
        let mut h = vec![0u8; IN_HEADER_LEN];
        h[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&opcode.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        h
    }

    /// Descriptor chains being laid out in guest memory, each buffer 64 KiB from the last.
    struct Layout<'a> {
        mem: &'a GuestMemoryMmap,
        descs: Vec<RawDescriptor>,
        next_buf: u64,
    }

    impl Layout<'_> {
        /// One chain: `readable` cut into descriptors at the lengths in `splits` (the rest in
        /// one more), then writable descriptors of the lengths in `writable`, whose addresses
        /// and lengths it returns.
        fn chain(
            &mut self,
            readable: &[u8],
            splits: &[usize],
            writable: &[u32],
        ) -> Vec<(u64, u32)> {
            let first = self.descs.len();
            let mut at: usize = 0;
            let mut parts: Vec<(u64, u32, u16)> = Vec::new();
            for &n in splits.iter().chain(std::iter::once(&usize::MAX)) {
                let end = at.saturating_add(n).min(readable.len());
                if end > at || (at == 0 && readable.is_empty()) {
                    let addr = self.next_buf;
                    self.mem
                        .write_slice(&readable[at..end], GuestAddress(addr))
                        .unwrap();
                    parts.push((addr, (end - at) as u32, 0));
                    self.next_buf += 0x1_0000;
                }
                at = end;
            }
            let mut outs = Vec::new();
            for &n in writable {
                parts.push((self.next_buf, n, VRING_DESC_F_WRITE as u16));
                outs.push((self.next_buf, n));
                self.next_buf += 0x1_0000;
            }
            let last = parts.len() - 1;
            for (i, (addr, len, flags)) in parts.into_iter().enumerate() {
                let (flags, next) = if i == last {
                    (flags, 0)
                } else {
                    (flags | VRING_DESC_F_NEXT as u16, (first + i + 1) as u16)
                };
                self.descs.push(RawDescriptor::from(SplitDescriptor::new(
                    addr, len, flags, next,
                )));
            }
            outs
        }
    }

    fn reply_at(mem: &GuestMemoryMmap, outs: &[(u64, u32)], n: usize) -> Vec<u8> {
        let mut all = Vec::new();
        for &(addr, len) in outs {
            let mut b = vec![0u8; len as usize];
            mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
            all.extend_from_slice(&b);
        }
        all.truncate(n);
        all
    }

    #[test]
    fn chains_are_served_as_requests_and_replies_go_back_into_them() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap();
        let mq = MockSplitQueue::new(&mem, 32);
        let mut l = Layout {
            mem: &mem,
            descs: Vec::new(),
            next_buf: 0x10_0000,
        };
        // Before INIT: refused (EIO).
        let mut early = header(IN_HEADER_LEN + 3, abi::LOOKUP, 1);
        early.extend_from_slice(b"ab\0");
        let o_early = l.chain(&early, &[], &[64]);
        // INIT, its request and reply each split over descriptors.
        let mut init = header(IN_HEADER_LEN + 64, abi::INIT, 2);
        init.extend_from_slice(&[7, 0, 0, 0, 31, 0, 0, 0]);
        init.resize(IN_HEADER_LEN + 64, 0);
        let o_init = l.chain(&init, &[20, 50], &[10, 200]);
        // A name split mid-way, the reply over two buffers.
        let mut lookup = header(IN_HEADER_LEN + 6, abi::LOOKUP, 3);
        lookup.extend_from_slice(b"hello\0");
        let o_lookup = l.chain(&lookup, &[30, 13], &[8, 100]);
        // FORGET: nothing writable, nothing written.
        let mut forget = header(IN_HEADER_LEN + 8, abi::FORGET, 4);
        forget.extend_from_slice(&1u64.to_ne_bytes());
        l.chain(&forget, &[], &[]);
        // FSYNC, answered later from another thread.
        let mut fsync = header(IN_HEADER_LEN + 16, abi::FSYNC, 5);
        fsync.resize(IN_HEADER_LEN + 16, 0);
        let o_fsync = l.chain(&fsync, &[], &[64]);
        // A reply larger than the guest's buffers: EIO.
        let mut read = header(IN_HEADER_LEN + 40, abi::READ, 6);
        read.resize(IN_HEADER_LEN + 40, 0);
        let o_read = l.chain(&read, &[], &[100]);
        // Shorter than a header: returned untouched.
        l.chain(&[0u8; 20], &[], &[64]);
        mq.add_desc_chains(&l.descs, 0).unwrap();

        let atomic = GuestMemoryAtomic::new(mem.clone());
        let vring = VringMutex::new(atomic.clone(), 32).unwrap();
        vring.set_queue_size(32);
        vring
            .set_queue_info(mq.desc_table_addr().0, mq.avail_addr().0, mq.used_addr().0)
            .unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        let fake = Arc::new(Fake::default());
        let device = Device::new(fake.clone(), Config::default());
        device.update_memory(atomic).unwrap();
        let mut bufs = device.buffers[1].lock();
        device.drain(&vring, &mut bufs);
        drop(bufs);
        for t in std::mem::take(&mut *fake.later.lock()) {
            t.join().unwrap();
        }
        assert!(fake.started.load(Ordering::SeqCst));

        // (head, bytes written) for each chain returned, by head.
        let used_idx: u16 = mem.read_obj(mq.used_addr().unchecked_add(2)).unwrap();
        assert_eq!(used_idx, 7, "every chain comes back");
        let used: HashMap<u32, u32> = (0..used_idx)
            .map(|i| {
                let e = mq.used().ring().ref_at(i as usize).unwrap().load();
                (e.id(), e.len())
            })
            .collect();
        let heads: Vec<u32> = {
            let mut h = vec![0u32];
            for (i, d) in l.descs.iter().enumerate() {
                if SplitDescriptor::from(*d).flags() & VRING_DESC_F_NEXT as u16 == 0
                    && i + 1 < l.descs.len()
                {
                    h.push(i as u32 + 1);
                }
            }
            h
        };
        let out_header = |o: &[(u64, u32)], n: usize| {
            let b = reply_at(&mem, o, n);
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap());
            let error = i32::from_ne_bytes(b[4..8].try_into().unwrap());
            let unique = u64::from_ne_bytes(b[8..16].try_into().unwrap());
            (len, error, unique, b[16..].to_vec())
        };
        assert_eq!(used[&heads[0]], 16);
        assert_eq!(out_header(&o_early, 16), (16, -libc::EIO, 1, vec![]));
        let n_init = used[&heads[1]] as usize;
        let (len, error, unique, body) = out_header(&o_init, n_init);
        assert_eq!((len as usize, error, unique), (n_init, 0, 2));
        assert_eq!(&body[0..8], &[7, 0, 0, 0, 31, 0, 0, 0]);
        assert_eq!(used[&heads[2]], 16 + 6);
        assert_eq!(out_header(&o_lookup, 22), (22, 0, 3, b"\0olleh".to_vec()));
        assert_eq!(used[&heads[3]], 0);
        assert_eq!(used[&heads[4]], 20);
        assert_eq!(out_header(&o_fsync, 20), (20, 0, 5, b"done".to_vec()));
        assert_eq!(used[&heads[5]], 16);
        assert_eq!(out_header(&o_read, 16), (16, -libc::EIO, 6, vec![]));
        assert_eq!(used[&heads[6]], 0);
        assert!(device.owed.chains.lock().is_empty());
    }

    /// Two request queues (`num-request-queues=2`): each served by its own thread, a request
    /// on one is answered while a request on the other is still being served (the handler
    /// holds each "meet" until the other arrives), and each reply lands in its own queue's
    /// chain.
    #[test]
    fn two_request_queues_are_served_at_once() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap();
        let q1 = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let q2 = MockSplitQueue::create(&mem, GuestAddress(0x8000), 16);
        let mut l1 = Layout {
            mem: &mem,
            descs: Vec::new(),
            next_buf: 0x10_0000,
        };
        let mut init = header(IN_HEADER_LEN + 64, abi::INIT, 1);
        init.extend_from_slice(&[7, 0, 0, 0, 31, 0, 0, 0]);
        init.resize(IN_HEADER_LEN + 64, 0);
        l1.chain(&init, &[], &[200]);
        let mut a = header(IN_HEADER_LEN + 6, abi::LOOKUP, 2);
        a.extend_from_slice(b"meetA\0");
        let o_a = l1.chain(&a, &[], &[64]);
        q1.add_desc_chains(&l1.descs, 0).unwrap();
        let mut l2 = Layout {
            mem: &mem,
            descs: Vec::new(),
            next_buf: 0x80_0000,
        };
        let mut b = header(IN_HEADER_LEN + 6, abi::LOOKUP, 3);
        b.extend_from_slice(b"meetB\0");
        let o_b = l2.chain(&b, &[], &[64]);
        q2.add_desc_chains(&l2.descs, 0).unwrap();

        let atomic = GuestMemoryAtomic::new(mem.clone());
        let vring = |q: &MockSplitQueue<GuestMemoryMmap>| {
            let v = VringMutex::new(atomic.clone(), 16).unwrap();
            v.set_queue_size(16);
            v.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0)
                .unwrap();
            v.set_queue_ready(true);
            v.set_enabled(true);
            v
        };
        let (v1, v2) = (vring(&q1), vring(&q2));
        let fake = Arc::new(Fake::default());
        let cfg = Config {
            request_queues: 2,
            ..Config::default()
        };
        let device = Arc::new(Device::new(fake.clone(), cfg));
        assert_eq!(device.num_queues(), 3);
        assert_eq!(device.queues_per_thread(), vec![1, 2, 4]);
        device.update_memory(atomic.clone()).unwrap();
        // As the daemon's threads do: each queue drained by its own thread, with its buffers.
        let t1 = {
            let (d, v) = (device.clone(), v1.clone());
            std::thread::spawn(move || d.drain(&v, &mut d.buffers[1].lock()))
        };
        // Queue 2's request after INIT was answered on queue 1 (before it, EIO).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !fake.started.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let t2 = {
            let (d, v) = (device.clone(), v2.clone());
            std::thread::spawn(move || d.drain(&v, &mut d.buffers[2].lock()))
        };
        t1.join().unwrap();
        t2.join().unwrap();
        let used = |q: &MockSplitQueue<GuestMemoryMmap>| -> u16 {
            mem.read_obj(q.used_addr().unchecked_add(2)).unwrap()
        };
        assert_eq!(
            (used(&q1), used(&q2)),
            (2, 1),
            "every chain back to its queue"
        );
        let reply = |o: &[(u64, u32)]| {
            let b = reply_at(&mem, o, 22);
            let error = i32::from_ne_bytes(b[4..8].try_into().unwrap());
            let unique = u64::from_ne_bytes(b[8..16].try_into().unwrap());
            (error, unique, b[16..].to_vec())
        };
        // Neither waited for the other to finish: each met the other mid-request.
        assert_eq!(reply(&o_a), (0, 2, b"\0Ateem".to_vec()));
        assert_eq!(reply(&o_b), (0, 3, b"\0Bteem".to_vec()));
        assert!(device.owed.chains.lock().is_empty());
    }

    /// FORGETs on the high-priority queue: served at once, their chains given back together,
    /// when the timer fires, or at once when half the ring is held.
    #[test]
    fn forgets_chains_go_back_in_batches() {
        // `n` FORGETs on a ring of 16, drained once by the high-priority queue's thread:
        // (chains given back, chains held), then after the timer's event.
        fn forgets(n: u64) -> ((u16, usize), Option<(u16, usize)>) {
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap();
            let mq = MockSplitQueue::new(&mem, 16);
            let mut l = Layout {
                mem: &mem,
                descs: Vec::new(),
                next_buf: 0x10_0000,
            };
            for unique in 1..=n {
                let mut forget = header(IN_HEADER_LEN + 8, abi::FORGET, unique);
                forget.extend_from_slice(&1u64.to_ne_bytes());
                l.chain(&forget, &[], &[]);
            }
            mq.add_desc_chains(&l.descs, 0).unwrap();
            let atomic = GuestMemoryAtomic::new(mem.clone());
            let vring = VringMutex::new(atomic.clone(), 16).unwrap();
            vring.set_queue_size(16);
            vring
                .set_queue_info(mq.desc_table_addr().0, mq.avail_addr().0, mq.used_addr().0)
                .unwrap();
            vring.set_queue_ready(true);
            vring.set_enabled(true);
            let device = Device::new(Arc::new(Fake::default()), Config::default());
            device.update_memory(atomic).unwrap();
            *device.agreed.write() = Some(BEFORE_INIT);
            let used = || -> u16 { mem.read_obj(mq.used_addr().unchecked_add(2)).unwrap() };
            let mut bufs = device.buffers[0].lock();
            device.drain(&vring, &mut bufs);
            drop(bufs);
            device.settle_forgets(&vring);
            let first = (used(), device.held.lock().len());
            let timer = device.forget_timer.as_ref().expect("a timerfd");
            if !timer.lock().is_armed().unwrap() {
                return (first, None);
            }
            // The timer fires: what was held goes back.
            assert!(timer.lock().wait().unwrap() >= 1);
            device.give_back_forgets(&vring);
            for i in 0..used() {
                let e = mq.used().ring().ref_at(i as usize).unwrap().load();
                assert_eq!(e.len(), 0, "nothing written into a FORGET");
            }
            let after = (used(), device.held.lock().len());
            (first, Some(after))
        }
        assert_eq!(forgets(3), ((0, 3), Some((3, 0))), "held until the timer");
        assert_eq!(forgets(7), ((0, 7), Some((7, 0))));
        assert_eq!(
            forgets(8),
            ((8, 0), None),
            "half the ring: at once, no timer"
        );
    }
}
