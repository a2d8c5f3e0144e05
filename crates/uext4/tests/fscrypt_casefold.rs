//! Directories both encrypted and casefolded (ext4_hash_in_dirent), through the engine.
//!
//! This kernel has fscrypt but no CONFIG_UNICODE, so it cannot mount a casefold image: the
//! kernel makes an `-O encrypt` image with empty v2-encrypted directories
//! (scripts/fscrypt-fixtures.py --casefold-base), tune2fs turns on `casefold`, and uext4
//! with the key casefolds the directories and fills them. e2fsck -fn judges every image
//! (it checks that every entry has room for its stored hash, and the index against the
//! stored hashes); e2fsck -fD rebuilds the index from the stored hashes, and uext4 must
//! still find every name; debugfs lists the entries as a second view. Without the key,
//! uext4 lists no-key names carrying the stored hash, and looks up, stats and removes by
//! them (in an indexed directory a lookup only finds a name under its right hash).
//! Debian's kernel, which has CONFIG_UNICODE, checks such directories both ways in a VM:
//! tests/kernel_vm.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use uext4::{EncryptionKey, Fs, MountOptions, RenameFlags};
use uext4_testkit::{e2fsck_clean, e2fsck_clean_when};

/// FS_CASEFOLD_FL.
const CASEFOLD_FL: u32 = 0x4000_0000;
/// FS_ENCRYPT_FL.
const ENCRYPT_FL: u32 = 0x800;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The base image: (work dir, image, key file, manifest), or None (SKIP printed).
fn base(tag: &str) -> Option<(PathBuf, PathBuf, PathBuf, serde_json::Value)> {
    let out = std::env::temp_dir().join(format!("uext4-fscf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let (img, key) = (out.join("cf.img"), out.join("cf.key"));
    let script = root().join("scripts/fscrypt-fixtures.py");
    let args = ["--casefold-base".as_ref(), img.as_os_str(), key.as_os_str()];
    let Some(stdout) = uext4_testkit::fixture_script(&script, &args) else {
        let _ = std::fs::remove_dir_all(&out);
        return None;
    };
    let manifest = serde_json::from_str(stdout.trim()).unwrap();
    Some((out, img, key, manifest))
}

fn open(img: &Path, key: Option<&Path>) -> Arc<Fs> {
    let keys = key
        .map(|k| vec![EncryptionKey::new(std::fs::read(k).unwrap())])
        .unwrap_or_default();
    Fs::open_path(
        img,
        MountOptions {
            keys,
            ..MountOptions::default()
        },
    )
    .unwrap()
}

fn ino_of(m: &serde_json::Value, dir: &str) -> u32 {
    m[format!("{dir}_ino")].as_u64().unwrap() as u32
}

/// The directory's entries but "." and "..": name -> inode.
fn listing(fs: &Fs, dir: u32) -> BTreeMap<Vec<u8>, u32> {
    let mut out = BTreeMap::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            assert!(out.insert(e.name, e.ino).is_none(), "a name listed twice");
        }
        true
    })
    .unwrap();
    out
}

fn errno(r: uext4::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("the call should fail").errno()
}

/// Other spellings of `name` under Unicode folding.
fn spellings(name: &str) -> Vec<String> {
    vec![name.to_uppercase(), name.to_lowercase()]
}

/// The names of the large directory (several thousand: an index of many leaves).
fn big_name(i: usize) -> String {
    format!("Fichier-{i:05}-Ünïcödé-ÉTÉ")
}

const BIG: usize = 3000;

