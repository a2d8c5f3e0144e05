//! A real kernel as the oracle for what this host's kernel lacks (CONFIG_UNICODE): Debian's
//! kernel (6.1, CONFIG_UNICODE=y, fscrypt) in a small VM (scripts/kernel-vm.sh) mounts the
//! images uext4 made and makes images uext4 reads.
//!
//! - Casefolded directories both ways, strict and not: a small one with names of every hard
//!   kind (ß, the Kelvin sign, dotted and dotless i, ligatures, combining marks against
//!   precomposed letters, Hangul syllables against their jamo) and a hashed one of 5,000
//!   entries. Each side looks every name up under another spelling the test computes with
//!   uext4's folding, and under near-spellings that fold differently (not found).
//! - Encrypted and casefolded directories both ways (v2 policy, the SipHash of the folded name
//!   stored in each entry): the first check of uext4's SipHash dirhash by a kernel, through
//!   lookups in a hashed directory; without the key, the no-key names each side lists.
//! - fs-verity both ways (CONFIG_FS_VERITY), on a plain file and on one in an encrypted
//!   directory, whose Merkle tree is encrypted with its data: each side measures and reads
//!   (verified) what the other enabled.
//! - Quotas (quota_v2, which this host lacks): the kernel's quotactl reports the usage and
//!   limits uext4 kept, enforces them, and uext4 reads the usage the kernel left.
//!
//! Every image is checked with `e2fsck -fn` after each side wrote it. The VM skips (with its
//! reason) where it cannot run: no qemu, no kernel with CONFIG_UNICODE, no static busybox.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use uext4::format::casefold::casefold;
use uext4::{EncryptionKey, EncryptionPolicy, Fs, MountOptions, ROOT_INO};
use uext4_testkit::unhex;
use uext4_testkit::{e2fsck_clean_when, mke2fs, xorshift, Scratch};

/// FS_CASEFOLD_FL, FS_INDEX_FL, FS_ENCRYPT_FL.
const CASEFOLD_FL: u32 = 0x4000_0000;
const INDEX_FL: u32 = 0x1000;
const ENCRYPT_FL: u32 = 0x800;
/// Entries of the hashed casefolded directory, and of the hashed encrypted one.
const BIG: usize = 5000;
const EBIG: usize = 3000;

