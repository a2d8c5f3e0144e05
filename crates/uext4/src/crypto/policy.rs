//! Encryption policies and the on-disk `fscrypt_context` (the inode's `c` xattr).
//!
//! v1 context (28 bytes): version=1, contents mode, filenames mode, flags,
//! master_key_descriptor\[8\], nonce\[16\].
//! v2 context (40 bytes): version=2, contents mode, filenames mode, flags,
//! log2_data_unit_size, reserved\[3\] (zero), master_key_identifier\[16\], nonce\[16\].

use super::{hex, CryptoError, Result};

/// Size of the per-file nonce.
pub(crate) const NONCE_SIZE: usize = 16;
/// Size of a v1 master key descriptor.
pub(crate) const DESCRIPTOR_SIZE: usize = 8;
/// Size of a v2 master key identifier.
pub(crate) const IDENTIFIER_SIZE: usize = 16;
/// Size of a v1 context.
pub(crate) const CONTEXT_V1_SIZE: usize = 28;
/// Size of a v2 context.
pub(crate) const CONTEXT_V2_SIZE: usize = 40;

/// Filename padding: 4 << (flags & PAD_MASK) bytes.
pub(crate) const FLAGS_PAD_MASK: u8 = 0x03;
/// Padding flag values.
pub(crate) const FLAGS_PAD_4: u8 = 0x00;
#[allow(missing_docs)]
pub(crate) const FLAGS_PAD_8: u8 = 0x01;
#[allow(missing_docs)]
pub(crate) const FLAGS_PAD_16: u8 = 0x02;
#[allow(missing_docs)]
pub(crate) const FLAGS_PAD_32: u8 = 0x03;
/// The per-file nonce goes into the IV; no per-file key is derived.
pub(crate) const FLAG_DIRECT_KEY: u8 = 0x04;
/// IV = inode number << 32 | logical block; key per (mode, filesystem UUID).
pub(crate) const FLAG_IV_INO_LBLK_64: u8 = 0x08;
/// IV = (u32)(SipHash(inode number) + logical block); key per (mode, filesystem UUID).
pub(crate) const FLAG_IV_INO_LBLK_32: u8 = 0x10;

/// An encryption mode (include/uapi/linux/fscrypt.h FSCRYPT_MODE_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// 1: contents.
    Aes256Xts,
    /// 4: filenames.
    Aes256Cts,
    /// 5: contents (AES-128-CBC with ESSIV over SHA-256).
    Aes128Cbc,
    /// 6: filenames.
    Aes128Cts,
    /// 7: contents (parsed; no cipher here).
    Sm4Xts,
    /// 8: filenames (parsed; no cipher here).
    Sm4Cts,
    /// 9: contents and filenames (XChaCha12 + AES-256).
    Adiantum,
    /// 10: filenames.
    Aes256Hctr2,
}

impl Mode {
    /// The mode of an on-disk mode number.
    pub(crate) fn from_num(n: u8) -> Option<Mode> {
        Some(match n {
            1 => Mode::Aes256Xts,
            4 => Mode::Aes256Cts,
            5 => Mode::Aes128Cbc,
            6 => Mode::Aes128Cts,
            7 => Mode::Sm4Xts,
            8 => Mode::Sm4Cts,
            9 => Mode::Adiantum,
            10 => Mode::Aes256Hctr2,
            _ => return None,
        })
    }

    /// The on-disk mode number (also the `mode_num` of per-mode key derivation).
    pub(crate) fn num(self) -> u8 {
        match self {
            Mode::Aes256Xts => 1,
            Mode::Aes256Cts => 4,
            Mode::Aes128Cbc => 5,
            Mode::Aes128Cts => 6,
            Mode::Sm4Xts => 7,
            Mode::Sm4Cts => 8,
            Mode::Adiantum => 9,
            Mode::Aes256Hctr2 => 10,
        }
    }

