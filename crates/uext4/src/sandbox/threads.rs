//! Containing every thread: capabilities, no_new_privs and a landlock domain belong to a
//! thread, not to the process, so each thread applies them to itself. The calling thread
//! signals the others (found in /proc/self/task) with a real-time signal whose handler does it
//! with raw system calls (async-signal-safe), waits until each has answered, and looks again
//! for threads that one of them started meanwhile, as glibc does for setuid(2). Handlers are
//! installed with SA_RESTART: a thread blocked reading /dev/fuse or a socket goes back to it.

use super::SandboxError;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The landlock ruleset the handler applies (-1: none).
static RULESET: AtomicI32 = AtomicI32::new(-1);
/// The threads that have answered (the first `ANSWERS` entries).
static ANSWERED: [AtomicI32; MAX_THREADS] = [const { AtomicI32::new(0) }; MAX_THREADS];
static ANSWERS: AtomicUsize = AtomicUsize::new(0);
const MAX_THREADS: usize = 4096;
/// What failed in some thread (the bits below).
static FAILED: AtomicU32 = AtomicU32::new(0);

const NO_NEW_PRIVS: u32 = 1;
const CAPS: u32 = 2;
const LANDLOCK: u32 = 4;

/// How long a thread may take to answer (one in an uninterruptible wait answers after it).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 4
}

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Contains the calling thread; returns the bits of what failed. Only raw system calls: it
/// runs in a signal handler.
fn contain_this_thread() -> u32 {
    let mut failed = 0;
    // SAFETY: prctl, capset and landlock_restrict_self with valid arguments; the capability
    // structures live on this stack for the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            failed |= NO_NEW_PRIVS;
        }
        // The bounding set first (it needs CAP_SETPCAP, gone below); an unknown number fails
        // harmlessly with EINVAL.
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let mut hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) != 0 {
            failed |= CAPS;
        }
        let fd = RULESET.load(Ordering::SeqCst);
        if fd >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
            failed |= LANDLOCK;
        }
    }
    failed
}

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno is thread-local; kept across the handler as the interrupted code expects.
    let errno = unsafe { *libc::__errno_location() };
    let failed = contain_this_thread();
    FAILED.fetch_or(failed, Ordering::SeqCst);
    let i = ANSWERS.fetch_add(1, Ordering::SeqCst);
    if let Some(slot) = ANSWERED.get(i) {
        // SAFETY: gettid has no preconditions.
        slot.store(unsafe { libc::gettid() }, Ordering::SeqCst);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The ids of this process's threads.
fn tids() -> Result<Vec<libc::pid_t>, SandboxError> {
    let dir = std::fs::read_dir("/proc/self/task")
        .map_err(|e| SandboxError::Threads(format!("/proc/self/task: {e}")))?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Contains every thread of the process with `ruleset` (landlock, where there is one), the
/// caller last.
pub(super) fn contain_all(ruleset: Option<&OwnedFd>) -> Result<(), SandboxError> {
    RULESET.store(ruleset.map_or(-1, |f| f.as_raw_fd()), Ordering::SeqCst);
    FAILED.store(0, Ordering::SeqCst);
    ANSWERS.store(0, Ordering::SeqCst);
    // SAFETY: a handler that only makes raw system calls and touches atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(signal(), &sa, std::ptr::null_mut()) != 0 {
            return Err(SandboxError::Threads(format!(
                "installing the handler: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    let broadcast = signal_others();
    // SAFETY: as above; later strays of the signal are ignored.
    unsafe { libc::signal(signal(), libc::SIG_IGN) };
    broadcast?;
    let failed = FAILED.load(Ordering::SeqCst) | contain_this_thread();
    RULESET.store(-1, Ordering::SeqCst);
    let what = [
        (NO_NEW_PRIVS, "setting no_new_privs"),
        (CAPS, "dropping capabilities"),
        (LANDLOCK, "landlock_restrict_self"),
    ];
    match what.iter().find(|(bit, _)| failed & bit != 0) {
        Some((_, w)) => Err(SandboxError::Threads(format!("{w} failed in a thread"))),
        None => Ok(()),
    }
}

/// Has every other thread run the handler, including threads started meanwhile.
fn signal_others() -> Result<(), SandboxError> {
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut done = vec![me];
    loop {
        let new: Vec<_> = tids()?.into_iter().filter(|t| !done.contains(t)).collect();
        if new.is_empty() {
            return Ok(());
        }
        for &t in &new {
            // SAFETY: tgkill with our own process id; a thread gone meanwhile gives ESRCH.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, t, signal()) };
            done.push(t);
        }
        let start = Instant::now();
        loop {
            // Those not answered yet and still there (a thread may end before its turn).
            let answered: Vec<_> = ANSWERED[..ANSWERS.load(Ordering::SeqCst).min(MAX_THREADS)]
                .iter()
                .map(|a| a.load(Ordering::SeqCst))
                .collect();
            let waiting = new
                .iter()
                .filter(|t| !answered.contains(t))
                .filter(|t| std::path::Path::new(&format!("/proc/self/task/{t}")).exists())
                .count();
            if waiting == 0 {
                break;
            }
            if start.elapsed() > ANSWER_WITHIN {
                return Err(SandboxError::Threads(format!(
                    "{waiting} thread(s) did not answer within {} s",
                    ANSWER_WITHIN.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