/// Names of every kind the folding treats specially.
const KINDS: &[&str] = &[
    "Straße",
    "\u{212A}elvin-sign",
    "İstanbul",
    "ıI-dotless",
    "ﬁle-ligature",
    "ﬀ-ﬂ-ﬃ",
    "café",
    "Cafe\u{301}-combining",
    "한국어-Hangul",
    "ΣΊΣΥΦΟΣ",
    "Ǆungla",
    "ÅNGSTRÖM-\u{212B}",
    "ﬆ-st-ligature",
    "Ωmega-\u{2126}",
    "plain-ASCII",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fold(name: &str) -> Vec<u8> {
    casefold(name.as_bytes()).expect("valid UTF-8")
}

/// Another spelling of `name`, byte-different and equal under the filesystem's folding:
/// upper case, lower case, the folded form itself (NFD: jamo for Hangul, base letter and mark
/// for precomposed ones), or the folded form upper-cased.
fn other_spelling(name: &str) -> String {
    let folded = String::from_utf8(fold(name)).unwrap();
    let candidates = [
        name.to_uppercase(),
        name.to_lowercase(),
        folded.clone(),
        folded.to_uppercase(),
    ];
    candidates
        .into_iter()
        .find(|c| c != name && fold(c) == fold(name) && c.len() <= 255)
        .unwrap_or_else(|| panic!("no other spelling of {name:?}"))
}

/// Spellings that look alike but fold differently: lookups by them must fail.
fn near_misses() -> Vec<(String, String)> {
    let m = [
        ("ıI-dotless", "II-DOTLESS"),
        ("İstanbul", "Istanbul"),
        ("café", "cafe"),
    ];
    let out: Vec<(String, String)> = m
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    for (a, b) in &out {
        assert_ne!(fold(a), fold(b), "{a} and {b} must fold apart");
    }
    out
}

fn big_name(i: usize) -> String {
    format!("{}-{i:05}", KINDS[i % KINDS.len()])
}

fn lines(names: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names {
        assert!(!n.contains('\n'));
        out.extend_from_slice(n.as_bytes());
        out.push(b'\n');
    }
    out
}

/// Runs `script` in the VM with `disks` and input files: the output's sections
/// (`== NAME` lines open one), or None where the VM cannot run here (SKIP printed).
fn vm(
    tag: &str,
    script: &str,
    disks: &[Scratch],
    inputs: &[(&str, Vec<u8>)],
) -> Option<BTreeMap<String, Vec<String>>> {
    let dir = Scratch::dir(&format!("kvm-{tag}"));
    std::fs::write(dir.p("run.sh"), script).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/kernel-vm.sh"));
    for d in disks {
        cmd.arg("--disk").arg(&d.0);
    }
    for (name, data) in inputs {
        std::fs::write(dir.p(name), data).unwrap();
        cmd.arg("--file").arg(dir.p(name));
    }
    cmd.arg("--timeout").arg("150").arg(dir.p("run.sh"));
    let t0 = std::time::Instant::now();
    let out = cmd.output().expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(77) {
        println!("{}", stdout.trim());
        return None;
    }
    assert!(
        out.status.success(),
        "the VM script failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{tag}: VM ran {:.1} s", t0.elapsed().as_secs_f64());
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur = String::new();
    for l in stdout.lines() {
        if let Some(s) = l.strip_prefix("== ") {
            cur = s.to_string();
            sections.entry(cur.clone()).or_default();
        } else {
            sections.entry(cur.clone()).or_default().push(l.to_string());
        }
    }
    Some(sections)
}

/// A `list` section: name -> inode.
fn listed(sec: &[String]) -> BTreeMap<Vec<u8>, u32> {
    sec.iter()
        .map(|l| {
            let (ino, name) = l.split_once(' ').unwrap();
            (unhex(name), ino.parse().unwrap())
        })
        .collect()
}

/// A section of one number a line (`lookup`, `create`, `unlink`: an inode, 0, or -errno).
fn numbers(sec: &[String]) -> Vec<i64> {
    sec.iter().map(|l| l.parse().unwrap()).collect()
}

fn open(img: &Path, key: Option<&EncryptionKey>) -> Arc<Fs> {
    let opts = MountOptions {
        keys: key.into_iter().cloned().collect(),
        ..MountOptions::default()
    };
    Fs::open_path(img, opts).unwrap()
}

/// uext4's view of a directory: name -> inode, without "." and "..".
fn listing(fs: &Fs, dir: u32) -> BTreeMap<Vec<u8>, u32> {
    let mut out = BTreeMap::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.insert(e.name, e.ino);
        }
        true
    })
    .unwrap();
    out
}

fn path_ino(fs: &Fs, path: &str) -> u32 {
    path.split('/')
        .filter(|c| !c.is_empty())
        .fold(ROOT_INO, |d, c| fs.lookup(d, c.as_bytes()).unwrap().ino)
}

fn read(fs: &Fs, ino: u32) -> Vec<u8> {
    uext4_testkit::read_all(fs, ino)
}

/// A casefold image made by uext4's mkfs (strict or not).
fn uext4_casefold_image(tag: &str, strict: bool, encrypt: bool) -> Scratch {
    let img = Scratch::file(tag, 64 << 20);
    let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(64 << 20, Some(4096));
    o.features.casefold = true;
    o.features.casefold_strict = strict;
    o.features.encrypt = encrypt;
    let dev = uext4::blockdev::FileDevice::open(&img.0, false).unwrap();
    uext4::mkfs::mkfs(&dev, &o).unwrap();
    img
}

/// Fills `dir` (made casefolded by the caller) with `names`, each file holding its name.
fn fill(fs: &Fs, dir: u32, names: &[String]) -> BTreeMap<Vec<u8>, u32> {
    let mut inos = BTreeMap::new();
    for n in names {
        let a = fs.create(dir, n.as_bytes(), 0o644, 0, 0).unwrap();
        fs.write_all(a.ino, 0, n.as_bytes()).unwrap();
        inos.insert(n.as_bytes().to_vec(), a.ino);
    }
    inos
}

fn casefolded_dir(fs: &Fs, parent: u32, name: &str) -> u32 {
    let d = fs.mkdir(parent, name.as_bytes(), 0o755, 0, 0).unwrap().ino;
    let fl = fs.get_flags(d).unwrap();
    fs.set_flags(d, fl | CASEFOLD_FL).unwrap();
    d
}

fn small_names() -> Vec<String> {
    KINDS.iter().map(|s| s.to_string()).collect()
}

fn big_names(n: usize) -> Vec<String> {
    (0..n).map(big_name).collect()
}

