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

    /// The credentials of process `pid` as `/proc/PID/status` shows them: its filesystem
    /// user and group ids and its supplementary groups, privileged when its filesystem user
    /// id is 0. None when the process is gone or not visible.
    pub fn of_process(pid: u32) -> Option<Cred> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let ids = ProcStatus(&status);
        let (uid, gid) = (ids.fs_id("Uid:")?, ids.fs_id("Gid:")?);
        Some(Cred {
            uid,
            gid,
            groups: Groups::List(ids.groups().collect()),
            privileged: uid == 0,
        })
    }

    /// Whether the caller is in group `gid` (its own or a supplementary one). For
    /// [`Groups::OfProcess`] the process's filesystem group id counts too, so a caller whose
    /// `gid` is unknown (`u32::MAX`) is still judged rightly.
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
                let ids = ProcStatus(&status);
                ids.fs_id("Gid:") == Some(gid) || ids.groups().any(|g| g == gid)
            }
        }
    }

    /// Whether the caller may keep set-group-ID on a file of group `gid` (the kernel's
    /// in_group_or_capable).
    pub fn in_group_or_privileged(&self, gid: u32) -> bool {
        self.privileged || self.in_group(gid)
    }
}

/// The lines of `/proc/PID/status` that name a process's credentials.
struct ProcStatus<'a>(&'a str);

impl ProcStatus<'_> {
    /// The filesystem id (the fourth of real, effective, saved, filesystem) on line `key`.
    fn fs_id(&self, key: &str) -> Option<u32> {
        let line = self.0.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().nth(3)?.parse().ok()
    }

    fn groups(&self) -> impl Iterator<Item = u32> + '_ {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .into_iter()
            .flat_map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_credentials_come_from_proc() {
        let me = Cred::of_process(std::process::id()).expect("own /proc entry");
        // SAFETY: no arguments, cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((me.uid, me.gid, me.privileged), (uid, gid, uid == 0));
        let unknown = Cred {
            uid: u32::MAX,
            gid: u32::MAX,
            groups: Groups::OfProcess(std::process::id()),
            privileged: false,
        };
        assert!(unknown.in_group(gid), "the filesystem group id counts");
        assert!(
            !unknown.in_group(0x7654_3210),
            "nor a group the process is not in"
        );
        assert!(Cred::of_process(u32::MAX - 1).is_none());
    }
}
