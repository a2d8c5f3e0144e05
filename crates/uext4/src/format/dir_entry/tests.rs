use super::*;

#[test]
fn entry_roundtrip_and_types() {
    let mut b = vec![0u8; 1024];
    put_dirent(&mut b, 12, 77, 24, b"hello", FT_REG);
    let e = DirEntryRef { block: &b, off: 12 };
    assert_eq!(
        (
            e.inode(),
            e.rec_len(),
            e.name_len(),
            e.file_type(),
            e.name()
        ),
        (77, 24, 5, FT_REG, &b"hello"[..])
    );
    assert_eq!(rec_len_for(1), 12);
    assert_eq!(rec_len_for(4), 12);
    assert_eq!(rec_len_for(5), 16);
    assert_eq!(rec_len_for(255), 264);
    assert_eq!(ftype_from_mode(0o100644), FT_REG);
    assert_eq!(ftype_from_mode(0o040755), FT_DIR);
    assert_eq!(ftype_from_mode(0o120777), FT_SYMLINK);
    assert_eq!(ftype_from_mode(0o020000), FT_CHRDEV);
    assert_eq!(ftype_from_mode(0o060000), FT_BLKDEV);
    assert_eq!(ftype_from_mode(0o010000), FT_FIFO);
    assert_eq!(ftype_from_mode(0o140000), FT_SOCK);
    assert_eq!(ftype_from_mode(0), FT_UNKNOWN);
    assert!(!has_tail(&b));
    put_tail(&mut b, 0xdead_beef);
    assert!(has_tail(&b));
    assert_eq!(tail_csum(&b), 0xdead_beef);
    assert_eq!(rec_len_from_disk(0, 65536), 65536);
    assert_eq!(rec_len_from_disk(65535, 65536), 65536);
    assert_eq!(rec_len_from_disk(0, 4096), 0);
    assert_eq!(rec_len_to_disk(65536), 65535);
    // A name past the block end is clamped, not a panic.
    let mut c = vec![0u8; 16];
    c[6] = 200;
    assert_eq!(DirEntryRef { block: &c, off: 0 }.name().len(), 8);
}

#[test]
fn tail_checksum_covers_the_block_before_the_tail() {
    let mut b = vec![0u8; 1024];
    put_dirent(&mut b, 0, 2, 1012, b".", FT_DIR);
    set_tail_csum(&mut b, 7);
    assert!(has_tail(&b));
    let want = crate::format::csum::crc32c(7, &b[..1012]);
    assert_eq!(tail_csum(&b), want);
}
