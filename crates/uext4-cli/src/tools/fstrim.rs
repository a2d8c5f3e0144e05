//! `uext4 fstrim`: discards an image's free blocks, as fstrim(8) on a mount (FITRIM), so that
//! a sparse image file gives their space back to the filesystem under it.

use crate::image::{finish, image_arg, open_img};
use anyhow::{Context, Result};
use std::path::Path;

/// `uext4 fstrim [-v] [-m MINIMUM] IMAGE`: with `verbose`, prints what fstrim -v prints.
pub fn fstrim(image: &Path, minimum: u64, verbose: bool) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, false)?;
    let r = fs.trim(0, u64::MAX, minimum);
    let r = r.map(|bytes| {
        if verbose {
            println!("{}: {bytes} bytes trimmed", image.display());
        }
    });
    finish(&fs, &img.path, r.context("FITRIM"))
}
