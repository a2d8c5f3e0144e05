//! The journal's history, read-only: `uext4 journal` lists the transactions the log still
//! holds and what each logged block is (debugfs's `logdump -a`, with the blocks named), or
//! the older copies of one inode or block; `uext4 recover` writes out deleted files from
//! older copies of their inodes in the log, as extundelete and ext4magic do
//! (crates/uext4/src/journal_history.rs reads the log).

use super::stat::{ctime_string, debugfs_view, json_of};
use crate::image::*;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use uext4::{BlockUse, Fs, InodeRecord, JournalHistory, LoggedState, LoggedTransaction};

/// What `uext4 journal` shows.
pub struct JournalOpts {
    pub json: bool,
    pub inode: Option<u32>,
    pub block: Option<u64>,
}

fn use_text(u: &BlockUse) -> String {
    match u {
        BlockUse::Superblock { group: 0 } => "superblock".into(),
        BlockUse::Superblock { group } => format!("backup superblock (group {group})"),
        BlockUse::GroupDescriptors { group } => {
            format!("group descriptors (copy in group {group})")
        }
        BlockUse::BlockBitmap { group } => format!("block bitmap of group {group}"),
        BlockUse::InodeBitmap { group } => format!("inode bitmap of group {group}"),
        BlockUse::InodeTable { group, first, last } => {
            format!("inode table of group {group}, inodes {first}-{last}")
        }
        BlockUse::Journal => "the journal".into(),
        BlockUse::Data {
            ino,
            lblk,
            dir: true,
        } => format!("directory block {lblk} of inode {ino}"),
        BlockUse::Data {
            ino,
            lblk,
            dir: false,
        } => format!("data block {lblk} of inode {ino}"),
        BlockUse::Map { ino, level } => format!("map block (level {level}) of inode {ino}"),
        BlockUse::Xattr { ino } => format!("xattr block of inode {ino}"),
        BlockUse::Unowned => "unowned now".into(),
    }
}

fn use_json(u: &BlockUse) -> Value {
    match u {
        BlockUse::Superblock { group } => json!({"kind": "superblock", "group": group}),
        BlockUse::GroupDescriptors { group } => {
            json!({"kind": "group_descriptors", "group": group})
        }
        BlockUse::BlockBitmap { group } => json!({"kind": "block_bitmap", "group": group}),
        BlockUse::InodeBitmap { group } => json!({"kind": "inode_bitmap", "group": group}),
        BlockUse::InodeTable { group, first, last } => {
            json!({"kind": "inode_table", "group": group, "first_inode": first, "last_inode": last})
        }
        BlockUse::Journal => json!({"kind": "journal"}),
        BlockUse::Data { ino, lblk, dir } => json!({
            "kind": if *dir { "directory" } else { "data" }, "inode": ino, "logical": lblk,
        }),
        BlockUse::Map { ino, level } => json!({"kind": "map", "inode": ino, "level": level}),
        BlockUse::Xattr { ino } => json!({"kind": "xattr", "inode": ino}),
        BlockUse::Unowned => json!({"kind": "unowned"}),
    }
}

fn time_text(t: Option<(u64, u32)>) -> String {
    match t {
        Some((s, ns)) => format!("{} (+{ns} ns)", ctime_string(s as i64)),
        None => "no commit time".into(),
    }
}

fn state_text(s: LoggedState) -> &'static str {
    match s {
        LoggedState::Intact => "",
        LoggedState::Overwritten => " (overwritten in the log)",
        LoggedState::BadChecksum => " (bad checksum)",
    }
}

fn state_json(s: LoggedState) -> &'static str {
    match s {
        LoggedState::Intact => "intact",
        LoggedState::Overwritten => "overwritten",
        LoggedState::BadChecksum => "bad_checksum",
    }
}

