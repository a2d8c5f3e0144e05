//! fs-verity on ext4: reads of verity files checked against their Merkle tree
//! (fs/verity/verify.c), enabling verity on a file (fs/verity/enable.c with ext4's
//! begin/end_enable_verity of fs/ext4/verity.c), the file digest (fs/verity/measure.c) and the
//! metadata (fs/verity/read_metadata.c). The on-disk structures are in format/verity.rs.
//!
//! Verity files are read-only: writes, truncates and write opens fail with EPERM (flags.rs).
//! In an encrypted file the Merkle tree, the descriptor and its size word are encrypted as
//! its data are, block by block with the file's contents key (ext4 reads and writes them
//! through the page cache, which fscrypt en- and decrypts by logical block); the hashes are
//! of the plaintext. Without the key such a file is ENOKEY, as its data are.

use crate::crypto::InodeKey;
use crate::error::{Corruption, Error, Result};
use crate::flags::{FL_APPEND, FL_VERITY};
use crate::format::features::RO_COMPAT_VERITY;
use crate::format::inode::{S_IFDIR, S_IFREG};
use crate::format::verity::{
    descriptor_layout, descriptor_location, metadata_pos, Descriptor, HashAlg, MerkleParams,
    TreeBuilder, VerifiedBlocks, VerityInfo, MAX_SALT_SIZE, MAX_SIGNATURE_SIZE,
    METADATA_DESCRIPTOR, METADATA_MERKLE_TREE, METADATA_SIGNATURE,
};
use crate::fs::Fs;
use crate::inode::Inode;
use crate::transaction::credits;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What FS_IOC_ENABLE_VERITY is given (`struct fsverity_enable_arg`).
#[derive(Clone, Debug)]
pub struct VerityArgs {
    /// `FS_VERITY_HASH_ALG_SHA256` (1) or `FS_VERITY_HASH_ALG_SHA512` (2).
    pub hash_algorithm: u32,
    /// The Merkle tree block size: a power of two from 1024 to the page size and the
    /// filesystem block size.
    pub block_size: u32,
    /// A salt of at most 32 bytes, prepended (padded) to every hashed block.
    pub salt: Vec<u8>,
    /// A builtin signature (PKCS#7 DER), stored with the descriptor and returned as is;
    /// uext4 does not check it against a keyring.
    pub signature: Vec<u8>,
}

impl Default for VerityArgs {
    /// SHA-256, 4 KiB blocks, no salt, no signature: `fsverity enable`'s defaults.
    fn default() -> Self {
        VerityArgs {
            hash_algorithm: 1,
            block_size: 4096,
            salt: Vec::new(),
            signature: Vec::new(),
        }
    }
}

/// Bytes of data hashed, or of tree written, per step while enabling.
const CHUNK: usize = 1 << 20;

impl Fs {
    /// The verity state of a verity inode, read from past its end on first use and kept with
    /// the inode (ensure_verity_info and fsverity_get_descriptor, with ext4's
    /// ext4_get_verity_descriptor_location).
    pub(crate) fn verity_info(&self, inode: &Inode) -> Result<Arc<VerityInfo>> {
        let ino = inode.ino;
        if let Some(v) = &inode.state.lock().verity {
            return Ok(v.clone());
        }
        let key = self.contents_key(ino)?;
        let key = key.as_deref();
        let (size, map_end) = {
            let mut st = inode.state.lock();
            if Self::is_inline(&st.raw) || Self::uses_blockmap(&st.raw) {
                return Err(Error::corrupt(
                    Corruption::Inode,
                    format!("inode {ino}: verity file doesn't use extents"),
                ));
            }
            let end = self.ext_cached(ino, &mut st, |c| {
                c.map
                    .values()
                    .next_back()
                    .map(|e| (e.lblk as u64 + e.len as u64) * self.geo.block_size as u64)
            })?;
            (st.raw.size(), end)
        };
        let bad = |why: String| {
            Error::corrupt(
                Corruption::Inode,
                format!("inode {ino}: verity file corrupted; can't find descriptor: {why}"),
            )
        };
        let map_end = map_end.ok_or_else(|| bad("it has no extents".into()))?;
        let mut word = [0u8; 4];
        if map_end >= 4 {
            self.read_plain(inode, key, map_end - 4, &mut word)?;
        }
        let bs = self.geo.block_size as u64;
        let (pos, len) = descriptor_location(size, map_end, u32::from_le_bytes(word), bs)
            .ok_or_else(|| bad("its size word makes no sense".into()))?;
        let mut raw = vec![0u8; len];
        self.read_plain(inode, key, pos, &mut raw)?;
        let desc = Descriptor::parse(&raw, size).map_err(bad)?;
        let params = MerkleParams::of(&desc, self.geo.block_size)
            .map_err(|e| Error::corrupt(Corruption::Inode, format!("inode {ino}: {e}")))?;
        let info = Arc::new(VerityInfo {
            digest: desc.file_digest(params.alg),
            desc,
            params,
            verified: parking_lot::Mutex::new(VerifiedBlocks::default()),
        });
        let mut st = inode.state.lock();
        Ok(st.verity.get_or_insert(info).clone())
    }

