//! fscrypt: per-file encryption as the kernel's fs/crypto does it, for ext4's `encrypt` feature.
//!
//! The ciphers and formats; the engine's side (which inodes, when) is encrypt.rs. One concern
//! per file, as in fs/crypto:
//! - [`policy`]: the `c` xattr (index 9, name "c"): `fscrypt_context` v1 and v2, its modes
//!   and flags, validation, and new contexts for new inodes (fresh random nonce);
//! - [`keys`]: master keys from raw key files ([`Keyring`]), the v1 descriptor and v2
//!   identifier, and each inode's derived key ([`InodeKey`]);
//! - [`fname`]: filename encryption (with the policy's padding) and no-key names;
//! - [`contents`]: file contents, one data unit (= filesystem block) at a time, with the
//!   IV of the policy's flags (default, DIRECT_KEY, IV_INO_LBLK_64, IV_INO_LBLK_32);
//! - [`symlink`]: encrypted symlink targets (`fscrypt_symlink_data`);
//! - [`hash`]: the SipHash dirhash of encrypted+casefolded directories;
//! - [`cipher`]: the ciphers of each mode, from maintained crates ([`hctr2`] composes
//!   HCTR2 from the `aes` and `polyval` crates, as no stable-Rust crate provides it).
//!
//! Secrets (master keys, derived keys, SipHash keys) never appear in errors, logs or
//! `Debug` output, and are zeroed when dropped.
//!
//! What the engine relies on:
//! - a new inode under an encrypted directory gets `dir_ctx.policy.new_context()` as its
//!   `c` xattr (index 9, in the inode) and EXT4_ENCRYPT_FL; its key is
//!   `keyring.inode_key(&ctx, kind, ino, &s_uuid)`, so the inode number must be known
//!   first (IV_INO_LBLK_* and LBLK_64 filenames put it in the IVs);
//! - v1 keys are matched by descriptor: [`Keyring::add_key`] gives the one the fscrypt and
//!   e4crypt tools use (SHA-512(SHA-512(key))[..8]); others need
//!   [`Keyring::add_key_with_descriptor`];
//! - the data unit is the block: encrypt a whole block before writing it, including the
//!   partial last block of a file (holes stay holes and read as zeros, unencrypted);
//! - encrypted inodes are never inline (the kernel converts or refuses it; checked on
//!   an `inline_data` image made by the kernel);
//! - ext4 puts a dirhash in no-key names wherever its readdir goes through the hash tree
//!   code (dir_index and the directory indexed, or one block long, or inline): the
//!   filesystem's hash of the ciphertext name, or in encrypted casefolded directories
//!   the hash stored after the name (SipHash of the casefolded plaintext,
//!   [`InodeKey::ext4_dirhash`]); zeros only for linear multi-block directories.

pub(crate) mod cipher;
pub(crate) mod contents;
pub(crate) mod fname;
pub(crate) mod hash;
pub(crate) mod hctr2;
pub(crate) mod keys;
pub(crate) mod policy;
pub(crate) mod symlink;

#[cfg(test)]
mod tests;

#[allow(unused_imports)] // the API the engine will use
pub(crate) use fname::{fname_encrypted_size, nokey_name, nokey_name_decode, NokeyName};
#[allow(unused_imports)]
pub use keys::EncryptionKey;
pub(crate) use keys::{InodeKey, InodeKind, Keyring};
pub use policy::EncryptionPolicy;
pub(crate) use policy::NONCE_SIZE;
#[allow(unused_imports)]
pub(crate) use policy::{Context, Mode, Policy, PolicyVersion};

/// The xattr index (EXT4_XATTR_INDEX_ENCRYPTION) and name of an inode's encryption context.
pub(crate) const XATTR_INDEX_ENCRYPTION: u8 = 9;
/// The xattr name of the context within [`XATTR_INDEX_ENCRYPTION`].
pub(crate) const XATTR_NAME_CONTEXT: &[u8] = b"c";

/// A failure of the fscrypt layer. No variant carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CryptoError {
    /// The `c` xattr is not a valid fscrypt_context (size, version).
    #[error("invalid encryption context: {0}")]
    InvalidContext(&'static str),
    /// The policy is well-formed but not supported (modes, flags, filesystem features).
    #[error("unsupported encryption policy: {0}")]
    Unsupported(String),
    /// No master key for this policy is in the keyring.
    #[error("required key not available (key {0})")]
    NoKey(String),
    /// A master key of the wrong size (for the keyring, or for the policy's mode).
    #[error("bad master key size: {0} bytes")]
    BadKeySize(usize),
    /// The operation does not apply to this inode's key (contents on a directory, ...).
    #[error("wrong inode kind for this operation: {0}")]
    WrongKind(&'static str),
    /// A name (or symlink target) is too long to encrypt within its limit.
    #[error("name too long")]
    NameTooLong,
    /// A ciphertext name, data unit or symlink target has an impossible length or layout.
    #[error("corrupt encrypted data: {0}")]
    Corrupt(&'static str),
    /// A string that is no no-key name (bad base64url or length).
    #[error("not a no-key name")]
    BadNokeyName,
    /// The system's random number generator failed.
    #[error("random number generator failed")]
    Random,
}

impl CryptoError {
    /// The errno the kernel returns for this failure.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            CryptoError::InvalidContext(_) | CryptoError::Unsupported(_) => libc::EINVAL,
            CryptoError::NoKey(_) | CryptoError::BadKeySize(_) => libc::ENOKEY,
            CryptoError::WrongKind(_) => libc::EINVAL,
            CryptoError::NameTooLong => libc::ENAMETOOLONG,
            CryptoError::Corrupt(_) => libc::EUCLEAN,
            CryptoError::BadNokeyName => libc::ENOENT,
            CryptoError::Random => libc::EIO,
        }
    }
}

/// Result of this module.
pub(crate) type Result<T> = std::result::Result<T, CryptoError>;

/// Lower-case hex of public bytes (descriptors, identifiers), for messages.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
