//! The engine's integration tests take their helpers (scratch images, e2fsck, mount-option
//! presets, stats deltas, a failing device) from the shared test kit.
#![allow(unused_imports)]

pub use uext4_testkit::*;
