//! Case folding of names in casefolded directories, as the kernel's fs/unicode does it for the
//! `utf8-12.1` encoding (`s_encoding` 1), and the comparison ext4 makes with it.
//!
//! A name folds to its NFDICF: each character replaced by its full case folding or canonical
//! decomposition (fully expanded), Default_Ignorable_Code_Point characters dropped, Hangul
//! syllables decomposed, then each run of combining marks put in canonical order. The data is
//! Unicode 12.1's, generated into `casefold/tables.rs` by scripts/gen-casefold-tables.py;
//! characters Unicode assigned after 12.1 fold to themselves, as in the kernel. (Linux 6.12
//! briefly stopped dropping ignorable characters; the change was reverted, and e2fsprogs never
//! made it, so ignorables are dropped here too.)
//!
//! A name that is not valid UTF-8 has no folding: it is hashed as it is and matches only
//! itself, byte for byte (`strict` filesystems refuse to create such names).
//!
//! Pure functions, no I/O. The directory code uses [`casefold`] for the hash of a name in a
//! casefolded directory (fs/ext4/hash.c hashes the folded bytes) and [`FoldedName::matches`]
//! for lookups (fs/libfs.c generic_ci_match).

mod tables;

/// Folds `name` to its NFDICF bytes; None when `name` is not valid UTF-8 (surrogates,
/// overlong forms and code points past U+10FFFF included, as the kernel's table has no such
/// sequences).
pub fn casefold(name: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(name).ok()?;
    let mut chars: Vec<(u32, u8)> = Vec::with_capacity(name.len());
    for c in s.chars() {
        push_folded(c as u32, &mut chars);
    }
    canonical_order(&mut chars);
    let mut out = Vec::with_capacity(chars.len() + 8);
    let mut buf = [0u8; 4];
    for (c, _) in chars {
        // Every code point in the tables is a scalar value, so this cannot fail.
        if let Some(ch) = char::from_u32(c) {
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
    }
    Some(out)
}

/// Whether `name` is valid UTF-8 for the encoding (what strict mode requires of new names).
pub fn is_valid(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok()
}

/// A name looked up in a casefolded directory, with its folding computed once for all the
/// entries it is compared against.
#[derive(Debug, Clone)]
pub struct FoldedName<'a> {
    name: &'a [u8],
    folded: Option<Vec<u8>>,
}

impl<'a> FoldedName<'a> {
    /// Folds `name` for comparisons.
    pub fn new(name: &'a [u8]) -> Self {
        FoldedName {
            name,
            folded: casefold(name),
        }
    }

    /// The name as given.
    pub fn name(&self) -> &'a [u8] {
        self.name
    }

    /// The folded bytes, None for a name that is not valid UTF-8.
    pub fn folded(&self) -> Option<&[u8]> {
        self.folded.as_deref()
    }

    /// Whether the entry named `disk` matches: the same bytes, or both valid UTF-8 with the
    /// same folding (generic_ci_match: the byte comparison first, then the folded one).
    pub fn matches(&self, disk: &[u8]) -> bool {
        if disk == self.name {
            return true;
        }
        match &self.folded {
            Some(f) => folds_to(disk, f),
            None => false,
        }
    }
}

/// Whether `disk` is valid UTF-8 and folds to exactly `folded`, without building its folding
/// when a quick look already tells (the common case in a large directory: a different name).
///
/// An ASCII character is a starter that folds to one ASCII character (letters to lower case)
/// and no ASCII character is ignorable, so the folding of `disk` begins with its ASCII prefix
/// in lower case, whatever follows: a prefix that differs rejects the name without folding
/// the rest, and an all-ASCII name needs no folding at all.
fn folds_to(disk: &[u8], folded: &[u8]) -> bool {
    let k = disk
        .iter()
        .position(|b| !b.is_ascii())
        .unwrap_or(disk.len());
    if folded.len() < k
        || !disk[..k]
            .iter()
            .zip(folded)
            .all(|(a, b)| a.to_ascii_lowercase() == *b)
    {
        return false;
    }
    if k == disk.len() {
        return folded.len() == k;
    }
    casefold(disk).is_some_and(|d| d == folded)
}

/// Appends the NFDICF of code point `c`, each with its combining class.
fn push_folded(c: u32, out: &mut Vec<(u32, u8)>) {
    if (0xAC00..=0xD7A3).contains(&c) {
        // Hangul syllable: L V (T), all of class 0, none with a folding of its own.
        let s = c - 0xAC00;
        out.push((0x1100 + s / 588, 0));
        out.push((0x1161 + (s % 588) / 28, 0));
        if !s.is_multiple_of(28) {
            out.push((0x11A7 + s % 28, 0));
        }
        return;
    }
    if is_ignorable(c) {
        return;
    }
    match tables::NFDICF.binary_search_by_key(&c, |e| e.0) {
        Ok(i) => {
            for &d in tables::NFDICF[i].1 {
                out.push((d, ccc(d)));
            }
        }
        Err(_) => out.push((c, ccc(c))),
    }
}

fn is_ignorable(c: u32) -> bool {
    let t = tables::IGNORABLE;
    match t.binary_search_by(|&(lo, _)| lo.cmp(&c)) {
        Ok(_) => true,
        Err(0) => false,
        Err(i) => c <= t[i - 1].1,
    }
}

/// The canonical combining class of `c` (0 for characters Unicode 12.1 did not have).
fn ccc(c: u32) -> u8 {
    match tables::CCC.binary_search_by_key(&c, |e| e.0) {
        Ok(i) => tables::CCC[i].1,
        Err(_) => 0,
    }
}

/// The canonical ordering algorithm: a stable sort by class of each run of characters whose
/// class is not 0.
fn canonical_order(chars: &mut [(u32, u8)]) {
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1 == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i].1 != 0 {
            i += 1;
        }
        chars[start..i].sort_by_key(|e| e.1);
    }
}

#[cfg(test)]
mod tests;
