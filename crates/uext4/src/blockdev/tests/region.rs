use crate::blockdev::*;

fn backing() -> Arc<MemDevice> {
    // Every byte of the device names its own 512-byte sector, so a misplaced access shows.
    let v: Vec<u8> = (0..16 * 512).map(|i| (i / 512) as u8 + 1).collect();
    Arc::new(MemDevice::from_vec(v))
}

fn region(offset: u64, len: Option<u64>) -> Region {
    Region { offset, len }
}

#[test]
fn reads_and_writes_are_translated() {
    let mem = backing();
    let d = RegionDevice::new(mem.clone(), region(4 * 512, Some(4 * 512))).unwrap();
    assert_eq!(d.size(), 4 * 512);
    let mut b = [0u8; 4];
    d.read_at(0, &mut b).unwrap();
    assert_eq!(b, [5; 4], "byte 0 of the window is sector 4 of the device");
    d.read_at(3 * 512 + 508, &mut b).unwrap();
    assert_eq!(b, [8; 4]);
    d.write_at(512, &[0xaa; 512]).unwrap();
    d.zero_range(2 * 512, 512).unwrap();
    d.write_new_at(3 * 512, &[0xbb; 16]).unwrap();
    let v = mem.to_vec();
    assert!(v[5 * 512..6 * 512].iter().all(|&x| x == 0xaa));
    assert!(v[6 * 512..7 * 512].iter().all(|&x| x == 0));
    assert!(v[7 * 512..7 * 512 + 16].iter().all(|&x| x == 0xbb));
    // Everything outside the window is as it was.
    for (i, &x) in v.iter().enumerate() {
        if !(4 * 512..8 * 512).contains(&i) {
            assert_eq!(
                x,
                (i / 512) as u8 + 1,
                "byte {i} outside the window changed"
            );
        }
    }
}

#[test]
fn accesses_past_the_window_fail_and_touch_nothing() {
    let mem = backing();
    let before = mem.to_vec();
    let d = RegionDevice::new(mem.clone(), region(512, Some(2 * 512))).unwrap();
    let mut b = [0u8; 2];
    assert!(d.read_at(2 * 512 - 1, &mut b).is_err());
    assert!(d.read_at(u64::MAX, &mut b).is_err());
    assert!(d.write_at(2 * 512 - 1, &[1, 2]).is_err());
    assert!(d.write_at(2 * 512, &[1]).is_err());
    assert!(d.write_new_at(u64::MAX - 1, &[1, 2, 3]).is_err());
    assert!(d.zero_range(512, 2 * 512).is_err());
    assert!(d.zero_range(u64::MAX, 2).is_err());
    assert_eq!(mem.to_vec(), before, "a refused access wrote something");
    // The last byte is inside.
    d.write_at(2 * 512 - 1, &[9]).unwrap();
    assert_eq!(mem.to_vec()[3 * 512 - 1], 9);
}

#[test]
fn bad_regions_are_refused() {
    let mem = backing();
    let size = mem.size();
    let err = |r| RegionDevice::new(mem.clone(), r).err().unwrap().to_string();
    assert!(err(region(100, None)).contains("not a multiple of 512"));
    assert!(err(region(size, None)).contains("past the end"));
    assert!(err(region(size + 512, Some(512))).contains("past the end"));
    assert!(err(region(512, Some(size))).contains("runs past the end"));
    assert!(err(region(512, Some(u64::MAX))).contains("runs past the end"));
    assert!(err(region(512, Some(0))).contains("empty"));
    // To the end of the device when no length is given.
    let d = RegionDevice::new(mem.clone(), region(15 * 512, None)).unwrap();
    assert_eq!(d.size(), 512);
    assert_eq!(d.region(), region(15 * 512, Some(512)));
}

#[test]
fn properties_of_the_device_carry_through() {
    struct Ro;
    impl BlockDevice for Ro {
        fn read_at(&self, _: u64, buf: &mut [u8]) -> io::Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(libc::EROFS))
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read_only(&self) -> bool {
            true
        }
        fn is_mapped(&self) -> bool {
            true
        }
        fn zeroes_cheaply(&self) -> bool {
            true
        }
    }
    let d = RegionDevice::new(Arc::new(Ro), region(4096, None)).unwrap();
    assert!(d.read_only() && d.is_mapped() && d.zeroes_cheaply());
    assert_eq!(d.size(), (1 << 20) - 4096);
    let m = RegionDevice::new(backing(), region(0, None)).unwrap();
    assert!(!m.read_only() && !m.is_mapped() && !m.zeroes_cheaply());
}
