//! The virtio-fs family (`uext4 bench --family virtio-fs`): one guest (Debian's kernel booted
//! by scripts/kernel-vm.sh) with two images of the same size, one served by `uext4 serve
//! --vhost-user-fs` (the guest's virtiofs driver sends FUSE requests over virtqueues to uext4
//! on the host) and one attached as a virtio disk that the guest's own ext4 mounts. Inside the
//! guest this binary runs the metadata family and three data workloads on each (guest.rs),
//! and the table gives seconds on each and their ratio. Under TCG (no KVM) the guest's ext4
//! runs emulated while uext4 runs natively: the ratios matter, not the seconds.
//!
//! How this binary runs in the guest: the guest is a busybox initramfs without the host's C
//! library, so the binary goes in with its `ldd` closure (the dynamic loader, libc, libm,
//! libgcc_s) as kernel-vm.sh's `--file` inputs, and is started through the loader itself
//! (`/in/ld-linux-x86-64.so.2 --library-path /in /in/uext4-bench ...`): nothing is installed
//! in the guest's /lib, and the guest's kernel need only match the host's architecture. The
//! same code that times the host's systems then times the guest's, with no second runner to
//! keep in step.

use crate::guest;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The labels of the two sides, as the guest prints them.
const VFS: &str = "virtio-fs";
const BLK: &str = "virtio-blk";

/// What the family needs from the caller.
pub struct Args<'a> {
    pub base: &'a Path,
    pub out: &'a Path,
    pub uext4: &'a Path,
    pub entries: usize,
    pub mib: usize,
    pub quick: bool,
    /// `-o` options for `uext4 serve` (threads=N, ...), comma-separated.
    pub serve_opts: Option<&'a str>,
}

/// `--vm-guest` (this binary inside the guest: guest.rs) or `--family virtio-fs` (the host's
/// side, here).
pub fn from_args(a: &crate::BenchArgs) -> Result<()> {
    if !a.vm_guest.is_empty() {
        return guest::run(&guest::Plan {
            dirs: a
                .vm_guest
                .iter()
                .map(|d| guest::parse_dir(d))
                .collect::<Result<_>>()?,
            entries: a.guest_entries,
            mib: a.guest_mib,
            quick: a.quick,
        });
    }
    let base = a
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("uext4-bench"));
    let (entries, mib) = if a.quick {
        (a.guest_entries.min(500), a.guest_mib.min(16))
    } else {
        (a.guest_entries, a.guest_mib)
    };
    run(&Args {
        base: &base,
        out: &a.out,
        uext4: &crate::uext4_exe()?,
        entries,
        mib,
        quick: a.quick,
        serve_opts: a.serve_options.as_deref(),
    })
}

/// scripts/kernel-vm.sh: UEXT4_KERNEL_VM, else the source tree this binary was built from.
fn kernel_vm() -> PathBuf {
    std::env::var_os("UEXT4_KERNEL_VM")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kernel-vm.sh"))
}

/// Why no guest can boot here, or None.
fn why_not() -> Option<String> {
    let kvm = kernel_vm();
    if !kvm.exists() {
        return Some(format!(
            "no {} (run from the source tree, or set UEXT4_KERNEL_VM)",
            kvm.display()
        ));
    }
    let o = match Command::new("bash").arg(&kvm).arg("--check").output() {
        Ok(o) => o,
        Err(e) => return Some(format!("bash {}: {e}", kvm.display())),
    };
    if o.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    Some(
        text.lines()
            .find_map(|l| l.strip_prefix("SKIP: "))
            .unwrap_or("scripts/kernel-vm.sh --check failed")
            .to_string(),
    )
}

/// The files a dynamically linked `exe` needs in a guest without the host's libraries: itself
/// and its `ldd` closure (the loader included).
fn closure(exe: &Path) -> Result<Vec<PathBuf>> {
    let o = Command::new("ldd").arg(exe).output().context("ldd")?;
    let mut files = vec![exe.to_path_buf()];
    let text = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        // "not a dynamic executable": a static build needs nothing else.
        return Ok(files);
    }
    for l in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
        let path = l
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(PathBuf::from);
        if let Some(p) = path {
            files.push(p);
        }
    }
    if !files.iter().skip(1).any(|f| is_loader(f)) {
        bail!("ldd {}: no dynamic loader among {text:?}", exe.display());
    }
    Ok(files)
}

