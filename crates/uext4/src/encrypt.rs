//! The engine's side of fscrypt (the `encrypt` feature): which inodes are encrypted, their
//! contexts and keys, and the data and name paths that go through crypto/.
//!
//! - An inode is encrypted when it has EXT4_ENCRYPT_FL; its context is the `c` xattr
//!   (index 9). Its key is derived at first use from the master keys given at mount
//!   ([`MountOptions::keys`](crate::MountOptions::keys)) and kept in its in-memory state,
//!   so that it goes when the inode leaves the cache.
//! - Names in an encrypted directory are stored encrypted and hashed as ciphertext
//!   (fname.rs), or in a casefolded one by the SipHash of the folded plaintext, stored in
//!   each entry (ext4_hash_in_dirent); without the key they are listed as no-key names and can be looked up and
//!   removed by them.
//! - A regular file's data is encrypted one block at a time (the data unit is the block):
//!   its reads and writes go through [`Fs::read_encrypted`] and [`Fs::write_encrypted`],
//!   which move whole ciphertext blocks through the plain data paths (direct, buffered,
//!   DAX alike) and decrypt or encrypt them here. A block of zeros on the device is a
//!   hole (or unwritten) and reads as zeros, as the kernel leaves holes unencrypted.

use std::sync::Arc;

use crate::cred::Cred;
use crate::crypto::{
    Context, EncryptionPolicy, InodeKey, InodeKind, XATTR_INDEX_ENCRYPTION, XATTR_NAME_CONTEXT,
};
use crate::error::{Error, Result};
use crate::flags::FL_ENCRYPT;
use crate::format::features::COMPAT_STABLE_INODES;
use crate::format::inode::{RawInode, S_IFDIR, S_IFLNK, S_IFREG};
use crate::fs::Fs;
use crate::icache::InodeState;

/// Whether an inode is encrypted (EXT4_ENCRYPT_FL).
pub(crate) fn is_encrypted(raw: &RawInode) -> bool {
    raw.flags() & FL_ENCRYPT != 0
}

/// The `c` xattr holding context `ctx`.
pub(crate) fn context_entry(ctx: &Context) -> crate::format::xattr::XattrEntry {
    crate::format::xattr::XattrEntry {
        index: XATTR_INDEX_ENCRYPTION,
        name: XATTR_NAME_CONTEXT.to_vec(),
        value: ctx.to_bytes(),
        ea: None,
    }
}

/// What an inode's encryption asks of an operation.
pub(crate) enum Crypt {
    /// Not encrypted.
    Plain,
    /// Encrypted, with its key.
    Key(Arc<InodeKey>),
    /// Encrypted, without its key: the key's public name (descriptor or identifier).
    NoKey(String),
}

impl Crypt {
    /// The key, or ENOKEY naming the missing one; None for plain inodes.
    pub(crate) fn require(&self) -> Result<Option<&Arc<InodeKey>>> {
        match self {
            Crypt::Plain => Ok(None),
            Crypt::Key(k) => Ok(Some(k)),
            Crypt::NoKey(k) => Err(Error::NoKey(format!("encryption key {k}"))),
        }
    }
}

fn kind_of(raw: &RawInode) -> Option<InodeKind> {
    match raw.file_type() {
        S_IFREG => Some(InodeKind::Regular),
        S_IFDIR => Some(InodeKind::Directory),
        S_IFLNK => Some(InodeKind::Symlink),
        _ => None,
    }
}

impl Fs {
    /// The encryption context of inode `ino` (its `c` xattr).
    pub(crate) fn crypt_context(&self, ino: u32, raw: &RawInode) -> Result<Context> {
        let loaded = self.xattr_load(ino, raw)?;
        let e = loaded
            .ibody
            .iter()
            .chain(loaded.block.iter())
            .find(|e| e.index == XATTR_INDEX_ENCRYPTION && e.name == XATTR_NAME_CONTEXT)
            .ok_or_else(|| {
                Error::corrupt(
                    crate::error::Corruption::Xattr,
                    format!("inode {ino}: encrypted, but has no encryption context"),
                )
            })?;
        Context::parse(&e.value).map_err(|err| {
            Error::corrupt(
                crate::error::Corruption::Xattr,
                format!("inode {ino}: {err}"),
            )
        })
    }

