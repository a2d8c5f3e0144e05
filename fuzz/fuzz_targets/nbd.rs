//! The NBD client against a server that answers with the fuzz input: the handshake (greeting,
//! option replies, export information, block sizes), then replies to reads, writes and
//! flushes. The input is sent whole on each connection the client opens, whatever the client
//! asks, then the server closes its side. No panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use uext4::blockdev::BlockDevice;
use uext4::NbdDevice;

/// The server's socket, one per fuzzing process.
fn socket() -> &'static std::path::Path {
    static P: OnceLock<std::path::PathBuf> = OnceLock::new();
    P.get_or_init(|| uext4_fuzz::input_file("nbd.sock", b""))
}

/// Serves `reply` on every connection until `stop` is set (and one more connection wakes it).
fn serve(listener: UnixListener, reply: Arc<Vec<u8>>, stop: Arc<AtomicBool>) {
    let mut conns = Vec::new();
    for s in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(mut s) = s else { break };
        let reply = reply.clone();
        conns.push(std::thread::spawn(move || {
            // What the client sends is read and dropped, so its writes never block.
            let mut rd = s.try_clone().unwrap();
            let drain = std::thread::spawn(move || {
                let mut b = [0u8; 65536];
                while matches!(rd.read(&mut b), Ok(n) if n > 0) {}
            });
            let _ = s.write_all(&reply);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let _ = drain.join();
        }));
    }
    for c in conns {
        let _ = c.join();
    }
}

fuzz_target!(|data: &[u8]| {
    let path = socket();
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).expect("binding the harness's socket");
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (reply, stop) = (Arc::new(data.to_vec()), stop.clone());
        std::thread::spawn(move || serve(listener, reply, stop))
    };
    let uri = format!("nbd+unix:///fuzz?socket={}", path.display());
    if let Ok(dev) = NbdDevice::open(&uri, false) {
        let mut b = vec![0u8; 8192];
        let _ = dev.read_at(0, &mut b[..512]);
        let _ = dev.read_at(4096, &mut b);
        let _ = dev.write_at(512, &b[..1024]);
        let _ = dev.flush();
        let _ = dev.size();
        drop(dev);
    }
    stop.store(true, Ordering::SeqCst);
    let _ = UnixStream::connect(path);
    server.join().unwrap();
});
