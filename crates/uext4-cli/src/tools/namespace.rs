//! The namespace tools: mkdir, rm, mv, ln, truncate.

use crate::image::*;
use anyhow::{bail, Context, Result};
use uext4::RenameFlags;
use uext4::{Error, Fs};

pub(super) fn mkdir(path: &str, parents: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        if parents {
            let mut cur = 2u32;
            for c in p.split('/').filter(|c| !c.is_empty()) {
                cur = match fs.lookup(cur, c.as_bytes()) {
                    Ok(a) if a.is_dir() => a.ino,
                    Ok(a) if a.mode & 0o170000 == 0o120000 => {
                        let t = fs.readlink(a.ino)?;
                        let ino = resolve_from(&fs, cur, &String::from_utf8_lossy(&t), true)
                            .with_context(|| c.to_string())?;
                        if !fs.getattr(ino)?.is_dir() {
                            bail!("{c}: exists and is not a directory");
                        }
                        ino
                    }
                    Ok(_) => bail!("{c}: exists and is not a directory"),
                    Err(Error::NotFound) => {
                        let (uid, gid) = caller();
                        fs.mkdir(cur, c.as_bytes(), 0o777 & !umask(), uid, gid)?.ino
                    }
                    Err(e) => return Err(e.into()),
                };
            }
        } else {
            let (d, n) = parent_of(&fs, &p)?;
            let (uid, gid) = caller();
            fs.mkdir(d, &n, 0o777 & !umask(), uid, gid)?;
        }
        Ok(())
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

/// Removes `name` in `dir` and, if it is a directory, everything under it. `seen` holds the
/// directories entered so far.
fn remove_tree(
    fs: &Fs,
    dir: u32,
    name: &[u8],
    seen: &mut std::collections::HashSet<u32>,
) -> uext4::Result<()> {
    let a = fs.lookup(dir, name)?;
    if a.is_dir() {
        if !seen.insert(a.ino) {
            return Err(directory_cycle(a.ino));
        }
        loop {
            let mut names = Vec::new();
            fs.readdir(a.ino, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    names.push(e.name);
                }
                names.len() < 1024
            })?;
            if names.is_empty() {
                break;
            }
            for n in names {
                remove_tree(fs, a.ino, &n, seen)?;
            }
        }
        fs.rmdir(dir, name)
    } else {
        fs.unlink(dir, name)
    }
}

pub(super) fn rm(path: &str, recursive: bool, force: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let (d, n) = parent_of(&fs, &p)?;
        let res = if recursive {
            remove_tree(&fs, d, &n, &mut Default::default())
        } else {
            match fs.lookup(d, &n) {
                Ok(a) if a.is_dir() => Err(Error::IsDir),
                Ok(_) => fs.unlink(d, &n),
                Err(e) => Err(e),
            }
        };
        match res {
            Err(Error::NotFound) if force => Ok(()),
            r => Ok(r?),
        }
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

pub(super) fn mv(src: &str, dst: &str) -> Result<()> {
    let (img, s) = image_loc(src)?;
    let (img2, d) = image_loc(dst)?;
    if img != img2 {
        bail!("{dst}: mv works inside one image; use cp and rm between images");
    }
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let (sd, sn) = parent_of(&fs, &s)?;
        // Moving onto an existing directory puts the source inside it.
        let (dd, dn) = match resolve(&fs, &d, true) {
            Ok(ino) if fs.getattr(ino)?.is_dir() => (ino, sn.clone()),
            _ => parent_of(&fs, &d)?,
        };
        fs.rename(sd, &sn, dd, &dn, RenameFlags::default())?;
        Ok(())
    })();
    finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")))
}

pub(super) fn ln(target: &str, link: &str, symbolic: bool) -> Result<()> {
    let (img, l) = image_loc(link)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let (d, n) = parent_of(&fs, &l)?;
        if symbolic {
            let (uid, gid) = caller();
            fs.symlink(d, &n, target.as_bytes(), uid, gid)?;
        } else {
            let t = match parse_loc(target)? {
                Loc::Image(i, p) if i == img => p,
                Loc::Image(..) => bail!("{target}: hard links must stay inside one image"),
                Loc::Host(p) => p.to_string_lossy().into_owned(),
            };
            let ino = resolve(&fs, &t, false).with_context(|| t.clone())?;
            fs.link(ino, d, &n)?;
        }
        Ok(())
    })();
    finish(&fs, &img.path, r.with_context(|| link.to_string()))
}

pub(super) fn truncate(path: &str, size: &str, create: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let size = parse_size(size)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let ino = match resolve(&fs, &p, true) {
            Ok(ino) => ino,
            Err(uext4::Error::NotFound) if create => {
                let (d, n) = parent_of(&fs, &p)?;
                let (uid, gid) = caller();
                fs.create(d, &n, 0o666 & !umask(), uid, gid)?.ino
            }
            // truncate -c: nothing to do, and no error (as truncate(1)).
            Err(uext4::Error::NotFound) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        Ok(fs.truncate(ino, size)?)
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}