/// The guest script's part for one uext4-made casefold disk at /mnt/X (X = vda's letter).
fn guest_reads(x: &str) -> String {
    format!(
        "d=/mnt/{x}; mkdir -p $d; mount -t ext4 /dev/vd{x} $d || exit 1
h=uext4-vm-helper
echo '== {x} flags'; $h flags $d/cf; $h flags $d/big
echo '== {x} list cf'; $h list $d/cf
echo '== {x} list big'; $h list $d/big
echo '== {x} lookup cf'; $h lookup $d/cf /in/cf-alt
echo '== {x} lookup big'; $h lookup $d/big /in/big-alt
echo '== {x} lookup miss'; $h lookup $d/cf /in/miss
echo '== {x} read cf'; $h read $d/cf /in/cf-alt
echo '== {x} create cf'; $h create $d/cf /in/new
echo '== {x} unlink big'; $h unlink $d/big /in/gone
umount $d || exit 1
"
    )
}

#[test]
fn casefold_uext4_to_kernel() {
    let small = small_names();
    let big = big_names(BIG);
    let mut disks = Vec::new();
    let mut made = Vec::new();
    for (x, strict) in [("a", true), ("b", false)] {
        let img = uext4_casefold_image(&format!("kvm-cf-{x}"), strict, false);
        let fs = open(&img.0, None);
        let cf = casefolded_dir(&fs, ROOT_INO, "cf");
        let bigd = casefolded_dir(&fs, ROOT_INO, "big");
        let mut cf_inos = fill(&fs, cf, &small);
        let big_inos = fill(&fs, bigd, &big);
        if !strict {
            // Not UTF-8: stored and compared as plain bytes.
            let a = fs.create(cf, b"raw-\xff-Name", 0o644, 0, 0).unwrap();
            cf_inos.insert(b"raw-\xff-Name".to_vec(), a.ino);
        }
        fs.unmount().unwrap();
        e2fsck_clean_when(&img.0, "uext4 filled the casefolded directories");
        made.push((x, strict, cf_inos, big_inos));
        disks.push(img);
    }
    let alt = |ns: &[String]| ns.iter().map(|n| other_spelling(n)).collect::<Vec<_>>();
    let cf_alt = alt(&small);
    let big_alt = alt(&big);
    let miss: Vec<String> = near_misses().into_iter().map(|(_, b)| b).collect();
    // New names: other spellings of existing ones (EEXIST), and fresh ones.
    let mut new: Vec<String> = cf_alt[..4].to_vec();
    new.extend(["Neu-STRASSE-ẞ", "ﬂuß-neu", "새-파일"].map(String::from));
    let gone: Vec<String> = (0..BIG).step_by(7).map(|i| big_alt[i].clone()).collect();
    let script: String = ["a", "b"].iter().map(|x| guest_reads(x)).collect();
    let inputs = [
        ("cf-alt", lines(&cf_alt)),
        ("big-alt", lines(&big_alt)),
        ("miss", lines(&miss)),
        ("new", lines(&new)),
        ("gone", lines(&gone)),
    ];
    let Some(out) = vm("cf-to-kernel", &script, &disks, &inputs) else {
        return;
    };
    for ((x, strict, cf_inos, big_inos), img) in made.iter().zip(&disks) {
        let sec = |s: &str| &out[&format!("{x} {s}")];
        let flags: Vec<u32> = sec("flags")
            .iter()
            .map(|l| u32::from_str_radix(l, 16).unwrap())
            .collect();
        assert_eq!(flags[0] & CASEFOLD_FL, CASEFOLD_FL, "strict={strict}");
        assert_eq!(flags[1] & (CASEFOLD_FL | INDEX_FL), CASEFOLD_FL | INDEX_FL);
        assert_eq!(&listed(sec("list cf")), cf_inos, "strict={strict}");
        assert_eq!(&listed(sec("list big")), big_inos, "strict={strict}");
        let want = |names: &[String], inos: &BTreeMap<Vec<u8>, u32>| -> Vec<i64> {
            names.iter().map(|n| inos[n.as_bytes()] as i64).collect()
        };
        assert_eq!(numbers(sec("lookup cf")), want(&small, cf_inos));
        assert_eq!(numbers(sec("lookup big")), want(&big, big_inos));
        assert_eq!(
            numbers(sec("lookup miss")),
            vec![-libc::ENOENT as i64; miss.len()]
        );
        let contents: Vec<Vec<u8>> = sec("read cf").iter().map(|l| unhex(l)).collect();
        let names: Vec<Vec<u8>> = small.iter().map(|n| n.as_bytes().to_vec()).collect();
        assert_eq!(contents, names, "the kernel reads what uext4 wrote");
        let mut want_new = vec![-libc::EEXIST as i64; 4];
        want_new.extend([0, 0, 0]);
        assert_eq!(numbers(sec("create cf")), want_new);
        assert_eq!(numbers(sec("unlink big")), vec![0; gone.len()]);

        // uext4 reads what the kernel changed.
        e2fsck_clean_when(&img.0, &format!("the kernel wrote (strict={strict})"));
        let fs = open(&img.0, None);
        let (cf, bigd) = (path_ino(&fs, "cf"), path_ino(&fs, "big"));
        for n in &new[4..] {
            let ino = fs.lookup(cf, n.as_bytes()).unwrap().ino;
            assert_eq!(
                fs.lookup(cf, other_spelling(n).as_bytes()).unwrap().ino,
                ino
            );
            assert_eq!(read(&fs, ino), n.as_bytes());
        }
        let now = listing(&fs, bigd);
        assert_eq!(now.len(), BIG - gone.len());
        for (i, n) in big.iter().enumerate() {
            let r = fs.lookup(bigd, n.as_bytes());
            if i % 7 == 0 {
                assert_eq!(r.unwrap_err().errno(), libc::ENOENT, "{n}");
            } else {
                assert_eq!(r.unwrap().ino, big_inos[n.as_bytes()], "{n}");
            }
        }
        if !strict {
            assert!(fs.lookup(cf, b"raw-\xff-Name").is_ok());
            assert_eq!(
                fs.lookup(cf, b"RAW-\xff-NAME").unwrap_err().errno(),
                libc::ENOENT
            );
        }
        fs.unmount().unwrap();
    }
}

