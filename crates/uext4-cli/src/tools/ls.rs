//! `uext4 ls`, and the formatting of modes, times and names that `stat` shares.

use crate::image::*;
use anyhow::{Context, Result};
use std::io::Write;
use uext4::Attr;
use uext4::Timestamp;

pub(super) fn mode_string(mode: u16) -> String {
    let t = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    // Set-user-id, set-group-id and sticky bits over the x positions, as ls(1).
    let mut b: Vec<char> = s.chars().collect();
    for (bit, pos, on, off) in [
        (0o4000, 3, 's', 'S'),
        (0o2000, 6, 's', 'S'),
        (0o1000, 9, 't', 'T'),
    ] {
        if mode & bit != 0 {
            b[pos] = if b[pos] == 'x' { on } else { off };
        }
    }
    b.into_iter().collect()
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
pub(super) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// "2026-11-22 13:49:01" (UTC).
pub(super) fn fmt_date(sec: i64) -> String {
    let (y, mo, d) = civil_from_days(sec.div_euclid(86_400));
    let s = sec.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// stat(1) style: "2026-11-22 13:49:01.150985199 +0000".
pub(super) fn fmt_time(t: Timestamp) -> String {
    format!("{}.{:09} +0000", fmt_date(t.sec), t.nsec)
}

/// A name as ls -b shows it: printable UTF-8 as it is; backslash, control bytes and bytes
/// that are not UTF-8 as C escapes (`\n`, `\\`, `\377`).
pub(super) fn escaped_name(b: &[u8]) -> String {
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for x in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{x:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        for x in chunk.invalid() {
            out.push_str(&format!("\\{x:03o}"));
        }
    }
    out
}

/// A size as `ls -h` shows it: bytes below 1024, else a power of 1024 with K, M, G, T, P, E,
/// rounded up, one decimal below 10 (1.5K, 12M, 3.1G).
pub(super) fn human_size(n: u64) -> String {
    if n < 1024 {
        return n.to_string();
    }
    let mut unit = 0;
    let mut div = 1u128;
    while n as u128 >= div * 1024 && unit < 6 {
        div *= 1024;
        unit += 1;
    }
    let suffix = ["", "K", "M", "G", "T", "P", "E"][unit];
    let n = n as u128;
    // Tenths, rounded up; below 10 one decimal is shown, as ls does.
    let tenths = (n * 10).div_ceil(div);
    if tenths < 100 {
        format!("{}.{}{suffix}", tenths / 10, tenths % 10)
    } else {
        let whole = n.div_ceil(div);
        // 1023.1K rounds up to 1024K, which ls shows as 1.0M.
        if whole >= 1024 && unit < 6 {
            format!("1.0{}", ["", "K", "M", "G", "T", "P", "E"][unit + 1])
        } else {
            format!("{whole}{suffix}")
        }
    }
}

pub(super) fn ls(path: &str, long: bool, human: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    // As ls(1): with -l a symlink named as the argument is shown itself, unless it ends in '/'.
    let follow = !long || p.ends_with('/');
    let ino = resolve(&fs, &p, follow).with_context(|| path.to_string())?;
    let a = fs.getattr(ino).with_context(|| path.to_string())?;
    use std::io::IsTerminal;
    let mut out = std::io::stdout().lock();
    // As ls(1): names go out as they are to a pipe (every byte, UTF-8 or not), and escaped
    // on a terminal, so that a newline or a control byte in a name cannot pass for something
    // else.
    let tty = out.is_terminal();
    let shown = |b: &[u8]| -> Vec<u8> {
        if tty {
            escaped_name(b).into_bytes()
        } else {
            b.to_vec()
        }
    };
    let mut show = |name: &[u8], a: &Attr| -> Result<()> {
        if long {
            let link = if a.mode & 0o170000 == 0o120000 {
                [&b" -> "[..], &shown(&fs.readlink(a.ino)?)].concat()
            } else {
                Vec::new()
            };
            write!(
                out,
                "{} {:>3} {:>5} {:>5} {:>12} {} ",
                mode_string(a.mode),
                a.nlink,
                a.uid,
                a.gid,
                if a.mode & 0o170000 == 0o020000 || a.mode & 0o170000 == 0o060000 {
                    format!(
                        "{}, {}",
                        (a.rdev >> 8) & 0xfff,
                        (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00)
                    )
                } else if human {
                    human_size(a.size)
                } else {
                    a.size.to_string()
                },
                &fmt_date(a.mtime.sec)[..16],
            )?;
            out.write_all(&shown(name))?;
            out.write_all(&link)?;
            out.write_all(b"\n")?;
        } else {
            out.write_all(&shown(name))?;
            out.write_all(b"\n")?;
        }
        Ok(())
    };
    if !a.is_dir() {
        return show(p.as_bytes(), &a);
    }
    let mut entries = Vec::new();
    fs.readdir(ino, 0, &mut |e| {
        entries.push(e);
        true
    })
    .with_context(|| path.to_string())?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let a = fs.getattr(e.ino).with_context(|| {
            format!(
                "{}/{}",
                path.trim_end_matches('/'),
                String::from_utf8_lossy(&e.name)
            )
        })?;
        show(&e.name, &a)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_ls_h_writes_them() {
        for (n, want) in [
            (0, "0"),
            (1023, "1023"),
            (1024, "1.0K"),
            (1536, "1.5K"),
            (1537, "1.6K"),
            (10 * 1024, "10K"),
            (10 * 1024 + 1, "11K"),
            ((1 << 20) - 1, "1.0M"),
            (12 << 20, "12M"),
            (3 << 30, "3.0G"),
        ] {
            assert_eq!(super::human_size(n), want, "{n}");
        }
    }

    #[test]
    fn names_on_a_terminal_are_escaped_as_ls_b() {
        assert_eq!(super::escaped_name(b"plain name"), "plain name");
        assert_eq!(super::escaped_name(b"a\nb\tc\\d"), "a\\nb\\tc\\\\d");
        assert_eq!(super::escaped_name(b"x\xffy\x01"), "x\\377y\\001");
        assert_eq!(super::escaped_name("é".as_bytes()), "é");
    }
}
