//! Master keys and each inode's derived key (fs/crypto keyring.c, keysetup.c,
//! keysetup_v1.c, hkdf.c).
//!
//! - v2: HKDF-SHA512 with an all-zero salt (no salt) over the raw master key; every
//!   derivation expands with info = "fscrypt\0" || context byte || context info.
//!   Key identifier: context 1, no info, 16 bytes.
//! - v1: the kernel matches keys by a descriptor chosen by userspace; the tools (fscrypt,
//!   e4crypt) choose the first 8 bytes of SHA-512(SHA-512(key)), as [`Keyring::add_key`]
//!   does. Per-file key: AES-128-ECB of the master key's first key_size bytes, keyed by
//!   the file's nonce; with DIRECT_KEY the master key itself.

use std::collections::HashMap;

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use sha2::{Digest, Sha512};
use zeroize::{Zeroize, Zeroizing};

use super::cipher::ModeCipher;
use super::policy::{
    Context, KeySpec, Mode, Policy, PolicyVersion, DESCRIPTOR_SIZE, FLAG_DIRECT_KEY,
    FLAG_IV_INO_LBLK_32, FLAG_IV_INO_LBLK_64, IDENTIFIER_SIZE, NONCE_SIZE,
};
use super::{CryptoError, Result};

/// HKDF contexts of fs/crypto/fscrypt_private.h (the byte after "fscrypt\0" in `info`).
pub(crate) const HKDF_CONTEXT_KEY_IDENTIFIER: u8 = 1; // info = (empty)
/// info = file nonce
pub(crate) const HKDF_CONTEXT_PER_FILE_ENC_KEY: u8 = 2;
/// info = mode number
pub(crate) const HKDF_CONTEXT_DIRECT_KEY: u8 = 3;
/// info = mode number || filesystem UUID
pub(crate) const HKDF_CONTEXT_IV_INO_LBLK_64_KEY: u8 = 4;
/// info = file nonce
pub(crate) const HKDF_CONTEXT_DIRHASH_KEY: u8 = 5;
/// info = mode number || filesystem UUID
pub(crate) const HKDF_CONTEXT_IV_INO_LBLK_32_KEY: u8 = 6;
/// info = (empty)
pub(crate) const HKDF_CONTEXT_INODE_HASH_KEY: u8 = 7;

/// Smallest and largest raw master keys the kernel accepts.
pub(crate) const MIN_KEY_SIZE: usize = 16;
/// FSCRYPT_MAX_RAW_KEY_SIZE.
pub(crate) const MAX_KEY_SIZE: usize = 64;

/// A master key: the raw bytes of a key file.
pub(crate) struct MasterKey {
    raw: Zeroizing<Vec<u8>>,
    descriptor: [u8; DESCRIPTOR_SIZE],
    identifier: [u8; IDENTIFIER_SIZE],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterKey")
            .field("descriptor", &super::hex(&self.descriptor))
            .field("identifier", &super::hex(&self.identifier))
            .field("raw", &format_args!("<{} bytes redacted>", self.raw.len()))
            .finish()
    }
}

impl MasterKey {
    /// A master key from raw bytes (16 to 64), v1 descriptor as the tools compute it.
    pub(crate) fn new(raw: &[u8]) -> Result<MasterKey> {
        let mut d = Sha512::digest(Sha512::digest(raw));
        let mut descriptor = [0u8; DESCRIPTOR_SIZE];
        descriptor.copy_from_slice(&d[..DESCRIPTOR_SIZE]);
        d.as_mut_slice().zeroize();
        Self::with_descriptor(raw, descriptor)
    }

    /// A master key whose v1 descriptor was chosen otherwise.
    pub(crate) fn with_descriptor(
        raw: &[u8],
        descriptor: [u8; DESCRIPTOR_SIZE],
    ) -> Result<MasterKey> {
        if !(MIN_KEY_SIZE..=MAX_KEY_SIZE).contains(&raw.len()) {
            return Err(CryptoError::BadKeySize(raw.len()));
        }
        let mut key = MasterKey {
            raw: Zeroizing::new(raw.to_vec()),
            descriptor,
            identifier: [0; IDENTIFIER_SIZE],
        };
        let mut id = [0u8; IDENTIFIER_SIZE];
        key.hkdf(HKDF_CONTEXT_KEY_IDENTIFIER, &[], &mut id);
        key.identifier = id;
        Ok(key)
    }

    /// The v1 descriptor.
    pub(crate) fn descriptor(&self) -> [u8; DESCRIPTOR_SIZE] {
        self.descriptor
    }

    /// The v2 identifier.
    pub(crate) fn identifier(&self) -> [u8; IDENTIFIER_SIZE] {
        self.identifier
    }

    /// HKDF-SHA512 expand of this key with fscrypt's info prefix.
    pub(crate) fn hkdf(&self, context: u8, info: &[u8], out: &mut [u8]) {
        let hk = hkdf::Hkdf::<Sha512>::new(None, &self.raw);
        let prefix = [b'f', b's', b'c', b'r', b'y', b'p', b't', 0, context];
        hk.expand_multi_info(&[&prefix, info], out)
            .expect("fscrypt keys are far below 255 * 64 bytes");
    }

