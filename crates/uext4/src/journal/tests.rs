//! The journal on a memory device: commit, crash (the blocks never reach home), recover.

use super::format::*;
use super::*;
use crate::blockdev::MemDevice;

const DEV_BLOCKS: u64 = 4096;
/// The journal lives at device blocks JSTART.. (split in two runs to test the map).
const JSTART: u64 = 1000;

struct Setup {
    dev: Arc<MemDevice>,
    bs: u32,
    map: JournalMap,
}

fn setup(bs: u32, jlen: u32, incompat: u32) -> Setup {
    let dev = Arc::new(MemDevice::new(DEV_BLOCKS * bs as u64));
    let mut sb = JournalSuperblock::new_v2(
        bs,
        jlen,
        [0x5A; 16],
        incompat & INCOMPAT_CSUM_V3 != 0,
        incompat & INCOMPAT_64BIT != 0,
    );
    sb.feature_incompat = incompat;
    if incompat & INCOMPAT_CSUM_V2 != 0 {
        sb.checksum_type = CSUM_TYPE_CRC32C;
    }
    dev.write_at(JSTART * bs as u64, &sb.to_bytes()).unwrap();
    let half = jlen / 2;
    // Two runs, out of order, with a gap between them on the device.
    let map = JournalMap(vec![
        (half, JSTART + half as u64 + 7, jlen - half),
        (0, JSTART, half),
    ]);
    Setup { dev, bs, map }
}

impl Setup {
    fn open(&self) -> Journal {
        Journal::open(self.dev.clone(), self.bs, self.map.clone()).unwrap()
    }
    fn block(&self, blk: u64) -> Vec<u8> {
        let mut b = vec![0u8; self.bs as usize];
        self.dev.read_at(blk * self.bs as u64, &mut b).unwrap();
        b
    }
    fn write_home(&self, blocks: &[(u64, Vec<u8>)]) {
        for (b, d) in blocks {
            self.dev.write_at(b * self.bs as u64, d).unwrap();
        }
    }
}

