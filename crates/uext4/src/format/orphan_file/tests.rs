use super::*;
use crate::format::le32;

#[test]
fn tail_holds_magic_and_checksum_over_block_number_and_slots() {
    let mut b = vec![0u8; 1024];
    assert_eq!(entries_per_block(1024), 254);
    put_tail(&mut b, None, 5);
    assert_eq!((le32(&b, 1016), le32(&b, 1020)), (ORPHAN_BLOCK_MAGIC, 0));
    put32(&mut b, 0, 13);
    put_tail(&mut b, Some(3), 5);
    let want = crc32c(crc32c(3, &5u64.to_le_bytes()), &b[..254 * 4]);
    assert_eq!(le32(&b, 1020), want);
    assert_eq!(block_csum(3, 5, &b), want);
}
