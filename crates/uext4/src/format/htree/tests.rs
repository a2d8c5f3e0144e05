use super::*;

#[test]
fn node_roundtrip_find_and_csum() {
    let mut b = vec![0u8; 1024];
    let n = DxNode {
        count_off: NODE_COUNT,
        limit: dx_limit(1024, false, true),
        entries: vec![(0, 5), (100, 6), (100 | 1, 7), (5000, 8)],
    };
    assert_eq!(n.limit, 126);
    assert_eq!(dx_limit(4096, true, false), 508);
    assert_eq!(dx_limit(4096, true, true), 507);
    n.store(&mut b);
    let p = DxNode::parse(&b, NODE_COUNT).unwrap();
    assert_eq!(p, n);
    assert_eq!(p.find(0), 0);
    assert_eq!(p.find(99), 0);
    assert_eq!(p.find(100), 1);
    assert_eq!(p.find(101), 2);
    assert_eq!(p.find(4999), 2);
    assert_eq!(p.find(u32::MAX), 3);
    set_dx_csum(42, &mut b, NODE_COUNT);
    assert!(verify_dx_csum(42, &b, NODE_COUNT));
    assert!(!verify_dx_csum(43, &b, NODE_COUNT));
    b[NODE_COUNT + 9] ^= 1;
    assert!(!verify_dx_csum(42, &b, NODE_COUNT));
    // Bad counts are refused, not panics.
    put16(&mut b, NODE_COUNT + 2, 0);
    assert!(DxNode::parse(&b, NODE_COUNT).is_none());
    put16(&mut b, NODE_COUNT, 2000);
    put16(&mut b, NODE_COUNT + 2, 3);
    assert!(DxNode::parse(&b, NODE_COUNT).is_none());
    assert!(!verify_dx_csum(42, &b, NODE_COUNT));
}
