//! The virtio-fs family's side inside the guest (`uext4-bench --vm-guest LABEL=DIR ...`, run
//! by the guest's script that `virtio_fs.rs` writes): the metadata family (meta.rs, the same
//! code the host's systems run, through system calls on DIR) and three data workloads, on
//! each folder in turn, printed as lines the host parses:
//!
//!     uext4-vm LABEL WORKLOAD SECONDS ENTRIES
//!     uext4-vm-req LABEL WORKLOAD OPCODE COUNT US_EACH
//!     uext4-vm-irq LABEL WORKLOAD QUEUE INTERRUPTS
//!
//! The last two kinds only where the folder is a uext4 mount: the server's request counters
//! (`user.uext4.stats` of the mount's root, as `uext4 stats` reads them) before and after
//! each workload, so that the round trips each one cost, and the server's time for each, come
//! back with the seconds; and the guest's interrupts from the virtio-fs queues (hiprio, the
//! FORGETs' queue, and requests, summed over the request queues), from /proc/interrupts.
//!
//! The data workloads, after the metadata family:
//! - `fsync-4k`: 200 files, each 4 KiB written and fsynced (a commit each);
//! - `seq-write`: MIB MiB written sequentially in 1 MiB calls, then fsync;
//! - `seq-read`: the same file read back in 1 MiB calls, the guest's caches dropped first.

use crate::meta::{self, Posix};
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

/// What the guest runs: the folders, the metadata tree's size and the data size.
pub struct Plan {
    pub dirs: Vec<(String, std::path::PathBuf)>,
    pub entries: usize,
    pub mib: usize,
    pub quick: bool,
}

/// The data workloads, in the order they run.
pub const DATA: &[&str] = &["fsync-4k", "seq-write", "seq-read"];

/// Parses `LABEL=DIR`.
pub fn parse_dir(s: &str) -> Result<(String, std::path::PathBuf)> {
    let (l, d) = s
        .split_once('=')
        .ok_or_else(|| anyhow!("--vm-guest takes LABEL=DIR, not {s:?}"))?;
    Ok((l.to_string(), d.into()))
}

/// Runs everything on every folder, printing as it goes (the host reads the lines even if a
/// later workload fails).
pub fn run(p: &Plan) -> Result<()> {
    let tree = meta::generate(p.entries, 0x5eed_0024);
    let all: Vec<String> = meta::WORKLOADS.iter().map(|w| w.to_string()).collect();
    for (label, dir) in &p.dirs {
        let mut counter = Stats::new(dir);
        let ops = Posix::new(dir);
        let counting: Option<&mut dyn meta::Counter> =
            counter.as_mut().map(|c| c as &mut dyn meta::Counter);
        let timed = meta::run_family(&ops, &tree, &all, p.quick, counting)
            .with_context(|| format!("metadata family on {label}"))?;
        for t in &timed {
            emit(label, t.workload, t.secs, t.entries, t.requests.as_ref());
        }
        for w in DATA {
            if let Some(c) = counter.as_mut() {
                meta::Counter::start(c)?;
            }
            let (secs, n) = data(dir, w, p.mib).with_context(|| format!("{w} on {label}"))?;
            let req = match counter.as_mut() {
                Some(c) => Some(meta::Counter::stop(c)?),
                None => None,
            };
            emit(label, w, secs, n, req.as_ref());
        }
    }
    Ok(())
}

fn emit(label: &str, w: &str, secs: f64, n: u64, req: Option<&BTreeMap<String, u64>>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "uext4-vm {label} {w} {secs:.6} {n}");
    for (op, c) in req.into_iter().flatten() {
        if let Some(q) = op.strip_prefix("irq:") {
            let _ = writeln!(out, "uext4-vm-irq {label} {w} {q} {c}");
        }
        // Counts and microseconds travel as "OPCODE" and "OPCODE.us" (see `Stats::stop`).
        if let Some(name) = op.strip_suffix(".us") {
            let count = req.and_then(|r| r.get(name)).copied().unwrap_or(0);
            let each = if count > 0 {
                *c as f64 / count as f64
            } else {
                0.0
            };
            let _ = writeln!(out, "uext4-vm-req {label} {w} {name} {count} {each:.2}");
        }
    }
    let _ = out.flush();
}