#[test]
fn casefold_kernel_to_uext4() {
    let small = small_names();
    let big = big_names(BIG);
    let mut disks = Vec::new();
    for (x, strict) in [("a", true), ("b", false)] {
        let img = Scratch::new(&format!("kvm-kcf-{x}"));
        let mut args = vec!["-O", "casefold"];
        if strict {
            args.extend(["-E", "encoding_flags=strict"]);
        }
        mke2fs(&img.0, "64M", &args);
        disks.push(img);
    }
    let dupes: Vec<String> = small.iter().map(|n| other_spelling(n)).collect();
    let mut script = String::new();
    for x in ["a", "b"] {
        script += &format!(
            "d=/mnt/{x}; mkdir -p $d; mount -t ext4 /dev/vd{x} $d || exit 1
h=uext4-vm-helper
mkdir $d/cf $d/big && $h chattr +F $d/cf && $h chattr +F $d/big || exit 1
echo '== {x} create cf'; $h create $d/cf /in/small
echo '== {x} create big'; $h create $d/big /in/big
echo '== {x} dupes'; $h create $d/cf /in/dupes
echo '== {x} flags'; $h flags $d/big
echo '== {x} list cf'; $h list $d/cf
echo '== {x} list big'; $h list $d/big
umount $d || exit 1
"
        );
    }
    let inputs = [
        ("small", lines(&small)),
        ("big", lines(&big)),
        ("dupes", lines(&dupes)),
    ];
    let Some(out) = vm("kernel-to-cf", &script, &disks, &inputs) else {
        return;
    };
    for (x, img) in ["a", "b"].iter().zip(&disks) {
        let sec = |s: &str| &out[&format!("{x} {s}")];
        assert_eq!(numbers(sec("create cf")), vec![0; small.len()]);
        assert_eq!(numbers(sec("create big")), vec![0; big.len()]);
        assert_eq!(
            numbers(sec("dupes")),
            vec![-libc::EEXIST as i64; small.len()]
        );
        let fl = u32::from_str_radix(&sec("flags")[0], 16).unwrap();
        assert_eq!(fl & (CASEFOLD_FL | INDEX_FL), CASEFOLD_FL | INDEX_FL);
        e2fsck_clean_when(&img.0, "the kernel made casefolded directories");
        let fs = open(&img.0, None);
        for (dir, names) in [("cf", &small), ("big", &big)] {
            let d = path_ino(&fs, dir);
            assert_eq!(fs.get_flags(d).unwrap() & CASEFOLD_FL, CASEFOLD_FL);
            let ours = listing(&fs, d);
            assert_eq!(ours, listed(sec(&format!("list {dir}"))), "{x} {dir}");
            let want: BTreeSet<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
            assert_eq!(ours.keys().cloned().collect::<BTreeSet<_>>(), want);
            for n in names.iter() {
                let ino = ours[n.as_bytes()];
                let alt = other_spelling(n);
                assert_eq!(fs.lookup(d, alt.as_bytes()).unwrap().ino, ino, "{alt}");
                assert_eq!(read(&fs, ino), n.as_bytes());
            }
        }
        let cf = path_ino(&fs, "cf");
        for (_, miss) in near_misses() {
            assert_eq!(
                fs.lookup(cf, miss.as_bytes()).unwrap_err().errno(),
                libc::ENOENT
            );
        }
        fs.unmount().unwrap();
    }
}

