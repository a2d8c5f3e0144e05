//! The dirhash of encrypted and casefolded directories (ext4 DX_HASH_SIPHASH, fs/ext4/hash.c,
//! with fscrypt_fname_siphash of fs/crypto/fname.c): SipHash-2-4 keyed with the directory's
//! DIRHASH key (HKDF context 5, info = the directory's nonce; the 16 bytes read as two
//! little-endian u64) over the user's name after casefolding, not over the ciphertext.

use super::keys::InodeKey;
use super::{CryptoError, Result};

/// EXT4_HTREE_EOF_32BIT.
const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;

impl InodeKey {
    /// fscrypt_fname_siphash: SipHash-2-4 of `name` with this directory's dirhash key.
    pub(crate) fn fname_siphash(&self, name: &[u8]) -> Result<u64> {
        let key = self.dirhash_key.as_ref().ok_or(CryptoError::WrongKind(
            "dirhash keys exist for v2 directories only",
        ))?;
        Ok(siphasher::sip::SipHasher24::new_with_key(key).hash(name))
    }

    /// ext4's (hash, minor_hash) of an entry of an encrypted casefolded directory:
    /// `casefolded_name` is the plaintext name after the directory's casefolding. The hash
    /// is the SipHash's high half with its low bit cleared (and the EOF value moved down),
    /// the minor hash its low half.
    pub(crate) fn ext4_dirhash(&self, casefolded_name: &[u8]) -> Result<(u32, u32)> {
        let h = self.fname_siphash(casefolded_name)?;
        let mut hash = (h >> 32) as u32 & !1;
        let minor = h as u32;
        if hash == HTREE_EOF_32BIT << 1 {
            hash = (HTREE_EOF_32BIT - 1) << 1;
        }
        Ok((hash, minor))
    }
}