    /// [`Fs::read`] of a verity file: the whole data blocks under `[off, off + buf.len())`
    /// read and each checked against the tree before any byte is returned
    /// (fsverity_verify_blocks); a mismatch is EIO naming the inode and the block.
    pub(crate) fn read_verity(&self, inode: &Inode, off: u64, buf: &mut [u8]) -> Result<usize> {
        let info = self.verity_info(inode)?;
        let key = self.contents_key(inode.ino)?;
        let key = key.as_deref();
        let _g = inode.io_lock.read();
        let (size, touched) = {
            let mut st = inode.state.lock();
            crate::file::check_live(&st)?;
            (st.raw.size(), self.atime_update_locked(&mut st))
        };
        if touched {
            self.dirty_lazily(inode);
        }
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - off) as usize;
        let bs = info.params.block_size as u64;
        let start = off / bs * bs;
        let end = (off + len as u64).next_multiple_of(bs).min(size);
        let mut data = vec![0u8; (end - start) as usize];
        self.read_plain(inode, key, start, &mut data)?;
        for (i, block) in data.chunks(bs as usize).enumerate() {
            self.verify_data_block(inode, key, &info, start / bs + i as u64, block)?;
        }
        let at = (off - start) as usize;
        buf[..len].copy_from_slice(&data[at..at + len]);
        self.stats
            .user_bytes_read
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(len)
    }

    /// Checks data block `index` (its bytes, the last one short) against the tree: the tree
    /// blocks above it are read and checked from the highest one not yet verified down, each
    /// against the hash above it (verify.c's verify_data_block).
    fn verify_data_block(
        &self,
        inode: &Inode,
        key: Option<&InodeKey>,
        info: &VerityInfo,
        index: u64,
        data: &[u8],
    ) -> Result<()> {
        let p = &info.params;
        let ds = p.alg.digest_size();
        let mut path = Vec::new();
        let mut want = info.desc.root_hash[..ds].to_vec();
        for level in 0..p.num_levels() {
            let (blk, off) = p.hash_position(level, index);
            if let Some(b) = info.verified.lock().get(blk) {
                want = b[off..off + ds].to_vec();
                break;
            }
            path.push((level, blk, off));
        }
        let base = metadata_pos(p.data_size);
        for &(level, blk, off) in path.iter().rev() {
            let mut block = vec![0u8; p.block_size];
            self.read_plain(inode, key, base + (blk << p.log_blocksize), &mut block)?;
            if p.hash_block(&block) != want {
                return Err(Error::Verity(format!(
                    "inode {}: Merkle tree block {blk} (level {level}) does not match the hash \
                     above it: the file's verity metadata is corrupt",
                    inode.ino
                )));
            }
            want = block[off..off + ds].to_vec();
            info.verified.lock().insert(blk, block.into());
        }
        if p.hash_block(data) != want {
            return Err(Error::Verity(format!(
                "inode {}: data block {index} (bytes {}..{}) does not match its Merkle tree: \
                 the file is corrupt",
                inode.ino,
                index * p.block_size as u64,
                index * p.block_size as u64 + data.len() as u64
            )));
        }
        Ok(())
    }

    /// Whether `ino` is a verity file (`EXT4_VERITY_FL`, statx's STATX_ATTR_VERITY).
    pub fn is_verity(&self, ino: u32) -> Result<bool> {
        Ok(self.iget(ino)?.state.lock().raw.flags() & FL_VERITY != 0)
    }

    /// The verity state of `ino`, ENODATA when it is no verity file (fsverity_get_info's
    /// callers).
    fn verity_of(&self, ino: u32) -> Result<(crate::inode::InodeRef, Arc<VerityInfo>)> {
        let inode = self.iget(ino)?;
        if inode.state.lock().raw.flags() & FL_VERITY == 0 {
            return Err(Error::NoAttr);
        }
        let info = self.verity_info(&inode)?;
        Ok((inode, info))
    }

    /// FS_IOC_MEASURE_VERITY: the file digest of verity file `ino`, the hash of its
    /// descriptor (what `fsverity measure` prints). ENODATA for a file without verity.
    pub fn measure_verity(&self, ino: u32) -> Result<(HashAlg, Vec<u8>)> {
        let (_, info) = self.verity_of(ino)?;
        Ok((info.params.alg, info.digest.clone()))
    }

    /// FS_IOC_READ_VERITY_METADATA: up to `len` bytes at `off` of the Merkle tree
    /// (`METADATA_MERKLE_TREE`), the descriptor without signature (`METADATA_DESCRIPTOR`) or
    /// the signature (`METADATA_SIGNATURE`; ENODATA when none); empty past the end. ENODATA
    /// for a file without verity, EINVAL for another type.
    pub fn read_verity_metadata(&self, ino: u32, kind: u64, off: u64, len: u64) -> Result<Vec<u8>> {
        let (inode, info) = self.verity_of(ino)?;
        let slice = |src: &[u8]| -> Vec<u8> {
            let from = off.min(src.len() as u64) as usize;
            let to = (from as u64).saturating_add(len).min(src.len() as u64) as usize;
            src[from..to].to_vec()
        };
        match kind {
            METADATA_MERKLE_TREE => {
                let end = off.saturating_add(len).min(info.params.tree_size);
                if off >= end {
                    return Ok(Vec::new());
                }
                let mut b = vec![0u8; (end - off) as usize];
                let key = self.contents_key(ino)?;
                let pos = metadata_pos(info.params.data_size) + off;
                self.read_plain(&inode, key.as_deref(), pos, &mut b)?;
                Ok(b)
            }
            METADATA_DESCRIPTOR => Ok(slice(&info.desc.core_bytes(0))),
            METADATA_SIGNATURE if info.desc.signature.is_empty() => Err(Error::NoAttr),
            METADATA_SIGNATURE => Ok(slice(&info.desc.signature)),
            _ => Err(Error::Invalid(format!("verity metadata type {kind}"))),
        }
    }

    /// FS_IOC_ENABLE_VERITY on `ino` (fsverity_ioctl_enable and enable_verity): the Merkle
    /// tree and descriptor are written past the end of the file, then EXT4_VERITY_FL is set.
    /// While they are written the inode is on the orphan list, so that a crash leaves a file
    /// whose blocks past its end the next open (or e2fsck, or the kernel) cuts away; the flag
    /// is set and the inode taken off the list in one last handle (ext4_end_enable_verity).
    /// The file is held against writers meanwhile (its io_lock).
    ///
    /// # Errors
    /// EINVAL for a block size that is not a power of two or that the kernel refuses, an
    /// unknown algorithm or a file that is not regular (EISDIR for a directory); EMSGSIZE for
    /// a salt over 32 bytes or a signature over 16128; EEXIST when verity is already on;
    /// EPERM for an append-only file; EOPNOTSUPP without the `verity` feature or for a file
    /// with an indirect block map; ENOKEY for an encrypted file without its key; EROFS;
    /// ENOSPC.
    pub fn enable_verity(&self, ino: u32, args: &VerityArgs) -> Result<()> {
        if !args.block_size.is_power_of_two() {
            return Err(Error::Invalid(format!(
                "verity block size {} is not a power of two",
                args.block_size
            )));
        }
        if args.salt.len() > MAX_SALT_SIZE {
            return Err(Error::MsgSize(format!(
                "a verity salt of {} bytes (at most {MAX_SALT_SIZE})",
                args.salt.len()
            )));
        }
        if args.signature.len() > MAX_SIGNATURE_SIZE {
            return Err(Error::MsgSize(format!(
                "a verity signature of {} bytes (at most {MAX_SIGNATURE_SIZE})",
                args.signature.len()
            )));
        }
        self.check_writable()?;
        if !self.sb.lock().has_ro_compat(RO_COMPAT_VERITY) {
            return Err(Error::NotSupported(
                "verity on a filesystem without the verity feature (tune2fs -O verity)".into(),
            ));
        }
        let inode = self.iget(ino)?;
        {
            let st = inode.state.lock();
            crate::file::check_live(&st)?;
            let r = &st.raw;
            match r.file_type() {
                S_IFREG => {}
                S_IFDIR => return Err(Error::IsDir),
                _ => {
                    return Err(Error::Invalid(
                        "verity on a file that is not regular".into(),
                    ))
                }
            }
            if r.flags() & FL_APPEND != 0 {
                return Err(Error::Perm);
            }
            if r.flags() & FL_VERITY != 0 {
                return Err(Error::Exists);
            }
        }
        // ENOKEY before anything changes.
        let key = self.contents_key(ino)?;
        let _g = inode.io_lock.write();
        let (params, times) = self.begin_enable_verity(&inode, args)?;
        let built = self.build_verity(&inode, key.as_deref(), &params, args);
        self.end_enable_verity(&inode, built.as_ref().ok(), times)?;
        built.map(drop)
    }

    /// ext4_begin_enable_verity: inline data converted, buffered data written back, blocks
    /// past the end removed (the descriptor is found from the last one), and the inode put on
    /// the orphan list. Returns the tree's shape and the times to keep.
    fn begin_enable_verity(
        &self,
        inode: &Inode,
        args: &VerityArgs,
    ) -> Result<(MerkleParams, [crate::format::inode::Timestamp; 2])> {
        self.inline_convert_file(inode)?;
        if inode.state.lock().delalloc.is_some() {
            self.delalloc_writeback_locked(inode)?;
        }
        let (size, times) = {
            let st = inode.state.lock();
            if Self::uses_blockmap(&st.raw) {
                return Err(Error::NotSupported(
                    "verity is only allowed on extent-based files".into(),
                ));
            }
            (st.raw.size(), [st.raw.mtime(), st.raw.ctime()])
        };
        let log = args.block_size.trailing_zeros();
        let params = MerkleParams::new(
            args.hash_algorithm,
            log,
            &args.salt,
            size,
            self.geo.block_size,
        )
        .map_err(|e| Error::Invalid(format!("verity: {e}")))?;
        self.cut_past_eof(inode, true)?;
        Ok((params, times))
    }

    /// Frees every block past the end of the file, and puts the inode on the orphan list
    /// (`orphan`) or takes it off.
    fn cut_past_eof(&self, inode: &Inode, orphan: bool) -> Result<()> {
        let first = {
            let st = inode.state.lock();
            st.raw
                .size()
                .div_ceil(self.geo.block_size as u64)
                .min(1 << 32)
        };
        self.remove_in_pieces(inode, first as u32, 1 << 32)?;
        let mut h = self.start(credits::UNLINK)?;
        let mut st = inode.state.lock();
        crate::file::check_live(&st)?;
        if Self::has_data_blocks(&st.raw) && first < 1 << 32 {
            self.ext_remove(&mut h, inode.ino, &mut st, first as u32, 1 << 32)?;
        }
        if orphan && !st.orphaned {
            self.orphan_add(&mut h, inode, &mut st)?;
        } else if !orphan && st.orphaned {
            self.orphan_del(&mut h, inode, &mut st)?;
        }
        self.mark_inode_dirty(&mut h, inode, &mut st)
    }

    /// build_merkle_tree and ext4_write_verity_descriptor: hashes the data, writes the tree
    /// past the end (each level's blocks gathered into runs of up to a megabyte), then the
    /// descriptor and its size. Returns the descriptor.
    fn build_verity(
        &self,
        inode: &Inode,
        key: Option<&InodeKey>,
        params: &MerkleParams,
        args: &VerityArgs,
    ) -> Result<Descriptor> {
        let size = params.data_size;
        let bs = params.block_size;
        let base = metadata_pos(size);
        // Per level: the first tree block of the run gathered, and its bytes.
        let mut runs: Vec<(u64, Vec<u8>)> = vec![(0, Vec::new()); params.num_levels()];
        let level_of = |idx: u64| {
            (0..params.num_levels())
                .find(|&l| idx >= params.level_start[l])
                .unwrap_or(0)
        };
        let write_run = |run: &mut (u64, Vec<u8>)| -> Result<()> {
            if !run.1.is_empty() {
                let at = base + (run.0 << params.log_blocksize);
                self.write_past_eof(inode, key, at, &run.1)?;
                run.1.clear();
            }
            Ok(())
        };
        let mut builder = TreeBuilder::new(params);
        let mut out = |idx: u64, block: &[u8]| -> Result<()> {
            let run = &mut runs[level_of(idx)];
            if run.1.len() >= CHUNK {
                write_run(run)?;
            }
            if run.1.is_empty() {
                run.0 = idx;
            }
            run.1.extend_from_slice(block);
            Ok(())
        };
        let mut chunk = vec![0u8; CHUNK];
        let mut pos = 0;
        while pos < size {
            let n = (size - pos).min(CHUNK as u64) as usize;
            self.read_plain(inode, key, pos, &mut chunk[..n])?;
            for block in chunk[..n].chunks(bs) {
                builder.push_data(block, &mut out)?;
            }
            pos += n as u64;
        }
        let root = builder.finish(&mut out)?;
        for run in runs.iter_mut() {
            write_run(run)?;
        }
        let mut root_hash = [0u8; 64];
        root_hash[..root.len()].copy_from_slice(&root);
        let desc = Descriptor {
            hash_algorithm: params.alg.id(),
            log_blocksize: params.log_blocksize as u8,
            salt: args.salt.clone(),
            data_size: size,
            root_hash,
            signature: args.signature.clone(),
        };
        let bytes = desc.to_bytes();
        let fs_bs = self.geo.block_size as u64;
        let (desc_pos, size_pos) =
            descriptor_layout(size, params.tree_size, bytes.len() as u64, fs_bs);
        self.write_past_eof(inode, key, desc_pos, &bytes)?;
        let word = (bytes.len() as u32).to_le_bytes();
        self.write_past_eof(inode, key, size_pos, &word)?;
        Ok(desc)
    }

    /// The file's bytes at `off`, inside or past its end, as its reader sees them: the
    /// stored bytes, or with `key` the plaintext of its encrypted blocks (a hole reads as
    /// zeros, never decrypted).
    fn read_plain(
        &self,
        inode: &Inode,
        key: Option<&InodeKey>,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let Some(key) = key else {
            return self.read_mapped(inode, off, buf);
        };
        let raw = |at: u64, b: &mut [u8]| self.read_mapped(inode, at, b).map(|()| b.len());
        self.read_encrypted(key, raw, off, buf).map(drop)
    }

    /// Writes `data` at `off`, past the end of the file, leaving its size (ext4's
    /// pagecache_write); with `key`, the blocks it touches are read, changed and written
    /// back whole, encrypted (the descriptor and its size word share a block). The caller
    /// holds the io_lock exclusively.
    fn write_past_eof(
        &self,
        inode: &Inode,
        key: Option<&InodeKey>,
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        if off + data.len() as u64 > self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        let size = inode.state.lock().raw.size();
        let Some(key) = key else {
            return self.write_new_blocks_locked(inode, off, data, size);
        };
        let bs = self.geo.block_size as u64;
        let start = off / bs * bs;
        let end = (off + data.len() as u64).div_ceil(bs) * bs;
        let mut blocks = vec![0u8; (end - start) as usize];
        self.read_plain(inode, Some(key), start, &mut blocks)?;
        let at = (off - start) as usize;
        blocks[at..at + data.len()].copy_from_slice(data);
        for (i, block) in blocks.chunks_mut(bs as usize).enumerate() {
            key.encrypt_block(start / bs + i as u64, block)?;
        }
        self.write_new_blocks_locked(inode, start, &blocks, size)
    }

    /// ext4_end_enable_verity: on success the flag set and the inode taken off the orphan list
    /// in one handle, its times as they were; on failure what was written past the end
    /// removed, and the inode off the list.
    fn end_enable_verity(
        &self,
        inode: &Inode,
        built: Option<&Descriptor>,
        times: [crate::format::inode::Timestamp; 2],
    ) -> Result<()> {
        if built.is_none() {
            return self.cut_past_eof(inode, false);
        }
        let mut h = self.start(credits::UNLINK)?;
        let mut st = inode.state.lock();
        crate::file::check_live(&st)?;
        if st.orphaned {
            self.orphan_del(&mut h, inode, &mut st)?;
        }
        let flags = st.raw.flags() | FL_VERITY;
        st.raw.set_flags(flags);
        st.raw.set_mtime(times[0]);
        st.raw.set_ctime(times[1]);
        st.verity = None;
        self.mark_inode_dirty(&mut h, inode, &mut st)
    }
}
