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
use uext4_testkit::{hex, unhex};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the fixture script into a fresh directory: (dir, manifest), or None (SKIP printed).
fn fixtures(tag: &str) -> Option<(PathBuf, serde_json::Value)> {
    let out = std::env::temp_dir().join(format!("uext4-fscrypt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let script = root().join("scripts/fscrypt-fixtures.py");
    if uext4_testkit::fixture_script(&script, &[out.as_os_str()]).is_none() {
        let _ = std::fs::remove_dir_all(&out);
        return None;
    }
    let manifest =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    Some((out, manifest))
}

fn key_of(out: &Path, pol: &serde_json::Value) -> EncryptionKey {
    EncryptionKey::new(std::fs::read(out.join(pol["key_file"].as_str().unwrap())).unwrap())
}

fn open(img: &Path, keys: Vec<EncryptionKey>, ro: bool) -> Arc<Fs> {
    let base = if ro {
        MountOptions::ro()
    } else {
        MountOptions::default()
    };
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
    out.join(
        manifest["images"][pol["image"].as_str().unwrap()]["image"]
            .as_str()
            .unwrap(),
    )
}

#[test]
fn kernel_images_read_with_and_without_key() {
    let Some((out, manifest)) = fixtures("read") else {
        return;
    };
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
                .push((
                    unhex(e["name_hex"].as_str().unwrap()),
                    e["ino"].as_u64().unwrap() as u32,
                ));
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
            assert_eq!(
                fs.lookup(parent, &nm).unwrap().ino,
                ino,
                "{name}: lookup {}",
                String::from_utf8_lossy(&nm)
            );
            match e["type"].as_str().unwrap() {
                "file" => {
                    let data = read_all(&fs, ino);
                    assert_eq!(data.len() as u64, e["size"].as_u64().unwrap());
                    assert_eq!(
                        hex(&Sha256::digest(&data)),
                        e["sha256"].as_str().unwrap(),
                        "{name}: contents of {ino}"
                    );
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
                    assert_eq!(
                        hex(&fs.readlink(ino).unwrap()),
                        e["target_hex"].as_str().unwrap(),
                        "{name}: target of {ino}"
                    );
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
            assert_eq!(
                found.as_deref(),
                Some(nokey),
                "{name}: no-key name of {ino}"
            );
            assert_eq!(
                fs.lookup(parent, &unhex(nokey)).unwrap().ino,
                ino,
                "{name}: no-key lookup of {ino}"
            );
            assert!(fs.getattr(ino).is_ok());
            match e["type"].as_str().unwrap() {
                "file" if e["size"].as_u64().unwrap() > 0 => {
                    let mut b = [0u8; 16];
                    assert_eq!(fs.read(ino, 0, &mut b).unwrap_err().errno(), libc::ENOKEY);
                    assert_eq!(fs.open(ino).unwrap_err().errno(), libc::ENOKEY);
                }
                "symlink" => {
                    if let Some(t) = e.get("nokey_target_hex").and_then(|t| t.as_str()) {
                        assert_eq!(
                            hex(&fs.readlink(ino).unwrap()),
                            t,
                            "{name}: no-key target of {ino}"
                        );
                    }
                }
                _ => {}
            }
        }
        // A wrong key is no key.
        drop(fs);
        let fs = open(&img, vec![EncryptionKey::new(vec![7u8; 64])], true);
        let got = listing(&fs, dir_ino);
        assert!(got.iter().all(|(n, _)| entries
            .iter()
            .any(|e| e["nokey_name_hex"].as_str() == Some(&hex(n)))));
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
    let e = Fs::open_path(
        &img,
        MountOptions {
            keys: vec![EncryptionKey::new(vec![1u8; 5])],
            ..MountOptions::ro()
        },
    )
    .err()
    .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("encryption key 1") && !msg.contains('\n'),
        "{msg}"
    );
    // The refused open left the image as mkfs made it.
    uext4_testkit::e2fsck_clean(&img);
    let dbg = format!(
        "{:?}",
        MountOptions {
            keys: vec![EncryptionKey::new(vec![0xab; 32])],
            ..MountOptions::ro()
        }
    );
    assert!(
        !dbg.contains("171") && !dbg.to_lowercase().contains("abab"),
        "{dbg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What uext4 writes into a kernel-made encrypted directory, the kernel reads back with the
/// key; e2fsck finds nothing wrong.
#[test]
fn writes_read_back_by_the_kernel() {
    let Some((out, manifest)) = fixtures("write") else {
        return;
    };
    let mut checked = 0;
    for pol in policies(&manifest) {
        let name = pol["name"].as_str().unwrap();
        let img = image_of(&out, &manifest, &pol);
        let dir = pol["dir_ino"].as_u64().unwrap() as u32;
        let fs = open(&img, vec![key_of(&out, &pol)], false);
        let mut rnd = uext4_testkit::xorshift(name.len() as u64 + 7);
        let mut bytes = |n: usize| (0..n).map(|_| rnd() as u8).collect::<Vec<u8>>();
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = Vec::new(); // (path, contents)
        let d = fs.mkdir(dir, b"uext4-dir", 0o755, 0, 0).unwrap().ino;
        for (fname, parent) in [
            (&b"u-small"[..], dir),
            (b"u-multi", dir),
            (b"u-sparse", d),
            (b"u-append", d),
            (b"u-trunc", dir),
            (b"u-zeros-trunc", dir),
        ] {
            let ino = fs.create(parent, fname, 0o644, 0, 0).unwrap().ino;
            let data = match fname {
                b"u-small" => {
                    let b = b"written by uext4\n".to_vec();
                    fs.write_all(ino, 0, &b).unwrap();
                    b
                }
                b"u-multi" => {
                    let b = bytes(3 * 4096 + 1234);
                    fs.write_all(ino, 0, &b).unwrap();
                    // An unaligned overwrite in the middle.
                    let patch = bytes(5000);
                    fs.write_all(ino, 3000, &patch).unwrap();
                    let mut b = b;
                    b[3000..8000].copy_from_slice(&patch);
                    b
                }
                b"u-sparse" => {
                    let tail = bytes(777);
                    fs.write_all(ino, 6 * 4096 + 100, &tail).unwrap();
                    let mut b = vec![0u8; 6 * 4096 + 100];
                    b.extend_from_slice(&tail);
                    b
                }
                b"u-append" => {
                    let mut b = Vec::new();
                    for i in 0..7 {
                        let piece = bytes(1000 + i * 333);
                        fs.write_all(ino, b.len() as u64, &piece).unwrap();
                        b.extend_from_slice(&piece);
                    }
                    b
                }
                b"u-zeros-trunc" => {
                    // Zeros written (stored as ciphertext, not a hole), then cut inside the
                    // block: the block keeps reading as zeros.
                    fs.write_all(ino, 0, &vec![0u8; 2 * 4096]).unwrap();
                    fs.truncate(ino, 4096 + 10).unwrap();
                    vec![0u8; 4096 + 10]
                }
                _ => {
                    let b = bytes(5 * 4096);
                    fs.write_all(ino, 0, &b).unwrap();
                    fs.truncate(ino, 2 * 4096 + 10).unwrap();
                    fs.truncate(ino, 3 * 4096).unwrap(); // extends: zeros after 2*4096+10
                    let mut b = b[..2 * 4096 + 10].to_vec();
                    b.resize(3 * 4096, 0);
                    b
                }
            };
            assert_eq!(
                read_all(&fs, ino),
                data,
                "{name}: uext4 reads back {}",
                String::from_utf8_lossy(fname)
            );
            let path = if parent == dir {
                fname.to_vec()
            } else {
                [&b"uext4-dir/"[..], fname].concat()
            };
            want.push((path, data));
        }
        fs.symlink(dir, b"u-fast", b"u-small", 0, 0).unwrap();
        let long = format!("/{}/target", "l".repeat(200));
        fs.symlink(d, b"u-slow", long.as_bytes(), 0, 0).unwrap();
        // A long name and a removal, a rename within the directory and a cross-policy one.
        let longname = vec![b'z'; 250];
        let z = fs.create(dir, &longname, 0o644, 0, 0).unwrap().ino;
        fs.write_all(z, 0, b"z").unwrap();
        let gone = fs.create(dir, b"u-gone", 0o644, 0, 0).unwrap().ino;
        fs.write_all(gone, 0, b"bye").unwrap();
        fs.unlink(dir, b"u-gone").unwrap();
        fs.rename(dir, b"u-small", dir, b"u-renamed", Default::default())
            .unwrap();
        let plain = fs
            .mkdir(
                uext4::ROOT_INO,
                format!("plain-{name}").as_bytes(),
                0o755,
                0,
                0,
            )
            .unwrap()
            .ino;
        // Out of an encrypted directory and back (same policy) is allowed, as the kernel
        // allows it; an unencrypted file into one is EXDEV, by rename or link.
        fs.rename(dir, b"u-renamed", plain, b"x", Default::default())
            .unwrap();
        fs.rename(plain, b"x", dir, b"u-renamed", Default::default())
            .unwrap();
        let p = fs.create(plain, b"p", 0o644, 0, 0).unwrap().ino;
        assert_eq!(
            fs.rename(plain, b"p", dir, b"p", Default::default())
                .unwrap_err()
                .errno(),
            libc::EXDEV
        );
        assert_eq!(fs.link(p, dir, b"p").unwrap_err().errno(), libc::EXDEV);
        fs.unmount().unwrap();
        uext4_testkit::e2fsck_clean(&img);

        // Without the key: no-key names can remove, names cannot be added.
        let fs = open(&img, vec![], false);
        assert_eq!(
            fs.create(dir, b"nope", 0o644, 0, 0).unwrap_err().errno(),
            libc::ENOKEY
        );
        let target = listing(&fs, dir)
            .into_iter()
            .find(|(_, i)| *i == z)
            .unwrap()
            .0;
        fs.unlink(dir, &target).unwrap();
        fs.unmount().unwrap();
        uext4_testkit::e2fsck_clean(&img);

        // The kernel, with the key.
        let version = pol["version"].as_u64().unwrap();
        let o = Command::new("python3")
            .arg(root().join("scripts/fscrypt-fixtures.py"))
            .args([
                "--list",
                img.to_str().unwrap(),
                out.join(pol["key_file"].as_str().unwrap())
                    .to_str()
                    .unwrap(),
            ])
            .arg(version.to_string())
            .arg(name)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "{name}: --list: {stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        if stdout.contains("SKIP:") {
            eprintln!("{stdout}");
            continue;
        }
        let kernel: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
        let by_name = |n: &[u8]| {
            kernel
                .iter()
                .find(|e| unhex(e["name_hex"].as_str().unwrap()) == n)
                .unwrap_or_else(|| {
                    panic!("{name}: the kernel has no {}", String::from_utf8_lossy(n))
                })
        };
        for (path, data) in &want {
            let leaf = path.rsplit(|&b| b == b'/').next().unwrap();
            let leaf: &[u8] = if leaf == b"u-small" {
                b"u-renamed"
            } else {
                leaf
            };
            let e = by_name(leaf);
            assert_eq!(
                e["size"].as_u64().unwrap(),
                data.len() as u64,
                "{name}: size of {}",
                String::from_utf8_lossy(leaf)
            );
            assert_eq!(
                e["sha256"].as_str().unwrap(),
                hex(&Sha256::digest(data)),
                "{name}: kernel reads {}",
                String::from_utf8_lossy(leaf)
            );
        }
        assert_eq!(
            unhex(by_name(b"u-fast")["target_hex"].as_str().unwrap()),
            b"u-small"
        );
        assert_eq!(
            unhex(by_name(b"u-slow")["target_hex"].as_str().unwrap()),
            long.as_bytes()
        );
        assert_eq!(by_name(b"uext4-dir")["type"], "dir");
        assert!(kernel
            .iter()
            .all(|e| unhex(e["name_hex"].as_str().unwrap()) != longname
                && e["name_hex"] != hex(b"u-gone")));
        checked += 1;
        eprintln!("{name}: ok");
    }
    assert!(checked > 0);
    let _ = std::fs::remove_dir_all(&out);
}
