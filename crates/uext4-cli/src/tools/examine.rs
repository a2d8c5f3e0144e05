//! The examiner's commands below the namespace, all read-only: `ncheck` (inodes to names) and
//! `icheck` (blocks to inodes) as debugfs's, `inodes` (every inode record, as the Sleuth Kit's
//! `ils`), and `timeline` (the Sleuth Kit's body file, as `fls -r -m /` writes it, for
//! `mactime`). They read inode records and directory blocks as they lie (uext4's
//! `Fs::inode_record`, `Fs::block_map`, `Fs::dir_entries_raw`), so deleted inodes and
//! removed entries are seen, and damage ends one walk, noted, not the command.

use crate::image::*;
use anyhow::Result;
use std::path::Path;
use uext4::{Fs, InodeRecord, MapEntry};

/// Each inode record the inode scan of e2fsprogs would visit: groups whose table is
/// initialised, up to their unused tail where group checksums say so.
fn each_inode(fs: &Fs, f: &mut dyn FnMut(InodeRecord) -> Result<bool>) -> Result<()> {
    let sb = fs.superblock();
    let per = sb.inodes_per_group();
    let groups = sb.inodes_count() / per;
    let csums = sb.has_ro_compat(uext4::format::features::RO_COMPAT_GDT_CSUM)
        || sb.has_ro_compat(uext4::format::features::RO_COMPAT_METADATA_CSUM);
    for g in 0..groups {
        let gd = fs.group_desc(g);
        let mut n = per;
        if csums {
            if gd.flags() & 0x1 != 0 {
                continue; // INODE_UNINIT
            }
            n = per.saturating_sub(gd.itable_unused().min(per as u64) as u32);
        }
        for i in 0..n {
            let ino = g * per + i + 1;
            if !f(fs.inode_record(ino)?)? {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The path of directory `dir` from the root, by its `..` entries (`<N>` where the chain
/// breaks).
pub(super) fn dir_path(fs: &Fs, dir: u32) -> String {
    let mut parts = Vec::new();
    let mut cur = dir;
    for _ in 0..4096 {
        if cur == uext4::ROOT_INO {
            parts.reverse();
            return format!("/{}", parts.join("/"));
        }
        let Ok(rec) = fs.inode_record(cur) else { break };
        let Ok((ents, _)) = fs.dir_entries_raw(cur, &rec.raw, false) else {
            break;
        };
        let Some(parent) = ents.iter().find(|e| e.name == b"..").map(|e| e.inode) else {
            break;
        };
        let Ok(prec) = fs.inode_record(parent) else {
            break;
        };
        let Ok((pents, _)) = fs.dir_entries_raw(parent, &prec.raw, false) else {
            break;
        };
        let Some(me) = pents
            .iter()
            .find(|e| e.inode == cur && e.name != b"." && e.name != b"..")
        else {
            break;
        };
        parts.push(String::from_utf8_lossy(&me.name).into_owned());
        cur = parent;
    }
    parts.reverse();
    format!("<{cur}>/{}", parts.join("/"))
}

/// `uext4 ncheck IMAGE INODE...`: the names of the inodes, as debugfs's `ncheck` finds them
/// (directories in inode order, entries in block order, at most one line per inode asked).
pub fn ncheck(image: &Path, inodes: &[u32], json: bool) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let mut left = inodes.len();
    let mut found: Vec<(u32, String)> = Vec::new();
    each_inode(&fs, &mut |rec| {
        let r = &rec.raw;
        if r.links_count() == 0 || r.dtime() != 0 || !r.is_dir() {
            return Ok(true);
        }
        let (ents, _) = fs.dir_entries_raw(rec.ino, r, false)?;
        let mut parent: Option<String> = None;
        for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
            for &want in inodes.iter().filter(|&&w| w == e.inode) {
                let p = parent.get_or_insert_with(|| dir_path(&fs, rec.ino));
                let sep = if p.ends_with('/') { "" } else { "/" };
                found.push((
                    want,
                    format!("{p}{sep}{}", String::from_utf8_lossy(&e.name)),
                ));
                left = left.saturating_sub(1);
            }
            if left == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    if json {
        let v: Vec<serde_json::Value> = found
            .iter()
            .map(|(i, p)| serde_json::json!({"inode": i, "path": p}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("Inode\tPathname");
        for (i, p) in &found {
            println!("{i}\t{p}");
        }
    }
    Ok(())
}

/// `uext4 icheck IMAGE BLOCK...`: the inode each block belongs to, as debugfs's `icheck`
/// (the first inode in table order that maps it, its xattr block or its map's blocks
/// included).
pub fn icheck(image: &Path, blocks: &[u64], json: bool) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let mut owner: Vec<u32> = vec![0; blocks.len()];
    let mut left = blocks.len();
    let mut claim = |p: u64, len: u64, ino: u32, left: &mut usize| {
        for (i, &b) in blocks.iter().enumerate() {
            if owner[i] == 0 && b >= p && b < p + len {
                owner[i] = ino;
                *left -= 1;
            }
        }
    };
    each_inode(&fs, &mut |rec| {
        let r = &rec.raw;
        if r.links_count() == 0 {
            return Ok(true);
        }
        if r.file_acl() != 0 {
            claim(r.file_acl(), 1, rec.ino, &mut left);
        }
        if r.dtime() == 0 {
            for e in fs.block_map(r)?.entries {
                match e {
                    MapEntry::Data(d) => claim(d.pblk, d.len, rec.ino, &mut left),
                    MapEntry::Map { pblk, .. } => claim(pblk, 1, rec.ino, &mut left),
                }
            }
        }
        Ok(left > 0)
    })?;
    if json {
        let v: Vec<serde_json::Value> = blocks
            .iter()
            .zip(&owner)
            .map(|(b, &o)| serde_json::json!({"block": b, "inode": (o != 0).then_some(o)}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("Block\tInode number");
    for (b, o) in blocks.iter().zip(&owner) {
        if *o == 0 {
            println!("{b}\t<block not found>");
        } else {
            println!("{b}\t{o}");
        }
    }
    Ok(())
}

/// The Sleuth Kit's letter for a file type: of a directory entry's type byte, or of a mode.
fn type_letter_ft(ft: u8) -> char {
    match ft {
        1 => 'r',
        2 => 'd',
        3 => 'c',
        4 => 'b',
        5 => 'p',
        6 => 'h',
        7 => 'l',
        _ => '-',
    }
}

fn type_letter_mode(mode: u16) -> char {
    match mode & 0o170000 {
        0o100000 => 'r',
        0o040000 => 'd',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 'h',
        0o120000 => 'l',
        _ => '-',
    }
}

/// "rwsr-xr-x": permissions with set-id and sticky bits, as ls and the Sleuth Kit write them.
fn perm_string(mode: u16) -> String {
    let bit = |m: u16, c: char| if mode & m != 0 { c } else { '-' };
    let special = |x: bool, s: bool, lower: char, upper: char, plain: char| match (s, x) {
        (true, true) => lower,
        (true, false) => upper,
        (false, true) => plain,
        (false, false) => '-',
    };
    let mut s = String::new();
    for (shift, sbit, lower, upper) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        s.push(bit(0o4 << shift, 'r'));
        s.push(bit(0o2 << shift, 'w'));
        s.push(special(
            mode & (0o1 << shift) != 0,
            mode & sbit != 0,
            lower,
            upper,
            'x',
        ));
    }
    s
}

/// One body-file line: MD5|name|inode|mode|UID|GID|size|atime|mtime|ctime|crtime.
fn body_line(fs: &Fs, name: &str, rec: &InodeRecord, name_type: char) -> String {
    let r = &rec.raw;
    let mode = r.mode();
    let mut name = name.to_string();
    if mode & 0o170000 == 0o120000 {
        if let Ok(t) = fs.readlink(rec.ino) {
            name += &format!(" -> {}", String::from_utf8_lossy(&t));
        }
    }
    let crtime = r.crtime().map_or(0, |t| t.sec);
    format!(
        "0|{name}|{}|{name_type}/{}{}|{}|{}|{}|{}|{}|{}|{crtime}",
        rec.ino,
        type_letter_mode(mode),
        perm_string(mode),
        r.uid(),
        r.gid(),
        r.size(),
        r.atime().sec,
        r.mtime().sec,
        r.ctime().sec,
    )
}

/// `uext4 timeline IMAGE`: the Sleuth Kit's body file for every name (live, and removed
/// ones marked `(deleted)`, or `(deleted-realloc)` where the inode was used again) and for
/// every deleted inode no name reaches (under `/$OrphanFiles`), as `fls -r -m /` writes it;
/// `mactime -b` turns it into a timeline.
pub fn timeline(image: &Path) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let mut named = std::collections::HashSet::new();
    let mut visited = std::collections::HashSet::new();
    let mut stack = vec![(uext4::ROOT_INO, String::new())];
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    use std::io::Write;
    // Depth first, each directory's entries in block order, as fls -r goes.
    fn walk(
        fs: &Fs,
        dir: u32,
        prefix: &str,
        named: &mut std::collections::HashSet<u32>,
        visited: &mut std::collections::HashSet<u32>,
        out: &mut dyn Write,
    ) -> Result<()> {
        if !visited.insert(dir) {
            return Ok(());
        }
        let rec = fs.inode_record(dir)?;
        let (ents, _) = fs.dir_entries_raw(dir, &rec.raw, true)?;
        for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
            let Ok(er) = fs.inode_record(e.inode) else {
                continue;
            };
            named.insert(e.inode);
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            let shown = match (e.removed, er.allocated) {
                (false, _) => path.clone(),
                (true, false) => format!("{path} (deleted)"),
                (true, true) => format!("{path} (deleted-realloc)"),
            };
            writeln!(
                out,
                "{}",
                body_line(fs, &shown, &er, type_letter_ft(e.file_type))
            )?;
            if !e.removed && er.raw.is_dir() && er.allocated {
                walk(fs, e.inode, &path, named, visited, out)?;
            }
        }
        Ok(())
    }
    while let Some((dir, prefix)) = stack.pop() {
        walk(&fs, dir, &prefix, &mut named, &mut visited, &mut out)?;
    }
    let orphans_ino = fs.superblock().inodes_count() + 1;
    writeln!(
        out,
        "0|/$OrphanFiles|{orphans_ino}|V/V---------|0|0|0|0|0|0|0"
    )?;
    each_inode(&fs, &mut |rec| {
        // Deleted and once used (the Sleuth Kit's test: a change time), reached by no name.
        if !rec.allocated && rec.raw.ctime().sec != 0 && !named.contains(&rec.ino) {
            let name = format!("/$OrphanFiles/OrphanFile-{} (deleted)", rec.ino);
            writeln!(out, "{}", body_line(&fs, &name, &rec, '-'))?;
        }
        Ok(true)
    })?;
    Ok(())
}

/// `uext4 inodes IMAGE [--deleted]`: one line per inode record, its number first, as the
/// Sleuth Kit's `ils` writes them (`ils -e` for all; with `--deleted`, as plain `ils`: the
/// inodes not in use that were used once, their change time set).
pub fn inodes(image: &Path, deleted: bool, json: bool) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    use std::io::Write;
    if json {
        // One array, written as the scan goes (an image may hold millions of inodes).
        let mut first = true;
        write!(out, "[")?;
        each_inode(&fs, &mut |rec| {
            let r = &rec.raw;
            if deleted && (rec.allocated || r.ctime().sec == 0) {
                return Ok(true);
            }
            let v = serde_json::json!({
                "inode": rec.ino, "allocated": rec.allocated, "uid": r.uid(), "gid": r.gid(),
                "mode": r.mode(), "links": r.links_count(), "size": r.size(),
                "atime": r.atime().sec, "mtime": r.mtime().sec, "ctime": r.ctime().sec,
                "crtime": r.crtime().map(|t| t.sec), "dtime": r.dtime(),
            });
            write!(out, "{}\n{v}", if first { "" } else { "," })?;
            first = false;
            Ok(true)
        })?;
        writeln!(out, "\n]")?;
        return Ok(());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    writeln!(out, "class|host|device|start_time")?;
    writeln!(out, "ils|{}||{now}", host.trim())?;
    writeln!(
        out,
        "st_ino|st_alloc|st_uid|st_gid|st_mtime|st_atime|st_ctime|st_crtime|st_mode|st_nlink|st_size"
    )?;
    each_inode(&fs, &mut |rec| {
        let r = &rec.raw;
        if deleted && (rec.allocated || r.ctime().sec == 0) {
            return Ok(true);
        }
        writeln!(
            out,
            "{}|{}|{}|{}|{}|{}|{}|{}|{:o}|{}|{}",
            rec.ino,
            if rec.allocated { 'a' } else { 'f' },
            r.uid(),
            r.gid(),
            r.mtime().sec,
            r.atime().sec,
            r.ctime().sec,
            r.crtime().map_or(0, |t| t.sec),
            r.mode() & 0o7777,
            r.links_count(),
            r.size()
        )?;
        Ok(true)
    })?;
    Ok(())
}

/// `uext4 ls --deleted IMAGE:DIR`: the directory's entries in the order its blocks hold
/// them, removed ones still readable in their neighbours' slack marked `(deleted)` with
/// their inode number (debugfs's `ls -d` shows the same entries in `<N>`).
pub fn ls_deleted(path: &str, long: bool, human: bool) -> Result<()> {
    use super::ls::{fmt_date, human_size, mode_string};
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let dir = resolve(&fs, &p, true).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let rec = fs.inode_record(dir)?;
    if !rec.raw.is_dir() {
        anyhow::bail!("{path}: not a directory");
    }
    let (ents, damage) = fs.dir_entries_raw(dir, &rec.raw, true)?;
    for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
        let name = String::from_utf8_lossy(&e.name);
        let mark = if e.removed {
            format!(" (deleted, inode {})", e.inode)
        } else {
            String::new()
        };
        if long {
            let r = fs.inode_record(e.inode)?.raw;
            println!(
                "{} {:>3} {:>5} {:>5} {:>12} {} {name}{mark}",
                mode_string(r.mode()),
                r.links_count(),
                r.uid(),
                r.gid(),
                if human {
                    human_size(r.size())
                } else {
                    r.size().to_string()
                },
                &fmt_date(r.mtime().sec)[..16],
            );
        } else {
            println!("{name}{mark}");
        }
    }
    if let Some(d) = damage {
        eprintln!("uext4: ls: {path}: {d} (the entries before it are shown)");
    }
    Ok(())
}

/// `uext4 ls --json [--deleted] IMAGE:PATH`: the entries as a JSON array, in the order the
/// directory's blocks hold them (fields in docs/USAGE.md); a file that is no directory gives
/// an array of one.
pub fn ls_json(path: &str, deleted: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, true).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let rec = fs.inode_record(ino)?;
    let entry = |name: &[u8], ino: u32, removed: bool| -> Result<serde_json::Value> {
        let r = fs.inode_record(ino)?.raw;
        Ok(serde_json::json!({
            "name": String::from_utf8_lossy(name),
            "inode": ino,
            "type": type_letter_mode(r.mode()).to_string(),
            "deleted": removed,
            "mode": r.mode() & 0o7777,
            "uid": r.uid(),
            "gid": r.gid(),
            "size": r.size(),
            "links": r.links_count(),
            "mtime": {"sec": r.mtime().sec, "nsec": r.mtime().nsec},
        }))
    };
    let mut out = Vec::new();
    if rec.raw.is_dir() {
        let (ents, _) = fs.dir_entries_raw(ino, &rec.raw, deleted)?;
        for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
            out.push(entry(&e.name, e.inode, e.removed)?);
        }
    } else {
        out.push(entry(p.as_bytes(), ino, false)?);
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
