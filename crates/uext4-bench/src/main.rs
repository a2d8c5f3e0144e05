//! `uext4-bench` (run as `uext4 bench`): the reference workloads (built-in fio jobs in workloads/, one per seed document)
//! run side by side, in one run, against the kernel's ext4 on a loop device, fuse2fs, uext4
//! through FUSE (default, writeback_cache, dax), uext4 in-process, the raw storage, and a FUSE
//! server that does nothing (the transport's ceiling). Results go to JSON and a Markdown report
//! with ratios and ASCII charts of the job sweep. The metadata family (meta.rs: untar, stat-walk,
//! read-all, cp-a, pkg-install, rm-rf) runs on the same systems and on an in-memory FUSE server
//! (memfs.rs, the transport's ceiling for metadata) and is reported in seconds.

mod chart;
mod features;
mod guest;
mod loadgen;
mod measure;
mod memfs;
mod meta;
mod null;
mod report;
mod tools;
mod virtio_fs;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tools::MetaInput;

/// `uext4 bench` runs this binary with its own arguments; it is a program of its own so that
/// the user binary carries neither the harness nor its chart drawing.
#[derive(Parser)]
#[command(
    name = "uext4 bench",
    bin_name = "uext4 bench",
    version,
    about = "Run the reference workloads side by side against the kernel, fuse2fs and uext4"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // Usage errors: one line, exit status 2, as the other uext4 commands.
            let text = e.render().to_string();
            let first = text.lines().map(str::trim).find(|l| !l.is_empty());
            let msg = first
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ");
            eprintln!("uext4: bench: {msg} (see uext4 bench --help)");
            return std::process::ExitCode::from(2);
        }
    };
    match run(cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uext4: bench: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Workloads to run, repeated or comma-separated (default: all of --family): the data
    /// family's fio jobs overwrite-4k, mixed-randrw-4k, fsync-randwrite-16k, pwrite-1g; the
    /// metadata family's untar, stat-walk, read-all, cp-a, pkg-install, rm-rf (run in that
    /// order on one fresh image per system, each timed apart; those before the last one asked
    /// for run too, since each starts from what the ones before it left, but only those asked
    /// for are reported).
    #[arg(long = "workload", value_delimiter = ',')]
    workloads: Vec<String>,
    /// Which family runs when no --workload is given: data (the fio jobs), metadata (a source
    /// tree unpacked, walked, read, copied, updated as a package manager does, and removed, on
    /// kernel, fuse2fs, uext4-fuse, uext4-fuse-wbc, uext4-lib, raw and fuse-mem), features
    /// (in-process: lookups in a 100,000-entry casefolded directory against a plain one,
    /// --repeat rounds, at least 3), virtio-fs (in a guest booted by scripts/kernel-vm.sh: the
    /// metadata family and data workloads over `uext4 serve --vhost-user-fs` against the
    /// guest's own ext4 on virtio-blk; skipped, with a line saying why, where no guest can
    /// boot), or all (data and metadata).
    #[arg(long, default_value = "all")]
    family: String,
    /// The metadata family's tree: a folder or an uncompressed tarball, read into memory first
    /// (default: a source tree generated from a fixed seed, about 10,000 entries; 1,000 with
    /// --quick).
    #[arg(long)]
    tree: Option<PathBuf>,
    /// Count the FUSE requests of every metadata workload on the FUSE systems, by opcode, with
    /// perf on the fuse:fuse_request_send tracepoint (needs root and perf): one extra, untimed
    /// run per FUSE system; the report adds requests per entry.
    #[arg(long)]
    count_requests: bool,
    /// Systems, comma-separated (default: all available): kernel, kernel-dioread_lock, fuse2fs,
    /// uext4-fuse, uext4-fuse-wbc, uext4-fuse-dax, uext4-fuse-nodax, uext4-fuse-unwritten,
    /// uext4-lib, uext4-lib-nodax, uext4-lib-dax, uext4-lib-dax-nt, uext4-lib-buffered, raw,
    /// fuse-null, memcpy, fuse-mem ("nodax": pread/pwrite even on tmpfs; "unwritten": `-o
    /// prealloc=unwritten`, fallocate makes unwritten extents as the kernel's; "dax-nt":
    /// non-temporal stores; "buffered": delayed allocation; memcpy: pwrite-1g only; fuse-mem,
    /// an in-memory FUSE server: the metadata family only, which runs on raw, fuse-mem, kernel,
    /// fuse2fs, uext4-fuse, uext4-fuse-wbc and uext4-lib); only when named: uext4-fuse-dev,
    /// uext4-fuse-uring (one transport each) and uext4-fuse-noopen (`-o noatime,noopen`).
    #[arg(long)]
    systems: Option<String>,
    /// Job counts to sweep (default: 1,2,4,8,16; the fsync workload also 64,256).
    #[arg(long)]
    jobs: Option<String>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    runtime: u64,
    /// Where images and mounts go (default: /dev/shm/uext4-bench, or a disk folder with --backing disk).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Journal size for every image, MiB (default: mke2fs's). The fsync workload also runs
    /// with a 4 MiB journal, in the same run.
    #[arg(long)]
    journal_size: Option<u32>,
    /// Every system and workload, briefly (a few minutes; the metadata family on a tree of
    /// about 1,000 entries): checks that all produce numbers.
    #[arg(long)]
    quick: bool,
    /// Lay overwrite-4k's files out as fio's create_only does by itself: fallocated, so the
    /// timed "overwrites" are mostly unwritten-to-written conversions on the kernel (and on
    /// uext4 off tmpfs or with prealloc=unwritten; on tmpfs its fallocate maps zeroed blocks
    /// written). The default writes the files' data first, so overwrites overwrite.
    #[arg(long)]
    fallocated_layout: bool,
    /// Measure every point this many times. The runs of one point (workload, job count) are
    /// interleaved across the systems and the fsync workload's two journals, each round in a
    /// rotated order, and the table shows each median run; every run's IOPS is kept in
    /// results.json (`runs`).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// shm (default) or disk.
    #[arg(long, default_value = "shm")]
    backing: String,
    /// A folder of fio job files (WORKLOAD.fio) to run instead of the built-in ones
    /// (crates/uext4-bench/src/workloads, compiled into the binary).
    #[arg(long)]
    workloads_dir: Option<PathBuf>,
    /// virtio-fs family: the metadata tree's entries, generated in the guest (500 with --quick).
    #[arg(long, default_value_t = 2000)]
    guest_entries: usize,
    /// virtio-fs family: MiB written and read back by the data workloads (16 with --quick).
    #[arg(long, default_value_t = 128)]
    guest_mib: usize,
    /// virtio-fs family: `-o` options for `uext4 serve` (threads=N: request queues offered).
    #[arg(long)]
    serve_options: Option<String>,
    /// Internal, in the guest: run the virtio-fs family's workloads on DIR, printed as LABEL.
    #[arg(long, hide = true, value_name = "LABEL=DIR")]
    vm_guest: Vec<String>,
    /// Internal: serve the do-nothing FUSE filesystem at this mount point (used by fuse-null).
    #[arg(long, hide = true)]
    serve_null: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 2)]
    null_threads: usize,
    /// Internal: serve the in-memory FUSE filesystem at this mount point (used by fuse-mem).
    #[arg(long, hide = true)]
    serve_mem: Option<PathBuf>,
}

