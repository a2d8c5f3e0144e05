//! What the fuzz harnesses (fuzz/, scripts/fuzz.sh) found, each input rebuilt here so that the
//! ordinary suite keeps it fixed. docs/FUZZING.md lists the findings.

use uext4::blockdev::MemDevice;
use uext4::partition::{identify, Table};
use uext4::Error;

/// A disk of `sectors` sectors with MBR entries (slot 1-4, type, first sector, sectors) and
/// the boot signature.
fn mbr(sectors: usize, entries: &[(usize, u8, u32, u32)]) -> Vec<u8> {
    let mut v = vec![0u8; sectors * 512];
    for &(slot, sys, lba, n) in entries {
        let o = 446 + 16 * (slot - 1);
        v[o + 4] = sys;
        v[o + 8..o + 12].copy_from_slice(&lba.to_le_bytes());
        v[o + 12..o + 16].copy_from_slice(&n.to_le_bytes());
    }
    v[510] = 0x55;
    v[511] = 0xaa;
    v
}

/// partition, crash-19cc4cf3: an MBR entry with a type but no sectors, at sector 0, beside a
/// damaged GPT header. mbrman's alignment guess found no divisor of 0 and panicked; entries
/// without sectors are unused (as the kernel's msdos parser skips them), so the table holds
/// no partition.
#[test]
fn an_mbr_entry_with_a_type_and_nothing_else_is_no_partition() {
    // The input as found (608 bytes, padded to whole sectors by the harness).
    let mut v = mbr(2, &[(3, 0x24, 0, 0)]);
    v.resize(1536, 0);
    v[0x3f] = 0x03;
    v[0x40] = 0xba;
    let gpt = "4546492050415254000001005c000000122b502f00000000010000000000000\
               07f000000000000002200000000000000";
    v[0x200..0x200 + gpt.len() / 2].copy_from_slice(&uext4_testkit::unhex(gpt));
    let d = MemDevice::from_vec(v);
    match Table::read(&d) {
        Ok(None) => {}
        Err(Error::PartitionTable(m)) => assert!(m.contains("GPT"), "{m}"),
        other => panic!("expected no table or a damaged GPT, got {other:?}"),
    }
    let _ = identify(&d);
    // The same entry alone, and in every slot.
    let d = MemDevice::from_vec(mbr(4, &[(1, 0x83, 0, 0), (4, 0x05, 0, 0)]));
    assert!(Table::read(&d).unwrap().is_none());
}

/// An MBR partition with sectors that starts at sector 0 lies over the table itself: refused,
/// naming it (mbrman panicked on it too).
#[test]
fn an_mbr_partition_over_the_table_is_refused() {
    let d = MemDevice::from_vec(mbr(64, &[(2, 0x83, 0, 20)]));
    match Table::read(&d) {
        Err(Error::PartitionTable(m)) => {
            assert!(m.contains("partition 2") && m.contains("sector 0"), "{m}")
        }
        other => panic!("expected a refused table, got {other:?}"),
    }
    // Beside a good one, still refused; the good one alone is read.
    let d = MemDevice::from_vec(mbr(64, &[(1, 0x83, 8, 8), (2, 0x83, 0, 20)]));
    assert!(matches!(Table::read(&d), Err(Error::PartitionTable(_))));
    let d = MemDevice::from_vec(mbr(64, &[(1, 0x83, 8, 8)]));
    assert_eq!(Table::read(&d).unwrap().unwrap().partitions.len(), 1);
}
