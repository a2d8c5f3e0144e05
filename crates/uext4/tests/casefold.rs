//! Casefolding against e2fsprogs, the oracle this kernel cannot be (it has no CONFIG_UNICODE):
//! every code point's folding, through the hash a casefolded directory stores, compared with
//! debugfs's `dx_hash -c -e utf8`, which folds with e2fsprogs's own utf8-12.1 table.
//! A kernel that has CONFIG_UNICODE checks casefolded directories too, in a VM:
//! tests/kernel_vm.rs.

use std::io::Write;
use std::process::Command;
use uext4::format::casefold::casefold;
use uext4::format::dx_hash::dirhash;
use uext4::format::htree::DX_HASH_HALF_MD4;
use uext4_testkit::{have, mke2fs, scratch};

const SEED: [u32; 4] = [0x1234_5678, 0x9abc_def0, 0x0fed_cba9, 0x8765_4321];

fn seed_uuid() -> String {
    // debugfs parses the seed as a UUID and hashes with its bytes as four little-endian words.
    let b: Vec<u8> = SEED.iter().flat_map(|w| w.to_le_bytes()).collect();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Names debugfs's command parser passes through whole: no ASCII space, control, quote,
/// backslash or comment sign.
fn passes_parser(name: &str) -> bool {
    !name
        .bytes()
        .any(|b| b <= b' ' || b == 0x7f || b == b'"' || b == b'\\' || b == b'#')
}

/// Hashes every name with debugfs in one run; returns (major, minor) per name, in order.
fn debugfs_hashes(names: &[String]) -> Vec<(u32, u32)> {
    let img = scratch("casefold-oracle");
    mke2fs(&img.0, "4M", &["-O", "casefold"]);
    let cmds = scratch("casefold-cmds");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&cmds.0).unwrap());
    let seed = seed_uuid();
    for n in names {
        writeln!(f, "dx_hash -c -e utf8 -h half_md4 -s {seed} {n}").unwrap();
    }
    drop(f);
    let out = Command::new("debugfs")
        .arg("-f")
        .arg(&cmds.0)
        .arg(&img.0)
        .output()
        .expect("debugfs must be installed (e2fsprogs)");
    let mut hashes = Vec::with_capacity(names.len());
    for line in out.stdout.split(|&b| b == b'\n') {
        if !line.starts_with(b"Hash of ") {
            continue;
        }
        let line = String::from_utf8_lossy(line);
        let tail = line.rsplit(" is ").next().unwrap();
        // "0x1234abcd (minor 0x5678ef01)"
        let mut it = tail.split([' ', ')']).filter(|s| s.starts_with("0x"));
        let major = u32::from_str_radix(&it.next().unwrap()[2..], 16).unwrap();
        let minor = u32::from_str_radix(&it.next().unwrap()[2..], 16).unwrap();
        hashes.push((major, minor));
    }
    assert_eq!(hashes.len(), names.len(), "debugfs answered for every name");
    hashes
}

fn ours(name: &str) -> (u32, u32) {
    let folded = casefold(name.as_bytes()).expect("valid UTF-8");
    dirhash(&folded, DX_HASH_HALF_MD4, &SEED)
}

