//! The real-tools family: the work developers and CI put on a mount, done by the tools
//! themselves. On one fresh image per system, each step timed apart, in this order:
//!
//! - `git-clone`: `git clone --no-hardlinks` of a generated repository (the metadata family's
//!   source tree, about 10,000 entries, and a small C project) from outside the mount: the
//!   objects copied in, the work tree checked out; then syncfs;
//! - `git-checkout`: from the first commit to the second (a fifth of the files changed, some
//!   removed, some added) and back, twice; then syncfs;
//! - `git-status`: `git status --porcelain` three times (it must print nothing);
//! - `venv`: `python3 -m venv` (pip copied in by ensurepip); then syncfs;
//! - `pip-install`: `pip install --no-index` of three generated pure-Python wheels (1,200
//!   modules, byte-compiled by pip as it installs); then syncfs;
//! - `py-import`: a fresh interpreter imports every module of them;
//! - `cc-build`: `make -j` of the C project in the clone (120 files), and the program run;
//! - `rm-tree`: `rm -rf` of the clone and the virtual environment; then syncfs.
//!
//! Every input is made here, before any timing, from fixed seeds: the repository with `git
//! fast-import`, the wheels with Python's zipfile. Nothing is downloaded. Each step checks that
//! its tool did the work (exit status, the commit checked out, an empty status, the modules'
//! values summed, the program's output), so a system that fails a step fails the bench rather
//! than reporting a fast non-result.

use super::meta::{self, Counter, Timed};
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The family, in the order it runs.
pub const WORKLOADS: &[&str] = &[
    "git-clone",
    "git-checkout",
    "git-status",
    "venv",
    "pip-install",
    "py-import",
    "cc-build",
    "rm-tree",
];

/// What the family's tools need here; `None` when all of them are present, else what is
/// missing, in one line.
pub fn missing() -> Option<String> {
    let mut miss = Vec::new();
    for tool in ["git", "make", "cc", "rm"] {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool} >/dev/null"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            miss.push(tool.to_string());
        }
    }
    let py = Command::new(python())
        .args(["-c", "import venv, ensurepip, zipfile"])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !py {
        miss.push("python3 with venv and ensurepip (python3-venv)".into());
    }
    if miss.is_empty() {
        None
    } else {
        Some(format!(
            "the tools family needs {} (scripts/install-deps.sh installs them)",
            miss.join(", ")
        ))
    }
}

