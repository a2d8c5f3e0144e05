//! The engine's POSIX ACL and set-ID rules, through the library (no FUSE): default ACLs
//! inherited by what is created in a directory (in the create's handle, as the kernel's
//! posix_acl_create), the umask only without one, the mode from an access ACL
//! (posix_acl_update_mode), chmod keeping the ACL in step, and set-ID bits and
//! `security.capability` taken away by writes, truncates and chowns (file_remove_privs).
//! Every image passes `e2fsck -fn`.

mod common;

use common::*;
use std::sync::Arc;
use uext4::format::xattr::{AclEntry, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER, ACL_USER_OBJ};
use uext4::SetAttr;
use uext4::Umask;
use uext4::XattrFlags;
use uext4::{Cred, Groups};
use uext4::{Error, Fs, MountOptions};

const U: u32 = u32::MAX;
const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";
const CAP: &[u8] = b"security.capability";

fn acl_vfs(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// (tag, perm) of each entry of a VFS-form ACL.
fn entries(v: &[u8]) -> Vec<(u16, u16)> {
    v[4..]
        .chunks(8)
        .map(|c| {
            (
                u16::from_le_bytes([c[0], c[1]]),
                u16::from_le_bytes([c[2], c[3]]),
            )
        })
        .collect()
}

fn acl(entries: &[(u16, u16, u32)]) -> Vec<AclEntry> {
    entries
        .iter()
        .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
        .collect()
}

/// u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x
fn default_acl() -> Vec<u8> {
    acl_vfs(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 5, U),
        (ACL_MASK, 7, U),
        (ACL_OTHER, 5, U),
    ])
}

fn image(tag: &str) -> (Scratch, Arc<Fs>) {
    let img = scratch(tag);
    mke2fs(&img.0, "32M", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    (img, fs)
}

fn mode(fs: &Fs, ino: u32) -> u16 {
    fs.getattr(ino).unwrap().mode & 0o7777
}

fn done(img: &Scratch, fs: Arc<Fs>) {
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
}

#[test]
fn create_masq_limits_mode_and_acl_as_the_kernel() {
    // default: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x ; open(0666)
    let mut a = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 5, 0),
        (ACL_MASK, 7, 0),
        (ACL_OTHER, 5, 0),
    ]);
    assert_eq!(uext4::acl_create_masq(&mut a, 0o100666), 0o100664);
    assert_eq!(uext4::acl_mode_bits(&a), 0o664);
    assert!(!uext4::acl_is_equivalent_to_mode(&a));
    // Without a mask the owning group entry takes the group bits.
    let mut b = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_GROUP_OBJ, 7, 0),
        (ACL_OTHER, 0, 0),
    ]);
    assert_eq!(uext4::acl_create_masq(&mut b, 0o40755), 0o40750);
    assert!(uext4::acl_is_equivalent_to_mode(&b));
}

#[test]
fn chmod_rule_updates_the_mask_not_the_owning_group() {
    let mut a = acl(&[
        (ACL_USER_OBJ, 7, 0),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 7, 0),
        (ACL_MASK, 7, 0),
        (ACL_OTHER, 7, 0),
    ]);
    uext4::acl_chmod(&mut a, 0o640);
    assert_eq!(uext4::acl_mode_bits(&a), 0o640);
    assert_eq!(
        a[2].perm, 7,
        "the owning group entry keeps its bits under a mask"
    );
}