/// `uext4 journal IMAGE [--inode N | --block B] [--json]`.
pub fn journal(image: &Path, o: JournalOpts) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let h = fs
        .journal_history()
        .with_context(|| format!("{}: the journal", image.display()))?;
    if let Some(ino) = o.inode {
        return inode_copies(&fs, &h, ino, o.json);
    }
    let txns: Vec<&LoggedTransaction> = match o.block {
        Some(b) => h
            .transactions
            .iter()
            .filter(|t| t.blocks.iter().any(|l| l.fs_block == b))
            .collect(),
        None => h.transactions.iter().collect(),
    };
    let all: Vec<u64> = txns
        .iter()
        .flat_map(|t| t.blocks.iter().map(|b| b.fs_block))
        .collect();
    let uses = fs.block_uses(&all)?;
    let mut uses = uses.iter();
    if o.json {
        let list: Vec<Value> = txns
            .iter()
            .map(|t| {
                let blocks: Vec<Value> = t
                    .blocks
                    .iter()
                    .map(|b| {
                        json!({
                            "block": b.fs_block, "log_block": b.log_block,
                            "state": state_json(b.state), "now": use_json(uses.next().expect("one use per block")),
                        })
                    })
                    .collect();
                json!({
                    "sequence": t.sequence, "committed": t.committed,
                    "commit_time": t.commit_time.map(|(s, n)| json!({"sec": s, "nsec": n})),
                    "blocks": blocks, "revoked": t.revoked,
                })
            })
            .collect();
        let out = json!({
            "first": h.first, "length": h.maxlen, "sequence": h.sequence, "start": h.start,
            "transactions": list,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "Journal: {} blocks, log from block {}; next sequence {}; {}",
        h.maxlen,
        h.first,
        h.sequence,
        if h.start == 0 {
            "nothing to replay".to_string()
        } else {
            format!("recovery starts at log block {}", h.start)
        }
    );
    for t in txns {
        println!(
            "transaction {}: {}, {}, {} blocks{}",
            t.sequence,
            if t.committed {
                "committed"
            } else {
                "not committed"
            },
            time_text(t.commit_time),
            t.blocks.len(),
            if t.revoked.is_empty() {
                String::new()
            } else {
                format!(", {} revoked", t.revoked.len())
            }
        );
        for b in &t.blocks {
            let u = uses.next().expect("one use per block");
            println!(
                "  block {} at log block {}: {}{}",
                b.fs_block,
                b.log_block,
                use_text(u),
                state_text(b.state)
            );
        }
        for r in &t.revoked {
            println!("  revoked block {r}");
        }
    }
    Ok(())
}

fn inode_copies(fs: &Fs, h: &JournalHistory, ino: u32, json: bool) -> Result<()> {
    let now = fs.inode_record(ino)?;
    let copies = fs.logged_inode_copies(h, ino)?;
    let rec_of = |raw: &uext4::format::inode::RawInode| InodeRecord {
        raw: raw.clone(),
        checksum_ok: None,
        allocated: false,
        ..now.clone()
    };
    if json {
        let list: Vec<Value> = copies
            .iter()
            .map(|c| {
                let rec = rec_of(&c.raw);
                let map = fs.block_map(&rec.raw).unwrap_or_default();
                json!({
                    "sequence": c.sequence,
                    "commit_time": c.commit_time.map(|(s, n)| json!({"sec": s, "nsec": n})),
                    "inode": json_of(fs, &rec, &map),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"inode": ino, "copies": list}))?
        );
        return Ok(());
    }
    if copies.is_empty() {
        println!("inode {ino}: no copy in the log");
    }
    for c in &copies {
        println!(
            "inode {ino} as transaction {} logged it ({}):",
            c.sequence,
            time_text(c.commit_time)
        );
        let rec = rec_of(&c.raw);
        let map = fs.block_map(&rec.raw).unwrap_or_default();
        debugfs_view(fs, &rec, &map);
        println!();
    }
    Ok(())
}

/// `uext4 recover IMAGE DIR [--inode N]... [--json]`: deleted files brought back from older
/// copies of their inodes in the log, written under DIR by name where one is found (as
/// extundelete's RECOVERED_FILES), as `<N>` otherwise. Files whose blocks are in use again
/// are written too and reported as possibly stale.
pub fn recover(image: &Path, dir: &Path, only: &[u32], json: bool) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let h = fs
        .journal_history()
        .with_context(|| format!("{}: the journal", image.display()))?;
    let files = fs.deleted_files(&h)?;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut report = Vec::new();
    for f in files
        .iter()
        .filter(|f| only.is_empty() || only.contains(&f.ino))
    {
        let name = f.names.first().map(|(d, n)| {
            let parent = super::examine::dir_path(&fs, *d);
            let n = String::from_utf8_lossy(n);
            format!("{}/{n}", parent.trim_end_matches('/'))
        });
        let rel = match &name {
            Some(p) if !p.starts_with('<') => p.trim_start_matches('/').to_string(),
            _ => format!("<{}>", f.ino),
        };
        let rel = safe_relative(&rel, f.ino);
        let out = dir.join(&rel);
        if let Some(p) = out.parent() {
            std::fs::create_dir_all(p).with_context(|| p.display().to_string())?;
        }
        let file = std::fs::File::create(&out).with_context(|| out.display().to_string())?;
        let size = fs.read_logged_copy(f.ino, &f.copy.raw, &mut |off, b| {
            use std::os::unix::fs::FileExt;
            file.write_all_at(b, off).map_err(uext4::Error::from)
        })?;
        file.set_len(size)?;
        report.push((f, rel, name, size));
    }
    if json {
        let list: Vec<Value> = report
            .iter()
            .map(|(f, rel, name, size)| {
                json!({
                    "inode": f.ino, "path": name, "written_to": rel.display().to_string(), "size": size,
                    "sequence": f.copy.sequence, "blocks": f.blocks, "blocks_in_use_again": f.reused,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    for (f, rel, name, size) in &report {
        println!(
            "{}\t{}\t{size} bytes\tfrom transaction {}{}{}",
            f.ino,
            rel.display(),
            f.copy.sequence,
            if name.is_none() {
                "\t(no name found)"
            } else {
                ""
            },
            if f.reused > 0 {
                format!(
                    "\t({} of {} blocks are in use again: may hold other data)",
                    f.reused, f.blocks
                )
            } else {
                String::new()
            }
        );
    }
    eprintln!(
        "{} deleted files recovered into {}",
        report.len(),
        dir.display()
    );
    Ok(())
}

/// `rel` with no way out of the output directory: `.`, `..` and empty parts dropped.
fn safe_relative(rel: &str, ino: u32) -> std::path::PathBuf {
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect();
    if parts.is_empty() {
        return format!("<{ino}>").into();
    }
    parts.iter().collect()
}
