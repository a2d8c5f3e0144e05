//! Random 4 KiB overwrites in-process (overwrite-4k's pattern: 32 files, every job writing
//! anywhere in any of them, no fsync) on one image opened locally and served by nbdkit's file
//! plugin over a Unix socket and TCP loopback, with the NBD rate as a fraction of local.
//!
//!     cargo run --release -p uext4 --example nbd_overwrite -- [SECONDS] [JOBS,JOBS,...]
//!
//! Needs mke2fs and nbdkit; the image lives in /dev/shm. Results: BENCHMARKS.md.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::{Fs, MountOptions};

const FILES: usize = 32;
const FILE_SIZE: u64 = 8 << 20;

fn opts() -> MountOptions {
    MountOptions {
        commit_interval_secs: 0,
        ..Default::default()
    }
}

fn run(fs: &Arc<Fs>, jobs: usize, secs: f64) -> f64 {
    let inos: Vec<u32> = (0..FILES)
        .map(|i| fs.lookup(2, format!("ow.{i}").as_bytes()).unwrap().ino)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..jobs)
        .map(|j| {
            let (fs, inos, stop, done) = (fs.clone(), inos.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (j as u64 + 1);
                let buf = vec![j as u8; 4096];
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let ino = inos[(x % FILES as u64) as usize];
                    let off = (x >> 8) % (FILE_SIZE / 4096) * 4096;
                    fs.write(ino, off, &buf).unwrap();
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

struct Server(Child, std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill with our child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

fn nbdkit(args: &[String], ready: impl Fn() -> bool, sock: std::path::PathBuf) -> Server {
    let c = Command::new("nbdkit")
        .args(["-f", "--exit-with-parent"])
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdkit");
    let s = Server(c, sock);
    let t = Instant::now();
    while !ready() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nbdkit did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let jobs: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').filter_map(|j| j.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8]);
    let img = Path::new("/dev/shm").join(format!("uext4-nbd-bench-{}.img", std::process::id()));
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096"])
        .arg(&img)
        .arg("512M")
        .status()
        .unwrap();
    assert!(st.success());
    {
        let fs = Fs::open_path(&img, opts()).unwrap();
        let data = vec![0x5au8; 1 << 20];
        for i in 0..FILES {
            let ino = fs
                .create(2, format!("ow.{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino;
            for m in 0..FILE_SIZE >> 20 {
                fs.write(ino, m << 20, &data).unwrap();
            }
        }
        fs.unmount().unwrap();
    }
    let sock = std::env::temp_dir().join(format!("uext4-nbd-bench-{}.sock", std::process::id()));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    println!("| jobs | local (mapped, tmpfs) | local (pread/pwrite) | NBD Unix socket | NBD TCP loopback | Unix / pwrite | Unix / mapped |");
    println!("|---|---|---|---|---|---|---|");
    for &j in &jobs {
        let mapped = {
            let fs = Fs::open_path(&img, opts()).unwrap();
            let r = run(&fs, j, secs);
            fs.unmount().unwrap();
            r
        };
        let pwrite = {
            let o = MountOptions {
                map_tmpfs: false,
                ..opts()
            };
            let fs = Fs::open_path(&img, o).unwrap();
            let r = run(&fs, j, secs);
            fs.unmount().unwrap();
            r
        };
        let file = format!("file={}", img.display());
        let unix = {
            let s2 = sock.clone();
            let _srv = nbdkit(
                &[
                    "-U".into(),
                    sock.display().to_string(),
                    "file".into(),
                    file.clone(),
                ],
                move || s2.exists(),
                sock.clone(),
            );
            let uri = format!("nbd+unix:///?socket={}", sock.display());
            let fs = Fs::open_path(Path::new(&uri), opts()).unwrap();
            let r = run(&fs, j, secs);
            fs.unmount().unwrap();
            r
        };
        let tcp = {
            let _srv = nbdkit(
                &[
                    "-i".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                    "file".into(),
                    file.clone(),
                ],
                move || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                std::path::PathBuf::new(),
            );
            let uri = format!("nbd://127.0.0.1:{port}/");
            let fs = Fs::open_path(Path::new(&uri), opts()).unwrap();
            let r = run(&fs, j, secs);
            fs.unmount().unwrap();
            r
        };
        println!(
            "| {j} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.0}% |",
            mapped,
            pwrite,
            unix,
            tcp,
            100.0 * unix / pwrite,
            100.0 * unix / mapped
        );
    }
    let _ = std::fs::remove_file(&img);
}