#[test]
fn every_code_point_folds_as_e2fsprogs_folds_it() {
    if !have(&["debugfs", "mke2fs"]) {
        println!("SKIP: debugfs and mke2fs are needed (e2fsprogs)");
        return;
    }
    // Every scalar value in the planes Unicode 12.1 assigned (0-2 and 14), each between two
    // letters so that its combining class meets a starter on both sides; those that fold to
    // nothing also alone (an empty folding hashes the seed alone).
    let mut names = Vec::new();
    let planes = (0x20u32..0x3_0000).chain(0xE_0000..0xE_1000);
    for cp in planes {
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        let name = format!("a{c}Z");
        if passes_parser(&name) {
            names.push(name);
        }
        let alone = c.to_string();
        if passes_parser(&alone) && casefold(alone.as_bytes()).is_some_and(|f| f.is_empty()) {
            names.push(alone);
        }
    }
    // Sequences whose order matters: marks of different classes, both ways round.
    for s in [
        "a\u{301}\u{328}",
        "a\u{328}\u{301}",
        "\u{1E63}\u{323}\u{307}",
        "\u{3B1}\u{345}\u{301}",
        "\u{130}\u{301}",
    ] {
        names.push(s.to_string());
    }
    let theirs = debugfs_hashes(&names);
    let mut wrong = Vec::new();
    for (n, t) in names.iter().zip(&theirs) {
        if ours(n) != *t {
            wrong.push(format!(
                "{:?} {:04X?}",
                n,
                n.chars().map(|c| c as u32).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} names hash differently from e2fsprogs, first: {:?}",
        wrong.len(),
        names.len(),
        &wrong[..wrong.len().min(20)]
    );
    println!("{} names hash as e2fsprogs hashes them", names.len());
}

// ---- Casefolded directories through the engine, with e2fsck as the judge. ----

use std::collections::BTreeSet;
use uext4::flags::FL_CASEFOLD;
use uext4::{Error, Fs, MountOptions, RenameFlags, ROOT_INO};
use uext4_testkit::{e2fsck_clean, e2fsck_clean_when};

/// A name with something to fold in it: letters of several scripts, ß, ligatures, accents
/// precomposed, Hangul.
fn cf_name(i: usize) -> String {
    match i % 6 {
        0 => format!("Track-{i}-Straße"),
        1 => format!("Čaj-{i}-Café"),
        2 => format!("ΣΟΦΙΑ-{i}"),
        3 => format!("ﬁle-{i}-Ångström"),
        4 => format!("한글-{i}"),
        _ => format!("README-{i}.TXT"),
    }
}

/// Another spelling of the same name under folding: cases swapped, ß as SS, ligature spelled
/// out, accents decomposed, Hangul as jamo.
fn other_spelling(n: &str) -> String {
    let swapped: String = n
        .replace('ß', "SS")
        .replace('ﬁ', "FI")
        .chars()
        .map(|c| {
            if c.is_lowercase() {
                c.to_uppercase().next().unwrap()
            } else {
                c.to_lowercase().next().unwrap()
            }
        })
        .collect();
    swapped
        .replace('é', "E\u{301}")
        .replace('É', "e\u{301}")
        .replace('å', "A\u{30A}")
        .replace('Å', "a\u{30A}")
        .replace('한', "\u{1112}\u{1161}\u{11AB}")
}

fn casefold_image(tag: &str, extra: &[&str]) -> uext4_testkit::Scratch {
    let img = scratch(tag);
    let mut args = vec!["-O", "casefold"];
    args.extend_from_slice(extra);
    mke2fs(&img.0, "64M", &args);
    img
}

fn cf_dir(fs: &Fs, parent: u32, name: &str) -> u32 {
    let d = fs.mkdir(parent, name.as_bytes(), 0o755, 0, 0).unwrap();
    let f = fs.get_flags(d.ino).unwrap();
    fs.set_flags(d.ino, f | FL_CASEFOLD).unwrap();
    d.ino
}

fn names_of(fs: &Fs, dir: u32) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.insert(String::from_utf8(e.name.clone()).unwrap());
        }
        true
    })
    .unwrap();
    out
}

