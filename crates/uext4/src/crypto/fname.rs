//! Filename encryption and no-key names (fs/crypto/fname.c).
//!
//! A name is zero-padded to at least 16 bytes, then up to a multiple of the policy's
//! padding, capped at NAME_MAX (255), and encrypted in one message with the IV of data
//! unit 0 (all zero, except: DIRECT_KEY puts the nonce in it, IV_INO_LBLK_64 the
//! directory's inode number, IV_INO_LBLK_32 its hashed inode number).
//!
//! Without the key, a name is shown as its no-key name: base64url (RFC 4648, no '=')
//! of `struct fscrypt_nokey_name { u32 dirhash\[2\]; u8 bytes\[149\]; u8 sha256\[32\]; }`,
//! cut after the ciphertext when it fits in 149 bytes, else the first 149 bytes and the
//! SHA-256 of the rest (189 bytes, 252 characters).

use sha2::{Digest, Sha256};

use super::keys::{InodeKey, InodeKind};
use super::policy::Policy;
use super::{CryptoError, Result};

/// The longest name (NAME_MAX).
pub(crate) const NAME_MAX: usize = 255;
/// Names shorter than this are padded to it before encryption.
pub(crate) const MIN_MSG_LEN: usize = 16;
/// Ciphertext bytes kept whole in a no-key name.
pub(crate) const NOKEY_BYTES: usize = 149;
/// Decoded size of a digested no-key name: 8 + 149 + 32.
pub(crate) const NOKEY_NAME_MAX: usize = 8 + NOKEY_BYTES + 32;
/// Encoded size of a digested no-key name.
pub(crate) const NOKEY_NAME_MAX_ENCODED: usize = (NOKEY_NAME_MAX * 4).div_ceil(3);

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The encrypted length of a name of `len` bytes under `policy`, at most `max_len`
/// (__fscrypt_fname_encrypted_size); None if `len` exceeds `max_len`.
pub(crate) fn fname_encrypted_size(policy: &Policy, len: usize, max_len: usize) -> Option<usize> {
    if len > max_len {
        return None;
    }
    let padded = len.max(MIN_MSG_LEN).next_multiple_of(policy.padding());
    Some(padded.min(max_len))
}

impl InodeKey {
    fn names_only(&self) -> Result<()> {
        if self.kind == InodeKind::Regular {
            return Err(CryptoError::WrongKind(
                "names need a directory's or symlink's key",
            ));
        }
        Ok(())
    }

    /// Encrypts `name`, zero-padded to `out_len` bytes.
    pub(crate) fn encrypt_name_to(&self, name: &[u8], out_len: usize) -> Result<Vec<u8>> {
        self.names_only()?;
        if out_len < name.len() || out_len < MIN_MSG_LEN {
            return Err(CryptoError::NameTooLong);
        }
        let mut out = vec![0u8; out_len];
        out[..name.len()].copy_from_slice(name);
        self.cipher.encrypt(&mut out, &self.iv(0))?;
        Ok(out)
    }

    /// Encrypts a name of this directory (1 to 255 bytes): the on-disk name.
    pub(crate) fn encrypt_name(&self, name: &[u8]) -> Result<Vec<u8>> {
        if name.is_empty() {
            return Err(CryptoError::Corrupt("empty name"));
        }
        let len = fname_encrypted_size(&self.policy, name.len(), NAME_MAX)
            .ok_or(CryptoError::NameTooLong)?;
        self.encrypt_name_to(name, len)
    }

    /// Decrypts an on-disk name of this directory; the padding NULs are cut
    /// ("." and ".." are not encrypted: the caller passes them through).
    pub(crate) fn decrypt_name(&self, ciphertext: &[u8]) -> Result<Vec<u8>> {
        self.names_only()?;
        if ciphertext.len() < MIN_MSG_LEN {
            return Err(CryptoError::Corrupt("encrypted name under 16 bytes"));
        }
        let mut out = ciphertext.to_vec();
        self.cipher.decrypt(&mut out, &self.iv(0))?;
        let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
        out.truncate(end);
        Ok(out)
    }
}

fn base64url_encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity((src.len() * 4).div_ceil(3));
    let (mut ac, mut bits) = (0u32, 0u32);
    for &b in src {
        ac = (ac << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(BASE64URL[((ac >> bits) & 0x3f) as usize]);
        }
    }
    if bits > 0 {
        out.push(BASE64URL[((ac << (6 - bits)) & 0x3f) as usize]);
    }
    out
}

