//! A name as a directory operation looks for it: the kernel's `struct ext4_filename`, set up
//! once per operation from the name the caller gave and the directory it is looked for in.
//!
//! In a plain directory a name matches an entry of the same bytes and hashes as those bytes.
//! In a casefolded directory (the casefold flag, on a filesystem with the casefold feature)
//! it matches an entry whose name folds the same (format/casefold.rs), and the hashed index
//! hashes the folded bytes, as fs/ext4/hash.c does; a name that is not valid UTF-8 keeps the
//! plain rules.
//!
//! In an encrypted directory (fs/crypto/fname.c's fscrypt_setup_filename, fscrypt_match_name),
//! with the key, the entry's name is the encrypted name and the index hashes that
//! ciphertext; without the key, the name given is a no-key name: it matches by its
//! ciphertext (or prefix and digest) and carries the hash to look in the index under. A
//! new entry needs the key (ENOKEY).
//!
//! In a directory both encrypted and casefolded (ext4_hash_in_dirent), with the key, the
//! name matches an entry whose decrypted name folds the same, and its hash is the SipHash of
//! the folded plaintext under the directory's dirhash key (ext4_fname_setup_ci_filename,
//! fscrypt_fname_siphash): a ciphertext cannot be hashed by its folding, so every entry of
//! such a directory stores its (hash, minor hash) after the name (`ext4_dir_entry_hash`),
//! and the index, readdir and no-key names use that stored hash. Without the key the name
//! is a no-key name as in any encrypted directory, carrying the stored hash it was listed
//! with.
//!
//! Entries already in a directory are hashed with [`Fs::entry_hash_bytes`], the same rule,
//! so that an index split or a readdir cookie agrees with a lookup (or, where the hash is in
//! the entry, read from it: [`stored_hash`]).

use crate::crypto::{InodeKey, NokeyName};
use crate::encrypt::Crypt;
use crate::error::{Error, Result};
use crate::flags::FL_CASEFOLD;
use crate::format::casefold::{casefold, FoldedName};
use crate::format::dir_entry::{rec_len_for, DIRENT_HEADER};
use crate::format::le32;
use crate::fs::Fs;
use crate::inode::InodeState;
use std::borrow::Cow;
use std::sync::Arc;

/// The (hash, minor hash) of a name, as `struct ext4_dir_entry_hash` stores it.
pub(crate) type DirentHash = (u32, u32);

/// Size of `struct ext4_dir_entry_hash` (hash, minor hash), stored after the name in the
/// entries of encrypted casefolded directories.
pub(crate) const DIRENT_HASH_SIZE: usize = 8;

/// ext4_dir_rec_len: the rec_len an entry with a `name_len`-byte name needs, with room for
/// the stored hash where `hashed` (ext4_hash_in_dirent, and not "." or "..").
pub(crate) fn dirent_rec_len(name_len: usize, hashed: bool) -> usize {
    rec_len_for(name_len) + if hashed { DIRENT_HASH_SIZE } else { 0 }
}

/// Whether an entry's name is "." or ".." (is_fake_dir_entry: these never store a hash).
pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// EXT4_DIRENT_HASH / EXT4_DIRENT_MINOR_HASH: the (hash, minor hash) stored after the name
/// of the entry at `off` (rec_len `rec_len`) of block `b`; None where the entry has no room
/// for them (a corrupt entry: the caller reports it).
pub(crate) fn stored_hash(b: &[u8], off: usize, rec_len: usize) -> Option<(u32, u32)> {
    let name_len = *b.get(off + 6)? as usize;
    if rec_len < dirent_rec_len(name_len, true) || off + rec_len > b.len() {
        return None;
    }
    let at = off + rec_len_for(name_len);
    debug_assert!(at >= off + DIRENT_HEADER + name_len);
    Some((le32(b, at), le32(b, at + 4)))
}

/// Writes the stored hash of the entry at `off` (its name already written).
pub(crate) fn put_stored_hash(b: &mut [u8], off: usize, (hash, minor): (u32, u32)) {
    let at = off + rec_len_for(b[off + 6] as usize);
    crate::format::put32(b, at, hash);
    crate::format::put32(b, at + 4, minor);
}