    fn siphash_key(&self, context: u8, info: &[u8]) -> Zeroizing<[u8; 16]> {
        let mut k = Zeroizing::new([0u8; 16]);
        self.hkdf(context, info, &mut k[..]);
        k
    }

    fn check_size(&self, policy: &Policy, mode: Mode) -> Result<()> {
        let min = match policy.version {
            PolicyVersion::V1 => mode.key_size(),
            PolicyVersion::V2 => mode.security_strength(),
        };
        if self.raw.len() < min {
            return Err(CryptoError::BadKeySize(self.raw.len()));
        }
        Ok(())
    }
}

/// The master keys known to a mounted filesystem.
#[derive(Default)]
pub(crate) struct Keyring {
    by_identifier: HashMap<[u8; IDENTIFIER_SIZE], MasterKey>,
    by_descriptor: HashMap<[u8; DESCRIPTOR_SIZE], [u8; IDENTIFIER_SIZE]>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_identifier.values()).finish()
    }
}

impl Keyring {
    /// An empty keyring.
    pub(crate) fn new() -> Keyring {
        Keyring::default()
    }

    /// Adds a raw key (the bytes of a key file): returns its v1 descriptor (first 8 bytes
    /// of SHA-512(SHA-512(key))) and its v2 identifier.
    pub(crate) fn add_key(
        &mut self,
        raw: &[u8],
    ) -> Result<([u8; DESCRIPTOR_SIZE], [u8; IDENTIFIER_SIZE])> {
        self.insert(MasterKey::new(raw)?)
    }

    /// Adds a raw key with a v1 descriptor of the caller's choice.
    pub(crate) fn add_key_with_descriptor(
        &mut self,
        raw: &[u8],
        descriptor: [u8; DESCRIPTOR_SIZE],
    ) -> Result<([u8; DESCRIPTOR_SIZE], [u8; IDENTIFIER_SIZE])> {
        self.insert(MasterKey::with_descriptor(raw, descriptor)?)
    }

    fn insert(&mut self, key: MasterKey) -> Result<([u8; DESCRIPTOR_SIZE], [u8; IDENTIFIER_SIZE])> {
        let (d, id) = (key.descriptor, key.identifier);
        self.by_descriptor.insert(d, id);
        self.by_identifier.insert(id, key);
        Ok((d, id))
    }

    /// Removes a key by its v2 identifier.
    pub(crate) fn remove(&mut self, identifier: &[u8; IDENTIFIER_SIZE]) -> bool {
        self.by_descriptor.retain(|_, id| id != identifier);
        self.by_identifier.remove(identifier).is_some()
    }

    /// Whether the key a key specifier names is here: 8 bytes are a v1 descriptor, 16 a v2
    /// identifier.
    pub(crate) fn has_spec(&self, spec: &[u8]) -> bool {
        match spec.len() {
            DESCRIPTOR_SIZE => self.by_descriptor.contains_key(spec),
            IDENTIFIER_SIZE => self.by_identifier.contains_key(spec),
            _ => false,
        }
    }

    /// The master key of a policy.
    pub(crate) fn lookup(&self, policy: &Policy) -> Option<&MasterKey> {
        match policy.key {
            KeySpec::Identifier(id) => self.by_identifier.get(&id),
            KeySpec::Descriptor(d) => self
                .by_descriptor
                .get(&d)
                .and_then(|id| self.by_identifier.get(id)),
        }
    }

    /// Derives the key of one inode (see [`InodeKey::derive`]); `NoKey` without its master key.
    pub(crate) fn inode_key(
        &self,
        ctx: &Context,
        kind: InodeKind,
        ino: u32,
        fs_uuid: &[u8; 16],
    ) -> Result<InodeKey> {
        let mk = self
            .lookup(&ctx.policy)
            .ok_or_else(|| CryptoError::NoKey(ctx.policy.key.to_string()))?;
        InodeKey::derive(mk, ctx, kind, ino, fs_uuid)
    }
}

/// The kind of an encrypted inode: it selects the mode (contents or filenames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InodeKind {
    /// Contents mode.
    Regular,
    /// Filenames mode (its entries' names).
    Directory,
    /// Filenames mode (its target).
    Symlink,
}

/// One inode's key, derived once and kept by the caller while the inode is cached.
pub(crate) struct InodeKey {
    pub(crate) kind: InodeKind,
    pub(crate) mode: Mode,
    pub(crate) policy: Policy,
    pub(crate) cipher: ModeCipher,
    pub(crate) nonce: [u8; NONCE_SIZE],
    pub(crate) ino: u32,
    /// IV_INO_LBLK_32: (u32)SipHash-2-4(inode hash key, le64(ino)).
    pub(crate) hashed_ino: u32,
    /// v2 directories: the SipHash key of casefolded dirhashes.
    pub(crate) dirhash_key: Option<Zeroizing<[u8; 16]>>,
}

impl std::fmt::Debug for InodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeKey")
            .field("kind", &self.kind)
            .field("mode", &self.mode)
            .field("ino", &self.ino)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl Drop for InodeKey {
    fn drop(&mut self) {
        self.hashed_ino.zeroize();
    }
}

