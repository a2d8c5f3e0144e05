//! The in-memory extent cache (the kernel's extent status tree, extents_status.c): every
//! mapped run of one file, keyed by first logical block, loaded once from the extent tree or
//! the indirect block map and kept in step with it by every change (DESIGN.md R1).
//!
//! A state subsystem: it knows extents, not where they are stored, so it imports no
//! filesystem operations.

use crate::format::extent::{Extent, MAX_INIT_LEN};
use crate::format::inode::{RawInode, FL_EXTENTS};
use std::collections::BTreeMap;

/// Every extent of one file, keyed by first logical block.
#[derive(Clone, Debug, Default)]
pub struct ExtentCache {
    pub map: BTreeMap<u32, Extent>,
    /// The file uses the indirect block map, not an extent tree.
    pub blockmap: bool,
}

impl ExtentCache {
    pub fn empty() -> Self {
        Self::default()
    }

    /// The cache of a new inode with nothing mapped yet: an indirect block map unless `raw`
    /// has the extents flag (set up by `Fs::init_block_map`).
    pub fn unmapped(raw: &RawInode) -> Self {
        Self {
            blockmap: raw.flags() & FL_EXTENTS == 0,
            ..Self::default()
        }
    }

    /// The extent containing `lblk`.
    pub fn lookup(&self, lblk: u32) -> Option<Extent> {
        let (_, e) = self.map.range(..=lblk).next_back()?;
        if (lblk as u64) < e.end() {
            Some(*e)
        } else {
            None
        }
    }
    /// The last extent that starts at or before `lblk` (containing it or before it).
    pub fn prev(&self, lblk: u32) -> Option<Extent> {
        self.map.range(..=lblk).next_back().map(|(_, e)| *e)
    }
    /// The first extent ending after `lblk`.
    pub fn next(&self, lblk: u32) -> Option<Extent> {
        if let Some(e) = self.lookup(lblk) {
            return Some(e);
        }
        self.map.range(lblk..).next().map(|(_, e)| *e)
    }

    /// Adds written extent `e` (over a hole), joined with physically contiguous written
    /// neighbours while the joined length stays within an extent's limit.
    pub(crate) fn insert_joined(&mut self, e: Extent) {
        let map = &mut self.map;
        let mut x = e;
        if let Some(left) = x.lblk.checked_sub(1).and_then(|b| {
            let (_, l) = map.range(..=b).next_back()?;
            (l.end() == x.lblk as u64 && l.pblk + l.len as u64 == x.pblk).then_some(*l)
        }) {
            if left.len + x.len <= MAX_INIT_LEN {
                map.remove(&left.lblk);
                x = Extent {
                    len: left.len + x.len,
                    ..left
                };
            }
        }
        if let Some(right) = map.get(&(x.end() as u32)).copied() {
            if x.end() < 1 << 32
                && x.pblk + x.len as u64 == right.pblk
                && x.len + right.len <= MAX_INIT_LEN
            {
                map.remove(&right.lblk);
                x.len += right.len;
            }
        }
        map.insert(x.lblk, x);
    }

    /// Removes logical blocks `[start, end)`, trimming and splitting extents.
    pub(crate) fn cut(&mut self, start: u64, end: u64) {
        let map = &mut self.map;
        if start >= end {
            return;
        }
        // Only the extent holding `start` (if any) and those that begin before `end` can meet the
        // range: a walk of the whole map made every conversion of a fragmented file O(extents).
        let s = u32::try_from(start).unwrap_or(u32::MAX);
        let from = map.range(..=s).next_back().map_or(s, |(&k, _)| k);
        let hit: Vec<Extent> = map
            .range(from..)
            .take_while(|(&k, _)| (k as u64) < end)
            .map(|(_, e)| *e)
            .filter(|e| e.end() > start)
            .collect();
        for x in hit {
            map.remove(&x.lblk);
            if (x.lblk as u64) < start {
                let e = Extent {
                    len: (start - x.lblk as u64) as u32,
                    ..x
                };
                map.insert(e.lblk, e);
            }
            if x.end() > end {
                let e = Extent {
                    lblk: end as u32,
                    len: (x.end() - end) as u32,
                    pblk: x.pblk + (end - x.lblk as u64),
                    unwritten: x.unwritten,
                };
                map.insert(e.lblk, e);
            }
        }
    }
}