fn pattern(bs: u32, blk: u64, gen: u32) -> Vec<u8> {
    let mut v: Vec<u8> = (0..bs)
        .map(|i| (i as u64 * 7 + blk * 13 + gen as u64 * 31) as u8)
        .collect();
    if gen.is_multiple_of(3) {
        // Some blocks begin with the jbd2 magic and must be escaped.
        v[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    }
    v
}

const FORMATS: [u32; 5] = [
    0,
    INCOMPAT_64BIT,
    INCOMPAT_CSUM_V2,
    INCOMPAT_CSUM_V2 | INCOMPAT_64BIT,
    INCOMPAT_CSUM_V3 | INCOMPAT_64BIT,
];

#[test]
fn commit_then_crash_replays_every_format() {
    for bs in [1024, 4096] {
        for inc in FORMATS.iter().copied().chain([INCOMPAT_CSUM_V3]) {
            let s = setup(bs, 1024, inc | INCOMPAT_REVOKE);
            let j = s.open();
            // More blocks than one descriptor holds.
            let n = j.fmt.tags_per_descriptor(bs as usize) + 5;
            let blocks: Vec<(u64, Vec<u8>)> = (0..n as u64)
                .map(|i| (100 + i, pattern(bs, 100 + i, i as u32)))
                .collect();
            let tid = j.commit(1, &blocks, &[]).unwrap();
            assert_eq!(tid, 1);
            assert!(j.needs_recovery());
            drop(j);
            let j = s.open();
            assert!(j.needs_recovery());
            let r = j.recover().unwrap();
            assert_eq!(
                r,
                RecoveryReport {
                    transactions: 1,
                    blocks_replayed: n as u64,
                    blocks_revoked: 0,
                    last_tid: 1
                },
                "bs {bs} incompat {inc:#x}"
            );
            for (b, d) in &blocks {
                assert_eq!(&s.block(*b), d, "block {b}, bs {bs}, incompat {inc:#x}");
            }
            assert!(!j.needs_recovery());
            let sb = s.open().superblock();
            assert_eq!((sb.start, sb.sequence), (0, 3));
            // Recovering an empty journal does nothing.
            assert_eq!(s.open().recover().unwrap().blocks_replayed, 0);
        }
    }
}

#[test]
fn revoked_blocks_are_not_replayed() {
    for inc in FORMATS {
        let s = setup(1024, 128, inc | INCOMPAT_REVOKE);
        let j = s.open();
        let a = pattern(1024, 50, 1);
        j.commit(1, &[(50, a.clone()), (51, a.clone())], &[])
            .unwrap();
        // T2 revokes 50 (freed); 51 logged again.
        let b = pattern(1024, 51, 2);
        j.commit(2, &[(51, b.clone())], &[50]).unwrap();
        // T3 logs 52, revoked by T4, then 52 is logged again in T5 (reused): replayed.
        j.commit(3, &[(52, a.clone())], &[]).unwrap();
        j.commit(4, &[], &[52]).unwrap();
        let c = pattern(1024, 52, 5);
        j.commit(5, &[(52, c.clone())], &[]).unwrap();
        drop(j);
        let r = s.open().recover().unwrap();
        assert_eq!(r.transactions, 5);
        assert_eq!(r.last_tid, 5);
        assert_eq!(r.blocks_revoked, 2, "50 in T1 and 52 in T3");
        assert_eq!(r.blocks_replayed, 3);
        assert!(
            s.block(50).iter().all(|&x| x == 0),
            "revoked block replayed"
        );
        assert_eq!(s.block(51), b);
        assert_eq!(s.block(52), c);
    }
}

/// Finds the log block holding the commit block of `tid`.
fn find_commit(s: &Setup, j: &Journal, tid: u32) -> u64 {
    for jb in j.first..j.maxlen {
        let p = s.map.phys(jb).unwrap();
        let b = s.block(p);
        if be32(&b, 0) == JBD2_MAGIC && be32(&b, 4) == BT_COMMIT && be32(&b, 8) == tid {
            return p;
        }
    }
    panic!("no commit block for {tid}")
}

#[test]
fn torn_last_transaction_is_discarded() {
    for inc in FORMATS {
        for how in ["missing", "bad checksum"] {
            if how == "bad checksum" && inc & (INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3) == 0 {
                continue;
            }
            let s = setup(1024, 128, inc);
            let j = s.open();
            j.commit(1, &[(60, pattern(1024, 60, 1))], &[]).unwrap();
            j.commit(
                2,
                &[(60, pattern(1024, 60, 2)), (61, pattern(1024, 61, 2))],
                &[],
            )
            .unwrap();
            let c = find_commit(&s, &j, 2);
            drop(j);
            let mut b = s.block(c);
            if how == "missing" {
                b.fill(0);
            } else {
                b[COMMIT_SEC + 7] ^= 1;
            }
            s.dev.write_at(c * 1024, &b).unwrap();
            let r = s.open().recover().unwrap();
            assert_eq!((r.transactions, r.last_tid), (1, 1), "{how} {inc:#x}");
            assert_eq!(s.block(60), pattern(1024, 60, 1), "{how} {inc:#x}");
            assert!(s.block(61).iter().all(|&x| x == 0));
            // s_sequence skips the discarded transaction, as the kernel's.
            let j = s.open();
            assert_eq!(j.superblock().sequence, 3);
            // The journal goes on after the recovery.
            let t = j.commit(3, &[(62, pattern(1024, 62, 3))], &[]).unwrap();
            assert_eq!(t, 3);
            drop(j);
            s.open().recover().unwrap();
            assert_eq!(s.block(62), pattern(1024, 62, 3));
        }
    }
}

#[test]
fn bad_data_checksum_fails_recovery_but_replays_the_rest() {
    let s = setup(1024, 128, INCOMPAT_CSUM_V3);
    let j = s.open();
    j.commit(
        1,
        &[(70, pattern(1024, 70, 1)), (71, pattern(1024, 71, 1))],
        &[],
    )
    .unwrap();
    // The data block of 71 is the log block right after 70's.
    let c = find_commit(&s, &j, 1);
    drop(j);
    let mut b = s.block(c - 1);
    b[100] ^= 0xFF;
    s.dev.write_at((c - 1) * 1024, &b).unwrap();
    let e = s.open().recover().unwrap_err();
    assert!(
        matches!(e, Error::BadChecksum { kind: Corruption::Journal, ref detail } if detail.contains("block 71")),
        "{e}"
    );
    assert_eq!(s.block(70), pattern(1024, 70, 1));
    assert!(s.block(71).iter().all(|&x| x == 0));
    assert!(s.open().needs_recovery(), "the log stays for e2fsck");
}

#[test]
fn wrap_around_with_checkpoints_and_crash_at_every_point() {
    for inc in [0, INCOMPAT_CSUM_V3 | INCOMPAT_64BIT] {
        let s = setup(1024, 40, inc);
        // The model: what each block holds once everything committed is home.
        let mut model: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        let j = s.open();
        let mut sb_writes = 0;
        let mut last_sb = j.superblock();
        for gen in 1..=60u32 {
            let n = (gen % 5 + 1) as u64;
            let blocks: Vec<(u64, Vec<u8>)> = (0..n)
                .map(|i| {
                    let blk = 200 + (gen as u64 * 3 + i) % 20;
                    (blk, pattern(1024, blk, gen))
                })
                .collect();
            let tid = j.commit(gen as u64, &blocks, &[]).unwrap();
            for (b, d) in &blocks {
                model.insert(*b, d.clone());
            }
            // A crash now: the transaction is in the log only. Replay a copy of the device.
            let copy = Arc::new(MemDevice::from_vec(s.dev.to_vec()));
            let jc = Journal::open(copy.clone(), 1024, s.map.clone()).unwrap();
            jc.recover().unwrap();
            for (b, d) in &model {
                let mut got = vec![0u8; 1024];
                copy.read_at(b * 1024, &mut got).unwrap();
                assert_eq!(&got, d, "block {b} after a crash after transaction {gen}");
            }
            s.write_home(&blocks);
            j.checkpointed(tid);
            assert_eq!(j.free_blocks(), j.log_len());
            let sb = j.superblock();
            if sb != last_sb {
                sb_writes += 1;
                last_sb = sb;
            }
        }
        // 60 transactions of about 5 blocks in a log of 39: the superblock moves about once
        // a lap, not once a commit.
        assert!(
            sb_writes > 3 && sb_writes < 20,
            "{sb_writes} superblock writes"
        );
        assert!(j.commits.load(Ordering::Relaxed) == 60);
        j.set_clean().unwrap();
        assert!(!s.open().needs_recovery());
    }
}

/// Records what the checkpointer tells the engine.
#[derive(Default)]
struct SeenHooks {
    home: std::sync::atomic::AtomicU64,
    failed: Mutex<Option<String>>,
}

impl CheckpointHooks for Arc<SeenHooks> {
    fn checkpointed(&self, tid: u64) {
        self.home.fetch_max(tid, Ordering::SeqCst);
    }
    fn failed(&self, why: &str) {
        *self.failed.lock() = Some(why.to_string());
    }
}

#[test]
fn full_log_waits_for_the_journals_checkpointer() {
    let s = Arc::new(setup(1024, 32, INCOMPAT_CSUM_V3));
    let j = Arc::new(s.open());
    let seen: Arc<SeenHooks> = Default::default();
    j.start_checkpointer(Box::new(seen.clone())).unwrap();
    for gen in 1..30u32 {
        let blocks: Vec<(u64, Vec<u8>)> = (0..6)
            .map(|i| (300 + i, pattern(1024, 300 + i, gen)))
            .collect();
        let tid = j.commit(gen as u64, &blocks, &[]).unwrap();
        assert!(j
            .queue_checkpoint(gen as u64, tid, blocks, Box::new(()))
            .unwrap());
        assert!(j.free_blocks() <= j.log_len());
    }
    // Crash: whatever is not home yet is in the log.
    let copy = Arc::new(MemDevice::from_vec(s.dev.to_vec()));
    Journal::open(copy.clone(), 1024, s.map.clone())
        .unwrap()
        .recover()
        .unwrap();
    for i in 0..6 {
        let mut got = vec![0u8; 1024];
        copy.read_at((300 + i) * 1024, &mut got).unwrap();
        assert_eq!(got, pattern(1024, 300 + i, 29));
    }
    j.checkpoint_drain().unwrap();
    assert_eq!(seen.home.load(Ordering::SeqCst), 29);
    assert!(seen.failed.lock().is_none());
    assert!(j.checkpoint_batches() > 0);
    j.set_clean().unwrap();
    for i in 0..6 {
        let mut got = vec![0u8; 1024];
        s.dev.read_at((300 + i) * 1024, &mut got).unwrap();
        assert_eq!(got, pattern(1024, 300 + i, 29));
    }
}

/// Commits that come while the checkpointer gathers a batch do not wake it: one wake-up for
/// the first, not one per commit (each was a context switch per fsync on a FUSE server).
/// Every transaction still goes home.
#[test]
fn commits_within_a_batch_wake_the_checkpointer_once() {
    let s = Arc::new(setup(1024, 1024, INCOMPAT_CSUM_V3));
    let j = Arc::new(s.open());
    let seen: Arc<SeenHooks> = Default::default();
    j.start_checkpointer(Box::new(seen.clone())).unwrap();
    let started = std::time::Instant::now();
    for gen in 1..=20u32 {
        let blocks = vec![(300, pattern(1024, 300, gen))];
        let tid = j.commit(gen as u64, &blocks, &[]).unwrap();
        assert!(j
            .queue_checkpoint(gen as u64, tid, blocks, Box::new(()))
            .unwrap());
    }
    // Twenty commits of one block each stay far below the quarter of the log that hurries
    // the checkpointer. Each 50 ms batch window that closes while they go on may take one
    // more wake-up (on a slow machine); a wake-up per commit is twenty.
    let windows = started.elapsed().as_millis() as u64 / 50;
    let wakes = j.checkpoint_wakes();
    assert!(
        wakes <= 2 + windows,
        "{wakes} wake-ups for 20 commits in {windows} batch windows"
    );
    j.checkpoint_drain().unwrap();
    assert_eq!(seen.home.load(Ordering::SeqCst), 20);
    let mut got = vec![0u8; 1024];
    s.dev.read_at(300 * 1024, &mut got).unwrap();
    assert_eq!(got, pattern(1024, 300, 20));
}

/// A commit waiting for log space that will never come (the checkpoints failed) wakes when
/// the journal is aborted and fails with `Stopped`, instead of waiting out its timeout.
#[test]
fn abort_wakes_a_commit_waiting_for_log_space() {
    let s = setup(1024, 32, INCOMPAT_CSUM_V3);
    let j = Arc::new(s.open());
    let blocks: Vec<(u64, Vec<u8>)> = (0..6)
        .map(|i| (300 + i, pattern(1024, 300 + i, 1)))
        .collect();
    // Nothing is ever checkpointed: the log fills.
    while j.free_blocks() >= j.blocks_needed(blocks.len(), 0) as u32 {
        j.commit(1, &blocks, &[]).unwrap();
    }
    let waiter = {
        let (j, blocks) = (j.clone(), blocks.clone());
        std::thread::spawn(move || j.commit(2, &blocks, &[]))
    };
    // Once the waiter is counted as waiting, abort.
    while j.checkpoint_waits.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    j.abort("the checkpoint failed");
    let r = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::Stopped(_))), "{r:?}");
    assert!(matches!(j.commit(3, &blocks, &[]), Err(Error::Stopped(_))));
    assert!(
        j.set_clean().is_err(),
        "an aborted journal is left for recovery"
    );
}

