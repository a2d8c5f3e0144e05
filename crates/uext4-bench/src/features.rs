//! The features family: what a feature costs the engine against the same work without it, in
//! one run, rounds alternated (A B A B) so that the machine's noise falls on both sides.
//!
//! - casefold: a directory of N entries (100,000 by default) made, then every name looked up
//!   in a random order, in a plain directory and in a casefolded one; in the casefolded one
//!   also under another spelling (upper case), and names that are not there.
//!
//! - encrypt: a file of 2 KiB per entry (200 MiB by default) written in 1 MiB pieces, synced,
//!   then read back, in a plain directory and in an encrypted one (v2, AES-256-XTS): what
//!   encryption costs per byte, beside the `xts-mode` crate's cipher alone (one AES call
//!   per block, as the engine used it before batching).
//!
//! In-process (the engine on an image in memory-backed storage): the cost is the engine's
//! own, with no kernel or FUSE transport in between.

use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;
use uext4::{Fs, MountOptions, ROOT_INO};

/// One measured step: what, and microseconds per entry in each round.
#[derive(Serialize, Debug, Clone)]
pub struct Step {
    pub name: String,
    pub us_per_entry: Vec<f64>,
}

impl Step {
    fn median(&self) -> f64 {
        let mut v = self.us_per_entry.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }
}

fn name(i: usize) -> String {
    // Names with something to fold, as a media library's: words, a number, accents.
    format!("Track {i:06} - Café Straße.flac")
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn per_entry(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// One round on a fresh image: the timings of each step, in microseconds per entry.
fn round(img: &Path, n: usize, folded: bool, seed: u64) -> Result<Vec<(String, f64)>> {
    let size = 1024u64 << 20;
    std::fs::File::create(img)?.set_len(size)?;
    let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(size, Some(4096));
    o.features.casefold = true;
    o.assume_zeroed = true;
    o.inodes = Some(n as u64 + 1024);
    {
        let dev = uext4::blockdev::FileDevice::open(img, false)?;
        uext4::mkfs::mkfs(&dev, &o)?;
    }
    let fs = Fs::open_path(img, MountOptions::default())?;
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0)?.ino;
    if folded {
        let f = fs.get_flags(dir)?;
        fs.set_flags(dir, f | uext4::flags::FL_CASEFOLD)?;
    }
    let tag = if folded { "casefold" } else { "plain" };
    let mut out = Vec::new();
    let t = Instant::now();
    for i in 0..n {
        fs.create(dir, name(i).as_bytes(), 0o644, 0, 0)?;
    }
    fs.sync()?;
    out.push((format!("create ({tag})"), per_entry(t, n)));
    let order = shuffled(n, seed);
    let t = Instant::now();
    for &i in &order {
        fs.lookup(dir, name(i).as_bytes())?;
    }
    out.push((format!("lookup ({tag})"), per_entry(t, n)));
    if folded {
        let t = Instant::now();
        for &i in &order {
            fs.lookup(dir, name(i).to_uppercase().as_bytes())?;
        }
        out.push(("lookup, other spelling (casefold)".into(), per_entry(t, n)));
    }
    let t = Instant::now();
    for &i in &order {
        let missing = format!("missing {i}");
        if fs.lookup(dir, missing.as_bytes()).is_ok() {
            anyhow::bail!("{missing:?} found");
        }
    }
    out.push((format!("lookup, missing ({tag})"), per_entry(t, n)));
    fs.unmount()?;
    Ok(out)
}

/// One encryption round on a fresh image: MiB/s of the write and of the read.
fn crypt_round(img: &Path, bytes: usize, encrypted: bool) -> Result<(f64, f64)> {
    let size = 1024u64 << 20;
    std::fs::File::create(img)?.set_len(size)?;
    let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(size, Some(4096));
    o.features.encrypt = true;
    o.assume_zeroed = true;
    {
        let dev = uext4::blockdev::FileDevice::open(img, false)?;
        uext4::mkfs::mkfs(&dev, &o)?;
    }
    let key = uext4::EncryptionKey::new((0u8..64).collect());
    let opts = MountOptions {
        keys: vec![key.clone()],
        ..MountOptions::default()
    };
    let fs = Fs::open_path(img, opts)?;
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0)?.ino;
    if encrypted {
        let p = uext4::EncryptionPolicy::v2(&key).map_err(anyhow::Error::msg)?;
        fs.set_encryption_policy(dir, &p)?;
    }
    let f = fs.create(dir, b"data", 0o644, 0, 0)?.ino;
    let piece: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mib = |t: Instant| bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut off = 0;
    while off < bytes {
        fs.write_all(f, off as u64, &piece)?;
        off += piece.len();
    }
    fs.fsync(f, false)?;
    let write = mib(t);
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut off = 0;
    while off < bytes {
        let n = fs.read(f, off as u64, &mut buf)?;
        if n == 0 || buf[..n] != piece[..n] {
            anyhow::bail!("read back at {off}: not what was written");
        }
        off += n;
    }
    let read = mib(t);
    fs.unmount()?;
    Ok((write, read))
}

