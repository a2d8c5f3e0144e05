//! The blocks that belong to the filesystem's own structures (the kernel's block_validity.c,
//! its "system zone"): every group's superblock copy and descriptor blocks, reserved GDT
//! blocks, block and inode bitmaps and inode table, and the journal's blocks. No file may map
//! them: an extent, an indirect pointer or an xattr block that names one is corruption, and is
//! refused when it is read, before a write through it or a free of it could destroy the
//! structures (a damaged extent pointing at the inode table, freed by an unlink, let the next
//! allocations overwrite every inode); and an allocation that a damaged bitmap would place on
//! them is refused too.

use crate::geometry::Geometry;
use std::collections::BTreeMap;

/// Disjoint ranges of system blocks: start -> end (exclusive).
#[derive(Default)]
pub struct SystemZone(BTreeMap<u64, u64>);

impl SystemZone {
    /// The zone of a filesystem with this geometry and these group tables (block bitmap,
    /// inode bitmap, inode table of each group).
    pub fn new(geo: &Geometry, tables: &[[u64; 3]]) -> SystemZone {
        let itb =
            (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size as u64);
        let mut ranges = Vec::with_capacity(tables.len() * 4);
        for (g, &[bb, ib, it]) in tables.iter().enumerate() {
            let first = geo.group_first_block(g as u32);
            let overhead = geo.group_overhead(g as u32) as u64;
            if overhead > 0 {
                ranges.push((first, first + overhead));
            }
            ranges.push((bb, bb + 1));
            ranges.push((ib, ib + 1));
            ranges.push((it, it + itb));
        }
        // Block 0 holds the boot sector and, with 4 KiB blocks, the superblock.
        ranges.push((0, geo.first_data_block + 1));
        let mut z = SystemZone::default();
        z.add(ranges);
        z
    }

    /// Adds ranges (start, end), merging them with what is there.
    pub fn add(&mut self, more: Vec<(u64, u64)>) {
        let mut all: Vec<(u64, u64)> = self.0.iter().map(|(&s, &e)| (s, e)).collect();
        all.extend(more.into_iter().filter(|r| r.0 < r.1));
        all.sort_unstable();
        let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
        let mut cur: Option<(u64, u64)> = None;
        for (s, e) in all {
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some(c) => {
                    merged.insert(c.0, c.1);
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some(c) = cur {
            merged.insert(c.0, c.1);
        }
        self.0 = merged;
    }

    /// The system range that `[start, end)` overlaps, if any.
    pub fn overlap(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.0.range(..end).next_back()?;
        (e > start).then_some((s, e))
    }

    /// The parts of the system ranges inside `[start, end)`.
    pub fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let from = self
            .0
            .range(..=start)
            .next_back()
            .filter(|r| *r.1 > start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        self.0
            .range(from..end)
            .map(move |(&s, &e)| (s.max(start), e.min(end)))
    }

    #[cfg(test)]
    pub fn ranges(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::SystemZone;

    #[test]
    fn ranges_merge_and_overlaps_are_found() {
        let mut z = SystemZone::default();
        z.add(vec![(10, 12), (12, 15), (20, 21), (5, 6), (14, 16)]);
        assert_eq!(z.ranges(), 3);
        assert_eq!(z.overlap(0, 5), None);
        assert_eq!(z.overlap(0, 6), Some((5, 6)));
        assert_eq!(z.overlap(6, 10), None);
        assert_eq!(z.overlap(15, 16), Some((10, 16)));
        assert_eq!(z.overlap(16, 20), None);
        assert_eq!(z.overlap(17, 100), Some((20, 21)));
        assert_eq!(z.overlap(21, 100), None);
        let w: Vec<_> = z.within(11, 21).collect();
        assert_eq!(w, vec![(11, 16), (20, 21)]);
        assert_eq!(z.within(16, 20).count(), 0);
    }
}
