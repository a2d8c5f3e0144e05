use super::*;

#[test]
fn fields_and_checksum() {
    let mut m = MmpBlock::from_bytes(&[]);
    m.set_magic(MMP_MAGIC);
    m.set_seq(MMP_SEQ_CLEAN);
    m.set_time(0x1_0000_0002);
    m.set_nodename(&"n".repeat(100));
    m.set_bdevname("loop0");
    m.set_check_interval(5);
    assert_eq!(&m.bytes()[..4], b"PMM\0");
    assert_eq!(m.nodename().len(), 63);
    assert_eq!(m.bdevname(), "loop0");
    assert_eq!(m.time(), 0x1_0000_0002);
    assert_eq!(m.bytes()[0x70], 5);
    assert!(m.verify_csum(None));
    m.set_csum(Some(0x1234));
    assert!(m.verify_csum(Some(0x1234)));
    m.set_seq(1);
    assert!(!m.verify_csum(Some(0x1234)));
}
