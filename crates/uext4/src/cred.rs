//! The caller's credentials: who owns what it creates, and whose privileges decide the
//! set-ID, capability and ACL-mode rules that the engine's operations apply (as the kernel's
//! VFS does with `current_cred()`).

/// A caller of the engine's operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cred {
    /// The caller's user id (the filesystem user id).
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Groups,
    /// Acts with root's capabilities (CAP_FSETID, CAP_FOWNER): keeps set-ID bits on write
    /// and truncate, and set-group-ID on files of groups it is not in.
    pub privileged: bool,
}

/// Where a caller's supplementary groups come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Groups {
    /// Given.
    List(Vec<u32>),
    /// Those of process `pid`, read from `/proc/PID/status` only when a decision needs them
    /// (a server that answers for another process does not pay for them on every request).
    OfProcess(u32),
}

impl Cred {
    /// Root: uid and gid 0, privileged.
    pub fn root() -> Cred {
        Cred {
            uid: 0,
            gid: 0,
            groups: Groups::List(Vec::new()),
            privileged: true,
        }
    }

    /// An unprivileged user with no supplementary groups (uid 0 is still root).
    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Groups::List(Vec::new()),
            privileged: uid == 0,
        }
    }

    /// This process's own credentials (effective ids and supplementary groups).
    pub fn current() -> Cred {
        // SAFETY: these calls take no arguments and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Cred {
            uid,
            gid,
            groups: Groups::OfProcess(std::process::id()),
            privileged: uid == 0,
        }
    }

    /// Whether the caller is in group `gid` (its own or a supplementary one).
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        match &self.groups {
            Groups::List(g) => g.contains(&gid),
            Groups::OfProcess(pid) => {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                    return false;
                };
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Groups:"))
                    .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
            }
        }
    }

    /// Whether the caller may keep set-group-ID on a file of group `gid` (the kernel's
    /// in_group_or_capable).
    pub fn in_group_or_privileged(&self, gid: u32) -> bool {
        self.privileged || self.in_group(gid)
    }
}