fn base64url_decode(src: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(src.len() * 3 / 4);
    let (mut ac, mut bits) = (0u32, 0u32);
    for &c in src {
        let v = BASE64URL.iter().position(|&x| x == c)? as u32;
        ac = (ac << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((ac >> bits) as u8);
        }
    }
    // Leftover bits must be zero (the kernel's check).
    if ac & ((1 << bits) - 1) != 0 {
        return None;
    }
    Some(out)
}

/// The no-key name of an on-disk (ciphertext) name, as the kernel lists it without the
/// key. `dirhash` is the entry's (hash, minor_hash) where the filesystem supplies one (ext4:
/// in indexed directories, and always in casefolded ones); None gives zeros, as ext4's
/// linear readdir does.
pub(crate) fn nokey_name(ciphertext: &[u8], dirhash: Option<(u32, u32)>) -> Vec<u8> {
    let (hash, minor) = dirhash.unwrap_or((0, 0));
    let mut raw = Vec::with_capacity(NOKEY_NAME_MAX);
    // The struct's u32 fields are in CPU order; little-endian on every platform ext4 and
    // this crate run on with fscrypt (the kernel's own no-key names are LE on x86/arm).
    raw.extend_from_slice(&hash.to_le_bytes());
    raw.extend_from_slice(&minor.to_le_bytes());
    if ciphertext.len() <= NOKEY_BYTES {
        raw.extend_from_slice(ciphertext);
    } else {
        raw.extend_from_slice(&ciphertext[..NOKEY_BYTES]);
        raw.extend_from_slice(&Sha256::digest(&ciphertext[NOKEY_BYTES..]));
    }
    base64url_encode(&raw)
}

/// A decoded no-key name (fscrypt_setup_filename without the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NokeyName {
    /// The whole ciphertext name (at most 149 bytes).
    Full {
        hash: u32,
        minor_hash: u32,
        ciphertext: Vec<u8>,
    },
    /// A longer name: its first 149 bytes and the SHA-256 of the rest.
    Digested {
        hash: u32,
        minor_hash: u32,
        prefix: Vec<u8>,
        sha256: [u8; 32],
    },
}

impl NokeyName {
    /// The dirhash carried by the name (zeros where none was given).
    pub(crate) fn dirhash(&self) -> (u32, u32) {
        match self {
            NokeyName::Full {
                hash, minor_hash, ..
            }
            | NokeyName::Digested {
                hash, minor_hash, ..
            } => (*hash, *minor_hash),
        }
    }

    /// Whether an on-disk name is the one this no-key name stands for (fscrypt_match_name).
    pub(crate) fn matches(&self, disk_name: &[u8]) -> bool {
        match self {
            NokeyName::Full { ciphertext, .. } => ciphertext == disk_name,
            NokeyName::Digested { prefix, sha256, .. } => {
                disk_name.len() > NOKEY_BYTES
                    && disk_name[..NOKEY_BYTES] == prefix[..]
                    && Sha256::digest(&disk_name[NOKEY_BYTES..]).as_slice() == sha256
            }
        }
    }
}

/// Decodes a no-key name given by a user (lookup without the key). ENOENT-like
/// [`CryptoError::BadNokeyName`] for anything that is none.
pub(crate) fn nokey_name_decode(name: &[u8]) -> Result<NokeyName> {
    if name.len() > NOKEY_NAME_MAX_ENCODED {
        return Err(CryptoError::BadNokeyName);
    }
    let raw = base64url_decode(name).ok_or(CryptoError::BadNokeyName)?;
    if raw.len() < 9 || (raw.len() > 8 + NOKEY_BYTES && raw.len() != NOKEY_NAME_MAX) {
        return Err(CryptoError::BadNokeyName);
    }
    let hash = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
    let minor_hash = u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes"));
    if raw.len() == NOKEY_NAME_MAX {
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(&raw[8 + NOKEY_BYTES..]);
        Ok(NokeyName::Digested {
            hash,
            minor_hash,
            prefix: raw[8..8 + NOKEY_BYTES].to_vec(),
            sha256,
        })
    } else {
        Ok(NokeyName::Full {
            hash,
            minor_hash,
            ciphertext: raw[8..].to_vec(),
        })
    }
}
