//! File handles through `uext4 mount` (name_to_handle_at / open_by_handle_at, what NFS export
//! and overlayfs's index use): a handle still opens its file or directory after the kernel
//! dropped its caches (the server answers LOOKUP of "." by node id and ".." by directory),
//! after a rename and after a remount; a removed file's handle, or one whose inode number was
//! taken by a new file, is ESTALE. Needs root and /dev/fuse; skips with a message otherwise.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

/// A handle as the kernel encodes it: `struct file_handle` with room for MAX_HANDLE_SZ bytes.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn handle_of(p: &Path) -> Handle {
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle with `bytes` bytes of room after its header.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            cstr(p).as_ptr(),
            &mut h as *mut Handle as *mut libc::file_handle,
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    h
}

fn open_handle(mnt: &Path, h: &Handle, flags: i32) -> std::io::Result<std::fs::File> {
    let m = std::fs::File::open(mnt).unwrap();
    let mut copy = Handle { ..*h };
    // SAFETY: `copy` is a handle name_to_handle_at filled; the descriptor is checked.
    let fd = unsafe {
        libc::open_by_handle_at(
            m.as_raw_fd(),
            &mut copy as *mut Handle as *mut libc::file_handle,
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by no one else.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Makes the kernel forget every inode of the mount nobody holds open: handles decoded
/// after this reach the server by node id.
fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", b"3").unwrap();
}

fn mount(img: &Path, mnt: &Path) {
    uext4_mount(bin(), img, mnt, &[]);
}

fn umount(img: &Path, mnt: &Path) {
    umount_and_wait(mnt, img);
}

/// Unmounts a mount left behind by a failed test.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A new image mounted at a new mount point, both removed at the end.
fn mounted(tag: &str) -> (PathBuf, PathBuf, MountPlace) {
    let c = MountPlace::new(&format!("fh-{tag}"), &["mnt"]);
    let (img, mnt) = (c.img.clone(), c.point(0));
    Cli(bin()).ok(&["mkfs", "--size", "64M", img.to_str().unwrap()]);
    mount(&img, &mnt);
    (img, mnt, c)
}

#[test]
fn handles_open_files_after_a_cache_drop_and_a_remount() {
    if !fuse_usable("the file handle test") {
        return;
    }
    let (img, mnt, _c) = mounted("plain");

    let d = mnt.join("d");
    let sub = d.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(d.join("f"), &data).unwrap();
    std::fs::write(sub.join("g"), b"in sub").unwrap();
    std::fs::write(d.join("gone"), b"removed").unwrap();
    let (hf, hd, hsub, hgone) = (
        handle_of(&d.join("f")),
        handle_of(&d),
        handle_of(&sub),
        handle_of(&d.join("gone")),
    );
    let gone_ino = std::fs::metadata(d.join("gone")).unwrap().ino();
    std::fs::remove_file(d.join("gone")).unwrap();
    // Rename after encoding: a handle names the inode, not the path.
    std::fs::rename(d.join("f"), sub.join("f2")).unwrap();
    drop_caches();

    let check = |when: &str| {
        let mut got = Vec::new();
        let mut f = open_handle(&mnt, &hf, libc::O_RDONLY).unwrap();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert!(got == data, "file's data {when}");
        // A directory decoded from its handle is connected to the tree through ".." lookups:
        // names relative to it work.
        for (h, name, want) in [(&hd, "sub/g", &b"in sub"[..]), (&hsub, "g", &b"in sub"[..])] {
            let dir = open_handle(&mnt, h, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
            let p = PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()));
            assert_eq!(std::fs::read(&p).unwrap(), want, "{name} {when}");
        }
        let err = open_handle(&mnt, &hgone, libc::O_RDONLY).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ESTALE),
            "removed file {when}"
        );
    };
    check("after a cache drop");
    drop_caches();
    // A new file may take the removed one's inode number: its generation differs, so the old
    // handle stays stale.
    let mut reused = false;
    for i in 0..20 {
        let p = d.join(format!("new{i}"));
        std::fs::write(&p, b"new").unwrap();
        reused |= std::fs::metadata(&p).unwrap().ino() == gone_ino;
    }
    drop_caches();
    let err = open_handle(&mnt, &hgone, libc::O_RDONLY).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ESTALE),
        "removed file's handle once its number is reused ({reused})"
    );
    umount(&img, &mnt);
    e2fsck_clean(&img);

    // Node ids and generations are the image's: handles outlive the mount.
    mount(&img, &mnt);
    check("after a remount");
    umount(&img, &mnt);
    e2fsck_clean(&img);
}

/// overlayfs with `index=on,nfs_export=on` keeps handles of its lower and upper inodes and
/// decodes them through the layers' own handles: both layers on a uext4 mount.
#[test]
fn overlay_nfs_export_handles_decode_through_the_layers() {
    if !overlay_usable("the overlay file handle test") {
        return;
    }
    let (img, mnt, _c) = mounted("ovl");
    let merged = mnt.with_extension("merged");
    std::fs::create_dir_all(&merged).unwrap();
    for d in ["lower/d", "upper", "work"] {
        std::fs::create_dir_all(mnt.join(d)).unwrap();
    }
    std::fs::write(mnt.join("lower/d/low"), b"lower file").unwrap();
    let opts = format!(
        "lowerdir={0}/lower,upperdir={0}/upper,workdir={0}/work,index=on,nfs_export=on",
        mnt.display()
    );
    let st = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&merged)
        .status()
        .unwrap();
    assert!(st.success(), "overlay mount");
    let _u = Unmount(merged.clone());
    std::fs::write(merged.join("d/up"), b"upper file").unwrap();
    let (hlow, hup, hd) = (
        handle_of(&merged.join("d/low")),
        handle_of(&merged.join("d/up")),
        handle_of(&merged.join("d")),
    );
    drop_caches();
    for (h, want) in [(&hlow, &b"lower file"[..]), (&hup, &b"upper file"[..])] {
        let mut got = Vec::new();
        let mut f = open_handle(&merged, h, libc::O_RDONLY).unwrap();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert_eq!(got, want);
    }
    let dir = open_handle(&merged, &hd, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
    let p = PathBuf::from(format!("/proc/self/fd/{}/low", dir.as_raw_fd()));
    assert_eq!(std::fs::read(p).unwrap(), b"lower file");
    drop(dir);
    assert!(Command::new("umount")
        .arg(&merged)
        .status()
        .unwrap()
        .success());
    umount(&img, &mnt);
    e2fsck_clean(&img);
}
