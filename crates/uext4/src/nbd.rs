//! An NBD (Network Block Device) client as a block device: images served by nbdkit, qemu-nbd,
//! Ceph's rbd-nbd and the like, addressed by the NBD URI standard (the NBD project's
//! doc/uri.md): `nbd://host[:port]/export` (TCP, port 10809 by default) and
//! `nbd+unix:///export?socket=/path/to.sock` (a Unix socket; `socket=%00name` is a socket in
//! the abstract namespace). TLS (`nbds://`, `nbds+unix://`) and vsock are refused as not
//! supported.
//!
//! The protocol (the NBD project's doc/proto.md): the fixed newstyle handshake, then
//! `NBD_OPT_GO` with the export name and a request for `NBD_INFO_BLOCK_SIZE`, whose
//! constraints are honoured (requests aligned to the minimum block size, a read-modify-write
//! for the rare access that is not; payloads no larger than the maximum, 32 MiB by default).
//! A server too old for `NBD_OPT_GO` gets `NBD_OPT_EXPORT_NAME`. Simple replies only:
//! structured replies would save nothing here (the engine reads allocated blocks).
//!
//! Transmission is pipelined: any number of engine threads send requests at once (each
//! written whole under the connection's send lock) and wait for their own reply, which one
//! reader thread per connection matches to the request by its cookie. Where the server
//! advertises `NBD_FLAG_CAN_MULTI_CONN`, several connections share the requests (a flush on
//! one of them then covers writes completed on all, which is what that flag promises).
//! `flush` is `NBD_CMD_FLUSH` (every durability point of the journal goes through it);
//! `zero_range` is `NBD_CMD_WRITE_ZEROES` where offered (the server may punch holes: no data
//! crosses the wire, so `zeroes_cheaply`). Writes carry no FUA: the engine's durability
//! points are flushes.
//!
//! Failure is loud: a server that answers an error fails that request; a server that
//! disconnects, or breaks the protocol, fails every request in flight and every later one on
//! that connection (it is not reconnected: the engine stops the filesystem at the first failed
//! write, and the next open recovers from the journal). A server that exports read-only
//! (`NBD_FLAG_READ_ONLY`) gives a read-only device. Nothing on this side claims the export
//! for one writer (holder.rs is for local files): the server decides who may write it.

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

mod handshake;
mod write_behind;
use handshake::{abort, handshake};
use write_behind::{Ticket, WriteBehind};

// Handshake (doc/proto.md, "Newstyle negotiation").
const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253; // old-style negotiation
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_ERR + 1;
const REP_ERR_POLICY: u32 = REP_ERR + 2;
const REP_ERR_INVALID: u32 = REP_ERR + 3;
const REP_ERR_PLATFORM: u32 = REP_ERR + 4;
const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;
const REP_ERR_SHUTDOWN: u32 = REP_ERR + 7;
const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR + 8;
const REP_ERR_TOO_BIG: u32 = REP_ERR + 9;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
const TF_HAS_FLAGS: u16 = 1 << 0;
const TF_READ_ONLY: u16 = 1 << 1;
const TF_SEND_FLUSH: u16 = 1 << 2;
const TF_SEND_TRIM: u16 = 1 << 5;
const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
const TF_CAN_MULTI_CONN: u16 = 1 << 8;

// Transmission.
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;
/// The largest payload sent or asked for when the server gives no maximum (the protocol's
/// default), and the most we accept from one that gives more.
const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;
/// The largest `NBD_CMD_WRITE_ZEROES` sent (its length is 32 bits; a round number well inside).
const MAX_ZERO_REQUEST: u64 = 1 << 30;
/// Connections opened where the server allows several (`NBD_FLAG_CAN_MULTI_CONN`), unless the
/// URI says otherwise (`x-connections=N`).
pub const DEFAULT_CONNECTIONS: usize = 4;
const MAX_CONNECTIONS: usize = 64;
/// The longest option reply accepted during the handshake (an error message, a description).
const MAX_OPTION_REPLY: u32 = 1 << 20;
/// How long the handshake may take before the server is given up on (it may not be an NBD
/// server at all, or one that serves a single client and is busy).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where an NBD URI says to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp {
        host: String,
        port: u16,
    },
    Unix(PathBuf),
    /// A socket in Linux's abstract namespace (`socket=%00name`): the name without the NUL.
    UnixAbstract(Vec<u8>),
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    /// The export name (the URI's path without its leading '/', percent-decoded).
    pub export: String,
    /// `x-connections=N`: how many connections to open when the server allows several.
    pub connections: Option<usize>,
}

