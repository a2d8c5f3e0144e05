//! fs-verity against fsverity-utils and e2fsck: files enabled by uext4 measure as
//! `fsverity digest` computes for the same bytes and parameters (SHA-256 and SHA-512, the
//! Merkle block sizes the kernel allows, salts), their Merkle tree and descriptor are byte for
//! byte what `fsverity digest --out-merkle-tree --out-descriptor` writes, e2fsck accepts the
//! layout past EOF, reads are checked (a changed data block or tree block gives EIO naming
//! the inode), and verity files refuse writes as the kernel does. Expected digests come from
//! the fsverity binary at test time (tests skip with a message without it).

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use uext4::format::verity::{
    metadata_pos, METADATA_DESCRIPTOR, METADATA_MERKLE_TREE, METADATA_SIGNATURE,
};
use uext4::{Fs, MountOptions, VerityArgs, ROOT_INO};
use uext4_testkit::hex;

/// A verity image of `size` (mke2fs -O verity, 4 KiB blocks unless `extra` says).
fn verity_image(tag: &str, extra: &[&str]) -> Scratch {
    let img = scratch(tag);
    let mut args = vec!["-O", "verity"];
    args.extend_from_slice(extra);
    mke2fs(&img.0, "64M", &args);
    img
}

fn open(img: &Path) -> std::sync::Arc<Fs> {
    Fs::open_path(img, opts::no_timer()).unwrap()
}

/// Deterministic bytes.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed);
    (0..len).map(|_| r() as u8).collect()
}

fn alg_name(id: u32) -> &'static str {
    if id == 1 {
        "sha256"
    } else {
        "sha512"
    }
}

