//! fs-verity's on-disk metadata, without I/O: the `fsverity_descriptor`
//! (fs/verity/fsverity_private.h), the Merkle tree's shape (fs/verity/open.c's
//! fsverity_init_merkle_tree_params), salted block hashing (fs/verity/hash_algs.c), the tree
//! built level by level as data blocks come (fs/verity/enable.c's build_merkle_tree), and
//! where ext4 keeps it all past the end of the file (fs/ext4/verity.c).
//!
//! ext4's layout, from i_size on: a hole up to the next 64 KiB boundary; the Merkle tree, its
//! root level first and level 0 (the hashes of the data blocks) last; zeros to the next
//! filesystem block; the descriptor with its signature appended; zeros up to 4 bytes before
//! a block boundary; the descriptor's size as a little-endian u32, the last bytes of the
//! file's last block.

use crate::error::{Error, Result};
use crate::format::{le32, le64, put32, put64};
use sha2::{Digest, Sha256, Sha512};
use std::collections::VecDeque;
use std::sync::Arc;

/// `FS_VERITY_HASH_ALG_SHA256`.
pub const HASH_ALG_SHA256: u8 = 1;
/// `FS_VERITY_HASH_ALG_SHA512`.
pub const HASH_ALG_SHA512: u8 = 2;
/// `sizeof(struct fsverity_descriptor)`, the signature excluded.
pub const DESCRIPTOR_SIZE: usize = 256;
/// `FS_VERITY_MAX_DESCRIPTOR_SIZE`: descriptor and signature together.
pub const MAX_DESCRIPTOR_SIZE: usize = 16384;
/// `FS_VERITY_MAX_SIGNATURE_SIZE`.
pub const MAX_SIGNATURE_SIZE: usize = MAX_DESCRIPTOR_SIZE - DESCRIPTOR_SIZE;
/// The descriptor's salt field.
pub const MAX_SALT_SIZE: usize = 32;
/// `FS_VERITY_MAX_LEVELS`.
pub const MAX_LEVELS: usize = 8;
/// ext4_verity_metadata_pos: the tree starts at the first multiple of this at or after i_size.
pub const METADATA_ALIGN: u64 = 65536;
/// `FS_VERITY_METADATA_TYPE_MERKLE_TREE` (FS_IOC_READ_VERITY_METADATA).
pub const METADATA_MERKLE_TREE: u64 = 1;
/// `FS_VERITY_METADATA_TYPE_DESCRIPTOR`.
pub const METADATA_DESCRIPTOR: u64 = 2;
/// `FS_VERITY_METADATA_TYPE_SIGNATURE`.
pub const METADATA_SIGNATURE: u64 = 3;

/// The hash algorithms fs-verity defines (fs/verity/hash_algs.c's fsverity_hash_algs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlg {
    /// SHA-256: 32-byte digests, 64-byte blocks.
    Sha256,
    /// SHA-512: 64-byte digests, 128-byte blocks.
    Sha512,
}

impl HashAlg {
    /// The algorithm of a descriptor's or an ioctl's number.
    pub fn from_id(id: u32) -> Option<Self> {
        match id {
            1 => Some(HashAlg::Sha256),
            2 => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    /// The algorithm `fsverity` names so ("sha256", "sha512").
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "sha256" => Some(HashAlg::Sha256),
            "sha512" => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    /// `FS_VERITY_HASH_ALG_*`.
    pub fn id(self) -> u8 {
        match self {
            HashAlg::Sha256 => HASH_ALG_SHA256,
            HashAlg::Sha512 => HASH_ALG_SHA512,
        }
    }

    /// The name `fsverity measure` prints.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha512 => "sha512",
        }
    }

    /// Bytes in a digest.
    pub fn digest_size(self) -> usize {
        match self {
            HashAlg::Sha256 => 32,
            HashAlg::Sha512 => 64,
        }
    }

    /// The hash's own block size, to which the salt is padded (fsverity_prepare_hash_state).
    fn block_size(self) -> usize {
        match self {
            HashAlg::Sha256 => 64,
            HashAlg::Sha512 => 128,
        }
    }