fn bad_uri(why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("bad NBD URI: {why}"))
}

fn percent_decode(s: &str) -> Result<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad_uri("a '%' not followed by two hex digits"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

impl NbdUri {
    /// Parses `nbd://host[:port][/export]` or `nbd+unix:///[export]?socket=PATH`. Every
    /// failure is one line naming the problem; TLS and vsock are refused as not supported.
    pub fn parse(uri: &str) -> Result<NbdUri> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad_uri("expected nbd:// or nbd+unix://"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme.starts_with("nbds") {
            return Err(Error::NotSupported(format!(
                "TLS ({scheme}://) is not supported by uext4's NBD client; serve the \
                 export without TLS on a Unix socket or a trusted network"
            )));
        }
        let unix = match scheme.as_str() {
            "nbd" => false,
            "nbd+unix" => true,
            _ => {
                return Err(Error::NotSupported(format!(
                    "the transport {scheme}:// is not supported (use nbd:// or nbd+unix://)"
                )))
            }
        };
        if rest.contains('#') {
            return Err(bad_uri("a fragment ('#') has no meaning here"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        let export_bytes = percent_decode(path.strip_prefix('/').unwrap_or(path))?;
        let export =
            String::from_utf8(export_bytes).map_err(|_| bad_uri("the export name is not UTF-8"))?;
        if export.contains('\0') {
            return Err(bad_uri("the export name contains a NUL"));
        }
        if export.len() > 4096 {
            return Err(bad_uri("the export name is longer than 4096 bytes"));
        }
        let mut socket = None;
        let mut connections = None;
        for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = param.split_once('=').unwrap_or((param, ""));
            match k {
                "socket" => socket = Some(percent_decode(v)?),
                "x-connections" => {
                    let n: usize = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_CONNECTIONS).contains(n))
                        .ok_or_else(|| {
                            bad_uri(format!("x-connections={v}: give 1 to {MAX_CONNECTIONS}"))
                        })?;
                    connections = Some(n);
                }
                k if k.starts_with("tls") => {
                    return Err(Error::NotSupported(format!(
                        "{k}: TLS is not supported by uext4's NBD client"
                    )))
                }
                k => return Err(bad_uri(format!("unknown query parameter {k:?}"))),
            }
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(bad_uri(
                    "nbd+unix:// takes no host (write nbd+unix:///export?socket=PATH)",
                ));
            }
            let s = socket.ok_or_else(|| {
                bad_uri("nbd+unix:// needs ?socket=PATH (the server's Unix socket)")
            })?;
            match s.split_first() {
                None => return Err(bad_uri("socket= is empty")),
                Some((0, name)) => Address::UnixAbstract(name.to_vec()),
                Some(_) => {
                    use std::os::unix::ffi::OsStringExt;
                    Address::Unix(PathBuf::from(std::ffi::OsString::from_vec(s)))
                }
            }
        } else {
            if socket.is_some() {
                return Err(bad_uri("socket= is for nbd+unix:// URIs"));
            }
            // userinfo is for TLS authentication only.
            let hostport = match authority.rsplit_once('@') {
                Some(_) => {
                    return Err(Error::NotSupported(
                        "a user name in the URI is for TLS, which is not supported".to_string(),
                    ))
                }
                None => authority,
            };
            let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
                let (h, after) = rest
                    .split_once(']')
                    .ok_or_else(|| bad_uri("an IPv6 address without its closing ']'"))?;
                let port = match after {
                    "" => None,
                    p => Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad_uri("expected ':PORT' after ']'"))?,
                    ),
                };
                (h.to_string(), port)
            } else {
                match hostport.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (hostport.to_string(), None),
                }
            };
            let port = match port {
                None | Some("") => DEFAULT_PORT,
                Some(p) => p
                    .parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| bad_uri(format!("bad port {p:?}")))?,
            };
            let host = String::from_utf8(percent_decode(&host)?)
                .map_err(|_| bad_uri("the host name is not UTF-8"))?;
            let host = if host.is_empty() {
                "localhost".to_string()
            } else {
                host
            };
            Address::Tcp { host, port }
        };
        Ok(NbdUri {
            address,
            export,
            connections,
        })
    }
}

