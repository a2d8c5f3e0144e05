//! `uext4 chattr`, `uext4 lsattr` and `uext4 label`: inode flags and the filesystem label
//! inside an image, with e2fsprogs' letters and lsattr's layout, so that their output can be
//! compared with the real tools' on a mount. The engine applies the kernel's rules
//! (`Fs::set_flags`); these tools only parse and print.

use super::attrs::walk;
use super::ls::escaped_name;
use crate::image::{finish, image_arg, image_loc, open_img, resolve};
use anyhow::{bail, Context, Result};
use std::path::Path;
use uext4::flags::*;
use uext4::{Attr, Fs};

/// `FS_NOCOW_FL`: not ext4's, but chattr and lsattr know its letter.
const FL_NOCOW: u32 = 0x80_0000;

/// Each flag with its letter, in the order lsattr prints them (e2fsprogs' table).
const LETTERS: [(u32, char); 22] = [
    (FL_SECRM, 's'),
    (FL_UNRM, 'u'),
    (FL_SYNC, 'S'),
    (FL_DIRSYNC, 'D'),
    (FL_IMMUTABLE, 'i'),
    (FL_APPEND, 'a'),
    (FL_NODUMP, 'd'),
    (FL_NOATIME, 'A'),
    (FL_COMPR, 'c'),
    (FL_ENCRYPT, 'E'),
    (FL_JOURNAL_DATA, 'j'),
    (FL_INDEX, 'I'),
    (FL_NOTAIL, 't'),
    (FL_TOPDIR, 'T'),
    (FL_EXTENTS, 'e'),
    (FL_NOCOW, 'C'),
    (FL_DAX, 'x'),
    (FL_CASEFOLD, 'F'),
    (FL_INLINE_DATA, 'N'),
    (FL_PROJINHERIT, 'P'),
    (FL_VERITY, 'V'),
    (FL_NOCOMPR, 'm'),
];

/// Letters lsattr shows but chattr does not take: the kernel keeps these itself.
const READ_ONLY: &str = "EINV";

/// The flags as lsattr prints them: a letter or '-' for each flag of the table.
pub fn flag_string(flags: u32) -> String {
    LETTERS
        .iter()
        .map(|&(f, c)| if flags & f != 0 { c } else { '-' })
        .collect()
}

/// One chattr mode word (`+ia`, `-d`, `=e`) as (operator, flags).
fn parse_mode(word: &str) -> Result<(char, u32)> {
    let mut chars = word.chars();
    let op = chars.next().unwrap_or(' ');
    if !matches!(op, '+' | '-' | '=') {
        bail!(
            "{word:?}: a mode is +, - or = followed by letters of [{}]",
            settable()
        );
    }
    let mut flags = 0;
    for c in chars {
        match LETTERS.iter().find(|&&(_, l)| l == c) {
            Some(&(f, _)) if !READ_ONLY.contains(c) => flags |= f,
            _ => bail!("{word:?}: unknown or read-only flag {c:?}"),
        }
    }
    Ok((op, flags))
}

fn settable() -> String {
    LETTERS
        .iter()
        .map(|&(_, c)| c)
        .filter(|c| !READ_ONLY.contains(*c))
        .collect()
}

/// The flags chattr asks for, from the current ones and the modes in order. `=` replaces
/// the flags chattr can set and keeps the others (EXTENTS among them unless named).
pub fn apply_modes(old: u32, modes: &[(char, u32)]) -> u32 {
    let all: u32 = LETTERS
        .iter()
        .filter(|(_, c)| !READ_ONLY.contains(*c) && *c != 'e')
        .fold(0, |a, (f, _)| a | f);
    modes.iter().fold(old, |f, &(op, m)| match op {
        '+' => f | m,
        '-' => f & !m,
        _ => (f & !all) | m,
    })
}

