//! Reads one file out of an image, with no mount and no root: the library's smallest use.
//!
//!     cargo run -p uext4 --example read_file -- IMAGE /etc/hostname > hostname
//!
//! The image is opened read-only: a journal that needs recovery is replayed in memory and
//! the image is never written.

use std::io::{Read, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, image, path] = &args[..] else {
        eprintln!("usage: read_file IMAGE PATH");
        std::process::exit(2);
    };
    let fs = uext4::Fs::open_path(image.as_ref(), uext4::MountOptions::ro())?;
    let ino = fs.lookup_path(uext4::ROOT_INO, path.as_bytes(), true)?;
    let mut reader = fs.open_reader(ino)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut out = std::io::stdout().lock();
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    Ok(())
}
