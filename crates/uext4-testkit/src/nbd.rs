//! NBD servers for tests: nbdkit (Unix socket or TCP loopback) and qemu-nbd, started on a fresh
//! address, waited for until they listen, and stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process serving one export; stopped (and its socket removed) on drop.
pub struct NbdServer {
    child: Option<Child>,
    sock: PathBuf,
    port: Option<u16>,
    /// The export's NBD URI.
    pub uri: String,
}

fn temp_socket() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("uext4-nbd-{}-{n}.sock", std::process::id()))
}

/// A loopback TCP port nobody listens on (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binding a loopback port")
        .local_addr()
        .expect("a bound port")
        .port()
}

impl NbdServer {
    /// nbdkit on a fresh Unix socket: `args` are filters, the plugin and its parameters.
    pub fn nbdkit(args: &[&str]) -> NbdServer {
        let sock = temp_socket();
        let mut c = Command::new("nbdkit");
        c.args(["-f", "--exit-with-parent", "-U"])
            .arg(&sock)
            .args(args);
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        NbdServer::start(c, sock, None, uri)
    }

    /// nbdkit on TCP loopback.
    pub fn nbdkit_tcp(args: &[&str]) -> NbdServer {
        let port = free_port();
        let mut c = Command::new("nbdkit");
        c.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(args);
        let uri = format!("nbd://127.0.0.1:{port}/");
        NbdServer::start(c, PathBuf::new(), Some(port), uri)
    }

    /// qemu-nbd serving `image` (of `format`) as export `name` on a Unix socket.
    pub fn qemu_nbd(image: &Path, format: &str, name: &str) -> NbdServer {
        let sock = temp_socket();
        let mut c = Command::new("qemu-nbd");
        c.args([
            "-t",
            "-e",
            "4",
            "-x",
            name,
            "-f",
            format,
            "--cache=writeback",
            "-k",
        ])
        .arg(&sock)
        .arg(image);
        let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
        NbdServer::start(c, sock, None, uri)
    }

    fn start(mut c: Command, sock: PathBuf, port: Option<u16>, uri: String) -> NbdServer {
        c.stdin(Stdio::null()).stdout(Stdio::null());
        let child = c.spawn().expect("starting the NBD server");
        let mut s = NbdServer {
            child: Some(child),
            sock,
            port,
            uri,
        };
        let t = Instant::now();
        loop {
            let up = match s.port {
                Some(p) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
                // Listening, not only bound: the socket file appears before listen().
                None => std::os::unix::net::UnixStream::connect(&s.sock).is_ok(),
            };
            if up {
                return s;
            }
            if let Some(Ok(Some(st))) = s.child.as_mut().map(|c| c.try_wait()) {
                panic!("the NBD server exited at start: {st}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the NBD server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `URI:PATH`, a path inside the export as the image tools take it.
    pub fn at(&self, path: &str) -> String {
        format!("{}:{path}", self.uri)
    }

    /// Kills the server at once (SIGKILL): what a crash of the storage host looks like.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    /// Stops the server and waits for it, so that everything it wrote is in the file.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill with our child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
