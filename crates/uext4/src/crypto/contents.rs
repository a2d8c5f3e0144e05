//! File contents (fs/crypto/crypto.c): each data unit is encrypted on its own with the IV
//! of its index. The data unit is the filesystem block unless a v2 policy sets
//! log2_data_unit_size (smaller units: index = lblk << (blkbits - du_bits) + i).

use super::keys::{InodeKey, InodeKind};
use super::{CryptoError, Result};

impl InodeKey {
    fn data_units(&self, block_len: usize) -> Result<(usize, u32)> {
        if self.kind != InodeKind::Regular {
            return Err(CryptoError::WrongKind("contents need a regular file's key"));
        }
        if !block_len.is_power_of_two() || block_len < 512 {
            return Err(CryptoError::Corrupt(
                "block size not a power of two of at least 512",
            ));
        }
        let blkbits = block_len.trailing_zeros() as u8;
        let du_bits = self.policy.data_unit_bits(blkbits);
        if du_bits > blkbits {
            return Err(CryptoError::Corrupt("data unit larger than the block"));
        }
        Ok((1 << du_bits, (blkbits - du_bits) as u32))
    }

    /// Encrypts one filesystem block (`block.len()` = block size) of logical block `lblk`
    /// in place.
    pub(crate) fn encrypt_block(&self, lblk: u64, block: &mut [u8]) -> Result<()> {
        let (du, shift) = self.data_units(block.len())?;
        for (i, unit) in block.chunks_mut(du).enumerate() {
            self.cipher
                .encrypt(unit, &self.iv((lblk << shift) + i as u64))?;
        }
        Ok(())
    }

    /// Decrypts one filesystem block of logical block `lblk` in place.
    pub(crate) fn decrypt_block(&self, lblk: u64, block: &mut [u8]) -> Result<()> {
        let (du, shift) = self.data_units(block.len())?;
        for (i, unit) in block.chunks_mut(du).enumerate() {
            self.cipher
                .decrypt(unit, &self.iv((lblk << shift) + i as u64))?;
        }
        Ok(())
    }
}
