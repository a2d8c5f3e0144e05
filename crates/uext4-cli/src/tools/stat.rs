//! `uext4 stat`: one inode's attributes, as stat(1) prints them, then the inode as its table
//! holds it, in debugfs's `stat` layout (times raw and decoded, dtime, flags, the extent tree
//! or block map, checksum, place on disk). `IMAGE:<N>` names an inode by number, used or not
//! (a deleted inode shows its last record); `--json` prints one object instead.

use super::ls::*;
use crate::image::*;
use anyhow::{Context, Result};
use uext4::format::le32;
use uext4::{BlockMap, Fs, InodeRecord, MapEntry};

pub(super) fn stat(path: &str, json: bool) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = match inode_number(p.trim_start_matches('/')) {
        Some(n) => n,
        None => resolve(&fs, &p, false).with_context(|| path.to_string())?,
    };
    let rec = fs
        .inode_record(ino)
        .with_context(|| format!("{path}: inode {ino}"))?;
    let map = fs.block_map(&rec.raw)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_of(&fs, &rec, &map))?
        );
        return Ok(());
    }
    // The live view first, where the inode is in use.
    if rec.allocated && rec.raw.links_count() > 0 {
        live(&fs, &p, ino)?;
        println!();
    }
    debugfs_view(&fs, &rec, &map);
    Ok(())
}

/// stat(1)'s layout.
fn live(fs: &Fs, p: &str, ino: u32) -> Result<()> {
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

/// debugfs's name of a file type.
fn type_name(mode: u16) -> &'static str {
    match mode & 0o170000 {
        0o100000 => "regular",
        0o040000 => "directory",
        0o120000 => "symlink",
        0o020000 => "character special",
        0o060000 => "block special",
        0o010000 => "FIFO",
        0o140000 => "socket",
        _ => "bad type",
    }
}

/// The raw fields debugfs prints, by byte offset in the inode (ext4.h's struct ext4_inode).
struct Raw<'a>(&'a [u8]);

impl Raw<'_> {
    fn u32(&self, off: usize) -> u32 {
        if off + 4 <= self.0.len() {
            le32(self.0, off)
        } else {
            0
        }
    }
    fn u16(&self, off: usize) -> u16 {
        if off + 2 <= self.0.len() {
            u16::from_le_bytes([self.0[off], self.0[off + 1]])
        } else {
            0
        }
    }
    /// Whether the extra field at `off` lies within i_extra_isize.
    fn has_extra(&self, off: usize, size: usize) -> bool {
        self.0.len() > 128 && off + size <= 128 + self.u16(0x80) as usize
    }
    fn extra32(&self, off: usize) -> Option<u32> {
        self.has_extra(off, 4).then(|| self.u32(off))
    }
}