/// A 64-byte master key from a fixed seed: its raw bytes (the guest's key file).
fn raw_key() -> Vec<u8> {
    let mut r = xorshift(0x6b65_726e_656c);
    (0..8).flat_map(|_| r().to_le_bytes()).collect()
}

#[test]
fn encrypted_casefold_both_ways() {
    let key = EncryptionKey::new(raw_key());
    let small = small_names();
    let big = big_names(EBIG);
    // Disk a: uext4 encrypts, casefolds and fills; disk b: mke2fs, for the kernel to fill.
    let a = uext4_casefold_image("kvm-ecf-a", false, true);
    let fs = open(&a.0, Some(&key));
    let policy = EncryptionPolicy::v2(&key).unwrap();
    let mut made = BTreeMap::new();
    for (dir, names) in [("ecf", &small), ("ebig", &big)] {
        let d = fs.mkdir(ROOT_INO, dir.as_bytes(), 0o755, 0, 0).unwrap().ino;
        fs.set_encryption_policy(d, &policy).unwrap();
        let fl = fs.get_flags(d).unwrap();
        fs.set_flags(d, fl | CASEFOLD_FL).unwrap();
        made.insert(dir, fill(&fs, d, names));
    }
    fs.unmount().unwrap();
    e2fsck_clean_when(&a.0, "uext4 filled encrypted casefolded directories");
    let fs = open(&a.0, None);
    let nokey_a: BTreeMap<&str, _> = ["ecf", "ebig"]
        .map(|d| (d, listing(&fs, path_ino(&fs, d))))
        .into_iter()
        .collect();
    fs.unmount().unwrap();
    let b = Scratch::new("kvm-ecf-b");
    mke2fs(&b.0, "64M", &["-O", "encrypt,casefold"]);

    let alt = |ns: &[String]| ns.iter().map(|n| other_spelling(n)).collect::<Vec<_>>();
    let (small_alt, big_alt) = (alt(&small), alt(&big));
    let new: Vec<String> = ["Nouveau-ÉTÉ", "ﬂoß-neu"].map(String::from).to_vec();
    let gone: Vec<String> = (0..EBIG).step_by(5).map(|i| big_alt[i].clone()).collect();
    let script = "h=uext4-vm-helper; mkdir -p /mnt/a /mnt/b
mount -t ext4 /dev/vda /mnt/a || exit 1
echo '== a nokey ecf'; $h list /mnt/a/ecf
echo '== a nokey ebig'; $h list /mnt/a/ebig
umount /mnt/a; mount -t ext4 /dev/vda /mnt/a || exit 1
echo '== a keyid'; $h add-key /mnt/a /in/key || exit 1
echo '== a flags'; $h flags /mnt/a/ebig
echo '== a list ecf'; $h list /mnt/a/ecf
echo '== a list ebig'; $h list /mnt/a/ebig
echo '== a lookup ecf'; $h lookup /mnt/a/ecf /in/small-alt
echo '== a lookup ebig'; $h lookup /mnt/a/ebig /in/big-alt
echo '== a read ecf'; $h read /mnt/a/ecf /in/small-alt
echo '== a create ecf'; $h create /mnt/a/ecf /in/new
echo '== a unlink ebig'; $h unlink /mnt/a/ebig /in/gone
umount /mnt/a || exit 1
mount -t ext4 /dev/vdb /mnt/b || exit 1
id=$($h add-key /mnt/b /in/key) || exit 1
for d in ecf ebig; do
  mkdir /mnt/b/$d && $h set-policy /mnt/b/$d $id && $h chattr +F /mnt/b/$d || exit 1
done
echo '== b create ecf'; $h create /mnt/b/ecf /in/small
echo '== b create ebig'; $h create /mnt/b/ebig /in/big
echo '== b flags'; $h flags /mnt/b/ebig
echo '== b list ecf'; $h list /mnt/b/ecf
umount /mnt/b; mount -t ext4 /dev/vdb /mnt/b || exit 1
echo '== b nokey ecf'; $h list /mnt/b/ecf
echo '== b nokey ebig'; $h list /mnt/b/ebig
umount /mnt/b || exit 1
";
    let inputs = [
        ("key", raw_key()),
        ("small", lines(&small)),
        ("big", lines(&big)),
        ("small-alt", lines(&small_alt)),
        ("big-alt", lines(&big_alt)),
        ("new", lines(&new)),
        ("gone", lines(&gone)),
    ];
    let disks = [a, b];
    let Some(out) = vm("encrypted-casefold", script, &disks, &inputs) else {
        return;
    };
    let [a, b] = &disks;
    let sec = |s: &str| &out[s];

    // Disk a, made by uext4: the kernel's no-key names are uext4's, byte for byte.
    for d in ["ecf", "ebig"] {
        assert_eq!(
            listed(sec(&format!("a nokey {d}"))),
            nokey_a[d],
            "no-key names of {d}"
        );
    }
    let keyid = &sec("a keyid")[0];
    assert!(
        policy.to_string().contains(keyid.as_str()),
        "{policy} names key {keyid}"
    );
    let fl = u32::from_str_radix(&sec("a flags")[0], 16).unwrap();
    let all = CASEFOLD_FL | INDEX_FL | ENCRYPT_FL;
    assert_eq!(
        fl & all,
        all,
        "uext4's encrypted casefolded directory is hashed"
    );
    assert_eq!(listed(sec("a list ecf")), made["ecf"]);
    assert_eq!(listed(sec("a list ebig")), made["ebig"]);
    let want = |names: &[String], inos: &BTreeMap<Vec<u8>, u32>| -> Vec<i64> {
        names.iter().map(|n| inos[n.as_bytes()] as i64).collect()
    };
    assert_eq!(numbers(sec("a lookup ecf")), want(&small, &made["ecf"]));
    // Found in the hashed directory under another spelling: the kernel's SipHash of the
    // folded name leads to the block where uext4 put the entry.
    assert_eq!(numbers(sec("a lookup ebig")), want(&big, &made["ebig"]));
    let contents: Vec<Vec<u8>> = sec("a read ecf").iter().map(|l| unhex(l)).collect();
    let names: Vec<Vec<u8>> = small.iter().map(|n| n.as_bytes().to_vec()).collect();
    assert_eq!(contents, names);
    assert_eq!(numbers(sec("a create ecf")), vec![0; new.len()]);
    assert_eq!(numbers(sec("a unlink ebig")), vec![0; gone.len()]);
    e2fsck_clean_when(
        &a.0,
        "the kernel changed uext4's encrypted casefolded directories",
    );
    let fs = open(&a.0, Some(&key));
    let (ecf, ebig) = (path_ino(&fs, "ecf"), path_ino(&fs, "ebig"));
    for n in &new {
        let ino = fs.lookup(ecf, other_spelling(n).as_bytes()).unwrap().ino;
        assert_eq!(read(&fs, ino), n.as_bytes());
    }
    assert_eq!(listing(&fs, ebig).len(), EBIG - gone.len());
    for g in &gone {
        assert_eq!(
            fs.lookup(ebig, g.as_bytes()).unwrap_err().errno(),
            libc::ENOENT
        );
    }
    fs.unmount().unwrap();

    // Disk b, made by the kernel: uext4 reads every name and finds it under other spellings
    // (in the hashed directory, by the kernel's stored SipHash); no-key names agree.
    assert_eq!(numbers(sec("b create ecf")), vec![0; small.len()]);
    assert_eq!(numbers(sec("b create ebig")), vec![0; big.len()]);
    let fl = u32::from_str_radix(&sec("b flags")[0], 16).unwrap();
    assert_eq!(
        fl & all,
        all,
        "the kernel's encrypted casefolded directory is hashed"
    );
    e2fsck_clean_when(&b.0, "the kernel made encrypted casefolded directories");
    let fs = open(&b.0, Some(&key));
    for (dir, names, alts) in [("ecf", &small, &small_alt), ("ebig", &big, &big_alt)] {
        let d = path_ino(&fs, dir);
        let ours = listing(&fs, d);
        let want: BTreeSet<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
        assert_eq!(ours.keys().cloned().collect::<BTreeSet<_>>(), want, "{dir}");
        for (n, alt) in names.iter().zip(alts) {
            let ino = fs.lookup(d, alt.as_bytes()).unwrap().ino;
            assert_eq!(ino, ours[n.as_bytes()], "{alt}");
            assert_eq!(read(&fs, ino), n.as_bytes());
        }
    }
    assert_eq!(
        listing(&fs, path_ino(&fs, "ecf")),
        listed(sec("b list ecf"))
    );
    fs.unmount().unwrap();
    let fs = open(&b.0, None);
    for d in ["ecf", "ebig"] {
        let ours = listing(&fs, path_ino(&fs, d));
        assert_eq!(
            ours,
            listed(sec(&format!("b nokey {d}"))),
            "no-key names of {d}"
        );
    }
    fs.unmount().unwrap();
    e2fsck_clean_when(&b.0, "uext4 read the kernel's directories");
}

