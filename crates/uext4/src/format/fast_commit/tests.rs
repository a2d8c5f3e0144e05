//! The scan rules on hand-built areas: which fast commits count.

use super::*;

const BS: usize = 1024;

/// One fast commit in one block: `records` (tag, value), then a TAIL for `tid` whose length
/// runs to the block's end and whose crc is right unless `bad_crc`.
fn fc_block(records: &[(u16, Vec<u8>)], tid: u32, bad_crc: bool) -> Vec<u8> {
    let mut b = Vec::new();
    for (tag, v) in records {
        encode(&mut b, *tag, v);
    }
    let start = b.len();
    let tail_len = BS - start - TL_SIZE;
    b.extend_from_slice(&TAG_TAIL.to_le_bytes());
    b.extend_from_slice(&(tail_len as u16).to_le_bytes());
    b.extend_from_slice(&tid.to_le_bytes());
    let crc = crc32c(0, &b[..start + TL_SIZE + 4]) ^ bad_crc as u32;
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(BS, 0);
    b
}

fn head(tid: u32) -> (u16, Vec<u8>) {
    let mut v = 0u32.to_le_bytes().to_vec();
    v.extend_from_slice(&tid.to_le_bytes());
    (TAG_HEAD, v)
}

fn inode(ino: u32) -> (u16, Vec<u8>) {
    let mut v = ino.to_le_bytes().to_vec();
    v.resize(4 + 160, 0xab);
    (TAG_INODE, v)
}

fn del_range(ino: u32, lblk: u32, len: u32) -> (u16, Vec<u8>) {
    let v = [ino, lblk, len]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    (TAG_DEL_RANGE, v)
}

#[test]
fn whole_fast_commits_are_found_and_a_torn_one_ends_the_scan() {
    let area = vec![
        fc_block(&[head(7), inode(12)], 7, false),
        fc_block(&[del_range(12, 3, 4)], 7, false),
        fc_block(&[inode(13)], 7, true),
        fc_block(&[inode(14)], 7, false),
    ];
    let fc = scan(&area, 7).unwrap();
    assert_eq!(fc.commits, 2);
    assert_eq!(fc.blocks, 2);
    let names: Vec<_> = fc.records.iter().map(|r| r.tag_name()).collect();
    assert_eq!(names, ["HEAD", "INODE", "TAIL", "DEL_RANGE", "TAIL"]);
    assert_eq!(
        fc.records[3],
        FcRecord::DelRange {
            ino: 12,
            lblk: 3,
            len: 4
        }
    );
}

#[test]
fn stale_or_absent_fast_commits_replay_nothing() {
    // Another transaction's HEAD: stale records of an earlier one.
    let area = vec![fc_block(&[head(6), inode(12)], 6, false)];
    assert!(scan(&area, 7).unwrap().is_empty());
    // No HEAD first: nothing.
    let area = vec![fc_block(&[inode(12)], 7, false)];
    assert!(scan(&area, 7).unwrap().is_empty());
    assert!(scan(&[vec![0u8; BS]], 7).unwrap().is_empty());
    assert!(scan(&[], 7).unwrap().is_empty());
    // Zeros after a good fast commit end the scan (tag 0 is no tag).
    let area = vec![fc_block(&[head(7)], 7, false), vec![0u8; BS]];
    assert_eq!(scan(&area, 7).unwrap().commits, 1);
}

#[test]
fn a_bad_first_tail_or_unknown_feature_is_refused() {
    let area = vec![fc_block(&[head(7), inode(12)], 7, true)];
    let e = scan(&area, 7).unwrap_err();
    assert!(matches!(e, Error::BadChecksum { .. }), "{e}");
    let mut h = head(7);
    h.1[0] = 1;
    let e = scan(&[fc_block(&[h], 7, false)], 7).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    // A record that runs past its block before any good TAIL.
    let mut b = fc_block(&[head(7)], 7, false);
    b[HEAD_SIZE + TL_SIZE + 2..HEAD_SIZE + TL_SIZE + 4].copy_from_slice(&4000u16.to_le_bytes());
    let e = scan(&[b], 7).unwrap_err();
    assert!(e.to_string().contains("runs past the block"), "{e}");
}

#[test]
fn records_decode_by_tag_and_length() {
    let mut v = 5u32.to_le_bytes().to_vec();
    let mut ex = [0u8; 12];
    Extent {
        lblk: 2,
        len: 3,
        pblk: 0x1_0000_0010,
        unwritten: true,
    }
    .write(&mut ex);
    v.extend_from_slice(&ex);
    assert_eq!(
        decode(TAG_ADD_RANGE, &v),
        Some(FcRecord::AddRange {
            ino: 5,
            extent: Extent {
                lblk: 2,
                len: 3,
                pblk: 0x1_0000_0010,
                unwritten: true
            }
        })
    );
    assert_eq!(decode(TAG_ADD_RANGE, &v[..15]), None);
    let mut d = 2u32.to_le_bytes().to_vec();
    d.extend_from_slice(&12u32.to_le_bytes());
    assert_eq!(decode(TAG_LINK, &d), None, "a name is needed");
    d.extend_from_slice(b"f1");
    assert_eq!(
        decode(TAG_UNLINK, &d),
        Some(FcRecord::Unlink(DentryInfo {
            parent: 2,
            ino: 12,
            name: b"f1".to_vec()
        }))
    );
    assert_eq!(decode(0, &[]), None);
    assert_eq!(decode(10, &[0; 8]), None);
}

/// The encoder's blocks scan back to exactly its records, across PADs and several fast
/// commits; the same blocks under another tid replay nothing; a torn second fast commit (its
/// last block lost) leaves the first.
#[test]
fn encoded_fast_commits_scan_back_whole() {
    let mut e = FcEncoder::new(BS);
    e.head(7);
    let mut want = vec![FcRecord::Head {
        features: 0,
        tid: 7,
    }];
    for i in 0..9u32 {
        let (tag, v) = inode(100 + i);
        assert!(e.add(tag, &v));
        want.push(decode(tag, &v).unwrap());
    }
    e.tail(7);
    let first = e.blocks();
    assert!(
        first >= 2,
        "nine 168-byte records need a PAD and a second block"
    );
    for i in 0..3u32 {
        let (tag, v) = del_range(5, i * 10, 10);
        assert!(e.add(tag, &v));
    }
    e.tail(7);
    let blocks = e.finish();
    assert_eq!(blocks.len(), first + 1);
    assert!(blocks.iter().all(|b| b.len() == BS));
    let got = scan(&blocks, 7).unwrap();
    assert_eq!(got.commits, 2);
    assert_eq!(got.blocks as usize, blocks.len());
    let kept: Vec<FcRecord> = got
        .records
        .iter()
        .filter(|r| !matches!(r, FcRecord::Pad | FcRecord::Tail { .. }))
        .cloned()
        .collect();
    assert_eq!(&kept[..want.len()], &want[..]);
    assert_eq!(kept.len(), want.len() + 3);
    assert!(scan(&blocks, 8).unwrap().is_empty());
    let torn = scan(&blocks[..first], 7).unwrap();
    assert_eq!(torn.commits, 1);
    let mut too_long = FcEncoder::new(BS);
    assert!(!too_long.add(TAG_INODE, &vec![0u8; BS]));
}