    /// The encryption of inode `ino` (state `st`), its key derived and cached on first use.
    pub(crate) fn crypt(&self, ino: u32, st: &mut InodeState) -> Result<Crypt> {
        if !is_encrypted(&st.raw) {
            return Ok(Crypt::Plain);
        }
        if let Some(k) = &st.crypt {
            return Ok(Crypt::Key(k.clone()));
        }
        let Some(kind) = kind_of(&st.raw) else {
            // Special files carry a context but nothing encrypted.
            return Ok(Crypt::Plain);
        };
        let ctx = self.crypt_context(ino, &st.raw)?;
        if self.keyring.lookup(&ctx.policy).is_none() {
            return Ok(Crypt::NoKey(ctx.policy.key.to_string()));
        }
        let key = Arc::new(self.keyring.inode_key(&ctx, kind, ino, &self.geo.uuid)?);
        st.crypt = Some(key.clone());
        Ok(Crypt::Key(key))
    }

    /// The encryption of inode `ino`, by number.
    pub(crate) fn crypt_of(&self, ino: u32) -> Result<Crypt> {
        let inode = self.iget(ino)?;
        let mut st = inode.state.lock();
        self.crypt(ino, &mut st)
    }

    /// The name a directory entry shows: decrypted with the key, the kernel's no-key name
    /// without it (with the dirhash where ext4's readdir gives one: `dirhash`).
    pub(crate) fn shown_name(
        &self,
        crypt: &Crypt,
        disk: &[u8],
        dirhash: impl FnOnce() -> Option<(u32, u32)>,
    ) -> Result<Vec<u8>> {
        if disk == b"." || disk == b".." {
            return Ok(disk.to_vec());
        }
        match crypt {
            Crypt::Plain => Ok(disk.to_vec()),
            Crypt::Key(k) => Ok(k.decrypt_name(disk)?),
            Crypt::NoKey(_) => Ok(crate::crypto::nokey_name(disk, dirhash())),
        }
    }

    /// Reads `buf.len()` bytes at `off` (inside the size) of an encrypted regular file:
    /// whole blocks through the plain read path, each decrypted.
    pub(crate) fn read_encrypted(
        &self,
        key: &InodeKey,
        raw_read: impl FnOnce(u64, &mut [u8]) -> Result<usize>,
        off: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let bs = self.geo.block_size as u64;
        let start = off / bs * bs;
        let end = (off + buf.len() as u64).div_ceil(bs) * bs;
        let mut blocks = vec![0u8; (end - start) as usize];
        let n = raw_read(start, &mut blocks)?;
        // The last block is read whole even past the size: its ciphertext covers it.
        let _ = n;
        for (i, chunk) in blocks.chunks_mut(bs as usize).enumerate() {
            if chunk.iter().all(|&b| b == 0) {
                continue; // a hole or unwritten: zeros, never encrypted
            }
            key.decrypt_block(start / bs + i as u64, chunk)?;
        }
        let at = (off - start) as usize;
        buf.copy_from_slice(&blocks[at..at + buf.len()]);
        Ok(buf.len())
    }

    /// The hash version ext4's readdir puts in no-key names of directory `dir`: None where
    /// it reads linearly (no dir_index, or a linear directory of more than one block).
    pub(crate) fn nokey_hash_version(&self, dir: u32, st: &mut InodeState) -> Result<Option<u8>> {
        if !self.geo.dir_index {
            return Ok(None);
        }
        if Self::is_inline(&st.raw) || (!Self::has_index_flag(st) && self.dir_blocks(st) == 1) {
            let def = self.geo.def_hash_version;
            let v = if def <= 2 && self.geo.unsigned_hash {
                def + 3
            } else {
                def
            };
            return Ok(Some(v));
        }
        if Self::has_index_flag(st) {
            let p0 = self.dir_pblk(dir, st, 0)?;
            let v = self.dir_hash_version(&self.bcache.get(p0)?.read());
            return Ok(Some(v));
        }
        Ok(None)
    }

