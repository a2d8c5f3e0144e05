//! The hard cases of the issue, against what Unicode 12.1's data says of them. The whole table
//! is checked against e2fsprogs's own in crates/uext4/tests/casefold.rs.

use super::*;

fn fold(s: &str) -> String {
    String::from_utf8(casefold(s.as_bytes()).unwrap()).unwrap()
}

fn same(a: &str, b: &str) -> bool {
    FoldedName::new(a.as_bytes()).matches(b.as_bytes())
}

#[test]
fn ascii_folds_to_lower_case() {
    assert_eq!(fold("README.TXT"), "readme.txt");
    assert!(same("Makefile", "MAKEFILE"));
    assert!(!same("Makefile", "Makefile2"));
}

#[test]
fn sharp_s_folds_to_ss_and_capital_sharp_s_too() {
    assert_eq!(fold("straße"), "strasse");
    assert_eq!(fold("STRASSE"), "strasse");
    assert!(same("STRAẞE", "strasse"));
}

#[test]
fn kelvin_and_angstrom_signs_fold_to_letters() {
    assert_eq!(fold("\u{212A}"), "k");
    // ANGSTROM SIGN: folding to å, then decomposed to a + ring.
    assert_eq!(fold("\u{212B}"), "a\u{30A}");
    assert!(same("\u{212B}", "\u{C5}"));
}

#[test]
fn turkish_i_uses_the_default_folding() {
    // Full folding (status F), not the Turkic one (T): İ is i + combining dot above.
    assert_eq!(fold("\u{130}"), "i\u{307}");
    // Dotless ı has no folding and stays apart from i.
    assert_eq!(fold("\u{131}"), "\u{131}");
    assert!(!same("\u{131}", "i"));
    assert!(!same("\u{130}", "i"));
}

#[test]
fn ligatures_fold_in_full() {
    assert_eq!(fold("\u{FB01}le"), "file");
    assert_eq!(fold("\u{FB00}"), "ff");
    assert!(same("ﬁle", "FILE"));
    // DŽ, Dž and dž are one letter in three cases.
    assert!(same("\u{1C4}", "\u{1C6}") && same("\u{1C5}", "\u{1C6}"));
}

#[test]
fn combining_marks_are_decomposed_and_ordered() {
    // é precomposed and decomposed.
    assert!(same("caf\u{E9}", "CAFE\u{301}"));
    // a + acute + ogonek and a + ogonek + acute are canonically equivalent.
    assert!(same("a\u{301}\u{328}", "a\u{328}\u{301}"));
    assert_eq!(fold("A\u{301}\u{328}"), "a\u{328}\u{301}");
    // ǻ (a, ring above, acute) in one and three code points.
    assert!(same("\u{1FB}", "A\u{30A}\u{301}"));
    // Greek: ΐ folds to ι + diaeresis + acute.
    assert_eq!(fold("\u{390}"), "\u{3B9}\u{308}\u{301}");
}

#[test]
fn hangul_syllables_decompose_to_jamo() {
    assert_eq!(fold("\u{D55C}"), "\u{1112}\u{1161}\u{11AB}");
    assert!(same(
        "\u{D55C}\u{AE00}",
        "\u{1112}\u{1161}\u{11AB}\u{1100}\u{1173}\u{11AF}"
    ));
    // An LV syllable has no trailing consonant.
    assert_eq!(fold("\u{AC00}"), "\u{1100}\u{1161}");
}

#[test]
fn ignorable_code_points_fold_to_nothing() {
    assert_eq!(fold("a\u{200D}b\u{AD}c"), "abc");
    assert!(same("ab", "a\u{200B}b"));
    assert_eq!(fold("\u{E0001}"), "\u{E0001}".replace('\u{E0001}', ""));
}

#[test]
fn characters_after_unicode_12_1_fold_to_themselves() {
    // U+A7C7 LATIN CAPITAL LETTER D WITH SHORT STROKE OVERLAY (13.0) has a lower case now.
    assert_eq!(fold("\u{A7C7}"), "\u{A7C7}");
    // U+2C2F GLAGOLITIC CAPITAL LETTER CAUDATE CHI (14.0).
    assert!(!same("\u{2C2F}", "\u{2C5F}"));
}

#[test]
fn names_that_are_not_utf8_match_only_themselves() {
    let bad: &[u8] = b"caf\xe9";
    assert!(casefold(bad).is_none());
    assert!(!is_valid(bad));
    assert!(FoldedName::new(bad).matches(bad));
    assert!(!FoldedName::new(bad).matches(b"CAF\xe9"));
    // A surrogate encoded in UTF-8, and an overlong '/'.
    assert!(casefold(b"\xed\xa0\x80").is_none());
    assert!(casefold(b"\xc0\xaf").is_none());
    // A valid name never matches an invalid one.
    assert!(!FoldedName::new(b"cafe").matches(bad));
}
