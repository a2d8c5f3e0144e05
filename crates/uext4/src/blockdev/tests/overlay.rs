use crate::blockdev::*;
use std::sync::Arc;

#[test]
fn overlay_keeps_writes_in_memory_and_reads_them_over_the_device() {
    // A size that is not a whole number of pages, to cover the short last page.
    let size = 3 * OVERLAY_PAGE as usize + 1000;
    let below: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let dev = Arc::new(MemDevice::from_vec(below.clone()));
    let ov = OverlayDevice::new(dev.clone());
    // Across a page boundary, and into the short last page.
    ov.write_at(4000, &[0xaa; 200]).unwrap();
    ov.write_at(3 * OVERLAY_PAGE + 990, &[0xbb; 10]).unwrap();
    assert!(ov.write_at(size as u64 - 5, &[0; 10]).is_err());
    ov.flush().unwrap();
    assert_eq!(dev.to_vec(), below, "the device below was written");
    let mut want = below.clone();
    want[4000..4200].fill(0xaa);
    want[size - 10..].fill(0xbb);
    let mut got = vec![0u8; size];
    ov.read_at(0, &mut got).unwrap();
    assert_eq!(got, want);
    let mut part = vec![0u8; 300];
    ov.read_at(3950, &mut part).unwrap();
    assert_eq!(part, want[3950..4250]);
    assert_eq!(ov.overlaid_bytes(), 2 * OVERLAY_PAGE + 1000);
}