#[test]
fn a_default_acl_is_inherited_by_files_and_directories_created_through_the_library() {
    let (img, fs) = image("acl-inherit");
    let d = fs.mkdir(2, b"d", 0o755, 0, 0).unwrap().ino;
    fs.setxattr(d, DEFAULT, &default_acl(), XattrFlags::Any)
        .unwrap();
    let user = Cred::user(1000, 1000);
    // The umask is not applied under a default ACL: the ACL limits the mode instead.
    let f = fs
        .create_as(&user, d, b"f", 0o666, Umask::Acl(0o077))
        .unwrap();
    assert_eq!((f.mode & 0o7777, f.uid, f.gid), (0o664, 1000, 1000));
    let a = fs.getxattr(f.ino, ACCESS).unwrap();
    assert_eq!(
        entries(&a),
        [
            (ACL_USER_OBJ, 6),
            (ACL_USER, 7),
            (ACL_GROUP_OBJ, 5),
            (ACL_MASK, 6),
            (ACL_OTHER, 4)
        ]
    );
    assert!(matches!(fs.getxattr(f.ino, DEFAULT), Err(Error::NoAttr)));

    // A directory gets the access ACL and keeps the default one for what it will hold.
    let sub = fs
        .mkdir_as(&user, d, b"sub", 0o777, Umask::Acl(0o077))
        .unwrap();
    assert_eq!(sub.mode & 0o7777, 0o775);
    assert_eq!(fs.getxattr(sub.ino, DEFAULT).unwrap(), default_acl());
    assert!(fs.getxattr(sub.ino, ACCESS).is_ok());
    let g = fs
        .create_as(&user, sub.ino, b"g", 0o640, Umask::Acl(0o022))
        .unwrap();
    assert_eq!(g.mode & 0o7777, 0o640);
    assert_eq!(
        entries(&fs.getxattr(g.ino, ACCESS).unwrap())[3],
        (ACL_MASK, 4)
    );

    // The image tools' create (explicit owner, no umask) inherits as well, and so do
    // mknod and O_TMPFILE; symbolic links do not.
    let raw = fs.create(d, b"raw", 0o644, 0, 0).unwrap();
    assert_eq!(raw.mode & 0o7777, 0o644);
    assert!(fs.getxattr(raw.ino, ACCESS).is_ok());
    let fifo = fs
        .mknod_as(&user, d, b"fifo", 0o010666, 0, Umask::Acl(0o022))
        .unwrap();
    assert_eq!(fifo.mode & 0o7777, 0o664);
    let t = fs.tmpfile_as(&user, d, 0o600, Umask::Acl(0o022)).unwrap();
    assert_eq!(t.mode & 0o7777, 0o600);
    assert!(fs.getxattr(t.ino, ACCESS).is_ok());
    fs.link(t.ino, d, b"was-tmp").unwrap();
    fs.release(t.ino).unwrap();
    let l = fs.symlink_as(&user, d, b"link", b"f").unwrap();
    assert_eq!(l.mode & 0o7777, 0o777);
    assert!(matches!(fs.getxattr(l.ino, ACCESS), Err(Error::NoAttr)));
    done(&img, fs);

    // On disk as set.
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let f = fs.lookup(d, b"f").unwrap();
    assert_eq!(f.mode & 0o7777, 0o664);
    assert!(fs.getxattr(f.ino, ACCESS).is_ok());
    let sub = fs.lookup(d, b"sub").unwrap();
    assert_eq!(fs.getxattr(sub.ino, DEFAULT).unwrap(), default_acl());
}

#[test]
fn without_a_default_acl_the_umask_applies() {
    let (img, fs) = image("acl-umask");
    let user = Cred::user(1000, 1000);
    let f = fs
        .create_as(&user, 2, b"f", 0o666, Umask::Acl(0o022))
        .unwrap();
    assert_eq!(f.mode & 0o7777, 0o644);
    assert!(matches!(fs.getxattr(f.ino, ACCESS), Err(Error::NoAttr)));
    let s = fs
        .mkdir_as(&user, 2, b"s", 0o777, Umask::Acl(0o027))
        .unwrap();
    assert_eq!(s.mode & 0o7777, 0o750);
    // With ACLs off (noacl) a default ACL is not inherited and the umask applies.
    let d = fs.mkdir(2, b"d", 0o777, 0, 0).unwrap().ino;
    fs.setxattr(d, DEFAULT, &default_acl(), XattrFlags::Any)
        .unwrap();
    let g = fs
        .create_as(&user, d, b"g", 0o666, Umask::NoAcl(0o022))
        .unwrap();
    assert_eq!(g.mode & 0o7777, 0o644);
    assert!(matches!(fs.getxattr(g.ino, ACCESS), Err(Error::NoAttr)));
    done(&img, fs);
}

#[test]
fn new_inodes_take_the_group_of_a_set_group_id_directory() {
    let (img, fs) = image("acl-sgid-dir");
    let d = fs.mkdir(2, b"d", 0o2777, 0, 77).unwrap().ino;
    let user = Cred::user(1000, 1000);
    let f = fs.create_as(&user, d, b"f", 0o2755, Umask::Acl(0)).unwrap();
    assert_eq!((f.uid, f.gid), (1000, 77));
    assert_eq!(
        f.mode & 0o7777,
        0o755,
        "set-group-ID of a group-executable file of a group the caller is not in is dropped"
    );
    let s = fs.mkdir_as(&user, d, b"s", 0o755, Umask::Acl(0)).unwrap();
    assert_eq!((s.gid, s.mode & 0o7777), (77, 0o2755));
    assert_eq!(fs.owner_in(&user, d).unwrap(), (1000, 77));
    assert_eq!(fs.owner_in(&user, 2).unwrap(), (1000, 1000));
    done(&img, fs);
}