    /// Size of the derived (per-file or per-mode) key.
    pub(crate) fn key_size(self) -> usize {
        match self {
            Mode::Aes256Xts => 64,
            Mode::Aes256Cts | Mode::Adiantum | Mode::Aes256Hctr2 | Mode::Sm4Xts => 32,
            Mode::Aes128Cbc | Mode::Aes128Cts | Mode::Sm4Cts => 16,
        }
    }

    /// Minimum size of a v2 master key for this mode (the kernel's security_strength).
    pub(crate) fn security_strength(self) -> usize {
        match self {
            Mode::Aes256Xts | Mode::Aes256Cts | Mode::Adiantum | Mode::Aes256Hctr2 => 32,
            Mode::Aes128Cbc | Mode::Aes128Cts | Mode::Sm4Xts | Mode::Sm4Cts => 16,
        }
    }

    /// IV size of the mode.
    pub(crate) fn iv_size(self) -> usize {
        match self {
            Mode::Adiantum | Mode::Aes256Hctr2 => 32,
            _ => 16,
        }
    }

    /// The kernel's name of the mode.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Aes256Xts => "AES-256-XTS",
            Mode::Aes256Cts => "AES-256-CTS-CBC",
            Mode::Aes128Cbc => "AES-128-CBC-ESSIV",
            Mode::Aes128Cts => "AES-128-CTS-CBC",
            Mode::Sm4Xts => "SM4-XTS",
            Mode::Sm4Cts => "SM4-CTS-CBC",
            Mode::Adiantum => "Adiantum",
            Mode::Aes256Hctr2 => "AES-256-HCTR2",
        }
    }
}

/// Policy version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyVersion {
    /// Deprecated: keys by 8-byte descriptor, AES-128-ECB key derivation.
    V1,
    /// Keys by 16-byte HKDF identifier, HKDF-SHA512 key derivation.
    V2,
}

/// Which master key a policy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KeySpec {
    /// v1: a descriptor chosen by whoever added the key.
    Descriptor([u8; DESCRIPTOR_SIZE]),
    /// v2: HKDF-SHA512(key, "fscrypt\0" 0x01), 16 bytes.
    Identifier([u8; IDENTIFIER_SIZE]),
}

impl std::fmt::Display for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySpec::Descriptor(d) => write!(f, "descriptor {}", hex(d)),
            KeySpec::Identifier(i) => write!(f, "identifier {}", hex(i)),
        }
    }
}

/// An encryption policy: what a directory passes on to the inodes made in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// v1 or v2.
    pub version: PolicyVersion,
    /// Mode of regular files' contents.
    pub contents_mode: Mode,
    /// Mode of filenames (directories) and symlink targets.
    pub filenames_mode: Mode,
    /// FSCRYPT_POLICY_FLAG_* (padding, DIRECT_KEY, IV_INO_LBLK_64/32).
    pub flags: u8,
    /// v2 only: log2 of the data unit size; 0 means the filesystem block size.
    pub log2_data_unit_size: u8,
    /// The master key.
    pub key: KeySpec,
}

/// What the filesystem offers that some policies need (the kernel's per-sb checks).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FsCaps {
    /// log2 of the block size.
    pub blkbits: u8,
    /// ext4: the `stable_inodes` compat feature (needed by IV_INO_LBLK_*).
    pub stable_inodes: bool,
    /// The directory the policy is set on (or inherited under) is casefolded.
    pub casefolded: bool,
}

impl Policy {
    /// Filename padding in bytes: 4, 8, 16 or 32.
    pub(crate) fn padding(&self) -> usize {
        4 << (self.flags & FLAGS_PAD_MASK)
    }

    /// The mode an inode of this kind uses: contents for regular files, filenames for
    /// directories and symlinks (the kernel's select_encryption_mode).
    pub(crate) fn mode_for(&self, kind: super::InodeKind) -> Mode {
        match kind {
            super::InodeKind::Regular => self.contents_mode,
            super::InodeKind::Directory | super::InodeKind::Symlink => self.filenames_mode,
        }
    }

    /// The data unit size for a filesystem of block size 1 << `blkbits`.
    pub(crate) fn data_unit_bits(&self, blkbits: u8) -> u8 {
        if self.log2_data_unit_size == 0 {
            blkbits
        } else {
            self.log2_data_unit_size
        }
    }