    /// The digest of the concatenation of `parts`.
    pub fn digest(self, parts: &[&[u8]]) -> Vec<u8> {
        match self {
            HashAlg::Sha256 => {
                let mut h = Sha256::new();
                parts.iter().for_each(|p| h.update(p));
                h.finalize().to_vec()
            }
            HashAlg::Sha512 => {
                let mut h = Sha512::new();
                parts.iter().for_each(|p| h.update(p));
                h.finalize().to_vec()
            }
        }
    }
}

/// A `struct fsverity_descriptor` and its appended signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// `hash_algorithm` (FS_VERITY_HASH_ALG_*).
    pub hash_algorithm: u8,
    /// `log_blocksize`: log2 of the data and tree block size.
    pub log_blocksize: u8,
    /// The salt, at most 32 bytes.
    pub salt: Vec<u8>,
    /// `data_size`: the file's size the tree covers.
    pub data_size: u64,
    /// `root_hash`, zero-padded to 64 bytes.
    pub root_hash: [u8; 64],
    /// The builtin signature (PKCS#7), stored as given; empty when none.
    pub signature: Vec<u8>,
}

impl Descriptor {
    /// Parses and checks a descriptor of `desc.len()` bytes as the kernel's
    /// validate_fsverity_descriptor does, against the inode's size `i_size`.
    pub fn parse(desc: &[u8], i_size: u64) -> std::result::Result<Descriptor, String> {
        if desc.len() < DESCRIPTOR_SIZE {
            return Err(format!(
                "unrecognized descriptor size: {} bytes",
                desc.len()
            ));
        }
        if desc[0] != 1 {
            return Err(format!("unrecognized descriptor version: {}", desc[0]));
        }
        if desc[112..DESCRIPTOR_SIZE].iter().any(|&b| b != 0) {
            return Err("reserved bits set in descriptor".into());
        }
        let salt_size = desc[3] as usize;
        if salt_size > MAX_SALT_SIZE {
            return Err(format!("invalid salt_size: {salt_size}"));
        }
        let data_size = le64(desc, 8);
        if data_size != i_size {
            return Err(format!(
                "wrong data_size: {data_size} (descriptor) != {i_size} (inode)"
            ));
        }
        let sig_size = le32(desc, 4) as usize;
        if sig_size > desc.len() - DESCRIPTOR_SIZE {
            return Err("signature overflows verity descriptor".into());
        }
        Ok(Descriptor {
            hash_algorithm: desc[1],
            log_blocksize: desc[2],
            salt: desc[80..80 + salt_size].to_vec(),
            data_size,
            root_hash: desc[16..80].try_into().unwrap(),
            signature: desc[DESCRIPTOR_SIZE..DESCRIPTOR_SIZE + sig_size].to_vec(),
        })
    }

    /// The 256 bytes of the descriptor with `sig_size` as given (0: the form the file digest
    /// hashes and FS_IOC_READ_VERITY_METADATA returns).
    pub fn core_bytes(&self, sig_size: u32) -> [u8; DESCRIPTOR_SIZE] {
        let mut b = [0u8; DESCRIPTOR_SIZE];
        b[0] = 1;
        b[1] = self.hash_algorithm;
        b[2] = self.log_blocksize;
        b[3] = self.salt.len() as u8;
        put32(&mut b, 4, sig_size);
        put64(&mut b, 8, self.data_size);
        b[16..80].copy_from_slice(&self.root_hash);
        b[80..80 + self.salt.len()].copy_from_slice(&self.salt);
        b
    }

    /// The descriptor as stored: the 256 bytes with `sig_size`, then the signature.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = self.core_bytes(self.signature.len() as u32).to_vec();
        v.extend_from_slice(&self.signature);
        v
    }

    /// The file digest (compute_file_digest): the hash of the descriptor with `sig_size` 0
    /// and without the signature.
    pub fn file_digest(&self, alg: HashAlg) -> Vec<u8> {
        alg.digest(&[&self.core_bytes(0)])
    }
}

