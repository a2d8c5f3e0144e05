//! Walks an image's tree and prints one line per name: type, size and path, as
//! `find DIR -printf '%y %s %P\n'` prints a host directory.
//!
//!     cargo run -p uext4 --example walk_tree -- IMAGE
//!
//! `Fs::walk` reads one directory at a time, so the loop is free to call back into the
//! filesystem (here `getattr`) for each name it is given.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, image] = &args[..] else {
        eprintln!("usage: walk_tree IMAGE");
        std::process::exit(2);
    };
    let fs = uext4::Fs::open_path(image.as_ref(), uext4::MountOptions::ro())?;
    for e in fs.walk(uext4::ROOT_INO) {
        let e = e?;
        if e.path == b"lost+found" {
            continue; // made by mkfs, not part of the tree
        }
        let a = fs.getattr(e.ino)?;
        let kind = match a.mode & uext4::S_IFMT {
            uext4::S_IFDIR => 'd',
            uext4::S_IFLNK => 'l',
            uext4::S_IFREG => 'f',
            _ => 'o',
        };
        println!("{kind} {} {}", a.size, String::from_utf8_lossy(&e.path));
    }
    Ok(())
}