    /// Checks the policy as fs/crypto/policy.c's fscrypt_supported_policy does: mode
    /// pairs, flags, DIRECT_KEY and IV_INO_LBLK_* restrictions, data unit size.
    pub(crate) fn validate(&self, caps: &FsCaps) -> Result<()> {
        use Mode::*;
        let pair = (self.contents_mode, self.filenames_mode);
        let v1_pair = matches!(
            pair,
            (Aes256Xts, Aes256Cts) | (Aes128Cbc, Aes128Cts) | (Adiantum, Adiantum)
        );
        let v2_pair = v1_pair || matches!(pair, (Aes256Xts, Aes256Hctr2) | (Sm4Xts, Sm4Cts));
        let unsupported = |why: String| Err(CryptoError::Unsupported(why));
        match self.version {
            PolicyVersion::V1 => {
                if !v1_pair {
                    return unsupported(format!(
                        "modes {}/{} in a v1 policy",
                        self.contents_mode.name(),
                        self.filenames_mode.name()
                    ));
                }
                if self.flags & !(FLAGS_PAD_MASK | FLAG_DIRECT_KEY) != 0 {
                    return unsupported(format!("flags {:#04x} in a v1 policy", self.flags));
                }
                if caps.casefolded {
                    return unsupported("v1 policy on a casefolded directory".into());
                }
            }
            PolicyVersion::V2 => {
                if !v2_pair {
                    return unsupported(format!(
                        "modes {}/{}",
                        self.contents_mode.name(),
                        self.filenames_mode.name()
                    ));
                }
                if self.flags
                    & !(FLAGS_PAD_MASK
                        | FLAG_DIRECT_KEY
                        | FLAG_IV_INO_LBLK_64
                        | FLAG_IV_INO_LBLK_32)
                    != 0
                {
                    return unsupported(format!("flags {:#04x}", self.flags));
                }
                let exclusive = [FLAG_DIRECT_KEY, FLAG_IV_INO_LBLK_64, FLAG_IV_INO_LBLK_32]
                    .iter()
                    .filter(|f| self.flags & **f != 0)
                    .count();
                if exclusive > 1 {
                    return unsupported(format!("mutually exclusive flags {:#04x}", self.flags));
                }
                if self.log2_data_unit_size != 0 {
                    if self.log2_data_unit_size > caps.blkbits || self.log2_data_unit_size < 9 {
                        return unsupported(format!(
                            "log2_data_unit_size {}",
                            self.log2_data_unit_size
                        ));
                    }
                    if self.log2_data_unit_size != caps.blkbits
                        && self.flags & FLAG_IV_INO_LBLK_32 != 0
                    {
                        return unsupported("sub-block data units with IV_INO_LBLK_32".into());
                    }
                }
                if self.flags & (FLAG_IV_INO_LBLK_64 | FLAG_IV_INO_LBLK_32) != 0 {
                    if self.contents_mode != Aes256Xts {
                        return unsupported(
                            "IV_INO_LBLK_* with contents mode other than AES-256-XTS".into(),
                        );
                    }
                    if !caps.stable_inodes {
                        return unsupported("IV_INO_LBLK_* without stable_inodes".into());
                    }
                    // ext4: inode numbers are 32-bit; file data unit indices fit in 32 bits
                    // since the largest file has 2^32 blocks.
                    let du_bits = self.data_unit_bits(caps.blkbits);
                    if 32 + (caps.blkbits - du_bits) as u32 > 32 {
                        return unsupported(
                            "IV_INO_LBLK_* with data units smaller than a block".into(),
                        );
                    }
                }
            }
        }
        if self.flags & FLAG_DIRECT_KEY != 0 {
            if self.contents_mode != self.filenames_mode {
                return unsupported(
                    "DIRECT_KEY with different contents and filenames modes".into(),
                );
            }
            // The IV must hold the 8-byte index and the 16-byte nonce.
            if self.contents_mode.iv_size() < 24 {
                return unsupported(format!("DIRECT_KEY with {}", self.contents_mode.name()));
            }
        }
        Ok(())
    }

