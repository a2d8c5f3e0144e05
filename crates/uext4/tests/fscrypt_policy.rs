//! Encryption policies set by uext4 (FS_IOC_SET_ENCRYPTION_POLICY's rules): on images made
//! by `uext4 mkfs -O encrypt` (laid out as mke2fs lays it out), uext4 encrypts an empty
//! directory, fills it, and the kernel, given the key, reads back every name, content and
//! symlink target (scripts/fscrypt-fixtures.py --list); e2fsck is clean after each change.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4::{EncryptionKey, EncryptionPolicy, Fs, MountOptions, ROOT_INO};
use uext4_testkit::hex;
use uext4_testkit::{can_loop_mount, e2fsck_clean, have, is_root, scratch, xorshift};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A 64 MiB image made by uext4 mkfs with `features` on top of ext4's.
fn image(tag: &str, features: &str) -> uext4_testkit::Scratch {
    let s = scratch(tag);
    std::fs::File::create(&s.0)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(64 << 20, Some(4096));
    o.features.apply(features).unwrap();
    let dev = uext4::blockdev::FileDevice::open(&s.0, false).unwrap();
    uext4::mkfs::mkfs(&dev, &o).unwrap();
    s
}

fn open(img: &Path, keys: &[EncryptionKey]) -> std::sync::Arc<Fs> {
    let o = MountOptions {
        keys: keys.to_vec(),
        ..uext4_testkit::opts::no_timer()
    };
    Fs::open_path(img, o).unwrap()
}

fn key(seed: u64) -> (EncryptionKey, Vec<u8>) {
    let mut r = xorshift(seed);
    let raw: Vec<u8> = (0..64).map(|_| r() as u8).collect();
    (EncryptionKey::new(raw.clone()), raw)
}

/// The kernel's view of `dir` (relative to the root) with the key: sorted lines of
/// name, type, size, SHA-256 or target.
fn kernel_view(img: &Path, raw_key: &[u8], version: u8, dir: &str) -> Option<Vec<String>> {
    let kf = img.with_extension("key");
    std::fs::write(&kf, raw_key).unwrap();
    let out = Command::new("python3")
        .arg(root().join("scripts/fscrypt-fixtures.py"))
        .args(["--list"])
        .arg(img)
        .arg(&kf)
        .arg(version.to_string())
        .arg(dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&kf);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if stdout.contains("SKIP:") {
        println!("{stdout}");
        return None;
    }
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let mut lines: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name_hex"].as_str().unwrap();
            let ty = e["type"].as_str().unwrap();
            let more = e["sha256"]
                .as_str()
                .or(e["target_hex"].as_str())
                .unwrap_or("");
            format!("{name} {ty} {} {more}", e["size"].as_u64().unwrap_or(0))
        })
        .collect();
    lines.sort();
    Some(lines)
}

