//! Revoke records: the table recovery builds (block -> the latest transaction that revoked
//! it) and the revoke blocks a commit writes.

use super::format::{
    be32, be64, header, put_be32, put_be64, set_tail_csum, tid_gt, TagFormat, BT_REVOKE,
    REVOKE_HEADER_SIZE,
};
use crate::error::{Corruption, Error, Result};
use std::collections::HashMap;

#[derive(Default, Debug)]
pub(super) struct RevokeTable {
    map: HashMap<u64, u32>,
}

impl RevokeTable {
    /// Records that `tid` revoked `blk` (keeping the latest revoking transaction).
    pub(super) fn set(&mut self, blk: u64, tid: u32) {
        let e = self.map.entry(blk).or_insert(tid);
        if tid_gt(tid, *e) {
            *e = tid;
        }
    }

    /// Whether a copy of `blk` logged in `tid` must not be replayed: revoked by `tid` or a
    /// later transaction.
    pub(super) fn revoked(&self, blk: u64, tid: u32) -> bool {
        self.map.get(&blk).is_some_and(|&r| !tid_gt(tid, r))
    }
}

/// Reads the records of a revoke block into `table`. `at` names the log block in errors.
pub(super) fn scan_revoke_block(
    fmt: &TagFormat,
    b: &[u8],
    tid: u32,
    at: u32,
    table: &mut RevokeTable,
) -> Result<u64> {
    let count = be32(b, 12) as usize;
    if count > b.len() - fmt.tail_bytes() || count < REVOKE_HEADER_SIZE {
        return Err(Error::corrupt(
            Corruption::Journal,
            format!("journal revoke block {at} (transaction {tid}): r_count {count} out of range"),
        ));
    }
    let rec = fmt.revoke_record_bytes();
    let mut off = REVOKE_HEADER_SIZE;
    let mut n = 0;
    while off + rec <= count {
        let blk = if rec == 8 {
            be64(b, off)
        } else {
            be32(b, off) as u64
        };
        table.set(blk, tid);
        off += rec;
        n += 1;
    }
    Ok(n)
}

/// The revoke blocks of transaction `tid` for `blocks`.
pub(super) fn revoke_blocks(
    fmt: &TagFormat,
    bs: usize,
    seed: u32,
    tid: u32,
    blocks: &[u64],
) -> Vec<Vec<u8>> {
    let rec = fmt.revoke_record_bytes();
    blocks
        .chunks(fmt.revokes_per_block(bs))
        .map(|chunk| {
            let mut b = vec![0u8; bs];
            header(&mut b, BT_REVOKE, tid);
            let mut off = REVOKE_HEADER_SIZE;
            for &r in chunk {
                if rec == 8 {
                    put_be64(&mut b, off, r);
                } else {
                    put_be32(&mut b, off, r as u32);
                }
                off += rec;
            }
            put_be32(&mut b, 12, off as u32);
            if fmt.csum() {
                set_tail_csum(seed, &mut b);
            }
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::format;
    use super::*;

    #[test]
    fn revoke_blocks_round_trip() {
        for b64 in [false, true] {
            let fmt = TagFormat {
                csum_v2: false,
                csum_v3: true,
                has_64bit: b64,
            };
            let blocks: Vec<u64> = (0..700).map(|i| i * 3 + 1).collect();
            let bl = revoke_blocks(&fmt, 1024, 42, 9, &blocks);
            assert_eq!(bl.len(), 700usize.div_ceil(fmt.revokes_per_block(1024)));
            let mut t = RevokeTable::default();
            let mut n = 0;
            for (i, b) in bl.iter().enumerate() {
                assert!(format::tail_csum_ok(42, b));
                n += scan_revoke_block(&fmt, b, 9, i as u32, &mut t).unwrap();
            }
            assert_eq!(n, 700);
            assert!(t.revoked(4, 9) && t.revoked(4, 8) && !t.revoked(4, 10));
            assert!(!t.revoked(5, 1));
        }
    }

    #[test]
    fn latest_revoke_wins() {
        let mut t = RevokeTable::default();
        t.set(7, 5);
        t.set(7, 3);
        assert!(t.revoked(7, 5));
        assert!(!t.revoked(7, 6));
        t.set(8, u32::MAX);
        t.set(8, 2); // after wrapping: later than u32::MAX
        assert!(t.revoked(8, 1) && t.revoked(8, u32::MAX - 3) && !t.revoked(8, 3));
    }

    #[test]
    fn bad_count_is_corruption() {
        let fmt = TagFormat {
            csum_v2: false,
            csum_v3: false,
            has_64bit: false,
        };
        let mut b = vec![0u8; 1024];
        header(&mut b, BT_REVOKE, 1);
        put_be32(&mut b, 12, 5000);
        let mut t = RevokeTable::default();
        assert!(matches!(
            scan_revoke_block(&fmt, &b, 1, 3, &mut t),
            Err(Error::Corrupt {
                kind: Corruption::Journal,
                ..
            })
        ));
    }
}
