//! (being written) The extent tree and the in-memory extent cache.
use crate::format::extent::Extent;
use std::collections::BTreeMap;

/// Every extent of one file, keyed by first logical block.
#[derive(Clone, Debug, Default)]
pub struct ExtentCache {
    pub map: BTreeMap<u32, Extent>,
}
impl ExtentCache {
    pub fn empty() -> Self {
        Self::default()
    }
}