/// A connected socket of either kind.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    /// send(2) with MSG_NOSIGNAL: a server gone away is an EPIPE error here, never a SIGPIPE
    /// (the image tools restore SIGPIPE's default, which would end the process silently).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes; the descriptor is our open socket.
            let n = unsafe {
                libc::send(
                    fd,
                    buf.as_ptr() as *const libc::c_void,
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn connect(addr: &Address) -> Result<Stream> {
    let fail = |e: io::Error| Error::Nbd(format!("connecting to the NBD server: {e}"));
    match addr {
        Address::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| Error::Nbd(format!("cannot resolve {host}: {e}")))?
                .collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, HANDSHAKE_TIMEOUT) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(fail(last))
        }
        Address::Unix(p) => UnixStream::connect(p).map(Stream::Unix).map_err(fail),
        Address::UnixAbstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(name).map_err(fail)?;
            UnixStream::connect_addr(&a).map(Stream::Unix).map_err(fail)
        }
    }
}

/// What the handshake learnt about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExportInfo {
    size: u64,
    flags: u16,
    /// Every request's offset and length are multiples of this (a power of two).
    min_block: u32,
    /// The largest payload of one request (a multiple of `min_block`).
    max_payload: u32,
}

fn read_u16(s: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// A reply as the reader thread hands it over: the payload (for a read), or the server's
/// error number.
type Reply = std::result::Result<Vec<u8>, u32>;

/// Who waits for a reply.
enum Waiter {
    /// A thread: the payload length expected with a successful reply, and where to send it.
    Thread(usize, mpsc::SyncSender<Reply>),
    /// Nobody: a write sent behind (write_behind.rs), whose reply ends its ticket.
    Behind(Ticket),
}

struct Pending {
    /// Cookie -> who waits for its reply.
    waiting: HashMap<u64, Waiter>,
    /// Why the connection is unusable, once it is.
    dead: Option<String>,
}

/// One connection in the transmission phase.
struct Conn {
    send: Mutex<Stream>,
    /// For shutting the socket down from any thread.
    ctl: Stream,
    pending: Arc<Mutex<Pending>>,
    next_cookie: AtomicU64,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The most requests ever waiting for their replies at once (pipelining at work).
    max_in_flight: AtomicUsize,
    /// The device's writes in flight, on every connection.
    behind: Arc<WriteBehind>,
}

/// A request sent and not yet answered.
struct InFlight<'a> {
    conn: &'a Conn,
    rx: mpsc::Receiver<Reply>,
    what: Request,
}

#[derive(Clone, Copy)]
struct Request {
    cmd: u16,
    off: u64,
    len: u32,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.cmd {
            CMD_READ => "read",
            CMD_WRITE => "write",
            CMD_FLUSH => return f.write_str("flush"),
            CMD_WRITE_ZEROES => "write-zeroes",
            CMD_TRIM => "trim",
            _ => "request",
        };
        write!(f, "{name} of {} bytes at offset {}", self.len, self.off)
    }
}

fn nbd_errno_text(e: u32) -> String {
    let name = match e {
        1 => "EPERM (operation not permitted)",
        5 => "EIO (input/output error)",
        12 => "ENOMEM (out of memory)",
        22 => "EINVAL (invalid argument)",
        28 => "ENOSPC (no space left on the server)",
        75 => "EOVERFLOW (value too large)",
        95 => "ENOTSUP (not supported)",
        108 => "ESHUTDOWN (the server is shutting down)",
        _ => return format!("error {e}"),
    };
    name.to_string()
}

