//! Access times: a read of a file or a listing of a directory updates its atime by the
//! kernel's rules (fs/inode.c `touch_atime`, `atime_needs_update`, `relatime_need_update`),
//! under the mount's policy (`MountOptions::atime`) and the inode's NOATIME flag (chattr +A).
//! The new time is set in memory and the inode joins the running transaction's lazy list: it
//! is written with the next commit, so a read starts no journal handle (R1).

use crate::flags::FL_NOATIME;
use crate::format::inode::{RawInode, Timestamp, S_IFDIR};
use crate::fs::{AtimeMode, AtimePolicy, Fs};
use crate::icache::{Inode, InodeState};

/// Seconds after which relatime updates an atime that is newer than mtime and ctime.
const RELATIME_SECS: i64 = 24 * 60 * 60;

/// Whether an access at `now` updates the atime of `raw` under `policy` (the kernel's
/// atime_needs_update and relatime_need_update, less the checks of the mount's writability).
pub(crate) fn atime_needs_update(policy: AtimePolicy, raw: &RawInode, now: Timestamp) -> bool {
    if raw.flags() & FL_NOATIME != 0 {
        return false;
    }
    if policy.nodiratime && raw.file_type() == S_IFDIR {
        return false;
    }
    let atime = raw.atime();
    match policy.mode {
        AtimeMode::NoAtime => false,
        AtimeMode::Strict => atime != now,
        AtimeMode::Relative => {
            raw.mtime() >= atime || raw.ctime() >= atime || now.sec - atime.sec >= RELATIME_SECS
        }
    }
}

impl Fs {
    /// An access to `inode` (a listing): sets its atime to now where the policy asks for it.
    pub(crate) fn file_accessed(&self, inode: &Inode) {
        let dirty = {
            let mut st = inode.state.lock();
            self.atime_update_locked(&mut st)
        };
        if dirty {
            self.dirty_lazily(inode);
        }
    }

    /// An access, in the caller's hold of the inode's state lock (a read takes it once): sets
    /// atime to now where the policy asks for it; never on a read-only filesystem, nor on an
    /// inode being freed. True when the inode changed: the caller then puts it on the lazy
    /// list (`dirty_lazily`) once it has let go of the lock.
    pub(crate) fn atime_update_locked(&self, st: &mut InodeState) -> bool {
        let policy = self.opts.atime;
        if policy.mode == AtimeMode::NoAtime || self.is_read_only() {
            return false;
        }
        let now = self.now();
        if st.deleted || st.dying || st.creating || !atime_needs_update(policy, &st.raw, now) {
            return false;
        }
        let before = st.raw.atime();
        st.raw.set_atime(now);
        // Unchanged at the inode's granularity (whole seconds in small inodes): nothing to write.
        st.raw.atime() != before
    }

    /// Whether a read of `ino` now would update its atime: the FUSE server then lets the
    /// kernel drop its cached pages at open, so that the read reaches the engine.
    pub fn atime_due(&self, ino: u32) -> bool {
        let policy = self.opts.atime;
        if policy.mode == AtimeMode::NoAtime || self.is_read_only() {
            return false;
        }
        let Ok(inode) = self.iget(ino) else {
            return false;
        };
        let st = inode.state.lock();
        atime_needs_update(policy, &st.raw, self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sec: i64) -> Timestamp {
        Timestamp { sec, nsec: 0 }
    }

    fn inode(atime: i64, mtime: i64, ctime: i64, mode: u16) -> RawInode {
        let mut r = RawInode::new(256);
        r.set_mode(mode);
        r.set_atime(at(atime));
        r.set_mtime(at(mtime));
        r.set_ctime(at(ctime));
        r
    }

    const REL: AtimePolicy = AtimePolicy {
        mode: AtimeMode::Relative,
        nodiratime: false,
    };

    #[test]
    fn relatime_rules() {
        // Modified or changed since the last access: updated.
        assert!(atime_needs_update(
            REL,
            &inode(100, 100, 50, 0o100644),
            at(200)
        ));
        assert!(atime_needs_update(
            REL,
            &inode(100, 50, 150, 0o100644),
            at(200)
        ));
        // Accessed after the last change, less than a day ago: not.
        assert!(!atime_needs_update(
            REL,
            &inode(100, 50, 50, 0o100644),
            at(200)
        ));
        // A day old: updated.
        let day = RELATIME_SECS;
        assert!(atime_needs_update(
            REL,
            &inode(100, 50, 50, 0o100644),
            at(100 + day)
        ));
    }

    #[test]
    fn strict_noatime_nodiratime_and_the_flag() {
        let strict = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: true,
        };
        let f = inode(100, 50, 50, 0o100644);
        assert!(atime_needs_update(strict, &f, at(101)));
        assert!(!atime_needs_update(strict, &f, at(100)));
        let d = inode(100, 50, 50, 0o40755);
        assert!(!atime_needs_update(strict, &d, at(101)));
        let none = AtimePolicy {
            mode: AtimeMode::NoAtime,
            nodiratime: false,
        };
        assert!(!atime_needs_update(
            none,
            &inode(100, 200, 200, 0o100644),
            at(300)
        ));
        let mut a = inode(100, 200, 200, 0o100644);
        a.set_flags(a.flags() | FL_NOATIME);
        assert!(!atime_needs_update(strict, &a, at(300)));
    }
}