#[test]
fn too_big_and_bad_blocks_are_invalid() {
    let s = setup(1024, 32, 0);
    let j = s.open();
    let blocks: Vec<(u64, Vec<u8>)> = (0..40).map(|i| (i + 100, vec![1u8; 1024])).collect();
    assert!(!j.fits(blocks.len(), 0));
    assert!(j.fits(20, 0));
    assert!(matches!(j.commit(1, &blocks, &[]), Err(Error::Invalid(_))));
    assert!(matches!(
        j.commit(1, &[(1u64 << 33, vec![0u8; 1024])], &[]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        j.commit(1, &[(5, vec![0u8; 10])], &[]),
        Err(Error::Invalid(_))
    ));
    assert_eq!(j.commits.load(Ordering::Relaxed), 0);
}

#[test]
fn bad_superblocks_are_refused() {
    let s = setup(1024, 64, INCOMPAT_CSUM_V3);
    let sb = s.open().superblock();
    let try_sb = |f: &dyn Fn(&mut JournalSuperblock)| {
        let mut b = sb.clone();
        f(&mut b);
        s.dev.write_at(JSTART * 1024, &b.to_bytes()).unwrap();
        Journal::open(s.dev.clone(), 1024, s.map.clone())
    };
    assert!(matches!(
        try_sb(&|b| b.maxlen = 1000),
        Err(Error::Corrupt {
            kind: Corruption::Journal,
            ..
        })
    ));
    assert!(matches!(
        try_sb(&|b| b.first = 0),
        Err(Error::Corrupt {
            kind: Corruption::Journal,
            ..
        })
    ));
    assert!(matches!(
        try_sb(&|b| b.start = 70),
        Err(Error::Corrupt {
            kind: Corruption::Journal,
            ..
        })
    ));
    assert!(matches!(
        try_sb(&|b| b.block_size = 4096),
        Err(Error::Corrupt {
            kind: Corruption::Journal,
            ..
        })
    ));
    // A damaged user count in the journal inode's superblock is corruption, not a shared
    // (external) journal device (e2fsck_journal_load reads it so).
    let e = try_sb(&|b| b.nr_users = 9999).err().unwrap();
    assert!(
        matches!(
            e,
            Error::Corrupt {
                kind: Corruption::Journal,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("9999") && msg.contains("corrupt"), "{msg}");
    assert!(
        !msg.contains("shared") && !msg.contains("external"),
        "{msg}"
    );
    // A fast-commit area that leaves fewer than 1024 log blocks (this journal is small).
    let e = try_sb(&|b| b.feature_incompat |= INCOMPAT_FAST_COMMIT)
        .err()
        .unwrap();
    assert!(e.to_string().contains("too short a log"), "{e}");
    assert!(matches!(
        try_sb(&|b| b.feature_incompat |= 0x100),
        Err(Error::Unsupported(_))
    ));
    let mut raw = sb.to_bytes();
    raw[0x20] ^= 1;
    s.dev.write_at(JSTART * 1024, &raw).unwrap();
    assert!(matches!(
        Journal::open(s.dev.clone(), 1024, s.map.clone()),
        Err(Error::BadChecksum {
            kind: Corruption::Journal,
            ..
        })
    ));
    // Garbage in the log is not a transaction: recovery of a log with s_start set but no
    // valid blocks replays nothing.
    let mut b = sb.clone();
    b.start = 10;
    s.dev.write_at(JSTART * 1024, &b.to_bytes()).unwrap();
    s.dev.write_at((JSTART + 10) * 1024, &[0xAB; 1024]).unwrap();
    let r = s.open().recover().unwrap();
    assert_eq!(r.transactions, 0);
}

#[test]
fn unrecovered_log_refuses_commits() {
    let s = setup(1024, 64, 0);
    let j = s.open();
    j.commit(1, &[(80, vec![3u8; 1024])], &[]).unwrap();
    drop(j);
    let j = s.open();
    assert!(matches!(
        j.commit(2, &[(81, vec![3u8; 1024])], &[]),
        Err(Error::Invalid(_))
    ));
    j.recover().unwrap();
    assert_eq!(j.commit(2, &[(81, vec![3u8; 1024])], &[]).unwrap(), 3);
}

#[test]
fn set_features_turns_on_csum_v3_and_64bit() {
    let s = setup(1024, 64, 0);
    let mut j = s.open();
    j.set_features(true, true).unwrap();
    let sb = s.open().superblock();
    assert_eq!(sb.feature_incompat, INCOMPAT_CSUM_V3 | INCOMPAT_64BIT);
    j.commit(1, &[(90, pattern(1024, 90, 3))], &[]).unwrap();
    drop(j);
    s.open().recover().unwrap();
    assert_eq!(s.block(90), pattern(1024, 90, 3));
}

#[test]
fn compat_checksum_v1_round_trip() {
    let s = setup(1024, 64, 0);
    let mut sb = s.open().superblock();
    sb.feature_compat = COMPAT_CHECKSUM;
    s.dev.write_at(JSTART * 1024, &sb.to_bytes()).unwrap();
    let j = s.open();
    j.commit(1, &[(95, pattern(1024, 95, 1))], &[]).unwrap();
    j.commit(2, &[(96, pattern(1024, 96, 2))], &[]).unwrap();
    // Damage T2's data block: its crc32_be in the commit block no longer matches.
    let c = find_commit(&s, &j, 2);
    drop(j);
    let mut b = s.block(c - 1);
    b[9] ^= 1;
    s.dev.write_at((c - 1) * 1024, &b).unwrap();
    let r = s.open().recover().unwrap();
    assert_eq!(r.transactions, 1);
    assert_eq!(s.block(95), pattern(1024, 95, 1));
    assert!(s.block(96).iter().all(|&x| x == 0));
}

#[test]
fn journal_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Journal>();
}

#[test]
fn corrupt_descriptor_in_a_committed_transaction_is_an_error() {
    let s = setup(1024, 64, INCOMPAT_CSUM_V3);
    let j = s.open();
    j.commit(1, &[(40, pattern(1024, 40, 1))], &[]).unwrap();
    j.commit(2, &[(41, pattern(1024, 41, 1))], &[]).unwrap();
    // T2's descriptor is two blocks before its commit block.
    let c = find_commit(&s, &j, 2);
    drop(j);
    let mut d = s.block(c - 2);
    assert_eq!(be32(&d, 4), BT_DESCRIPTOR);
    d[200] ^= 1;
    s.dev.write_at((c - 2) * 1024, &d).unwrap();
    let e = s.open().recover().unwrap_err();
    assert!(
        matches!(e, Error::BadChecksum { kind: Corruption::Journal, ref detail } if detail.contains("transaction 2")),
        "{e}"
    );
    assert!(s.open().needs_recovery());
    // A stale commit (older than the previous one) after a bad descriptor ends the log
    // instead: the kernel's test for blocks left from an earlier lap.
    let mut cb = s.block(c);
    put_be64(&mut cb, COMMIT_SEC, 1);
    let sum = commit_csum(s.open().seed, &cb);
    put_be32(&mut cb, COMMIT_CHKSUM, sum);
    s.dev.write_at(c * 1024, &cb).unwrap();
    let r = s.open().recover().unwrap();
    assert_eq!(r.transactions, 1);
    assert_eq!(s.block(40), pattern(1024, 40, 1));
    assert!(s.block(41).iter().all(|&x| x == 0));
}