impl Conn {
    fn start(
        uri: &str,
        stream: Stream,
        label: String,
        behind: Arc<WriteBehind>,
    ) -> Result<Arc<Conn>> {
        let ctl = stream.try_clone()?;
        // Replies are read through a buffer: one system call takes many small replies.
        let mut rd = io::BufReader::with_capacity(64 * 1024, stream.try_clone()?);
        let pending = Arc::new(Mutex::new(Pending {
            waiting: HashMap::new(),
            dead: None,
        }));
        let p = pending.clone();
        let uri_owned = uri.to_string();
        let wb = behind.clone();
        let reader = std::thread::Builder::new()
            .name(label)
            .spawn(move || {
                let why = read_replies(&mut rd, &p, &wb);
                let mut g = p.lock();
                let dead = g.dead.get_or_insert(format!("{uri_owned}: {why}")).clone();
                // Dropping the senders wakes every waiting thread with the connection's
                // failure; the writes sent behind are lost, which fails the device.
                for (_, w) in g.waiting.drain() {
                    if let Waiter::Behind(t) = w {
                        wb.end(
                            t,
                            Some(format!(
                                "{dead} (a write of {} bytes at offset {} was in flight)",
                                t.len, t.off
                            )),
                        );
                    }
                }
            })
            .map_err(Error::Io)?;
        Ok(Arc::new(Conn {
            send: Mutex::new(stream),
            ctl,
            pending,
            next_cookie: AtomicU64::new(1),
            reader: Mutex::new(Some(reader)),
            max_in_flight: AtomicUsize::new(0),
            behind,
        }))
    }

    fn dead_error(&self) -> io::Error {
        let why = self
            .pending
            .lock()
            .dead
            .clone()
            .unwrap_or_else(|| "the NBD connection failed".into());
        io::Error::new(io::ErrorKind::BrokenPipe, why)
    }

    /// Sends one request (and its payload for a write) without waiting for the reply.
    fn submit(
        &self,
        cmd: u16,
        off: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> io::Result<InFlight<'_>> {
        let (tx, rx) = mpsc::sync_channel(1);
        let expect = if cmd == CMD_READ { len as usize } else { 0 };
        self.send(cmd, off, len, payload, Waiter::Thread(expect, tx))?;
        Ok(InFlight {
            conn: self,
            rx,
            what: Request { cmd, off, len },
        })
    }

    /// Sends a write whose reply nobody waits for: it ends `ticket` (write_behind.rs).
    fn submit_behind(&self, ticket: Ticket, payload: &[u8]) -> io::Result<()> {
        let r = self.send(
            CMD_WRITE,
            ticket.off,
            payload.len() as u32,
            Some(payload),
            Waiter::Behind(ticket),
        );
        if let Err(e) = &r {
            // Never registered, or taken back by the reader when the connection died: the
            // ticket ends here either way (ending it twice is harmless).
            ticket_end_on_send_failure(&self.behind, ticket, e);
        }
        r
    }

    fn send(
        &self,
        cmd: u16,
        off: u64,
        len: u32,
        payload: Option<&[u8]>,
        waiter: Waiter,
    ) -> io::Result<()> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        {
            let mut p = self.pending.lock();
            if let Some(why) = &p.dead {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()));
            }
            p.waiting.insert(cookie, waiter);
            self.max_in_flight
                .fetch_max(p.waiting.len(), Ordering::Relaxed);
        }
        let mut hdr = [0u8; 28];
        hdr[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        hdr[4..6].copy_from_slice(&0u16.to_be_bytes());
        hdr[6..8].copy_from_slice(&cmd.to_be_bytes());
        hdr[8..16].copy_from_slice(&cookie.to_be_bytes());
        hdr[16..24].copy_from_slice(&off.to_be_bytes());
        hdr[24..28].copy_from_slice(&len.to_be_bytes());
        let r = {
            let mut s = self.send.lock();
            match payload {
                // One write for a small request: one segment on the wire.
                Some(p) if p.len() <= 64 * 1024 => {
                    let mut m = Vec::with_capacity(28 + p.len());
                    m.extend_from_slice(&hdr);
                    m.extend_from_slice(p);
                    s.write_all(&m)
                }
                Some(p) => s.write_all(&hdr).and_then(|_| s.write_all(p)),
                None => s.write_all(&hdr),
            }
        };
        if let Err(e) = r {
            // Half a request may have gone out: the connection cannot be used again.
            self.kill(format!("sending to the NBD server: {e}"));
            return Err(self.dead_error());
        }
        Ok(())
    }

    /// Marks the connection dead (the first reason stays) and shuts the socket down, which
    /// ends the reader and fails every request in flight.
    fn kill(&self, why: String) {
        {
            let mut p = self.pending.lock();
            p.dead.get_or_insert(why);
        }
        self.ctl.shutdown();
    }

    fn close(&self) {
        let alive = self.pending.lock().dead.is_none();
        if alive {
            let mut hdr = [0u8; 28];
            hdr[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            hdr[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
            let _ = self.send.lock().write_all(&hdr);
        }
        self.kill("the NBD connection was closed".into());
        if let Some(h) = self.reader.lock().take() {
            let _ = h.join();
        }
    }
}

fn ticket_end_on_send_failure(behind: &WriteBehind, t: Ticket, e: &io::Error) {
    behind.end(
        t,
        Some(format!(
            "{e} (a write of {} bytes at offset {} was being sent)",
            t.len, t.off
        )),
    );
}

impl InFlight<'_> {
    /// Waits for the reply.
    fn wait(self) -> io::Result<Vec<u8>> {
        match self.rx.recv() {
            Ok(Ok(data)) => Ok(data),
            Ok(Err(e)) => Err(io::Error::other(format!(
                "the NBD server failed a {}: {}",
                self.what,
                nbd_errno_text(e)
            ))),
            Err(_) => {
                let e = self.conn.dead_error();
                Err(io::Error::new(
                    e.kind(),
                    format!("{} (a {} was in flight)", e, self.what),
                ))
            }
        }
    }
}

