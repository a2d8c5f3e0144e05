//! `uext4`: mount an ext4 image through FUSE, work on images without mounting, make new ones,
//! and benchmark against the kernel's ext4 and fuse2fs.

use uext4_cli::{image, log, mount, sandbox, serve, tools, usage_status, MOUNT_HELPER};

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// `0.1.0 (abc1234 2025-01-31)`: the package version, and the commit and its date (build.rs;
/// "unknown" for a build outside git).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("UEXT4_COMMIT"),
    " ",
    env!("UEXT4_COMMIT_DATE"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "uext4",
    version = VERSION,
    about = "Userspace ext4: mount, inspect and modify ext4 images",
    after_help = "A path inside an image is IMAGE:PATH (disk.img:/etc/hosts). IMAGE@N names \
                  partition N of a whole-disk image (GPT or MBR, numbered as fdisk and lsblk \
                  do): disk.img@2:/etc/hosts; IMAGE@offset=BYTES[,size=BYTES] a filesystem \
                  at a byte offset (a multiple of 512), as in a SIF container. A file literally \
                  named disk.img@2 wins. `uext4 info disk.img` lists a disk's partitions. \
                  An NBD export is named by its URI: nbd://host[:port]/export or \
                  nbd+unix:///export?socket=PATH; in URI:PATH the URI ends at the first ':' \
                  after its host and port (nbd://localhost/disk:/etc/hosts). Exit status: 0 \
                  done, 1 failed, 2 a usage mistake (mount(8)'s helper mount.uext4: 32 failed, \
                  1 a usage mistake)."
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
    /// For the image tools: no progress bar and no notes (a journal replayed in memory);
    /// errors and warnings are still said.
    #[arg(short = 'q', long, alias = "no-progress", global = true)]
    quiet: bool,
}

