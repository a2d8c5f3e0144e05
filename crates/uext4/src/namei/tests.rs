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

/// `lookup_path` walks names from the root or a directory, follows symlinks in the middle
/// (relative ones from their own directory, absolute ones from the root) and at the end only
/// when asked, and stops a loop.
#[test]
fn lookup_path_follows_symlinks() {
    use crate::{Error, Fs};
    let dev = crate::blockdev::MemDevice::new(16 << 20);
    let mut o = crate::mkfs::MkfsOptions::default_for(0);
    o.block_size = 1024;
    crate::mkfs::mkfs(&dev, &o).unwrap();
    let fs = Fs::open_dev(std::sync::Arc::new(dev), Default::default()).unwrap();
    let a = fs.mkdir(2, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(b, b"f", 0o644, 0, 0).unwrap().ino;
    let rel = fs.symlink(2, b"rel", b"a/b", 0, 0).unwrap().ino;
    fs.symlink(b, b"abs", b"/a/b/f", 0, 0).unwrap();
    fs.symlink(2, b"loop", b"loop/x", 0, 0).unwrap();
    assert_eq!(fs.lookup_path(2, b"/a/b/f", true).unwrap(), f);
    assert_eq!(fs.lookup_path(a, b"b//./f", false).unwrap(), f);
    assert_eq!(fs.lookup_path(b, b"../b/f", false).unwrap(), f);
    assert_eq!(fs.lookup_path(2, b"/", true).unwrap(), 2);
    assert_eq!(fs.lookup_path(2, b"rel/f", false).unwrap(), f);
    assert_eq!(fs.lookup_path(2, b"rel", false).unwrap(), rel);
    assert_eq!(fs.lookup_path(2, b"rel", true).unwrap(), b);
    assert_eq!(fs.lookup_path(2, b"a/b/abs", true).unwrap(), f);
    assert!(matches!(
        fs.lookup_path(2, b"a/nope", true),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        fs.lookup_path(2, b"a/b/f/x", true),
        Err(Error::NotDir)
    ));
    assert!(matches!(
        fs.lookup_path(2, b"loop", true),
        Err(Error::Invalid(_))
    ));
}
