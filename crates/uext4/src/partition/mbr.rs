//! The MBR (DOS) partition table and its extended partition's chain of EBRs, read here rather
//! than by a crate: every number in it comes from the disk, so sums are made in 64 bits and the
//! chain is bounded (the fuzz harness found `mbrman` panicking on both an overflowing logical
//! partition start and a table whose used entries all start at sector 0; docs/FUZZING.md).

use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};

/// One slot of a table (the MBR's four, or an EBR's first two), as stored: type, first sector
/// (relative to what the slot's table counts from), sectors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub sys: u8,
    pub start: u64,
    pub sectors: u64,
}

impl Entry {
    fn parse(e: &[u8]) -> Entry {
        Entry {
            sys: e[4],
            start: u32::from_le_bytes([e[8], e[9], e[10], e[11]]) as u64,
            sectors: u32::from_le_bytes([e[12], e[13], e[14], e[15]]) as u64,
        }
    }
    /// Whether the slot holds a partition: a type and sectors (the kernel's msdos parser skips
    /// a slot without sectors).
    pub fn used(&self) -> bool {
        self.sys != 0 && self.sectors != 0
    }
    /// An extended partition (DOS, Windows LBA, Linux): the container of the logical ones.
    pub fn extended(&self) -> bool {
        matches!(self.sys, 0x05 | 0x0f | 0x85)
    }
}

/// More logical partitions than this is taken for damage (Linux numbers at most 256 in all).
const LOGICAL_MAX: usize = 256;

/// The four slots of the sector at `lba` and whether it ends in the boot signature.
fn sector(dev: &dyn BlockDevice, lba: u64) -> Result<Option<[Entry; 4]>> {
    let mut b = [0u8; 512];
    let off = lba.checked_mul(512).filter(|&o| o + 512 <= dev.size());
    let Some(off) = off else { return Ok(None) };
    dev.read_at(off, &mut b)?;
    if b[510..512] != [0x55, 0xaa] {
        return Ok(None);
    }
    let e = |i: usize| Entry::parse(&b[446 + 16 * i..462 + 16 * i]);
    Ok(Some([e(0), e(1), e(2), e(3)]))
}

/// Every partition, numbered as fdisk numbers them: primaries by slot (1-4), logical ones
/// from 5 in chain order; each with its absolute first sector. None without a boot signature.
pub(super) fn read(dev: &dyn BlockDevice) -> Result<Option<Vec<(u32, Entry)>>> {
    let damaged =
        |why: String| Error::PartitionTable(format!("the MBR partition table is damaged: {why}"));
    let Some(primaries) = sector(dev, 0)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, e) in primaries.iter().enumerate() {
        if !e.used() {
            continue;
        }
        if e.start == 0 {
            return Err(Error::PartitionTable(format!(
                "MBR partition {} starts at sector 0, over the partition table",
                i + 1
            )));
        }
        out.push((i as u32 + 1, *e));
    }
    let Some(ext) = out.iter().map(|p| p.1).find(Entry::extended) else {
        return Ok(Some(out));
    };
    // Each EBR: its first slot a logical partition (from the EBR's own sector), its second the
    // next EBR (from the extended partition's start), which must lie further on.
    let mut rel = 0u64;
    for n in 0.. {
        if n == LOGICAL_MAX {
            return Err(damaged(format!(
                "more than {LOGICAL_MAX} logical partitions"
            )));
        }
        let at = ext.start + rel;
        let Some(ebr) = sector(dev, at)? else {
            if n == 0 {
                // An empty extended partition need not hold an EBR.
                break;
            }
            return Err(damaged(format!("no EBR at sector {at}")));
        };
        let (part, next) = (ebr[0], ebr[1]);
        if part.used() {
            let start = Entry {
                start: at + part.start,
                ..part
            };
            out.push((5 + n as u32, start));
        }
        if next.start == 0 {
            break;
        }
        if next.start <= rel {
            return Err(damaged(format!(
                "the EBR at sector {at} links back to sector {} (a loop)",
                ext.start + next.start
            )));
        }
        rel = next.start;
    }
    Ok(Some(out))
}
