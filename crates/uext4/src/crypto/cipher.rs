//! The cipher of each mode, keyed with an inode's derived (or per-mode) key.
//!
//! Every primitive comes from a maintained crate: `aes`, `cbc`, `cts` (CBC-CS3, which is the
//! kernel's `cts(cbc(aes))`), `adiantum` with `chacha20`'s XChaCha12, `sha2` for ESSIV; HCTR2
//! is composed in [`super::hctr2`] from `aes` and `polyval`. XTS (IEEE 1619) is composed here
//! from `aes` too, whole blocks only (fscrypt's data units are multiples of 16 bytes): the
//! `xts-mode` crate calls AES one block at a time, which leaves the AES-NI/VAES lanes the
//! `aes` crate runs in parallel unused; batching the calls made encrypted files 2-3x faster
//! (BENCHMARKS.md). The `xts-mode` crate stays as the test oracle (crypto/tests.rs).

use aes::cipher::{BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, InnerIvInit, KeyInit};
use aes::{Aes128, Aes256};
use sha2::{Digest, Sha256};

use super::hctr2::Hctr2;
use super::policy::Mode;
use super::{CryptoError, Result};

type AdiantumCipher = adiantum::Cipher<chacha20::XChaCha12, Aes256>;

/// A keyed cipher of one mode.
pub(crate) enum ModeCipher {
    /// AES-256-XTS (contents): tweak = first 16 bytes of the IV; `data` keyed with the
    /// first half of the key, `tweak` with the second.
    Aes256Xts { data: Aes256, tweak: Aes256 },
    /// AES-128-CBC-ESSIV (contents): the IV is encrypted with AES-256 keyed by SHA-256(key).
    Aes128CbcEssiv { key: Aes128, essiv: Aes256 },
    /// AES-256-CTS-CBC (filenames).
    Aes256Cts(Aes256),
    /// AES-128-CTS-CBC (filenames).
    Aes128Cts(Aes128),
    /// Adiantum (contents and filenames): tweak = the 32-byte IV.
    Adiantum(Box<AdiantumCipher>),
    /// AES-256-HCTR2 (filenames): tweak = the 32-byte IV.
    Hctr2(Box<Hctr2>),
}

impl std::fmt::Debug for ModeCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key schedule.
        f.write_str(match self {
            ModeCipher::Aes256Xts { .. } => "ModeCipher(AES-256-XTS, <redacted>)",
            ModeCipher::Aes128CbcEssiv { .. } => "ModeCipher(AES-128-CBC-ESSIV, <redacted>)",
            ModeCipher::Aes256Cts(_) => "ModeCipher(AES-256-CTS, <redacted>)",
            ModeCipher::Aes128Cts(_) => "ModeCipher(AES-128-CTS, <redacted>)",
            ModeCipher::Adiantum(_) => "ModeCipher(Adiantum, <redacted>)",
            ModeCipher::Hctr2(_) => "ModeCipher(AES-256-HCTR2, <redacted>)",
        })
    }
}

