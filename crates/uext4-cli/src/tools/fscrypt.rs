//! `uext4 fscrypt`: encryption policies on an image, as fscryptctl(8) sets and reads them
//! on a mounted filesystem. The key comes from the global `--key FILE` (a raw key file).

use crate::image::*;
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use uext4::EncryptionPolicy;

#[derive(Subcommand)]
pub enum FscryptCmd {
    /// Encrypt an empty directory: IMAGE:DIR, with the first --key's policy (v2 unless
    /// --v1), as `fscryptctl set_policy`. New files, directories and symlinks in it inherit
    /// the policy; the key must be given again to read or write them.
    SetPolicy {
        /// A v1 policy (deprecated by the kernel), under the descriptor the fscrypt and
        /// e4crypt tools compute from the key.
        #[arg(long)]
        v1: bool,
        /// Contents mode: AES-256-XTS (default), AES-128-CBC or Adiantum.
        #[arg(long, default_value = "AES-256-XTS")]
        contents: String,
        /// Filenames mode: AES-256-CTS (default), AES-128-CTS, AES-256-HCTR2 or Adiantum.
        #[arg(long, default_value = "AES-256-CTS")]
        filenames: String,
        /// Filename padding in bytes: 4, 8, 16 or 32 (default).
        #[arg(long, default_value_t = 32)]
        padding: u32,
        /// Policy flags: direct-key, iv-ino-lblk-64 or iv-ino-lblk-32 (repeatable).
        #[arg(long = "flag", value_name = "FLAG")]
        flags: Vec<String>,
        /// The empty directory: IMAGE:DIR.
        path: String,
    },
    /// Print the policy of an encrypted file or directory, and whether its key was given:
    /// IMAGE:PATH.
    GetPolicy {
        /// The file or directory: IMAGE:PATH.
        path: String,
    },
}

pub fn run(cmd: FscryptCmd) -> Result<()> {
    match cmd {
        FscryptCmd::SetPolicy {
            v1,
            contents,
            filenames,
            padding,
            flags,
            path,
        } => {
            let Some(key) = keys().first() else {
                bail!("{path}: give the directory's key with --key FILE");
            };
            let mut policy = if v1 {
                EncryptionPolicy::v1(key)
            } else {
                EncryptionPolicy::v2(key)
            }
            .and_then(|p| p.with_modes(&contents, &filenames))
            .and_then(|p| p.with_padding(padding))
            .map_err(anyhow::Error::msg)?;
            for f in &flags {
                policy = policy.with_flag(f).map_err(anyhow::Error::msg)?;
            }
            set_policy(&path, &policy)
        }
        FscryptCmd::GetPolicy { path } => get_policy(&path),
    }
}

fn set_policy(path: &str, policy: &EncryptionPolicy) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let ino = resolve(&fs, &p, true)?;
        fs.set_encryption_policy(ino, policy)
            .with_context(|| format!("policy {policy}"))?;
        Ok(())
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

fn get_policy(path: &str) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, false).with_context(|| path.to_string())?;
    match fs.encryption_policy(ino)? {
        None => bail!("{path}: not encrypted"),
        Some(s) => {
            println!("Encryption policy: {}", s.policy);
            println!("Key: {}", if s.key_present { "present" } else { "absent" });
        }
    }
    Ok(())
}