/// A name prepared for comparisons against one directory's entries.
#[derive(Debug, Clone)]
pub(crate) struct Fname<'a> {
    usr: &'a [u8],
    /// Where the directory is casefolded: the name with its folding.
    ci: Option<FoldedName<'a>>,
    /// Where the directory is encrypted: the name as its entries store it.
    crypt: Option<CryptName>,
}

/// A name in an encrypted directory.
#[derive(Debug, Clone)]
enum CryptName {
    /// With the key: the encrypted name, as stored.
    Disk(Vec<u8>),
    /// With the key, in a casefolded directory: the encrypted name a new entry stores, the
    /// key that decrypts the entries compared, and the SipHash of the folded name.
    Folded {
        disk: Vec<u8>,
        key: Arc<InodeKey>,
        hash: (u32, u32),
    },
    /// Without it: the decoded no-key name.
    Nokey(NokeyName),
    /// Without it, a name that is no no-key name: it matches no entry (as the kernel's
    /// lookup finds nothing), and cannot be added (ENOKEY).
    NoMatch,
}

impl<'a> Fname<'a> {
    /// The name as the caller gave it (and as a new entry stores it).
    pub(crate) fn usr(&self) -> &'a [u8] {
        self.usr
    }

    /// Whether the directory entry named `disk` is this name. `stored`: the hash the entry
    /// stores, in an encrypted casefolded directory.
    pub(crate) fn matches(&self, disk: &[u8], stored: Option<(u32, u32)>) -> bool {
        match &self.crypt {
            Some(CryptName::Disk(d)) => return disk == &d[..],
            Some(CryptName::Folded { key, hash, .. }) => {
                return self.matches_folded(key, *hash, disk, stored)
            }
            Some(CryptName::Nokey(n)) => return n.matches(disk),
            Some(CryptName::NoMatch) => return false,
            None => {}
        }
        match &self.ci {
            Some(f) => f.matches(disk),
            None => disk == self.usr,
        }
    }

    /// ext4_match in an encrypted casefolded directory with the key: a stored hash that
    /// differs rules the entry out without decrypting it (where the name folds: equal
    /// foldings hash the same); otherwise the entry's decrypted name is compared by folding
    /// (an entry that does not decrypt matches nothing).
    fn matches_folded(
        &self,
        key: &InodeKey,
        hash: (u32, u32),
        disk: &[u8],
        stored: Option<(u32, u32)>,
    ) -> bool {
        let folds = self.ci.as_ref().is_some_and(|f| f.folded().is_some());
        if folds && stored.is_some_and(|s| s != hash) {
            return false;
        }
        let Ok(plain) = key.decrypt_name(disk) else {
            return false;
        };
        match &self.ci {
            Some(f) => f.matches(&plain),
            None => plain == self.usr,
        }
    }

    /// The (hash, minor hash) a new entry stores after its name: Some in an encrypted
    /// casefolded directory (with the key).
    pub(crate) fn dirent_hash(&self) -> Option<(u32, u32)> {
        match &self.crypt {
            Some(CryptName::Folded { hash, .. }) => Some(*hash),
            _ => None,
        }
    }

    /// The bytes the hashed index hashes for this name.
    pub(crate) fn hash_bytes(&self) -> &[u8] {
        if let Some(CryptName::Disk(d)) = &self.crypt {
            return d;
        }
        match self.ci.as_ref().and_then(|f| f.folded()) {
            Some(folded) => folded,
            None => self.usr,
        }
    }

    /// The (hash, minor hash) the index is searched under where it is not the hash of
    /// [`Fname::hash_bytes`]: the one a no-key name carries, or the SipHash of an encrypted
    /// casefolded directory's name.
    pub(crate) fn given_hash(&self) -> Option<(u32, u32)> {
        match &self.crypt {
            Some(CryptName::Nokey(n)) => Some(n.dirhash()),
            Some(CryptName::Folded { hash, .. }) => Some(*hash),
            Some(CryptName::NoMatch) => Some((0, 0)),
            _ => None,
        }
    }

    /// The name a new entry stores: the encrypted name in an encrypted directory (ENOKEY
    /// without the key).
    pub(crate) fn disk_name(&self) -> Result<Cow<'_, [u8]>> {
        match &self.crypt {
            Some(CryptName::Disk(d) | CryptName::Folded { disk: d, .. }) => Ok(Cow::Borrowed(d)),
            Some(CryptName::Nokey(_) | CryptName::NoMatch) => Err(Error::NoKey(
                "encryption key of the directory (a name cannot be added without it)".into(),
            )),
            None => Ok(Cow::Borrowed(self.usr)),
        }
    }
}