#[derive(Serialize, Clone, Debug, Default)]
pub struct Record {
    pub system: String,
    pub workload: String,
    pub jobs: usize,
    pub iops: f64,
    pub bw_mib_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub fsck: String,
    pub stats: Option<serde_json::Value>,
    pub note: String,
    /// The journal asked for: "default" (mke2fs's, or --journal-size) or "4 MiB".
    pub journal: String,
    /// The image's journal size as dumpe2fs reports it (none for raw and fuse-null).
    pub journal_mib: Option<u32>,
    /// Every run's IOPS for this point, in the order measured (one unless --repeat); for the
    /// metadata family every run's seconds.
    pub runs: Vec<f64>,
    /// Metadata family: the workload's seconds (`iops` is then entries per second).
    pub seconds: Option<f64>,
    /// Metadata family: the entries the workload went through (files for pkg-install).
    pub entries: Option<u64>,
    /// Metadata family with --count-requests: the FUSE requests it sent, by opcode, and "total".
    pub requests: Option<std::collections::BTreeMap<String, u64>>,
}

const WORKLOADS: &[&str] = &[
    "overwrite-4k",
    "mixed-randrw-4k",
    "fsync-randwrite-16k",
    "pwrite-1g",
];
/// uext4 through FUSE by one transport: /dev/fuse, or FUSE over io_uring.
const TRANSPORTS: &[&str] = &["uext4-fuse-dev", "uext4-fuse-uring"];
const SYSTEMS: &[&str] = &[
    "raw",
    "fuse-null",
    "kernel",
    "kernel-dioread_lock",
    "fuse2fs",
    "uext4-fuse",
    "uext4-fuse-wbc",
    "uext4-fuse-dax",
    "uext4-fuse-nodax",
    "uext4-fuse-unwritten",
    "uext4-fuse-dev",
    "uext4-fuse-uring",
    "uext4-fuse-noopen",
    "uext4-lib",
    "uext4-lib-nodax",
    "uext4-lib-dax",
    "uext4-lib-dax-nt",
    "uext4-lib-buffered",
    "memcpy",
    "fuse-mem",
];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd} >/dev/null"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// "default" for the journal every image gets (mke2fs's or --journal-size), else its size.
fn journal_label(j: Option<u32>, default: Option<u32>) -> String {
    match j {
        _ if j == default => "default".into(),
        Some(m) => format!("{m} MiB"),
        None => "default".into(),
    }
}

