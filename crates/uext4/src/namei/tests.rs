#[test]
fn generations_are_spread_and_not_repeated() {
    let g: Vec<u32> = (0..1000).map(|_| super::next_generation()).collect();
    let mut d = g.clone();
    d.sort_unstable();
    d.dedup();
    assert_eq!(d.len(), g.len(), "a generation repeated");
    // Not a counter: consecutive values differ in many bits.
    let close = g
        .windows(2)
        .filter(|w| (w[0] ^ w[1]).count_ones() < 4)
        .count();
    assert!(close < 10, "{close} consecutive pairs nearly equal");
    assert!(g.iter().any(|&x| x & 0x8000_0000 != 0) && g.iter().any(|&x| x < 1 << 31));
}
