use super::*;
#[test]
fn crc32c_matches_standard_with_inversions() {
    // Standard CRC-32C of "123456789" is 0xE3069283.
    assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
}
#[test]
fn crc16_known_value() {
    // CRC-16/ARC of "123456789" is 0xBB3D.
    assert_eq!(crc16(0, b"123456789"), 0xBB3D);
}
