use super::*;
use std::time::{Duration, UNIX_EPOCH};

#[test]
fn timestamps_convert_both_ways() {
    for t in [
        Timestamp { sec: 0, nsec: 0 },
        Timestamp {
            sec: 1_700_000_000,
            nsec: 5,
        },
        Timestamp { sec: -5, nsec: 250 },
    ] {
        assert_eq!(timestamp(systime(t)), t);
    }
    // What fuser 0.17 makes of the kernel's (-5 s, 250 ns): the epoch less both.
    let sent = UNIX_EPOCH - Duration::new(5, 250);
    assert_eq!(setattr_time(sent), Timestamp { sec: -5, nsec: 250 });
    let sent = UNIX_EPOCH + Duration::new(5, 250);
    assert_eq!(setattr_time(sent), Timestamp { sec: 5, nsec: 250 });
}
