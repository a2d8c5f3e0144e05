//! Requests served, by opcode, and the time the handler spent on them: what `uext4 stats`
//! shows as `fuse_requests`, so that a round trip cut (or added) is visible in numbers.

use crate::abi;
use std::sync::atomic::{AtomicU64, Ordering};

/// Opcodes up to this are counted one by one; higher ones together as "other".
const MAX_OPCODE: usize = 63;

/// Counters per opcode: requests, and nanoseconds between decoding a request and having its
/// answer (a kept fsync counts until it is queued, not until its commit).
pub(super) struct RequestStats {
    count: [AtomicU64; MAX_OPCODE + 1],
    nanos: [AtomicU64; MAX_OPCODE + 1],
}

/// The kernel's name of an opcode.
fn name(op: usize) -> &'static str {
    const NAMES: [(u32, &str); 45] = [
        (abi::LOOKUP, "LOOKUP"),
        (abi::FORGET, "FORGET"),
        (abi::GETATTR, "GETATTR"),
        (abi::SETATTR, "SETATTR"),
        (abi::READLINK, "READLINK"),
        (abi::SYMLINK, "SYMLINK"),
        (abi::MKNOD, "MKNOD"),
        (abi::MKDIR, "MKDIR"),
        (abi::UNLINK, "UNLINK"),
        (abi::RMDIR, "RMDIR"),
        (abi::RENAME, "RENAME"),
        (abi::LINK, "LINK"),
        (abi::OPEN, "OPEN"),
        (abi::READ, "READ"),
        (abi::WRITE, "WRITE"),
        (abi::STATFS, "STATFS"),
        (abi::RELEASE, "RELEASE"),
        (abi::FSYNC, "FSYNC"),
        (abi::SETXATTR, "SETXATTR"),
        (abi::GETXATTR, "GETXATTR"),
        (abi::LISTXATTR, "LISTXATTR"),
        (abi::REMOVEXATTR, "REMOVEXATTR"),
        (abi::FLUSH, "FLUSH"),
        (abi::INIT, "INIT"),
        (abi::OPENDIR, "OPENDIR"),
        (abi::READDIR, "READDIR"),
        (abi::RELEASEDIR, "RELEASEDIR"),
        (abi::FSYNCDIR, "FSYNCDIR"),
        (abi::GETLK, "GETLK"),
        (abi::SETLK, "SETLK"),
        (abi::SETLKW, "SETLKW"),
        (abi::ACCESS, "ACCESS"),
        (abi::CREATE, "CREATE"),
        (abi::INTERRUPT, "INTERRUPT"),
        (abi::DESTROY, "DESTROY"),
        (abi::IOCTL, "IOCTL"),
        (abi::BATCH_FORGET, "BATCH_FORGET"),
        (abi::FALLOCATE, "FALLOCATE"),
        (abi::READDIRPLUS, "READDIRPLUS"),
        (abi::RENAME2, "RENAME2"),
        (abi::LSEEK, "LSEEK"),
        (abi::COPY_FILE_RANGE, "COPY_FILE_RANGE"),
        (abi::SYNCFS, "SYNCFS"),
        (abi::TMPFILE, "TMPFILE"),
        (abi::STATX, "STATX"),
    ];
    NAMES
        .iter()
        .find(|(o, _)| *o as usize == op)
        .map_or("OTHER", |(_, n)| n)
}

impl RequestStats {
    pub(super) fn new() -> RequestStats {
        RequestStats {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// One request of `opcode` served in `nanos`.
    pub(super) fn record(&self, opcode: u32, nanos: u64) {
        let i = (opcode as usize).min(MAX_OPCODE);
        self.count[i].fetch_add(1, Ordering::Relaxed);
        self.nanos[i].fetch_add(nanos, Ordering::Relaxed);
    }

    /// `{"LOOKUP": {"count": N, "us_each": F}, ...}` for every opcode seen.
    pub(super) fn json(&self) -> String {
        let parts: Vec<String> = (0..=MAX_OPCODE)
            .filter_map(|i| {
                let n = self.count[i].load(Ordering::Relaxed);
                (n > 0).then(|| {
                    let us = self.nanos[i].load(Ordering::Relaxed) as f64 / 1000.0 / n as f64;
                    format!("\"{}\": {{\"count\": {n}, \"us_each\": {us:.2}}}", name(i))
                })
            })
            .collect();
        format!("{{{}}}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_opcode_and_names_them() {
        let s = RequestStats::new();
        s.record(abi::LOOKUP, 3000);
        s.record(abi::LOOKUP, 1000);
        s.record(abi::STATX, 500);
        s.record(999, 1);
        let j = s.json();
        assert!(
            j.contains("\"LOOKUP\": {\"count\": 2, \"us_each\": 2.00}"),
            "{j}"
        );
        assert!(
            j.contains("\"STATX\": {\"count\": 1, \"us_each\": 0.50}"),
            "{j}"
        );
        assert!(j.contains("\"OTHER\": {\"count\": 1"), "{j}");
        assert!(!j.contains("GETATTR"), "{j}");
    }
}