impl Fs {
    /// Whether directory `dir` compares names by their folding (a casefolded directory: the
    /// casefold flag on a filesystem with the casefold feature). False for anything that is
    /// not such a directory, or no inode at all.
    pub fn folds_names(&self, dir: u32) -> bool {
        if !self.geo.casefold {
            return false;
        }
        self.iget(dir)
            .map(|inode| self.is_casefolded(&inode.state.lock()))
            .unwrap_or(false)
    }

    /// Whether directory `st` compares names by their folding.
    pub(crate) fn is_casefolded(&self, st: &InodeState) -> bool {
        self.geo.casefold && st.raw.flags() & FL_CASEFOLD != 0
    }

    /// ext4_hash_in_dirent: whether the entries of directory `st` store their hash after
    /// the name (encrypted and casefolded).
    pub(crate) fn hash_in_dirent(&self, st: &InodeState) -> bool {
        self.is_casefolded(st) && crate::encrypt::is_encrypted(&st.raw)
    }

    /// `name` prepared for lookups in directory `st`.
    pub(crate) fn fname<'a>(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &'a [u8],
    ) -> Result<Fname<'a>> {
        let dots = name == b"." || name == b"..";
        let mut crypt = None;
        let mut ci = None;
        if !dots && crate::encrypt::is_encrypted(&st.raw) {
            let folded = self.is_casefolded(st);
            crypt = Some(match self.crypt(dir, st)? {
                Crypt::Plain => None,
                Crypt::Key(k) if folded => {
                    let f = FoldedName::new(name);
                    let hash = k.ext4_dirhash(f.folded().unwrap_or(name))?;
                    let disk = k.encrypt_name(name)?;
                    ci = Some(f);
                    Some(CryptName::Folded { disk, key: k, hash })
                }
                Crypt::Key(k) => Some(CryptName::Disk(k.encrypt_name(name)?)),
                Crypt::NoKey(_) => Some(match crate::crypto::nokey_name_decode(name) {
                    Ok(n) => CryptName::Nokey(n),
                    Err(_) => CryptName::NoMatch,
                }),
            })
            .flatten();
        }
        if crypt.is_none() && self.is_casefolded(st) && !dots {
            ci = Some(FoldedName::new(name));
        }
        Ok(Fname {
            usr: name,
            ci,
            crypt,
        })
    }

    /// The name a new entry for `name` stores in directory `st`: `name` itself, or in an
    /// encrypted directory its encrypted form (ENOKEY without the key), with the hash the
    /// entry stores after it in an encrypted casefolded directory. Plain and casefolded
    /// directories prepare nothing (the index folds the name once, when it hashes it).
    pub(crate) fn disk_name<'a>(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &'a [u8],
    ) -> Result<(Cow<'a, [u8]>, Option<DirentHash>)> {
        if !crate::encrypt::is_encrypted(&st.raw) {
            return Ok((Cow::Borrowed(name), None));
        }
        let f = self.fname(dir, st, name)?;
        Ok((Cow::Owned(f.disk_name()?.into_owned()), f.dirent_hash()))
    }

    /// The bytes the index hashes for an entry named `name` already in directory `st`.
    pub(crate) fn entry_hash_bytes<'n>(&self, st: &InodeState, name: &'n [u8]) -> Cow<'n, [u8]> {
        if self.is_casefolded(st) {
            if let Some(f) = casefold(name) {
                return Cow::Owned(f);
            }
        }
        Cow::Borrowed(name)
    }
}
