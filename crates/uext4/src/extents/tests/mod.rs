//! Tests of the block mapping: the cache alone, the tree and the indirect map through the
//! dispatch point against models, e2fsprogs and the kernel.

use super::ExtentCache;
use crate::error::{Error, Result};
use crate::format::extent::*;
use crate::format::{le32, put32};
use crate::fs::Fs;
use std::collections::BTreeMap;

mod cache;
mod corruption;
mod image;
mod indirect;
mod kernel;
mod merge;
mod model;