/// Errors are one line in the report and on the terminal.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn sh(cmd: &str) -> Result<String> {
    let o = Command::new("sh").arg("-c").arg(cmd).output()?;
    if !o.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(m) = &a.serve_null {
        return null::serve(m, a.null_threads);
    }
    if let Some(m) = &a.serve_mem {
        return memfs::serve(m, a.null_threads);
    }
    if a.repeat == 0 {
        bail!("--repeat takes a count of 1 or more");
    }
    if !a.vm_guest.is_empty() || a.family == "virtio-fs" {
        return virtio_fs::from_args(&a);
    }
    if a.family == "features" {
        // In-process, no systems to set up: casefold and encryption against plain.
        let dir = a
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/shm/uext4-bench"));
        let entries = if a.quick { 20_000 } else { 100_000 };
        return features::run(
            &dir,
            &a.out,
            entries,
            a.repeat.max(if a.quick { 1 } else { 3 }),
        );
    }
    // SAFETY: a plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let wdir = match &a.workloads_dir {
        Some(d) => Some(
            std::fs::canonicalize(d)
                .with_context(|| format!("workloads folder {}", d.display()))?,
        ),
        None => None,
    };
    let (workloads, meta_workloads) = select_workloads(&a)?;
    // The tree first: a bad --tree stops the run before anything is set up.
    let tree = if meta_workloads.is_empty() {
        None
    } else {
        Some(match &a.tree {
            Some(p) => meta::load(p)?,
            None => meta::generate(if a.quick { 1_000 } else { 10_000 }, 0x5eed_0024),
        })
    };
    let (systems, skipped) = select_systems(&a, root, &workloads)?;
    let (jobs, fsync_jobs) = job_counts(&a)?;
    let runtime = if a.quick { 1 } else { a.runtime };
    let base = a.dir.clone().unwrap_or_else(|| {
        if a.backing == "disk" {
            std::env::temp_dir().join("uext4-bench")
        } else {
            PathBuf::from("/dev/shm/uext4-bench")
        }
    });
    let base_existed = base.exists();
    std::fs::create_dir_all(&base)?;
    std::fs::create_dir_all(&a.out)?;
    // The metadata family's images: room for the tree twice (cp-a) and the updates.
    let meta_mib = tree
        .as_ref()
        .map(|t| (t.data_bytes() * 3 / (1 << 20) + 512).max(1024))
        .unwrap_or(1024);
    let ctx = Ctx {
        base,
        exe: uext4_exe()?,
        bench_exe: std::env::current_exe()?,
        wdir,
        runtime,
        quick: a.quick,
        journal_mib: a.journal_size,
        written_layout: !a.fallocated_layout,
        meta_mib,
    };
    let plan = data_plan(&a, &workloads, &systems, &jobs, &fsync_jobs);
    let (meta_plan, count_note) = meta_plan(&a, root, &meta_workloads, &systems);
    let pb = indicatif::ProgressBar::new((plan.len() + meta_plan.len()) as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut meta_out = MetaOutcome::default();
    let tools_inputs = match &tree {
        Some(tree)
            if meta_workloads
                .iter()
                .any(|w| tools::WORKLOADS.contains(&w.as_str())) =>
        {
            if let Some(m) = tools::missing() {
                bail!("{m}");
            }
            say(
                &pb,
                "tools family: making the repository and the wheels".into(),
            );
            Some(tools::Inputs::make(&ctx.base, tree, a.quick)?)
        }
        _ => None,
    };
    let input = match (&tree, &tools_inputs) {
        (_, Some(t)) => Some(MetaInput::Tools(t)),
        (Some(t), None) => Some(MetaInput::Tree(t)),
        _ => None,
    };
    if let Some(input) = input {
        say(
            &pb,
            format!("metadata-shaped family on {}", input.describe()),
        );
        meta_out = run_meta(&ctx, &pb, input, &meta_workloads, &meta_plan);
    }
    let mut records = meta_out.records;
    records.extend(run_data(&ctx, &pb, &plan, a.journal_size));
    pb.finish_and_clear();
    let mut records = medians(records);
    for r in records.iter_mut() {
        if let Some(c) = meta_out
            .counted
            .iter()
            .find(|c| c.system == r.system && c.workload == r.workload)
        {
            r.requests = c.requests.clone();
        }
    }
    clean_up(&ctx.base, base_existed);
    write_outputs(&a, &records, &workloads, &skipped, input, count_note)?;
    if !meta_out.errors.is_empty() {
        bail!("metadata family: {}", meta_out.errors.join("; "));
    }
    if a.quick {
        let missing: Vec<String> = records
            .iter()
            .filter(|r| r.iops <= 0.0)
            .map(|r| format!("{} {} {}: {}", r.system, r.workload, r.jobs, r.note))
            .collect();
        if !missing.is_empty() {
            bail!("no numbers for: {}", missing.join("; "));
        }
    }
    Ok(())
}