#[test]
fn a_large_casefolded_directory_matches_every_spelling_and_stays_e2fsck_clean() {
    if !have(&["mke2fs", "e2fsck"]) {
        println!("SKIP: mke2fs and e2fsck are needed (e2fsprogs)");
        return;
    }
    // 1 KiB blocks: 12,000 names need a two-level index.
    let img = casefold_image("cf-large", &["-b", "1024"]);
    let n = 12_000;
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let dir = cf_dir(&fs, ROOT_INO, "Music");
    let plain = fs.mkdir(ROOT_INO, b"plain", 0o755, 0, 0).unwrap().ino;
    let other = cf_dir(&fs, ROOT_INO, "Other");
    for i in 0..n {
        fs.create(dir, cf_name(i).as_bytes(), 0o644, 0, 0).unwrap();
    }
    // Every name answers under another spelling; making that spelling is EEXIST.
    for i in (0..n).step_by(7) {
        let spelled = other_spelling(&cf_name(i));
        assert_ne!(spelled, cf_name(i));
        let a = fs
            .lookup(dir, spelled.as_bytes())
            .unwrap_or_else(|e| panic!("{spelled:?}: {e}"));
        assert_eq!(a.ino, fs.lookup(dir, cf_name(i).as_bytes()).unwrap().ino);
        assert!(matches!(
            fs.create(dir, spelled.as_bytes(), 0o644, 0, 0),
            Err(Error::Exists)
        ));
    }
    // A plain directory keeps comparing bytes.
    fs.create(plain, b"Readme", 0o644, 0, 0).unwrap();
    fs.create(plain, b"README", 0o644, 0, 0).unwrap();
    assert!(matches!(fs.lookup(plain, b"readme"), Err(Error::NotFound)));
    // Removals and renames under other spellings.
    let mut kept: BTreeSet<String> = (0..n).map(cf_name).collect();
    for i in (0..n).filter(|i| i % 3 == 0) {
        fs.unlink(dir, other_spelling(&cf_name(i)).as_bytes())
            .unwrap();
        kept.remove(&cf_name(i));
    }
    let mut moved = BTreeSet::new();
    for i in (0..n).filter(|i| i % 3 == 1 && i % 5 == 0) {
        let to = format!("Moved-{i}");
        fs.rename(
            dir,
            other_spelling(&cf_name(i)).as_bytes(),
            other,
            to.as_bytes(),
            RenameFlags::default(),
        )
        .unwrap();
        kept.remove(&cf_name(i));
        moved.insert(to);
    }
    // A name equal under folding in the target replaces it, as any existing name does.
    fs.create(other, b"target", 0o644, 0, 0).unwrap();
    fs.rename(
        dir,
        cf_name(4).as_bytes(),
        other,
        b"TARGET",
        RenameFlags::default(),
    )
    .unwrap();
    kept.remove(&cf_name(4));
    moved.insert("target".to_string());
    assert_eq!(
        names_of(&fs, dir),
        kept,
        "readdir keeps the names as created"
    );
    assert_eq!(names_of(&fs, other), moved);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after uext4 filled casefolded directories");

    // e2fsprogs rebuilds the index with its own folding; uext4 then finds every name in it.
    let st = Command::new("e2fsck")
        .args(["-fyD"])
        .arg(&img.0)
        .output()
        .unwrap();
    assert!(st.status.code().unwrap_or(8) <= 1, "e2fsck -fyD: {st:?}");
    e2fsck_clean_when(&img.0, "after e2fsck -fD");
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let dir = fs.lookup(ROOT_INO, b"Music").unwrap().ino;
    for name in &kept {
        let spelled = other_spelling(name);
        fs.lookup(dir, spelled.as_bytes())
            .unwrap_or_else(|e| panic!("{spelled:?} after e2fsck -fD: {e}"));
    }
    // And changes to e2fsprogs's index stay clean.
    for name in kept.iter().take(2000) {
        fs.unlink(dir, other_spelling(name).as_bytes()).unwrap();
    }
    for i in n..n + 2000 {
        fs.create(dir, cf_name(i).as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after uext4 changed e2fsprogs's index");
}

#[test]
fn strict_encoding_refuses_names_that_are_not_utf8() {
    if !have(&["mke2fs", "e2fsck"]) {
        println!("SKIP: mke2fs and e2fsck are needed (e2fsprogs)");
        return;
    }
    let bad: &[u8] = b"caf\xe9";
    let strict = casefold_image("cf-strict", &["-E", "encoding_flags=strict"]);
    let fs = Fs::open_path(&strict.0, MountOptions::default()).unwrap();
    let dir = cf_dir(&fs, ROOT_INO, "ci");
    assert!(matches!(
        fs.create(dir, bad, 0o644, 0, 0),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        fs.mkdir(dir, bad, 0o755, 0, 0),
        Err(Error::Invalid(_))
    ));
    // Outside a casefolded directory any bytes go.
    fs.create(ROOT_INO, bad, 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    e2fsck_clean(&strict.0);

    let relaxed = casefold_image("cf-relaxed", &[]);
    let fs = Fs::open_path(&relaxed.0, MountOptions::default()).unwrap();
    let dir = cf_dir(&fs, ROOT_INO, "ci");
    let a = fs.create(dir, bad, 0o644, 0, 0).unwrap();
    // Such a name matches only itself.
    assert_eq!(fs.lookup(dir, bad).unwrap().ino, a.ino);
    assert!(matches!(fs.lookup(dir, b"CAF\xe9"), Err(Error::NotFound)));
    fs.create(dir, b"CAF\xe9", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    e2fsck_clean(&relaxed.0);
}

#[test]
fn the_casefold_flag_goes_on_empty_directories_and_passes_to_subdirectories() {
    if !have(&["mke2fs", "e2fsck"]) {
        println!("SKIP: mke2fs and e2fsck are needed (e2fsprogs)");
        return;
    }
    let img = casefold_image("cf-flag", &[]);
    let fs = Fs::open_path(&img.0, MountOptions::default()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"x", 0o644, 0, 0).unwrap();
    let f = fs.get_flags(d).unwrap();
    assert!(matches!(
        fs.set_flags(d, f | FL_CASEFOLD),
        Err(Error::NotEmpty)
    ));
    fs.unlink(d, b"x").unwrap();
    fs.set_flags(d, f | FL_CASEFOLD).unwrap();
    let sub = fs.mkdir(d, b"Sub", 0o755, 0, 0).unwrap().ino;
    let file = fs.create(d, b"File", 0o644, 0, 0).unwrap().ino;
    assert_ne!(
        fs.get_flags(sub).unwrap() & FL_CASEFOLD,
        0,
        "subdirectories inherit +F"
    );
    assert_eq!(fs.get_flags(file).unwrap() & FL_CASEFOLD, 0, "files do not");
    assert!(fs.folds_names(sub) && !fs.folds_names(file) && !fs.folds_names(ROOT_INO));
    // Off again only when empty.
    assert!(matches!(fs.set_flags(d, f), Err(Error::NotEmpty)));
    fs.unmount().unwrap();
    e2fsck_clean(&img.0);

    // Without the feature the flag is refused.
    let plain = scratch("cf-nofeature");
    mke2fs(&plain.0, "16M", &[]);
    let fs = Fs::open_path(&plain.0, MountOptions::default()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.get_flags(d).unwrap();
    assert!(matches!(
        fs.set_flags(d, f | FL_CASEFOLD),
        Err(Error::NotSupported(_))
    ));
    fs.unmount().unwrap();
    e2fsck_clean(&plain.0);
}

#[test]
fn mkfs_lays_out_casefold_as_mke2fs_does() {
    if !have(&["mke2fs", "dumpe2fs"]) {
        println!("SKIP: mke2fs and dumpe2fs are needed (e2fsprogs)");
        return;
    }
    let header = |p: &std::path::Path| {
        let out = Command::new("dumpe2fs").arg("-h").arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("Filesystem features") || l.starts_with("Character encoding"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let raw_flags = |p: &std::path::Path| {
        let b = std::fs::read(p).unwrap();
        u16::from_le_bytes([b[1024 + 0x27E], b[1024 + 0x27F]])
    };
    for strict in [false, true] {
        let theirs = scratch("cf-mke2fs");
        let mut args = vec!["-O", "casefold"];
        if strict {
            args.extend(["-E", "encoding_flags=strict"]);
        }
        mke2fs(&theirs.0, "32M", &args);
        let ours = scratch("cf-mkfs");
        std::fs::File::create(&ours.0)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(32 << 20, Some(4096));
        o.features.casefold = true;
        o.features.casefold_strict = strict;
        let dev = uext4::blockdev::FileDevice::open(&ours.0, false).unwrap();
        uext4::mkfs::mkfs(&dev, &o).unwrap();
        drop(dev);
        assert_eq!(header(&ours.0), header(&theirs.0));
        assert_eq!(
            raw_flags(&ours.0),
            raw_flags(&theirs.0),
            "encoding flags, strict={strict}"
        );
        e2fsck_clean(&ours.0);
    }
}