    /// fscrypt_prepare_setflags: casefolding an encrypted directory needs its key (ENOKEY)
    /// and a v2 policy (EINVAL), whose dirhash key hashes the names.
    pub(crate) fn crypt_prepare_casefold(&self, ino: u32, st: &mut InodeState) -> Result<()> {
        if !is_encrypted(&st.raw) {
            return Ok(());
        }
        let crypt = self.crypt(ino, st)?;
        if let Some(k) = crypt.require()? {
            if k.dirhash_key.is_none() {
                return Err(Error::Invalid(
                    "casefolding an encrypted directory needs a v2 encryption policy".into(),
                ));
            }
        }
        Ok(())
    }

    /// Whether inode `ino` is encrypted.
    pub(crate) fn dir_is_encrypted(&self, ino: u32) -> Result<bool> {
        Ok(is_encrypted(&self.iget(ino)?.state.lock().raw))
    }

    /// fscrypt_has_permitted_context: whether inode `child` may have a name in directory
    /// `dir` (same policy where `dir` is encrypted; special files anywhere).
    fn permitted_in(&self, dir: u32, child: u32) -> Result<bool> {
        let d = self.iget(dir)?;
        let draw = d.state.lock().raw.clone();
        if !is_encrypted(&draw) {
            return Ok(true);
        }
        let c = self.iget(child)?;
        let craw = c.state.lock().raw.clone();
        if kind_of(&craw).is_none() {
            return Ok(true);
        }
        if !is_encrypted(&craw) {
            return Ok(false);
        }
        Ok(self.crypt_context(dir, &draw)?.policy == self.crypt_context(child, &craw)?.policy)
    }

    /// The key of an encrypted directory, required (ENOKEY).
    fn require_dir_key(&self, dir: u32) -> Result<()> {
        let d = self.iget(dir)?;
        let mut st = d.state.lock();
        self.crypt(dir, &mut st)?.require()?;
        Ok(())
    }

    /// fscrypt_prepare_link: a new name for `ino` in `dir`.
    pub(crate) fn may_link_crypt(&self, dir: u32, ino: u32) -> Result<()> {
        self.require_dir_key(dir)?;
        if !self.permitted_in(dir, ino)? {
            return Err(Error::CrossDevice);
        }
        Ok(())
    }

    /// fscrypt_prepare_rename: both directories' keys, and the moved inodes' policies.
    pub(crate) fn may_rename_crypt(
        &self,
        odir: u32,
        oname: &[u8],
        ndir: u32,
        nname: &[u8],
        exchange: bool,
    ) -> Result<()> {
        self.require_dir_key(odir)?;
        self.require_dir_key(ndir)?;
        if odir == ndir {
            return Ok(());
        }
        let old = self.lookup(odir, oname)?.ino;
        if !self.permitted_in(ndir, old)? {
            return Err(Error::CrossDevice);
        }
        if exchange {
            let new = self.lookup(ndir, nname)?.ino;
            if !self.permitted_in(odir, new)? {
                return Err(Error::CrossDevice);
            }
        }
        Ok(())
    }

    /// The contents key of an encrypted regular file (ENOKEY without it); None for files
    /// that are not encrypted and for anything else.
    pub(crate) fn contents_key(&self, ino: u32) -> Result<Option<Arc<InodeKey>>> {
        let inode = self.iget(ino)?;
        let mut st = inode.state.lock();
        if st.raw.file_type() != S_IFREG || !is_encrypted(&st.raw) {
            return Ok(None);
        }
        Ok(self.crypt(ino, &mut st)?.require()?.cloned())
    }