impl InodeKey {
    /// Derives the key of inode `ino` (of `kind`) with context `ctx` from master key `mk`,
    /// as fs/crypto/keysetup.c does; `fs_uuid` is the superblock's s_uuid (IV_INO_LBLK_*).
    pub(crate) fn derive(
        mk: &MasterKey,
        ctx: &Context,
        kind: InodeKind,
        ino: u32,
        fs_uuid: &[u8; 16],
    ) -> Result<InodeKey> {
        let policy = ctx.policy;
        let mode = policy.mode_for(kind);
        mk.check_size(&policy, mode)?;
        let ks = mode.key_size();
        let mut key = Zeroizing::new(vec![0u8; ks]);
        let mut hashed_ino = 0;
        let mut dirhash_key = None;
        match policy.version {
            PolicyVersion::V1 => {
                if policy.flags & FLAG_DIRECT_KEY != 0 {
                    key.copy_from_slice(&mk.raw[..ks]);
                } else {
                    // AES-128-ECB of the master key, keyed by the nonce.
                    let aes = aes::Aes128::new(&ctx.nonce.into());
                    key.copy_from_slice(&mk.raw[..ks]);
                    for block in key.chunks_mut(16) {
                        let b: &mut [u8; 16] =
                            block.try_into().expect("key sizes are multiples of 16");
                        aes.encrypt_block(b.into());
                    }
                }
            }
            PolicyVersion::V2 => {
                let mut info = Vec::with_capacity(17);
                info.push(mode.num());
                if policy.flags & FLAG_DIRECT_KEY != 0 {
                    mk.hkdf(HKDF_CONTEXT_DIRECT_KEY, &info, &mut key);
                } else if policy.flags & FLAG_IV_INO_LBLK_64 != 0 {
                    info.extend_from_slice(fs_uuid);
                    mk.hkdf(HKDF_CONTEXT_IV_INO_LBLK_64_KEY, &info, &mut key);
                } else if policy.flags & FLAG_IV_INO_LBLK_32 != 0 {
                    info.extend_from_slice(fs_uuid);
                    mk.hkdf(HKDF_CONTEXT_IV_INO_LBLK_32_KEY, &info, &mut key);
                    let hk = mk.siphash_key(HKDF_CONTEXT_INODE_HASH_KEY, &[]);
                    hashed_ino = siphasher::sip::SipHasher24::new_with_key(&hk)
                        .hash(&(ino as u64).to_le_bytes()) as u32;
                } else {
                    mk.hkdf(HKDF_CONTEXT_PER_FILE_ENC_KEY, &ctx.nonce, &mut key);
                }
                if kind == InodeKind::Directory {
                    dirhash_key = Some(mk.siphash_key(HKDF_CONTEXT_DIRHASH_KEY, &ctx.nonce));
                }
            }
        }
        let cipher = ModeCipher::new(mode, &key)?;
        Ok(InodeKey {
            kind,
            mode,
            policy,
            cipher,
            nonce: ctx.nonce,
            ino,
            hashed_ino,
            dirhash_key,
        })
    }

    /// The IV of data unit `index` (fscrypt_generate_iv): le64 index, then for DIRECT_KEY
    /// the nonce; IV_INO_LBLK_64 puts the inode number in the index's high 32 bits,
    /// IV_INO_LBLK_32 adds the hashed inode number (mod 2^32).
    pub(crate) fn iv(&self, index: u64) -> [u8; 32] {
        let mut iv = [0u8; 32];
        let flags = self.policy.flags;
        let mut index = index;
        if flags & FLAG_IV_INO_LBLK_64 != 0 {
            index |= (self.ino as u64) << 32;
        } else if flags & FLAG_IV_INO_LBLK_32 != 0 {
            index = self.hashed_ino.wrapping_add(index as u32) as u64;
        } else if flags & FLAG_DIRECT_KEY != 0 {
            iv[8..24].copy_from_slice(&self.nonce);
        }
        iv[..8].copy_from_slice(&index.to_le_bytes());
        iv
    }
}

/// A raw fscrypt master key (the bytes of a key file, 16 to 64), as given at mount. Its
/// `Debug` shows only its length; the bytes are zeroed when it is dropped.
#[derive(Clone)]
pub struct EncryptionKey(zeroize::Zeroizing<Vec<u8>>);

impl EncryptionKey {
    /// A key from the raw bytes of a key file.
    pub fn new(raw: Vec<u8>) -> EncryptionKey {
        EncryptionKey(zeroize::Zeroizing::new(raw))
    }

    /// The raw bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKey(<{} bytes redacted>)", self.0.len())
    }
}

impl Keyring {
    /// The master keys of a mount as a keyring; the first key of a bad size is named by its
    /// place (1-based) with the error.
    pub(crate) fn of(keys: &[EncryptionKey]) -> std::result::Result<Keyring, (usize, CryptoError)> {
        let mut ring = Keyring::new();
        for (i, k) in keys.iter().enumerate() {
            ring.add_key(&k.0).map_err(|e| (i + 1, e))?;
        }
        Ok(ring)
    }
}
