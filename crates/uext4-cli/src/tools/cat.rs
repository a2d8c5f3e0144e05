//! `uext4 cat`: a file's bytes to stdout.

use crate::image::*;
use anyhow::{anyhow, Context, Result};
use std::io::Write;
use uext4::Error;

pub(super) fn cat(path: &str) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, true).with_context(|| path.to_string())?;
    let a = fs.getattr(ino)?;
    if a.is_dir() {
        return Err(anyhow!(Error::IsDir)).with_context(|| path.to_string());
    }
    let size = a.size;
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = fs
            .read(ino, off, &mut buf)
            .with_context(|| path.to_string())?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(())
}