/// fs-verity against the kernel's, plain and encrypted: uext4 enables verity on a file
/// (SHA-256) and on one in an encrypted directory (SHA-512 and a salt: its tree, descriptor
/// and size word encrypted as the kernel keeps them); the kernel measures both
/// (FS_IOC_MEASURE_VERITY) as uext4 did and reads both whole through its verified path. The
/// kernel enables verity on the same two files of its own (SHA-256, 4 KiB: what 6.1 allows);
/// uext4 measures them as the kernel did and reads them whole. e2fsck is clean after each.
#[test]
fn verity_plain_and_encrypted_both_ways() {
    let key = EncryptionKey::new(raw_key());
    let mut r = xorshift(0x7665_7269);
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| r() as u8).collect() };
    let (plain, sealed) = (bytes(100 * 4096 + 77), bytes(300 * 4096 + 1234));
    let a = Scratch::new("kvm-verity-a");
    mke2fs(&a.0, "64M", &["-O", "verity,encrypt"]);
    let fs = open(&a.0, Some(&key));
    let p = fs.create(ROOT_INO, b"p", 0o644, 0, 0).unwrap().ino;
    fs.write_all(p, 0, &plain).unwrap();
    fs.enable_verity(p, &uext4::VerityArgs::default()).unwrap();
    let e = fs.mkdir(ROOT_INO, b"e", 0o755, 0, 0).unwrap().ino;
    fs.set_encryption_policy(e, &EncryptionPolicy::v2(&key).unwrap())
        .unwrap();
    let f = fs.create(e, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_all(f, 0, &sealed).unwrap();
    let sha512 = uext4::VerityArgs {
        hash_algorithm: 2,
        salt: b"pepper".to_vec(),
        ..Default::default()
    };
    fs.enable_verity(f, &sha512).unwrap();
    let digest = |fs: &Fs, ino: u32| {
        let (alg, d) = fs.measure_verity(ino).unwrap();
        format!("{}:{}", alg.name(), uext4_testkit::hex(&d))
    };
    let ours = [digest(&fs, p), digest(&fs, f)];
    fs.unmount().unwrap();
    e2fsck_clean_when(
        &a.0,
        "uext4 enabled verity on a plain and an encrypted file",
    );
    let b = Scratch::new("kvm-verity-b");
    mke2fs(&b.0, "64M", &["-O", "verity,encrypt"]);
    let script = "h=uext4-vm-helper; mkdir -p /mnt/a /mnt/b
mount -t ext4 /dev/vda /mnt/a || exit 1
$h add-key /mnt/a /in/key >/dev/null || exit 1
echo '== a measure'; $h measure-verity /mnt/a/p; $h measure-verity /mnt/a/e/f
echo '== a read'; cmp /mnt/a/p /in/plain && cmp /mnt/a/e/f /in/sealed && echo same
umount /mnt/a || exit 1
mount -t ext4 /dev/vdb /mnt/b || exit 1
id=$($h add-key /mnt/b /in/key) || exit 1
mkdir /mnt/b/e && $h set-policy /mnt/b/e $id || exit 1
cp /in/plain /mnt/b/p && cp /in/sealed /mnt/b/e/f || exit 1
$h enable-verity /mnt/b/p && $h enable-verity /mnt/b/e/f || exit 1
echo '== b measure'; $h measure-verity /mnt/b/p; $h measure-verity /mnt/b/e/f
umount /mnt/b || exit 1
";
    let inputs = [
        ("key", raw_key()),
        ("plain", plain.clone()),
        ("sealed", sealed.clone()),
    ];
    let disks = [a, b];
    let Some(out) = vm("verity", script, &disks, &inputs) else {
        return;
    };
    let [a, b] = &disks;
    assert_eq!(
        out["a measure"], ours,
        "the kernel measures uext4's verity files"
    );
    assert_eq!(
        out["a read"],
        ["same"],
        "the kernel reads them whole, verified"
    );
    e2fsck_clean_when(&a.0, "the kernel read uext4's verity files");
    e2fsck_clean_when(
        &b.0,
        "the kernel enabled verity on a plain and an encrypted file",
    );
    let fs = open(&b.0, Some(&key));
    let (p, f) = (path_ino(&fs, "p"), path_ino(&fs, "e/f"));
    assert_eq!(
        [digest(&fs, p), digest(&fs, f)].to_vec(),
        out["b measure"],
        "uext4 measures the kernel's verity files"
    );
    assert_eq!(read(&fs, p), plain);
    assert_eq!(
        read(&fs, f),
        sealed,
        "the kernel's encrypted tree, decrypted and checked"
    );
    fs.unmount().unwrap();
}

