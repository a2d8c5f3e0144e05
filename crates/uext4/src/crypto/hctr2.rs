//! HCTR2 (Crowley, Huckleberry, Biggers 2021), the length-preserving mode of
//! AES-256-HCTR2 filenames, composed from the `aes` block cipher and the `polyval`
//! universal hash of the RustCrypto crates. (The `hctr2` crate needs a nightly compiler.)
//!
//! With block cipher E_K, h = E_K(0^128), L = E_K(le128(1)), tweak T and message
//! P = M || N (|M| = 16):
//!   MM = M ^ H(T, N); UU = E_K(MM); S = MM ^ UU ^ L; V = N ^ XCTR_K(S);
//!   U = UU ^ H(T, V); C = U || V,
//! where H(T, X) = POLYVAL_h(le128(2*8|T| + 2 + [|X| % 16 != 0]) || pad(T) || pad'(X)),
//! pad zero-fills to 16 bytes and pad' appends 0x01 then zeros when |X| % 16 != 0,
//! and XCTR block i (from 1) is E_K(S ^ le128(i)).

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::Aes256;
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;

/// An AES-256-HCTR2 key schedule.
pub(crate) struct Hctr2 {
    aes: Aes256,
    h: [u8; 16],
    l: [u8; 16],
}

impl Drop for Hctr2 {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.h.zeroize();
        self.l.zeroize();
    }
}

fn xor16(a: &mut [u8; 16], b: &[u8; 16]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= *y;
    }
}

impl Hctr2 {
    /// The schedule of a 32-byte key.
    pub(crate) fn new(key: &[u8; 32]) -> Hctr2 {
        let aes = Aes256::new(key.into());
        let mut h = [0u8; 16];
        aes.encrypt_block((&mut h).into());
        let mut l = 1u128.to_le_bytes();
        aes.encrypt_block((&mut l).into());
        Hctr2 { aes, h, l }
    }

    fn hash(&self, tweak: &[u8], x: &[u8]) -> [u8; 16] {
        let mut p = Polyval::new(&self.h.into());
        let rem = !x.len().is_multiple_of(16) as u128;
        let first = (2 * 8 * tweak.len() as u128 + 2 + rem).to_le_bytes();
        p.update_padded(&first);
        p.update_padded(tweak);
        let full = x.len() / 16 * 16;
        p.update_padded(&x[..full]);
        if rem != 0 {
            let mut last = [0u8; 16];
            let tail = &x[full..];
            last[..tail.len()].copy_from_slice(tail);
            last[tail.len()] = 1;
            p.update_padded(&last);
        }
        p.finalize().into()
    }

    fn xctr(&self, data: &mut [u8], s: &[u8; 16]) {
        for (i, chunk) in data.chunks_mut(16).enumerate() {
            let mut ks = (i as u128 + 1).to_le_bytes();
            xor16(&mut ks, s);
            self.aes.encrypt_block((&mut ks).into());
            for (d, k) in chunk.iter_mut().zip(ks.iter()) {
                *d ^= *k;
            }
        }
    }

    /// Encrypts `data` (at least 16 bytes) in place under `tweak`.
    pub(crate) fn encrypt(&self, data: &mut [u8], tweak: &[u8]) {
        assert!(data.len() >= 16, "HCTR2 needs at least one block");
        let (m, n) = data.split_at_mut(16);
        let mut mm: [u8; 16] = m.try_into().expect("16 bytes");
        xor16(&mut mm, &self.hash(tweak, n));
        let mut uu = mm;
        self.aes.encrypt_block((&mut uu).into());
        let mut s = mm;
        xor16(&mut s, &uu);
        xor16(&mut s, &self.l);
        self.xctr(n, &s);
        xor16(&mut uu, &self.hash(tweak, n));
        m.copy_from_slice(&uu);
    }

    /// Decrypts `data` (at least 16 bytes) in place under `tweak`.
    pub(crate) fn decrypt(&self, data: &mut [u8], tweak: &[u8]) {
        assert!(data.len() >= 16, "HCTR2 needs at least one block");
        let (u, v) = data.split_at_mut(16);
        let mut uu: [u8; 16] = u.try_into().expect("16 bytes");
        xor16(&mut uu, &self.hash(tweak, v));
        let mut mm = uu;
        self.aes.decrypt_block((&mut mm).into());
        let mut s = mm;
        xor16(&mut s, &uu);
        xor16(&mut s, &self.l);
        self.xctr(v, &s);
        xor16(&mut mm, &self.hash(tweak, v));
        u.copy_from_slice(&mm);
    }
}