/// The reader thread's loop: reads replies and hands each to its request. Returns why it
/// stopped (the server went away, or broke the protocol).
fn read_replies(rd: &mut impl Read, pending: &Mutex<Pending>, behind: &WriteBehind) -> String {
    loop {
        let mut hdr = [0u8; 16];
        if let Err(e) = rd.read_exact(&mut hdr) {
            return if e.kind() == io::ErrorKind::UnexpectedEof {
                "the NBD server closed the connection".into()
            } else {
                format!("reading from the NBD server: {e}")
            };
        }
        let magic = u32::from_be_bytes(hdr[0..4].try_into().unwrap_or_default());
        if magic == STRUCTURED_REPLY_MAGIC {
            return "the NBD server sent a structured reply, which was not negotiated".into();
        }
        if magic != SIMPLE_REPLY_MAGIC {
            return format!("the NBD server sent a reply with bad magic {magic:#x}");
        }
        let error = u32::from_be_bytes(hdr[4..8].try_into().unwrap_or_default());
        let cookie = u64::from_be_bytes(hdr[8..16].try_into().unwrap_or_default());
        let Some(waiter) = pending.lock().waiting.remove(&cookie) else {
            return format!("the NBD server answered a request never sent (cookie {cookie})");
        };
        let (expect, tx) = match waiter {
            Waiter::Thread(expect, tx) => (expect, tx),
            Waiter::Behind(t) => {
                let failure = (error != 0).then(|| {
                    format!(
                        "the NBD server failed a write of {} bytes at offset {}: {}",
                        t.len,
                        t.off,
                        nbd_errno_text(error)
                    )
                });
                behind.end(t, failure);
                continue;
            }
        };
        let reply = if error != 0 {
            Err(error)
        } else {
            let mut data = vec![0u8; expect];
            if let Err(e) = rd.read_exact(&mut data) {
                return format!("reading a reply's data from the NBD server: {e}");
            }
            Ok(data)
        };
        // The waiter may be gone (it never is today); nothing to do then.
        let _ = tx.send(reply);
    }
}

/// An NBD export as a [`BlockDevice`].
pub struct NbdDevice {
    uri: String,
    export: String,
    info: ExportInfo,
    read_only: bool,
    conns: Vec<Arc<Conn>>,
    next: AtomicUsize,
    /// Serializes the read-modify-write of accesses not aligned to the minimum block size.
    rmw: Mutex<()>,
    /// Writes sent and not yet answered, on every connection.
    behind: Arc<WriteBehind>,
}

