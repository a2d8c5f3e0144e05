//! Tests of the fscrypt module: known-answer vectors of the ciphers, the context format,
//! no-key names, and (where the machine allows: root, loop devices, fscrypt) images made by
//! the kernel through scripts/fscrypt-fixtures.py, decrypted and re-encrypted here.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::fname::{nokey_name, nokey_name_decode, NokeyName, NOKEY_NAME_MAX_ENCODED};
use super::hctr2::Hctr2;
use super::keys::{InodeKey, InodeKind, Keyring, MasterKey};
use super::policy::{Context, FsCaps, KeySpec, Mode, Policy, PolicyVersion};
use super::symlink::symlink_ciphertext;
use super::CryptoError;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// (key, tweak, plaintext, ciphertext)
type Vector = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

fn vectors(json: &str) -> Vec<Vector> {
    let v: Vec<(String, String, String, String)> = serde_json::from_str(json).unwrap();
    v.into_iter()
        .map(|(k, t, p, c)| (unhex(&k), unhex(&t), unhex(&p), unhex(&c)))
        .collect()
}

#[test]
fn hctr2_known_answers() {
    // Vectors of the HCTR2 authors' reference (AES-256, 32-byte tweaks as fscrypt uses).
    let vs = vectors(include_str!("testdata/hctr2-aes256.json"));
    assert!(vs.len() >= 5);
    for (key, tweak, plain, cipher) in vs {
        let h = Hctr2::new(key.as_slice().try_into().unwrap());
        let mut buf = plain.clone();
        h.encrypt(&mut buf, &tweak);
        assert_eq!(buf, cipher, "HCTR2 encrypt, {} bytes", plain.len());
        h.decrypt(&mut buf, &tweak);
        assert_eq!(buf, plain);
    }
}

#[test]
fn adiantum_known_answers_through_mode_cipher() {
    // Vectors of the Adiantum paper's XChaCha12/AES-256 set, 32-byte tweaks, including a
    // length that is no multiple of 16 (as padded filenames can be).
    use super::cipher::ModeCipher;
    for (key, tweak, plain, cipher) in
        vectors(include_str!("testdata/adiantum-xchacha12-aes256.json"))
    {
        let c = ModeCipher::new(Mode::Adiantum, &key).unwrap();
        let iv: [u8; 32] = tweak.as_slice().try_into().unwrap();
        let mut buf = plain.clone();
        c.encrypt(&mut buf, &iv).unwrap();
        assert_eq!(buf, cipher, "Adiantum, {} bytes", plain.len());
        c.decrypt(&mut buf, &iv).unwrap();
        assert_eq!(buf, plain);
    }
}

#[test]
fn aes_cts_is_cbc_cs3() {
    // RFC 3962's AES-128 CTS vectors (Kerberos: CBC-CS3 with a zero IV), the kernel's
    // cts(cbc(aes)).
    use super::cipher::ModeCipher;
    let key = unhex("636869636b656e207465726979616b69");
    let c = ModeCipher::new(Mode::Aes128Cts, &key).unwrap();
    let plain = unhex("4920776f756c64206c696b652074686520");
    let mut buf = plain.clone();
    c.encrypt(&mut buf, &[0; 32]).unwrap();
    assert_eq!(buf, unhex("c6353568f2bf8cb4d8a580362da7ff7f97"));
    c.decrypt(&mut buf, &[0; 32]).unwrap();
    assert_eq!(buf, plain);
    let plain = unhex("4920776f756c64206c696b65207468652047656e6572616c20476175277320");
    let mut buf = plain.clone();
    c.encrypt(&mut buf, &[0; 32]).unwrap();
    assert_eq!(
        buf,
        unhex("fc00783e0efdb2c1d445d4c8eff7ed2297687268d6ecccc0c07b25e25ecfe5")
    );
}

