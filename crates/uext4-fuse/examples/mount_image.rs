//! Mounts an image through FUSE from a program, as `uext4 mount -f` does, and serves it
//! until the mount point is unmounted (`umount MOUNTPOINT` or `fusermount3 -u`).
//!
//!     cargo run -p uext4-fuse --example mount_image -- IMAGE MOUNTPOINT [OPTIONS]
//!
//! OPTIONS is mount's `-o` list (`ro`, `noatime`, `transport=dev`, ...). Mounting needs root
//! or fusermount3.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (image, mountpoint, list) = match &args[..] {
        [_, i, m] => (i, m, ""),
        [_, i, m, o] => (i, m, o.as_str()),
        _ => {
            eprintln!("usage: mount_image IMAGE MOUNTPOINT [OPTIONS]");
            std::process::exit(2);
        }
    };
    let opts = uext4_fuse::Options::parse(list)?;
    let fs = uext4::Fs::open_path(image.as_ref(), opts.mount_options())?;
    let served = uext4_fuse::serve(fs.clone(), Path::new(image), Path::new(mountpoint), &opts)?;
    eprintln!("serving {image} at {mountpoint}; unmount it to stop");
    served.join()?;
    fs.unmount()?;
    Ok(())
}
