use super::*;
use crate::abi::Fields;

fn attr() -> WireAttr {
    WireAttr {
        ino: 12,
        size: 5000,
        blocks: 16,
        atime: (-2, 250_000_000),
        mtime: (1_700_000_000, 7),
        ctime: (3, 0),
        crtime: (4, 9),
        mode: 0o100644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
    }
}

#[test]
fn entry_and_attr_at_their_offsets() {
    let mut out = vec![0u8; 4096];
    let n = entry(&mut out, 3, Ttl::both(Duration::from_secs(1)), &attr());
    assert_eq!(n, 128);
    let f = Fields(&out);
    assert_eq!((f.u64(0), f.u64(8), f.u64(16), f.u64(24)), (12, 3, 1, 1));
    assert_eq!(f.u64(40), 12);
    assert_eq!(f.u64(40 + 24) as i64, -2);
    assert_eq!(f.u32(40 + 48), 250_000_000);
    assert_eq!(f.u32(40 + 60), 0o100644);
    assert_eq!(f.u32(40 + 80), 4096);
    let n = super::attr(&mut out, Duration::from_millis(1500), &attr());
    assert_eq!(n, 104);
    let f = Fields(&out);
    assert_eq!((f.u64(0), f.u32(8), f.u64(16 + 8)), (1, 500_000_000, 5000));
}

#[test]
fn create_is_an_entry_then_an_open() {
    let mut out = vec![0u8; 4096];
    let n = create(
        &mut out,
        1,
        Ttl::both(Duration::ZERO),
        &attr(),
        77,
        abi::FOPEN_KEEP_CACHE,
    );
    assert_eq!(n, 144);
    let f = Fields(&out);
    assert_eq!((f.u64(128), f.u32(136)), (77, abi::FOPEN_KEEP_CACHE));
}

#[test]
fn statx_has_birth_time_and_device_numbers() {
    let mut out = vec![0u8; 4096];
    let mut a = attr();
    // new_encode_dev(MKDEV(8, 0x101)): minor's low byte, major, minor's high bits.
    a.rdev = 0x01 | (8 << 8) | (0x100 << 12);
    let n = statx(
        &mut out,
        Duration::from_secs(1),
        &a,
        abi::STATX_BASIC_STATS | abi::STATX_BTIME,
        (0x20, 0x74),
    );
    assert_eq!(n, 288);
    let f = Fields(&out);
    assert_eq!(f.u32(32), abi::STATX_BASIC_STATS | abi::STATX_BTIME);
    // stx_attributes and stx_attributes_mask.
    assert_eq!((f.u64(32 + 8), f.u64(32 + 56)), (0x20, 0x74));
    assert_eq!(f.u16(32 + 28), 0o100644);
    assert_eq!((f.u64(32 + 80), f.u32(32 + 88)), (4, 9));
    assert_eq!((f.u32(32 + 128), f.u32(32 + 132)), (8, 0x101));
}

#[test]
fn dirents_are_padded_and_stop_at_the_size_asked() {
    let mut out = vec![0xffu8; 4096];
    let mut d = Dirents::new(&mut out, 64);
    assert!(d.add(5, 1, 0o040000, b"dir"));
    assert_eq!(d.len(), 32);
    assert!(d.add(6, 2, 0o100000, b"file"));
    assert_eq!(d.len(), 64);
    assert!(!d.add(7, 3, 0o100000, b"x"));
    let f = Fields(&out);
    assert_eq!((f.u64(0), f.u64(8), f.u32(16), f.u32(20)), (5, 1, 3, 4));
    assert_eq!(&out[24..32], b"dir\0\0\0\0\0");
    let mut d = Dirents::new(&mut out, 4096);
    assert!(d.add_plus(0, Ttl::both(Duration::ZERO), &attr(), 9, b"name"));
    assert_eq!(d.len(), 128 + 32);
    let f = Fields(&out);
    assert_eq!((f.u64(128), f.u64(136), f.u32(148)), (12, 9, 8));
}

#[test]
fn init_is_cut_for_old_kernels() {
    let mut out = vec![0u8; 4096];
    let o = abi::InitOut::default();
    assert_eq!(init(&mut out, &o, 44), 64);
    assert_eq!(init(&mut out, &o, 22), 24);
}
