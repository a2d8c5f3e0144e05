use super::*;

/// Values from `debugfs -R "dx_hash -h <alg> [-s <seed>] <name>"` (e2fsprogs 1.47).
#[test]
fn hashes_match_debugfs() {
    let zero = [0u32; 4];
    // Seed 01234567-89ab-cdef-0123-456789abcdef, as the superblock stores it.
    let seed = [0x6745_2301, 0xefcd_ab89, 0x6745_2301, 0xefcd_ab89];
    let long = b"a-much-longer-file-name-that-spans-more-than-thirty-two-bytes";
    assert_eq!(
        dirhash(b"hello", DX_HASH_HALF_MD4, &zero),
        (0x1746da32, 0x420013b5)
    );
    assert_eq!(
        dirhash(long, DX_HASH_HALF_MD4, &seed),
        (0xfbf799c6, 0xc1749341)
    );
    assert_eq!(
        dirhash(b"hello", DX_HASH_TEA, &zero),
        (0x6f5bb1a8, 0x231917c2)
    );
    assert_eq!(dirhash(long, DX_HASH_TEA, &seed), (0xcbc3f652, 0xfc72fb09));
    assert_eq!(dirhash(b"hello", DX_HASH_LEGACY, &zero).0, 0x32252546);
    assert_eq!(dirhash(long, DX_HASH_LEGACY, &seed).0, 0x2e5820e2);
    // High-bit bytes: signed and unsigned variants differ (`dx_hash -h 0..5`).
    let hi = "héllo-wörld-ÿÿÿÿ-and-some-more-bytes-to-pass-32".as_bytes();
    assert_eq!(dirhash(hi, DX_HASH_LEGACY, &seed), (0x6d730bde, 0));
    assert_eq!(
        dirhash(hi, DX_HASH_HALF_MD4, &seed),
        (0x5d3f2162, 0x4c868d93)
    );
    assert_eq!(dirhash(hi, DX_HASH_TEA, &seed), (0x0c180df0, 0x8efa2bc3));
    assert_eq!(dirhash(hi, DX_HASH_LEGACY_UNSIGNED, &seed), (0xa6793918, 0));
    assert_eq!(
        dirhash(hi, DX_HASH_HALF_MD4_UNSIGNED, &seed),
        (0x89d4a130, 0x36456be4)
    );
    assert_eq!(
        dirhash(hi, DX_HASH_TEA_UNSIGNED, &seed),
        (0xd63a1fc4, 0x85bfc66d)
    );
    assert_eq!(
        dirhash(b"x", DX_HASH_TEA_UNSIGNED, &zero),
        (0xe958e760, 0x9772c62c)
    );
    assert_eq!(dirhash(b"x", DX_HASH_LEGACY, &zero).0, 0xb26f0bdc);
}

/// Many names against debugfs in one go (skipped when debugfs is missing).
#[test]
fn hashes_match_debugfs_bulk() {
    let seed_str = "8f3c2a10-5b6d-4e7f-9a01-23456789abcd";
    let u = [
        0x8f, 0x3c, 0x2a, 0x10, 0x5b, 0x6d, 0x4e, 0x7f, 0x9a, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
        0xcd,
    ];
    let seed: [u32; 4] =
        std::array::from_fn(|i| u32::from_le_bytes(u[i * 4..i * 4 + 4].try_into().unwrap()));
    let names: Vec<String> = (0..40)
        .map(|i| match i % 4 {
            0 => format!("n{i}"),
            1 => format!("file-{i}-{}", "q".repeat(i)),
            2 => format!("é{i}ñ{}", "Ω".repeat(i % 9)),
            _ => "x".repeat(i * 6 + 1),
        })
        .collect();
    for v in 0..=5u8 {
        let mut script = String::new();
        for n in &names {
            script.push_str(&format!("dx_hash -h {v} -s {seed_str} {n}\n"));
        }
        let out = match std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '{script}' | debugfs -f - 2>/dev/null"))
            .output()
        {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => {
                eprintln!("SKIP: debugfs not available");
                return;
            }
        };
        let got: Vec<(u32, u32)> = out
            .lines()
            .filter(|l| l.starts_with("Hash of "))
            .map(|l| {
                let h = l.split(" is 0x").nth(1).unwrap();
                let (a, b) = h.split_once(" (minor 0x").unwrap();
                (
                    u32::from_str_radix(a, 16).unwrap(),
                    u32::from_str_radix(b.trim_end_matches(')'), 16).unwrap(),
                )
            })
            .collect();
        if got.is_empty() {
            eprintln!("SKIP: debugfs gave no dx_hash output");
            return;
        }
        assert_eq!(got.len(), names.len());
        for (n, g) in names.iter().zip(got) {
            assert_eq!(dirhash(n.as_bytes(), v, &seed), g, "version {v} name {n}");
        }
    }
}