#[test]
fn essiv_cbc_round_trip_and_iv_dependence() {
    use super::cipher::ModeCipher;
    let c = ModeCipher::new(Mode::Aes128Cbc, &[7u8; 16]).unwrap();
    let plain: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let mut a = plain.clone();
    let mut iv = [0u8; 32];
    c.encrypt(&mut a, &iv).unwrap();
    iv[0] = 1;
    let mut b = plain.clone();
    c.encrypt(&mut b, &iv).unwrap();
    assert_ne!(a, b);
    c.decrypt(&mut b, &iv).unwrap();
    assert_eq!(b, plain);
}

fn v2_policy(contents: Mode, names: Mode, flags: u8) -> Policy {
    Policy {
        version: PolicyVersion::V2,
        contents_mode: contents,
        filenames_mode: names,
        flags,
        log2_data_unit_size: 0,
        key: KeySpec::Identifier([0x11; 16]),
    }
}

#[test]
fn context_round_trip_and_validation() {
    let p = v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 2);
    let ctx = p.new_context().unwrap();
    let raw = ctx.to_bytes();
    assert_eq!(raw.len(), 40);
    assert_eq!(&raw[..8], &[2, 1, 4, 2, 0, 0, 0, 0]);
    assert_eq!(Context::parse(&raw).unwrap(), ctx);
    assert_ne!(p.new_context().unwrap().nonce, ctx.nonce, "fresh nonces");
    let v1 = Policy {
        version: PolicyVersion::V1,
        key: KeySpec::Descriptor([1; 8]),
        ..p
    };
    let raw1 = v1.new_context().unwrap().to_bytes();
    assert_eq!(raw1.len(), 28);
    assert_eq!(Context::parse(&raw1).unwrap().policy, v1);
    assert!(matches!(
        Context::parse(&raw[..39]),
        Err(CryptoError::InvalidContext(_))
    ));
    let mut bad = raw.clone();
    bad[6] = 1;
    assert!(Context::parse(&bad).is_err(), "reserved bytes");
    bad = raw.clone();
    bad[0] = 3;
    assert!(Context::parse(&bad).is_err(), "version");

    let caps = FsCaps {
        blkbits: 12,
        stable_inodes: false,
        casefolded: false,
    };
    assert!(p.validate(&caps).is_ok());
    assert!(v2_policy(Mode::Aes256Xts, Mode::Aes128Cts, 0)
        .validate(&caps)
        .is_err());
    assert!(v2_policy(Mode::Aes256Xts, Mode::Aes256Hctr2, 0)
        .validate(&caps)
        .is_ok());
    assert!(Policy {
        version: PolicyVersion::V1,
        key: KeySpec::Descriptor([0; 8]),
        ..v2_policy(Mode::Aes256Xts, Mode::Aes256Hctr2, 0)
    }
    .validate(&caps)
    .is_err());
    assert!(
        v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0x04)
            .validate(&caps)
            .is_err(),
        "DIRECT_KEY needs 32-byte IVs"
    );
    assert!(v2_policy(Mode::Adiantum, Mode::Adiantum, 0x04)
        .validate(&caps)
        .is_ok());
    assert!(
        v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0x08)
            .validate(&caps)
            .is_err(),
        "needs stable_inodes"
    );
    let stable = FsCaps {
        stable_inodes: true,
        ..caps
    };
    assert!(v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0x08)
        .validate(&stable)
        .is_ok());
    assert!(
        v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0x18)
            .validate(&stable)
            .is_err(),
        "exclusive"
    );
    assert!(
        v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0x20)
            .validate(&stable)
            .is_err(),
        "unknown flag"
    );
}

