//! FUSE server (in progress)
