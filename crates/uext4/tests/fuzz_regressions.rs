//! What the fuzz harnesses (fuzz/, scripts/fuzz.sh) found, each input rebuilt here so that the
//! ordinary suite keeps it fixed. docs/FUZZING.md lists the findings.

use std::sync::Arc;
use uext4::blockdev::{BlockDevice, MemDevice, RegionDevice};
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
/// naming it (mbrman, which read MBRs then, panicked on it too).
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

/// An EBR at `sector` of `v`: its logical partition (type, first sector from the EBR) and the
/// link to the next EBR (first sector from the extended partition's start; 0: the last).
fn ebr(v: &mut [u8], sector: usize, sys: u8, lba: u32, n: u32, next: u32) {
    let b = sector * 512;
    v[b + 446 + 4] = sys;
    v[b + 446 + 8..b + 446 + 12].copy_from_slice(&lba.to_le_bytes());
    v[b + 446 + 12..b + 446 + 16].copy_from_slice(&n.to_le_bytes());
    if next != 0 {
        v[b + 462 + 4] = 0x05;
        v[b + 462 + 8..b + 462 + 12].copy_from_slice(&next.to_le_bytes());
        v[b + 462 + 12..b + 462 + 16].copy_from_slice(&1u32.to_le_bytes());
    }
    v[b + 510] = 0x55;
    v[b + 511] = 0xaa;
}

/// partition, crash-823c1c6e: a logical partition whose first sector, counted from its EBR,
/// passes 2^32 (0xfffffff5 from an EBR at sector 32). mbrman added the two in 32 bits: a panic
/// with overflow checks, a wrong partition without. The MBR is read here now (partition/mbr.rs),
/// in 64 bits: the partition is where its numbers say, past the disk, and its region is
/// refused.
#[test]
fn a_logical_partition_past_2_to_the_32_sectors_is_where_it_says() {
    let mut v = mbr(64, &[(1, 0x05, 32, 32)]);
    ebr(&mut v, 32, 0x83, 0xffff_fff5, 10, 0);
    let d: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_vec(v));
    let t = Table::read(&*d).unwrap().unwrap();
    let p = t.get(5).expect("the logical partition");
    assert_eq!(p.start, (32 + 0xffff_fff5u64) * 512);
    assert!(RegionDevice::new(d, t.region_of(5).unwrap()).is_err());
    // The extended partition and a good logical one beside it still read.
    let mut v = mbr(64, &[(1, 0x05, 32, 32)]);
    ebr(&mut v, 32, 0x83, 2, 10, 16);
    ebr(&mut v, 48, 0x83, 2, 10, 0);
    let t = Table::read(&MemDevice::from_vec(v)).unwrap().unwrap();
    let starts: Vec<(u32, u64)> = t
        .partitions
        .iter()
        .map(|p| (p.number, p.start / 512))
        .collect();
    assert_eq!(starts, [(1, 32), (5, 34), (6, 50)]);
}

/// A chain of EBRs that links back (the second EBR names the first): refused as a loop, not
/// followed.
#[test]
fn an_ebr_chain_that_links_back_is_refused() {
    let mut v = mbr(64, &[(1, 0x05, 32, 32)]);
    ebr(&mut v, 32, 0x83, 2, 4, 16);
    ebr(&mut v, 48, 0x83, 2, 4, 8);
    match Table::read(&MemDevice::from_vec(v)) {
        Err(Error::PartitionTable(m)) => assert!(m.contains("loop"), "{m}"),
        other => panic!("expected the chain refused, got {other:?}"),
    }
}

/// image_write, crash-7e554a5e: a group descriptor whose free count is smaller than the free
/// run the block bitmap shows. The allocator took the run and subtracted it from the count,
/// which overflowed (a panic with the fuzz build's overflow checks, a wrapped count on disk
/// in a release build). Now the allocation is refused as a damaged bitmap, naming the group,
/// and no block is taken (e2fsck finds only the counts debugfs damaged).
#[test]
fn a_group_free_count_below_the_bitmap_is_refused_not_wrapped() {
    use uext4::{Fs, MountOptions};
    use uext4_testkit::{mke2fs, scratch};
    let img = scratch("fuzz-free-count");
    mke2fs(&img.0, "16M", &[]);
    debugfs_w(
        &img.0,
        &["set_bg 0 free_blocks_count 2", "set_bg 0 checksum calc"],
    );
    let opts = MountOptions {
        commit_interval_secs: 0,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&img.0, opts).unwrap();
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    match fs.write(f, 0, &vec![7u8; 64 << 10]) {
        Err(Error::Corrupt { detail, .. }) => {
            assert!(
                detail.contains("group 0") && detail.contains("free count"),
                "{detail}"
            )
        }
        other => panic!("expected a refused allocation, got {other:?}"),
    }
    let _ = fs.unmount();
    drop(fs);
    // e2fsck finds the damaged counts (the superblock's too, which the open summed from the
    // groups as the kernel's mount does), nothing else: no block was taken.
    let o = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&img.0)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    for l in out.lines() {
        let fine = l.is_empty()
            || l.starts_with("Pass ")
            || l.starts_with("Fix? no")
            || l.contains("Free blocks count wrong")
            || l.contains(".img");
        assert!(fine, "e2fsck: {l}\n{out}");
    }
}

/// image_read, crash-fa14cf7c: a group descriptor (64-bit) naming its block bitmap at a
/// block near 2^64. The check that the bitmap lies inside the filesystem summed the block
/// and its length, which overflowed (a panic with the fuzz build's overflow checks; in a
/// release build the sum wrapped to a small number and the check passed). The open is now
/// refused naming the group and the block.
#[test]
fn a_group_bitmap_near_2_to_the_64_is_refused() {
    use uext4::{Fs, MountOptions};
    use uext4_testkit::{mke2fs, scratch};
    let img = scratch("fuzz-bitmap-wrap");
    mke2fs(&img.0, "16M", &[]);
    debugfs_w(
        &img.0,
        &[
            "set_bg 0 block_bitmap 0xffffffffffffffff",
            "set_bg 0 checksum calc",
        ],
    );
    match Fs::open_path(&img.0, MountOptions::ro()) {
        Err(Error::Corrupt { detail, .. }) => assert!(
            detail.contains("group 0") && detail.contains("18446744073709551615"),
            "{detail}"
        ),
        Err(e) => panic!("expected the descriptor refused, got {e}"),
        Ok(_) => panic!("expected the descriptor refused, the image opened"),
    }
}

/// Runs each of `cmds` with `debugfs -w` on `img` (a damaged field, as a fuzzer found it).
fn debugfs_w(img: &std::path::Path, cmds: &[&str]) {
    for cmd in cmds {
        let o = std::process::Command::new("debugfs")
            .args(["-w", "-R", cmd])
            .arg(img)
            .output()
            .expect("debugfs (e2fsprogs)");
        assert!(o.status.success(), "debugfs {cmd}");
    }
}