/// The shape of a file's Merkle tree (`struct merkle_tree_params`).
#[derive(Clone, Debug)]
pub struct MerkleParams {
    /// The hash algorithm.
    pub alg: HashAlg,
    /// log2 of the block size of data and tree.
    pub log_blocksize: u32,
    /// The data and tree block size.
    pub block_size: usize,
    /// The salt, zero-padded to the hash's block size (empty without a salt).
    padded_salt: Vec<u8>,
    /// log2 of the hashes one tree block holds.
    log_arity: u32,
    /// The first tree block of each level, level 0 (above the data) first.
    pub level_start: Vec<u64>,
    /// Bytes of the whole tree.
    pub tree_size: u64,
    /// The size of the data the tree covers.
    pub data_size: u64,
}

impl MerkleParams {
    /// Checks the parameters as the kernel's fsverity_init_merkle_tree_params does (block
    /// sizes from 1024 bytes to the page and the filesystem block, at least two digests a
    /// block) and lays the tree out for `data_size` bytes. Errors are the kernel's warnings.
    pub fn new(
        hash_algorithm: u32,
        log_blocksize: u32,
        salt: &[u8],
        data_size: u64,
        fs_block_size: u32,
    ) -> std::result::Result<MerkleParams, String> {
        let alg = HashAlg::from_id(hash_algorithm)
            .ok_or_else(|| format!("unknown hash algorithm number: {hash_algorithm}"))?;
        const PAGE_SHIFT: u32 = 12;
        if !(10..=PAGE_SHIFT).contains(&log_blocksize) || 1u32 << log_blocksize > fs_block_size {
            return Err(format!("unsupported log_blocksize: {log_blocksize}"));
        }
        let block_size = 1usize << log_blocksize;
        if block_size < 2 * alg.digest_size() {
            return Err(format!(
                "Merkle tree block size ({block_size}) too small for hash algorithm \"{}\"",
                alg.name()
            ));
        }
        let mut padded_salt = salt.to_vec();
        if !salt.is_empty() {
            padded_salt.resize(salt.len().next_multiple_of(alg.block_size()), 0);
        }
        let log_arity = log_blocksize - alg.digest_size().trailing_zeros();
        let mut counts = Vec::new();
        let mut blocks = data_size.div_ceil(block_size as u64);
        while blocks > 1 {
            if counts.len() >= MAX_LEVELS {
                return Err("too many levels in Merkle tree".into());
            }
            blocks = blocks.div_ceil(1 << log_arity);
            counts.push(blocks);
        }
        // The root level is stored first, level 0 last.
        let mut level_start = vec![0; counts.len()];
        let mut offset = 0;
        for level in (0..counts.len()).rev() {
            level_start[level] = offset;
            offset += counts[level];
        }
        Ok(MerkleParams {
            alg,
            log_blocksize,
            block_size,
            padded_salt,
            log_arity,
            level_start,
            tree_size: offset << log_blocksize,
            data_size,
        })
    }

    /// The parameters a descriptor names.
    pub fn of(desc: &Descriptor, fs_block_size: u32) -> std::result::Result<MerkleParams, String> {
        MerkleParams::new(
            desc.hash_algorithm as u32,
            desc.log_blocksize as u32,
            &desc.salt,
            desc.data_size,
            fs_block_size,
        )
    }

    /// Levels in the tree (0 for a file of at most one block: its block's hash is the root).
    pub fn num_levels(&self) -> usize {
        self.level_start.len()
    }

    /// The salted hash of one block (fsverity_hash_block); `block` is zero-padded to the
    /// block size.
    pub fn hash_block(&self, block: &[u8]) -> Vec<u8> {
        if block.len() < self.block_size {
            let mut b = block.to_vec();
            b.resize(self.block_size, 0);
            return self.alg.digest(&[&self.padded_salt, &b]);
        }
        self.alg.digest(&[&self.padded_salt, block])
    }

    /// Where the hash of data block `index` is kept at `level`: the tree block (counted from
    /// the tree's start) and the byte offset in it (verify.c's verify_data_block).
    pub fn hash_position(&self, level: usize, index: u64) -> (u64, usize) {
        let hidx = index >> (self.log_arity as usize * level);
        let block = self.level_start[level] + (hidx >> self.log_arity);
        let off = (hidx & ((1 << self.log_arity) - 1)) as usize * self.alg.digest_size();
        (block, off)
    }
}

