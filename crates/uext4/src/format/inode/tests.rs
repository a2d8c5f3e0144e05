use super::*;
#[test]
fn timestamp_roundtrip_with_epoch_bits() {
    for sec in [
        0i64,
        1,
        -1,
        1_700_000_000,
        0x7fff_ffff,
        0x8000_0000,
        0x3_0000_0000 - 0x8000_0001,
    ] {
        let t = Timestamp {
            sec,
            nsec: 123_456_789,
        };
        let (lo, x) = t.encode();
        assert_eq!(Timestamp::decode(lo, Some(x)), t, "sec {sec}");
    }
}

#[test]
fn times_past_the_range_stop_at_its_ends() {
    let t = |sec, nsec| Timestamp { sec, nsec };
    let max = 15_032_385_535;
    let min = -2_147_483_648;
    for (given, extra, want) in [
        (t(max + 1, 5), true, t(max, 0)),
        (t(1 << 34, 0), true, t(max, 0)),
        (t(max - 1, 5), true, t(max - 1, 5)),
        (t(min - 1, 5), true, t(min, 0)),
        (t(-5, 250), true, t(-5, 250)),
        (t(1 << 31, 5), false, t(i32::MAX as i64, 0)),
        (t(min - 1, 0), false, t(min, 0)),
        (t(7, 5), false, t(7, 0)),
    ] {
        assert_eq!(given.clamped(extra), want, "{given:?} extra {extra}");
        let mut raw = RawInode::new(if extra { 256 } else { 128 });
        raw.set_mtime(given);
        assert_eq!(raw.mtime(), want, "{given:?} stored, extra {extra}");
    }
}
