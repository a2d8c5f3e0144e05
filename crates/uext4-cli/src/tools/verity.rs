//! `uext4 verity`: fs-verity on a file of an image, as fsverity(1) does on a mounted
//! filesystem: `enable` builds the Merkle tree and sets the verity flag
//! (FS_IOC_ENABLE_VERITY), `measure` prints the file digest (FS_IOC_MEASURE_VERITY) in
//! `fsverity measure`'s form, `ALG:HEX PATH`.

use crate::image::*;
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use std::path::PathBuf;
use uext4::format::verity::HashAlg;

#[derive(Subcommand)]
pub enum VerityCmd {
    /// Enable verity on IMAGE:PATH (the image needs the verity feature: mkfs -O verity).
    Enable {
        /// sha256 (default) or sha512.
        #[arg(long = "hash-alg", default_value = "sha256")]
        hash_alg: String,
        /// The Merkle tree block size: 1024 up to the page size and the filesystem block.
        #[arg(long = "block-size", default_value_t = 4096)]
        block_size: u32,
        /// A salt, in hex (at most 32 bytes).
        #[arg(long = "salt")]
        salt: Option<String>,
        /// A builtin signature (DER PKCS#7, as `fsverity sign` makes) to store with it.
        #[arg(long = "signature")]
        signature: Option<PathBuf>,
        /// The file: IMAGE:PATH.
        path: String,
    },
    /// Print the file digest of a verity file: ALG:HEX IMAGE:PATH.
    Measure {
        /// The files: IMAGE:PATH...
        #[arg(required = true, num_args = 1..)]
        paths: Vec<String>,
    },
}

/// The bytes of a hex string.
fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        bail!("salt {s:?}: an odd number of hex digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| anyhow!("salt {s:?}: not hex")))
        .collect()
}

pub fn run(cmd: VerityCmd) -> Result<()> {
    match cmd {
        VerityCmd::Enable {
            hash_alg,
            block_size,
            salt,
            signature,
            path,
        } => {
            let alg = HashAlg::from_name(&hash_alg)
                .ok_or_else(|| anyhow!("unknown hash algorithm {hash_alg:?} (sha256, sha512)"))?;
            let args = uext4::VerityArgs {
                hash_algorithm: alg.id() as u32,
                block_size,
                salt: salt.as_deref().map(unhex).transpose()?.unwrap_or_default(),
                signature: match signature {
                    Some(p) => std::fs::read(&p).with_context(|| p.display().to_string())?,
                    None => Vec::new(),
                },
            };
            let (img, p) = image_loc(&path)?;
            let fs = open_img(&img, false)?;
            let r = resolve(&fs, &p, true)
                .and_then(|ino| fs.enable_verity(ino, &args))
                .with_context(|| path.clone());
            finish(&fs, &img.path, r)
        }
        VerityCmd::Measure { paths } => {
            for path in paths {
                let (img, p) = image_loc(&path)?;
                let fs = open_img(&img, true)?;
                let (alg, digest) = resolve(&fs, &p, true)
                    .and_then(|ino| fs.measure_verity(ino))
                    .map_err(|e| match e {
                        uext4::Error::NoAttr => anyhow!("{path}: file is not a verity file"),
                        e => anyhow!(e).context(path.clone()),
                    })?;
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                println!("{}:{hex} {path}", alg.name());
            }
            Ok(())
        }
    }
}
