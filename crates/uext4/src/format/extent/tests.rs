use super::*;

#[test]
fn node_checksum_covers_header_and_all_slots() {
    let mut b = vec![0u8; 1024];
    let max = node_capacity(1024, false);
    assert_eq!(max, 84);
    ExtentHeader {
        magic: EXTENT_MAGIC,
        entries: 1,
        max,
        depth: 0,
        generation: 0,
    }
    .write(&mut b);
    Extent {
        lblk: 0,
        len: 3,
        pblk: 1 << 33,
        unwritten: false,
    }
    .write(&mut b[HEADER_SIZE..HEADER_SIZE + ENTRY_SIZE]);
    set_node_csum(&mut b, 9);
    let t = tail_offset(max);
    assert_eq!(le32(&b, t), crc32c(9, &b[..t]));
    let e = Extent::read(&b[HEADER_SIZE..]);
    assert_eq!((e.len, e.pblk), (3, 1 << 33));
}