/// AES-256-XTS over 4 KiB blocks from the `xts-mode` crate, MiB/s: what the engine paid per
/// byte before it batched its AES calls (crypto/cipher.rs), for comparison.
fn cipher_alone(bytes: usize) -> f64 {
    use aes::cipher::KeyInit;
    let key = |b: u8| aes::Aes256::new_from_slice(&[b; 32]).expect("32 bytes");
    let xts = xts_mode::Xts128::new(key(1), key(2));
    let mut block = vec![0u8; 4096];
    let t = Instant::now();
    let n = bytes / 4096;
    for i in 0..n {
        let mut tweak = [0u8; 16];
        tweak[..8].copy_from_slice(&(i as u64).to_le_bytes());
        xts.encrypt_sector(&mut block, tweak.into());
    }
    std::hint::black_box(&block);
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The encryption half: prints its table and returns its figures for the JSON.
fn run_crypt(img: &Path, bytes: usize, rounds: usize) -> Result<serde_json::Value> {
    let mut mibs: [[Vec<f64>; 2]; 2] = Default::default(); // [plain, encrypted][write, read]
    for r in 0..rounds {
        for (side, encrypted) in [false, true].into_iter().enumerate() {
            eprintln!(
                "features: encryption round {} of {rounds}, {} ...",
                r + 1,
                if encrypted { "encrypted" } else { "plain" }
            );
            let (w, rd) = crypt_round(img, bytes, encrypted)?;
            mibs[side][0].push(w);
            mibs[side][1].push(rd);
        }
    }
    let cipher = cipher_alone(bytes.min(256 << 20));
    println!();
    println!(
        "encryption: {} MiB written in 1 MiB pieces and synced, then read, {rounds} rounds alternated",
        bytes >> 20
    );
    println!();
    println!("| step | plain MiB/s | encrypted MiB/s | encrypted / plain | added ns per byte |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, what) in ["write", "read"].into_iter().enumerate() {
        let (p, e) = (median(&mibs[0][i]), median(&mibs[1][i]));
        let ns = |mib_s: f64| 1e9 / (mib_s * (1 << 20) as f64);
        let added = ns(e) - ns(p);
        println!("| {what} | {p:.0} | {e:.0} | {:.2}x | {added:.2} |", e / p);
        rows.push(serde_json::json!({"step": what, "plain_mib_s": mibs[0][i], "encrypted_mib_s": mibs[1][i], "added_ns_per_byte": added}));
    }
    println!(
        "| AES-256-XTS alone, xts-mode crate (one AES call per block) | - | {cipher:.0} | - | {:.2} |",
        1e9 / (cipher * (1 << 20) as f64)
    );
    Ok(serde_json::json!({"bytes": bytes, "steps": rows, "cipher_mib_s": cipher}))
}

/// Runs the family: `rounds` rounds of each side, alternated; prints the table and writes
/// `features.json` under `out`.
pub fn run(dir: &Path, out: &Path, entries: usize, rounds: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let img = dir.join("features.img");
    let mut steps: Vec<Step> = Vec::new();
    for r in 0..rounds {
        for folded in [false, true] {
            eprintln!(
                "features: round {} of {rounds}, {} ...",
                r + 1,
                if folded { "casefold" } else { "plain" }
            );
            for (name, us) in round(&img, entries, folded, 42 + r as u64)? {
                match steps.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.us_per_entry.push(us),
                    None => steps.push(Step {
                        name,
                        us_per_entry: vec![us],
                    }),
                }
            }
        }
    }
    let plain = |what: &str| {
        steps
            .iter()
            .find(|s| s.name == format!("{what} (plain)"))
            .map(Step::median)
    };
    println!("features family: {entries} entries in one directory, {rounds} rounds alternated, in-process");
    println!();
    println!("| step | µs per entry (median) | rounds | against plain |");
    println!("|---|---|---|---|");
    for s in &steps {
        let base = s
            .name
            .split(" (")
            .next()
            .and_then(|w| plain(w.trim_end_matches(", other spelling")));
        let ratio = match base {
            Some(b) if !s.name.ends_with("(plain)") => format!("{:.2}x", s.median() / b),
            _ => "-".into(),
        };
        let all: Vec<String> = s.us_per_entry.iter().map(|v| format!("{v:.2}")).collect();
        println!(
            "| {} | {:.2} | {} | {ratio} |",
            s.name,
            s.median(),
            all.join(", ")
        );
    }
    let crypt = run_crypt(&img, entries * 2048, rounds)?;
    let _ = std::fs::remove_file(&img);
    std::fs::write(
        out.join("features.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "entries": entries,
            "rounds": rounds,
            "steps": steps,
            "encryption": crypt,
        }))?,
    )?;
    Ok(())
}
