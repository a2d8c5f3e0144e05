//! An Android-like userdata image: `-O casefold,encrypt,stable_inodes,inline_data,
//! metadata_csum,verity,quota,project` (the set mke2fs accepts for Android), with an
//! encrypted tree the kernel made the way Android's file-based encryption lays it out (v2,
//! AES-256-XTS/CTS, IV_INO_LBLK_64), a casefolded media directory, an encrypted casefolded
//! directory, and small files and a directory the kernel stored inline. The kernel (which has
//! no CONFIG_UNICODE here) fills what it can before casefold is turned on; uext4 makes the
//! casefolded parts; tune2fs turns on verity, quota and project; e2fsck checks every stage.
//! Then the examiner's view: with the key everything reads as the kernel wrote it, under any
//! case spelling where folded; without it, the kernel's own no-key names; the image opens
//! read-write with its quotas kept, and a read-only open never writes it.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4::{EncryptionKey, Fs, MountOptions, ROOT_INO};
use uext4_testkit::{e2fsck_clean, e2fsck_clean_when, have, read_all, scratch};
use uext4_testkit::{hex, unhex};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn open(img: &Path, keys: &[EncryptionKey], ro: bool) -> std::sync::Arc<Fs> {
    let base = if ro {
        MountOptions::ro()
    } else {
        uext4_testkit::opts::no_timer()
    };
    let o = MountOptions {
        keys: keys.to_vec(),
        ..base
    };
    Fs::open_path(img, o).unwrap()
}

