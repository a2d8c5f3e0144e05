//! `uext4`: mount an ext4 image through FUSE, work on images without mounting, make new ones,
//! and benchmark against the kernel's ext4 and fuse2fs.

mod host;
mod image;
mod log;
mod mount;
mod sandbox;
mod tools;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "uext4",
    version,
    about = "Userspace ext4: mount, inspect and modify ext4 images",
    after_help = "A path inside an image is IMAGE:PATH (disk.img:/etc/hosts). IMAGE@N names \
                  partition N of a whole-disk image (GPT or MBR, numbered as fdisk and lsblk \
                  do): disk.img@2:/etc/hosts; IMAGE@offset=BYTES[,size=BYTES] a filesystem \
                  at a byte offset (a multiple of 512), as in a SIF container. A file literally \
                  named disk.img@2 wins. `uext4 info disk.img` lists a disk's partitions. \
                  An NBD export is named by its URI: nbd://host[:port]/export or \
                  nbd+unix:///export?socket=PATH; in URI:PATH the URI ends at the first ':' \
                  after its host and port (nbd://localhost/disk:/etc/hosts).",
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// An fscrypt master key for the image tools: a raw key file (16 to 64 bytes, as fscrypt
    /// and e4crypt take them). Repeatable. Without the key an encrypted directory lists the
    /// kernel's no-key names and its files' contents are refused (ENOKEY). For a mount, give
    /// `-o key=FILE`.
    #[arg(long = "key", value_name = "FILE", global = true)]
    keys: Vec<std::path::PathBuf>,
    /// For the image tools: once the image is open, contain the process as a mount's server
    /// is (no capabilities, no_new_privs, a seccomp allowlist, and landlock: only the image,
    /// /proc and the host paths named on the command line stay open). See docs/SECURITY.md.
    #[arg(long, global = true)]
    sandbox: bool,
}

// One value, parsed once per run: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Mount an image or block device through FUSE.
    Mount(mount::MountArgs),
    /// Unmount a uext4 mount and wait until its server has written the image back.
    Umount {
        mountpoint: std::path::PathBuf,
        /// Seconds to wait for the server before giving up (it goes on in the background).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Print a mounted filesystem's engine counters as JSON.
    Stats { mountpoint: std::path::PathBuf },
    /// Run the reference workloads side by side against the kernel, fuse2fs and uext4 (the
    /// `uext4-bench` program, installed beside uext4; `uext4 bench --help` lists its options).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    #[command(flatten)]
    Tool(tools::ToolCmd),
    /// The privileged helper of a contained mount server (sandbox.rs): unmounts its mounts
    /// when the server asks.
    #[command(name = "__unmounter", hide = true)]
    Unmounter {
        mountpoint: std::path::PathBuf,
        dev: Option<String>,
    },
}

/// The command line as `uext4 mount` reads it, for the forms in which other programs start a
/// FUSE filesystem:
/// - called as `mount.uext4` or `mount.fuse.uext4` (mount(8)'s helper for `-t fuse.uext4`
///   and fstab lines): `IMAGE MOUNTPOINT [-sfnv] [-o OPTIONS]`;
/// - called as `fuse2fs` (a drop-in): `[-f] [-o OPTIONS] IMAGE MOUNTPOINT`;
/// - `uext4 IMAGE MOUNTPOINT -o OPTIONS`, as mount.fuse3 runs the program named by the type
///   `fuse.uext4`.
///
/// mount(8)'s -s (sloppy), -n (no mtab) and -v (verbose) change nothing here.
fn mount_argv(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(argv0) = args.first() else {
        return args;
    };
    let base = std::path::Path::new(argv0)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    let helper = base.starts_with("mount.") || base == "fuse2fs";
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let subcommands = Cli::command()
        .get_subcommands()
        .flat_map(|c| {
            std::iter::once(c.get_name().to_string())
                .chain(c.get_all_aliases().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    // mount.fuse3's form: the first argument is an existing image, not a subcommand.
    let fuse_form = args.len() >= 3
        && first.as_deref().is_some_and(|f| {
            !f.starts_with('-')
                && !subcommands.iter().any(|s| s == f)
                && std::path::Path::new(f).exists()
        });
    if !helper && !fuse_form {
        return args;
    }
    let mut out: Vec<std::ffi::OsString> = vec!["uext4".into(), "mount".into()];
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-s" | "-n" | "-v" | "-sn" | "-ns") => {}
            // fuse2fs's -d (debug) would keep it in the foreground.
            Some("-d") => out.push("-f".into()),
            Some("-o") => {
                out.push(a);
                if let Some(v) = it.next() {
                    out.push(v);
                }
            }
            _ => out.push(a),
        }
    }
    out
}

/// `uext4 bench ARGS`: runs `uext4-bench ARGS` in this process's place, found beside this
/// executable or else on PATH; the harness is a program of its own so that this one does not
/// carry it.
fn run_bench(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("uext4-bench"))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("uext4-bench"))
                .find(|p| p.is_file())
        })
    };
    let Some(exe) = beside.or_else(on_path) else {
        anyhow::bail!(
            "uext4-bench is not installed beside uext4 or on PATH \
             (cargo build --release -p uext4-bench, or scripts/install.sh)"
        );
    };
    let err = std::process::Command::new(&exe).args(args).exec();
    Err(anyhow::Error::new(err).context(exe.display().to_string()))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(mount_argv(std::env::args_os().collect())) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // Usage errors: one line (clap's first), exit status 2.
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut msg = lines
                .next()
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ")
                .to_string();
            // "the following required arguments were not provided:" names them below.
            if msg.ends_with(':') {
                let names: Vec<&str> = lines.take_while(|l| !l.starts_with("Usage:")).collect();
                msg = format!("{} {}", msg, names.join(" "));
            }
            eprintln!("uext4: {msg} (see uext4 --help)");
            return ExitCode::from(2);
        }
    };
    log::init(match cli.cmd {
        Cmd::Tool(_) => tracing_subscriber::filter::LevelFilter::OFF,
        _ => tracing_subscriber::filter::LevelFilter::WARN,
    });
    let (name, result) = match cli.cmd {
        Cmd::Mount(a) => ("mount", mount::run_mount(a)),
        Cmd::Umount {
            mountpoint,
            timeout,
        } => (
            "umount",
            mount::run_umount(&mountpoint, std::time::Duration::from_secs(timeout)),
        ),
        Cmd::Stats { mountpoint } => ("stats", mount::run_stats(&mountpoint)),
        Cmd::Bench { args } => ("bench", run_bench(&args)),
        Cmd::Unmounter { mountpoint, dev } => (
            "unmount helper",
            sandbox::run_unmounter(|| mount::unmount_all(dev.as_deref(), &mountpoint)),
        ),
        Cmd::Tool(t) => {
            if cli.sandbox {
                sandbox::request_for_tools(&std::env::args_os().collect::<Vec<_>>());
            }
            if let Err(e) = image::set_keys(&cli.keys) {
                eprintln!("uext4: {}: {e:#}", t.name());
                return ExitCode::from(1);
            }
            // The image tools end quietly when their reader goes away (`uext4 cat ... | head`),
            // as other Unix tools do, instead of failing on EPIPE.
            // SAFETY: restoring a default disposition before any thread starts.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            (t.name(), tools::run(t))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uext4: {name}: {e:#}");
            if std::env::var_os(log::BACKGROUND_ENV).is_some() {
                // A background server's stderr is read only until the mount is ready.
                tracing::error!("{name}: {e:#}");
            }
            ExitCode::from(1)
        }
    }
}
