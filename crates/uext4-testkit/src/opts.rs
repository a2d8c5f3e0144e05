//! The mount options tests use, by name. Each is the default with a few fields changed, so a
//! test can change one more with struct-update syntax:
//! `MountOptions { buffered: true, ..opts::no_timer() }`.

use uext4::MountOptions;

/// No commit timer: commits happen only when the test asks (fsync, sync, unmount), so what a
/// test sees does not depend on timing.
pub fn no_timer() -> MountOptions {
    MountOptions {
        commit_interval_secs: 0,
        ..Default::default()
    }
}

/// [`no_timer`] with buffered (delayed-allocation) writes on or off.
pub fn no_timer_buffered(buffered: bool) -> MountOptions {
    MountOptions {
        buffered,
        ..no_timer()
    }
}

/// Read-only, otherwise the defaults.
pub fn read_only() -> MountOptions {
    MountOptions {
        read_only: true,
        ..Default::default()
    }
}

/// Buffered writes with a small limit, so that writeback runs often.
pub fn buffered_small(limit_bytes: u64) -> MountOptions {
    MountOptions {
        buffered: true,
        buffered_limit_bytes: limit_bytes,
        ..Default::default()
    }
}