fn tune2fs(img: &Path, args: &[&str]) {
    let out = Command::new("tune2fs")
        .args(args)
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tune2fs {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Walks the kernel's listing (entries keyed by parent inode) and checks each against what
/// `fs` shows under its plaintext name.
fn check_with_key(fs: &Fs, entries: &[serde_json::Value]) {
    for e in entries {
        let parent = e["parent_ino"].as_u64().unwrap() as u32;
        let name = unhex(e["name_hex"].as_str().unwrap());
        let ino = fs.lookup(parent, &name).unwrap().ino;
        assert_eq!(ino as u64, e["ino"].as_u64().unwrap());
        match e["type"].as_str().unwrap() {
            "file" => {
                let data = read_all(fs, ino);
                assert_eq!(hex(&Sha256::digest(&data)), e["sha256"].as_str().unwrap());
            }
            "symlink" => {
                let t = fs.readlink(ino).unwrap();
                assert_eq!(hex(&t), e["target_hex"].as_str().unwrap());
            }
            _ => {}
        }
    }
}

#[test]
fn an_android_like_image_reads_as_the_kernel_wrote_it() {
    if !have(&["tune2fs", "e2fsck", "dumpe2fs"]) {
        println!("SKIP: e2fsprogs needed");
        return;
    }
    let img = scratch("android");
    let keyf = img.0.with_extension("key");
    let script = root().join("scripts/fscrypt-fixtures.py");
    let args = [
        std::ffi::OsStr::new("--android"),
        img.0.as_os_str(),
        keyf.as_os_str(),
    ];
    let Some(stdout) = uext4_testkit::fixture_script(&script, &args) else {
        return;
    };
    let k: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let key = EncryptionKey::new(std::fs::read(&keyf).unwrap());
    let _ = std::fs::remove_file(&keyf);
    e2fsck_clean(&img.0);

    // Casefold on (the kernel here cannot mount it any more); uext4 makes the folded parts.
    tune2fs(&img.0, &["-O", "casefold"]);
    let media = k["media_ino"].as_u64().unwrap() as u32;
    let data_ci = k["data_ci_ino"].as_u64().unwrap() as u32;
    let data = k["data_ino"].as_u64().unwrap() as u32;
    let fs = open(&img.0, std::slice::from_ref(&key), false);
    for d in [media, data_ci] {
        let f = fs.get_flags(d).unwrap();
        fs.set_flags(d, f | uext4::flags::FL_CASEFOLD).unwrap();
    }
    let dcim = fs.mkdir(media, b"DCIM", 0o755, 0, 0).unwrap().ino;
    let mut photos = Vec::new();
    for i in 0..40 {
        let name = format!("IMG_{i:04}.JPG");
        let f = fs.create(dcim, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let body = format!("photo {i} ").repeat(i + 1);
        fs.write_all(f, 0, body.as_bytes()).unwrap();
        photos.push((name, body));
    }
    let notes = fs
        .create(data_ci, "Notizen-Straße.txt".as_bytes(), 0o600, 0, 0)
        .unwrap()
        .ino;
    fs.write_all(notes, 0, b"encrypted and folded").unwrap();
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);

    // The rest of Android's set: verity, quota and project ids.
    tune2fs(
        &img.0,
        &[
            "-O",
            "verity,quota,project",
            "-Q",
            "usrquota,grpquota,prjquota",
        ],
    );
    e2fsck_clean(&img.0);
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&img.0)
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_string();
    for f in [
        "casefold",
        "encrypt",
        "stable_inodes",
        "inline_data",
        "metadata_csum",
        "verity",
        "quota",
        "project",
    ] {
        assert!(head.contains(f), "dumpe2fs does not show {f}:\n{head}");
    }

    // Asked for read-write, it opens read-write: usage goes into the quota files as the
    // tree changes, and e2fsck (which checks it) finds it right.
    let fs = open(&img.0, std::slice::from_ref(&key), false);
    assert!(!fs.is_read_only(), "{:?}", fs.read_only_reason());
    fs.mkdir(ROOT_INO, b"x", 0o755, 1000, 1000).unwrap();
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after a read-write open of the quota image");
    let before = std::fs::read(&img.0).unwrap();

    // With the key: every encrypted file, link and name as the kernel wrote it; the folded
    // directories under any spelling; the inline files.
    let fs = open(&img.0, std::slice::from_ref(&key), true);
    check_with_key(&fs, k["data"].as_array().unwrap());
    check_with_key(&fs, k["system"].as_array().unwrap());
    let dcim = fs.lookup(media, b"dcim").unwrap().ino;
    for (name, body) in &photos {
        let f = fs.lookup(dcim, name.to_lowercase().as_bytes()).unwrap().ino;
        assert_eq!(read_all(&fs, f), body.as_bytes());
    }
    let n = fs
        .lookup(data_ci, "NOTIZEN-STRASSE.TXT".as_bytes())
        .unwrap()
        .ino;
    assert_eq!(read_all(&fs, n), b"encrypted and folded");
    fs.unmount().unwrap();

    // Without it: the kernel's no-key names, byte for byte; contents refused.
    let fs = open(&img.0, &[], true);
    for e in k["data"].as_array().unwrap() {
        let parent = e["parent_ino"].as_u64().unwrap() as u32;
        let nokey = unhex(e["nokey_name_hex"].as_str().unwrap());
        let ino = fs.lookup(parent, &nokey).unwrap().ino;
        assert_eq!(ino as u64, e["ino"].as_u64().unwrap());
        if e["type"] == "file" && e["size"].as_u64().unwrap() > 0 {
            let mut buf = [0u8; 16];
            assert_eq!(fs.read(ino, 0, &mut buf).unwrap_err().errno(), libc::ENOKEY);
        }
    }
    let mut listed = 0;
    fs.readdir(data, 0, &mut |e| {
        listed += (e.name != b"." && e.name != b"..") as usize;
        true
    })
    .unwrap();
    let direct = k["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["parent_ino"].as_u64() == Some(data as u64))
        .count();
    assert_eq!(listed, direct);
    fs.unmount().unwrap();
    assert!(
        std::fs::read(&img.0).unwrap() == before,
        "a read-only open changed the image"
    );
    e2fsck_clean(&img.0);
}
