//! The kernel's write-back cache through `uext4 mount` (`-o writeback_cache`, with the reserve
//! of docs/DESIGN.md): running out of space is reported by write(2), not by a
//! later fsync; what write(2) acknowledged is in the file; syncfs after removing written files
//! reports no error; an append-only file keeps what was appended. Every mode is checked the
//! same way, the write-through one too. Needs root and /dev/fuse; skips with a message
//! otherwise.

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

struct Env {
    img: PathBuf,
    mnt: PathBuf,
    _place: MountPlace,
}

impl Env {
    /// A fresh image of `size` (mke2fs), mounted with `opts`.
    fn new(tag: &str, size: &str, opts: &[&str]) -> Env {
        let place = MountPlace::new(&format!("wb-{tag}"), &["mnt"]);
        let (img, mnt) = (place.img.clone(), place.point(0));
        mke2fs(&img, size, &[]);
        let e = Env {
            img,
            mnt,
            _place: place,
        };
        e.mount(opts);
        e
    }
    fn mount(&self, opts: &[&str]) {
        uext4_mount(bin(), &self.img, &self.mnt, opts);
    }
    fn umount(&self) {
        let o = Command::new(bin())
            .arg("umount")
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wait_server_gone(&self.img);
    }
}

fn syncfs(dir: &Path) -> std::io::Result<()> {
    let d = std::fs::File::open(dir)?;
    // SAFETY: a valid descriptor, held for the call.
    match unsafe { libc::syncfs(d.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn chunk(i: u64) -> Vec<u8> {
    (0..1u64 << 20)
        .map(|b| (b ^ i.wrapping_mul(0x9e37)) as u8)
        .collect()
}

/// One file written in 1 MiB write(2) calls until the space runs out: the write gets ENOSPC,
/// the fsync after it succeeds, and the file holds exactly the acknowledged chunks after a
/// remount; e2fsck is clean.
#[test]
fn running_out_of_space_fails_the_write_in_every_cache_mode() {
    if !fuse_usable("the write-back cache tests") {
        return;
    }
    let modes: [&[&str]; 3] = [
        &[],
        &["-o", "writeback_cache"],
        &["-o", "nowriteback_cache"],
    ];
    for (k, opts) in modes.into_iter().enumerate() {
        let e = Env::new(&format!("full{k}"), "1400M", opts);
        let path = e.mnt.join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        let mut n = 0u64;
        let mut bytes = 0u64;
        let err = loop {
            match f.write(&chunk(n)) {
                Ok(1048576) => {
                    n += 1;
                    bytes += 1 << 20;
                }
                // A short count near full (write-through): the next call says why.
                Ok(m) => {
                    bytes += m as u64;
                    match f.write(&chunk(n + 1)) {
                        Err(e) => break e,
                        Ok(m) => panic!("{opts:?}: a write after a short one wrote {m}"),
                    }
                }
                Err(e) => break e,
            }
            assert!(n < 2048, "{opts:?}: 2 GiB written to a 1.4 GiB image");
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{opts:?}: {err}");
        f.sync_all()
            .unwrap_or_else(|e| panic!("{opts:?}: fsync after the refused write: {e}"));
        drop(f);
        assert!(n > 900, "{opts:?}: only {n} MiB fit");
        e.umount();
        e2fsck_clean(&e.img);
        e.mount(&["-o", "ro"]);
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len() as u64, bytes, "{opts:?}: the file's size");
        for i in [0, n / 2, n - 1] {
            let at = (i << 20) as usize;
            assert!(
                got[at..at + (1 << 20)] == chunk(i)[..],
                "{opts:?}: chunk {i} differs"
            );
        }
        e.umount();
    }
}

/// Files written and closed, then removed: syncfs reports no error (with the write-back
/// cache the kernel sends the removed files' new ctime after each unlink, for inodes the
/// server has already freed). An append-only file keeps what `>>` added.
#[test]
fn removals_and_appends_leave_no_writeback_error() {
    if !fuse_usable("the write-back cache tests") || !have(&["chattr"]) {
        return;
    }
    let modes: [&[&str]; 2] = [&["-o", "writeback_cache"], &[]];
    for (k, opts) in modes.into_iter().enumerate() {
        let e = Env::new(&format!("rm{k}"), "1400M", opts);
        let d = e.mnt.join("d");
        std::fs::create_dir(&d).unwrap();
        for i in 0..200 {
            std::fs::write(d.join(format!("f{i}")), format!("{i}\n")).unwrap();
        }
        std::fs::remove_dir_all(&d).unwrap();
        syncfs(&e.mnt).unwrap_or_else(|err| panic!("{opts:?}: syncfs after rm -r: {err}"));
        let a = e.mnt.join("a");
        std::fs::write(&a, "abc\n").unwrap();
        assert!(Command::new("chattr")
            .arg("+a")
            .arg(&a)
            .status()
            .unwrap()
            .success());
        let mut f = std::fs::OpenOptions::new().append(true).open(&a).unwrap();
        f.write_all(b"def\n").unwrap();
        drop(f);
        syncfs(&e.mnt).unwrap_or_else(|err| panic!("{opts:?}: syncfs after >>: {err}"));
        e.umount();
        e.mount(&[]);
        assert_eq!(std::fs::read(&a).unwrap(), b"abc\ndef\n", "{opts:?}");
        assert!(Command::new("chattr")
            .arg("-a")
            .arg(&a)
            .status()
            .unwrap()
            .success());
        e.umount();
        e2fsck_clean(&e.img);
    }
}
