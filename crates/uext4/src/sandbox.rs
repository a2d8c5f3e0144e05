//! Containment for a process that reads images it did not make: after the image (and, for a
//! mount, /dev/fuse) is open, [`contain`] takes away what a hostile image could otherwise
//! reach through a bug: every capability (effective, permitted, inheritable, ambient and the
//! bounding set), set-uid and file-capability gains at exec (no_new_privs), every file outside
//! the policy's list (landlock, with TCP and signals to processes outside the sandbox as well
//! where the kernel scopes them), and every system call outside the list in `syscalls.rs`
//! (a seccomp filter; a call off the list fails with EPERM instead of running).
//!
//! It is applied to every thread of the process: the seccomp filter with TSYNC, the rest by
//! each thread itself (capabilities, no_new_privs and landlock domains belong to a thread, and
//! the kernel here may predate landlock's own TSYNC): `threads.rs` has each thread run a
//! signal handler that contains it. Threads started later inherit it all.
//!
//! `uext4 mount` calls it once mounted (on by default, `-o nosandbox` off); the image tools
//! with `--sandbox`; an embedder that opens images from strangers can call it once its own
//! setup is done. It cannot be undone.

mod syscalls;
mod threads;

use std::path::PathBuf;

/// What a contained process may still open, and how its filter answers.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Files and directories (with everything beneath) it may read.
    pub read: Vec<PathBuf>,
    /// Files and directories it may read and write.
    pub write: Vec<PathBuf>,
    /// Whether it may make new sockets (a tool that connects to an NBD server after
    /// containing itself); a mount's connections are made before.
    pub sockets: bool,
    /// Whether it may make, remove and change files (where landlock lets it): an image tool
    /// copying out to the host; a mount server makes none.
    pub host_files: bool,
    /// Log the calls off the list (the kernel's audit log, `dmesg`) and let them run, instead
    /// of refusing them: for finding what a new code path needs, never for serving strangers.
    pub audit_only: bool,
}

/// What [`contain`] could not apply because the kernel lacks it, one line each ("landlock:
/// not supported by this kernel"); empty where everything holds.
#[derive(Clone, Debug, Default)]
pub struct Contained {
    /// One line per mechanism missing or weaker than asked.
    pub missing: Vec<String>,
}

/// Why containment failed where the kernel offers the mechanism.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Building or applying the landlock ruleset failed.
    #[error("landlock: {0}")]
    Landlock(String),
    /// Building or applying the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// A thread could not be contained (or did not answer).
    #[error("containing the threads: {0}")]
    Threads(String),
}

/// The paths every contained uext4 process reads: /proc, where a server reads its callers'
/// credentials (/proc/PID/status), its own mounts (/proc/self/mountinfo) and the kernel's
/// writeback limits (/proc/sys/vm).
pub const ALWAYS_READ: &[&str] = &["/proc"];

/// Contains the calling process (every thread) under `policy`. A mechanism this kernel lacks
/// is named in the answer's `missing` and the rest applies; one it has that fails is an error
/// (the process may then be partly contained: capabilities go first).
pub fn contain(policy: &Policy) -> Result<Contained, SandboxError> {
    let mut missing = Vec::new();
    let ruleset = landlock_ruleset(policy, &mut missing)?;
    threads::contain_all(ruleset.as_ref())?;
    drop(ruleset);
    match syscalls::apply(policy) {
        Ok(()) => {}
        Err(SandboxError::Seccomp(e)) if !seccomp_supported() => {
            missing.push(format!("seccomp: not supported by this kernel ({e})"))
        }
        Err(e) => return Err(e),
    }
    Ok(Contained { missing })
}

/// Whether the kernel has seccomp filters (PR_GET_SECCOMP answers where it has).
fn seccomp_supported() -> bool {
    // SAFETY: prctl(PR_GET_SECCOMP) takes no pointers.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// The landlock ABI version this kernel offers, or why none.
fn landlock_abi() -> Result<i64, std::io::Error> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads nothing and returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

/// The ruleset's descriptor (None where the kernel has no landlock, said in `missing`).
fn landlock_ruleset(
    policy: &Policy,
    missing: &mut Vec<String>,
) -> Result<Option<std::os::fd::OwnedFd>, SandboxError> {
    use landlock::{
        path_beneath_rules, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr,
        Scope, ABI,
    };
    let have = match landlock_abi() {
        Ok(v) => v,
        Err(e) => {
            missing.push(format!("landlock: not available in this kernel ({e})"));
            return Ok(None);
        }
    };
    // The rights known and tested here (ABI 6: files, TCP, signal and abstract-socket
    // scoping); an older kernel enforces what it knows.
    let abi = ABI::V6;
    if have < 6 {
        missing.push(format!(
            "landlock: this kernel's ABI {have} lacks {} (ABI 6); the files are restricted",
            match have {
                1..=3 => "file truncation, TCP and signal rules",
                _ => "TCP or signal rules",
            }
        ));
    }
    let err = |e: landlock::RulesetError| SandboxError::Landlock(e.to_string());
    let mut read: Vec<PathBuf> = ALWAYS_READ.iter().map(PathBuf::from).collect();
    read.extend(policy.read.iter().cloned());
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?;
    if !policy.sockets {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(err)?;
    }
    let created = ruleset
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))
        .map_err(err)?
        .add_rules(path_beneath_rules(&policy.write, AccessFs::from_all(abi)))
        .map_err(err)?;
    Ok(created.into())
}

/// Whether the calling thread is contained: seccomp filter mode (2 in /proc/self/status).
pub fn is_contained() -> bool {
    // SAFETY: prctl(PR_GET_SECCOMP) takes no pointers.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) == 2 }
}