/// A line above the progress bar (or on stderr when there is none).
fn say(pb: &indicatif::ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// The `uext4` binary the FUSE systems mount with: beside this one, else on PATH.
fn uext4_exe() -> Result<PathBuf> {
    let beside = std::env::current_exe()?.with_file_name("uext4");
    if beside.exists() {
        return Ok(beside);
    }
    Ok(PathBuf::from("uext4"))
}

/// The workloads asked for (by --workload, or --family): (the data family's, the metadata
/// family's).
fn select_workloads(a: &BenchArgs) -> Result<(Vec<String>, Vec<String>)> {
    let all_workloads: Vec<&str> = WORKLOADS
        .iter()
        .chain(meta::WORKLOADS)
        .chain(tools::WORKLOADS)
        .copied()
        .collect();
    let requested: Vec<String> = if a.workloads.is_empty() {
        let fams: &[&[&str]] = match a.family.as_str() {
            "data" => &[WORKLOADS],
            "metadata" => &[meta::WORKLOADS],
            "tools" => &[tools::WORKLOADS],
            "all" => &[WORKLOADS, meta::WORKLOADS],
            f => bail!(
                "unknown family {f:?} (known: data, metadata, tools, features, virtio-fs, all)"
            ),
        };
        fams.iter()
            .flat_map(|f| f.iter())
            .map(|s| s.to_string())
            .collect()
    } else {
        a.workloads
            .iter()
            .map(|w| w.trim().to_string())
            .filter(|w| !w.is_empty())
            .collect()
    };
    for w in &requested {
        if !all_workloads.contains(&w.as_str()) {
            bail!(
                "unknown workload {w:?} (known: {})",
                all_workloads.join(", ")
            );
        }
    }
    let workloads: Vec<String> = requested
        .iter()
        .filter(|w| WORKLOADS.contains(&w.as_str()))
        .cloned()
        .collect();
    let meta_workloads: Vec<String> = requested
        .iter()
        .filter(|w| meta::WORKLOADS.contains(&w.as_str()) || tools::WORKLOADS.contains(&w.as_str()))
        .cloned()
        .collect();
    // Both run on one image per system, each family from the start: one of them at a time.
    if meta_workloads
        .iter()
        .any(|w| tools::WORKLOADS.contains(&w.as_str()))
        && meta_workloads
            .iter()
            .any(|w| meta::WORKLOADS.contains(&w.as_str()))
    {
        bail!("the metadata and tools families run one at a time (two runs of uext4 bench)");
    }
    Ok((workloads, meta_workloads))
}

/// The systems asked for that this machine can run, and a note for each one it cannot.
fn select_systems(
    a: &BenchArgs,
    root: bool,
    workloads: &[String],
) -> Result<(Vec<String>, Vec<String>)> {
    let mut systems: Vec<String> = match &a.systems {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect(),
        // The two transports side by side only when asked for: otherwise uext4-fuse is one
        // of them (io_uring when the kernel offers it). `-o noopen` too only when asked for.
        None => SYSTEMS
            .iter()
            .filter(|s| !TRANSPORTS.contains(s) && **s != "uext4-fuse-noopen")
            .map(|s| s.to_string())
            .collect(),
    };
    for s in &systems {
        if !SYSTEMS.contains(&s.as_str()) {
            bail!("unknown system {s:?} (known: {})", SYSTEMS.join(", "));
        }
    }
    let mut skipped = Vec::new();
    systems.retain(|s| {
        let why = match s.as_str() {
            "kernel" | "kernel-dioread_lock" if !root => Some("needs root and loop devices"),
            "fuse2fs" if !have("fuse2fs") => Some("fuse2fs is not installed"),
            "uext4-fuse-uring"
                if !root || !Path::new("/sys/module/fuse/parameters/enable_uring").exists() =>
            {
                Some("needs root and a kernel with FUSE over io_uring (the fuse module's enable_uring, Linux 6.14+)")
            }
            "fuse-null"
            | "fuse-mem"
            | "uext4-fuse"
            | "uext4-fuse-wbc"
            | "uext4-fuse-dax"
            | "uext4-fuse-nodax"
            | "uext4-fuse-unwritten"
            | "uext4-fuse-dev"
            | "uext4-fuse-uring"
            | "uext4-fuse-noopen"
            | "fuse2fs"
                if !Path::new("/dev/fuse").exists() =>
            {
                Some("no /dev/fuse")
            }
            _ => None,
        };
        if let Some(w) = why {
            skipped.push(format!("{s}: {w}"));
        }
        why.is_none()
    });
    let data_family = workloads.iter().any(|w| WORKLOADS.contains(&w.as_str()));
    let only_in_process = systems
        .iter()
        .all(|s| s.starts_with("uext4-lib") || s == "memcpy");
    if data_family && !only_in_process && !have("fio") {
        bail!("fio is not installed (apt-get install fio): every system but the in-process ones (uext4-lib*) needs it");
    }
    Ok((systems, skipped))
}

/// The job counts to sweep: (every data workload's, the fsync workload's).
fn job_counts(a: &BenchArgs) -> Result<(Vec<usize>, Vec<usize>)> {
    let parse_jobs = |s: &str| -> Result<Vec<usize>> {
        s.split(',')
            .map(|j| j.trim().parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| anyhow!("--jobs takes numbers like 1,2,4"))
    };
    let (jobs, fsync_jobs): (Vec<usize>, Vec<usize>) = if a.quick {
        (vec![2], vec![2])
    } else if let Some(j) = &a.jobs {
        let j = parse_jobs(j)?;
        (j.clone(), j)
    } else {
        (vec![1, 2, 4, 8, 16], vec![1, 2, 4, 8, 16, 64, 256])
    };
    Ok((jobs, fsync_jobs))
}

/// The data family's plan: every (workload, journal variant, job count, system), interleaved
/// (see `interleave`).
fn data_plan(
    a: &BenchArgs,
    workloads: &[String],
    systems: &[String],
    jobs: &[usize],
    fsync_jobs: &[usize],
) -> Vec<Step> {
    // The plan: every (workload, journal variant, job count, system); `interleave` orders it
    // by point (workload, job count) so that the systems and journals of one point are
    // measured minutes apart at most; with --repeat each point's rounds follow one another,
    // rotated by one place every round.
    let mut plan: Vec<Step> = Vec::new();
    for w in workloads {
        let fsync = w == "fsync-randwrite-16k";
        let mut journals = vec![a.journal_size];
        if fsync && a.journal_size != Some(4) {
            journals.push(Some(4));
        }
        for (vi, &jn) in journals.iter().enumerate() {
            for s in systems {
                if s == "kernel-dioread_lock" && !fsync {
                    continue;
                }
                // The memory-copy ceiling is for the large sequential write only.
                if s == "memcpy" && w != "pwrite-1g" {
                    continue;
                }
                // The in-memory server is the metadata family's ceiling.
                if s == "fuse-mem" {
                    continue;
                }
                // The ceilings have no journal: measured once.
                if vi > 0 && (s == "raw" || s == "fuse-null") {
                    continue;
                }
                // --quick keeps under two minutes: the small journal only where it matters.
                if vi > 0 && a.quick && !["kernel", "uext4-fuse", "uext4-lib"].contains(&s.as_str())
                {
                    continue;
                }
                let sweep: &[usize] = if w == "pwrite-1g" {
                    &[1]
                } else if fsync {
                    fsync_jobs
                } else {
                    jobs
                };
                for &j in sweep {
                    plan.push((w.clone(), jn, s.clone(), j));
                }
            }
        }
    }
    interleave(plan, a.repeat)
}

/// The metadata family's plan: (system, counting requests) in order, and a note when requests
/// cannot be counted here.
fn meta_plan(
    a: &BenchArgs,
    root: bool,
    meta_workloads: &[String],
    systems: &[String],
) -> (Vec<(String, bool)>, Option<String>) {
    // The metadata family: one run per system and round, each a fresh image, the systems
    // rotated by one place every round; with --count-requests one more, untimed, run per FUSE
    // system counts its requests.
    let meta_systems: Vec<String> = if meta_workloads.is_empty() {
        Vec::new()
    } else {
        systems
            .iter()
            // The tools need a mount: not the in-process engine.
            .filter(|s| meta::SYSTEMS.contains(&s.as_str()))
            .filter(|s| {
                *s != "uext4-lib"
                    || !meta_workloads
                        .iter()
                        .any(|w| tools::WORKLOADS.contains(&w.as_str()))
            })
            .cloned()
            .collect()
    };
    let mut meta_plan: Vec<(String, bool)> = Vec::new();
    for round in 0..a.repeat {
        for i in 0..meta_systems.len() {
            meta_plan.push((
                meta_systems[(i + round) % meta_systems.len()].clone(),
                false,
            ));
        }
    }
    let mut count_note = None;
    if a.count_requests && !meta_systems.is_empty() {
        if !root || !meta::PerfCounter::available() {
            count_note = Some("requests not counted: needs root and perf with the fuse:fuse_request_send tracepoint".to_string());
        } else {
            for s in &meta_systems {
                if is_fuse(s) {
                    meta_plan.push((s.clone(), true));
                }
            }
        }
    }
    (meta_plan, count_note)
}

/// What the metadata family's runs gave: the timed records, the request-counting ones, and
/// the failures that fail the bench.
#[derive(Default)]
struct MetaOutcome {
    records: Vec<Record>,
    counted: Vec<Record>,
    errors: Vec<String>,
}

fn run_meta(
    ctx: &Ctx,
    pb: &indicatif::ProgressBar,
    input: MetaInput,
    meta_workloads: &[String],
    meta_plan: &[(String, bool)],
) -> MetaOutcome {
    let mut out = MetaOutcome::default();
    for (s, count) in meta_plan {
        pb.set_message(format!(
            "metadata family on {s}{}",
            if *count { " (counting requests)" } else { "" }
        ));
        let rs = ctx
            .measure_meta(s, input, meta_workloads, *count)
            .unwrap_or_else(|e| {
                let note = one_line(&format!("error: {e:#}"));
                meta_workloads
                    .iter()
                    .map(|w| Record {
                        system: s.clone(),
                        workload: w.clone(),
                        jobs: 1,
                        fsck: "-".into(),
                        note: note.clone(),
                        journal: "default".into(),
                        ..Default::default()
                    })
                    .collect()
            });
        for r in &rs {
            let line = format!(
                "{:>20} {:>20}{}: {:>8.3} s {:>7} entries  fsck {}{}",
                s,
                r.workload,
                if *count { " (counting)" } else { "" },
                r.seconds.unwrap_or(0.0),
                r.entries.unwrap_or(0),
                r.fsck,
                if r.note.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", r.note)
                }
            );
            say(pb, line);
            // A failed run or an e2fsck complaint fails the bench (after the report); a
            // warning (a syncfs error) is reported with the numbers.
            // fuse2fs's images are not ours: its e2fsck complaints are reported, not fatal.
            if r.note.starts_with("error")
                || (r.fsck != "clean" && r.fsck != "-" && r.system != "fuse2fs")
            {
                let e = format!("{} {}: {} {}", r.system, r.workload, r.fsck, r.note);
                if !out.errors.contains(&e) {
                    out.errors.push(e);
                }
            }
        }
        if *count {
            out.counted.extend(rs);
        } else {
            out.records.extend(rs);
        }
        pb.inc(1);
    }
    out
}

