//! The NBD block backend (nbd.rs) against real servers on this machine, over Unix sockets and
//! TCP loopback only: nbdkit (file and memory plugins; its error, delay and blocksize-policy
//! filters for faults, latency and block size constraints) and qemu-nbd serving qcow2.
//! Every test that writes an image runs `e2fsck -fn` on what the server served. A test whose
//! server program is missing prints `SKIP: ...` and passes.

mod common;

use common::*;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::blockdev::BlockDevice;
use uext4::NbdDevice;
use uext4::{Fs, MountOptions};

fn rw() -> MountOptions {
    opts::no_timer()
}

fn ro() -> MountOptions {
    MountOptions {
        read_only: true,
        ..opts::no_timer()
    }
}

/// Content of file `i` of the tree: sizes from empty to several extents.
fn content(i: usize) -> Vec<u8> {
    let len = [0usize, 1, 4095, 4096, 10_000, 300_000, 1 << 20][i % 7] + i;
    (0..len).map(|j| (j * 31 + i * 7) as u8).collect()
}

fn path_of(fs: &Fs, path: &str) -> u32 {
    let mut ino = 2;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(ino, c.as_bytes()).unwrap().ino;
    }
    ino
}

/// Writes `dirs` directories of `files` files each, fsyncing every file.
fn write_tree(fs: &Fs, dirs: usize, files: usize) {
    for d in 0..dirs {
        let dir = fs
            .mkdir(2, format!("d{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..files {
            let i = d * files + f;
            let ino = fs
                .create(dir, format!("f{f}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            let data = content(i);
            let mut off = 0;
            while off < data.len() {
                off += fs.write(ino, off as u64, &data[off..]).unwrap();
            }
            fs.fsync(ino, false).unwrap();
        }
    }
}

fn check_tree(fs: &Fs, dirs: usize, files: usize) {
    for d in 0..dirs {
        for f in 0..files {
            let ino = path_of(fs, &format!("d{d}/f{f}"));
            assert_eq!(read_all(fs, ino), content(d * files + f), "d{d}/f{f}");
        }
    }
}

#[test]
fn tree_over_nbdkit_file_plugin_on_a_unix_socket_is_clean_and_reads_back_locally() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-file");
    mke2fs(&img.0, "128M", &[]);
    let mut srv = NbdServer::nbdkit(&["file", &format!("file={}", img.0.display())]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    assert!(!fs.is_read_only());
    write_tree(&fs, 4, 9);
    check_tree(&fs, 4, 9);
    fs.unmount().unwrap();
    drop(fs);
    srv.stop();
    e2fsck_clean(&img.0);
    let local = Fs::open_path(&img.0, ro()).unwrap();
    check_tree(&local, 4, 9);
}

#[test]
fn mkfs_over_tcp_on_the_memory_plugin_then_a_tree_then_e2fsck_of_the_export() {
    if !have(&["nbdkit"]) {
        return;
    }
    let srv = NbdServer::nbdkit_tcp(&["memory", "size=96M"]);
    let dev = Arc::new(NbdDevice::open(&srv.uri, false).unwrap());
    assert!(dev.connections() > 1, "the memory plugin allows multi-conn");
    let o = uext4::mkfs::MkfsOptions::like_mke2fs(dev.size(), None);
    uext4::mkfs::mkfs(&*dev, &o).unwrap();
    let fs = Fs::open_dev(dev.clone(), rw()).unwrap();
    write_tree(&fs, 3, 7);
    fs.unmount().unwrap();
    drop(fs);
    drop(dev);
    // Reopened over NBD, and copied out for e2fsck.
    let fs = Fs::open_path(Path::new(&srv.uri), ro()).unwrap();
    check_tree(&fs, 3, 7);
    drop(fs);
    e2fsck_export(&srv.uri);
}

/// Copies what the export at `uri` holds into a scratch file and runs `e2fsck -fn` on it (a
/// memory export has no file of its own to check).
fn e2fsck_export(uri: &str) {
    let dev = NbdDevice::open(uri, true).unwrap();
    let mut all = vec![0u8; dev.size() as usize];
    dev.read_at(0, &mut all).unwrap();
    let out = scratch("nbd-mem-copy");
    std::fs::write(&out.0, &all).unwrap();
    e2fsck_clean(&out.0);
}

#[test]
fn qemu_nbd_serving_qcow2_is_formatted_written_and_clean() {
    if !have(&["qemu-nbd", "qemu-img"]) {
        return;
    }
    let q = scratch("nbd-qcow2");
    sh(&format!(
        "qemu-img create -q -f qcow2 {} 128M",
        q.0.display()
    ));
    let mut srv = NbdServer::qemu_nbd(&q.0, "qcow2", "disk");
    let dev = Arc::new(NbdDevice::open(&srv.uri, false).unwrap());
    assert_eq!(dev.size(), 128 << 20);
    let o = uext4::mkfs::MkfsOptions::like_mke2fs(dev.size(), None);
    uext4::mkfs::mkfs(&*dev, &o).unwrap();
    drop(dev);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    write_tree(&fs, 3, 8);
    // fallocate: zeroed through WRITE_ZEROES where qemu-nbd offers it.
    let f = fs.create(2, b"prealloc", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(f, 0, 0, 8 << 20).unwrap();
    fs.write(f, 4096, b"inside").unwrap();
    fs.fsync(f, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    srv.stop();
    let raw = scratch("nbd-qcow2-raw");
    sh(&format!(
        "qemu-img convert -O raw {} {}",
        q.0.display(),
        raw.0.display()
    ));
    e2fsck_clean(&raw.0);
    let local = Fs::open_path(&raw.0, ro()).unwrap();
    check_tree(&local, 3, 8);
    let f = path_of(&local, "prealloc");
    let data = read_all(&local, f);
    assert_eq!(data.len(), 8 << 20);
    assert_eq!(&data[4096..4102], b"inside");
    assert!(data[..4096].iter().all(|&b| b == 0) && data[4102..].iter().all(|&b| b == 0));
}

/// Many threads with requests in flight at once on one connection and on several, each
/// checking its own data: the replies (out of order under the delay filter and nbdkit's
/// parallel threads) reach the requests they answer.
#[test]
fn pipelined_requests_from_many_threads_are_matched_by_cookie() {
    if !have(&["nbdkit"]) {
        return;
    }
    let srv = NbdServer::nbdkit(&[
        "--filter=delay",
        "memory",
        "size=64M",
        "delay-read=3ms",
        "delay-write=3ms",
    ]);
    for conns in [1, 4] {
        let uri = format!("{}&x-connections={conns}", srv.uri);
        let dev = Arc::new(NbdDevice::open(&uri, false).unwrap());
        assert_eq!(dev.connections(), conns);
        let t = Instant::now();
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    for round in 0..20u64 {
                        let off = (t * 20 + round) * 65536 + (round % 3) * 512;
                        let len = 4096 * (1 + (round % 4) as usize);
                        let pat: Vec<u8> = (0..len)
                            .map(|i| (i as u64 * 7 + t + round * 3) as u8)
                            .collect();
                        dev.write_at(off, &pat).unwrap();
                        let mut back = vec![0u8; len];
                        dev.read_at(off, &mut back).unwrap();
                        assert_eq!(back, pat, "thread {t} round {round}");
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        dev.flush().unwrap();
        // 16 threads × 20 rounds × (write + read) at 3 ms each take about 2 s one at a time.
        eprintln!(
            "{conns} connection(s): {:?}, at most {} requests in flight on one connection",
            t.elapsed(),
            dev.max_in_flight()
        );
        assert!(dev.max_in_flight() > 1, "requests were not pipelined");
    }
}

#[test]
fn writes_go_behind_yet_reads_see_them_and_a_flush_makes_them_durable() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-behind");
    std::fs::write(&img.0, vec![0u8; 8 << 20]).unwrap();
    // Slow writes on a server that carries out requests in parallel, in any order.
    let srv = NbdServer::nbdkit(&[
        "--filter=delay",
        "file",
        &format!("file={}", img.0.display()),
        "delay-write=20ms",
    ]);
    let dev = NbdDevice::open(&srv.uri, false).unwrap();
    let pat = |n: u8| vec![n; 4096];
    // One thread: each write returns once sent, so several are in flight at once.
    for i in 0..8u64 {
        dev.write_at(i * 4096, &pat(i as u8 + 1)).unwrap();
    }
    assert!(
        dev.max_in_flight() > 1,
        "writes from one thread waited for their replies"
    );
    // Overwrites of a block in flight land in order, and a read sees the last.
    for n in 10..20u8 {
        dev.write_at(0, &pat(n)).unwrap();
    }
    let mut back = vec![0u8; 4096];
    dev.read_at(0, &mut back).unwrap();
    assert_eq!(back, pat(19), "a read did not see the writes before it");
    // After the flush every write is in the image the server serves.
    dev.flush().unwrap();
    let on_disk = std::fs::read(&img.0).unwrap();
    assert_eq!(&on_disk[..4096], &pat(19)[..]);
    for i in 1..8usize {
        assert_eq!(&on_disk[i * 4096..(i + 1) * 4096], &pat(i as u8 + 1)[..]);
    }
}

#[test]
fn trim_reaches_the_server_and_the_export_shrinks() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-trim");
    mke2fs(&img.0, "64M", &[]);
    let mut srv = NbdServer::nbdkit(&["file", &format!("file={}", img.0.display())]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    let f = fs.create(2, b"big", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![0x5a; 24 << 20]).unwrap();
    fs.sync().unwrap();
    let blocks = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    };
    let full = blocks(&img.0);
    fs.unlink(2, b"big").unwrap();
    fs.sync().unwrap();
    let t = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(t.supported && t.bytes >= 24 << 20, "{t:?}");
    fs.unmount().unwrap();
    drop(fs);
    srv.stop();
    let after = blocks(&img.0);
    assert!(after + (20 << 20) <= full, "{full} -> {after}");
    e2fsck_clean(&img.0);
}

#[test]
fn block_size_constraints_are_honoured_with_read_modify_write() {
    if !have(&["nbdkit"]) {
        return;
    }
    let srv = NbdServer::nbdkit(&[
        "--filter=blocksize-policy",
        "memory",
        "size=16M",
        "blocksize-minimum=4096",
        "blocksize-preferred=4096",
        "blocksize-maximum=65536",
        "blocksize-error-policy=error",
    ]);
    let dev = NbdDevice::open(&srv.uri, false).unwrap();
    assert_eq!(dev.min_block_size(), 4096);
    let pat: Vec<u8> = (0..300_000).map(|i| (i % 253) as u8).collect();
    dev.write_at(1000, &pat).unwrap();
    dev.write_at(5000, b"hello").unwrap();
    let mut back = vec![0u8; 300_000];
    dev.read_at(1000, &mut back).unwrap();
    let mut want = pat.clone();
    want[4000..4005].copy_from_slice(b"hello");
    assert_eq!(back, want);
    dev.zero_range(3000, 20_000).unwrap();
    let mut z = vec![1u8; 20_002];
    dev.read_at(2999, &mut z).unwrap();
    assert_eq!(z[0], want[1999]);
    assert!(z[1..20_001].iter().all(|&b| b == 0));
    assert_eq!(z[20_001], want[22_000]);
    // And a filesystem on it (1 KiB superblock writes at 1024 are not whole blocks).
    let dev = Arc::new(dev);
    let o = uext4::mkfs::MkfsOptions::like_mke2fs(dev.size(), Some(1024));
    uext4::mkfs::mkfs(&*dev, &o).unwrap();
    let fs = Fs::open_dev(dev.clone(), rw()).unwrap();
    write_tree(&fs, 2, 7);
    check_tree(&fs, 2, 7);
    fs.unmount().unwrap();
    drop(fs);
    drop(dev);
    e2fsck_export(&srv.uri);
}

#[test]
fn a_read_only_export_opens_read_only() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-ro");
    mke2fs(&img.0, "32M", &[]);
    let before = std::fs::read(&img.0).unwrap();
    let srv = NbdServer::nbdkit(&["-r", "file", &format!("file={}", img.0.display())]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    assert!(fs.is_read_only());
    assert!(fs.read_only_reason().unwrap().contains("not writable"));
    let e = fs.create(2, b"x", 0o644, 0, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    fs.unmount().unwrap();
    drop(fs);
    assert!(
        std::fs::read(&img.0).unwrap() == before,
        "a read-only export was written"
    );
}

#[test]
fn write_errors_from_the_server_fail_fsync_and_the_next_open_recovers() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-err");
    mke2fs(&img.0, "64M", &[]);
    let trigger = scratch("nbd-err-trigger");
    let mut srv = NbdServer::nbdkit(&[
        "--filter=error",
        "file",
        &format!("file={}", img.0.display()),
        "error-pwrite=EIO",
        "error-pwrite-rate=100%",
        &format!("error-pwrite-file={}", trigger.0.display()),
        "error-zero=EIO",
        "error-zero-rate=100%",
        &format!("error-zero-file={}", trigger.0.display()),
    ]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    write_tree(&fs, 2, 7);
    std::fs::write(&trigger.0, b"").unwrap();
    let f = fs.create(2, b"late", 0o644, 0, 0).unwrap().ino;
    let _ = fs.write(f, 0, &[7u8; 100_000]);
    let e = fs.fsync(f, false).unwrap_err();
    eprintln!("fsync with the server failing writes: {e}");
    assert!(
        fs.sync().is_err(),
        "a later sync succeeded after a failed write"
    );
    let _ = fs.unmount();
    drop(fs);
    std::fs::remove_file(&trigger.0).unwrap();
    // The next open replays the journal; what fsync acknowledged is there.
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    check_tree(&fs, 2, 7);
    fs.unmount().unwrap();
    drop(fs);
    srv.stop();
    e2fsck_clean(&img.0);
}

#[test]
fn a_server_killed_midway_gives_clear_errors_and_the_next_open_replays_the_journal() {
    if !have(&["nbdkit"]) {
        return;
    }
    let img = scratch("nbd-kill");
    mke2fs(&img.0, "64M", &[]);
    let mut srv = NbdServer::nbdkit(&["file", &format!("file={}", img.0.display())]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    // Acknowledged (fsynced) files, then writers still going when the server dies.
    write_tree(&fs, 2, 7);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let fs = fs.clone();
            let stop = stop.clone();
            std::thread::spawn(move || -> Option<String> {
                let dir = fs
                    .mkdir(2, format!("w{t}").as_bytes(), 0o755, 0, 0)
                    .ok()?
                    .ino;
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) && i > 1000 {
                        return None;
                    }
                    let r = fs
                        .create(dir, format!("{i}").as_bytes(), 0o644, 0, 0)
                        .and_then(|a| fs.write(a.ino, 0, &[t as u8; 8192]).map(|_| a.ino))
                        .and_then(|ino| fs.fsync(ino, false));
                    if let Err(e) = r {
                        return Some(e.to_string());
                    }
                }
                None
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    srv.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let e = w
            .join()
            .unwrap()
            .expect("a writer went on after the server died");
        eprintln!("writer: {e}");
        assert!(!e.contains('\n'));
    }
    assert!(fs.sync().is_err());
    let _ = fs.unmount();
    drop(fs);
    // The journal was left to replay (the server died between commits and checkpoints).
    let mut srv = NbdServer::nbdkit(&["file", &format!("file={}", img.0.display())]);
    let fs = Fs::open_path(Path::new(&srv.uri), rw()).unwrap();
    check_tree(&fs, 2, 7);
    fs.unmount().unwrap();
    drop(fs);
    srv.stop();
    e2fsck_clean(&img.0);
}

#[test]
fn bad_servers_and_names_are_one_line_errors() {
    let one_line = |uri: &str| {
        let e = Fs::open_path(Path::new(uri), rw())
            .err()
            .expect(uri)
            .to_string();
        eprintln!("{uri}: {e}");
        assert!(!e.contains('\n'), "{e}");
        e
    };
    // Connection refused (nothing listens), a missing socket.
    let port = free_port();
    assert!(one_line(&format!("nbd://127.0.0.1:{port}/")).contains("onnection refused"));
    assert!(one_line("nbd+unix:///?socket=/nonexistent/x.sock").contains("No such file"));
    assert!(one_line("nbds://127.0.0.1/").contains("TLS"));
    assert!(one_line("nbd+unix:///").contains("socket="));
    // Not an NBD server, and one that hangs up at once.
    for greeting in [&b"HTTP/1.1 400 Bad Request\r\n\r\n"[..], &b""[..]] {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let g = greeting.to_vec();
        let t = std::thread::spawn(move || {
            use std::io::Write;
            let (mut c, _) = l.accept().unwrap();
            let _ = c.write_all(&g);
        });
        let e = one_line(&format!("nbd://127.0.0.1:{port}/"));
        assert!(
            e.contains("not an NBD server") || e.contains("closed the connection"),
            "{e}"
        );
        t.join().unwrap();
    }
    if have(&["qemu-nbd"]) {
        let img = scratch("nbd-names");
        std::fs::write(&img.0, vec![0u8; 1 << 20]).unwrap();
        let srv = NbdServer::qemu_nbd(&img.0, "raw", "disk");
        let other = srv.uri.replace("/disk?", "/nosuch?");
        assert!(one_line(&other).contains("has no export \"nosuch\""));
        // The export is there but holds no filesystem.
        assert!(one_line(&srv.uri).contains("not an ext2/3/4"));
    }
    if have(&["nbdkit"]) {
        let psk = scratch("nbd-psk");
        std::fs::write(&psk.0, "alice:0123456789abcdef0123456789abcdef\n").unwrap();
        let srv = NbdServer::nbdkit(&[
            "--tls=require",
            &format!("--tls-psk={}", psk.0.display()),
            "memory",
            "size=1M",
        ]);
        assert!(one_line(&srv.uri).contains("requires TLS"));
    }
}