/// The interpreter: `UEXT4_BENCH_PYTHON`, else `python3` on PATH.
fn python() -> String {
    std::env::var("UEXT4_BENCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The family's inputs, made once per bench run outside every mount.
pub struct Inputs {
    dir: PathBuf,
    /// The bare repository the clone copies.
    repo: PathBuf,
    wheels: PathBuf,
    /// Files in the first commit; entries changed, added or removed by one checkout.
    files: u64,
    changed: u64,
    pkgs: usize,
    /// Modules per package: subpackages x modules.
    subs: usize,
    mods: usize,
    c_units: usize,
    /// What the tree came from, for the report.
    pub summary: String,
}

/// The C project's size and the wheels' shape, full and --quick.
fn shape(quick: bool) -> (usize, usize, usize, usize) {
    if quick {
        // (C files, packages, subpackages, modules per subpackage)
        (24, 1, 4, 20)
    } else {
        (120, 3, 10, 40)
    }
}

impl Inputs {
    /// Makes the repository (from `tree`) and the wheels under `base`.
    pub fn make(base: &Path, tree: &meta::Tree, quick: bool) -> Result<Inputs> {
        let dir = base.join("tools-inputs");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home"))?;
        let (c_units, pkgs, subs, mods) = shape(quick);
        let repo = dir.join("repo.git");
        let (files, changed) = make_repo(&dir, &repo, tree, c_units)?;
        let wheels = dir.join("wheels");
        std::fs::create_dir_all(&wheels)?;
        let script = dir.join("make_wheels.py");
        std::fs::write(&script, WHEEL_MAKER)?;
        run_tool(
            &dir,
            Command::new(python())
                .arg(&script)
                .arg(&wheels)
                .args([pkgs, subs, mods].map(|n| n.to_string())),
        )
        .context("making the wheels")?;
        let summary = format!(
            "a git repository of {files} files ({}, and a C project of {c_units} files), two \
             commits {changed} entries apart; {pkgs} wheels of {} modules",
            tree.summary(),
            pkgs * subs * mods
        );
        Ok(Inputs {
            dir,
            repo,
            wheels,
            files,
            changed,
            pkgs,
            subs,
            mods,
            c_units,
            summary,
        })
    }

    /// A command with this family's environment: no user or system configuration, no caches
    /// outside the mount, no network.
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, cwd: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(cwd)
            .env("HOME", self.dir.join("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("PIP_NO_INDEX", "1")
            .env("PIP_NO_CACHE_DIR", "1")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            // pip and the imports byte-compile as they do for users.
            .env_remove("PYTHONDONTWRITEBYTECODE")
            .env_remove("VIRTUAL_ENV");
        c
    }
}

/// The family's heading and paragraph in the report.
pub fn intro(inp: &Inputs) -> String {
    format!(
        "## Real tools (seconds, lower is better)\n\nInputs: {}. One fresh image per system; \
         the steps run in this order, each timed apart: git-clone (--no-hardlinks, + syncfs), \
         git-checkout (to the second commit and back, twice, + syncfs), git-status (three \
         times), venv (python3 -m venv, + syncfs), pip-install (the wheels, no index, + \
         syncfs), py-import (every module), cc-build (make -j, the program run, + syncfs), \
         rm-tree (rm -rf of the clone and the venv, + syncfs). Entries: the files each step \
         went through. raw is a tmpfs folder, fuse-mem an in-memory FUSE server.",
        inp.summary
    )
}

/// Runs the family in the mounted folder `dir`: every step up to the last one selected.
pub fn run_family(
    dir: &Path,
    inp: &Inputs,
    selected: &[String],
    mut counter: Option<&mut dyn Counter>,
) -> Result<Vec<Timed>> {
    let mut out = Vec::new();
    for &w in meta::up_to_last(WORKLOADS, selected) {
        if let Some(c) = counter.as_mut() {
            c.start()?;
        }
        let t0 = Instant::now();
        let entries = step(w, dir, inp).with_context(|| w.to_string())?;
        let secs = t0.elapsed().as_secs_f64();
        let requests = match counter.as_mut() {
            Some(c) => Some(c.stop()?),
            None => None,
        };
        // Counted after the clock stops: what the step made (or, for rm-tree, found).
        let entries = match entries {
            Some(n) => n,
            None => count_entries(&dir.join(if w == "venv" { "venv" } else { "venv/lib" }))?,
        };
        out.push(Timed {
            workload: w,
            note: String::new(),
            secs,
            entries,
            requests,
        });
    }
    Ok(out)
}

/// One step; its entry count when known before the clock stops, `None` to count the tree after.
fn step(w: &str, dir: &Path, inp: &Inputs) -> Result<Option<u64>> {
    let clone = dir.join("repo");
    let venv = dir.join("venv");
    let vpy = venv.join("bin/python");
    Ok(Some(match w {
        "git-clone" => {
            run_tool(
                dir,
                inp.cmd("git", dir)
                    .args(["clone", "-q", "--no-hardlinks"])
                    .arg(&inp.repo)
                    .arg(&clone),
            )?;
            syncfs(dir)?;
            inp.files
        }
        "git-checkout" => {
            for rev in ["second", "main", "second", "main"] {
                run_tool(dir, inp.cmd("git", &clone).args(["checkout", "-q", rev]))?;
            }
            syncfs(dir)?;
            inp.changed * 4
        }
        "git-status" => {
            for _ in 0..3 {
                let o = capture(
                    &clone,
                    inp.cmd("git", &clone).args(["status", "--porcelain"]),
                )?;
                if !o.trim().is_empty() {
                    bail!(
                        "git status after the checkouts is not clean: {}",
                        first_line(&o)
                    );
                }
            }
            inp.files * 3
        }
        "venv" => {
            run_tool(dir, inp.cmd(python(), dir).args(["-m", "venv"]).arg(&venv))?;
            syncfs(dir)?;
            return Ok(None);
        }
        "pip-install" => {
            let names: Vec<String> = (0..inp.pkgs)
                .map(|p| format!("uext4bench-pkg{p}"))
                .collect();
            run_tool(
                dir,
                inp.cmd(&vpy, dir)
                    .args(["-m", "pip", "install", "-q", "--find-links"])
                    .arg(&inp.wheels)
                    .args(&names),
            )?;
            syncfs(dir)?;
            return Ok(None);
        }
        "py-import" => {
            let o = capture(
                dir,
                inp.cmd(&vpy, dir)
                    .args(["-c", IMPORTER, &inp.pkgs.to_string()]),
            )?;
            let want = expected_import(inp);
            if o.trim() != want {
                bail!("the imports gave {:?}, not {want:?}", o.trim());
            }
            (inp.pkgs * inp.subs * inp.mods) as u64
        }
        "cc-build" => {
            let proj = clone.join("cproj");
            let jobs = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2);
            run_tool(
                &proj,
                inp.cmd("make", &proj).args(["-s", &format!("-j{jobs}")]),
            )?;
            let o = capture(&proj, &mut inp.cmd(proj.join("prog"), &proj))?;
            let want = c_expected(inp.c_units).to_string();
            if o.trim() != want {
                bail!("the program printed {:?}, not {want}", o.trim());
            }
            syncfs(dir)?;
            inp.c_units as u64 + 1
        }
        "rm-tree" => {
            let n = count_entries(&clone)? + count_entries(&venv)?;
            run_tool(dir, inp.cmd("rm", dir).arg("-rf").arg(&clone).arg(&venv))?;
            syncfs(dir)?;
            if std::fs::read_dir(dir)?.any(|e| e.is_ok_and(|e| e.file_name() != "lost+found")) {
                bail!("rm -rf left entries in {}", dir.display());
            }
            n
        }
        _ => unreachable!("not a tools workload"),
    }))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// Runs a tool to completion; its stderr's first line names a failure.
fn run_tool(cwd: &Path, c: &mut Command) -> Result<()> {
    capture(cwd, c).map(|_| ())
}

fn capture(cwd: &Path, c: &mut Command) -> Result<String> {
    let prog = c.get_program().to_string_lossy().into_owned();
    let o = c
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{prog} (in {})", cwd.display()))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        bail!("{prog} failed ({}): {}", o.status, first_line(&err));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn syncfs(dir: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir).with_context(|| dir.display().to_string())?;
    // SAFETY: d is an open descriptor.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(anyhow!("syncfs: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Entries below `root` (not following links); 0 when it is not there.
fn count_entries(root: &Path) -> Result<u64> {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| d.display().to_string()),
        };
        for e in rd {
            let e = e?;
            n += 1;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(n)
}

/// What the one-image-per-system families run on: the metadata family's tree, or the tools
/// family's repository and wheels.
#[derive(Clone, Copy)]
pub(crate) enum MetaInput<'a> {
    Tree(&'a meta::Tree),
    Tools(&'a Inputs),
}

impl MetaInput<'_> {
    pub(crate) fn describe(&self) -> String {
        match self {
            MetaInput::Tree(t) => format!("{}, {}", t.source, t.summary()),
            MetaInput::Tools(t) => t.summary.clone(),
        }
    }

    pub(crate) fn workloads(&self) -> &'static [&'static str] {
        match self {
            MetaInput::Tree(_) => meta::WORKLOADS,
            MetaInput::Tools(_) => WORKLOADS,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The repository

/// Writes the repository with `git fast-import`: `main` holds the tree and the C project,
/// `second` the same with every fifth file changed, every 23rd removed and one file added per
/// twenty. Returns (files in `main`, entries one checkout changes).
fn make_repo(dir: &Path, repo: &Path, tree: &meta::Tree, c_units: usize) -> Result<(u64, u64)> {
    run_tool(
        dir,
        Command::new("git")
            .args(["init", "-q", "--bare", "-b", "main"])
            .arg(repo)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null"),
    )?;
    // (path, git mode, contents)
    let mut files: Vec<(String, &'static str, Vec<u8>)> = Vec::new();
    for e in &tree.entries {
        let (mode, data) = match &e.kind {
            meta::Kind::Dir => continue,
            meta::Kind::File(d) => (
                if e.mode & 0o111 != 0 {
                    "100755"
                } else {
                    "100644"
                },
                d,
            ),
            meta::Kind::Symlink(t) => ("120000", t),
            meta::Kind::HardLink(i) => match &tree.entries[*i].kind {
                meta::Kind::File(d) => ("100644", d),
                _ => continue,
            },
        };
        files.push((e.path.clone(), mode, data.clone()));
    }
    for (path, data) in c_project(c_units) {
        files.push((path, "100644", data.into_bytes()));
    }
    let mut stream = Vec::new();
    let stamp = "uext4 bench <bench@uext4.invalid> 1700000000 +0000";
    let commit = |s: &mut Vec<u8>, branch: &str, msg: &str| {
        let _ = write!(
            s,
            "commit refs/heads/{branch}\ncommitter {stamp}\ndata {}\n{msg}\n",
            msg.len() + 1
        );
    };
    let put = |s: &mut Vec<u8>, path: &str, mode: &str, data: &[u8]| {
        let _ = write!(s, "M {mode} inline {path}\ndata {}\n", data.len());
        s.extend_from_slice(data);
        s.push(b'\n');
    };
    commit(&mut stream, "main", "the tree");
    for (p, m, d) in &files {
        put(&mut stream, p, m, d);
    }
    commit(&mut stream, "second", "a fifth changed");
    stream.extend_from_slice(b"from refs/heads/main\n");
    let mut changed = 0u64;
    let tree_files = files.len() - c_units - 3;
    for (i, (p, m, d)) in files.iter().take(tree_files).enumerate() {
        if i % 23 == 7 {
            let _ = writeln!(stream, "D {p}");
            changed += 1;
        } else if i % 5 == 0 && *m != "120000" {
            let mut d = d.clone();
            d.extend_from_slice(format!("\nchanged in the second commit ({i})\n").as_bytes());
            put(&mut stream, p, m, &d);
            changed += 1;
        }
        if i % 20 == 3 {
            let parent = p
                .rsplit_once('/')
                .map(|(d, _)| format!("{d}/"))
                .unwrap_or_default();
            put(
                &mut stream,
                &format!("{parent}added-{i}.txt"),
                "100644",
                format!("new file {i}\n").as_bytes(),
            );
            changed += 1;
        }
    }
    let mut c = Command::new("git");
    c.arg("--git-dir")
        .arg(repo)
        .args(["fast-import", "--quiet"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().context("git fast-import")?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow!("git fast-import: no stdin"))?
        .write_all(&stream)
        .context("git fast-import")?;
    let o = child.wait_with_output()?;
    if !o.status.success() {
        bail!(
            "git fast-import failed: {}",
            first_line(&String::from_utf8_lossy(&o.stderr))
        );
    }
    Ok((files.len() as u64, changed))
}

/// The C project: `c_units` files in six folders, a header, a main and a Makefile; its
/// program prints `c_expected(c_units)`.
fn c_project(units: usize) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let mut decls = String::from("#ifndef PROJ_H\n#define PROJ_H\n");
    let mut calls = String::new();
    for n in 0..units {
        decls.push_str(&format!("unsigned long unit_{n}(unsigned long x);\n"));
        calls.push_str(&format!("    sum += unit_{n}(1);\n"));
        let mut body =
            format!("#include \"../../proj.h\"\n\n/* Unit {n}: generated for uext4 bench. */\n");
        // Helpers the compiler has to work through, as in real sources.
        for h in 0..6 {
            body.push_str(&format!(
                "static unsigned long helper_{n}_{h}(unsigned long x)\n{{\n    unsigned long r = x;\n    \
                 for (int i = 0; i < 3; i++)\n        r = (r * {m} + {h}) % 1000003UL;\n    return r;\n}}\n\n",
                m = 31 + h
            ));
        }
        body.push_str(&format!(
            "unsigned long unit_{n}(unsigned long x)\n{{\n    unsigned long r = x;\n    \
             for (int i = 0; i < 20; i++)\n        r = (r * 33 + {n}) % 1000003UL;\n    \
             (void)helper_{n}_0; (void)helper_{n}_1; (void)helper_{n}_2;\n    \
             (void)helper_{n}_3; (void)helper_{n}_4; (void)helper_{n}_5;\n    \
             return r + {k};\n}}\n",
            k = n * 7 % 13
        ));
        v.push((format!("cproj/src/d{}/unit{n}.c", n % 6), body));
    }
    decls.push_str("#endif\n");
    v.push(("cproj/proj.h".into(), decls));
    v.push((
        "cproj/main.c".into(),
        format!("#include <stdio.h>\n#include \"proj.h\"\n\nint main(void)\n{{\n    unsigned long sum = 0;\n{calls}    printf(\"%lu\\n\", sum);\n    return 0;\n}}\n"),
    ));
    v.push((
        "cproj/Makefile".into(),
        "SRCS := $(wildcard src/*/*.c) main.c\nOBJS := $(SRCS:%.c=build/%.o)\n\n\
         prog: $(OBJS)\n\t$(CC) -o $@ $^\n\n\
         build/%.o: %.c proj.h\n\t@mkdir -p $(dir $@)\n\t$(CC) -O1 -c -o $@ $<\n"
            .into(),
    ));
    v
}

/// What the C project's program prints.
fn c_expected(units: usize) -> u64 {
    (0..units as u64)
        .map(|n| {
            let mut r = 1u64;
            for _ in 0..20 {
                r = (r * 33 + n) % 1_000_003;
            }
            r + n * 7 % 13
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The wheels

/// Writes `packages` wheels (uext4bench_pkgP-1.0-py3-none-any.whl) into `argv[1]`: each with
/// `subs` subpackages of `mods` modules and a JSON file per subpackage; entries dated 2020 so
/// the same bytes come back every run; RECORD with each file's hash, as pip expects.
const WHEEL_MAKER: &str = r#"
import base64, hashlib, json, sys, zipfile
out, packages, subs, mods = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def module(p, s, m):
    lines = ['"""Module %d of subpackage %d of package %d (uext4 bench)."""' % (m, s, p),
             "VALUE = %d" % (p * 100000 + s * 1000 + m), ""]
    for f in range(12):
        lines += ["def f%d(x, y=%d):" % (f, f), "    r = x * %d + y" % (f + 1),
                  "    for i in range(3):", "        r = (r * 31 + i) % 1000003", "    return r", ""]
    lines += ["class C%d:" % m, "    def __init__(self, a):", "        self.a = a", "",
              "    def value(self):", "        return self.a + VALUE", ""]
    return "\n".join(lines).encode()

for p in range(packages):
    name = "uext4bench_pkg%d" % p
    dist = name + "-1.0.dist-info"
    files = [(name + "/__init__.py", b"PACKAGE = %d\n" % p)]
    for s in range(subs):
        files.append(("%s/sub%d/__init__.py" % (name, s), b"SUB = %d\n" % s))
        for m in range(mods):
            files.append(("%s/sub%d/mod%d.py" % (name, s, m), module(p, s, m)))
        files.append(("%s/sub%d/data.json" % (name, s),
                      json.dumps({"sub": s, "values": list(range(200))}).encode()))
    files.append((dist + "/METADATA", b"Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name.encode()))
    files.append((dist + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: uext4-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist + "/RECORD,,")
    files.append((dist + "/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile("%s/%s-1.0-py3-none-any.whl" % (out, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
"#;

/// Imports every module of the installed packages; prints how many and their VALUEs' sum.
const IMPORTER: &str = r#"
import importlib, pkgutil, sys
n = total = 0
for p in range(int(sys.argv[1])):
    pkg = importlib.import_module("uext4bench_pkg%d" % p)
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        m = importlib.import_module(info.name)
        if hasattr(m, "VALUE"):
            n += 1
            total += m.VALUE
print(n, total)
"#;

fn expected_import(inp: &Inputs) -> String {
    let mut total = 0u64;
    for p in 0..inp.pkgs as u64 {
        for s in 0..inp.subs as u64 {
            for m in 0..inp.mods as u64 {
                total += p * 100_000 + s * 1000 + m;
            }
        }
    }
    format!("{} {total}", inp.pkgs * inp.subs * inp.mods)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated C project builds and prints what `c_expected` says, and the repository
    /// holds both commits with the counts `make_repo` returns (git itself is the oracle).
    #[test]
    fn inputs_are_what_the_checks_expect() {
        if missing().is_some() {
            eprintln!("skipped: {}", missing().unwrap_or_default());
            return;
        }
        let base = std::env::temp_dir().join(format!("uext4-tools-{}", std::process::id()));
        let tree = meta::generate(300, 7);
        let inp = Inputs::make(&base, &tree, true).unwrap();
        let work = base.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let clone = work.join("repo");
        run_tool(
            &work,
            inp.cmd("git", &work)
                .args(["clone", "-q"])
                .arg(&inp.repo)
                .arg(&clone),
        )
        .unwrap();
        let ls = capture(&clone, inp.cmd("git", &clone).args(["ls-files"])).unwrap();
        assert_eq!(ls.lines().count() as u64, inp.files);
        let diff = capture(
            &clone,
            inp.cmd("git", &clone)
                .args(["diff", "--name-only", "main", "origin/second"]),
        )
        .unwrap();
        assert_eq!(diff.lines().count() as u64, inp.changed);
        let proj = clone.join("cproj");
        run_tool(&proj, inp.cmd("make", &proj).arg("-s")).unwrap();
        let o = capture(&proj, &mut inp.cmd(proj.join("prog"), &proj)).unwrap();
        assert_eq!(o.trim(), c_expected(inp.c_units).to_string());
        let wheels: Vec<_> = std::fs::read_dir(&inp.wheels).unwrap().collect();
        assert_eq!(wheels.len(), inp.pkgs);
        let _ = std::fs::remove_dir_all(&base);
    }
}