/// Quota usage and limits against the kernel's quota_v2 (the host has no CONFIG_QFMT_V2):
/// uext4 charges files to user 1000, group 2000 and project 7 (a PROJINHERIT directory) and
/// sets limits; the kernel's quotactl reports the same usage and limits. The kernel then
/// writes as user 1000: within the limits, past the user's hard limit, past the project's
/// (EDQUOT each); e2fsck agrees with the usage it left, and uext4 reads the same numbers as
/// the kernel's quotactl.
#[test]
fn quota_usage_and_limits_both_ways() {
    use uext4::format::quota::{Dquot, QuotaType};
    let img = Scratch::new("kvm-quota-img");
    let qt = "quotatype=usrquota:grpquota:prjquota";
    mke2fs(
        &img.0,
        "64M",
        &["-O", "quota,project", "-E", qt, "-I", "256"],
    );
    let fs = open(&img.0, None);
    let u = fs.mkdir(ROOT_INO, b"u", 0o777, 1000, 2000).unwrap().ino;
    for (name, n) in [("a", 100_000), ("b", 1), ("c", 70_000)] {
        let f = fs
            .create(u, name.as_bytes(), 0o644, 1000, 2000)
            .unwrap()
            .ino;
        fs.write_all(f, 0, &vec![7u8; n]).unwrap();
    }
    let p = fs.mkdir(ROOT_INO, b"p", 0o777, 0, 0).unwrap().ino;
    let fsx = uext4::FsXattr {
        xflags: uext4::flags::XFLAG_PROJINHERIT,
        projid: 7,
        ..Default::default()
    };
    fs.set_fsxattr_as(&uext4::Cred::root(), p, &fsx).unwrap();
    let f = fs.create(p, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_all(f, 0, &[9u8; 50_000]).unwrap();
    let limits = |bhard: u64, ihard: u64| Dquot {
        bhardlimit: bhard,
        bsoftlimit: bhard / 2,
        ihardlimit: ihard,
        isoftlimit: ihard / 2,
        ..Default::default()
    };
    fs.set_dquot_limits(QuotaType::User, 1000, &limits(1 << 20, 10))
        .unwrap();
    fs.set_dquot_limits(QuotaType::Project, 7, &limits(200 << 10, 0))
        .unwrap();
    let kinds = [
        (QuotaType::User, 1000),
        (QuotaType::Group, 2000),
        (QuotaType::Project, 7),
    ];
    // As the helper prints struct if_dqblk: space in bytes, limits in 1 KiB blocks.
    let ours = |fs: &Fs| -> Vec<String> {
        kinds
            .iter()
            .map(|&(t, id)| {
                let q = fs.dquot(t, id).unwrap().unwrap_or_default();
                format!(
                    "{} {} {} {} {} {}",
                    q.curspace,
                    q.curinodes,
                    q.bhardlimit / 1024,
                    q.bsoftlimit / 1024,
                    q.ihardlimit,
                    q.isoftlimit
                )
            })
            .collect()
    };
    let before = ours(&fs);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "uext4 charged files and set limits");
    let script = "h=uext4-vm-helper; mkdir -p /mnt/a
mount -t ext4 -o usrquota,grpquota,prjquota /dev/vda /mnt/a || exit 1
q() { $h getquota /dev/vda usr 1000; $h getquota /dev/vda grp 2000; $h getquota /dev/vda prj 7; }
echo '== before'; q
echo '== writes'
$h as 1000 2000 /mnt/a/u/g1 200000
$h as 1000 2000 /mnt/a/u/g2 2000000
$h as 1000 2000 /mnt/a/p/g3 300000
sync
echo '== after'; q
umount /mnt/a || exit 1
";
    let disks = [img];
    let Some(out) = vm("quota", script, &disks, &[]) else {
        return;
    };
    let [img] = &disks;
    assert_eq!(
        out["before"], before,
        "the kernel reads uext4's usage and limits"
    );
    assert_eq!(
        out["writes"],
        ["0", "-122", "-122"],
        "within the limits; past the user's hard limit; past the project's (EDQUOT)"
    );
    e2fsck_clean_when(&img.0, "the kernel wrote under uext4's limits");
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    assert_eq!(
        ours(&fs),
        out["after"],
        "uext4 reads the usage the kernel left"
    );
    assert_ne!(out["after"], out["before"]);
}