#[test]
fn an_access_acl_sets_the_mode_and_a_caller_outside_the_group_loses_set_group_id() {
    let (img, fs) = image("acl-update-mode");
    let f = fs.create(2, b"f", 0o2775, 1000, 50).unwrap().ino;
    let outsider = Cred::user(1000, 1000);
    let plain = acl_vfs(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_OTHER, 4, U),
    ]);
    fs.setxattr_as(&outsider, f, ACCESS, &plain, XattrFlags::Any)
        .unwrap();
    assert_eq!(mode(&fs, f), 0o644);
    assert!(
        matches!(fs.getxattr(f, ACCESS), Err(Error::NoAttr)),
        "an ACL equivalent to the mode is not stored"
    );
    // A member of the group keeps set-group-ID; a named entry makes the ACL stored.
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o2775),
            ..Default::default()
        },
    )
    .unwrap();
    let member = Cred {
        groups: Groups::List(vec![50]),
        ..Cred::user(1000, 1000)
    };
    let named = acl_vfs(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 7, 2000),
        (ACL_GROUP_OBJ, 5, U),
        (ACL_MASK, 5, U),
        (ACL_OTHER, 0, U),
    ]);
    fs.setxattr_as(&member, f, ACCESS, &named, XattrFlags::Any)
        .unwrap();
    assert_eq!(mode(&fs, f), 0o2750);
    // chmod keeps the stored ACL in step: the mask follows the group bits.
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o2710),
            ..Default::default()
        },
    )
    .unwrap();
    let a = entries(&fs.getxattr(f, ACCESS).unwrap());
    assert_eq!(a[0], (ACL_USER_OBJ, 7));
    assert_eq!(a[3], (ACL_MASK, 1));
    assert_eq!(a[4], (ACL_OTHER, 0));
    done(&img, fs);
}

#[test]
fn a_write_by_a_user_clears_set_id_bits_and_the_capability() {
    let (img, fs) = image("acl-killpriv");
    let user = Cred::user(1000, 1000);
    let f = fs.create(2, b"f", 0o6755, 0, 0).unwrap().ino;
    fs.write(f, 0, &[1u8; 8192]).unwrap();
    fs.setxattr(f, CAP, &[1, 0, 0, 2, 0, 0, 0, 0], XattrFlags::Any)
        .unwrap();
    // An overwrite (the fast path) by a user: both set-ID bits and the capability go.
    let (n, changed) = fs.write_as(&user, f, 0, b"x").unwrap();
    assert_eq!((n, changed), (1, true));
    assert_eq!(mode(&fs, f), 0o755);
    assert!(matches!(fs.getxattr(f, CAP), Err(Error::NoAttr)));
    // Nothing left to remove: the next write changes nothing.
    assert_eq!(fs.write_as(&user, f, 1, b"y").unwrap(), (1, false));

    // Root keeps set-user-ID but still loses the capability.
    let r = fs.create(2, b"r", 0o4755, 0, 0).unwrap().ino;
    fs.setxattr(r, CAP, &[1, 0, 0, 2, 0, 0, 0, 0], XattrFlags::Any)
        .unwrap();
    assert_eq!(fs.write_as(&Cred::root(), r, 0, b"z").unwrap(), (1, false));
    assert_eq!(mode(&fs, r), 0o4755);
    assert!(matches!(fs.getxattr(r, CAP), Err(Error::NoAttr)));

    // Set-group-ID without group execute stays for a member, goes for an outsider.
    let g = fs.create(2, b"g", 0o2644, 0, 1000).unwrap().ino;
    fs.write_as(&user, g, 0, b"a").unwrap();
    assert_eq!(mode(&fs, g), 0o2644);
    fs.write_as(&Cred::user(2000, 2000), g, 0, b"b").unwrap();
    assert_eq!(mode(&fs, g), 0o644);

    // fallocate changes the file as a write does.
    let h = fs.create(2, b"h", 0o4755, 0, 0).unwrap().ino;
    assert!(fs.fallocate_as(&user, h, 0, 0, 4096).unwrap());
    assert_eq!(mode(&fs, h), 0o755);
    done(&img, fs);
}

#[test]
fn truncate_and_chown_take_set_id_bits_and_the_capability_away() {
    let (img, fs) = image("acl-chown");
    let user = Cred::user(1000, 1000);
    let f = fs.create(2, b"f", 0o6755, 1000, 1000).unwrap().ino;
    fs.write(f, 0, &[1u8; 100]).unwrap();
    // Root's truncate keeps the bits; a user's takes them.
    let size = |s| SetAttr {
        size: Some(s),
        ..Default::default()
    };
    fs.setattr_as(&Cred::root(), f, &size(50)).unwrap();
    assert_eq!(mode(&fs, f), 0o6755);
    fs.setattr_as(&user, f, &size(10)).unwrap();
    assert_eq!(mode(&fs, f), 0o755);
    // A chown, even root's, takes set-user-ID, group-executable set-group-ID and the
    // capability.
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o6755),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setxattr(f, CAP, &[1, 0, 0, 2, 0, 0, 0, 0], XattrFlags::Any)
        .unwrap();
    let chown = SetAttr {
        uid: Some(0),
        ..Default::default()
    };
    fs.setattr_as(&Cred::root(), f, &chown).unwrap();
    assert_eq!(mode(&fs, f), 0o755);
    assert!(matches!(fs.getxattr(f, CAP), Err(Error::NoAttr)));
    // The image tools' setattr changes only what it is asked to.
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o4755),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        f,
        &SetAttr {
            uid: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(mode(&fs, f), 0o4755);
    // Directories keep their set-group-ID.
    let d = fs.mkdir(2, b"d", 0o2775, 0, 0).unwrap().ino;
    fs.setattr_as(&Cred::root(), d, &chown).unwrap();
    assert_eq!(mode(&fs, d), 0o2775);
    done(&img, fs);
}
