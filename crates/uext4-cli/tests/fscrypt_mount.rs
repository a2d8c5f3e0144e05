//! Encrypted directories through `uext4 mount -o key=FILE`: a directory encrypted with
//! `uext4 fscrypt set-policy` is written and read through the mount, the fscrypt ioctls the
//! kernel's FUSE can carry answer as the kernel's ext4 does (the nonce equals what the
//! kernel's own FS_IOC_GET_ENCRYPTION_NONCE says on a loop mount of the same image), the
//! ones it cannot carry say EOPNOTSUPP, and the kernel reads back what the mount wrote.
//! Needs root, /dev/fuse and loop devices; skips with a message otherwise.

use std::os::fd::AsRawFd;
use std::path::Path;
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

const GET_ENCRYPTION_NONCE: libc::c_ulong = 0x8010_661b;
const GET_ENCRYPTION_KEY_STATUS: libc::c_ulong = 0xc080_661a;
const SET_ENCRYPTION_POLICY: libc::c_ulong = 0x800c_6613;

fn nonce(p: &Path) -> [u8; 16] {
    let f = std::fs::File::open(p).unwrap();
    let mut n = [0u8; 16];
    // SAFETY: the buffer has the 16 bytes the ioctl writes.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), GET_ENCRYPTION_NONCE, n.as_mut_ptr()) };
    assert_eq!(
        r,
        0,
        "nonce of {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    n
}

/// FS_IOC_GET_ENCRYPTION_KEY_STATUS for a v2 identifier: the status word.
fn key_status(dir: &Path, identifier: &[u8; 16]) -> u32 {
    let f = std::fs::File::open(dir).unwrap();
    let mut arg = [0u8; 128];
    arg[0..4].copy_from_slice(&2u32.to_ne_bytes());
    arg[8..24].copy_from_slice(identifier);
    // SAFETY: the buffer is the 128-byte fscrypt_get_key_status_arg.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), GET_ENCRYPTION_KEY_STATUS, arg.as_mut_ptr()) };
    assert_eq!(r, 0, "key status: {}", std::io::Error::last_os_error());
    u32::from_ne_bytes(arg[64..68].try_into().unwrap())
}

fn unhex(s: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn encrypted_directory_through_the_mount() {
    if !fuse_usable("the fscrypt mount test") || !can_loop_mount() {
        println!("SKIP: needs /dev/fuse and loop devices");
        return;
    }
    let place = MountPlace::new("mt-fscrypt", &["mnt", "kernel"]);
    let (img, mnt, kmnt) = (place.img.clone(), place.point(0), place.point(1));
    let key = img.with_extension("key");
    let mut r = xorshift(42);
    std::fs::write(&key, (0..64).map(|_| r() as u8).collect::<Vec<u8>>()).unwrap();
    let (i, k) = (img.to_str().unwrap(), key.to_str().unwrap());
    let cli = Cli(bin());
    cli.ok(&["mkfs", "-O", "encrypt", "--size", "64M", i]);
    cli.ok(&["mkdir", &format!("{i}:/secret")]);
    cli.ok(&["--key", k, "fscrypt", "set-policy", &format!("{i}:/secret")]);
    let pol = cli.ok(&["fscrypt", "get-policy", &format!("{i}:/secret")]);
    let id = pol.split("key identifier ").nth(1).unwrap()[..32].to_string();

    uext4_mount(bin(), &img, &mnt, &["-o", &format!("key={k}")]);
    let m = mnt.display();
    sh(&format!(
        "set -e; cd {m}/secret; echo hello > a; mkdir sub; \
         dd if=/dev/urandom of=sub/big bs=1k count=300 status=none; ln -s a link; \
         test \"$(cat link)\" = hello; lsattr -d . | grep -q E; lsattr a | grep -q E; \
         mv a b; test ! -e a; cp sub/big {m}/plain-copy; cmp sub/big {m}/plain-copy"
    ));
    let sums = sh(&format!(
        "cd {m} && sha256sum secret/b secret/sub/big plain-copy"
    ));
    let n_dir = nonce(&mnt.join("secret"));
    let n_file = nonce(&mnt.join("secret/b"));
    assert_ne!(n_dir, n_file);
    // A plain file has no nonce: ENODATA, as the kernel says.
    let f = std::fs::File::open(mnt.join("plain-copy")).unwrap();
    let mut n = [0u8; 16];
    // SAFETY: as in nonce().
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), GET_ENCRYPTION_NONCE, n.as_mut_ptr()) };
    assert_eq!(
        (rc, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::ENODATA))
    );
    drop(f);
    assert_eq!(key_status(&mnt.join("secret"), &unhex(&id)), 2, "present");
    assert_eq!(key_status(&mnt.join("secret"), &[7u8; 16]), 1, "absent");
    // A policy cannot travel through FUSE: EOPNOTSUPP, not a silent success.
    std::fs::create_dir(mnt.join("empty")).unwrap();
    let d = std::fs::File::open(mnt.join("empty")).unwrap();
    let mut pol = [0u8; 12];
    // SAFETY: the buffer is a fscrypt_policy_v1.
    let rc = unsafe { libc::ioctl(d.as_raw_fd(), SET_ENCRYPTION_POLICY, pol.as_mut_ptr()) };
    assert_eq!(
        (rc, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EOPNOTSUPP))
    );
    drop(d);
    umount_and_wait(&mnt, &img);
    e2fsck_clean(&img);

    // Without the key the mount lists no-key names and refuses contents.
    uext4_mount(bin(), &img, &mnt, &[]);
    let names = sh(&format!("ls {m}/secret | wc -l"));
    assert_eq!(names.trim(), "3");
    sh(&format!(
        "f=$(ls {m}/secret | head -1); if cat {m}/secret/$f 2>/dev/null; then exit 1; fi; true"
    ));
    umount_and_wait(&mnt, &img);

    // The kernel, with the key, reads what the mount wrote, with the same nonces.
    sh(&format!(
        "mount -o loop {i} {km} && python3 -c \"
import fcntl, os, struct
raw = open('{k}', 'rb').read()
arg = struct.pack('=II16s16sII32x', 2, 0, b'', b'', len(raw), 0) + raw
d = os.open('{km}/secret', os.O_RDONLY)
fcntl.ioctl(d, 0xc0506617, bytearray(arg))
\"",
        km = kmnt.display()
    ));
    let km = kmnt.display();
    let ksums = sh(&format!(
        "cd {km} && sha256sum secret/b secret/sub/big plain-copy"
    ));
    let kn_file = nonce(&kmnt.join("secret/b"));
    let kn_dir = nonce(&kmnt.join("secret"));
    sh(&format!("umount {km}"));
    assert_eq!(ksums, sums);
    assert_eq!((kn_dir, kn_file), (n_dir, n_file));
    e2fsck_clean(&img);
}