/// Fills encrypted directory `d` and returns what the kernel's view must be.
fn fill(fs: &Fs, d: u32, seed: u64) -> Vec<String> {
    let mut r = xorshift(seed);
    let mut want = Vec::new();
    let mut file = |parent: u32, name: &str, len: usize, want: &mut Vec<String>| {
        let data: Vec<u8> = (0..len).map(|_| r() as u8).collect();
        let ino = fs.create(parent, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_all(ino, 0, &data).unwrap();
        let sum = hex(&Sha256::digest(&data));
        want.push(format!("{} file {len} {sum}", hex(name.as_bytes())));
    };
    file(d, "small", 13, &mut want);
    file(d, "multi-block", 3 * 4096 + 77, &mut want);
    file(d, &"n".repeat(200), 1, &mut want);
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    want.push(format!("{} dir 0 ", hex(b"sub")));
    file(sub, "inner", 5000, &mut want);
    let target = format!("/{}/t", "x".repeat(90));
    fs.symlink(d, b"link", target.as_bytes(), 0, 0).unwrap();
    want.push(format!(
        "{} symlink 0 {}",
        hex(b"link"),
        hex(target.as_bytes())
    ));
    want.sort();
    want
}

#[test]
fn policies_set_by_uext4_are_read_by_the_kernel() {
    let kernel = is_root() && can_loop_mount() && have(&["python3"]);
    if !kernel {
        println!("SKIP (kernel read-back): needs root, loop devices and python3");
    }
    type Make = fn(&EncryptionKey) -> EncryptionPolicy;
    let v1: Make = |k| EncryptionPolicy::v1(k).unwrap();
    let v2: Make = |k| EncryptionPolicy::v2(k).unwrap();
    let cases: [(&str, Make, u8, Option<&str>, u32); 5] = [
        ("v1", v1, 1, None, 32),
        ("v2", v2, 2, None, 32),
        ("v2-pad4", v2, 2, None, 4),
        ("v2-lblk64", v2, 2, Some("iv-ino-lblk-64"), 16),
        ("v2-lblk32", v2, 2, Some("iv-ino-lblk-32"), 32),
    ];
    for (i, (tag, make, version, flag, pad)) in cases.into_iter().enumerate() {
        let img = image(&format!("pol-{tag}"), "encrypt,stable_inodes");
        let (k, raw) = key(100 + i as u64);
        let mut policy = make(&k).with_padding(pad).unwrap();
        if let Some(f) = flag {
            policy = policy.with_flag(f).unwrap();
        }
        let fs = open(&img.0, std::slice::from_ref(&k));
        let d = fs.mkdir(ROOT_INO, b"secret", 0o755, 0, 0).unwrap().ino;
        fs.set_encryption_policy(d, &policy).unwrap();
        // Setting the same policy again is no change; another is EEXIST.
        fs.set_encryption_policy(d, &policy).unwrap();
        let other = policy.with_padding(if pad == 8 { 16 } else { 8 }).unwrap();
        assert_eq!(
            fs.set_encryption_policy(d, &other).unwrap_err().errno(),
            libc::EEXIST,
            "{tag}"
        );
        let st = fs.encryption_policy(d).unwrap().unwrap();
        assert_eq!(st.policy, policy, "{tag}");
        assert!(st.key_present);
        let want = fill(&fs, d, 7 + i as u64);
        // Children inherit the policy with nonces of their own.
        let sub = fs.lookup(d, b"sub").unwrap().ino;
        assert_eq!(fs.encryption_policy(sub).unwrap().unwrap().policy, policy);
        assert_ne!(
            fs.encryption_nonce(sub).unwrap(),
            fs.encryption_nonce(d).unwrap()
        );
        fs.unmount().unwrap();
        e2fsck_clean(&img.0);
        // Without the key: the policy is known, the key is not.
        let fs = open(&img.0, &[]);
        let st = fs.encryption_policy(d).unwrap().unwrap();
        assert!(!st.key_present, "{tag}");
        fs.unmount().unwrap();
        if kernel {
            let got = kernel_view(&img.0, &raw, version, "secret").unwrap();
            // The kernel lists the subdirectory's contents too: compare ours, recursively.
            let got: Vec<String> = got
                .into_iter()
                .map(|l| {
                    let mut f: Vec<&str> = l.split(' ').collect();
                    if f[1] == "dir" {
                        f[2] = "0";
                    }
                    f.join(" ")
                })
                .collect();
            assert_eq!(got, want, "{tag}: the kernel's view");
        }
        e2fsck_clean(&img.0);
    }
}

#[test]
fn set_policy_refuses_as_the_kernel_does() {
    let img = image("pol-refuse", "encrypt");
    let (k, _) = key(1);
    let (other_key, _) = key(2);
    let fs = open(&img.0, std::slice::from_ref(&k));
    let p = EncryptionPolicy::v2(&k).unwrap();
    let errno = |r: uext4::Result<()>| r.unwrap_err().errno();
    // The root stays plain (e2fsck wants lost+found so): ENOTEMPTY while lost+found is
    // there (the emptiness check comes first, as in fscrypt_ioctl_set_policy), EPERM after.
    assert_eq!(
        errno(fs.set_encryption_policy(ROOT_INO, &p)),
        libc::ENOTEMPTY
    );
    fs.rmdir(ROOT_INO, b"lost+found").unwrap();
    assert_eq!(errno(fs.set_encryption_policy(ROOT_INO, &p)), libc::EPERM);
    fs.mkdir(ROOT_INO, b"lost+found", 0o700, 0, 0).unwrap();
    let full = fs.mkdir(ROOT_INO, b"full", 0o755, 0, 0).unwrap().ino;
    fs.create(full, b"f", 0o644, 0, 0).unwrap();
    assert_eq!(errno(fs.set_encryption_policy(full, &p)), libc::ENOTEMPTY);
    let file = fs.create(ROOT_INO, b"file", 0o644, 0, 0).unwrap().ino;
    assert_eq!(errno(fs.set_encryption_policy(file, &p)), libc::ENOTDIR);
    let e = fs.mkdir(ROOT_INO, b"empty", 0o755, 1000, 1000).unwrap().ino;
    // A v2 key that was not given; IV_INO_LBLK_64 without stable_inodes.
    let absent = EncryptionPolicy::v2(&other_key).unwrap();
    assert_eq!(errno(fs.set_encryption_policy(e, &absent)), libc::ENOKEY);
    let lblk = p.with_flag("iv-ino-lblk-64").unwrap();
    assert_eq!(errno(fs.set_encryption_policy(e, &lblk)), libc::EINVAL);
    // Neither owner nor privileged.
    let stranger = uext4::Cred::user(2000, 2000);
    assert_eq!(
        errno(fs.set_encryption_policy_as(&stranger, e, &p)),
        libc::EACCES
    );
    // The owner may; then a plain file is not inherited into it.
    let owner = uext4::Cred::user(1000, 1000);
    fs.set_encryption_policy_as(&owner, e, &p).unwrap();
    assert!(fs.encryption_policy(file).unwrap().is_none());
    assert_eq!(
        fs.encryption_nonce(file).unwrap_err().errno(),
        libc::ENODATA
    );
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);

    // Without the encrypt feature.
    let plain = image("pol-nofeature", "");
    let fs = open(&plain.0, std::slice::from_ref(&k));
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(errno(fs.set_encryption_policy(d, &p)), libc::EOPNOTSUPP);
    fs.unmount().unwrap();
    e2fsck_clean(&plain.0);
}

