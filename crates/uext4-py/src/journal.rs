//! The journal's history for Python: `Filesystem.journal()` gives the transactions the log
//! still holds (uext4's `Fs::journal_history`, as `uext4 journal` prints them), and
//! `Filesystem.logged_inodes(n)` the older copies of an inode found in them.

use pyo3::prelude::*;

/// One filesystem block as a transaction logged it: `state` is "intact", "overwritten" (a
/// later transaction's block lies over it in the log) or "bad_checksum".
#[pyclass(module = "uext4", frozen, get_all)]
#[derive(Clone)]
pub struct LoggedBlock {
    block: u64,
    log_block: u32,
    state: &'static str,
}

#[pymethods]
impl LoggedBlock {
    fn __repr__(&self) -> String {
        format!(
            "uext4.LoggedBlock(block={}, log_block={}, state={:?})",
            self.block, self.log_block, self.state
        )
    }
}

/// A transaction found in the journal's log: its sequence, whether its commit block was
/// found, the commit time in nanoseconds since the epoch (None without one), the blocks it
/// logged and the block numbers it revoked.
#[pyclass(module = "uext4", frozen, get_all)]
pub struct Transaction {
    sequence: u32,
    committed: bool,
    commit_time_ns: Option<u64>,
    blocks: Vec<LoggedBlock>,
    revoked: Vec<u64>,
}

#[pymethods]
impl Transaction {
    fn __repr__(&self) -> String {
        format!(
            "uext4.Transaction(sequence={}, committed={}, blocks={})",
            self.sequence,
            if self.committed { "True" } else { "False" },
            self.blocks.len()
        )
    }
}

impl Transaction {
    pub(crate) fn of(t: &uext4::LoggedTransaction) -> Transaction {
        Transaction {
            sequence: t.sequence,
            committed: t.committed,
            commit_time_ns: t
                .commit_time
                .map(|(s, n)| s.saturating_mul(1_000_000_000).saturating_add(n as u64)),
            blocks: t
                .blocks
                .iter()
                .map(|b| LoggedBlock {
                    block: b.fs_block,
                    log_block: b.log_block,
                    state: match b.state {
                        uext4::LoggedState::Intact => "intact",
                        uext4::LoggedState::Overwritten => "overwritten",
                        uext4::LoggedState::BadChecksum => "bad_checksum",
                    },
                })
                .collect(),
            revoked: t.revoked.clone(),
        }
    }
}