/// How many of `want`'s entries e2fsck -fD dropped as duplicates, checking that `got` is
/// `want` less those, and that each dropped entry's inode went to lost+found.
///
/// e2fsprogs 1.47 compares the names of an encrypted casefolded directory as if they were
/// plaintext (e2fsck/rehash.c: `same_name` casefolds the ciphertext), so two ciphertexts
/// that, for example, both begin with a NUL byte compare equal when they sort next to each
/// other; e2fsck then clears one entry ("Duplicate filename entry ... Clear") and links its
/// inode into lost+found. The kernel has no such check, and uext4 made distinct names (the
/// listings with the key are distinct, and `listing` refuses a name listed twice). A run
/// hits this a few times in twenty, since the nonces, and so the ciphertexts, are random.
fn rehash_drops(
    want: &BTreeMap<Vec<u8>, u32>,
    got: &BTreeMap<Vec<u8>, u32>,
    lost: &BTreeSet<u32>,
) -> usize {
    for (name, ino) in got {
        assert_eq!(
            want.get(name),
            Some(ino),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    let dropped: Vec<u32> = want
        .iter()
        .filter(|(name, _)| !got.contains_key(*name))
        .map(|(_, ino)| *ino)
        .collect();
    for ino in &dropped {
        assert!(
            lost.contains(ino),
            "inode {ino}: dropped, and not in lost+found"
        );
    }
    dropped.len()
}

/// Live entries of `path` as debugfs `ls -p` lists them: lines `/inode/mode/...` with a
/// nonzero inode (it also shows removed entries, with inode 0; the names, encrypted, are not
/// checked).
fn debugfs_count(img: &Path, path: &str) -> usize {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("ls -p {path}"))
        .arg(img)
        .output()
        .expect("debugfs (e2fsprogs)");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let mut f = l.split('/');
            f.next() == Some("")
                && f.next()
                    .is_some_and(|i| i.parse::<u32>().is_ok_and(|i| i != 0))
                && f.next()
                    .is_some_and(|m| m.len() == 6 && m.bytes().all(|b| b.is_ascii_digit()))
        })
        .count()
}

