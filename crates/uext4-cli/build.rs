//! `uext4 --version`'s commit and date: `git rev-parse --short HEAD` and the commit's date,
//! "unknown" for a build outside a git checkout (a crate from crates.io, a tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let date = commit
        .as_ref()
        .and_then(|_| git(&["log", "-1", "--format=%cs", "HEAD"]));
    println!(
        "cargo:rustc-env=UEXT4_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!(
        "cargo:rustc-env=UEXT4_COMMIT_DATE={}",
        date.as_deref().unwrap_or("unknown")
    );
    // Again when HEAD moves (a commit, a checkout): the checkout's HEAD and its log.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "logs/HEAD"] {
            let p = std::path::Path::new(&dir).join(f);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
