//! Changing owners, modes and times inside an image: `uext4 chmod`, `chown`, `touch`, and the
//! owner squash of `mkfs --all-root`. Each opens the image, changes it and leaves it clean.

use crate::image::{caller, finish, image_loc, open_img, parent_of, resolve, umask};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashSet;
use uext4::Timestamp;
use uext4::{Attr, Error, Fs};
use uext4::{SetAttr, TimeSet};

/// Calls `f` on `ino` and, for a directory, on everything below it (depth first, each
/// directory once, symlinks not followed).
pub fn walk(fs: &Fs, ino: u32, f: &mut dyn FnMut(&Fs, &Attr) -> Result<()>) -> Result<()> {
    let mut seen = HashSet::new();
    let mut stack = vec![ino];
    while let Some(ino) = stack.pop() {
        let a = fs.getattr(ino)?;
        f(fs, &a)?;
        if !a.is_dir() {
            continue;
        }
        if !seen.insert(ino) {
            return Err(crate::image::directory_cycle(ino).into());
        }
        let mut kids = Vec::new();
        fs.readdir(ino, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                kids.push(e.ino);
            }
            true
        })?;
        stack.extend(kids.into_iter().rev());
    }
    Ok(())
}

/// Every inode below `ino` (itself included) owned by 0:0 (`mkfs --all-root`, genext2fs's
/// `-U`); modes, set-id bits and capabilities stay as they are.
pub fn squash_owners(fs: &Fs, ino: u32) -> Result<()> {
    walk(fs, ino, &mut |fs, a| {
        if a.uid != 0 || a.gid != 0 {
            let set = SetAttr {
                uid: Some(0),
                gid: Some(0),
                ctime: Some(a.ctime),
                ..Default::default()
            };
            fs.setattr(a.ino, &set)?;
        }
        Ok(())
    })
}

/// A chmod(1) mode: octal (`755`, `4755`) or symbolic (`u+x,go-w`, `a=rX`, `+t`), applied
/// to the permission bits `old` of a file (`dir`: a directory, for `X`).
pub fn new_mode(spec: &str, old: u32, dir: bool) -> Result<u32> {
    let bad = || anyhow!("{spec:?}: not a mode (octal like 755, or symbolic like u+x,go-w)");
    if !spec.is_empty() && spec.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        let m = u32::from_str_radix(spec, 8).map_err(|_| bad())?;
        if m > 0o7777 {
            return Err(bad());
        }
        return Ok(m);
    }
    let mut mode = old & 0o7777;
    for clause in spec.split(',') {
        let mut chars = clause.chars().peekable();
        let mut who = 0u32;
        while let Some(&c) = chars.peek() {
            who |= match c {
                'u' => 0o4700,
                'g' => 0o2070,
                'o' => 0o1007,
                'a' => 0o7777,
                _ => break,
            };
            chars.next();
        }
        // No "who": all, except what the umask masks (chmod(1)).
        let mask = if who == 0 { 0o7777 & !umask() } else { who };
        let mut any = false;
        while let Some(op) = chars.next() {
            if !matches!(op, '+' | '-' | '=') {
                return Err(bad());
            }
            any = true;
            let mut bits = 0u32;
            while let Some(&c) = chars.peek() {
                if matches!(c, '+' | '-' | '=') {
                    break;
                }
                chars.next();
                bits |= match c {
                    'r' => 0o444,
                    'w' => 0o222,
                    'x' => 0o111,
                    'X' if dir || mode & 0o111 != 0 => 0o111,
                    'X' => 0,
                    's' => 0o6000,
                    't' => 0o1000,
                    // Copies of another class's bits.
                    'u' => ((mode >> 6) & 7) * 0o111,
                    'g' => ((mode >> 3) & 7) * 0o111,
                    'o' => (mode & 7) * 0o111,
                    _ => return Err(bad()),
                };
            }
            let bits = bits & mask;
            match op {
                '+' => mode |= bits,
                '-' => mode &= !bits,
                _ => {
                    let clear = if who == 0 { 0o7777 } else { who };
                    // `=` leaves a directory's set-id bits unless named (chmod(1)).
                    let keep = if dir { 0o6000 & !bits } else { 0 };
                    mode = (mode & !(clear & !keep)) | bits;
                }
            }
        }
        if !any {
            return Err(bad());
        }
    }
    Ok(mode)
}