#[test]
fn encrypted_casefolded_directories_with_and_without_the_key() {
    let Some((out, img, key, m)) = base("main") else {
        return;
    };
    e2fsck_clean_when(&img, "the kernel's image after tune2fs -O casefold");
    let (cf, big, kfill, v1) = (
        ino_of(&m, "cf"),
        ino_of(&m, "big"),
        ino_of(&m, "kfill"),
        ino_of(&m, "v1"),
    );

    // chattr +F on an encrypted directory needs its key (fscrypt_prepare_setflags).
    let fs = open(&img, None);
    let fl = fs.get_flags(cf).unwrap();
    assert_eq!(errno(fs.set_flags(cf, fl | CASEFOLD_FL)), libc::ENOKEY);
    fs.unmount().unwrap();

    let fs = open(&img, Some(&key));
    for d in [cf, big] {
        let fl = fs.get_flags(d).unwrap();
        fs.set_flags(d, fl | CASEFOLD_FL).unwrap();
        assert_eq!(
            fs.get_flags(d).unwrap() & (CASEFOLD_FL | ENCRYPT_FL),
            CASEFOLD_FL | ENCRYPT_FL
        );
    }
    // Not on a non-empty directory, nor under a v1 policy.
    let fl = fs.get_flags(kfill).unwrap();
    assert_eq!(
        errno(fs.set_flags(kfill, fl | CASEFOLD_FL)),
        libc::ENOTEMPTY
    );
    let fl = fs.get_flags(v1).unwrap();
    assert_eq!(errno(fs.set_flags(v1, fl | CASEFOLD_FL)), libc::EINVAL);

    // Names of every kind in `cf`.
    let long = "Ä".repeat(127); // 254 bytes
    let mut names: Vec<String> = vec![
        "Hello.txt".into(),
        "straße".into(),
        "ÉCOLE".into(),
        "Ångström".into(),
        "ﬁle-ligature".into(),
        "x".into(),
        long.clone(),
        format!("{}y", "z".repeat(254)),
    ];
    let mut inos = BTreeMap::new();
    for n in &names {
        let a = fs.create(cf, n.as_bytes(), 0o644, 0, 0).unwrap();
        fs.write_all(a.ino, 0, n.as_bytes()).unwrap();
        inos.insert(n.clone(), a.ino);
    }
    // Equal under folding: EEXIST, and every spelling finds the entry.
    for n in &names {
        for s in spellings(n) {
            if s.len() > 255 {
                continue;
            }
            assert_eq!(fs.lookup(cf, s.as_bytes()).unwrap().ino, inos[n], "{s}");
            assert_eq!(
                errno(fs.create(cf, s.as_bytes(), 0o644, 0, 0)),
                libc::EEXIST,
                "{s}"
            );
        }
    }
    assert_eq!(fs.lookup(cf, b"STRASSE").unwrap().ino, inos["straße"]);
    assert_eq!(
        fs.lookup(cf, b"file-LIGATURE").unwrap().ino,
        inos["ﬁle-ligature"]
    );
    assert_eq!(errno(fs.lookup(cf, b"nothing")), libc::ENOENT);
    // A subdirectory inherits both; a symlink, a hard link, renames.
    let sub = fs
        .mkdir(cf, "Sous-Dossier".as_bytes(), 0o755, 0, 0)
        .unwrap()
        .ino;
    inos.insert("Sous-Dossier".into(), sub);
    names.push("Sous-Dossier".into());
    assert_eq!(
        fs.get_flags(sub).unwrap() & (CASEFOLD_FL | ENCRYPT_FL),
        CASEFOLD_FL | ENCRYPT_FL
    );
    let inner = fs
        .create(sub, "Intérieur".as_bytes(), 0o644, 0, 0)
        .unwrap()
        .ino;
    assert_eq!(fs.lookup(sub, "INTÉRIEUR".as_bytes()).unwrap().ino, inner);
    let sl = fs.symlink(cf, b"Lien", b"Hello.txt", 0, 0).unwrap().ino;
    assert_eq!(fs.readlink(sl).unwrap(), b"Hello.txt");
    inos.insert("Lien".into(), sl);
    names.push("Lien".into());
    fs.link(inos["x"], cf, b"HardLink").unwrap();
    assert_eq!(fs.lookup(cf, b"hardlink").unwrap().ino, inos["x"]);
    fs.unlink(cf, b"HARDLINK").unwrap();
    assert_eq!(errno(fs.lookup(cf, b"HardLink")), libc::ENOENT);
    fs.rename(cf, b"hello.TXT", cf, b"Renamed.TXT", RenameFlags::default())
        .unwrap();
    assert_eq!(errno(fs.lookup(cf, b"Hello.txt")), libc::ENOENT);
    assert_eq!(
        fs.lookup(cf, b"renamed.txt").unwrap().ino,
        inos["Hello.txt"]
    );
    let h = inos.remove("Hello.txt").unwrap();
    inos.insert("Renamed.TXT".into(), h);
    // Across directories: into the subdirectory and back under another case.
    fs.rename(
        cf,
        "ÉCOLE".as_bytes(),
        sub,
        b"Moved",
        RenameFlags::default(),
    )
    .unwrap();
    fs.rename(
        sub,
        b"MOVED",
        cf,
        "école".as_bytes(),
        RenameFlags::default(),
    )
    .unwrap();
    let e = inos.remove("ÉCOLE").unwrap();
    inos.insert("école".into(), e);
    let want: BTreeMap<Vec<u8>, u32> = inos
        .iter()
        .map(|(n, i)| (n.as_bytes().to_vec(), *i))
        .collect();
    assert_eq!(listing(&fs, cf), want, "names read back as created");

    // Several thousand names in `big`: an index of many leaves.
    let mut big_inos = Vec::new();
    for i in 0..BIG {
        big_inos.push(
            fs.create(big, big_name(i).as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino,
        );
    }
    assert!(fs.getattr(big).unwrap().size > 16 * 4096, "big is indexed");
    for i in (0..BIG).step_by(7) {
        fs.unlink(big, big_name(i).to_uppercase().as_bytes())
            .unwrap();
    }
    let live: BTreeSet<usize> = (0..BIG).filter(|i| i % 7 != 0).collect();
    for &i in &live {
        let s = &spellings(&big_name(i))[i % 2];
        assert_eq!(
            fs.lookup(big, s.as_bytes()).unwrap().ino,
            big_inos[i],
            "{s}"
        );
    }
    let got = listing(&fs, big);
    assert_eq!(got.len(), live.len());
    for &i in &live {
        assert_eq!(got.get(big_name(i).as_bytes()), Some(&big_inos[i]));
    }
    fs.unmount().unwrap();
    e2fsck_clean_when(&img, "uext4 filled the encrypted casefolded directories");
    // debugfs: the same number of entries ("." and ".." besides).
    assert_eq!(debugfs_count(&img, "/cf"), want.len() + 2);
    assert_eq!(debugfs_count(&img, "/big"), live.len() + 2);

    // Without the key: no-key names, found (in the index under their stored hash), stat'ed
    // and removed by them; nothing can be added.
    let fs = open(&img, None);
    let nk_cf = listing(&fs, cf);
    assert_eq!(
        nk_cf.values().copied().collect::<BTreeSet<_>>(),
        want.values().copied().collect::<BTreeSet<_>>()
    );
    for (n, ino) in &nk_cf {
        assert_eq!(fs.lookup(cf, n).unwrap().ino, *ino);
    }
    let nk_big = listing(&fs, big);
    assert_eq!(nk_big.len(), live.len());
    for (n, ino) in &nk_big {
        assert_eq!(fs.lookup(big, n).unwrap().ino, *ino);
        assert_eq!(fs.getattr(*ino).unwrap().ino, *ino);
    }
    assert_eq!(
        errno(fs.create(big, b"new-name", 0o644, 0, 0)),
        libc::ENOKEY
    );
    let mut removed = BTreeSet::new();
    for (n, ino) in nk_big.iter().step_by(11) {
        fs.unlink(big, n).unwrap();
        removed.insert(*ino);
    }
    let x_nokey = nk_cf
        .iter()
        .find(|(_, i)| **i == inos["x"])
        .unwrap()
        .0
        .clone();
    fs.unlink(cf, &x_nokey).unwrap();
    fs.unmount().unwrap();
    e2fsck_clean_when(&img, "uext4 removed entries by no-key names");

    // With the key again: every name as created, but those removed.
    let fs = open(&img, Some(&key));
    let mut want_cf = want.clone();
    want_cf.remove(&b"x"[..]);
    assert_eq!(listing(&fs, cf), want_cf);
    let live: BTreeSet<usize> = live
        .into_iter()
        .filter(|i| !removed.contains(&big_inos[*i]))
        .collect();
    let got = listing(&fs, big);
    assert_eq!(got.len(), live.len());
    for &i in &live {
        assert_eq!(got.get(big_name(i).as_bytes()), Some(&big_inos[i]));
    }
    // The long names' contents read back.
    let l = fs.lookup(cf, long.to_lowercase().as_bytes()).unwrap();
    let mut buf = vec![0u8; long.len()];
    assert_eq!(fs.read(l.ino, 0, &mut buf).unwrap(), long.len());
    assert_eq!(buf, long.as_bytes());
    fs.unmount().unwrap();

    // e2fsck -fD rebuilds the index from the stored hashes; uext4 still finds every name
    // (less e2fsprogs' false duplicates: see `rehash_drops`).
    let copy = out.join("rehashed.img");
    std::fs::copy(&img, &copy).unwrap();
    let r = Command::new("e2fsck")
        .arg("-fyD")
        .arg(&copy)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.code().unwrap_or(8) <= 1, "e2fsck -fyD: {report}");
    e2fsck_clean_when(&copy, "e2fsck -fD");
    let fs = open(&copy, Some(&key));
    let lost = listing(&fs, fs.lookup(uext4::ROOT_INO, b"lost+found").unwrap().ino)
        .into_values()
        .collect::<BTreeSet<_>>();
    let want_big: BTreeMap<Vec<u8>, u32> = live
        .iter()
        .map(|&i| (big_name(i).into_bytes(), big_inos[i]))
        .collect();
    let (got_cf, got_big) = (listing(&fs, cf), listing(&fs, big));
    let dropped = rehash_drops(&want_cf, &got_cf, &lost) + rehash_drops(&want_big, &got_big, &lost);
    assert_eq!(
        dropped,
        report.matches("Duplicate filename entry").count(),
        "every entry e2fsck -fD dropped is one it reported: {report}"
    );
    if dropped > 0 {
        eprintln!("note: e2fsck -fD dropped {dropped} entries as false duplicates");
    }
    for (name, ino) in &got_big {
        let s = String::from_utf8(name.clone()).unwrap().to_lowercase();
        assert_eq!(fs.lookup(big, s.as_bytes()).unwrap().ino, *ino, "{s}");
    }
    // And it still adds to the rebuilt index.
    for i in BIG..BIG + 200 {
        fs.create(big, big_name(i).as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    e2fsck_clean_when(&copy, "uext4 wrote into the index e2fsck -fD rebuilt");
    e2fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&out);
}