impl NbdDevice {
    /// Connects to the export `uri` names (`nbd://host[:port]/export`,
    /// `nbd+unix:///export?socket=PATH`). `read_only` never writes;
    /// a server that exports read-only makes the device read-only too.
    pub fn open(uri: &str, read_only: bool) -> Result<NbdDevice> {
        let parsed = NbdUri::parse(uri)?;
        let mut s = connect(&parsed.address)?;
        let info = handshake(&mut s, &parsed.export).inspect_err(|_| abort(&mut s))?;
        let behind = Arc::new(WriteBehind::new(info.max_payload as u64));
        let mut conns = vec![Conn::start(uri, s, "uext4-nbd-0".into(), behind.clone())?];
        let want = if info.flags & TF_CAN_MULTI_CONN != 0 {
            parsed.connections.unwrap_or(DEFAULT_CONNECTIONS)
        } else {
            1
        };
        for i in 1..want {
            // Extra connections are an optimization: stop at the first that fails.
            let extra = connect(&parsed.address).and_then(|mut s| {
                let other = handshake(&mut s, &parsed.export).inspect_err(|_| abort(&mut s))?;
                if other != info {
                    return Err(Error::Nbd(
                        "a second connection saw a different export".to_string(),
                    ));
                }
                Conn::start(uri, s, format!("uext4-nbd-{i}"), behind.clone())
            });
            match extra {
                Ok(c) => conns.push(c),
                Err(e) => {
                    tracing::warn!("{uri}: using {} NBD connection(s): {e}", conns.len());
                    break;
                }
            }
        }
        Ok(NbdDevice {
            uri: uri.to_string(),
            export: parsed.export,
            read_only: read_only || info.flags & TF_READ_ONLY != 0,
            info,
            conns,
            next: AtomicUsize::new(0),
            rmw: Mutex::new(()),
            behind,
        })
    }

