//! `uext4 stat`: one inode's attributes, as stat(1) prints them.

use super::ls::*;
use crate::image::*;
use anyhow::{Context, Result};

pub(super) fn stat(path: &str) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, false).with_context(|| path.to_string())?;
    let a = fs.getattr(ino)?;
    println!("  File: {p}");
    let kind = match a.mode & 0o170000 {
        0o040000 => "directory",
        0o120000 => "symbolic link",
        0o020000 => "character special file",
        0o060000 => "block special file",
        0o010000 => "fifo",
        0o140000 => "socket",
        _ if a.size == 0 => "regular empty file",
        _ => "regular file",
    };
    println!(
        "  Size: {}\tBlocks: {}\tIO Block: {}\t{kind}",
        a.size, a.blocks, a.block_size
    );
    if matches!(a.mode & 0o170000, 0o020000 | 0o060000) {
        println!(
            "Device type: {},{}",
            (a.rdev >> 8) & 0xfff,
            (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00)
        );
    }
    println!(
        "Inode: {}\tLinks: {}\tGeneration: {}",
        a.ino, a.nlink, a.generation
    );
    println!(
        "Access: ({:04o}/{})  Uid: {}  Gid: {}",
        a.mode & 0o7777,
        mode_string(a.mode),
        a.uid,
        a.gid
    );
    println!("Access: {}", fmt_time(a.atime));
    println!("Modify: {}", fmt_time(a.mtime));
    println!("Change: {}", fmt_time(a.ctime));
    println!(" Birth: {}", fmt_time(a.crtime));
    if let Some(e) = fs.encryption_policy(ino)? {
        let key = if e.key_present { "present" } else { "absent" };
        println!("Encrypted: {} (key {key})", e.policy);
    }
    if let Ok(x) = fs.listxattr(ino) {
        for n in x {
            println!("xattr: {}", String::from_utf8_lossy(&n));
        }
    }
    Ok(())
}