/// ext4_verity_metadata_pos: where the tree starts.
pub fn metadata_pos(i_size: u64) -> u64 {
    i_size.next_multiple_of(METADATA_ALIGN)
}

/// ext4_write_verity_descriptor's offsets: where the descriptor goes (the first block boundary
/// after the tree) and where its size goes (4 bytes before the block boundary after it).
pub fn descriptor_layout(i_size: u64, tree_size: u64, desc_size: u64, bs: u64) -> (u64, u64) {
    let desc_pos = (metadata_pos(i_size) + tree_size).next_multiple_of(bs);
    let size_pos = (desc_pos + desc_size + 4).next_multiple_of(bs) - 4;
    (desc_pos, size_pos)
}

/// ext4_get_verity_descriptor_location: from the end of the file's last extent (in bytes)
/// and the u32 stored in its last 4 bytes, the descriptor's (position, size); None where they
/// make no sense (the kernel's "verity file corrupted; can't find descriptor").
pub fn descriptor_location(
    i_size: u64,
    map_end: u64,
    size_word: u32,
    bs: u64,
) -> Option<(u64, usize)> {
    let size_pos = map_end.checked_sub(4)?;
    let size = size_word as u64;
    if size > i32::MAX as u64 || size > size_pos || size as usize > MAX_DESCRIPTOR_SIZE {
        return None;
    }
    let pos = (size_pos - size) / bs * bs;
    (pos >= metadata_pos(i_size)).then_some((pos, size as usize))
}

/// Builds a Merkle tree from the data blocks fed in order (build_merkle_tree): each full tree
/// block is handed out with its index as soon as it is complete, and `finish` gives the root
/// hash. Memory: one pending block per level.
pub struct TreeBuilder<'a> {
    params: &'a MerkleParams,
    /// Level by level, the hashes gathered for the block being filled.
    pending: Vec<Vec<u8>>,
    /// Level by level, the index of the block being filled.
    next: Vec<u64>,
    /// The hash above the top level: the root hash.
    root: Vec<u8>,
}

impl<'a> TreeBuilder<'a> {
    /// A builder for a tree of `params`' shape.
    pub fn new(params: &'a MerkleParams) -> Self {
        TreeBuilder {
            params,
            pending: vec![Vec::with_capacity(params.block_size); params.num_levels()],
            next: params.level_start.clone(),
            root: Vec::new(),
        }
    }

    /// Hashes the next data block (its bytes, the last one possibly short) into level 0,
    /// passing each tree block filled on the way to `out` (index from the tree's start).
    pub fn push_data(
        &mut self,
        data: &[u8],
        out: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let h = self.params.hash_block(data);
        self.push_hash(0, h, out)
    }

    /// Adds `h` to `level`'s pending block; a full block is written and hashed upward.
    fn push_hash(
        &mut self,
        level: usize,
        h: Vec<u8>,
        out: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if level == self.pending.len() {
            if !self.root.is_empty() {
                return Err(Error::Invalid("Merkle tree has more than one root".into()));
            }
            self.root = h;
            return Ok(());
        }
        self.pending[level].extend_from_slice(&h);
        if self.pending[level].len() + h.len() > self.params.block_size {
            self.flush(level, out)?;
        }
        Ok(())
    }

    /// Writes `level`'s pending block (zero-padded) and hashes it into the level above.
    fn flush(&mut self, level: usize, out: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let mut block = std::mem::take(&mut self.pending[level]);
        block.resize(self.params.block_size, 0);
        out(self.next[level], &block)?;
        self.next[level] += 1;
        let h = self.params.hash_block(&block);
        block.clear();
        self.pending[level] = block;
        self.push_hash(level + 1, h, out)
    }

