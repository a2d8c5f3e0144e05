//! Image builders' entry points: file data placed by the engine and filled from a source file
//! on another thread (`Fs::place_new_data`, `Fs::fill_placed`: the kernel's copy between two
//! files, a buffer where it will not copy), and names added without a lookup
//! (`Fs::mknod_unique`, `Fs::symlink_unique`). Every image is checked with `e2fsck -fn`.

mod common;

use common::*;
use std::io::Write;
use std::os::fd::FromRawFd;
use uext4::{Error, Fs};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
}

/// A source file holding `data`: a file beside the image (the kernel copies), or a memfd
/// (another filesystem: copied through a buffer).
fn source(data: &[u8], memfd: bool, tag: &str) -> (std::fs::File, Option<Scratch>) {
    if memfd {
        // SAFETY: a valid C string; the descriptor returned is ours.
        let fd = unsafe { libc::memfd_create(c"uext4-place".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: just created, owned by nothing else.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(data).unwrap();
        return (f, None);
    }
    let s = scratch(tag);
    std::fs::write(&s.0, data).unwrap();
    (std::fs::File::open(&s.0).unwrap(), Some(s))
}

#[test]
fn placed_data_filled_from_another_thread_reads_back() {
    let img = scratch("place");
    mke2fs(&img.0, "128M", &["-b", "4096"]);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    let sizes = [1usize, 4095, 4096, 4097, 200_000, 40 << 20];
    let mut files = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        for memfd in [false, true] {
            let data = pattern(n, i as u8 + memfd as u8 * 100);
            let name = format!("f{i}-{memfd}");
            let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            let placed = fs.place_new_data(ino, n as u64).unwrap();
            assert_eq!(placed.iter().map(|p| p.len).sum::<u64>(), n as u64);
            let (src, keep) = source(&data, memfd, "place-src");
            files.push((ino, data, src, placed, keep));
        }
    }
    // Filled on another thread, all before the commit.
    std::thread::scope(|s| {
        s.spawn(|| {
            for (_, data, src, placed, _) in &files {
                for p in placed {
                    assert_eq!(fs.fill_placed(p, src, p.file_off).unwrap(), p.len);
                }
                assert_eq!(placed.iter().map(|p| p.len).sum::<u64>(), data.len() as u64);
            }
        });
    });
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    for (ino, data, ..) in &files {
        assert_eq!(fs.getattr(*ino).unwrap().size, data.len() as u64);
        assert!(
            read_all(&fs, *ino) == *data,
            "inode {ino} reads back different"
        );
    }
    fs.unmount().unwrap();
}

#[test]
fn a_short_source_leaves_zeros_and_a_used_file_is_refused() {
    let img = scratch("place-short");
    mke2fs(&img.0, "64M", &["-b", "4096"]);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    let ino = fs.create(2, b"short", 0o644, 0, 0).unwrap().ino;
    let placed = fs.place_new_data(ino, 10_000).unwrap();
    let (src, _keep) = source(&pattern(3000, 7), false, "place-short-src");
    let got: u64 = placed
        .iter()
        .map(|p| fs.fill_placed(p, &src, p.file_off).unwrap())
        .sum();
    assert_eq!(got, 3000);
    let mut want = pattern(3000, 7);
    want.resize(10_000, 0);
    assert!(read_all(&fs, ino) == want);
    // Only a new, empty regular file can be placed.
    assert!(matches!(fs.place_new_data(ino, 5), Err(Error::Invalid(_))));
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    assert!(matches!(fs.place_new_data(d, 5), Err(Error::Invalid(_))));
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}

#[test]
fn unique_names_fill_new_directories() {
    let img = scratch("place-unique");
    mke2fs(&img.0, "64M", &[]);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    let top = fs.mknod_unique(2, b"top", 0o40755, 0, 0, 0).unwrap().ino;
    // Enough names for an indexed directory, and a small one.
    for i in 0..3000 {
        let name = format!("file-{i:05}");
        fs.mknod_unique(top, name.as_bytes(), 0o100644, 0, 1, 1)
            .unwrap();
    }
    let small = fs
        .mknod_unique(top, b"small", 0o40700, 0, 0, 0)
        .unwrap()
        .ino;
    fs.symlink_unique(small, b"link", b"../file-00001", 0, 0)
        .unwrap();
    fs.mknod_unique(small, b"fifo", 0o10644, 0, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    for i in (0..3000).step_by(97) {
        let name = format!("file-{i:05}");
        assert!(fs.lookup(top, name.as_bytes()).is_ok(), "{name} not found");
    }
    assert!(fs.lookup(small, b"link").is_ok() && fs.lookup(small, b"fifo").is_ok());
    // The ordinary way still refuses a name that is there.
    assert!(matches!(
        fs.create(top, b"file-00042", 0o644, 0, 0),
        Err(Error::Exists)
    ));
    fs.unmount().unwrap();
}

/// A placing that runs out of space leaves the file empty and its blocks free (nothing will
/// write the blocks it had mapped); the free count is back where it was once committed.
#[test]
fn a_placing_out_of_space_leaves_the_file_empty() {
    let img = scratch("place-full");
    mke2fs(&img.0, "32M", &["-b", "4096"]);
    let fs = Fs::open_path(&img.0, opts::no_timer()).unwrap();
    let ino = fs.create(2, b"big", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let free = fs.statfs().blocks_free;
    assert!(matches!(
        fs.place_new_data(ino, 64 << 20),
        Err(Error::NoSpace)
    ));
    assert_eq!(fs.getattr(ino).unwrap().size, 0);
    fs.sync().unwrap();
    assert_eq!(fs.statfs().blocks_free, free);
    fs.unmount().unwrap();
    drop(fs);
    e2fsck_clean(&img.0);
}
