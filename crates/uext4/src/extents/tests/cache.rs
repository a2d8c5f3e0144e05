//! The extent cache on its own.

use super::*;

#[test]
fn cache_lookup_and_next() {
    let mut c = ExtentCache::empty();
    c.map.insert(
        10,
        Extent {
            lblk: 10,
            len: 5,
            pblk: 100,
            unwritten: false,
        },
    );
    c.map.insert(
        20,
        Extent {
            lblk: 20,
            len: 1,
            pblk: 200,
            unwritten: true,
        },
    );
    assert_eq!(c.lookup(9), None);
    assert_eq!(c.lookup(10).unwrap().pblk, 100);
    assert_eq!(c.lookup(14).unwrap().pblk, 100);
    assert_eq!(c.lookup(15), None);
    assert_eq!(c.next(15).unwrap().lblk, 20);
    assert_eq!(c.next(21), None);
}
