//! Builds an image from a host directory with the library alone (no root, no mount):
//! directories, regular files and symbolic links, with their modes. `uext4 mkfs -d` does
//! this and much more (owners, times, xattrs, hard links, devices, reproducible output).
//!
//!     cargo run -p uext4 --example build_image -- IMAGE SIZE_MIB DIR
//!
//! The filesystem is closed with `Fs::unmount`, which leaves the image clean.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use uext4::Fs;

fn copy_dir(fs: &Fs, host: &Path, dir: u32) -> Result<(), Box<dyn std::error::Error>> {
    let mut names: Vec<_> = std::fs::read_dir(host)?.collect::<Result<_, _>>()?;
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let name = e.file_name();
        let name = name.as_encoded_bytes();
        let md = std::fs::symlink_metadata(e.path())?;
        let mode = md.permissions().mode() & 0o7777;
        let (uid, gid) = (md.uid(), md.gid());
        if md.is_dir() {
            let a = fs.mkdir(dir, name, mode, uid, gid)?;
            copy_dir(fs, &e.path(), a.ino)?;
        } else if md.file_type().is_symlink() {
            let target = std::fs::read_link(e.path())?;
            fs.symlink(dir, name, target.as_os_str().as_encoded_bytes(), uid, gid)?;
        } else if md.is_file() {
            let a = fs.create(dir, name, mode, uid, gid)?;
            let data = std::fs::read(e.path())?;
            let mut off = 0;
            while off < data.len() {
                off += fs.write(a.ino, off as u64, &data[off..])?;
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, image, mib, dir] = &args[..] else {
        eprintln!("usage: build_image IMAGE SIZE_MIB DIR");
        std::process::exit(2);
    };
    let size = mib.parse::<u64>()? << 20;
    uext4::mkfs::make_image(image.as_ref(), size)?;
    let fs = Fs::open_path(image.as_ref(), uext4::MountOptions::default())?;
    copy_dir(&fs, dir.as_ref(), uext4::ROOT_INO)?;
    fs.unmount()?;
    Ok(())
}