// One value, parsed once per run: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Mount an image or block device through FUSE.
    Mount(mount::MountArgs),
    /// Serve an image to a virtual machine as a vhost-user-fs (virtio-fs) back end, until the
    /// machine's monitor disconnects.
    Serve(serve::ServeArgs),
    /// Unmount a uext4 mount and wait until its server has written the image back.
    Umount {
        /// The directory the image is mounted on.
        mountpoint: std::path::PathBuf,
        /// Seconds to wait for the server before giving up (it goes on in the background).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Print a mounted filesystem's engine counters as JSON.
    Stats {
        /// The directory a uext4 mount is on.
        mountpoint: std::path::PathBuf,
    },
    /// Run the reference workloads side by side against the kernel, fuse2fs and uext4 (the
    /// `uext4-bench` program, installed beside uext4; `uext4 bench --help` lists its options).
    #[command(disable_help_flag = true)]
    Bench {
        /// The arguments of uext4-bench (`--quick`, `--systems`, `--workload`, ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the shell completions for bash, zsh or fish (`uext4 completions bash >
    /// /usr/share/bash-completion/completions/uext4`; scripts/install.sh installs them).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (uext4.1, and uext4-CMD.1 for each command) into DIR
    /// (scripts/install.sh installs them).
    Manpages {
        /// The directory to write them into (made if missing).
        dir: std::path::PathBuf,
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

/// `uext4 bench ARGS`: runs `uext4-bench ARGS` in this process's place, the one installed
/// beside this executable (never another build's found on PATH); the harness is a program of
/// its own so that this one does not carry it.
fn run_bench(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe()?;
    let exe = me.with_file_name("uext4-bench");
    if !exe.is_file() {
        anyhow::bail!(
            "uext4-bench is not installed beside {} (build it with cargo build --release -p \
             uext4-bench, or cargo install --path crates/uext4-bench, or install both with \
             scripts/install.sh)",
            me.display()
        );
    }
    let err = std::process::Command::new(&exe).args(args).exec();
    Err(anyhow::Error::new(err).context(exe.display().to_string()))
}

/// The exit status of a failure: 1 (32 from mount(8)'s helper, mount(8)'s "mount failure").
fn failure_status() -> u8 {
    if MOUNT_HELPER.load(std::sync::atomic::Ordering::Relaxed) {
        32
    } else {
        1
    }
}

/// A usage error from clap in one line: clap's message, its suggestion ("did you mean") if it
/// has one, and where the help is: `uext4: unrecognized subcommand 'mout' (did you mean
/// 'mount'? see uext4 --help)`, `uext4: ... (see uext4 mkfs --help)`.
fn usage_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut msg = lines
        .next()
        .unwrap_or("invalid usage")
        .trim_start_matches("error: ")
        .to_string();
    // "the following required arguments were not provided:" names them below.
    if msg.ends_with(':') {
        let names: Vec<&str> = lines
            .clone()
            .take_while(|l| !l.starts_with("Usage:"))
            .collect();
        msg = format!("{} {}", msg, names.join(" "));
    }
    // The command whose usage clap shows: the words of its usage line before the first
    // option or argument ("Usage: uext4 fscrypt set [OPTIONS] ..." is `uext4 fscrypt set`).
    let command = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|u| {
            u.split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']) && w.chars().all(|c| c != '.'))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| c.starts_with("uext4"))
        .unwrap_or_else(|| "uext4".to_string());
    let suggested: Vec<String> = e
        .context()
        .filter(|(k, _)| {
            matches!(
                k,
                ContextKind::SuggestedSubcommand | ContextKind::SuggestedArg
            )
        })
        .flat_map(|(_, v)| match v {
            ContextValue::String(s) => vec![s.clone()],
            ContextValue::Strings(v) => v.clone(),
            _ => Vec::new(),
        })
        .map(|s| format!("'{s}'"))
        .collect();
    if suggested.is_empty() {
        format!("{msg} (see {command} --help)")
    } else {
        format!(
            "{msg} (did you mean {}? see {command} --help)",
            suggested.join(" or ")
        )
    }
}

/// `uext4 manpages DIR`: uext4.1 and a page for each command (uext4-mount.1,
/// uext4-fscrypt-set.1, ...), made from the command definitions.
fn write_manpages(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    fn pages(cmd: &clap::Command, name: &str, dir: &std::path::Path) -> anyhow::Result<()> {
        // clap names are 'static (without its `string` feature); a few dozen, once per run.
        let name: &'static str = Box::leak(name.to_string().into_boxed_str());
        let page = cmd.clone().name(name).display_name(name);
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        let file = dir.join(format!("{name}.1"));
        std::fs::write(&file, out).with_context(|| file.display().to_string())?;
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            if sub.get_name() != "help" {
                pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
            }
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut cmd = Cli::command();
    cmd.build();
    pages(&cmd, "uext4", dir)
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let helper = args.first().is_some_and(|a| {
        std::path::Path::new(a)
            .file_name()
            .is_some_and(|b| b.to_string_lossy().starts_with("mount."))
    });
    MOUNT_HELPER.store(helper, std::sync::atomic::Ordering::Relaxed);
    let cli = match Cli::try_parse_from(mount_argv(args)) {
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
            // Usage errors: one line, exit status 2.
            eprintln!("uext4: {}", usage_line(&e));
            return ExitCode::from(usage_status() as u8);
        }
    };
    match &cli.cmd {
        Cmd::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "uext4", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Cmd::Manpages { dir } => {
            if let Err(e) = write_manpages(dir) {
                eprintln!("uext4: manpages: {}", image::plain(&e));
                return ExitCode::from(1);
            }
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    log::init(match cli.cmd {
        Cmd::Tool(_) => tracing_subscriber::filter::LevelFilter::OFF,
        _ => tracing_subscriber::filter::LevelFilter::WARN,
    });
    let (name, result) = match cli.cmd {
        Cmd::Mount(a) => ("mount", mount::run_mount(a)),
        Cmd::Serve(a) => ("serve", serve::run_serve(a)),
        Cmd::Umount {
            mountpoint,
            timeout,
        } => (
            "umount",
            mount::run_umount(&mountpoint, std::time::Duration::from_secs(timeout)),
        ),
        Cmd::Stats { mountpoint } => ("stats", mount::run_stats(&mountpoint)),
        Cmd::Bench { args } => ("bench", run_bench(&args)),
        Cmd::Completions { .. } | Cmd::Manpages { .. } => unreachable!("handled above"),
        Cmd::Unmounter { mountpoint, dev } => (
            "unmount helper",
            sandbox::run_unmounter(|| mount::unmount_all(dev.as_deref(), &mountpoint)),
        ),
        Cmd::Tool(t) => {
            if cli.sandbox {
                sandbox::request_for_tools(&std::env::args_os().collect::<Vec<_>>());
            }
            image::set_quiet(cli.quiet);
            if let Err(e) = image::set_keys(&cli.keys) {
                eprintln!("uext4: {}: {}", t.name(), image::plain(&e));
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
            let msg = image::plain(&e);
            eprintln!("uext4: {name}: {msg}");
            if std::env::var_os(log::BACKGROUND_ENV).is_some() {
                // A background server's stderr is read only until the mount is ready.
                tracing::error!("{name}: {msg}");
            }
            if image::is_usage(&e) {
                return ExitCode::from(usage_status() as u8);
            }
            ExitCode::from(failure_status())
        }
    }
}
