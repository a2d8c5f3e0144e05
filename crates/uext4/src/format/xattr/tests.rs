use super::*;

fn vfs(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    acl_to_vfs(
        &entries
            .iter()
            .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
            .collect::<Vec<_>>(),
    )
}

#[test]
fn names() {
    assert_eq!(split_name(b"user.foo").unwrap(), (1, &b"foo"[..]));
    assert_eq!(
        split_name(b"system.posix_acl_access").unwrap(),
        (2, &b""[..])
    );
    assert_eq!(
        split_name(b"system.posix_acl_default").unwrap(),
        (3, &b""[..])
    );
    for internal in [&b"system.data"[..], b"system.richacl", b"system.foo"] {
        assert!(matches!(split_name(internal), Err(Error::NotSupported(_))));
    }
    assert_eq!(join_name(INDEX_SYSTEM, b"data"), None);
    assert_eq!(
        split_name(b"security.selinux").unwrap(),
        (6, &b"selinux"[..])
    );
    assert!(matches!(
        split_name(b"bogus.x"),
        Err(Error::NotSupported(_))
    ));
    assert!(matches!(split_name(b"user."), Err(Error::Invalid(_))));
    let long = [b"user.".to_vec(), vec![b'a'; 251]].concat();
    assert!(matches!(split_name(&long), Err(Error::NameTooLong)));
    assert!(split_name(&long[..255]).is_ok());
    assert_eq!(join_name(6, b"selinux").unwrap(), b"security.selinux");
    assert_eq!(join_name(2, b"").unwrap(), b"system.posix_acl_access");
    assert_eq!(join_name(5, b"x"), None);
}

#[test]
fn entry_hash_matches_kernel_formula() {
    // Worked by hand: name "a" -> 0x61; value "b" (padded to 4) -> 0x61 << 16 ^ 0x62.
    let e = XattrEntry {
        index: 1,
        name: b"a".to_vec(),
        value: b"b".to_vec(),
        ea: None,
    };
    assert_eq!(e.hash(), 0x0061_0062);
    assert_eq!(block_hash(std::slice::from_ref(&e)), 0x0061_0062);
}

#[test]
fn entries_roundtrip_and_bounds() {
    let entries = vec![
        XattrEntry {
            index: 1,
            name: b"x".to_vec(),
            value: b"hello".to_vec(),
            ea: None,
        },
        XattrEntry {
            index: 4,
            name: b"empty".to_vec(),
            value: vec![],
            ea: None,
        },
    ];
    let blk = build_block(1024, &entries, 77, Some(0x1234));
    assert_eq!(parse_block(&blk, 77, Some(0x1234), "t").unwrap(), entries);
    assert!(matches!(
        parse_block(&blk, 78, Some(0x1234), "t"),
        Err(Error::BadChecksum {
            kind: Corruption::Xattr,
            ..
        })
    ));
    // A value offset pointing into the entry list is corrupt, not a panic.
    let mut bad = blk.clone();
    put16(&mut bad, BLOCK_HEADER_LEN + 2, 8);
    assert!(matches!(
        parse_block(&bad, 77, None, "t"),
        Err(Error::Corrupt {
            kind: Corruption::Xattr,
            ..
        })
    ));
    // Value size running off the end.
    let mut bad = blk.clone();
    put32(&mut bad, BLOCK_HEADER_LEN + 8, 5000);
    assert!(matches!(
        parse_block(&bad, 77, None, "t"),
        Err(Error::Corrupt {
            kind: Corruption::Xattr,
            ..
        })
    ));
    // An ea_inode value: the entry names its inode, size and hash, and holds no bytes.
    let mut ea = blk.clone();
    put32(&mut ea, BLOCK_HEADER_LEN + 4, 12);
    let parsed = parse_block(&ea, 77, None, "t").unwrap();
    let r = parsed[0].ea.expect("an EA inode reference");
    assert_eq!((r.inum, r.hash), (12, le32(&ea, BLOCK_HEADER_LEN + 12)));
    assert_eq!(r.size as usize, parsed[0].value_size());
    assert!(parsed[0].value.is_empty());
    assert_eq!(parsed[0].value_len(), 0);
    // No terminator: every byte non-zero.
    let garbage = vec![0xffu8; 100];
    assert!(parse_entries(&garbage, 4, 4, "t").is_err());
    // Random garbage never panics.
    let mut seed = 1u32;
    for _ in 0..2000 {
        let mut area = vec![0u8; 96];
        for b in area.iter_mut() {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *b = (seed >> 16) as u8 & if seed & 0x100 != 0 { 0xff } else { 0x1f };
        }
        let _ = parse_entries(&area, 4, 4, "t");
    }
}