/// The inodes a command acts on: `path`, and with `recursive` everything below it.
fn each(
    fs: &Fs,
    ino: u32,
    recursive: bool,
    f: &mut dyn FnMut(&Fs, &Attr) -> Result<()>,
) -> Result<()> {
    if recursive {
        walk(fs, ino, f)
    } else {
        f(fs, &fs.getattr(ino)?)
    }
}

pub fn chmod(mode: &str, path: &str, recursive: bool) -> Result<()> {
    // A bad mode fails before the image is opened.
    new_mode(mode, 0, false)?;
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let ino = resolve(&fs, &p, true)?;
        each(&fs, ino, recursive, &mut |fs, a| {
            // chmod -R leaves the symlinks it meets alone (their mode means nothing).
            if a.mode & 0o170000 == 0o120000 {
                return Ok(());
            }
            let m = new_mode(mode, a.mode as u32, a.is_dir())?;
            if m != a.mode as u32 & 0o7777 {
                let set = SetAttr {
                    mode: Some(m),
                    ..Default::default()
                };
                fs.setattr(a.ino, &set)?;
            }
            Ok(())
        })
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

/// `UID`, `UID:GID`, `UID:` or `:GID`, numeric.
pub fn parse_owner(spec: &str) -> Result<(Option<u32>, Option<u32>)> {
    let bad = || anyhow!("{spec:?}: give a numeric UID[:GID] (like 1000:1000, 0, :100)");
    let (u, g) = match spec.split_once([':', '.']) {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let num = |s: &str| -> Result<Option<u32>> {
        if s.is_empty() {
            Ok(None)
        } else {
            s.parse().map(Some).map_err(|_| bad())
        }
    };
    let (uid, gid) = (num(u)?, g.map(num).transpose()?.flatten());
    if uid.is_none() && gid.is_none() {
        return Err(bad());
    }
    Ok((uid, gid))
}

pub fn chown(owner: &str, path: &str, recursive: bool, no_deref: bool) -> Result<()> {
    let (uid, gid) = parse_owner(owner)?;
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        // As chown(1): a symlink named is followed unless -h; those met by -R are changed
        // themselves.
        let ino = resolve(&fs, &p, !no_deref && !recursive)?;
        each(&fs, ino, recursive, &mut |fs, a| {
            let set = SetAttr {
                uid,
                gid,
                ..Default::default()
            };
            // As the kernel's chown (the engine's rule, in the change's handle): a file that is
            // not a directory loses set-user-ID, set-group-ID (when group-executable) and
            // security.capability.
            fs.setattr_as(&uext4::Cred::root(), a.ino, &set)?;
            Ok(())
        })
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn stamp(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32, nsec: u32) -> Result<Timestamp> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        bail!("a date or time out of range");
    }
    Ok(Timestamp {
        sec: days_from_civil(y, mo, d) * 86_400 + (h * 3600 + mi * 60 + s) as i64,
        nsec,
    })
}

/// touch -d: `@SECONDS[.FRACTION]`, `now`, or `YYYY-MM-DD[ HH:MM[:SS[.FRACTION]]]` (also with
/// `T`), in UTC unless followed by `Z`/`UTC` or an offset `+HH:MM`/`-HHMM`.
pub fn parse_date(s: &str) -> Result<Timestamp> {
    let bad = || anyhow!("{s:?}: not a date (@SECONDS, YYYY-MM-DD[ HH:MM[:SS[.NS]]][ +HH:MM])");
    let t = s.trim();
    if t == "now" {
        return Ok(now());
    }
    if let Some(n) = t.strip_prefix('@') {
        let (sec, frac) = n.split_once('.').unwrap_or((n, ""));
        let sec: i64 = sec.parse().map_err(|_| bad())?;
        return Ok(Timestamp {
            sec,
            nsec: frac_ns(frac).ok_or_else(bad)?,
        });
    }
    // The zone at the end.
    let (body, offset) = split_zone(t).ok_or_else(bad)?;
    let (date, time) = match body.split_once(['T', ' ']) {
        Some((d, tm)) => (d, tm.trim()),
        None => (body, ""),
    };
    let dp: Vec<&str> = date.split('-').collect();
    if dp.len() != 3 {
        return Err(bad());
    }
    let y: i64 = dp[0].parse().map_err(|_| bad())?;
    let mo: u32 = dp[1].parse().map_err(|_| bad())?;
    let d: u32 = dp[2].parse().map_err(|_| bad())?;
    let (mut h, mut mi, mut sec, mut ns) = (0, 0, 0, 0);
    if !time.is_empty() {
        let tp: Vec<&str> = time.split(':').collect();
        if !(2..=3).contains(&tp.len()) {
            return Err(bad());
        }
        h = tp[0].parse().map_err(|_| bad())?;
        mi = tp[1].parse().map_err(|_| bad())?;
        if let Some(sp) = tp.get(2) {
            let (sv, frac) = sp.split_once('.').unwrap_or((sp, ""));
            sec = sv.parse().map_err(|_| bad())?;
            ns = frac_ns(frac).ok_or_else(bad)?;
        }
    }
    let mut ts = stamp(y, mo, d, h, mi, sec, ns).map_err(|_| bad())?;
    ts.sec -= offset;
    Ok(ts)
}

/// Splits a trailing zone off: `Z`, `UTC`, `+HH:MM`, `-HHMM` (seconds east of UTC).
fn split_zone(t: &str) -> Option<(&str, i64)> {
    if let Some(b) = t.strip_suffix('Z').or_else(|| t.strip_suffix("UTC")) {
        return Some((b.trim_end(), 0));
    }
    // An offset: the last '+' or a '-' after the date's own dashes, followed by digits.
    if let Some(i) = t.rfind(['+', '-']).filter(|&i| i > 10) {
        let z = t[i + 1..].replace(':', "");
        if z.len() == 4 && z.bytes().all(|b| b.is_ascii_digit()) {
            let h: i64 = z[..2].parse().ok()?;
            let m: i64 = z[2..].parse().ok()?;
            let off = (h * 3600 + m * 60) * if &t[i..=i] == "-" { -1 } else { 1 };
            return Some((t[..i].trim_end(), off));
        }
    }
    Some((t, 0))
}

fn frac_ns(frac: &str) -> Option<u32> {
    if !frac.bytes().all(|b| b.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    if frac.is_empty() {
        return Some(0);
    }
    Some(frac.parse::<u32>().ok()? * 10u32.pow(9 - frac.len() as u32))
}

/// touch -t: `[[CC]YY]MMDDhhmm[.ss]`, in UTC.
pub fn parse_stamp(s: &str) -> Result<Timestamp> {
    let bad = || anyhow!("{s:?}: not a -t stamp ([[CC]YY]MMDDhhmm[.ss])");
    let (main, secs) = s.split_once('.').unwrap_or((s, "00"));
    if !main.bytes().all(|b| b.is_ascii_digit()) || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n = |r: std::ops::Range<usize>| -> Result<u32> {
        main.get(r).and_then(|v| v.parse().ok()).ok_or_else(bad)
    };
    let (y, rest) = match main.len() {
        8 => (crate_year(), 0),
        10 => {
            let yy = n(0..2)? as i64;
            (if yy >= 69 { 1900 + yy } else { 2000 + yy }, 2)
        }
        12 => (n(0..4)? as i64, 4),
        _ => return Err(bad()),
    };
    let sec: u32 = secs.parse().map_err(|_| bad())?;
    stamp(
        y,
        n(rest..rest + 2)?,
        n(rest + 2..rest + 4)?,
        n(rest + 4..rest + 6)?,
        n(rest + 6..rest + 8)?,
        sec,
        0,
    )
    .map_err(|_| bad())
}

/// This year (UTC), for a -t stamp without one.
fn crate_year() -> i64 {
    let mut y = 1970;
    let days = now().sec.div_euclid(86_400);
    while days_from_civil(y + 1, 1, 1) <= days {
        y += 1;
    }
    y
}

/// What `touch` sets.
pub struct TouchArgs {
    pub atime_only: bool,
    pub mtime_only: bool,
    pub no_create: bool,
    pub date: Option<String>,
    pub stamp: Option<String>,
    pub reference: Option<String>,
}

pub fn touch(t: &TouchArgs, path: &str) -> Result<()> {
    let given = [&t.date, &t.stamp, &t.reference]
        .iter()
        .filter(|x| x.is_some())
        .count();
    if given > 1 {
        bail!("give one of -d, -t and -r");
    }
    // The times, before the image is opened for writing.
    let (atime, mtime) = if let Some(d) = &t.date {
        let ts = parse_date(d)?;
        (TimeSet::At(ts), TimeSet::At(ts))
    } else if let Some(s) = &t.stamp {
        let ts = parse_stamp(s)?;
        (TimeSet::At(ts), TimeSet::At(ts))
    } else if let Some(r) = &t.reference {
        reference_times(r)?
    } else {
        (TimeSet::Now, TimeSet::Now)
    };
    let (set_a, set_m) = match (t.atime_only, t.mtime_only) {
        (true, false) => (true, false),
        (false, true) => (false, true),
        _ => (true, true),
    };
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, false)?;
    let r = (|| -> Result<()> {
        let ino = match resolve(&fs, &p, true) {
            Ok(ino) => ino,
            Err(Error::NotFound) if t.no_create => return Ok(()),
            Err(Error::NotFound) => {
                let (d, n) = parent_of(&fs, &p)?;
                let (uid, gid) = caller();
                fs.create(d, &n, 0o666 & !umask(), uid, gid)?.ino
            }
            Err(e) => return Err(e.into()),
        };
        let set = SetAttr {
            atime: set_a.then_some(atime),
            mtime: set_m.then_some(mtime),
            ..Default::default()
        };
        fs.setattr(ino, &set)?;
        Ok(())
    })();
    finish(&fs, &img.path, r.with_context(|| path.to_string()))
}

/// The access and modification times of `r`: a host path or IMAGE:PATH.
fn reference_times(r: &str) -> Result<(TimeSet, TimeSet)> {
    use std::os::unix::fs::MetadataExt;
    let at = |s: i64, n: i64| {
        TimeSet::At(Timestamp {
            sec: s,
            nsec: n as u32,
        })
    };
    if let Ok((img, p)) = image_loc(r) {
        let fs = open_img(&img, true)?;
        let a = fs
            .getattr(resolve(&fs, &p, true).with_context(|| r.to_string())?)
            .with_context(|| r.to_string())?;
        return Ok((TimeSet::At(a.atime), TimeSet::At(a.mtime)));
    }
    let m = std::fs::metadata(r).with_context(|| r.to_string())?;
    Ok((at(m.atime(), m.atime_nsec()), at(m.mtime(), m.mtime_nsec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(new_mode("755", 0o644, false).unwrap(), 0o755);
        assert_eq!(new_mode("4755", 0, false).unwrap(), 0o4755);
        assert_eq!(new_mode("u+x,go-w", 0o666, false).unwrap(), 0o744);
        assert_eq!(new_mode("a=rX", 0o700, true).unwrap(), 0o555);
        assert_eq!(new_mode("a=rX", 0o600, false).unwrap(), 0o444);
        assert_eq!(new_mode("u+s,o+t", 0o755, false).unwrap(), 0o5755);
        assert_eq!(new_mode("g=u", 0o740, false).unwrap(), 0o770);
        assert!(new_mode("q+x", 0, false).is_err());
        assert!(new_mode("8", 0, false).is_err());
        assert!(new_mode("u", 0, false).is_err());
    }

    #[test]
    fn owners() {
        assert_eq!(parse_owner("1000:100").unwrap(), (Some(1000), Some(100)));
        assert_eq!(parse_owner("0").unwrap(), (Some(0), None));
        assert_eq!(parse_owner(":7").unwrap(), (None, Some(7)));
        assert!(parse_owner("root").is_err());
        assert!(parse_owner(":").is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date("@1700000000").unwrap().sec, 1_700_000_000);
        let t = parse_date("2023-11-14 22:13:20.5").unwrap();
        assert_eq!((t.sec, t.nsec), (1_700_000_000, 500_000_000));
        assert_eq!(
            parse_date("2023-11-15T00:13:20+02:00").unwrap().sec,
            1_700_000_000
        );
        assert_eq!(parse_date("1970-01-02").unwrap().sec, 86_400);
        assert!(parse_date("yesterday").is_err());
        assert_eq!(parse_stamp("202311142213.20").unwrap().sec, 1_700_000_000);
        assert_eq!(parse_stamp("2311142213.20").unwrap().sec, 1_700_000_000);
        assert!(parse_stamp("11142213").is_ok());
        assert!(parse_stamp("2311x42213").is_err());
    }
}
