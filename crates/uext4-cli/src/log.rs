//! Where the engine's warnings and errors go: the `tracing` events of the uext4 and
//! uext4-fuse crates (a transaction written without the journal, a journal abort, corruption
//! found, a commit waiting for log space).
//!
//! The tools and a mount in the foreground print them on stderr. A mount in the background
//! has no terminal: its messages go to the system log through /dev/log where a syslog daemon
//! listens (`journalctl -t uext4`), otherwise to the kernel's log through /dev/kmsg, where the
//! kernel's own ext4 reports its errors (`dmesg`). (Its stderr, which the starting `uext4
//! mount` reads only until the mount is ready, gets the error it exits with.)
//! `UEXT4_LOG=error|warn|info|debug|trace|off` sets the level; warn by default, off for the
//! image tools (their one-line error says what failed). (The kernel's
//! log takes lines from root only, at most about 1 KiB each and ten per five seconds: an
//! ordinary user's server without a syslog daemon logs nowhere, and a burst is cut short.)

use std::io::Write;
use std::sync::OnceLock;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Set in the environment of the server that `uext4 mount` starts in the background.
pub const BACKGROUND_ENV: &str = "UEXT4_BACKGROUND_SERVER";

/// Installs the logger once, at start, at `default` unless UEXT4_LOG says otherwise (the
/// image tools pass OFF: each reports the error it meets in its one line, which the
/// engine's own event would repeat). A wrong UEXT4_LOG value is named on stderr.
pub fn init(default: LevelFilter) {
    let level = match std::env::var("UEXT4_LOG") {
        Err(_) => default,
        Ok(v) => match v.to_ascii_lowercase().as_str() {
            "off" => LevelFilter::OFF,
            "error" => LevelFilter::ERROR,
            "warn" | "" => LevelFilter::WARN,
            "info" => LevelFilter::INFO,
            "debug" => LevelFilter::DEBUG,
            "trace" => LevelFilter::TRACE,
            other => {
                eprintln!(
                    "uext4: UEXT4_LOG={other:?} is not a level (error, warn, info, debug, \
                     trace, off); using warn"
                );
                LevelFilter::WARN
            }
        },
    };
    let background = std::env::var_os(BACKGROUND_ENV).is_some();
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false);
    // Another subscriber already set (never, in this binary) is not worth failing for.
    let _ = if background {
        builder.without_time().with_writer(SystemLog).try_init()
    } else {
        builder.with_writer(std::io::stderr).try_init()
    };
}

/// What a background server's lines name, as the kernel's ext4 names its device: the
/// image it serves (set once it knows it).
static SOURCE: OnceLock<String> = OnceLock::new();

/// Names the image in every later line of a background server's log.
pub fn set_source(image: &std::path::Path) {
    let _ = SOURCE.set(image.display().to_string());
}

/// Chooses a background server's log now and connects to it (a contained server can open no
/// socket or file later; a syslog daemon restarted meanwhile then loses its lines).
pub fn prepare() {
    if std::env::var_os(BACKGROUND_ENV).is_some() {
        let _ = sink();
    }
}

/// The system log where there is one, else the kernel's log.
struct SystemLog;

/// Where a background server's lines go, chosen at its first message.
enum Sink {
    /// To a thread that hands them to syslog(3), which may block on a stalled daemon (or one
    /// writing its log onto this very mount): the engine logs while holding its locks, so
    /// it never waits for that; lines beyond the queue's room are dropped.
    Syslog(std::sync::mpsc::SyncSender<(i32, std::ffi::CString)>),
    Kmsg(std::fs::File),
    Nowhere,
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        if std::path::Path::new("/dev/log").exists() {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(i32, std::ffi::CString)>(256);
            // Connected now (LOG_NDELAY), not at the first line.
            // SAFETY: the identifier is a static C string that outlives every call.
            unsafe {
                libc::openlog(
                    c"uext4".as_ptr(),
                    libc::LOG_PID | libc::LOG_NDELAY,
                    libc::LOG_DAEMON,
                )
            };
            let started = std::thread::Builder::new()
                .name("uext4-syslog".into())
                .spawn(move || {
                    for (prio, line) in rx {
                        // SAFETY: a "%s" format with one NUL-terminated string argument.
                        unsafe { libc::syslog(prio, c"%s".as_ptr(), line.as_ptr()) };
                    }
                });
            if started.is_ok() {
                return Sink::Syslog(tx);
            }
        }
        match std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
            Ok(f) => Sink::Kmsg(f),
            Err(_) => Sink::Nowhere,
        }
    })
}

/// One event's text, sent when the formatter is done with it.
struct Line {
    level: Level,
    buf: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        let text = match SOURCE.get() {
            Some(image) => format!("{image}: {text}"),
            None => text.to_string(),
        };
        let prio = match self.level {
            Level::ERROR => libc::LOG_ERR,
            Level::WARN => libc::LOG_WARNING,
            Level::INFO => libc::LOG_INFO,
            _ => libc::LOG_DEBUG,
        };
        match sink() {
            Sink::Syslog(tx) => {
                if let Ok(c) = std::ffi::CString::new(text.replace('\0', " ")) {
                    let _ = tx.try_send((prio, c));
                }
            }
            Sink::Kmsg(f) => {
                // One record per write: "<priority>name[pid]: text".
                let rec = format!("<{prio}>uext4[{}]: {text}\n", std::process::id());
                let _ = (&*f).write_all(rec.as_bytes());
            }
            Sink::Nowhere => {}
        }
    }
}

impl<'a> MakeWriter<'a> for SystemLog {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line {
            level: Level::INFO,
            buf: Vec::new(),
        }
    }
    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        Line {
            level: *meta.level(),
            buf: Vec::new(),
        }
    }
}
