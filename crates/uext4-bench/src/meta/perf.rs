//! Counting the FUSE requests a workload sends, with `perf stat` on the FUSE tracepoint.

use super::posix::{check, cpath};
use super::*;

/// The FUSE opcodes counted one by one (the kernel's `fuse_opcode`); the rest go to "other".
const OPCODES: &[(u32, &str)] = &[
    (1, "LOOKUP"),
    (2, "FORGET"),
    (3, "GETATTR"),
    (4, "SETATTR"),
    (5, "READLINK"),
    (6, "SYMLINK"),
    (8, "MKNOD"),
    (9, "MKDIR"),
    (10, "UNLINK"),
    (11, "RMDIR"),
    (12, "RENAME"),
    (13, "LINK"),
    (14, "OPEN"),
    (15, "READ"),
    (16, "WRITE"),
    (17, "STATFS"),
    (18, "RELEASE"),
    (20, "FSYNC"),
    (21, "SETXATTR"),
    (22, "GETXATTR"),
    (23, "LISTXATTR"),
    (24, "REMOVEXATTR"),
    (25, "FLUSH"),
    (27, "OPENDIR"),
    (28, "READDIR"),
    (29, "RELEASEDIR"),
    (30, "FSYNCDIR"),
    (34, "ACCESS"),
    (35, "CREATE"),
    (36, "INTERRUPT"),
    (39, "IOCTL"),
    (40, "POLL"),
    (42, "BATCH_FORGET"),
    (43, "FALLOCATE"),
    (44, "READDIRPLUS"),
    (45, "RENAME2"),
    (46, "LSEEK"),
    (47, "COPY_FILE_RANGE"),
    (50, "SYNCFS"),
    (51, "TMPFILE"),
    (52, "STATX"),
];

/// Counts the requests the kernel sends to one FUSE connection, by opcode, with `perf stat` on
/// the `fuse:fuse_request_send` tracepoint filtered by the connection (the mount's device
/// number): no change to any server, the same count for uext4, fuse2fs and fuse-mem. Each
/// tracepoint hit costs a little, so the counting pass is run apart from the timed ones.
pub struct PerfCounter {
    conn: u64,
    dir: PathBuf,
    child: Option<std::process::Child>,
}

impl PerfCounter {
    /// For the FUSE mount at `mnt`; `scratch` holds perf's control fifos and output.
    pub fn new(mnt: &Path, scratch: &Path) -> Result<PerfCounter> {
        let md = std::fs::metadata(mnt).with_context(|| mnt.display().to_string())?;
        let dev = md.dev();
        // The kernel's dev_t: major << 20 | minor.
        let conn = ((libc::major(dev) as u64) << 20) | libc::minor(dev) as u64;
        Ok(PerfCounter {
            conn,
            dir: scratch.to_path_buf(),
            child: None,
        })
    }

    /// Whether perf can count the FUSE tracepoint here.
    pub fn available() -> bool {
        std::process::Command::new("perf")
            .args(["list", "fuse:fuse_request_send"])
            .output()
            .map(|o| {
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).contains("fuse_request_send")
            })
            .unwrap_or(false)
    }

    fn files(&self) -> (PathBuf, PathBuf, PathBuf) {
        (
            self.dir.join("perf.ctl"),
            self.dir.join("perf.ack"),
            self.dir.join("perf.out"),
        )
    }
}

fn open_nonblock(p: &Path, flags: libc::c_int) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    if flags == libc::O_WRONLY {
        o.write(true);
    } else {
        o.read(true);
    }
    o.custom_flags(libc::O_NONBLOCK).open(p)
}

impl Counter for PerfCounter {
    fn start(&mut self) -> Result<()> {
        let (ctl, ack, out) = self.files();
        for p in [&ctl, &ack, &out] {
            let _ = std::fs::remove_file(p);
        }
        for p in [&ctl, &ack] {
            let c = cpath(p)?;
            // SAFETY: a NUL-terminated path.
            check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, "mkfifo", p)?;
        }
        let mut cmd = std::process::Command::new("perf");
        cmd.args(["stat", "-x,", "-a", "-D", "-1"])
            .arg("-o")
            .arg(&out)
            .arg("--control")
            .arg(format!("fifo:{},{}", ctl.display(), ack.display()));
        let c = self.conn;
        for (op, _) in OPCODES {
            cmd.args(["-e", "fuse:fuse_request_send", "--filter"])
                .arg(format!("connection == {c} && opcode == {op}"));
        }
        cmd.args(["-e", "fuse:fuse_request_send", "--filter"])
            .arg(format!("connection == {c}"));
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().context("perf")?;
        // perf opens its fifos once its counters are set up; then it is told to start counting
        // and answers "ack".
        let t0 = Instant::now();
        let mut w = loop {
            match open_nonblock(&ctl, libc::O_WRONLY) {
                Ok(f) => break f,
                Err(_) if t0.elapsed().as_secs() < 20 => {
                    if let Ok(Some(s)) = child.try_wait() {
                        bail!("perf stat exited ({s}) before counting");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e).context("perf stat's control fifo");
                }
            }
        };
        let mut a = open_nonblock(&ack, libc::O_RDONLY)?;
        w.write_all(b"enable\n")?;
        let mut got = Vec::new();
        let mut b = [0u8; 16];
        while !got.windows(3).any(|x| x == b"ack") {
            match a.read(&mut b) {
                Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
                _ if t0.elapsed().as_secs() < 20 => {
                    std::thread::sleep(std::time::Duration::from_millis(2))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("perf stat did not start counting");
                }
            }
        }
        self.child = Some(child);
        Ok(())
    }

    fn stop(&mut self) -> Result<BTreeMap<String, u64>> {
        let (ctl, ack, out) = self.files();
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("the request counter was not started"))?;
        // SAFETY: our own child's process id.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        child.wait()?;
        let text = std::fs::read_to_string(&out).context("perf stat's output")?;
        let counts: Vec<u64> = text
            .lines()
            .filter(|l| l.contains("fuse:fuse_request_send"))
            .map(|l| {
                l.split(',')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .parse()
                    .unwrap_or(0)
            })
            .collect();
        if counts.len() != OPCODES.len() + 1 {
            bail!(
                "perf stat printed {} counts, not {}",
                counts.len(),
                OPCODES.len() + 1
            );
        }
        let mut m = BTreeMap::new();
        let total = counts[OPCODES.len()];
        let mut named = 0;
        for ((_, name), &n) in OPCODES.iter().zip(&counts) {
            if n > 0 {
                m.insert(name.to_string(), n);
                named += n;
            }
        }
        if total > named {
            m.insert("other".to_string(), total - named);
        }
        m.insert("total".to_string(), total);
        for p in [&ctl, &ack, &out] {
            let _ = std::fs::remove_file(p);
        }
        Ok(m)
    }
}

impl Drop for PerfCounter {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