/// What `fsverity digest` says of `bytes` under `args`: the digest in hex, the Merkle tree
/// and the descriptor it writes.
fn fsverity_digest(dir: &Path, bytes: &[u8], args: &VerityArgs) -> (String, Vec<u8>, Vec<u8>) {
    let f = dir.join("plain");
    let (tree, desc) = (dir.join("tree"), dir.join("desc"));
    std::fs::write(&f, bytes).unwrap();
    let mut cmd = Command::new("fsverity");
    cmd.arg("digest")
        .arg(&f)
        .arg(format!("--hash-alg={}", alg_name(args.hash_algorithm)))
        .arg(format!("--block-size={}", args.block_size))
        .arg(format!("--out-merkle-tree={}", tree.display()))
        .arg(format!("--out-descriptor={}", desc.display()));
    if !args.salt.is_empty() {
        cmd.arg(format!("--salt={}", hex(&args.salt)));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let digest = line.split_whitespace().next().unwrap();
    let digest = digest.split(':').nth(1).unwrap().to_string();
    (
        digest,
        std::fs::read(&tree).unwrap(),
        std::fs::read(&desc).unwrap(),
    )
}

fn file_with(fs: &Fs, name: &str, bytes: &[u8]) -> u32 {
    let a = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap();
    fs.write_all(a.ino, 0, bytes).unwrap();
    a.ino
}

fn args(alg: u32, block_size: u32, salt: &[u8]) -> VerityArgs {
    VerityArgs {
        hash_algorithm: alg,
        block_size,
        salt: salt.to_vec(),
        signature: Vec::new(),
    }
}

/// Every case: measured digest, tree and descriptor equal fsverity-utils', before and after
/// a reopen, and the data reads back whole through the checked path.
#[test]
fn digests_trees_and_descriptors_equal_fsverity_utils() {
    if !have(&["fsverity"]) {
        return;
    }
    let img = verity_image("verity-digest", &[]);
    let work = scratch("verity-digest-work");
    std::fs::create_dir_all(&work.0).unwrap();
    let sizes = [
        0usize,
        1,
        4095,
        4096,
        4097,
        128 * 4096,
        128 * 4096 + 1,
        2_500_000,
    ];
    let params = [
        args(1, 4096, b""),
        args(2, 4096, b""),
        args(1, 1024, b"\x01\x02\x03"),
        args(2, 2048, &[0xa5; 32]),
        args(2, 1024, b"salt"),
    ];
    let mut cases = Vec::new();
    let fs = open(&img.0);
    for (i, size) in sizes.iter().enumerate() {
        for (j, a) in params.iter().enumerate() {
            if *size > 600_000 && j > 1 {
                continue;
            }
            let bytes = data(*size, (i * 10 + j) as u64 + 1);
            let ino = file_with(&fs, &format!("f{i}-{j}"), &bytes);
            fs.enable_verity(ino, a).unwrap();
            cases.push((ino, bytes, a.clone()));
        }
    }
    let check = |fs: &Fs, when: &str| {
        for (ino, bytes, a) in &cases {
            let (want, tree, desc) = fsverity_digest(&work.0, bytes, a);
            let (alg, got) = fs.measure_verity(*ino).unwrap();
            assert_eq!(alg.name(), alg_name(a.hash_algorithm));
            assert_eq!(hex(&got), want, "{when}: size {} {a:?}", bytes.len());
            let t = fs
                .read_verity_metadata(*ino, METADATA_MERKLE_TREE, 0, u64::MAX)
                .unwrap();
            assert!(
                t == tree,
                "{when}: Merkle tree of size {} {a:?}",
                bytes.len()
            );
            let d = fs
                .read_verity_metadata(*ino, METADATA_DESCRIPTOR, 0, 4096)
                .unwrap();
            assert_eq!(d, desc, "{when}: descriptor of size {} {a:?}", bytes.len());
            assert_eq!(read_all(fs, *ino), *bytes, "{when}: contents");
            assert!(fs.is_verity(*ino).unwrap());
        }
    };
    check(&fs, "after enable");
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after enabling verity");
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    check(&fs, "after a read-only reopen");
}

/// A 1 KiB-block filesystem takes Merkle blocks of 1 KiB only (at most the filesystem block,
/// as the kernel); the file left as it was after a refusal.
#[test]
fn block_sizes_past_the_filesystem_block_are_refused() {
    if !have(&["fsverity"]) {
        return;
    }
    let img = verity_image("verity-1k", &["-b", "1024"]);
    let work = scratch("verity-1k-work");
    std::fs::create_dir_all(&work.0).unwrap();
    let fs = open(&img.0);
    let bytes = data(300_000, 7);
    let ino = file_with(&fs, "f", &bytes);
    let e = fs.enable_verity(ino, &args(1, 4096, b"")).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(!fs.is_verity(ino).unwrap());
    fs.write_all(ino, 0, b"still writable").unwrap();
    let mut bytes = bytes;
    bytes[..14].copy_from_slice(b"still writable");
    let a = args(1, 1024, b"");
    fs.enable_verity(ino, &a).unwrap();
    let (want, _, _) = fsverity_digest(&work.0, &bytes, &a);
    assert_eq!(hex(&fs.measure_verity(ino).unwrap().1), want);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after enabling verity on 1 KiB blocks");
}

/// Flips bytes in the image at byte `at`.
fn flip(img: &Path, at: u64, n: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, at).unwrap();
    b.iter_mut().for_each(|x| *x ^= 0x5a);
    f.write_all_at(&b, at).unwrap();
}

/// The device byte where byte `off` of file `ino` lives.
fn byte_of(fs: &Fs, ino: u32, off: u64) -> u64 {
    let bs = fs.geo.block_size as u64;
    let lblk = (off / bs) as u32;
    let e = fs
        .ext_list(ino)
        .unwrap()
        .into_iter()
        .find(|e| e.lblk <= lblk && lblk < e.lblk + e.len)
        .expect("mapped");
    (e.pblk + (lblk - e.lblk) as u64) * bs + off % bs
}