/// "Sun Nov 29 01:06:05 2026" (UTC), as ctime(3) writes it.
pub(super) fn ctime_string(sec: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = sec.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let s = sec.rem_euclid(86_400);
    format!(
        "{} {} {d:2} {:02}:{:02}:{:02} {y}",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[m as usize - 1],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Seconds of a 32-bit time and its extra field's epoch bits.
fn seconds(lo: u32, extra: Option<u32>) -> i64 {
    lo as i32 as i64 + (((extra.unwrap_or(0) & 3) as i64) << 32)
}

/// debugfs's line for one time: `  name: 0xLO:EXTRA -- DATE`.
fn time_line(name: &str, lo: u32, extra: Option<u32>, extra_shown: Option<u32>) -> String {
    // debugfs pads the names to six columns only where it prints an extra field.
    let (raw, name) = match (extra, extra_shown) {
        (Some(e), _) => (format!("0x{lo:08x}:{e:08x}"), format!("{name:>6}")),
        (None, Some(e)) => (format!("0x{lo:08x}:({e:08x})"), format!("{name:>6}")),
        (None, None) => (format!("0x{lo:08x}"), name.to_string()),
    };
    let secs = seconds(lo, extra.or(extra_shown));
    format!("{name}: {raw} -- {}", ctime_string(secs))
}

/// The EXTENTS or BLOCKS line as debugfs writes it.
fn map_line(map: &BlockMap) -> String {
    let mut parts = Vec::new();
    let mut total = 0u64;
    for e in &map.entries {
        match *e {
            MapEntry::Map { level, pblk } => {
                total += 1;
                parts.push(if map.extents {
                    format!("(ETB{level}):{pblk}")
                } else {
                    let name = ["IND", "DIND", "TIND"][(level as usize).clamp(1, 3) - 1];
                    format!("({name}):{pblk}")
                });
            }
            MapEntry::Data(r) => {
                total += r.len;
                let u = if r.unwritten { "[u]" } else { "" };
                parts.push(if r.len == 1 {
                    format!("({}{u}):{}", r.lblk, r.pblk)
                } else {
                    format!(
                        "({}-{}{u}):{}-{}",
                        r.lblk,
                        r.lblk + r.len - 1,
                        r.pblk,
                        r.pblk + r.len - 1
                    )
                });
            }
        }
    }
    let mut s = parts.join(", ");
    if !map.extents && !parts.is_empty() {
        s += &format!("\nTOTAL: {total}");
    }
    s
}

/// debugfs's `stat` layout, with what debugfs leaves implicit said outright (the record's
/// place, whether its checksum holds, whether the bitmap has it in use).
pub(super) fn debugfs_view(fs: &Fs, rec: &InodeRecord, map: &BlockMap) {
    let b = rec.raw.bytes();
    let r = Raw(b);
    let mode = r.u16(0);
    let kind = mode & 0o170000;
    println!(
        "Inode: {}   Type: {}    Mode:  {:04o}   Flags: 0x{:x}",
        rec.ino,
        type_name(mode),
        mode & 0o7777,
        r.u32(0x20)
    );
    match r.extra32(0x98) {
        Some(hi) => println!(
            "Generation: {}    Version: 0x{hi:08x}:{:08x}",
            r.u32(0x64),
            r.u32(0x24)
        ),
        None => println!(
            "Generation: {}    Version: 0x{:08x}",
            r.u32(0x64),
            r.u32(0x24)
        ),
    }
    let uid = r.u16(0x02) as u32 | (r.u16(0x78) as u32) << 16;
    let gid = r.u16(0x18) as u32 | (r.u16(0x7A) as u32) << 16;
    let project = r
        .extra32(0x9C)
        .map_or(String::new(), |p| format!("   Project: {p:5}"));
    let size = if matches!(kind, 0o100000 | 0o040000) {
        rec.raw.size()
    } else {
        r.u32(0x04) as u64
    };
    println!("User: {uid:5}   Group: {gid:5}{project}   Size: {size}");
    println!("File ACL: {}", rec.raw.file_acl());
    let blocks = r.u32(0x1C) as u64 | (r.u16(0x74) as u64) << 32;
    println!("Links: {}   Blockcount: {blocks}", r.u16(0x1A));
    println!("Fragment:  Address: 0    Number: 0    Size: 0");
    let ctime_extra = r.extra32(0x84);
    println!("{}", time_line("ctime", r.u32(0x0C), ctime_extra, None));
    println!("{}", time_line("atime", r.u32(0x08), r.extra32(0x8C), None));
    println!("{}", time_line("mtime", r.u32(0x10), r.extra32(0x88), None));
    if let Some(e) = r.extra32(0x94) {
        println!("{}", time_line("crtime", r.u32(0x90), Some(e), None));
    }
    if r.u32(0x14) != 0 {
        println!("{}", time_line("dtime", r.u32(0x14), None, ctime_extra));
    }
    if b.len() > 128 {
        println!("Size of extra inode fields: {}", r.u16(0x80));
    }
    if let Ok(x) = fs.listxattr(rec.ino) {
        if !x.is_empty() {
            println!("Extended attributes:");
            for n in x {
                println!("  {}", String::from_utf8_lossy(&n));
            }
        }
    }
    if rec.checksum_ok.is_some()
        || fs
            .superblock()
            .has_ro_compat(uext4::format::features::RO_COMPAT_METADATA_CSUM)
    {
        let hi = if r.has_extra(0x82, 2) {
            r.u16(0x82) as u32
        } else {
            0
        };
        let stored = r.u16(0x7C) as u32 | hi << 16;
        let verdict = if rec.checksum_ok == Some(false) {
            " (does not match)"
        } else {
            ""
        };
        println!("Inode checksum: 0x{stored:08x}{verdict}");
    }
    tail(rec, map, &r, kind);
    if let Some(d) = &map.damage {
        println!("Map damaged: {d}");
    }
    println!(
        "Location: group {}, inode table block {}, offset {}; {}",
        rec.group,
        rec.table_block,
        rec.offset,
        if rec.allocated {
            "in use"
        } else {
            "not in use"
        }
    );
}

/// What follows the checksum in debugfs's layout: a fast symlink's target, a device's
/// numbers, or the map (extents, inline data, or blocks).
fn tail(rec: &InodeRecord, map: &BlockMap, r: &Raw<'_>, kind: u16) {
    let size = rec.raw.size();
    let inline = rec.raw.flags() & uext4::flags::FL_INLINE_DATA != 0;
    if kind == 0o120000 && size > 0 && size < 60 {
        // ext2fs_is_fast_symlink; printed as C prints "%.*s" (up to a NUL).
        let t = &rec.raw.i_block()[..size as usize];
        let t = &t[..t.iter().position(|&c| c == 0).unwrap_or(t.len())];
        println!("Fast link dest: \"{}\"", String::from_utf8_lossy(t));
    } else if matches!(kind, 0o020000 | 0o060000) {
        // Old encoding in i_block[0], new in i_block[1].
        let (old, new) = (le32(rec.raw.i_block(), 0), le32(rec.raw.i_block(), 4));
        let (major, minor, note) = if old != 0 {
            ((old >> 8) & 0xff, old & 0xff, "")
        } else {
            (
                (new & 0xfff00) >> 8,
                (new & 0xff) | ((new >> 12) & 0xfff00),
                "(New-style) ",
            )
        };
        println!(
            "{note}Device major/minor number: {major:02}:{minor:02} (hex {major:02x}:{minor:02x})"
        );
    } else if kind == 0o120000 && inline {
        // A long inline symlink: not shown here (its target is the file's contents).
    } else if map.extents {
        println!("EXTENTS:");
        if !map.entries.is_empty() {
            println!("{}", map_line(map));
        }
    } else if inline {
        println!("Size of inline data: {}", 60 + system_data_len(rec, r));
    } else {
        println!("BLOCKS:");
        println!("{}", map_line(map));
        if map.entries.is_empty() {
            return;
        }
        println!();
    }
}

/// The length of the inode's `system.data` attribute (the inline data past i_block).
fn system_data_len(rec: &InodeRecord, r: &Raw<'_>) -> usize {
    let Some(area) = rec.raw.xattr_area() else {
        return 0;
    };
    let a = &r.0[area];
    if le32(a, 0) != 0xEA02_0000 {
        return 0;
    }
    uext4::format::xattr::parse_entries(a, 4, 4, "inode")
        .ok()
        .and_then(|es| {
            es.into_iter()
                .find(|e| e.index == 7 && e.name == b"data")
                .map(|e| e.value.len())
        })
        .unwrap_or(0)
}

/// The `--json` object: the same facts, with names that do not change (docs/USAGE.md).
pub(super) fn json_of(fs: &Fs, rec: &InodeRecord, map: &BlockMap) -> serde_json::Value {
    let r = Raw(rec.raw.bytes());
    let time = |lo: usize, extra: Option<usize>| {
        let ex = extra.and_then(|o| r.extra32(o));
        serde_json::json!({
            "sec": seconds(r.u32(lo), ex),
            "nsec": ex.map_or(0, |e| e >> 2),
        })
    };
    let runs: Vec<serde_json::Value> = map
        .entries
        .iter()
        .map(|e| match *e {
            MapEntry::Data(d) => serde_json::json!({
                "logical": d.lblk, "physical": d.pblk, "length": d.len, "unwritten": d.unwritten,
            }),
            MapEntry::Map { level, pblk } => serde_json::json!({"map_block": pblk, "level": level}),
        })
        .collect();
    let xattrs: Vec<String> = fs
        .listxattr(rec.ino)
        .unwrap_or_default()
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    serde_json::json!({
        "inode": rec.ino,
        "in_use": rec.allocated,
        "type": type_name(r.u16(0)),
        "mode": r.u16(0) & 0o7777,
        "flags": r.u32(0x20),
        "uid": r.u16(0x02) as u32 | (r.u16(0x78) as u32) << 16,
        "gid": r.u16(0x18) as u32 | (r.u16(0x7A) as u32) << 16,
        "project": r.extra32(0x9C).unwrap_or(0),
        "size": rec.raw.size(),
        "links": r.u16(0x1A),
        "generation": r.u32(0x64),
        "file_acl": rec.raw.file_acl(),
        "atime": time(0x08, Some(0x8C)),
        "mtime": time(0x10, Some(0x88)),
        "ctime": time(0x0C, Some(0x84)),
        "crtime": if r.has_extra(0x90, 8) { time(0x90, Some(0x94)) } else { serde_json::Value::Null },
        "dtime": if r.u32(0x14) != 0 { time(0x14, None) } else { serde_json::Value::Null },
        "checksum_ok": rec.checksum_ok,
        "location": {"group": rec.group, "table_block": rec.table_block, "offset": rec.offset},
        "extents": map.extents,
        "map": runs,
        "map_damage": map.damage,
        "xattrs": xattrs,
    })
}