    /// Flushes the blocks still partly filled, bottom up, and returns the root hash (zeros
    /// for an empty file).
    pub fn finish(mut self, out: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<Vec<u8>> {
        for level in 0..self.pending.len() {
            if !self.pending[level].is_empty() {
                self.flush(level, out)?;
            }
        }
        if self.root.is_empty() {
            if self.params.data_size != 0 {
                return Err(Error::Invalid("Merkle tree built without its root".into()));
            }
            self.root = vec![0; self.params.alg.digest_size()];
        }
        Ok(self.root)
    }
}

/// The tree blocks of one file already checked against the root, most recent last: reads
/// check only up to the first block found here (as the kernel's verified-block bitmap and
/// page cache spare it). Bounded: the oldest go first.
#[derive(Debug, Default)]
pub struct VerifiedBlocks {
    blocks: VecDeque<(u64, Arc<[u8]>)>,
}

/// Tree blocks a file keeps verified (64 of 4 KiB cover 32 MiB of data with SHA-256).
pub const VERIFIED_BLOCKS_MAX: usize = 64;

impl VerifiedBlocks {
    /// The verified tree block `index`, if kept (it becomes the most recent).
    pub fn get(&mut self, index: u64) -> Option<Arc<[u8]>> {
        let at = self.blocks.iter().position(|(i, _)| *i == index)?;
        let e = self.blocks.remove(at)?;
        let b = e.1.clone();
        self.blocks.push_back(e);
        Some(b)
    }

    /// Keeps tree block `index`, checked, dropping the oldest past the bound.
    pub fn insert(&mut self, index: u64, block: Arc<[u8]>) {
        if self.blocks.iter().any(|(i, _)| *i == index) {
            return;
        }
        if self.blocks.len() >= VERIFIED_BLOCKS_MAX {
            self.blocks.pop_front();
        }
        self.blocks.push_back((index, block));
    }

    /// How many blocks are kept.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// What an open verity file keeps (the kernel's `struct fsverity_info`): its descriptor, its
/// tree's shape, and the tree blocks already verified.
#[derive(Debug)]
pub struct VerityInfo {
    /// The descriptor read from past the end of the file.
    pub desc: Descriptor,
    /// The tree's shape.
    pub params: MerkleParams,
    /// The file digest (FS_IOC_MEASURE_VERITY).
    pub digest: Vec<u8>,
    /// Verified tree blocks.
    pub verified: parking_lot::Mutex<VerifiedBlocks>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_shape_matches_the_kernel_arithmetic() {
        // 4 KiB blocks, SHA-256: 128 hashes a block. 1 block of data: no tree.
        let p = MerkleParams::new(1, 12, &[], 4096, 4096).unwrap();
        assert_eq!(p.num_levels(), 0);
        assert_eq!(p.tree_size, 0);
        // 129 blocks: two level-0 blocks, one root block stored first.
        let p = MerkleParams::new(1, 12, &[], 129 * 4096, 4096).unwrap();
        assert_eq!(p.level_start, vec![1, 0]);
        assert_eq!(p.tree_size, 3 * 4096);
        assert_eq!(p.hash_position(0, 128), (2, 0));
        assert_eq!(p.hash_position(1, 128), (0, 32));
        // Block sizes the kernel refuses.
        assert!(MerkleParams::new(1, 9, &[], 1, 4096).is_err());
        assert!(MerkleParams::new(1, 12, &[], 1, 1024).is_err());
        assert!(MerkleParams::new(3, 12, &[], 1, 4096).is_err());
    }

    #[test]
    fn descriptor_round_trips_and_locates() {
        let d = Descriptor {
            hash_algorithm: 1,
            log_blocksize: 12,
            salt: vec![1, 2, 3],
            data_size: 5000,
            root_hash: [7; 64],
            signature: vec![9; 10],
        };
        let b = d.to_bytes();
        assert_eq!(Descriptor::parse(&b, 5000).unwrap(), d);
        assert!(Descriptor::parse(&b, 5001).is_err());
        let (pos, size_pos) = descriptor_layout(5000, 8192, b.len() as u64, 4096);
        assert_eq!(pos, 65536 + 8192);
        assert_eq!(size_pos, 65536 + 8192 + 4092);
        let end = size_pos + 4;
        assert_eq!(
            descriptor_location(5000, end, b.len() as u32, 4096),
            Some((pos, b.len()))
        );
    }
}
