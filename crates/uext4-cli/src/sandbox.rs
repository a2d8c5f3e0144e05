//! The contained server and `--sandbox` for the image tools: what of `uext4::sandbox` the
//! command line decides (which files a command names, the mount options, who unmounts).
//! The engine's `contain` takes a list of paths; which paths a command needs is known here.
//!
//! A contained mount server has no capability left to unmount with (and may not run
//! fusermount3): before it contains itself it starts `uext4 __unmounter`, a small process
//! that keeps the starter's privileges, reads nothing from the image, and on the server's
//! word through a pipe unmounts that server's mounts, as the server did itself before.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// `-o nosandbox`, the default, or `-o sandbox=required`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// Contained as far as the kernel allows; what it lacks is said in one line each.
    On,
    /// Refused (before mounting) where the kernel lacks a mechanism.
    Required,
}

/// Takes `nosandbox`, `sandbox` and `sandbox=required|on|off` out of the mount options.
pub fn take_option(options: &[String]) -> Result<(Vec<String>, Mode)> {
    let (mut rest, mut mode) = (Vec::new(), Mode::On);
    for o in options.iter().flat_map(|l| l.split(',')) {
        match o.trim() {
            "nosandbox" | "sandbox=off" => mode = Mode::Off,
            "sandbox" | "sandbox=on" => mode = Mode::On,
            "sandbox=required" => mode = Mode::Required,
            s if s.starts_with("sandbox=") => {
                bail!("option {s}: sandbox= takes on, off or required")
            }
            "" => {}
            s => rest.push(s.to_string()),
        }
    }
    Ok((rest, mode))
}

/// What this kernel lacks of the containment (one line each), found without applying it:
/// `sandbox=required` refuses to mount where this is not empty.
pub fn missing_here() -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: prctl(PR_GET_SECCOMP) takes no pointers.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
        out.push("seccomp: not supported by this kernel".to_string());
    }
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if abi < 6 {
        out.push(match abi {
            a if a < 1 => "landlock: not available in this kernel".to_string(),
            a => format!("landlock: this kernel's ABI {a} is older than 6"),
        });
    }
    out
}

/// Contains this process: `image` readable (and writable unless `read_only`; None for an
/// NBD export, whose connection is open already) plus `extra` paths read-write (where files
/// may be made). Where the
/// kernel lacks a mechanism it says so in one line and goes on.
pub fn contain(image: Option<&Path>, read_only: bool, extra: Vec<PathBuf>) -> Result<()> {
    let mut policy = uext4::sandbox::Policy {
        audit_only: std::env::var_os(AUDIT_ENV).is_some(),
        host_files: !extra.is_empty(),
        write: extra,
        ..Default::default()
    };
    if let Some(image) = image {
        if read_only {
            policy.read.push(image.to_path_buf());
        } else {
            policy.write.push(image.to_path_buf());
        }
    }
    let done = uext4::sandbox::contain(&policy).context("sandbox")?;
    for m in done.missing {
        eprintln!("uext4: sandbox: {m}; going on without it");
    }
    Ok(())
}

/// Set in the environment, the seccomp filter logs calls off its list (`dmesg`) instead of
/// refusing them: for finding what a new code path needs.
pub const AUDIT_ENV: &str = "UEXT4_SANDBOX_AUDIT";

/// Set in the environment, a contained server tries what the sandbox should refuse, once
/// contained, from a thread started before (comma-separated: `socket`, `open=PATH`,
/// `exec=PATH`), and says how each went on stderr: for the tests.
pub const PROBE_ENV: &str = "UEXT4_SANDBOX_PROBE";

/// Starts the probe thread where `UEXT4_SANDBOX_PROBE` asks for one; it runs when the
/// returned sender is dropped (after containing).
pub fn start_probe() -> Option<std::sync::mpsc::Sender<()>> {
    let what = std::env::var(PROBE_ENV).ok()?;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = rx.recv();
        for p in what.split(',') {
            let r = match p.split_once('=') {
                None if p == "socket" => std::os::unix::net::UnixDatagram::unbound().map(|_| ()),
                Some(("open", path)) => std::fs::File::open(path).map(|_| ()),
                Some(("exec", path)) => std::process::Command::new(path).status().map(|_| ()),
                _ => continue,
            };
            match r {
                Ok(()) => eprintln!("uext4: sandbox probe: {p}: allowed"),
                Err(e) => eprintln!("uext4: sandbox probe: {p}: refused ({e})"),
            }
        }
    });
    Some(tx)
}

