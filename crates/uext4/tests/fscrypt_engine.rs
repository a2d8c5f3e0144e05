//! fscrypt through the engine, against images the kernel encrypted
//! (scripts/fscrypt-fixtures.py): with the key, every name, content and symlink target is
//! the kernel's; without it, the listing is the kernel's no-key listing and contents are
//! refused with ENOKEY. Then uext4 writes into the kernel's encrypted directories, e2fsck
//! checks the image, and the kernel reads back what uext4 wrote (the script's verify mode).

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use uext4::{EncryptionKey, Fs, MountOptions};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the fixture script into a fresh directory: (dir, manifest), or None (SKIP printed).
fn fixtures(tag: &str) -> Option<(PathBuf, serde_json::Value)> {
    let out = std::env::temp_dir().join(format!("uext4-fscrypt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new("python3").arg(root().join("scripts/fscrypt-fixtures.py")).arg(&out).output();
    let Ok(run) = run else {
        eprintln!("SKIP: no python3");
        return None;
    };
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    if stdout.contains("SKIP:") {
        eprintln!("{stdout}");
        let _ = std::fs::remove_dir_all(&out);
        return None;
    }
    assert!(run.status.success(), "fixture script failed: {stdout}{}", String::from_utf8_lossy(&run.stderr));
    let manifest = serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    Some((out, manifest))
}

fn key_of(out: &Path, pol: &serde_json::Value) -> EncryptionKey {
    EncryptionKey::new(std::fs::read(out.join(pol["key_file"].as_str().unwrap())).unwrap())
}

fn open(img: &Path, keys: Vec<EncryptionKey>, ro: bool) -> Arc<Fs> {
    let base = if ro { MountOptions::ro() } else { MountOptions::default() };
    Fs::open_path(img, MountOptions { keys, ..base }).unwrap()
}

fn listing(fs: &Fs, dir: u32) -> Vec<(Vec<u8>, u32)> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.push((e.name, e.ino));
        }
        true
    })
    .unwrap();
    out
}

fn read_all(fs: &Fs, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut buf = vec![0u8; size as usize + 10];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn policies(manifest: &serde_json::Value) -> Vec<serde_json::Value> {
    manifest["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p.get("skipped").is_none())
        .cloned()
        .collect()
}

fn image_of(out: &Path, manifest: &serde_json::Value, pol: &serde_json::Value) -> PathBuf {
    out.join(manifest["images"][pol["image"].as_str().unwrap()]["image"].as_str().unwrap())
}

#[test]
fn kernel_images_read_with_and_without_key() {
    let Some((out, manifest)) = fixtures("read") else { return };
    let mut checked = 0;
    for pol in policies(&manifest) {
        let name = pol["name"].as_str().unwrap();
        let img = image_of(&out, &manifest, &pol);
        let dir_ino = pol["dir_ino"].as_u64().unwrap() as u32;
        let entries = pol["entries"].as_array().unwrap();
        // With the key.
        let fs = open(&img, vec![key_of(&out, &pol)], true);
        let mut by_dir: HashMap<u32, Vec<(Vec<u8>, u32)>> = HashMap::new();
        for e in entries {
            by_dir
                .entry(e["parent_ino"].as_u64().unwrap() as u32)
                .or_default()
                .push((unhex(e["name_hex"].as_str().unwrap()), e["ino"].as_u64().unwrap() as u32));
        }
        for (dir, want) in &by_dir {
            let mut got = listing(&fs, *dir);
            let mut want = want.clone();
            got.sort();
            want.sort();
            assert_eq!(got, want, "{name}: listing of {dir} with the key");
        }
        for e in entries {
            let ino = e["ino"].as_u64().unwrap() as u32;
            let parent = e["parent_ino"].as_u64().unwrap() as u32;
            let nm = unhex(e["name_hex"].as_str().unwrap());
            assert_eq!(fs.lookup(parent, &nm).unwrap().ino, ino, "{name}: lookup {}", String::from_utf8_lossy(&nm));
            match e["type"].as_str().unwrap() {
                "file" => {
                    let data = read_all(&fs, ino);
                    assert_eq!(data.len() as u64, e["size"].as_u64().unwrap());
                    assert_eq!(hex(&Sha256::digest(&data)), e["sha256"].as_str().unwrap(), "{name}: contents of {ino}");
                    // Unaligned reads decrypt the same bytes.
                    if data.len() > 5000 {
                        let mut b = vec![0u8; 3000];
                        assert_eq!(fs.read(ino, 4000, &mut b).unwrap(), 3000);
                        assert_eq!(b, data[4000..7000]);
                    }
                    fs.open(ino).unwrap();
                    fs.release(ino).unwrap();
                }
                "symlink" => {
                    assert_eq!(hex(&fs.readlink(ino).unwrap()), e["target_hex"].as_str().unwrap(), "{name}: target of {ino}");
                }
                _ => {}
            }
        }
        drop(fs);
        // Without it: the kernel's no-key names, stat works, contents are ENOKEY.
        let fs = open(&img, vec![], true);
        for e in entries {
            let ino = e["ino"].as_u64().unwrap() as u32;
            let parent = e["parent_ino"].as_u64().unwrap() as u32;
            let nokey = e["nokey_name_hex"].as_str().unwrap();
            let got = listing(&fs, parent);
            let found = got.iter().find(|(_, i)| *i == ino).map(|(n, _)| hex(n));
            assert_eq!(found.as_deref(), Some(nokey), "{name}: no-key name of {ino}");
            assert_eq!(fs.lookup(parent, &unhex(nokey)).unwrap().ino, ino, "{name}: no-key lookup of {ino}");
            assert!(fs.getattr(ino).is_ok());
            match e["type"].as_str().unwrap() {
                "file" if e["size"].as_u64().unwrap() > 0 => {
                    let mut b = [0u8; 16];
                    assert_eq!(fs.read(ino, 0, &mut b).unwrap_err().errno(), libc::ENOKEY);
                    assert_eq!(fs.open(ino).unwrap_err().errno(), libc::ENOKEY);
                }
                "symlink" => {
                    if let Some(t) = e.get("nokey_target_hex").and_then(|t| t.as_str()) {
                        assert_eq!(hex(&fs.readlink(ino).unwrap()), t, "{name}: no-key target of {ino}");
                    }
                }
                _ => {}
            }
        }
        // A wrong key is no key.
        drop(fs);
        let fs = open(&img, vec![EncryptionKey::new(vec![7u8; 64])], true);
        let got = listing(&fs, dir_ino);
        assert!(got.iter().all(|(n, _)| entries.iter().any(|e| e["nokey_name_hex"].as_str() == Some(&hex(n)))));
        checked += 1;
        eprintln!("{name}: ok");
    }
    assert!(checked > 0);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_keys_are_one_line_errors() {
    let dir = std::env::temp_dir().join(format!("uext4-fscrypt-badkey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("a.img");
    uext4::mkfs::make_image(&img, 16 << 20).unwrap();
    let e = Fs::open_path(&img, MountOptions { keys: vec![EncryptionKey::new(vec![1u8; 5])], ..MountOptions::ro() })
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(msg.contains("encryption key 1") && !msg.contains('\n'), "{msg}");
    let dbg = format!("{:?}", MountOptions { keys: vec![EncryptionKey::new(vec![0xab; 32])], ..MountOptions::ro() });
    assert!(!dbg.contains("171") && !dbg.to_lowercase().contains("abab"), "{dbg}");
    let _ = std::fs::remove_dir_all(&dir);
}