impl ModeCipher {
    /// Keys `mode` with `key` (exactly `mode.key_size()` bytes).
    pub(crate) fn new(mode: Mode, key: &[u8]) -> Result<ModeCipher> {
        if key.len() != mode.key_size() {
            return Err(CryptoError::BadKeySize(key.len()));
        }
        let bad = |_| CryptoError::BadKeySize(key.len());
        Ok(match mode {
            Mode::Aes256Xts => ModeCipher::Aes256Xts {
                data: Aes256::new_from_slice(&key[..32]).map_err(bad)?,
                tweak: Aes256::new_from_slice(&key[32..]).map_err(bad)?,
            },
            Mode::Aes128Cbc => {
                let mut digest: [u8; 32] = Sha256::digest(key).into();
                let essiv = Aes256::new(&digest.into());
                zeroize::Zeroize::zeroize(&mut digest);
                ModeCipher::Aes128CbcEssiv {
                    key: Aes128::new_from_slice(key).map_err(bad)?,
                    essiv,
                }
            }
            Mode::Aes256Cts => ModeCipher::Aes256Cts(Aes256::new_from_slice(key).map_err(bad)?),
            Mode::Aes128Cts => ModeCipher::Aes128Cts(Aes128::new_from_slice(key).map_err(bad)?),
            Mode::Adiantum => {
                ModeCipher::Adiantum(Box::new(AdiantumCipher::new_from_slice(key).map_err(bad)?))
            }
            Mode::Aes256Hctr2 => {
                let k: &[u8; 32] = key
                    .try_into()
                    .map_err(|_| CryptoError::BadKeySize(key.len()))?;
                ModeCipher::Hctr2(Box::new(Hctr2::new(k)))
            }
            Mode::Sm4Xts | Mode::Sm4Cts => {
                return Err(CryptoError::Unsupported(format!(
                    "{} (no SM4 cipher here)",
                    mode.name()
                )))
            }
        })
    }

    /// Encrypts `data` in place with `iv` (32 bytes; the mode uses its IV size of them).
    pub(crate) fn encrypt(&self, data: &mut [u8], iv: &[u8; 32]) -> Result<()> {
        self.check_len(data)?;
        match self {
            ModeCipher::Aes256Xts { data: k, tweak } => xts(k, tweak, data, iv, true),
            ModeCipher::Aes128CbcEssiv { key, essiv } => {
                let mut mode =
                    cbc::Encryptor::<Aes128>::inner_iv_init(key.clone(), &essiv_iv(essiv, iv));
                mode.encrypt_blocks(aes::Block::slice_as_chunks_mut(data).0);
            }
            ModeCipher::Aes256Cts(k) => cts_encrypt(k.clone(), data, iv)?,
            ModeCipher::Aes128Cts(k) => cts_encrypt(k.clone(), data, iv)?,
            ModeCipher::Adiantum(a) => a.encrypt(data, iv),
            ModeCipher::Hctr2(h) => h.encrypt(data, iv),
        }
        Ok(())
    }

    /// Decrypts `data` in place with `iv`.
    pub(crate) fn decrypt(&self, data: &mut [u8], iv: &[u8; 32]) -> Result<()> {
        self.check_len(data)?;
        match self {
            ModeCipher::Aes256Xts { data: k, tweak } => xts(k, tweak, data, iv, false),
            ModeCipher::Aes128CbcEssiv { key, essiv } => {
                let mut mode =
                    cbc::Decryptor::<Aes128>::inner_iv_init(key.clone(), &essiv_iv(essiv, iv));
                mode.decrypt_blocks(aes::Block::slice_as_chunks_mut(data).0);
            }
            ModeCipher::Aes256Cts(k) => cts_decrypt(k.clone(), data, iv)?,
            ModeCipher::Aes128Cts(k) => cts_decrypt(k.clone(), data, iv)?,
            ModeCipher::Adiantum(a) => a.decrypt(data, iv),
            ModeCipher::Hctr2(h) => h.decrypt(data, iv),
        }
        Ok(())
    }

    /// The lengths each mode takes (the same both ways).
    fn check_len(&self, data: &[u8]) -> Result<()> {
        match self {
            ModeCipher::Aes256Xts { .. } if data.is_empty() || !data.len().is_multiple_of(16) => {
                Err(CryptoError::Corrupt(
                    "XTS data unit not a positive multiple of 16 bytes",
                ))
            }
            ModeCipher::Aes128CbcEssiv { .. } if !data.len().is_multiple_of(16) => Err(
                CryptoError::Corrupt("CBC data unit not a multiple of 16 bytes"),
            ),
            ModeCipher::Adiantum(_) => adiantum_check(data),
            ModeCipher::Hctr2(_) if data.len() < 16 => {
                Err(CryptoError::Corrupt("HCTR2 message under 16 bytes"))
            }
            _ => Ok(()),
        }
    }
}