/// `uext4 chattr [-R] [-p PROJECT] MODE... IMAGE:PATH`.
pub fn chattr(modes: &[String], project: Option<u32>, path: &str, recursive: bool) -> Result<()> {
    let modes: Vec<(char, u32)> = modes.iter().map(|m| parse_mode(m)).collect::<Result<_>>()?;
    if modes.is_empty() && project.is_none() {
        bail!("give a mode (+-=[{}]) or -p PROJECT", settable());
    }
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let ino = resolve(&fs, &p, true)?;
        let mut one = |fs: &Fs, a: &Attr| -> Result<()> {
            // chattr -R leaves symlinks alone, as e2fsprogs' does.
            if a.mode & 0o170000 == 0o120000 && a.ino != ino {
                return Ok(());
            }
            if !modes.is_empty() {
                let old = fs.get_flags(a.ino)?;
                let new = apply_modes(old, &modes);
                if new != old {
                    fs.set_flags(a.ino, new)
                        .with_context(|| format!("inode {}: flags {}", a.ino, flag_string(new)))?;
                }
            }
            if let Some(projid) = project {
                let mut x = fs.get_fsxattr(a.ino)?;
                x.projid = projid;
                fs.set_fsxattr_as(&uext4::Cred::root(), a.ino, &x)?;
            }
            Ok(())
        };
        if recursive {
            walk(&fs, ino, &mut one)
        } else {
            one(&fs, &fs.getattr(ino)?)
        }
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

/// What `uext4 lsattr` prints besides the flags.
#[derive(Clone, Copy, Default)]
pub struct LsattrOpts {
    /// `-d`: a directory itself, not its entries.
    pub dir_itself: bool,
    /// `-R`: below directories too.
    pub recursive: bool,
    /// `-a`: entries starting with '.' too.
    pub all: bool,
    /// `-p`: the project id.
    pub project: bool,
    /// `-v`: the generation.
    pub version: bool,
}

/// `uext4 lsattr [-dRapv] IMAGE:PATH`, as lsattr(1) prints: `[PROJECT ][VERSION ]FLAGS PATH`.
pub fn lsattr(path: &str, o: LsattrOpts) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, true).with_context(|| path.to_string())?;
    let line = |ino: u32, name: &str| -> Result<()> {
        let a = fs.getattr(ino)?;
        let mut out = String::new();
        if o.project {
            out += &format!("{:5} ", fs.get_fsxattr(ino)?.projid);
        }
        if o.version {
            out += &format!("{:<10} ", a.generation);
        }
        println!("{out}{} {name}", flag_string(fs.get_flags(ino)?));
        Ok(())
    };
    if o.dir_itself || !fs.getattr(ino)?.is_dir() {
        return line(ino, &p);
    }
    let mut dirs = vec![(ino, p.trim_end_matches('/').to_string())];
    while let Some((d, dp)) = dirs.pop() {
        let mut kids = Vec::new();
        fs.readdir(d, 0, &mut |e| {
            kids.push(e);
            true
        })?;
        kids.sort_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for e in kids {
            if e.name == b"." || e.name == b".." || (!o.all && e.name.starts_with(b".")) {
                continue;
            }
            let kp = format!("{dp}/{}", escaped_name(&e.name));
            // Special files have no flags to ask for through an open file: lsattr skips
            // them, and so does this.
            if !matches!(e.kind, uext4::FT_REG | uext4::FT_DIR) {
                continue;
            }
            line(e.ino, &kp)?;
            if o.recursive && e.kind == uext4::FT_DIR {
                subdirs.push((e.ino, kp));
            }
        }
        dirs.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// `uext4 label IMAGE [LABEL]`: prints the label, or sets it (at most 16 bytes).
pub fn label(image: &Path, new: Option<&str>) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, new.is_none())?;
    let r = match new {
        None => {
            println!("{}", String::from_utf8_lossy(&fs.label()));
            Ok(())
        }
        Some(l) => fs
            .set_label(l.as_bytes())
            .with_context(|| format!("label {l:?}")),
    };
    finish(&fs, &img.path, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_letters() {
        assert_eq!(
            flag_string(FL_IMMUTABLE | FL_EXTENTS),
            "----i---------e-------"
        );
        let m = [parse_mode("+iS").unwrap(), parse_mode("-S").unwrap()];
        assert_eq!(apply_modes(FL_EXTENTS, &m), FL_EXTENTS | FL_IMMUTABLE);
        let eq = [parse_mode("=d").unwrap()];
        assert_eq!(
            apply_modes(FL_EXTENTS | FL_SYNC | FL_INDEX, &eq),
            FL_EXTENTS | FL_INDEX | FL_NODUMP
        );
        assert!(parse_mode("+I").is_err());
        assert!(parse_mode("i").is_err());
    }
}