    /// A new context for a new inode under this policy, with a fresh random nonce.
    pub(crate) fn new_context(&self) -> Result<Context> {
        let mut nonce = [0u8; NONCE_SIZE];
        getrandom::fill(&mut nonce).map_err(|_| CryptoError::Random)?;
        Ok(Context {
            policy: *self,
            nonce,
        })
    }
}

/// An inode's encryption context: its policy and its nonce.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Context {
    /// The policy (inherited from the parent directory, or set by ioctl).
    pub policy: Policy,
    /// The per-file nonce (random at creation).
    pub nonce: [u8; NONCE_SIZE],
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The nonce is no secret, but it is printed only as hex, like the key spec.
        f.debug_struct("Context")
            .field("policy", &self.policy)
            .field("nonce", &hex(&self.nonce))
            .finish()
    }
}

impl Context {
    /// Parses the raw value of the `c` xattr (fscrypt_context_is_valid and
    /// fscrypt_policy_from_context). Modes must be known numbers; whether the policy is
    /// supported is [`Policy::validate`]'s question.
    pub(crate) fn parse(raw: &[u8]) -> Result<Context> {
        let Some(&version) = raw.first() else {
            return Err(CryptoError::InvalidContext("empty"));
        };
        let (policy_version, size) = match version {
            1 => (PolicyVersion::V1, CONTEXT_V1_SIZE),
            2 => (PolicyVersion::V2, CONTEXT_V2_SIZE),
            _ => return Err(CryptoError::InvalidContext("unknown version")),
        };
        if raw.len() != size {
            return Err(CryptoError::InvalidContext("wrong size for its version"));
        }
        let contents_mode =
            Mode::from_num(raw[1]).ok_or(CryptoError::InvalidContext("unknown contents mode"))?;
        let filenames_mode =
            Mode::from_num(raw[2]).ok_or(CryptoError::InvalidContext("unknown filenames mode"))?;
        let flags = raw[3];
        let mut nonce = [0u8; NONCE_SIZE];
        let (log2_data_unit_size, key) = match policy_version {
            PolicyVersion::V1 => {
                let mut d = [0u8; DESCRIPTOR_SIZE];
                d.copy_from_slice(&raw[4..12]);
                nonce.copy_from_slice(&raw[12..28]);
                (0, KeySpec::Descriptor(d))
            }
            PolicyVersion::V2 => {
                if raw[5..8] != [0, 0, 0] {
                    return Err(CryptoError::InvalidContext("reserved bytes set"));
                }
                let mut id = [0u8; IDENTIFIER_SIZE];
                id.copy_from_slice(&raw[8..24]);
                nonce.copy_from_slice(&raw[24..40]);
                (raw[4], KeySpec::Identifier(id))
            }
        };
        Ok(Context {
            policy: Policy {
                version: policy_version,
                contents_mode,
                filenames_mode,
                flags,
                log2_data_unit_size,
                key,
            },
            nonce,
        })
    }

    /// The raw value of the `c` xattr.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let p = &self.policy;
        let mut out = vec![0u8; 4];
        out[1] = p.contents_mode.num();
        out[2] = p.filenames_mode.num();
        out[3] = p.flags;
        // The key spec decides the layout: a Policy's version always agrees with it.
        match p.key {
            KeySpec::Descriptor(d) => {
                out[0] = 1;
                out.extend_from_slice(&d);
            }
            KeySpec::Identifier(id) => {
                out[0] = 2;
                out.extend_from_slice(&[p.log2_data_unit_size, 0, 0, 0]);
                out.extend_from_slice(&id);
            }
        }
        out.extend_from_slice(&self.nonce);
        out
    }
}

/// An fscrypt policy as userspace sees it: what FS_IOC_SET_ENCRYPTION_POLICY takes and
/// FS_IOC_GET_ENCRYPTION_POLICY_EX returns (`struct fscrypt_policy_v1` of 12 bytes, version
/// byte 0; `struct fscrypt_policy_v2` of 24 bytes, version byte 2). Its `Display` is one
/// line: version, modes, padding, flags and the key's public name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncryptionPolicy(pub(crate) Policy);