/// XTS over whole blocks (IEEE 1619 without ciphertext stealing): T_0 = E_tweak(iv),
/// C_j = E_data(P_j xor T_j) xor T_j, T_{j+1} = T_j times x in GF(2^128) (little-endian,
/// x^128 = x^7 + x^2 + x + 1). The AES calls go 32 blocks at a time, so that the `aes`
/// crate runs them in parallel.
fn xts(data_key: &Aes256, tweak_key: &Aes256, data: &mut [u8], iv: &[u8; 32], enc: bool) {
    use aes::cipher::BlockCipherDecrypt;
    let mut t0 = aes::Block::from(iv16(iv));
    tweak_key.encrypt_block(&mut t0);
    let mut t = u128::from_le_bytes(t0.into());
    let xor = |b: &mut aes::Block, t: u128| {
        let v = u128::from_le_bytes((*b).into()) ^ t;
        *b = v.to_le_bytes().into();
    };
    let (blocks, _) = aes::Block::slice_as_chunks_mut(data);
    for chunk in blocks.chunks_mut(32) {
        let mut tweaks = [0u128; 32];
        for (b, tw) in chunk.iter_mut().zip(tweaks.iter_mut()) {
            *tw = t;
            xor(b, t);
            t = (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 };
        }
        if enc {
            data_key.encrypt_blocks(chunk);
        } else {
            data_key.decrypt_blocks(chunk);
        }
        for (b, tw) in chunk.iter_mut().zip(tweaks.iter()) {
            xor(b, *tw);
        }
    }
}

/// The first 16 bytes of an IV (the modes with a 16-byte IV).
fn iv16(iv: &[u8; 32]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&iv[..16]);
    out
}

/// CBC-ESSIV's IV: the IV encrypted with the key's hash.
fn essiv_iv(essiv: &Aes256, iv: &[u8; 32]) -> aes::Block {
    let mut eiv = aes::Block::from(iv16(iv));
    essiv.encrypt_block(&mut eiv);
    eiv
}

fn adiantum_check(data: &[u8]) -> Result<()> {
    // The crate hashes at most 4 NH chunks of 1 KiB (and the kernel's data units here are
    // at most a 4 KiB block); the message has at least one 16-byte block.
    if data.len() < 16 || data.len() > 4096 {
        return Err(CryptoError::Corrupt(
            "Adiantum message outside 16..=4096 bytes",
        ));
    }
    Ok(())
}

fn cts_encrypt<C>(cipher: C, data: &mut [u8], iv: &[u8; 32]) -> Result<()>
where
    C: BlockCipherEncrypt + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    use cts::Encrypt;
    let iv16 = iv16(iv);
    if data.len() == 16 {
        // One block: the kernel's cts(cbc(aes)) is plain CBC there (the crate's CS3 is not).
        let (blocks, _) = aes::Block::slice_as_chunks_mut(data);
        cbc::Encryptor::<C>::inner_iv_init(cipher, &iv16.into()).encrypt_blocks(blocks);
        return Ok(());
    }
    cts::CbcCs3::<C>::inner_iv_init(cipher, &iv16.into())
        .encrypt(data)
        .map_err(|_| CryptoError::Corrupt("CTS message under 16 bytes"))
}

fn cts_decrypt<C>(cipher: C, data: &mut [u8], iv: &[u8; 32]) -> Result<()>
where
    C: aes::cipher::BlockCipherDecrypt
        + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    use cts::Decrypt;
    let iv16 = iv16(iv);
    if data.len() == 16 {
        let (blocks, _) = aes::Block::slice_as_chunks_mut(data);
        cbc::Decryptor::<C>::inner_iv_init(cipher, &iv16.into()).decrypt_blocks(blocks);
        return Ok(());
    }
    cts::CbcCs3::<C>::inner_iv_init(cipher, &iv16.into())
        .decrypt(data)
        .map_err(|_| CryptoError::Corrupt("CTS message under 16 bytes"))
}