    /// Plaintext of `[start, start + buf.len())`, block-aligned, of an encrypted file of
    /// size `size`: zeros past the size.
    fn read_plain_blocks(
        &self,
        key: &InodeKey,
        ino: u32,
        start: u64,
        buf: &mut [u8],
        size: u64,
    ) -> Result<()> {
        buf.fill(0);
        if start < size {
            let n = ((size - start) as usize).min(buf.len());
            self.read_encrypted(
                key,
                |o, b| self.read_inner_whole(ino, o, b),
                start,
                &mut buf[..n],
            )?;
        }
        Ok(())
    }

    /// Writes whole blocks of plaintext at `start` encrypted, then sets the size to
    /// `new_size` (the plain write path leaves it at the end of the last block).
    fn write_plain_blocks(
        &self,
        cred: Option<&crate::cred::Cred>,
        key: &InodeKey,
        ino: u32,
        start: u64,
        mut blocks: Vec<u8>,
        new_size: u64,
    ) -> Result<bool> {
        let bs = self.geo.block_size as u64;
        for (i, chunk) in blocks.chunks_mut(bs as usize).enumerate() {
            key.encrypt_block(start / bs + i as u64, chunk)?;
        }
        let mut done = 0;
        let mut changed = false;
        while done < blocks.len() {
            match self.write_inner_raw(cred, ino, start + done as u64, &blocks[done..])? {
                (0, _) => return Err(Error::NoSpace),
                (n, c) => {
                    done += n;
                    changed |= c;
                }
            }
        }
        let inode = self.iget(ino)?;
        if inode.state.lock().delalloc.is_some() {
            // Buffered: the whole blocks go down before the size is cut inside the last.
            let _g = inode.io_lock.write();
            self.delalloc_writeback_locked(&inode)?;
        }
        let mut h = self.start(crate::transaction::credits::SETATTR)?;
        let mut st = inode.state.lock();
        if st.raw.size() != new_size {
            st.raw.set_size(new_size);
            self.mark_inode_dirty(&mut h, &inode, &mut st)?;
        }
        Ok(changed)
    }

