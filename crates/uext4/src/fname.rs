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
//! Entries already in a directory are hashed with [`Fs::entry_hash_bytes`], the same rule,
//! so that an index split or a readdir cookie agrees with a lookup.

use crate::crypto::NokeyName;
use crate::encrypt::Crypt;
use crate::error::{Error, Result};
use crate::flags::FL_CASEFOLD;
use crate::format::casefold::{casefold, FoldedName};
use crate::fs::Fs;
use crate::inode::InodeState;
use std::borrow::Cow;

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

    /// Whether the directory entry named `disk` is this name.
    pub(crate) fn matches(&self, disk: &[u8]) -> bool {
        match &self.crypt {
            Some(CryptName::Disk(d)) => return disk == &d[..],
            Some(CryptName::Nokey(n)) => return n.matches(disk),
            Some(CryptName::NoMatch) => return false,
            None => {}
        }
        match &self.ci {
            Some(f) => f.matches(disk),
            None => disk == self.usr,
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

    /// The (hash, minor hash) a no-key name carries: the index is searched under it.
    pub(crate) fn given_hash(&self) -> Option<(u32, u32)> {
        match &self.crypt {
            Some(CryptName::Nokey(n)) => Some(n.dirhash()),
            Some(CryptName::NoMatch) => Some((0, 0)),
            _ => None,
        }
    }

    /// The name a new entry stores: the encrypted name in an encrypted directory (ENOKEY
    /// without the key).
    pub(crate) fn disk_name(&self) -> Result<Cow<'_, [u8]>> {
        match &self.crypt {
            Some(CryptName::Disk(d)) => Ok(Cow::Borrowed(d)),
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

    /// `name` prepared for lookups in directory `st`.
    pub(crate) fn fname<'a>(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &'a [u8],
    ) -> Result<Fname<'a>> {
        let dots = name == b"." || name == b"..";
        let mut crypt = None;
        if !dots && crate::encrypt::is_encrypted(&st.raw) {
            if self.is_casefolded(st) {
                return Err(Error::NotSupported(
                    "encrypted casefolded directories".into(),
                ));
            }
            crypt = Some(match self.crypt(dir, st)? {
                Crypt::Plain => None,
                Crypt::Key(k) => Some(CryptName::Disk(k.encrypt_name(name)?)),
                Crypt::NoKey(_) => Some(match crate::crypto::nokey_name_decode(name) {
                    Ok(n) => CryptName::Nokey(n),
                    Err(_) => CryptName::NoMatch,
                }),
            })
            .flatten();
        }
        let ci =
            (crypt.is_none() && self.is_casefolded(st) && !dots).then(|| FoldedName::new(name));
        Ok(Fname {
            usr: name,
            ci,
            crypt,
        })
    }

    /// The name a new entry for `name` stores in directory `st`: `name` itself, or in an
    /// encrypted directory its encrypted form (ENOKEY without the key). Plain and casefolded
    /// directories prepare nothing (the index folds the name once, when it hashes it).
    pub(crate) fn disk_name<'a>(
        &self,
        dir: u32,
        st: &mut InodeState,
        name: &'a [u8],
    ) -> Result<Cow<'a, [u8]>> {
        if !crate::encrypt::is_encrypted(&st.raw) {
            return Ok(Cow::Borrowed(name));
        }
        Ok(Cow::Owned(
            self.fname(dir, st, name)?.disk_name()?.into_owned(),
        ))
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