/// A changed data block, level-0 tree block or root tree block gives EIO, with a message that
/// names the inode, for reads under it; other blocks still read. e2fsck does not check hashes
/// and stays quiet.
#[test]
fn corruption_of_data_or_tree_gives_eio() {
    let img = verity_image("verity-corrupt", &[]);
    let fs = open(&img.0);
    // 300 data blocks: two level-0 tree blocks under one root block.
    let bytes = data(300 * 4096, 3);
    let ino = file_with(&fs, "f", &bytes);
    fs.enable_verity(ino, &VerityArgs::default()).unwrap();
    let size = bytes.len() as u64;
    let tree = metadata_pos(size);
    let (data_at, root_at, level0_at) = (
        byte_of(&fs, ino, 5 * 4096 + 100),
        byte_of(&fs, ino, tree),
        byte_of(&fs, ino, tree + 2 * 4096 + 8),
    );
    fs.unmount().unwrap();
    let read = |off: u64, len: usize| -> uext4::Result<Vec<u8>> {
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        let mut b = vec![0u8; len];
        let n = fs.read(ino, off, &mut b)?;
        b.truncate(n);
        Ok(b)
    };
    let eio = |r: uext4::Result<Vec<u8>>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.errno(), libc::EIO, "{what}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("inode {ino}")) && !msg.contains('\n'),
            "{msg}"
        );
    };
    // Data block 5: 9 bytes changed.
    flip(&img.0, data_at, 9);
    eio(read(5 * 4096, 10), "read of the changed block");
    eio(read(0, bytes.len()), "read of the whole file");
    assert_eq!(read(6 * 4096, 4096).unwrap(), bytes[6 * 4096..7 * 4096]);
    flip(&img.0, data_at, 9);
    assert_eq!(read(0, bytes.len()).unwrap(), bytes);
    // The second level-0 tree block (data blocks 128..255; the root is tree block 0).
    flip(&img.0, level0_at, 1);
    eio(read(200 * 4096, 1), "read under the changed tree block");
    assert_eq!(read(0, 4096).unwrap(), bytes[..4096]);
    flip(&img.0, level0_at, 1);
    // The root block: everything fails.
    flip(&img.0, root_at, 4);
    eio(read(0, 1), "read under a changed root block");
    eio(
        read(299 * 4096, 1),
        "read of the last block under a changed root block",
    );
    e2fsck_clean_when(
        &img.0,
        "after corrupting verity data (hashes are not e2fsck's)",
    );
    flip(&img.0, root_at, 4);
    assert_eq!(read(0, bytes.len()).unwrap(), bytes);
}

