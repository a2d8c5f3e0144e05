//! Running the `uext4` binary from a test: a command that must succeed, or fail the way the
//! tools promise (one line on stderr starting `uext4: `, a set exit status, never a panic).

use std::process::{Command, Output};

/// The binary under test, as `env!("CARGO_BIN_EXE_uext4")` gives it.
#[derive(Clone, Copy)]
pub struct Cli(pub &'static str);

impl Cli {
    /// Builds the binaries of the workspace package `package` (`uext4-bench`) beside this one,
    /// with its profile: cargo builds only the tested package's binaries for its tests. A
    /// no-op when the workspace was built.
    pub fn build_beside(&self, package: &str) {
        let profile_dir = std::path::Path::new(self.0).parent().unwrap();
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", package, "--target-dir"])
            .arg(profile_dir.parent().unwrap());
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                c.arg("--release");
            }
            Some(other) => {
                c.args(["--profile", other]);
            }
            None => {}
        }
        assert!(c.status().unwrap().success(), "building {package} failed");
    }

    /// Runs it and returns what it did.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(self.0).args(args).output().unwrap()
    }

    /// A command that must succeed without a panic; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "uext4 {args:?} failed: {err}");
        assert!(!err.contains("panicked"), "uext4 {args:?}: {err}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A command that must fail with exit status 1 and a one-line error; its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        self.fails_with(args, 1)
    }

    /// A command that must fail with exit status `code` and a one-line error; its stderr.
    pub fn fails_with(&self, args: &[&str], code: i32) -> String {
        let o = self.run(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!err.contains("panicked"), "uext4 {args:?} panicked: {err}");
        assert_eq!(
            o.status.code(),
            Some(code),
            "uext4 {args:?}: exit status (stderr {err:?})"
        );
        assert!(
            err.trim().lines().count() == 1 && err.starts_with("uext4: "),
            "uext4 {args:?}: expected a one-line error, got {err:?}"
        );
        err
    }
}
