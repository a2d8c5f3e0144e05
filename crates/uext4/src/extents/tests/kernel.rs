//! The kernel reads a deep tree written by uext4, changes it (writes into holes and into
//! unwritten space, punches), and uext4 reads the kernel's tree back (equal to debugfs's
//! reading) and changes it again for the kernel. Needs root and loop devices; skips otherwise.

use super::*;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use uext4_testkit::needs::can_loop_mount;

/// Every block of the file reads as the model says (a fill byte, or zeros).
fn check_data(read: &dyn Fn(u64, &mut [u8]), blocks: u64, model: &BTreeMap<u64, u8>) {
    let mut buf = vec![0u8; 1024];
    for b in 0..blocks {
        read(b, &mut buf);
        let want = model.get(&b).copied().unwrap_or(0);
        assert!(buf.iter().all(|&x| x == want), "block {b}: want {want:#x}");
    }
}

#[test]
fn kernel_and_uext4_edit_each_others_trees() {
    if !can_loop_mount() {
        return;
    }
    let img = mkimg("kernel", "64M", &["-t", "ext4", "-b", "1024"]);
    let mut model: BTreeMap<u64, u8> = BTreeMap::new();
    let fs = open(&img.0, false);
    let ino = fs.create(2, b"k", 0o100644, 0, 0).unwrap().ino;
    let mut order: Vec<u64> = (0..1500).collect();
    let mut s = 3u64;
    for i in (1..order.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (s >> 33) as usize % (i + 1));
    }
    for &i in &order {
        let v = (i % 250) as u8 + 1;
        fs.write(ino, 2 * i * 1024, &[v; 1024]).unwrap();
        model.insert(2 * i, v);
    }
    fs.fallocate(ino, 1, 4000 * 1024, 200 * 1024).unwrap();
    assert_eq!(fs.ext_tree_depth(ino).unwrap(), 2);
    assert!(fs.ext_list(ino).unwrap().iter().any(|e| e.unwritten));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);

    // The kernel reads it, then changes it.
    {
        let m = uext4_testkit::faulty::KernelMount::new(&img.0);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.dir.join("k"))
            .unwrap();
        assert_eq!(f.metadata().unwrap().len(), 2999 * 1024);
        check_data(
            &|b, buf| f.read_exact_at(buf, b * 1024).unwrap(),
            2999,
            &model,
        );
        for (b, v) in [(1u64, 0xAAu8), (3, 0xAB), (4050, 0xAC)] {
            f.write_all_at(&[v; 1024], b * 1024).unwrap();
            model.insert(b, v);
        }
        // SAFETY: a valid descriptor; plain integer arguments.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                100 * 1024,
                600 * 1024,
            )
        };
        assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
        model.retain(|&b, _| !(100..700).contains(&b));
        f.sync_all().unwrap();
    }
    e2fsck_clean(&img.0);

    // uext4 reads the kernel's tree: as debugfs does, with the kernel's data.
    let fs = open(&img.0, false);
    let list = fs.ext_list(ino).unwrap();
    assert!(
        list == debugfs_extents(&img.0, ino),
        "uext4 and debugfs disagree"
    );
    assert!(list.iter().any(|e| e.unwritten && e.lblk > 4000));
    check_data(
        &|b, buf| {
            fs.read(ino, b * 1024, buf).unwrap();
        },
        4051,
        &model,
    );
    // And changes it: truncate, punch.
    fs.truncate(ino, 2000 * 1024).unwrap();
    model.retain(|&b, _| b < 2000);
    fs.fallocate(ino, 0x3, 10 * 1024, 40 * 1024).unwrap();
    model.retain(|&b, _| !(10..50).contains(&b));
    let list = fs.ext_list(ino).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    assert!(
        list == debugfs_extents(&img.0, ino),
        "after uext4's changes"
    );
    {
        let m = uext4_testkit::faulty::KernelMount::new(&img.0);
        let f = std::fs::File::open(m.dir.join("k")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 2000 * 1024);
        check_data(
            &|b, buf| f.read_exact_at(buf, b * 1024).unwrap(),
            2000,
            &model,
        );
    }
    e2fsck_clean(&img.0);
}