    /// How many connections carry the requests.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The most requests that were ever in flight at once on one connection.
    pub fn max_in_flight(&self) -> usize {
        self.conns
            .iter()
            .map(|c| c.max_in_flight.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// Whether the server exports the image read-only.
    pub fn server_read_only(&self) -> bool {
        self.info.flags & TF_READ_ONLY != 0
    }

    /// The minimum block size the server asked for (1 when it gave none).
    pub fn min_block_size(&self) -> u32 {
        self.info.min_block
    }

    fn conn(&self) -> &Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        &self.conns[i]
    }

    fn check(&self, off: u64, len: u64) -> io::Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access at byte {off} (+{len}) is past the end of the NBD export ({} bytes)",
                    self.info.size
                ),
            )),
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        Ok(())
    }

    fn aligned(&self, off: u64, len: u64) -> bool {
        let m = self.info.min_block as u64;
        off.is_multiple_of(m) && len.is_multiple_of(m)
    }

    /// The aligned range that covers `off..off + len`.
    fn widen(&self, off: u64, len: u64) -> (u64, u64) {
        let m = self.info.min_block as u64;
        let start = off / m * m;
        let end = (off + len).div_ceil(m) * m;
        (start, end - start)
    }

    /// An aligned read, in requests of at most the maximum payload, all sent before the
    /// first reply is awaited.
    fn read_aligned(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.behind.settle(off, buf.len() as u64)?;
        let max = self.info.max_payload as usize;
        let conn = self.conn();
        let mut flights = Vec::with_capacity(buf.len().div_ceil(max));
        for (i, chunk) in buf.chunks(max).enumerate() {
            let at = off + (i * max) as u64;
            flights.push(conn.submit(CMD_READ, at, chunk.len() as u32, None));
        }
        let mut first_err = None;
        for (f, chunk) in flights.into_iter().zip(buf.chunks_mut(max)) {
            match f.and_then(|f| f.wait()) {
                Ok(data) if data.len() == chunk.len() => chunk.copy_from_slice(&data),
                Ok(_) => {
                    first_err.get_or_insert(io::Error::other("a read reply of the wrong length"));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// An aligned write, in requests of at most the maximum payload, sent behind: it returns
    /// once they are on the wire (write_behind.rs).
    fn write_aligned(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let max = self.info.max_payload as usize;
        let conn = self.conn();
        for (i, chunk) in buf.chunks(max).enumerate() {
            let at = off + (i * max) as u64;
            let ticket = self.behind.begin(at, chunk.len() as u64)?;
            conn.submit_behind(ticket, chunk)?;
        }
        Ok(())
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        // The writes sent are answered before the connections close (a failure was reported
        // at the flush that needed them, or is moot: nothing waits for them).
        let _ = self.behind.drain();
        for c in &self.conns {
            c.close();
        }
    }
}

impl BlockDevice for NbdDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.aligned(off, buf.len() as u64) {
            return self.read_aligned(off, buf);
        }
        let (start, len) = self.widen(off, buf.len() as u64);
        let mut tmp = vec![0u8; len as usize];
        self.read_aligned(start, &mut tmp)?;
        let from = (off - start) as usize;
        buf.copy_from_slice(&tmp[from..from + buf.len()]);
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        self.check(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.aligned(off, buf.len() as u64) {
            return self.write_aligned(off, buf);
        }
        // Read-modify-write of the whole minimum blocks around it.
        let _g = self.rmw.lock();
        let (start, len) = self.widen(off, buf.len() as u64);
        let mut tmp = vec![0u8; len as usize];
        self.read_aligned(start, &mut tmp)?;
        let from = (off - start) as usize;
        tmp[from..from + buf.len()].copy_from_slice(buf);
        self.write_aligned(start, &tmp)
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        // A flush covers the writes the server has answered: wait for every one sent before.
        self.behind.drain()?;
        if self.info.flags & TF_SEND_FLUSH == 0 {
            // No flush offered: the server's writes are durable when acknowledged.
            return Ok(());
        }
        // With several connections the server promised (CAN_MULTI_CONN) that a flush on one
        // covers the writes completed on all.
        self.conn()
            .submit(CMD_FLUSH, 0, 0, None)?
            .wait()
            .map(|_| ())
    }

    fn size(&self) -> u64 {
        self.info.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn zeroes_cheaply(&self) -> bool {
        !self.read_only && self.info.flags & TF_SEND_WRITE_ZEROES != 0
    }

    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.check(off, len)?;
        if self.info.flags & TF_SEND_WRITE_ZEROES == 0 {
            let zeros = vec![0u8; len.min(1 << 20) as usize];
            let mut at = off;
            while at < off + len {
                let n = (off + len - at).min(zeros.len() as u64) as usize;
                self.write_at(at, &zeros[..n])?;
                at += n as u64;
            }
            return Ok(());
        }
        // Whole minimum blocks by WRITE_ZEROES, the partial ones at the ends written.
        let m = self.info.min_block as u64;
        let start = off.div_ceil(m) * m;
        let end = (off + len) / m * m;
        if start >= end {
            return self.write_at(off, &vec![0u8; len as usize]);
        }
        if start > off {
            self.write_at(off, &vec![0u8; (start - off) as usize])?;
        }
        if end < off + len {
            self.write_at(end, &vec![0u8; (off + len - end) as usize])?;
        }
        let step = MAX_ZERO_REQUEST / m * m;
        // The server may carry out requests in any order: no write in flight may land on the
        // zeroed range after the zeroes.
        self.behind.settle(start, end - start)?;
        let conn = self.conn();
        let mut flights = Vec::new();
        let mut at = start;
        while at < end {
            let n = (end - at).min(step);
            flights.push(conn.submit(CMD_WRITE_ZEROES, at, n as u32, None));
            at += n;
        }
        let mut first_err = None;
        for f in flights {
            if let Err(e) = f.and_then(|f| f.wait()) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// `NBD_CMD_TRIM`, where the server offers it, in whole minimum blocks inside the range.
    fn discard(&self, off: u64, len: u64) -> io::Result<bool> {
        self.check_writable()?;
        self.check(off, len)?;
        if self.info.flags & TF_SEND_TRIM == 0 {
            return Ok(false);
        }
        let m = self.info.min_block as u64;
        let (start, end) = (off.div_ceil(m) * m, (off + len) / m * m);
        if start >= end {
            return Ok(true);
        }
        // No write in flight may land on the range after the trim (the server may carry out
        // requests in any order).
        self.behind.settle(start, end - start)?;
        let step = MAX_ZERO_REQUEST / m * m;
        let conn = self.conn();
        let mut flights = Vec::new();
        let mut at = start;
        while at < end {
            let n = (end - at).min(step);
            flights.push(conn.submit(CMD_TRIM, at, n as u32, None));
            at += n;
        }
        for f in flights {
            f.and_then(|f| f.wait())?;
        }
        Ok(true)
    }

    fn name(&self) -> Option<String> {
        Some(if self.export.is_empty() {
            self.uri.clone()
        } else {
            self.export.clone()
        })
    }
}

#[cfg(test)]
mod tests;
