//! Casefolding against e2fsprogs, the oracle this kernel cannot be (it has no CONFIG_UNICODE):
//! every code point's folding, through the hash a casefolded directory stores, compared with
//! debugfs's `dx_hash -c -e utf8`, which folds with e2fsprogs's own utf8-12.1 table.

use std::io::Write;
use std::process::Command;
use uext4::format::casefold::casefold;
use uext4::format::dx_hash::dirhash;
use uext4::format::htree::DX_HASH_HALF_MD4;
use uext4_testkit::{have, mke2fs, scratch};

const SEED: [u32; 4] = [0x1234_5678, 0x9abc_def0, 0x0fed_cba9, 0x8765_4321];

fn seed_uuid() -> String {
    // debugfs parses the seed as a UUID and hashes with its bytes as four little-endian words.
    let b: Vec<u8> = SEED.iter().flat_map(|w| w.to_le_bytes()).collect();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Names debugfs's command parser passes through whole: no ASCII space, control, quote,
/// backslash or comment sign.
fn passes_parser(name: &str) -> bool {
    !name.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'"' || b == b'\\' || b == b'#')
}

/// Hashes every name with debugfs in one run; returns (major, minor) per name, in order.
fn debugfs_hashes(names: &[String]) -> Vec<(u32, u32)> {
    let img = scratch("casefold-oracle");
    mke2fs(&img.0, "4M", &["-O", "casefold"]);
    let cmds = scratch("casefold-cmds");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&cmds.0).unwrap());
    let seed = seed_uuid();
    for n in names {
        writeln!(f, "dx_hash -c -e utf8 -h half_md4 -s {seed} {n}").unwrap();
    }
    drop(f);
    let out = Command::new("debugfs")
        .arg("-f")
        .arg(&cmds.0)
        .arg(&img.0)
        .output()
        .expect("debugfs must be installed (e2fsprogs)");
    let mut hashes = Vec::with_capacity(names.len());
    for line in out.stdout.split(|&b| b == b'\n') {
        if !line.starts_with(b"Hash of ") {
            continue;
        }
        let line = String::from_utf8_lossy(line);
        let tail = line.rsplit(" is ").next().unwrap();
        // "0x1234abcd (minor 0x5678ef01)"
        let mut it = tail.split(|c| c == ' ' || c == ')').filter(|s| s.starts_with("0x"));
        let major = u32::from_str_radix(&it.next().unwrap()[2..], 16).unwrap();
        let minor = u32::from_str_radix(&it.next().unwrap()[2..], 16).unwrap();
        hashes.push((major, minor));
    }
    assert_eq!(hashes.len(), names.len(), "debugfs answered for every name");
    hashes
}

fn ours(name: &str) -> (u32, u32) {
    let folded = casefold(name.as_bytes()).expect("valid UTF-8");
    dirhash(&folded, DX_HASH_HALF_MD4, &SEED)
}

#[test]
fn every_code_point_folds_as_e2fsprogs_folds_it() {
    if !have(&["debugfs", "mke2fs"]) {
        println!("SKIP: debugfs and mke2fs are needed (e2fsprogs)");
        return;
    }
    // Every scalar value in the planes Unicode 12.1 assigned (0-2 and 14), each between two
    // letters so that its combining class meets a starter on both sides; those that fold to
    // nothing also alone (an empty folding hashes the seed alone).
    let mut names = Vec::new();
    let planes = (0x20u32..0x3_0000).chain(0xE_0000..0xE_1000);
    for cp in planes {
        let Some(c) = char::from_u32(cp) else { continue };
        let name = format!("a{c}Z");
        if passes_parser(&name) {
            names.push(name);
        }
        let alone = c.to_string();
        if passes_parser(&alone) && casefold(alone.as_bytes()).is_some_and(|f| f.is_empty()) {
            names.push(alone);
        }
    }
    // Sequences whose order matters: marks of different classes, both ways round.
    for s in ["a\u{301}\u{328}", "a\u{328}\u{301}", "\u{1E63}\u{323}\u{307}", "\u{3B1}\u{345}\u{301}", "\u{130}\u{301}"] {
        names.push(s.to_string());
    }
    let theirs = debugfs_hashes(&names);
    let mut wrong = Vec::new();
    for (n, t) in names.iter().zip(&theirs) {
        if ours(n) != *t {
            wrong.push(format!("{:?} {:04X?}", n, n.chars().map(|c| c as u32).collect::<Vec<_>>()));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} names hash differently from e2fsprogs, first: {:?}",
        wrong.len(),
        names.len(),
        &wrong[..wrong.len().min(20)]
    );
    println!("{} names hash as e2fsprogs hashes them", names.len());
}