#[test]
fn names_pad_and_round_trip() {
    let mut ring = Keyring::new();
    let (_, id) = ring.add_key(&[0x42; 64]).unwrap();
    for (flags, len, want) in [
        (0u8, 1usize, 16usize),
        (0, 17, 20),
        (1, 17, 24),
        (2, 17, 32),
        (3, 17, 32),
        (3, 250, 255),
        (0, 255, 255),
    ] {
        let p = Policy {
            key: KeySpec::Identifier(id),
            ..v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, flags)
        };
        let ctx = p.new_context().unwrap();
        let k = ring
            .inode_key(&ctx, InodeKind::Directory, 12, &[0; 16])
            .unwrap();
        let name = vec![b'a'; len];
        let ct = k.encrypt_name(&name).unwrap();
        assert_eq!(ct.len(), want, "padding {} of {len}", p.padding());
        assert_eq!(k.decrypt_name(&ct).unwrap(), name);
    }
    let p = Policy {
        key: KeySpec::Identifier(id),
        ..v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0)
    };
    let k = ring
        .inode_key(
            &p.new_context().unwrap(),
            InodeKind::Directory,
            12,
            &[0; 16],
        )
        .unwrap();
    assert_eq!(k.encrypt_name(&[b'a'; 256]), Err(CryptoError::NameTooLong));
    assert!(
        k.encrypt_block(0, &mut [0; 4096]).is_err(),
        "a directory key has no contents"
    );
}

