//! `uext4 fstrim`: the image's free blocks are given back to what holds it, as fstrim(8) does
//! on a mounted filesystem: holes in an image file (it takes less space on its host), TRIM
//! requests to an NBD server that takes them.

use crate::image::*;
use anyhow::{bail, Result};
use std::path::Path;

pub(super) fn fstrim(image: &Path, minimum: Option<&str>, verbose: bool) -> Result<()> {
    let img = image_arg(image)?;
    let min_len = minimum.map(parse_size).transpose()?.unwrap_or(0);
    let fs = open_img(&img, false)?;
    let r = fs.trim(0, u64::MAX, min_len);
    let done = match r {
        Ok(t) => t,
        Err(e) => return finish(&fs, &img.path, Err(e.into())),
    };
    finish(&fs, &img.path, Ok(()))?;
    if !done.supported {
        bail!(
            "{}: the storage under the image does not take discards",
            img.name()
        );
    }
    if verbose {
        println!("{}: {} bytes trimmed", img.name(), done.bytes);
    }
    Ok(())
}