fn is_loader(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("ld-linux"))
}

/// A `uext4 serve` process, killed on drop if it is still running.
struct Backend(Option<Child>);

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A side and workload: ("virtio-fs" or "virtio-blk", "untar").
type Key = (String, String);
/// A request kind's (opcode, count, server microseconds each).
type Served = (String, u64, f64);

/// The guest's lines: (label, workload) to (seconds, entries), and to the requests by opcode
/// (count, server microseconds each).
#[derive(Default)]
struct Results {
    secs: BTreeMap<(String, String), (f64, u64)>,
    requests: BTreeMap<Key, Vec<Served>>,
    /// The guest's interrupts from the virtio-fs queues: (hiprio, requests).
    irq: BTreeMap<(String, String), (u64, u64)>,
}

fn parse(out: &str) -> Results {
    let mut r = Results::default();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["uext4-vm", label, wl, s, n] => {
                if let (Ok(s), Ok(n)) = (s.parse(), n.parse()) {
                    r.secs.insert((label.to_string(), wl.to_string()), (s, n));
                }
            }
            ["uext4-vm-req", label, wl, op, c, us] => {
                if let (Ok(c), Ok(us)) = (c.parse(), us.parse()) {
                    r.requests
                        .entry((label.to_string(), wl.to_string()))
                        .or_default()
                        .push((op.to_string(), c, us));
                }
            }
            ["uext4-vm-irq", label, wl, q, n] => {
                let e = r
                    .irq
                    .entry((label.to_string(), wl.to_string()))
                    .or_default();
                match (*q, n.parse()) {
                    ("hiprio", Ok(n)) => e.0 = n,
                    ("requests", Ok(n)) => e.1 = n,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    r
}

/// Runs the family; prints the table and writes OUT/virtio-fs.md and OUT/virtio-fs.json. A
/// machine that cannot boot a guest gets one line saying why, and no error.
pub fn run(a: &Args) -> Result<()> {
    std::fs::create_dir_all(a.out)?;
    if let Some(why) = why_not() {
        let line = format!("virtio-fs family skipped: {why}");
        println!("{line}");
        std::fs::write(a.out.join("virtio-fs.md"), format!("{line}\n"))?;
        return Ok(());
    }
    if a.uext4.is_absolute() && !a.uext4.exists() {
        bail!(
            "no {} beside this binary (cargo build --release -p uext4-cli)",
            a.uext4.display()
        );
    }
    let work = a.base.join("virtio-fs");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let r = boot(a, &work);
    let _ = std::fs::remove_dir_all(&work);
    let (res, fsck) = r?;
    let report = report(a, &res, &fsck);
    print!("{report}");
    std::fs::write(a.out.join("virtio-fs.md"), &report)?;
    let json: Vec<serde_json::Value> = res
        .secs
        .iter()
        .map(|((label, w), (s, n))| {
            let key = (label.clone(), w.clone());
            let req = res.requests.get(&key);
            let irq = res.irq.get(&key);
            serde_json::json!({
                "system": label, "workload": w, "seconds": s, "entries": n,
                "guest_interrupts": irq.map(|(h, q)| serde_json::json!({"hiprio": h, "requests": q})),
                "requests": req.map(|v| v.iter().map(|(op, c, us)| {
                    serde_json::json!({"opcode": op, "count": c, "us_each": us})
                }).collect::<Vec<_>>()),
            })
        })
        .collect();
    std::fs::write(
        a.out.join("virtio-fs.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let missing: Vec<String> = guest::DATA
        .iter()
        .chain(crate::meta::WORKLOADS)
        .flat_map(|w| [VFS, BLK].map(|l| (l, *w)))
        .filter(|(l, w)| !res.secs.contains_key(&(l.to_string(), w.to_string())))
        .map(|(l, w)| format!("{l} {w}"))
        .collect();
    if !missing.is_empty() {
        bail!("the guest gave no numbers for: {}", missing.join(", "));
    }
    Ok(())
}

/// Makes the images, starts the back end, boots the guest; the guest's results and e2fsck's
/// verdict on each image.
fn boot(a: &Args, work: &Path) -> Result<(Results, Vec<String>)> {
    // Room for the metadata tree twice (cp-a) and the data file.
    let mib = a.mib + a.entries / 10 * 3 + 512;
    let vfs = work.join("vfs.img");
    let blk = work.join("blk.img");
    for img in [&vfs, &blk] {
        crate::sh(&format!(
            "mke2fs -q -F -t ext4 -b 4096 '{}' {mib}M",
            img.display()
        ))?;
    }
    let sock = work.join("sock");
    let log = work.join("serve.log");
    let mut cmd = Command::new(a.uext4);
    cmd.arg("serve").arg("--vhost-user-fs").arg(&sock);
    if let Some(o) = a.serve_opts {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(&vfs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let mut backend = Backend(Some(cmd.spawn().context("uext4 serve")?));
    let serve_log = || std::fs::read_to_string(&log).unwrap_or_default();
    for _ in 0..200 {
        if sock.exists() {
            break;
        }
        if let Some(c) = backend.0.as_mut() {
            if let Some(st) = c.try_wait()? {
                bail!(
                    "uext4 serve exited ({st}): {}",
                    crate::one_line(&serve_log())
                );
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let exe = std::env::current_exe()?;
    let files = closure(&exe)?;
    let loader = files
        .iter()
        .skip(1)
        .find(|f| is_loader(f))
        .and_then(|f| f.file_name())
        .map(|n| format!("/in/{} --library-path /in ", n.to_string_lossy()))
        .unwrap_or_default();
    let script = work.join("run.sh");
    std::fs::write(
        &script,
        format!(
            "mkdir -p /mnt/v /mnt/b\n\
             mount -t virtiofs bench /mnt/v || exit 1\n\
             mount -t ext4 /dev/vda /mnt/b || exit 1\n\
             {loader}/in/{exe_name} --vm-guest {VFS}=/mnt/v --vm-guest {BLK}=/mnt/b \
             --guest-entries {} --guest-mib {}{}\n",
            a.entries,
            a.mib,
            if a.quick { " --quick" } else { "" },
            exe_name = exe.file_name().unwrap_or_default().to_string_lossy(),
        ),
    )?;
    let mut vm = Command::new("bash");
    vm.arg(kernel_vm())
        .arg("--disk")
        .arg(&blk)
        .arg("--vhost-user-fs")
        .arg(format!("{}:bench", sock.display()))
        .args(["--mem", "1536", "--timeout", "7200"]);
    for f in &files {
        vm.arg("--file").arg(f);
    }
    let o = vm.arg(&script).stdin(Stdio::null()).output()?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        bail!(
            "the guest failed ({}): {}",
            o.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    // The back end ends by itself once QEMU has gone (commit, image marked clean).
    let mut child = backend.0.take().ok_or_else(|| anyhow!("no back end"))?;
    let mut st = None;
    for _ in 0..600 {
        st = child.try_wait()?;
        if st.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let Some(st) = st else {
        backend.0 = Some(child);
        bail!("uext4 serve still running 30 s after the guest powered off");
    };
    if !st.success() {
        bail!("uext4 serve: {st}: {}", crate::one_line(&serve_log()));
    }
    let fsck = [(VFS, &vfs), (BLK, &blk)]
        .iter()
        .map(|(l, img)| {
            let o = Command::new("e2fsck").arg("-fn").arg(img).output();
            match o {
                Ok(o) if o.status.success() => format!("{l} clean"),
                Ok(o) => format!(
                    "{l} NOT CLEAN: {}",
                    crate::one_line(&String::from_utf8_lossy(&o.stdout))
                ),
                Err(e) => format!("{l}: e2fsck: {e}"),
            }
        })
        .collect();
    Ok((parse(&out), fsck))
}

/// The table (seconds and ratio per workload), the requests uext4 served per entry for each,
/// and e2fsck's verdict.
fn report(a: &Args, r: &Results, fsck: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## virtio-fs: uext4 serve against the guest's ext4 on virtio-blk (seconds in the guest)\n\n\
         Metadata tree: {} entries generated in the guest; data: {} MiB. Ratio virtio-fs / \
         virtio-blk: below 1, virtio-fs is faster. Under TCG only the ratios mean anything.\n",
        a.entries, a.mib
    );
    s.push_str("| workload | virtio-fs | virtio-blk | ratio | requests / entry | server us / request | guest interrupts (hiprio, requests) |\n|---|---|---|---|---|---|---|\n");
    for w in crate::meta::WORKLOADS.iter().chain(guest::DATA) {
        let get = |l: &str| r.secs.get(&(l.to_string(), w.to_string())).copied();
        let (v, b) = (get(VFS), get(BLK));
        let cell = |x: Option<(f64, u64)>| x.map_or("-".into(), |(s, _)| format!("{s:.3}"));
        let ratio = match (v, b) {
            (Some((v, _)), Some((b, _))) if b > 0.0 => format!("{:.2}", v / b),
            _ => "-".into(),
        };
        let req = r.requests.get(&(VFS.to_string(), w.to_string()));
        let total: u64 = req.map_or(0, |q| q.iter().map(|x| x.1).sum());
        let us: f64 = req.map_or(0.0, |q| q.iter().map(|x| x.1 as f64 * x.2).sum());
        let per = match v {
            Some((_, n)) if n > 0 && total > 0 => format!("{:.1}", total as f64 / n as f64),
            _ => "-".into(),
        };
        let each = if total > 0 {
            format!("{:.1}", us / total as f64)
        } else {
            "-".into()
        };
        let irq = r
            .irq
            .get(&(VFS.to_string(), w.to_string()))
            .map_or("-".into(), |(h, q)| format!("{h}, {q}"));
        let _ = writeln!(
            s,
            "| {w} | {} | {} | {ratio} | {per} | {each} | {irq} |",
            cell(v),
            cell(b)
        );
    }
    s.push_str("\nRequests uext4 served, by opcode (count, server microseconds each):\n\n");
    for w in crate::meta::WORKLOADS.iter().chain(guest::DATA) {
        if let Some(q) = r.requests.get(&(VFS.to_string(), w.to_string())) {
            let mut q = q.clone();
            q.sort_by_key(|x| std::cmp::Reverse(x.1));
            let parts: Vec<String> = q
                .iter()
                .map(|(op, c, us)| format!("{op} {c} ({us:.0} us)"))
                .collect();
            let _ = writeln!(s, "- {w}: {}", parts.join(", "));
        }
    }
    let _ = writeln!(s, "\ne2fsck -fn after the guest: {}.", fsck.join(", "));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guests_lines_are_parsed_and_the_rest_ignored() {
        let out = "kernel noise\nuext4-vm virtio-fs untar 1.5 100\n\
                   uext4-vm-req virtio-fs untar CREATE 90 12.4\n\
                   uext4-vm-irq virtio-fs untar hiprio 3\nuext4-vm-irq virtio-fs untar requests 250\n\
                   uext4-vm virtio-blk untar 0.5 100\nuext4-vm bad\n";
        let r = parse(out);
        assert_eq!(r.secs.len(), 2);
        assert_eq!(r.secs[&(VFS.into(), "untar".into())], (1.5, 100));
        assert_eq!(
            r.requests[&(VFS.into(), "untar".into())],
            vec![("CREATE".to_string(), 90, 12.4)]
        );
        let a = Args {
            base: Path::new("/nonexistent"),
            out: Path::new("/nonexistent"),
            uext4: Path::new("/nonexistent"),
            entries: 100,
            mib: 8,
            quick: true,
            serve_opts: None,
        };
        let rep = report(&a, &r, &["virtio-fs clean".into()]);
        assert!(
            rep.contains("| untar | 1.500 | 0.500 | 3.00 | 0.9 | 12.4 | 3, 250 |"),
            "{rep}"
        );
        assert!(rep.contains("- untar: CREATE 90 (12 us)"), "{rep}");
    }

    #[test]
    fn the_closure_of_this_test_binary_has_its_loader() {
        let exe = std::env::current_exe().unwrap();
        let files = closure(&exe).unwrap();
        assert_eq!(files[0], exe);
        // Built dynamically (the default on glibc), it names the loader and libc.
        if files.len() > 1 {
            assert!(files.iter().any(|f| is_loader(f)), "{files:?}");
            assert!(
                files.iter().all(|f| f.is_absolute() && f.exists()),
                "{files:?}"
            );
        }
    }
}