#[test]
fn nokey_names_encode_and_decode() {
    let short: Vec<u8> = (0..32u8).collect();
    let n = nokey_name(&short, Some((0x1234_5678, 0x9abc_def0)));
    assert_eq!(n.len(), (40usize * 4).div_ceil(3));
    assert!(n
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
    let d = nokey_name_decode(&n).unwrap();
    assert_eq!(
        d,
        NokeyName::Full {
            hash: 0x1234_5678,
            minor_hash: 0x9abc_def0,
            ciphertext: short.clone()
        }
    );
    assert!(d.matches(&short));
    let long: Vec<u8> = (0..255u32).map(|i| (i * 7) as u8).collect();
    let n = nokey_name(&long, None);
    assert_eq!(n.len(), NOKEY_NAME_MAX_ENCODED);
    assert_eq!(n.len(), 252);
    let d = nokey_name_decode(&n).unwrap();
    assert!(matches!(d, NokeyName::Digested { .. }));
    assert!(d.matches(&long));
    let mut other = long.clone();
    other[200] ^= 1;
    assert!(!d.matches(&other));
    // The first bytes of the RFC 4648 base64url alphabet, no padding.
    assert_eq!(
        nokey_name(&[0xfb; 16], None)[..12].to_vec(),
        b"AAAAAAAAAAD7".to_vec()
    );
    assert!(nokey_name_decode(b"ab/c").is_err());
    assert!(nokey_name_decode(b"AAAAAAAAAAA").is_err(), "too short");
}

#[test]
fn keys_never_print() {
    let raw = [0xA5u8; 64];
    let mut ring = Keyring::new();
    ring.add_key(&raw).unwrap();
    let mk = MasterKey::new(&raw).unwrap();
    let p = Policy {
        key: KeySpec::Identifier(mk.identifier()),
        ..v2_policy(Mode::Aes256Xts, Mode::Aes256Cts, 0)
    };
    let k = ring
        .inode_key(&p.new_context().unwrap(), InodeKind::Regular, 13, &[0; 16])
        .unwrap();
    for s in [
        format!("{ring:?}"),
        format!("{mk:?}"),
        format!("{k:?}"),
        format!("{:?}", k.cipher),
    ] {
        assert!(!s.contains("a5a5") && !s.contains("165, 165"), "{s}");
    }
    assert!(MasterKey::new(&[1; 15]).is_err());
    // A v2 key shorter than the mode's strength is refused for that mode.
    let short = MasterKey::new(&[3; 16]).unwrap();
    let p = Policy {
        key: KeySpec::Identifier(short.identifier()),
        ..p
    };
    assert!(matches!(
        InodeKey::derive(
            &short,
            &p.new_context().unwrap(),
            InodeKind::Regular,
            1,
            &[0; 16]
        ),
        Err(CryptoError::BadKeySize(16))
    ));
}

// ---- Against the kernel ----

/// (inode, on-disk name, stored dirhash)
type DirEntry = (u32, Vec<u8>, Option<(u32, u32)>);

struct Image {
    bytes: Vec<u8>,
    block_size: usize,
    inode_size: usize,
    inodes_per_group: u32,
    desc_size: usize,
    uuid: [u8; 16],
}

const EXT4_EXTENTS_FL: u32 = 0x80000;
const EXT4_INLINE_DATA_FL: u32 = 0x1000_0000;
const EXT4_ENCRYPT_FL: u32 = 0x800;
const EXT4_CASEFOLD_FL: u32 = 0x4000_0000;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

impl Image {
    fn open(path: &Path) -> Image {
        let bytes = std::fs::read(path).unwrap();
        let sb = &bytes[1024..2048];
        let block_size = 1024usize << le32(sb, 0x18);
        let incompat = le32(sb, 0x60);
        let desc_size = if incompat & 0x80 != 0 {
            le16(sb, 0xFE) as usize
        } else {
            32
        };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&sb[0x68..0x78]);
        Image {
            block_size,
            inode_size: le16(sb, 0x58) as usize,
            inodes_per_group: le32(sb, 0x28),
            desc_size,
            uuid,
            bytes,
        }
    }

    fn block(&self, n: u64) -> &[u8] {
        let o = n as usize * self.block_size;
        &self.bytes[o..o + self.block_size]
    }

    fn inode(&self, ino: u32) -> &[u8] {
        let g = ((ino - 1) / self.inodes_per_group) as usize;
        let idx = ((ino - 1) % self.inodes_per_group) as usize;
        let gdt = if self.block_size == 1024 { 2 } else { 1 } * self.block_size;
        let gd = &self.bytes[gdt + g * self.desc_size..];
        let mut table = le32(gd, 8) as u64;
        if self.desc_size >= 64 {
            table |= (le32(gd, 0x28) as u64) << 32;
        }
        let o = table as usize * self.block_size + idx * self.inode_size;
        &self.bytes[o..o + self.inode_size]
    }

    /// The `c` xattr (index 9) of an inode: in the inode, else in its xattr block.
    fn context(&self, ino: u32) -> Vec<u8> {
        let raw = self.inode(ino);
        let extra = le16(raw, 128) as usize;
        let body = 128 + extra;
        if raw.len() > body + 4 && le32(raw, body) == 0xEA02_0000 {
            if let Some(v) = find_xattr(&raw[body + 4..], 0) {
                return v;
            }
        }
        let acl = le32(raw, 0x68) as u64 | (le16(raw, 0x74) as u64) << 32;
        assert_ne!(acl, 0, "inode {ino} has no encryption context");
        let blk = self.block(acl);
        find_xattr(&blk[32..], 32).expect("context in the xattr block")
    }

    /// Physical block of logical block `lblk` (None: a hole), walking the extent tree.
    fn bmap(&self, ino: u32, lblk: u32) -> Option<u64> {
        let raw = self.inode(ino);
        assert!(
            le32(raw, 0x20) & EXT4_EXTENTS_FL != 0,
            "inode {ino} has no extents"
        );
        let mut node = raw[0x28..0x28 + 60].to_vec();
        loop {
            assert_eq!(le16(&node, 0), 0xF30A);
            let entries = le16(&node, 2) as usize;
            let depth = le16(&node, 6);
            if depth == 0 {
                for i in 0..entries {
                    let e = &node[12 + 12 * i..24 + 12 * i];
                    let first = le32(e, 0);
                    let mut len = le16(e, 4) as u32;
                    if len > 32768 {
                        len -= 32768; // unwritten
                    }
                    if lblk >= first && lblk < first + len {
                        let start = le32(e, 8) as u64 | (le16(e, 6) as u64) << 32;
                        return Some(start + (lblk - first) as u64);
                    }
                }
                return None;
            }
            let mut child = None;
            for i in 0..entries {
                let e = &node[12 + 12 * i..24 + 12 * i];
                if le32(e, 0) <= lblk {
                    child = Some(le32(e, 4) as u64 | (le16(e, 8) as u64) << 32);
                }
            }
            node = self.block(child?).to_vec();
        }
    }

    /// ext4's default dirhash of a name (s_def_hash_version, unsigned flag, s_hash_seed).
    fn ext4_hash(&self, name: &[u8]) -> (u32, u32) {
        let sb = &self.bytes[1024..2048];
        let mut v = sb[0xFC];
        if v <= 2 && le32(sb, 0x160) & 0x2 != 0 {
            v += 3;
        }
        let seed = [
            le32(sb, 0xEC),
            le32(sb, 0xF0),
            le32(sb, 0xF4),
            le32(sb, 0xF8),
        ];
        crate::format::dx_hash::dirhash(name, v, &seed)
    }

    fn size(&self, ino: u32) -> u64 {
        let raw = self.inode(ino);
        le32(raw, 4) as u64 | (le32(raw, 0x6C) as u64) << 32
    }

    fn flags(&self, ino: u32) -> u32 {
        le32(self.inode(ino), 0x20)
    }

    /// (inode, on-disk name, stored dirhash) of every live entry of a directory; the
    /// dirhash is stored after the name in encrypted casefolded directories.
    fn dir_entries(&self, ino: u32) -> Vec<DirEntry> {
        let hashed = self.flags(ino) & (EXT4_CASEFOLD_FL | EXT4_ENCRYPT_FL)
            == EXT4_CASEFOLD_FL | EXT4_ENCRYPT_FL;
        let blocks = self.size(ino) as usize / self.block_size;
        let mut out = Vec::new();
        for l in 0..blocks as u32 {
            let Some(p) = self.bmap(ino, l) else { continue };
            let b = self.block(p);
            let mut o = 0;
            while o + 8 <= b.len() {
                let (i, rec, nl) = (le32(b, o), le16(b, o + 4) as usize, b[o + 6] as usize);
                if rec < 8 {
                    break;
                }
                if i != 0 && nl > 0 {
                    let h = (8 + nl + 3) & !3;
                    let stored = hashed.then(|| (le32(b, o + h), le32(b, o + h + 4)));
                    out.push((i, b[o + 8..o + 8 + nl].to_vec(), stored));
                }
                o += rec;
            }
        }
        out
    }
}