#[test]
fn acl_conversions() {
    let v = vfs(&[
        (ACL_USER_OBJ, 6, u32::MAX),
        (ACL_USER, 6, 1000),
        (ACL_GROUP_OBJ, 4, u32::MAX),
        (ACL_GROUP, 5, 50),
        (ACL_MASK, 7, u32::MAX),
        (ACL_OTHER, 0, u32::MAX),
    ]);
    let acl = acl_from_vfs(&v).unwrap().unwrap();
    let d = acl_to_disk(&acl);
    assert_eq!(d.len(), 4 + 4 + 8 + 4 + 8 + 4 + 4);
    assert_eq!(acl_to_vfs(&acl_from_disk(&d).unwrap()), v);
    // Minimal ACL without a mask.
    let v = vfs(&[
        (ACL_USER_OBJ, 7, u32::MAX),
        (ACL_GROUP_OBJ, 5, u32::MAX),
        (ACL_OTHER, 5, u32::MAX),
    ]);
    assert!(acl_from_vfs(&v).unwrap().is_some());
    // Empty: remove.
    assert_eq!(acl_from_vfs(&2u32.to_le_bytes()).unwrap(), None);
    assert_eq!(acl_from_vfs(&[]).unwrap(), None);
    // Malformed ones.
    for bad in [
        vec![1, 2, 3],
        1u32.to_le_bytes().to_vec(),
        // named user but no mask
        vfs(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_USER, 6, 1000),
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]),
        // out of order
        vfs(&[
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]),
        // bad perm
        vfs(&[
            (ACL_USER_OBJ, 8, u32::MAX),
            (ACL_GROUP_OBJ, 4, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]),
        // unknown tag
        vfs(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (0x40, 4, u32::MAX),
            (ACL_OTHER, 0, u32::MAX),
        ]),
        // missing other
        vfs(&[(ACL_USER_OBJ, 6, u32::MAX), (ACL_GROUP_OBJ, 4, u32::MAX)]),
    ] {
        assert!(
            matches!(acl_from_vfs(&bad), Err(Error::Invalid(_))),
            "{bad:?} accepted"
        );
    }
    assert!(acl_from_disk(&[1, 0, 0, 0, 2, 0, 6]).is_err());
    assert!(acl_from_disk(&[2, 0, 0, 0]).is_err());
}

#[test]
fn ea_entry_hashes() {
    // Plain names hash alike both ways; the name's bytes, then the value hash as one word.
    assert_eq!(
        ea_entry_hash(b"big", 0x1234),
        ea_entry_hash_signed(b"big", 0x1234)
    );
    let manual = {
        let mut h = 0u32;
        for &c in b"big" {
            h = h.rotate_left(5) ^ c as u32;
        }
        h.rotate_left(16) ^ 0x1234
    };
    assert_eq!(ea_entry_hash(b"big", 0x1234), manual);
    // A byte from 0x80 differs: sign-extended in the old form.
    assert_ne!(ea_entry_hash(b"\xff", 7), ea_entry_hash_signed(b"\xff", 7));
    assert_eq!(
        ea_entry_hash_signed(b"\xff", 7),
        0xffff_ffffu32.rotate_left(16) ^ 7
    );
}
