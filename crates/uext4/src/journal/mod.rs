//! jbd2 (in progress)