fn run_data(
    ctx: &Ctx,
    pb: &indicatif::ProgressBar,
    plan: &[Step],
    journal_size: Option<u32>,
) -> Vec<Record> {
    let mut records = Vec::new();
    for (w, jn, s, j) in plan {
        let (w, jn, s, j) = (w.as_str(), *jn, s.as_str(), *j);
        let label = journal_label(jn, journal_size);
        pb.set_message(format!("{w} on {s}, {j} jobs, journal {label}"));
        let r = ctx.measure(s, w, j, jn).unwrap_or_else(|e| Record {
            system: s.into(),
            workload: w.into(),
            jobs: j,
            iops: 0.0,
            bw_mib_s: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            fsck: "-".into(),
            stats: None,
            note: one_line(&format!("error: {e:#}")),
            journal: label.clone(),
            journal_mib: None,
            ..Default::default()
        });
        let line = format!(
            "{:>20} {:>20} {:>3} jobs {:>8}: {:>10.0} IOPS {:>9.1} MiB/s  p99 {:>8.0} us  fsck {}{}",
            s,
            w,
            j,
            r.journal_mib
                .map(|m| format!("j{m}M"))
                .unwrap_or_else(|| "-".into()),
            r.iops,
            r.bw_mib_s,
            r.p99_us,
            r.fsck,
            if r.note.is_empty() {
                String::new()
            } else {
                format!("  ({})", r.note)
            }
        );
        say(pb, line);
        records.push(r);
        pb.inc(1);
    }
    records
}