#[test]
fn policies_round_trip_through_the_ioctl_structures() {
    let (k, _) = key(3);
    for p in [
        EncryptionPolicy::v1(&k).unwrap(),
        EncryptionPolicy::v2(&k).unwrap(),
        EncryptionPolicy::v2(&k)
            .unwrap()
            .with_modes("Adiantum", "adiantum")
            .unwrap()
            .with_flag("direct-key")
            .unwrap(),
    ] {
        let b = p.to_bytes();
        assert_eq!(b.len(), if p.version() == 1 { 12 } else { 24 });
        assert_eq!(b[0], if p.version() == 1 { 0 } else { 2 });
        assert_eq!(EncryptionPolicy::from_bytes(&b).unwrap(), p);
    }
    assert!(EncryptionPolicy::from_bytes(&[2; 12]).is_err());
    assert!(EncryptionPolicy::from_bytes(&[1; 12]).is_err());
    assert!(EncryptionPolicy::v2(&k).unwrap().with_padding(5).is_err());
    assert!(EncryptionPolicy::v2(&k)
        .unwrap()
        .with_modes("ROT13", "AES-256-CTS")
        .is_err());
}

#[test]
fn mkfs_lays_out_encrypt_as_mke2fs_does() {
    if !have(&["mke2fs", "dumpe2fs"]) {
        println!("SKIP: mke2fs and dumpe2fs are needed (e2fsprogs)");
        return;
    }
    let features = |p: &Path| {
        let out = Command::new("dumpe2fs").arg("-h").arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("Filesystem features"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for f in ["encrypt", "encrypt,stable_inodes"] {
        let theirs = scratch("enc-mke2fs");
        uext4_testkit::mke2fs(&theirs.0, "64M", &["-O", f]);
        let ours = image("enc-mkfs", f);
        assert_eq!(features(&ours.0), features(&theirs.0), "{f}");
        e2fsck_clean(&ours.0);
    }
}

#[test]
fn punch_and_zero_range_on_encrypted_files_as_the_kernel() {
    use uext4::FALLOC_FL_ZERO_RANGE;
    use uext4::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
    let img = image("pol-falloc", "encrypt");
    let (k, raw) = key(9);
    let fs = open(&img.0, std::slice::from_ref(&k));
    let d = fs.mkdir(ROOT_INO, b"secret", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy(d, &EncryptionPolicy::v2(&k).unwrap())
        .unwrap();
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let mut r = xorshift(5);
    let mut want: Vec<u8> = (0..6 * 4096 + 500).map(|_| r() as u8).collect();
    fs.write_all(f, 0, &want).unwrap();
    let zero = |want: &mut Vec<u8>, from: usize, to: usize| {
        if to > want.len() {
            want.resize(to, 0);
        }
        want[from..to].fill(0);
    };
    // Partial blocks at both ends and whole blocks between; inside one block; past the end.
    fs.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 9000)
        .unwrap();
    zero(&mut want, 1000, 10000);
    fs.fallocate(f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 13000, 100)
        .unwrap();
    zero(&mut want, 13000, 13100);
    fs.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 24000, 9000)
        .unwrap();
    let n = want.len();
    zero(&mut want, 24000, n);
    fs.fallocate(f, FALLOC_FL_ZERO_RANGE, 20000, 8000).unwrap();
    zero(&mut want, 20000, 28000);
    assert_eq!(fs.getattr(f).unwrap().size, 28000);
    // Plain preallocation past the end: unwritten blocks, never stored zeros (which the
    // kernel would decrypt into noise).
    fs.fallocate(f, 0, 28000, 8192).unwrap();
    zero(&mut want, 28000, 36192);
    assert_eq!(uext4_testkit::read_all(&fs, f), want);
    assert_eq!(
        fs.fallocate(f, FALLOC_FL_COLLAPSE_RANGE, 0, 4096)
            .unwrap_err()
            .errno(),
        libc::EOPNOTSUPP
    );
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);
    let fs = open(&img.0, std::slice::from_ref(&k));
    assert_eq!(uext4_testkit::read_all(&fs, f), want);
    fs.unmount().unwrap();
    if is_root() && can_loop_mount() && have(&["python3"]) {
        let got = kernel_view(&img.0, &raw, 2, "secret").unwrap();
        let line = format!(
            "{} file {} {}",
            hex(b"f"),
            want.len(),
            hex(&Sha256::digest(&want))
        );
        assert_eq!(got, vec![line], "the kernel reads the same bytes");
    }
}