fn find_xattr(entries: &[u8], value_base_adjust: usize) -> Option<Vec<u8>> {
    // Entries start at `entries`; value offsets count from the first entry (in the inode)
    // or from the block start (in a block: `value_base_adjust` = 32 bytes of header).
    let mut o = 0;
    while o + 16 <= entries.len() && le32(entries, o) != 0 {
        let (nl, idx, voff, vsize) = (
            entries[o] as usize,
            entries[o + 1],
            le16(entries, o + 2) as usize,
            le32(entries, o + 8) as usize,
        );
        let name = &entries[o + 16..o + 16 + nl];
        if idx == 9 && name == b"c" {
            let start = voff - value_base_adjust;
            return Some(entries[start..start + vsize].to_vec());
        }
        o += (16 + nl + 3) & !3;
    }
    None
}

#[test]
fn kernel_made_images_decrypt_and_reencrypt() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("uext4-fscrypt-{}", std::process::id()));
    let run = Command::new("python3")
        .arg(root.join("scripts/fscrypt-fixtures.py"))
        .arg(&out)
        .output();
    let Ok(run) = run else {
        eprintln!("SKIP: no python3");
        return;
    };
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    if stdout.contains("SKIP:") {
        eprintln!("{stdout}");
        let _ = std::fs::remove_dir_all(&out);
        return;
    }
    assert!(
        run.status.success(),
        "fixture script failed: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let mut verified = Vec::new();
    for pol in manifest["policies"].as_array().unwrap() {
        let name = pol["name"].as_str().unwrap();
        if std::env::var("FSCRYPT_ONLY").is_ok_and(|o| !name.contains(&o)) {
            continue;
        }
        if let Some(why) = pol.get("skipped") {
            eprintln!("{name}: skipped by the kernel: {why}");
            continue;
        }
        let img_name = manifest["images"][pol["image"].as_str().unwrap()]["image"]
            .as_str()
            .unwrap();
        let img = Image::open(&out.join(img_name));
        let raw_key = std::fs::read(out.join(pol["key_file"].as_str().unwrap())).unwrap();
        let mut ring = Keyring::new();
        let (_, id) = ring.add_key(&raw_key).unwrap();
        if let Some(kid) = pol.get("identifier") {
            assert_eq!(
                super::hex(&id),
                kid.as_str().unwrap(),
                "{name}: v2 key identifier"
            );
        }
        let dir_ino = pol["dir_ino"].as_u64().unwrap() as u32;
        let dctx = Context::parse(&img.context(dir_ino)).unwrap();
        assert_eq!(
            dctx.policy.contents_mode.num() as u64,
            pol["contents_mode"].as_u64().unwrap()
        );
        assert_eq!(
            dctx.policy.filenames_mode.num() as u64,
            pol["filenames_mode"].as_u64().unwrap()
        );
        assert_eq!(dctx.policy.flags as u64, pol["flags"].as_u64().unwrap());
        let caps = FsCaps {
            blkbits: img.block_size.trailing_zeros() as u8,
            stable_inodes: pol["image"] == "stable",
            casefolded: pol["image"] == "casefold",
        };
        dctx.policy.validate(&caps).unwrap();
        let key_of = |ino: u32, kind: InodeKind| {
            let ctx = Context::parse(&img.context(ino)).unwrap();
            assert_eq!(
                ctx.policy, dctx.policy,
                "{name}: inode {ino} inherits the policy"
            );
            ring.inode_key(&ctx, kind, ino, &img.uuid).unwrap()
        };
        let mut checked = 0;
        for e in pol["entries"].as_array().unwrap() {
            let ino = e["ino"].as_u64().unwrap() as u32;
            let parent = e["parent_ino"].as_u64().unwrap() as u32;
            let plain = unhex(e["name_hex"].as_str().unwrap());
            let dkey = key_of(parent, InodeKind::Directory);
            let (_, ct, stored) = img
                .dir_entries(parent)
                .into_iter()
                .find(|(i, _, _)| *i == ino)
                .expect("entry on disk");
            assert_eq!(
                dkey.decrypt_name(&ct).unwrap(),
                plain,
                "{name}: name of inode {ino}"
            );
            assert_eq!(
                dkey.encrypt_name(&plain).unwrap(),
                ct,
                "{name}: re-encrypted name of inode {ino}"
            );
            let nokey = unhex(e["nokey_name_hex"].as_str().expect("no-key name recorded"));
            // ext4 gives the dirhash (of the ciphertext, with the filesystem's hash) where
            // its readdir goes through the hash tree code: indexed or one-block directories.
            let dx_readdir =
                img.flags(parent) & 0x1000 != 0 || img.size(parent) == img.block_size as u64;
            let mut dirhash = dx_readdir.then(|| img.ext4_hash(&ct));
            if let Some(h) = stored {
                // Casefolded: SipHash of the (casefolded; here lower-case ASCII) plaintext.
                assert_eq!(
                    dkey.ext4_dirhash(&plain).unwrap(),
                    h,
                    "{name}: casefold dirhash of inode {ino}"
                );
                dirhash = Some(h);
            }
            assert_eq!(
                nokey_name(&ct, dirhash),
                nokey,
                "{name}: no-key name of inode {ino}"
            );
            assert!(nokey_name_decode(&nokey).unwrap().matches(&ct));
            assert!(img.flags(ino) & EXT4_ENCRYPT_FL != 0);
            match e["type"].as_str().unwrap() {
                "file" => {
                    let size = e["size"].as_u64().unwrap();
                    assert_eq!(img.size(ino), size);
                    assert_eq!(
                        img.flags(ino) & EXT4_INLINE_DATA_FL,
                        0,
                        "{name}: encrypted files are never inline"
                    );
                    let k = key_of(ino, InodeKind::Regular);
                    let bs = img.block_size;
                    let mut data = Vec::new();
                    for l in 0..size.div_ceil(bs as u64) {
                        match img.bmap(ino, l as u32) {
                            Some(p) => {
                                let mut b = img.block(p).to_vec();
                                let ct = b.clone();
                                k.decrypt_block(l, &mut b).unwrap();
                                let mut again = b.clone();
                                k.encrypt_block(l, &mut again).unwrap();
                                assert_eq!(
                                    again, ct,
                                    "{name}: re-encrypted block {l} of inode {ino}"
                                );
                                data.extend_from_slice(&b);
                            }
                            None => data.extend(std::iter::repeat_n(0, bs)),
                        }
                    }
                    data.truncate(size as usize);
                    assert_eq!(
                        super::hex(&Sha256::digest(&data)),
                        e["sha256"].as_str().unwrap(),
                        "{name}: contents of inode {ino}"
                    );
                }
                "symlink" => {
                    let target = unhex(e["target_hex"].as_str().unwrap());
                    let size = img.size(ino) as usize;
                    let disk = if img.flags(ino) & EXT4_EXTENTS_FL != 0 {
                        img.block(img.bmap(ino, 0).unwrap())[..size].to_vec()
                    } else {
                        img.inode(ino)[0x28..0x28 + size].to_vec()
                    };
                    let k = key_of(ino, InodeKind::Symlink);
                    assert_eq!(
                        k.decrypt_symlink(&disk).unwrap(),
                        target,
                        "{name}: target of {ino}"
                    );
                    let enc = k.encrypt_symlink(&target, img.block_size).unwrap();
                    assert_eq!(
                        &enc[..size],
                        &disk[..],
                        "{name}: re-encrypted target of {ino}"
                    );
                    assert_eq!(enc.len(), size + 1, "i_size leaves out the NUL");
                    let nk = unhex(e["nokey_target_hex"].as_str().expect("no-key target"));
                    assert_eq!(
                        nokey_name(symlink_ciphertext(&disk).unwrap(), None),
                        nk,
                        "{name}: no-key target of {ino}"
                    );
                }
                _ => {}
            }
            checked += 1;
        }
        assert!(checked >= 20, "{name}: {checked} entries");
        verified.push(name.to_string());
    }
    eprintln!("verified against the kernel: {}", verified.join(", "));
    assert!(!verified.is_empty());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn cts_single_block_is_cbc() {
    use super::cipher::ModeCipher;
    use aes::cipher::{BlockCipherEncrypt, KeyInit};
    let key = [9u8; 32];
    let c = ModeCipher::new(Mode::Aes256Cts, &key).unwrap();
    let mut a = [0x61u8; 16];
    c.encrypt(&mut a, &[0; 32]).unwrap();
    let mut b = [0x61u8; 16];
    aes::Aes256::new(&key.into()).encrypt_block((&mut b).into());
    assert_eq!(a, b);
}

/// The engine's XTS (AES calls batched) equals the `xts-mode` crate's, block for block, on
/// data units of every size fscrypt uses, both ways.
#[test]
fn xts_equals_the_xts_mode_crate() {
    use aes::cipher::KeyInit;
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    };
    for len in [16usize, 32, 512, 1024, 4096, 65536] {
        let key: Vec<u8> = (0..64).map(|_| rnd()).collect();
        let mut iv = [0u8; 32];
        iv.iter_mut().take(16).for_each(|b| *b = rnd());
        let plain: Vec<u8> = (0..len).map(|_| rnd()).collect();
        let ours = super::cipher::ModeCipher::new(super::Mode::Aes256Xts, &key).unwrap();
        let mut a = plain.clone();
        ours.encrypt(&mut a, &iv).unwrap();
        let oracle = xts_mode::Xts128::new(
            aes::Aes256::new_from_slice(&key[..32]).unwrap(),
            aes::Aes256::new_from_slice(&key[32..]).unwrap(),
        );
        let mut b = plain.clone();
        let mut t = [0u8; 16];
        t.copy_from_slice(&iv[..16]);
        oracle.encrypt_sector(&mut b, t.into());
        assert_eq!(a, b, "XTS of {len} bytes");
        ours.decrypt(&mut a, &iv).unwrap();
        assert_eq!(a, plain);
    }
    let ours = super::cipher::ModeCipher::new(super::Mode::Aes256Xts, &[7u8; 64]).unwrap();
    assert!(ours.encrypt(&mut [0u8; 24], &[0; 32]).is_err());
}