/// The mount points are empty now (every system was unmounted after its run); a folder
/// still mounted or holding files is left as it is (remove_dir refuses both). The job
/// files written for fio go too.
fn clean_up(base: &Path, base_existed: bool) {
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("mnt-") {
                let _ = std::fs::remove_dir(e.path());
            } else if name.ends_with(".fio") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if !base_existed {
        let _ = std::fs::remove_dir(base);
    }
}

/// results.json and report.md in --out, and the report on stdout.
fn write_outputs(
    a: &BenchArgs,
    records: &[Record],
    workloads: &[String],
    skipped: &[String],
    input: Option<MetaInput>,
    count_note: Option<String>,
) -> Result<()> {
    let runtime = if a.quick { 1 } else { a.runtime };
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&records)?,
    )?;
    let data: Vec<Record> = records
        .iter()
        .filter(|r| r.seconds.is_none() && !meta::WORKLOADS.contains(&r.workload.as_str()))
        .cloned()
        .collect();
    let mut report = if workloads.is_empty() {
        let mut s = "# uext4 bench\n\n".to_string();
        if !skipped.is_empty() {
            s.push_str(&format!("Skipped: {}\n\n", skipped.join("; ")));
        }
        s
    } else {
        report::report(&data, skipped, runtime, a.repeat, &a.out)
    };
    if let Some(input) = input {
        let intro = match input {
            MetaInput::Tree(tree) => meta::intro(
                &format!("{}: {}", tree.source, tree.summary()),
                meta::pkg_count(a.quick),
            ),
            MetaInput::Tools(t) => tools::intro(t),
        };
        report.push_str(&meta::report(
            records,
            input.workloads(),
            &intro,
            a.repeat,
            count_note.as_deref(),
        ));
    }
    std::fs::write(a.out.join("report.md"), &report)?;
    println!("{report}");
    println!(
        "results: {}/results.json, {}/report.md",
        a.out.display(),
        a.out.display()
    );
    Ok(())
}

/// One measurement in the plan: workload, journal size (None: the default), system, jobs.
type Step = (String, Option<u32>, String, usize);

struct Ctx {
    base: PathBuf,
    /// The `uext4` binary (mounts, stats).
    exe: PathBuf,
    /// This binary (the do-nothing and in-memory FUSE servers).
    bench_exe: PathBuf,
    /// `--workloads-dir`; the built-in job files when `None`.
    wdir: Option<PathBuf>,
    runtime: u64,
    quick: bool,
    journal_mib: Option<u32>,
    /// overwrite-4k's files are written before timing (see `BenchArgs::fallocated_layout`).
    written_layout: bool,
    /// The metadata family's image size, MiB.
    meta_mib: u64,
}

/// The systems served through FUSE (their requests can be counted).
fn is_fuse(s: &str) -> bool {
    s == "fuse2fs" || s == "fuse-mem" || s == "fuse-null" || s.starts_with("uext4-fuse")
}

