//! The seccomp allowlist: the system calls a contained uext4 process makes, found by running
//! the mount suites (both transports, NBD images, pjdfstest) and the image tools under
//! `strace -f` and with the filter in audit mode. Anything else fails with EPERM: a stray
//! call from a dependency's rare path then fails as a refused operation would (the request
//! gets an error, the mount keeps serving) instead of killing the server and stopping the
//! filesystem; the call itself never runs either way. Not on the list, among others: exec,
//! mount and umount, ptrace, new sockets (unless the policy allows them), keyrings, bpf,
//! namespaces, setuid and friends, module loading, reboot.

use super::{Policy, SandboxError};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

/// Allowed whatever their arguments.
const ALLOWED: &[libc::c_long] = &[
    // Files already open, and opening what landlock allows.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getcwd,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync_file_range,
    libc::SYS_fallocate,
    libc::SYS_ftruncate,
    libc::SYS_fadvise64,
    libc::SYS_flock,
    libc::SYS_splice,
    libc::SYS_pipe2,
    libc::SYS_eventfd2,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_msync,
    libc::SYS_brk,
    libc::SYS_mincore,
    // Threads, waiting and time.
    libc::SYS_futex,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    // A timer made before containment (virtio-fs gives FORGETs back on one).
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getrandom,
    libc::SYS_membarrier,
    // Signals (to this process only: tgkill/kill with other ids are checked below).
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    // Who and where.
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_getrusage,
    libc::SYS_prlimit64,
    // Sockets already connected (an NBD export, the system log).
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    // FUSE over io_uring.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// The pre-*at calls glibc may still make on x86_64.
#[cfg(target_arch = "x86_64")]
const ALLOWED_X86_64: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_epoll_wait,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_getdents,
    libc::SYS_time,
    libc::SYS_arch_prctl,
];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_X86_64: &[libc::c_long] = &[];

/// Making and changing files where landlock allows it (an image tool copying out to the
/// host); a mount server makes none.
const HOST_FILES: &[libc::c_long] = &[
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_renameat2,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_copy_file_range,
    libc::SYS_sendfile,
];

/// HOST_FILES' older forms on x86_64.
#[cfg(target_arch = "x86_64")]
const HOST_FILES_X86_64: &[libc::c_long] = &[
    libc::SYS_mkdir,
    libc::SYS_unlink,
    libc::SYS_symlink,
    libc::SYS_link,
    libc::SYS_rename,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_lchown,
    libc::SYS_utimes,
];
#[cfg(not(target_arch = "x86_64"))]
const HOST_FILES_X86_64: &[libc::c_long] = &[];

/// New sockets, for a policy that allows them.
const SOCKETS: &[libc::c_long] = &[libc::SYS_socket, libc::SYS_connect];

/// A rule: every condition (argument index, comparison, value) holds. The arguments compared
/// are all C ints (pids, prctl options, ioctl numbers), compared as the kernel reads them: the
/// low 32 bits, so that high bits set cannot slip a refused value past a `Ne`.
fn rule(conds: &[(u8, SeccompCmpOp, u64)]) -> Result<SeccompRule, SandboxError> {
    let conds = conds
        .iter()
        .map(|(arg, op, v)| SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, op.clone(), *v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    SeccompRule::new(conds).map_err(|e| SandboxError::Seccomp(e.to_string()))
}

/// The calls allowed with some arguments only.
fn conditional() -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, SandboxError> {
    use SeccompCmpOp::{Eq, Ne};
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let dword = u64::from;
    Ok(vec![
        // Signals to this process only (a stop request to itself, a thread's wakeup).
        (libc::SYS_kill, vec![rule(&[(0, Eq, pid)])?]),
        (libc::SYS_tgkill, vec![rule(&[(0, Eq, pid)])?]),
        // Thread names; nothing else of prctl's (no_new_privs is set for good).
        (
            libc::SYS_prctl,
            vec![
                rule(&[(0, Eq, libc::PR_SET_NAME as u64)])?,
                rule(&[(0, Eq, libc::PR_GET_NAME as u64)])?,
            ],
        ),
        // Device and file ioctls on descriptors already open (landlock decides which files
        // open), but not the terminal's input injection of a foreground server's tty.
        (
            libc::SYS_ioctl,
            vec![rule(&[
                (1, Ne, dword(libc::TIOCSTI)),
                (1, Ne, dword(libc::TIOCLINUX)),
            ])?],
        ),
    ])
}

/// Builds the filter for `policy` and applies it to every thread (TSYNC).
pub(super) fn apply(policy: &Policy) -> Result<(), SandboxError> {
    let err = |e: seccompiler::Error| SandboxError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let sockets: &[libc::c_long] = if policy.sockets { SOCKETS } else { &[] };
    let files: [&[libc::c_long]; 2] = if policy.host_files {
        [HOST_FILES, HOST_FILES_X86_64]
    } else {
        [&[], &[]]
    };
    for &nr in ALLOWED
        .iter()
        .chain(ALLOWED_X86_64)
        .chain(sockets)
        .chain(files.concat().iter())
    {
        rules.insert(nr, Vec::new());
    }
    for (nr, r) in conditional()? {
        rules.insert(nr, r);
    }
    let refuse = if policy.audit_only {
        SeccompAction::Log
    } else {
        SeccompAction::Errno(libc::EPERM as u32)
    };
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Seccomp(e.to_string()))?;
    let filter = SeccompFilter::new(rules, refuse, SeccompAction::Allow, arch)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Seccomp(e.to_string()))?;
    seccompiler::apply_filter_all_threads(&prog).map_err(err)
}