/// The privileged side of a contained server: unmounts its mounts when asked.
pub struct Unmounter {
    child: std::process::Child,
    answers: BufReader<std::process::ChildStdout>,
}

impl Unmounter {
    /// Starts `uext4 __unmounter` for the mounts of device `dev` (or `mountpoint`).
    pub fn start(dev: Option<&str>, mountpoint: &Path) -> Result<Unmounter> {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.arg("__unmounter").arg(mountpoint);
        if let Some(d) = dev {
            cmd.arg(d);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the unmount helper")?;
        let answers = BufReader::new(child.stdout.take().context("unmount helper")?);
        Ok(Unmounter { child, answers })
    }

    /// Has the helper unmount every mount of the server; its error, if any.
    pub fn unmount(&mut self) -> Result<()> {
        let stdin = self.child.stdin.as_mut().context("unmount helper")?;
        stdin.write_all(b"u\n").context("unmount helper")?;
        let mut line = String::new();
        self.answers.read_line(&mut line)?;
        match line.trim() {
            "ok" => Ok(()),
            "" => bail!("the unmount helper is gone"),
            e => bail!("{e}"),
        }
    }
}

/// `uext4 __unmounter MOUNTPOINT [DEV]`: for each `u` line on stdin, unmounts the server's
/// mounts (newest first) with `unmount` and answers `ok` or the error; ends at end of input
/// (the server is gone).
pub fn run_unmounter(unmount: impl Fn() -> Result<()>) -> Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        if line?.trim() != "u" {
            continue;
        }
        let answer = match unmount() {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{e:#}").replace('\n', " "),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// `--sandbox` on the image tools.
static TOOLS: AtomicBool = AtomicBool::new(false);
/// The host paths the command names (what a contained tool may still open).
static NAMED: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// Asks the image tools to contain themselves once their image is open; `args` is the
/// command line, whose existing host paths (or, for a file still to be made, its directory)
/// stay open to them.
pub fn request_for_tools(args: &[std::ffi::OsString]) {
    let mut named = Vec::new();
    for a in args.iter().skip(1) {
        let s = a.to_string_lossy();
        if s.starts_with('-') {
            continue;
        }
        // IMAGE:PATH and IMAGE@N name IMAGE.
        let cands = [
            s.to_string(),
            s.split(':').next().unwrap_or("").to_string(),
            s.split('@').next().unwrap_or("").to_string(),
        ];
        let found: Vec<PathBuf> = cands
            .iter()
            .map(PathBuf::from)
            .filter(|p| !p.as_os_str().is_empty() && p.exists())
            .collect();
        if found.is_empty() {
            let parent = Path::new(s.as_ref()).parent().map(Path::to_path_buf);
            let parent = parent.filter(|p| !p.as_os_str().is_empty());
            named.push(parent.unwrap_or_else(|| PathBuf::from(".")));
        }
        named.extend(found);
    }
    let _ = NAMED.set(named);
    TOOLS.store(true, Ordering::SeqCst);
}

/// Contains an image tool once its image is open, where `--sandbox` asked for it (once).
pub fn contain_tool(image: &Path, read_only: bool) -> Result<()> {
    if !TOOLS.swap(false, Ordering::SeqCst) {
        return Ok(());
    }
    let mut named = NAMED.get().cloned().unwrap_or_default();
    if read_only {
        // The image stays read-only even where the command line names it.
        let canon = std::fs::canonicalize(image).ok();
        named.retain(|p| std::fs::canonicalize(p).ok() != canon);
    }
    let image = (!uext4::image::is_nbd_uri(image)).then_some(image);
    contain(image, read_only, named)
}