/// The uapi version byte of a v1 policy (FSCRYPT_POLICY_V1; its context says 1).
const UAPI_V1: u8 = 0;
/// The uapi version byte of a v2 policy.
const UAPI_V2: u8 = 2;

impl EncryptionPolicy {
    /// A v2 policy for `key` with the kernel's recommended modes (AES-256-XTS contents,
    /// AES-256-CTS-CBC names) and 32-byte name padding, as `fscryptctl set_policy` makes.
    pub fn v2(key: &super::EncryptionKey) -> std::result::Result<EncryptionPolicy, String> {
        let k = super::keys::MasterKey::new(key.bytes()).map_err(|e| e.to_string())?;
        Ok(EncryptionPolicy(Policy {
            version: PolicyVersion::V2,
            contents_mode: Mode::Aes256Xts,
            filenames_mode: Mode::Aes256Cts,
            flags: FLAGS_PAD_32,
            log2_data_unit_size: 0,
            key: KeySpec::Identifier(k.identifier()),
        }))
    }

    /// A v1 policy for `key` under the descriptor the fscrypt and e4crypt tools compute
    /// (the first 8 bytes of SHA-512(SHA-512(key))), with [`EncryptionPolicy::v2`]'s modes.
    pub fn v1(key: &super::EncryptionKey) -> std::result::Result<EncryptionPolicy, String> {
        let k = super::keys::MasterKey::new(key.bytes()).map_err(|e| e.to_string())?;
        let mut p = Self::v2(key)?;
        p.0.version = PolicyVersion::V1;
        p.0.key = KeySpec::Descriptor(k.descriptor());
        Ok(p)
    }

    /// Sets the contents and filenames modes by name: the kernel's (`AES-256-XTS`,
    /// `AES-256-CTS-CBC`, `AES-128-CBC-ESSIV`, `AES-128-CTS-CBC`, `Adiantum`,
    /// `AES-256-HCTR2`) or fscryptctl's short ones (`AES-256-CTS`, `AES-128-CBC`,
    /// `AES-128-CTS`), in any case.
    pub fn with_modes(
        mut self,
        contents: &str,
        filenames: &str,
    ) -> std::result::Result<EncryptionPolicy, String> {
        self.0.contents_mode = mode_by_name(contents)?;
        self.0.filenames_mode = mode_by_name(filenames)?;
        Ok(self)
    }

    /// Sets the filename padding: 4, 8, 16 or 32 bytes.
    pub fn with_padding(mut self, bytes: u32) -> std::result::Result<EncryptionPolicy, String> {
        let code = match bytes {
            4 => FLAGS_PAD_4,
            8 => FLAGS_PAD_8,
            16 => FLAGS_PAD_16,
            32 => FLAGS_PAD_32,
            _ => return Err(format!("padding {bytes} (4, 8, 16 or 32)")),
        };
        self.0.flags = self.0.flags & !FLAGS_PAD_MASK | code;
        Ok(self)
    }

    /// Adds a flag by fscryptctl's name: `direct-key`, `iv-ino-lblk-64` or `iv-ino-lblk-32`.
    pub fn with_flag(mut self, name: &str) -> std::result::Result<EncryptionPolicy, String> {
        self.0.flags |= match name.to_ascii_lowercase().replace('_', "-").as_str() {
            "direct-key" => FLAG_DIRECT_KEY,
            "iv-ino-lblk-64" => FLAG_IV_INO_LBLK_64,
            "iv-ino-lblk-32" => FLAG_IV_INO_LBLK_32,
            _ => {
                return Err(format!(
                    "flag {name} (direct-key, iv-ino-lblk-64 or iv-ino-lblk-32)"
                ))
            }
        };
        Ok(self)
    }