/// The journal size of an image in MiB, as dumpe2fs reports it ("Total journal size: 64M").
fn journal_size_of(img: &Path) -> Option<u32> {
    let o = Command::new("dumpe2fs").arg("-h").arg(img).output().ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let v = text
        .lines()
        .find(|l| l.starts_with("Journal size:") || l.starts_with("Total journal size:"))?
        .split(':')
        .nth(1)?
        .trim()
        .to_string();
    let (num, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u32 = num.parse().ok()?;
    Some(match unit.trim() {
        "k" | "K" => n / 1024,
        "G" => n * 1024,
        _ => n,
    })
}

/// A mounted system under test; unmounts on drop.
struct Mounted {
    dir: PathBuf,
    img: Option<PathBuf>,
    umount: bool,
    journal_mib: Option<u32>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.umount {
            let _ = Command::new("umount").arg(&self.dir).status();
            // The FUSE servers write everything back after the unmount: wait for them.
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                let busy = Command::new("sh")
                    .arg("-c")
                    .arg(format!("grep -qs ' {} ' /proc/mounts", self.dir.display()))
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                if !busy {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // A FUSE server goes on writing back after the kernel drops the mount: wait for
            // whatever process still has the image open (uext4, fuse2fs) before e2fsck runs.
            if let Some(img) = &self.img {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(60) {
                    let pat = format!("{}", img.display());
                    let busy = Command::new("pgrep")
                        .args(["-f", &pat])
                        .output()
                        .map(|o| o.status.success())
                        .unwrap_or(false);
                    if !busy {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        } else {
            // A plain folder (raw): its files would otherwise hold their memory in /dev/shm.
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Ctx {
    /// The metadata family on `system`: a fresh image (or folder, or server), every workload
    /// up to the last one asked for, in order, then e2fsck. With `count`, each workload's FUSE
    /// requests are counted (the timings of that run are not used).
    fn measure_meta(
        &self,
        system: &str,
        input: MetaInput,
        selected: &[String],
        count: bool,
    ) -> Result<Vec<Record>> {
        let (timed, fsck_result, journal_mib, stats) =
            if let (MetaInput::Tree(tree), "uext4-lib") = (input, system) {
                let img = self.base.join("uext4-lib.img");
                let journal_mib = self.mke2fs(&img, self.journal_mib, self.meta_mib)?;
                let fs = uext4::Fs::open_path(&img, uext4::MountOptions::default())
                    .map_err(|e| anyhow!("{}: {e}", img.display()))?;
                let r = meta::run_family(&meta::Lib { fs: &fs }, tree, selected, self.quick, None);
                let stats = serde_json::from_str(&fs.stats_json()).ok();
                let u = fs.unmount();
                drop(fs);
                let timed = r?;
                u.map_err(|e| anyhow!("unmount: {e}"))?;
                let f = fsck(&img);
                let _ = std::fs::remove_file(&img);
                (timed, f, journal_mib, stats)
            } else {
                let m = self.setup(system, "metadata", 1, self.journal_mib)?;
                let ops = meta::Posix::new(&m.dir);
                let mut counter = if count {
                    Some(meta::PerfCounter::new(&m.dir, &self.base)?)
                } else {
                    None
                };
                let counter = counter.as_mut().map(|c| c as &mut dyn meta::Counter);
                let r = match input {
                    MetaInput::Tree(tree) => {
                        meta::run_family(&ops, tree, selected, self.quick, counter)
                    }
                    MetaInput::Tools(t) => tools::run_family(&m.dir, t, selected, counter),
                };
                let (stats, f, journal_mib) = self.take_down(system, m);
                (r?, f, journal_mib, stats)
            };
        let n = timed.len();
        Ok(timed
            .into_iter()
            .enumerate()
            .map(|(i, t)| Record {
                system: system.into(),
                workload: t.workload.into(),
                jobs: 1,
                iops: t.entries as f64 / t.secs.max(1e-9),
                fsck: fsck_result.clone(),
                // The engine's counters after the whole family: with its last workload.
                stats: if i + 1 == n { stats.clone() } else { None },
                journal: "default".into(),
                journal_mib,
                seconds: Some(t.secs),
                entries: Some(t.entries),
                requests: t.requests,
                note: if t.note.is_empty() {
                    String::new()
                } else {
                    format!("warning: {}", t.note)
                },
                ..Default::default()
            })
            .collect())
    }
}

/// The plan in measuring order: points (workload, job count) in the order they first appear,
/// each point's (journal, system) pairs `repeat` times, rotated by one place every round so
/// that no system always runs first (or right after the same neighbour). The fsync workload's
/// two journals are pairs of one point, so their runs alternate too and the 4 MiB / 64 MiB
/// ratio is not taken minutes apart (the machine's speed drifts).
fn interleave(plan: Vec<Step>, repeat: usize) -> Vec<Step> {
    type Point = (String, usize);
    type Pairs = Vec<(Option<u32>, String)>;
    let mut points: Vec<(Point, Pairs)> = Vec::new();
    for (w, jn, s, j) in plan {
        let key = (w, j);
        match points.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pairs)) => pairs.push((jn, s)),
            None => points.push((key, vec![(jn, s)])),
        }
    }
    let mut out = Vec::new();
    for ((w, j), pairs) in points {
        for round in 0..repeat {
            for i in 0..pairs.len() {
                let (jn, s) = &pairs[(i + round) % pairs.len()];
                out.push((w.clone(), *jn, s.clone(), j));
            }
        }
    }
    out
}

/// One record per point and system: the median run by IOPS (the lower of the middle two for
/// an even count), with every run's IOPS in `runs`, the worst e2fsck result and every note.
fn medians(records: Vec<Record>) -> Vec<Record> {
    let mut groups: Vec<Vec<Record>> = Vec::new();
    for r in records {
        let same = |g: &&mut Vec<Record>| {
            let f = &g[0];
            f.system == r.system
                && f.workload == r.workload
                && f.journal == r.journal
                && f.jobs == r.jobs
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let runs: Vec<f64> = g.iter().map(|r| r.seconds.unwrap_or(r.iops)).collect();
            let fsck = g
                .iter()
                .map(|r| r.fsck.clone())
                .find(|f| f != "clean" && f != "-");
            let mut notes: Vec<String> = Vec::new();
            for r in &g {
                if !r.note.is_empty() && !notes.contains(&r.note) {
                    notes.push(r.note.clone());
                }
            }
            let mut g = g;
            g.sort_by(|a, b| a.iops.total_cmp(&b.iops));
            let mut m = g.swap_remove((g.len() - 1) / 2);
            if let Some(f) = fsck {
                m.fsck = f;
            }
            m.note = notes.join("; ");
            m.runs = runs;
            m
        })
        .collect()
}

fn wait_mounted(dir: &Path) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if is_mounted(dir) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{} did not get mounted", dir.display())
}

fn fsck(img: &Path) -> String {
    match Command::new("e2fsck").arg("-fn").arg(img).output() {
        Ok(o) if o.status.success() => "clean".into(),
        Ok(o) => format!(
            "ERRORS: {}",
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .unwrap_or("")
                .trim()
        ),
        Err(e) => format!("e2fsck: {e}"),
    }
}

fn parse_fio(out: &str) -> Result<(f64, f64, f64, f64)> {
    let start = out
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no JSON"))?;
    let v: serde_json::Value = serde_json::from_str(&out[start..]).context("parsing fio's JSON")?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio job error {}", job["error"]);
    }
    let mut iops = 0.0;
    let mut bw = 0.0;
    let mut p50: f64 = 0.0;
    let mut p99: f64 = 0.0;
    for d in ["read", "write"] {
        let x = &job[d];
        iops += x["iops"].as_f64().unwrap_or(0.0);
        bw += x["bw"].as_f64().unwrap_or(0.0) / 1024.0;
        let pct = &x["clat_ns"]["percentile"];
        p50 = p50.max(pct["50.000000"].as_f64().unwrap_or(0.0) / 1000.0);
        p99 = p99.max(pct["99.000000"].as_f64().unwrap_or(0.0) / 1000.0);
    }
    Ok((iops, bw, p50, p99))
}

/// Whether something is mounted at `dir`: it sits on another device than its parent.
fn is_mounted(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(dir), std::fs::metadata(dir.join(".."))) {
        (Ok(d), Ok(p)) => d.dev() != p.dev(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(system: &str, jobs: usize, iops: f64, fsck: &str) -> Record {
        Record {
            system: system.into(),
            workload: "overwrite-4k".into(),
            jobs,
            iops,
            bw_mib_s: 0.0,
            p50_us: 0.0,
            p99_us: iops / 10.0,
            fsck: fsck.into(),
            stats: None,
            note: String::new(),
            journal: "default".into(),
            journal_mib: None,
            ..Default::default()
        }
    }

    #[test]
    fn interleave_rotates_systems_within_each_point() {
        let p = |s: &str, j| ("w".to_string(), None, s.to_string(), j);
        let plan = vec![
            p("a", 1),
            p("a", 8),
            p("b", 1),
            p("b", 8),
            p("c", 1),
            p("c", 8),
        ];
        let order: Vec<(String, usize)> = interleave(plan, 2)
            .into_iter()
            .map(|(_, _, s, j)| (s, j))
            .collect();
        let want: Vec<(String, usize)> = [
            ("a", 1),
            ("b", 1),
            ("c", 1),
            ("b", 1),
            ("c", 1),
            ("a", 1),
            ("a", 8),
            ("b", 8),
            ("c", 8),
            ("b", 8),
            ("c", 8),
            ("a", 8),
        ]
        .iter()
        .map(|&(s, j)| (s.to_string(), j))
        .collect();
        assert_eq!(order, want);
    }

    #[test]
    fn interleave_alternates_the_journals_of_a_point() {
        let p = |jn, s: &str, j| ("f".to_string(), jn, s.to_string(), j);
        let plan = vec![
            p(None, "a", 64),
            p(None, "a", 256),
            p(Some(4), "a", 64),
            p(Some(4), "a", 256),
        ];
        let order: Vec<(Option<u32>, usize)> = interleave(plan, 2)
            .into_iter()
            .map(|(_, jn, _, j)| (jn, j))
            .collect();
        assert_eq!(
            order,
            vec![
                (None, 64),
                (Some(4), 64),
                (Some(4), 64),
                (None, 64),
                (None, 256),
                (Some(4), 256),
                (Some(4), 256),
                (None, 256),
            ]
        );
    }

    #[test]
    fn medians_keep_the_middle_run_every_run_and_the_worst_fsck() {
        let rs = vec![
            rec("a", 1, 300.0, "clean"),
            rec("b", 1, 50.0, "clean"),
            rec("a", 1, 100.0, "ERRORS: x"),
            rec("a", 1, 200.0, "clean"),
            rec("b", 1, 70.0, "clean"),
        ];
        let m = medians(rs);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].system, "a");
        assert_eq!(m[0].iops, 200.0);
        assert_eq!(m[0].p99_us, 20.0, "the median run's own latency");
        assert_eq!(m[0].runs, vec![300.0, 100.0, 200.0]);
        assert_eq!(m[0].fsck, "ERRORS: x");
        // Two runs: the lower one.
        assert_eq!(m[1].iops, 50.0);
        assert_eq!(m[1].runs, vec![50.0, 70.0]);
        assert_eq!(m[1].fsck, "clean");
    }
}