/// One data workload on `dir`: its seconds and the files (or MiB) it went through.
fn data(dir: &Path, w: &str, mib: usize) -> Result<(f64, u64)> {
    let chunk = vec![0x5au8; 1 << 20];
    let file = dir.join("seq-data");
    let t0;
    let n = match w {
        "fsync-4k" => {
            let d = dir.join("fsync-4k");
            std::fs::create_dir_all(&d)?;
            t0 = Instant::now();
            for i in 0..200 {
                let mut f = std::fs::File::create(d.join(format!("f{i}")))?;
                f.write_all(&chunk[..4096])?;
                f.sync_all()?;
            }
            200
        }
        "seq-write" => {
            t0 = Instant::now();
            let mut f = std::fs::File::create(&file)?;
            for _ in 0..mib {
                f.write_all(&chunk)?;
            }
            f.sync_all()?;
            mib as u64
        }
        "seq-read" => {
            sync_and_drop_caches()?;
            t0 = Instant::now();
            let mut f = std::fs::File::open(&file)?;
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let k = f.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                total += k as u64;
            }
            if total != (mib as u64) << 20 {
                return Err(anyhow!("read {total} bytes back, wrote {} MiB", mib));
            }
            mib as u64
        }
        _ => unreachable!("not a data workload"),
    };
    Ok((t0.elapsed().as_secs_f64(), n))
}

fn sync_and_drop_caches() -> Result<()> {
    // SAFETY: a plain system call.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the guest's caches")
}

/// The guest's interrupts from virtio-fs queues so far: (hiprio, requests.N summed). The
/// lines of /proc/interrupts end with the queue's name ("virtio0-hiprio",
/// "virtio0-requests.0"), after a count per CPU.
fn interrupts() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    let mut n = (0, 0);
    for l in text.lines() {
        let Some(name) = l.split_whitespace().last() else {
            continue;
        };
        let count: u64 = l
            .split_whitespace()
            .skip(1)
            .map_while(|w| w.parse::<u64>().ok())
            .sum();
        if name.ends_with("-hiprio") {
            n.0 += count;
        } else if name.contains("-requests.") {
            n.1 += count;
        }
    }
    n
}

/// The server's request counters, read from the mount's root (`user.uext4.stats`), and the
/// guest's interrupts.
struct Stats {
    root: std::ffi::CString,
    before: BTreeMap<String, (u64, f64)>,
    irq: (u64, u64),
}

impl Stats {
    /// None where `dir` is not a uext4 mount (the attribute is not there).
    fn new(dir: &Path) -> Option<Stats> {
        use std::os::unix::ffi::OsStrExt;
        let root = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let s = Stats {
            root,
            before: BTreeMap::new(),
            irq: (0, 0),
        };
        s.read().ok().map(|_| s)
    }

    /// `fuse_requests`: opcode to (count, microseconds in all).
    fn read(&self) -> Result<BTreeMap<String, (u64, f64)>> {
        let name = c"user.uext4.stats";
        let mut buf = vec![0u8; 1 << 16];
        // SAFETY: the path and name are NUL-terminated, buf is as long as said.
        let n = unsafe {
            libc::getxattr(
                self.root.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("user.uext4.stats");
        }
        let v: serde_json::Value = serde_json::from_slice(&buf[..n as usize])?;
        let mut out = BTreeMap::new();
        if let Some(m) = v.get("fuse_requests").and_then(|r| r.as_object()) {
            for (op, e) in m {
                let count = e.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
                let each = e.get("us_each").and_then(|c| c.as_f64()).unwrap_or(0.0);
                out.insert(op.clone(), (count, each * count as f64));
            }
        }
        Ok(out)
    }
}

impl meta::Counter for Stats {
    fn start(&mut self) -> Result<()> {
        self.before = self.read()?;
        self.irq = interrupts();
        Ok(())
    }

    /// Each opcode's count, and its microseconds in all under "OPCODE.us"; "total" counts
    /// them all; "irq:hiprio" and "irq:requests" the guest's interrupts. The attribute's own
    /// GETXATTR (one at each end) is left out.
    fn stop(&mut self) -> Result<BTreeMap<String, u64>> {
        let after = self.read()?;
        let mut out = BTreeMap::new();
        let mut total = 0;
        for (op, &(c, us)) in &after {
            let (c0, us0) = self.before.get(op).copied().unwrap_or((0, 0.0));
            let mut n = c.saturating_sub(c0);
            if op == "GETXATTR" {
                n = n.saturating_sub(1);
            }
            if n > 0 {
                out.insert(op.clone(), n);
                out.insert(format!("{op}.us"), (us - us0).max(0.0).round() as u64);
                total += n;
            }
        }
        out.insert("total".into(), total);
        let irq = interrupts();
        out.insert("irq:hiprio".into(), irq.0.saturating_sub(self.irq.0));
        out.insert("irq:requests".into(), irq.1.saturating_sub(self.irq.1));
        Ok(out)
    }
}