    /// A write to an encrypted regular file: the blocks it touches are read and decrypted
    /// (partial first and last), changed, encrypted and written whole.
    pub(crate) fn write_encrypted(
        &self,
        cred: Option<&crate::cred::Cred>,
        key: &InodeKey,
        ino: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(usize, bool)> {
        let _serial = self.crypt_write_lock.lock();
        if off.saturating_add(data.len() as u64) > self.max_file_size() {
            return Err(Error::FileTooBig);
        }
        let bs = self.geo.block_size as u64;
        let size = self.getattr(ino)?.size;
        let start = off / bs * bs;
        let end = (off + data.len() as u64).div_ceil(bs) * bs;
        let mut blocks = vec![0u8; (end - start) as usize];
        // Only the partial first and last blocks need their old contents.
        self.read_plain_blocks(key, ino, start, &mut blocks[..bs as usize], size)?;
        let last = end - bs;
        if last > start {
            let at = (last - start) as usize;
            self.read_plain_blocks(key, ino, last, &mut blocks[at..], size)?;
        }
        let at = (off - start) as usize;
        blocks[at..at + data.len()].copy_from_slice(data);
        let new_size = size.max(off + data.len() as u64);
        let changed = self.write_plain_blocks(cred, key, ino, start, blocks, new_size)?;
        Ok((data.len(), changed))
    }

    /// A truncate of an encrypted regular file: where the new size ends inside a block, the
    /// rest of that block is zeroed in the plaintext and the block encrypted again (the
    /// kernel's ext4_block_truncate_page does the same through the page cache).
    pub(crate) fn truncate_encrypted(&self, key: &InodeKey, ino: u32, size: u64) -> Result<()> {
        let _serial = self.crypt_write_lock.lock();
        let bs = self.geo.block_size as u64;
        let old = self.getattr(ino)?.size;
        if size >= old || size.is_multiple_of(bs) {
            return self.truncate_raw(ino, size);
        }
        let start = size / bs * bs;
        // A hole (stored zeros: read_encrypted's rule) stays one; a stored block is written
        // again, even where its plaintext is zeros, as its ciphertext's tail is about to be
        // zeroed by the plain truncate.
        let mut block = vec![0u8; bs as usize];
        self.read_inner_whole(ino, start, &mut block)?;
        let hole = block.iter().all(|&b| b == 0);
        if !hole {
            self.read_plain_blocks(key, ino, start, &mut block, old)?;
        }
        self.truncate_raw(ino, size)?;
        if hole {
            return Ok(());
        }
        block[(size - start) as usize..].fill(0);
        self.write_plain_blocks(None, key, ino, start, block, size)?;
        Ok(())
    }
}

impl Fs {
    /// FALLOC_FL_PUNCH_HOLE and FALLOC_FL_ZERO_RANGE on an encrypted file, as ext4 allows
    /// them (only collapse and insert are refused: they would move blocks under IVs made
    /// for other offsets). The whole blocks inside the range go through the plain path
    /// (freed, or made unwritten: both read as zeros); the partial blocks at its ends are
    /// decrypted, zeroed and encrypted again, as the kernel's ext4_zero_partial_blocks does
    /// through the page cache. A punch and a zeroing that keeps the size never reach past
    /// the end of the file; one that does not keep it extends the file to the range's end.
    /// `keeps_size`: the mode punches or has FALLOC_FL_KEEP_SIZE.
    pub(crate) fn fallocate_encrypted(
        &self,
        key: &InodeKey,
        ino: u32,
        (mode, keeps_size): (i32, bool),
        off: u64,
        len: u64,
    ) -> Result<()> {
        let bs = self.geo.block_size as u64;
        let end = off.checked_add(len).ok_or(Error::FileTooBig)?;
        let (inner_start, inner_end) = (off.div_ceil(bs) * bs, end / bs * bs);
        if inner_start < inner_end {
            // Whole blocks: freed, or freed and allocated again unwritten (never stored zeros
            // under an encrypted file: fallocate_prealloc).
            self.fallocate_plain(ino, mode, inner_start, inner_end - inner_start)?;
        }
        let edges = if inner_start < inner_end {
            [(off, inner_start), (inner_end, end)]
        } else {
            [(off, end), (end, end)]
        };
        for (from, to) in edges {
            let size = self.getattr(ino)?.size;
            let to = if keeps_size { to.min(size) } else { to };
            if from < to {
                self.write_encrypted(None, key, ino, from, &vec![0u8; (to - from) as usize])?;
            }
        }
        Ok(())
    }
}

/// What an inode's encryption looks like from outside (`uext4 stat`, lsattr's `E`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncryptionStatus {
    /// The inode's policy.
    pub policy: EncryptionPolicy,
    /// Whether its master key was given (so names and contents read as plaintext).
    pub key_present: bool,
}

