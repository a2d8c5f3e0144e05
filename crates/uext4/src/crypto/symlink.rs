//! Encrypted symlink targets (fs/crypto/hooks.c): the on-disk target is
//! `struct fscrypt_symlink_data { __le16 len; u8 encrypted_path[len]; }` followed by a NUL
//! that is counted in the kernel's disk_link.len but not in i_size. The target is
//! encrypted like a filename with the symlink inode's own key, padded per the policy, with
//! at most `max_len - 3` ciphertext bytes (`max_len`: ext4's block size).

use super::fname::fname_encrypted_size;
use super::keys::{InodeKey, InodeKind};
use super::{CryptoError, Result};

impl InodeKey {
    /// The on-disk target for `target`: 2-byte length, ciphertext, NUL. The inode's
    /// i_size is this length minus 1; ext4 keeps it in i_block (fast symlink) when the
    /// whole (with the NUL) fits in 60 bytes, else in a block. `max_len` is ext4's
    /// block size.
    pub(crate) fn encrypt_symlink(&self, target: &[u8], max_len: usize) -> Result<Vec<u8>> {
        if self.kind != InodeKind::Symlink {
            return Err(CryptoError::WrongKind(
                "symlink targets need the symlink's key",
            ));
        }
        if target.is_empty() || max_len < 3 {
            return Err(CryptoError::NameTooLong);
        }
        let ct_len = fname_encrypted_size(&self.policy, target.len(), max_len - 3)
            .ok_or(CryptoError::NameTooLong)?;
        let ct = self.encrypt_name_to(target, ct_len)?;
        let mut out = Vec::with_capacity(ct_len + 3);
        out.extend_from_slice(&(ct_len as u16).to_le_bytes());
        out.extend_from_slice(&ct);
        out.push(0);
        Ok(out)
    }

    /// The target of an on-disk encrypted symlink (`disk`: its i_size bytes, or more).
    pub(crate) fn decrypt_symlink(&self, disk: &[u8]) -> Result<Vec<u8>> {
        if self.kind != InodeKind::Symlink {
            return Err(CryptoError::WrongKind(
                "symlink targets need the symlink's key",
            ));
        }
        if disk.len() < 3 {
            return Err(CryptoError::Corrupt("encrypted symlink too short"));
        }
        let len = u16::from_le_bytes([disk[0], disk[1]]) as usize;
        if len == 0 || len + 2 > disk.len() {
            return Err(CryptoError::Corrupt("encrypted symlink length"));
        }
        let target = self.decrypt_name(&disk[2..2 + len])?;
        if target.is_empty() {
            return Err(CryptoError::Corrupt(
                "encrypted symlink decrypts to nothing",
            ));
        }
        Ok(target)
    }
}

/// The ciphertext of an on-disk encrypted symlink (for its no-key form: the kernel shows
/// `nokey_name(ciphertext, None)` as the target without the key).
pub(crate) fn symlink_ciphertext(disk: &[u8]) -> Result<&[u8]> {
    if disk.len() < 3 {
        return Err(CryptoError::Corrupt("encrypted symlink too short"));
    }
    let len = u16::from_le_bytes([disk[0], disk[1]]) as usize;
    if len == 0 || len + 2 > disk.len() {
        return Err(CryptoError::Corrupt("encrypted symlink length"));
    }
    Ok(&disk[2..2 + len])
}
