//! A name as a directory operation looks for it: the kernel's `struct ext4_filename`, set up
//! once per operation from the name the caller gave and the directory it is looked for in.
//!
//! In a plain directory a name matches an entry of the same bytes and hashes as those bytes.
//! In a casefolded directory (the casefold flag, on a filesystem with the casefold feature)
//! it matches an entry whose name folds the same (format/casefold.rs), and the hashed index
//! hashes the folded bytes, as fs/ext4/hash.c does; a name that is not valid UTF-8 keeps the
//! plain rules.
//!
//! Entries already in a directory are hashed with [`Fs::entry_hash_bytes`], the same rule,
//! so that an index split or a readdir cookie agrees with a lookup.

use crate::format::casefold::{casefold, FoldedName};
use crate::flags::FL_CASEFOLD;
use crate::fs::Fs;
use crate::inode::InodeState;
use std::borrow::Cow;

/// A name prepared for comparisons against one directory's entries.
#[derive(Debug, Clone)]
pub(crate) struct Fname<'a> {
    usr: &'a [u8],
    /// Where the directory is casefolded: the name with its folding.
    ci: Option<FoldedName<'a>>,
}

impl<'a> Fname<'a> {
    /// The name as the caller gave it (and as a new entry stores it).
    pub(crate) fn usr(&self) -> &'a [u8] {
        self.usr
    }

    /// Whether the directory entry named `disk` is this name.
    pub(crate) fn matches(&self, disk: &[u8]) -> bool {
        match &self.ci {
            Some(f) => f.matches(disk),
            None => disk == self.usr,
        }
    }

    /// The bytes the hashed index hashes for this name.
    pub(crate) fn hash_bytes(&self) -> &[u8] {
        match self.ci.as_ref().and_then(|f| f.folded()) {
            Some(folded) => folded,
            None => self.usr,
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
    pub(crate) fn fname<'a>(&self, st: &InodeState, name: &'a [u8]) -> Fname<'a> {
        let ci = (self.is_casefolded(st) && name != b"." && name != b"..")
            .then(|| FoldedName::new(name));
        Fname { usr: name, ci }
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