impl Fs {
    /// FS_IOC_GET_ENCRYPTION_POLICY_EX: the policy of inode `ino`, or None where it is not
    /// encrypted (the kernel's ENODATA).
    pub fn encryption_policy(&self, ino: u32) -> Result<Option<EncryptionStatus>> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        if !is_encrypted(&st.raw) {
            return Ok(None);
        }
        let policy = self.crypt_context(ino, &st.raw)?.policy;
        Ok(Some(EncryptionStatus {
            policy: EncryptionPolicy(policy),
            key_present: self.keyring.lookup(&policy).is_some(),
        }))
    }

    /// FS_IOC_GET_ENCRYPTION_NONCE: the per-file nonce of encrypted inode `ino` (ENODATA
    /// where it is not encrypted).
    pub fn encryption_nonce(&self, ino: u32) -> Result<[u8; crate::crypto::NONCE_SIZE]> {
        let inode = self.iget(ino)?;
        let st = inode.state.lock();
        if !is_encrypted(&st.raw) {
            return Err(Error::NoAttr);
        }
        Ok(self.crypt_context(ino, &st.raw)?.nonce)
    }

    /// FS_IOC_GET_ENCRYPTION_KEY_STATUS for the keys given at open: whether the master key
    /// a key specifier names is present (8 bytes: a v1 descriptor; 16: a v2 identifier).
    pub fn has_encryption_key(&self, spec: &[u8]) -> bool {
        self.keyring.has_spec(spec)
    }

    /// [`Fs::set_encryption_policy_as`] as root (the image tools).
    pub fn set_encryption_policy(&self, ino: u32, policy: &EncryptionPolicy) -> Result<()> {
        self.set_encryption_policy_as(&Cred::root(), ino, policy)
    }

    /// FS_IOC_SET_ENCRYPTION_POLICY for `cred`, as fscrypt_ioctl_set_policy and
    /// ext4_set_context: on a filesystem with the `encrypt` feature (EOPNOTSUPP), by the
    /// owner or a privileged caller (EACCES); an inode that already has this policy is left
    /// alone and one with another is EEXIST; otherwise only an empty directory (ENOTDIR,
    /// ENOTEMPTY), never the root (EPERM, as e2fsck wants lost+found plain), with a policy
    /// the filesystem supports (EINVAL) and, for v2, whose key was given (ENOKEY). The
    /// context (a fresh nonce) is stored in the inode with EXT4_ENCRYPT_FL in one handle; an
    /// inline directory moves to a block first.
    pub fn set_encryption_policy_as(
        &self,
        cred: &Cred,
        ino: u32,
        policy: &EncryptionPolicy,
    ) -> Result<()> {
        self.stats
            .ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.check_writable()?;
        if !self.crypt_enabled {
            return Err(Error::NotSupported(
                "encryption on a filesystem without the encrypt feature".into(),
            ));
        }
        let inode = self.iget(ino)?;
        let _io = inode.io_lock.write();
        let mut h = self.start(crate::transaction::credits::XATTR)?;
        let mut st = inode.state.lock();
        if st.deleted || st.raw.links_count() == 0 {
            return Err(Error::NotFound);
        }
        if cred.uid != st.raw.uid() && !cred.privileged {
            return Err(Error::Access);
        }
        if is_encrypted(&st.raw) {
            return match self.crypt_context(ino, &st.raw)?.policy == policy.0 {
                true => Ok(()),
                false => Err(Error::Exists),
            };
        }
        if !st.raw.is_dir() {
            return Err(Error::NotDir);
        }
        if !self.dir_is_empty(ino, &mut st)? {
            return Err(Error::NotEmpty);
        }
        if ino == crate::format::inode::ROOT_INO {
            return Err(Error::Perm);
        }
        if st.raw.flags() & crate::flags::FL_DAX != 0 {
            return Err(Error::NotSupported("encryption of a DAX directory".into()));
        }
        let caps = crate::crypto::policy::FsCaps {
            blkbits: self.geo.block_size.trailing_zeros() as u8,
            stable_inodes: self.sb.lock().has_compat(COMPAT_STABLE_INODES),
            casefolded: st.raw.flags() & crate::flags::FL_CASEFOLD != 0,
        };
        policy
            .0
            .validate(&caps)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if policy.0.version == crate::crypto::PolicyVersion::V2
            && self.keyring.lookup(&policy.0).is_none()
        {
            // fscrypt_verify_key_added: a v2 policy names a key that must be there.
            return Err(Error::NoKey(format!("encryption key {}", policy.0.key)));
        }
        let ctx = policy.0.new_context()?;
        // ext4_set_context: an inline directory (empty here) moves to a block first, and no
        // encrypted inode goes inline (EXT4_STATE_MAY_INLINE_DATA ends).
        self.inline_convert(&mut h, ino, &mut st)?;
        st.may_inline = false;
        self.xattr_put_in(&mut h, ino, &mut st, vec![context_entry(&ctx)])?;
        let flags = st.raw.flags() | FL_ENCRYPT;
        st.raw.set_flags(flags);
        st.raw.set_ctime(self.now());
        st.crypt = None;
        self.mark_inode_dirty(&mut h, &inode, &mut st)
    }
}