/// Verity files refuse writes, truncates, fallocate and write opens (EPERM); enabling twice
/// is EEXIST; directories, oversize salts, bad block sizes and images without the feature
/// are refused as the kernel refuses them. A signature is stored and returned.
#[test]
fn verity_files_are_read_only_and_enabling_checks_its_arguments() {
    let img = verity_image("verity-rules", &[]);
    let fs = open(&img.0);
    let bytes = data(10_000, 9);
    let ino = file_with(&fs, "f", &bytes);
    let mut a = VerityArgs::default();
    let bad = |a: &VerityArgs| fs.enable_verity(ino, a).unwrap_err().errno();
    assert_eq!(
        bad(&VerityArgs {
            block_size: 3000,
            ..a.clone()
        }),
        libc::EINVAL
    );
    assert_eq!(
        bad(&VerityArgs {
            block_size: 512,
            ..a.clone()
        }),
        libc::EINVAL
    );
    assert_eq!(
        bad(&VerityArgs {
            hash_algorithm: 3,
            ..a.clone()
        }),
        libc::EINVAL
    );
    assert_eq!(
        bad(&VerityArgs {
            salt: vec![1; 33],
            ..a.clone()
        }),
        libc::EMSGSIZE
    );
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    assert_eq!(
        fs.enable_verity(dir.ino, &a).unwrap_err().errno(),
        libc::EISDIR
    );
    a.signature = b"not really PKCS#7, stored as given".to_vec();
    fs.enable_verity(ino, &a).unwrap();
    assert_eq!(bad(&a), libc::EEXIST);
    let perm = |r: uext4::Result<()>| assert_eq!(r.unwrap_err().errno(), libc::EPERM);
    perm(fs.write(ino, 0, b"x").map(drop));
    perm(fs.write(ino, bytes.len() as u64, b"x").map(drop));
    perm(fs.truncate(ino, 0));
    perm(fs.fallocate(ino, 0, 0, 1 << 20));
    perm(fs.check_open(ino, libc::O_WRONLY));
    perm(fs.check_open(ino, libc::O_RDONLY | libc::O_TRUNC));
    fs.check_open(ino, libc::O_RDONLY).unwrap();
    // Attributes still change, as on the kernel.
    fs.setattr(
        ino,
        &uext4::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let sig = fs
        .read_verity_metadata(ino, METADATA_SIGNATURE, 0, 1 << 20)
        .unwrap();
    assert_eq!(sig, a.signature);
    let d = fs
        .read_verity_metadata(ino, METADATA_DESCRIPTOR, 0, 1 << 20)
        .unwrap();
    assert_eq!(
        (d.len(), &d[4..8]),
        (256, &[0u8; 4][..]),
        "sig_size reads as 0"
    );
    let plain = file_with(&fs, "plain", b"abc");
    assert_eq!(fs.measure_verity(plain).unwrap_err().errno(), libc::ENODATA);
    let g = file_with(&fs, "g", b"abc");
    fs.enable_verity(g, &VerityArgs::default()).unwrap();
    assert_eq!(
        fs.read_verity_metadata(g, METADATA_SIGNATURE, 0, 10)
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    assert_eq!(read_all(&fs, ino), bytes);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after verity refusals");

    let plain_img = scratch("verity-nofeature");
    mke2fs(&plain_img.0, "64M", &[]);
    let fs = open(&plain_img.0);
    let ino = file_with(&fs, "f", b"abc");
    let e = fs.enable_verity(ino, &VerityArgs::default()).unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
    fs.unmount().unwrap();
    e2fsck_clean_when(&plain_img.0, "after a refused enable");
}

/// Buffered data not yet written back is what the tree covers; blocks past the end left by
/// fallocate are dropped first (the descriptor is found from the last block); the flag and
/// the tree survive a crash after the enable (journal replay), and the image is clean.
#[test]
fn buffered_data_preallocated_tails_and_a_crash_after_enabling() {
    if !have(&["fsverity"]) {
        return;
    }
    let img = verity_image("verity-crash", &[]);
    let work = scratch("verity-crash-work");
    std::fs::create_dir_all(&work.0).unwrap();
    let fs = Fs::open_path(&img.0, opts::no_timer_buffered(true)).unwrap();
    let bytes = data(777_777, 11);
    let ino = file_with(&fs, "f", &bytes);
    fs.fallocate(ino, uext4::FALLOC_FL_KEEP_SIZE, 0, 4 << 20)
        .unwrap();
    fs.enable_verity(ino, &VerityArgs::default()).unwrap();
    let (want, _, _) = fsverity_digest(&work.0, &bytes, &VerityArgs::default());
    assert_eq!(hex(&fs.measure_verity(ino).unwrap().1), want);
    fs.sync().unwrap();
    fs.crash();
    let fs = open(&img.0);
    assert!(fs.is_verity(ino).unwrap());
    assert_eq!(hex(&fs.measure_verity(ino).unwrap().1), want);
    assert_eq!(read_all(&fs, ino), bytes);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after a crash following an enable");
}

/// Verity on an encrypted file (mke2fs -O verity,encrypt; a v2 policy on its directory), as
/// the kernel keeps it: the Merkle tree, the descriptor and its size word are encrypted past
/// the end like the data, the hashes are of the plaintext. The digest, and the tree and
/// descriptor read back through FS_IOC_READ_VERITY_METADATA, are what fsverity-utils computes
/// from the plaintext, before and after a reopen; no block of the image holds the tree's
/// plaintext; without the key the file is ENOKEY; a changed data block is EIO; e2fsck is
/// clean. tests/kernel_vm.rs checks the same files against the kernel's fs-verity.
#[test]
fn verity_on_encrypted_files_keeps_the_tree_encrypted() {
    if !have(&["fsverity"]) {
        return;
    }
    let img = verity_image("verity-encrypted", &["-O", "encrypt"]);
    let key = uext4::EncryptionKey::new(data(64, 0x6b6579));
    let with_key = || {
        let o = MountOptions {
            keys: vec![key.clone()],
            ..opts::no_timer()
        };
        Fs::open_path(&img.0, o).unwrap()
    };
    let fs = with_key();
    let dir = fs.mkdir(ROOT_INO, b"sealed", 0o755, 0, 0).unwrap().ino;
    let policy = uext4::EncryptionPolicy::v2(&key).unwrap();
    fs.set_encryption_policy(dir, &policy).unwrap();
    // 300 blocks and a part: two level-0 tree blocks, a short last data block.
    let bytes = data(300 * 4096 + 1234, 9);
    let ino = fs.create(dir, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_all(ino, 0, &bytes).unwrap();
    let scratch = Scratch::dir("verity-encrypted-digest");
    for (alg, bs) in [(1, 4096), (2, 1024)] {
        let name = format!("f{alg}");
        let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_all(ino, 0, &bytes).unwrap();
        let a = args(alg, bs, b"salt");
        fs.enable_verity(ino, &a).unwrap();
        let (want, tree, desc) = fsverity_digest(&scratch.0, &bytes, &a);
        assert_eq!(hex(&fs.measure_verity(ino).unwrap().1), want, "{name}");
        let got = fs
            .read_verity_metadata(ino, METADATA_MERKLE_TREE, 0, 1 << 30)
            .unwrap();
        assert_eq!(got, tree, "{name}: the tree, decrypted");
        let got = fs
            .read_verity_metadata(ino, METADATA_DESCRIPTOR, 0, 1 << 20)
            .unwrap();
        assert_eq!(got, desc, "{name}: the descriptor, decrypted");
        assert_eq!(uext4_testkit::read_all(&fs, ino), bytes);
    }
    let a = VerityArgs::default();
    fs.enable_verity(ino, &a).unwrap();
    let (want, tree, _) = fsverity_digest(&scratch.0, &bytes, &a);
    let data_at = byte_of(&fs, ino, 7 * 4096 + 10);
    fs.unmount().unwrap();
    e2fsck_clean_when(&img.0, "after enabling verity on encrypted files");
    // The tree's plaintext is nowhere on disk (its first 64 bytes, a hash, at any offset).
    let image = std::fs::read(&img.0).unwrap();
    assert!(
        !image.windows(64).any(|w| w == &tree[..64]),
        "the Merkle tree is stored in plaintext"
    );
    drop(image);
    let fs = with_key();
    let f = fs.lookup(dir, b"f").unwrap().ino;
    assert_eq!(hex(&fs.measure_verity(f).unwrap().1), want);
    assert_eq!(uext4_testkit::read_all(&fs, f), bytes);
    fs.unmount().unwrap();
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let mut b = vec![0u8; 16];
    let e = fs.read(ino, 0, &mut b).expect_err("read without the key");
    assert_eq!(e.errno(), libc::ENOKEY, "{e}");
    drop(fs);
    flip(&img.0, data_at, 3);
    let fs = Fs::open_path(
        &img.0,
        MountOptions {
            keys: vec![key.clone()],
            ..MountOptions::ro()
        },
    )
    .unwrap();
    let e = fs.read(ino, 7 * 4096, &mut b).expect_err("a changed block");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert_eq!(fs.read(ino, 0, &mut b).unwrap(), 16);
    assert_eq!(b, bytes[..16]);
}
