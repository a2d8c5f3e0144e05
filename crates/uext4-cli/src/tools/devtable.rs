//! A genext2fs-style device table (`mkfs -D FILE`): device nodes, directories, FIFOs and the
//! owners and modes of files, made without root after the image is filled.
//!
//! One entry a line, fields split by blanks, `#` starts a comment line:
//!
//! ```text
//! # name       type mode uid gid major minor start inc count
//! /dev         d    755  0   0   -     -     -     -   -
//! /dev/console c    600  0   0   5     1     -     -   -
//! /dev/tty     c    666  0   0   4     0     0     1   4
//! ```
//!
//! `type` is `f` (a regular file), `d` (a directory), `c` or `b` (a character or block
//! device), `p` (a FIFO); `mode` is octal (set-id and sticky bits too); `-` is 0. With a
//! `count`, names `NAMEi` are made for i from `start` below `count`, with minor `minor + i*inc
//! - start` (genext2fs's rule). An entry that exists already gets the line's mode and owner
//! (its type stays); a missing one is made. Its directory must exist (an earlier line can make
//! it); a path with `..` is refused.

use crate::image::clean_path;
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use uext4::SetAttr;
use uext4::{Error, Fs};

/// One line of the table.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub name: String,
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub major: u32,
    pub minor: u32,
    pub start: u32,
    pub inc: u32,
    pub count: u32,
}

/// Parses one line; `None` for a blank or comment line.
pub fn parse_line(l: &str) -> Result<Option<Line>> {
    let l = l.trim();
    if l.is_empty() || l.starts_with('#') {
        return Ok(None);
    }
    let f: Vec<&str> = l.split_whitespace().collect();
    if f.len() < 3 || f.len() > 10 {
        bail!(
            "{} fields; expected NAME TYPE MODE [UID GID MAJOR MINOR START INC COUNT]",
            f.len()
        );
    }
    let num = |i: usize, radix: u32, what: &str| -> Result<u32> {
        match f.get(i).copied() {
            None | Some("-") => Ok(0),
            Some(v) => {
                u32::from_str_radix(v, radix).map_err(|_| anyhow!("{what} {v:?} is not a number"))
            }
        }
    };
    let kind = match f[1] {
        "f" | "d" | "c" | "b" | "p" => f[1].chars().next().unwrap_or('f'),
        t => bail!("type {t:?}: use f, d, c, b or p"),
    };
    let mode = num(2, 8, "mode")?;
    let (start, count) = (num(7, 10, "start")?, num(9, 10, "count")?);
    if count.saturating_sub(start) > 1 << 16 {
        bail!("count {count}: more than 65536 nodes from one line");
    }
    if mode > 0o7777 {
        bail!("mode {:o}: only permission, set-id and sticky bits", mode);
    }
    Ok(Some(Line {
        name: f[0].to_string(),
        kind,
        mode,
        uid: num(3, 10, "uid")?,
        gid: num(4, 10, "gid")?,
        major: num(5, 10, "major")?,
        minor: num(6, 10, "minor")?,
        start,
        inc: num(8, 10, "inc")?,
        count,
    }))
}

/// Reads and checks the whole table (before anything is made).
pub fn read(path: &Path) -> Result<Vec<(usize, Line)>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = parse_line(l).with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        if let Some(line) = line {
            clean_path(line.name.as_bytes())
                .with_context(|| format!("{}: line {}", path.display(), i + 1))?;
            out.push((i + 1, line));
        }
    }
    Ok(out)
}

/// Applies the table to the image.
pub fn apply(fs: &Fs, table: &Path, lines: &[(usize, Line)]) -> Result<()> {
    for (n, l) in lines {
        apply_line(fs, l).with_context(|| format!("{}: line {n} ({})", table.display(), l.name))?;
    }
    Ok(())
}

fn apply_line(fs: &Fs, l: &Line) -> Result<()> {
    let names: Vec<(String, u32)> = if l.count > 0 && matches!(l.kind, 'c' | 'b') {
        (l.start..l.count)
            .map(|i| {
                let minor =
                    (l.minor as u64 + i as u64 * l.inc as u64).saturating_sub(l.start as u64);
                (format!("{}{i}", l.name), minor as u32)
            })
            .collect()
    } else {
        vec![(l.name.clone(), l.minor)]
    };
    for (name, minor) in names {
        let comps = clean_path(name.as_bytes())?;
        let Some((last, parents)) = comps.split_last() else {
            // The root itself.
            set(fs, fs.root_ino(), l)?;
            continue;
        };
        let mut dir = fs.root_ino();
        for c in parents {
            let a = fs.lookup(dir, c).map_err(|e| match e {
                Error::NotFound => anyhow!(
                    "directory {} does not exist (list it on an earlier line)",
                    String::from_utf8_lossy(c)
                ),
                e => e.into(),
            })?;
            if !a.is_dir() {
                bail!("{}: not a directory", String::from_utf8_lossy(c));
            }
            dir = a.ino;
        }
        let ino = match fs.lookup(dir, last) {
            Ok(a) => a.ino,
            Err(Error::NotFound) => {
                let ft = match l.kind {
                    'd' => {
                        fs.mkdir(dir, last, l.mode, l.uid, l.gid)?;
                        continue;
                    }
                    'c' => 0o020000,
                    'b' => 0o060000,
                    'p' => 0o010000,
                    _ => 0o100000,
                };
                let rdev = (minor & 0xff) | ((l.major & 0xfff) << 8) | ((minor & !0xff) << 12);
                fs.mknod(dir, last, ft | l.mode, rdev, l.uid, l.gid)?.ino
            }
            Err(e) => return Err(e.into()),
        };
        set(fs, ino, l)?;
    }
    Ok(())
}

fn set(fs: &Fs, ino: u32, l: &Line) -> Result<()> {
    let set = SetAttr {
        mode: Some(l.mode),
        uid: Some(l.uid),
        gid: Some(l.gid),
        ..Default::default()
    };
    fs.setattr(ino, &set)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(parse_line("  # comment").unwrap(), None);
        assert_eq!(parse_line("").unwrap(), None);
        let l = parse_line("/dev/tty c 666 0 5 4 0 0 1 4").unwrap().unwrap();
        assert_eq!(
            (l.kind, l.mode, l.gid, l.major, l.count),
            ('c', 0o666, 5, 4, 4)
        );
        let l = parse_line("/dev d 755 - - - - - - -").unwrap().unwrap();
        assert_eq!((l.kind, l.mode, l.uid), ('d', 0o755, 0));
        assert!(parse_line("/dev/x q 755 0 0").is_err());
        assert!(parse_line("/dev/x c 9z9 0 0").is_err());
        assert!(parse_line("/dev/x c").is_err());
        assert!(parse_line("/dev/x c 70000 0 0").is_err());
    }
}