    /// Parses the ioctl's structure (v1: 12 bytes, v2: 24 bytes; extra bytes are an error,
    /// as the kernel copies exactly the size of the version's structure).
    pub fn from_bytes(b: &[u8]) -> std::result::Result<EncryptionPolicy, String> {
        let version = *b.first().ok_or("an empty encryption policy")?;
        let (want, v) = match version {
            UAPI_V1 => (12, PolicyVersion::V1),
            UAPI_V2 => (24, PolicyVersion::V2),
            n => return Err(format!("encryption policy version {n} (0 or 2)")),
        };
        if b.len() != want {
            return Err(format!(
                "an encryption policy of {} bytes ({want} for its version)",
                b.len()
            ));
        }
        let mode = |n: u8| Mode::from_num(n).ok_or_else(|| format!("encryption mode number {n}"));
        let (log2_data_unit_size, key) = match v {
            PolicyVersion::V1 => {
                let mut d = [0u8; DESCRIPTOR_SIZE];
                d.copy_from_slice(&b[4..12]);
                (0, KeySpec::Descriptor(d))
            }
            PolicyVersion::V2 => {
                if b[5..8] != [0, 0, 0] {
                    return Err("reserved bytes set in an encryption policy".into());
                }
                let mut id = [0u8; IDENTIFIER_SIZE];
                id.copy_from_slice(&b[8..24]);
                (b[4], KeySpec::Identifier(id))
            }
        };
        Ok(EncryptionPolicy(Policy {
            version: v,
            contents_mode: mode(b[1])?,
            filenames_mode: mode(b[2])?,
            flags: b[3],
            log2_data_unit_size,
            key,
        }))
    }

    /// The ioctl's structure.
    pub fn to_bytes(&self) -> Vec<u8> {
        let p = &self.0;
        let mut out = vec![0, p.contents_mode.num(), p.filenames_mode.num(), p.flags];
        match p.key {
            KeySpec::Descriptor(d) => {
                out[0] = UAPI_V1;
                out.extend_from_slice(&d);
            }
            KeySpec::Identifier(id) => {
                out[0] = UAPI_V2;
                out.extend_from_slice(&[p.log2_data_unit_size, 0, 0, 0]);
                out.extend_from_slice(&id);
            }
        }
        out
    }

    /// 1 or 2.
    pub fn version(&self) -> u8 {
        match self.0.version {
            PolicyVersion::V1 => 1,
            PolicyVersion::V2 => 2,
        }
    }
}

impl std::fmt::Display for EncryptionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.0;
        write!(
            f,
            "v{} {}/{}, padding {}",
            self.version(),
            p.contents_mode.name(),
            p.filenames_mode.name(),
            p.padding()
        )?;
        for (bit, name) in [
            (FLAG_DIRECT_KEY, "direct-key"),
            (FLAG_IV_INO_LBLK_64, "iv-ino-lblk-64"),
            (FLAG_IV_INO_LBLK_32, "iv-ino-lblk-32"),
        ] {
            if p.flags & bit != 0 {
                write!(f, ", {name}")?;
            }
        }
        if p.log2_data_unit_size != 0 {
            write!(f, ", data unit {}", 1u32 << p.log2_data_unit_size)?;
        }
        write!(f, ", key {}", p.key)
    }
}

/// A mode by the kernel's or fscryptctl's name.
fn mode_by_name(name: &str) -> std::result::Result<Mode, String> {
    let n = name.to_ascii_uppercase();
    Ok(match n.as_str() {
        "AES-256-XTS" => Mode::Aes256Xts,
        "AES-256-CTS" | "AES-256-CTS-CBC" => Mode::Aes256Cts,
        "AES-128-CBC" | "AES-128-CBC-ESSIV" => Mode::Aes128Cbc,
        "AES-128-CTS" | "AES-128-CTS-CBC" => Mode::Aes128Cts,
        "ADIANTUM" => Mode::Adiantum,
        "AES-256-HCTR2" => Mode::Aes256Hctr2,
        _ => {
            return Err(format!(
                "encryption mode {name} (AES-256-XTS, AES-256-CTS, AES-128-CBC, AES-128-CTS, \
                 Adiantum or AES-256-HCTR2)"
            ))
        }
    })
}
