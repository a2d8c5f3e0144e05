//! `uext4 info`: the superblock, the usage, and a whole disk's partitions.

use crate::image::*;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use uext4::blockdev::BlockDevice;
use uext4::image::open_image;
use uext4::partition::{identify, Contents, Table};
use uext4::Error;

thread_local! {
    /// With `--json`, info's lines are kept here instead of printed, then made one object.
    static CAPTURE: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// One line of `info`: printed, or kept for `--json`.
fn emit(line: String) {
    CAPTURE.with(|c| match &mut *c.borrow_mut() {
        Some(v) => v.push(line),
        None => println!("{line}"),
    })
}

macro_rules! say {
    ($($t:tt)*) => {
        emit(format!($($t)*))
    };
}

/// `uext4 info --json`: the same facts as one object. Each `Label: value` line becomes a key,
/// the label in snake_case (`Free blocks` -> `free_blocks`), the value a number where it is
/// one and a string otherwise; the lines after `On disk` go into an `on_disk` object; lines
/// of no such form (a whole disk's partition table) go into `lines`, in order.
pub(super) fn info_json(arg: &Path) -> Result<()> {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let r = info(arg);
    let lines = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    r?;
    let mut top = serde_json::Map::new();
    let mut on_disk = serde_json::Map::new();
    let mut other = Vec::new();
    let mut below = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':').filter(|(k, _)| {
            !k.is_empty()
                && !k.starts_with(' ')
                && k.len() < 26
                && l.as_bytes().get(k.len() + 1) == Some(&b' ')
        }) else {
            other.push(serde_json::Value::String(l));
            continue;
        };
        let key: String = k
            .to_ascii_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("_");
        let v = v.trim();
        let val = v
            .parse::<u64>()
            .map(serde_json::Value::from)
            .unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
        if key == "on_disk" {
            below = true;
            on_disk.insert("note".into(), val);
        } else if below {
            on_disk.insert(key, val);
        } else {
            top.insert(key, val);
        }
    }
    if below {
        top.insert("on_disk".into(), serde_json::Value::Object(on_disk));
    }
    if !other.is_empty() {
        top.insert("lines".into(), serde_json::Value::Array(other));
    }
    println!("{}", serde_json::to_string_pretty(&top)?);
    Ok(())
}

/// A superblock time as dumpe2fs writes it (ctime's layout, in UTC), or "n/a" for none.
fn ctime(sec: i64) -> String {
    if sec == 0 {
        return "n/a".to_string();
    }
    super::stat::ctime_string(sec)
}

/// What dumpe2fs -h shows of a filesystem's settings and history: default mount options,
/// error behaviour, the reserve, creation, mount, write and check times and the mount count.
fn print_history(sb: &uext4::format::superblock::Superblock) {
    // The high bytes of the times (s_wtime_hi, s_mtime_hi, s_mkfs_time_hi, s_lastcheck_hi).
    let hi = |off: usize| i64::from(sb.bytes()[off]) << 32;
    let opts = sb.default_mount_opts();
    // In e2p's order: the journal mode first, then the flags by bit.
    let mut names: Vec<&str> = match opts & 0x0060 {
        0x0020 => vec!["journal_data"],
        0x0040 => vec!["journal_data_ordered"],
        0x0060 => vec!["journal_data_writeback"],
        _ => Vec::new(),
    };
    for (bit, n) in [
        (0x0001, "debug"),
        (0x0002, "bsdgroups"),
        (0x0004, "user_xattr"),
        (0x0008, "acl"),
        (0x0010, "uid16"),
        (0x0100, "nobarrier"),
        (0x0200, "block_validity"),
        (0x0400, "discard"),
        (0x0800, "nodelalloc"),
    ] {
        if opts & bit != 0 {
            names.push(n);
        }
    }
    say!(
        "Default mount options:    {}",
        if names.is_empty() {
            "(none)".to_string()
        } else {
            names.join(" ")
        }
    );
    say!(
        "Errors behavior:          {}",
        match sb.errors() {
            1 => "Continue".to_string(),
            2 => "Remount read-only".to_string(),
            3 => "Panic".to_string(),
            n => format!("Unknown (continue) ({n})"),
        }
    );
    say!("Reserved block count:     {}", sb.r_blocks_count());
    say!("Reserved blocks uid:      {}", sb.def_resuid());
    say!("Reserved blocks gid:      {}", sb.def_resgid());
    say!(
        "Filesystem created:       {}",
        ctime(i64::from(sb.mkfs_time()) | hi(0x276))
    );
    say!(
        "Last mount time:          {}",
        ctime(i64::from(sb.mtime()) | hi(0x275))
    );
    say!(
        "Last write time:          {}",
        ctime(i64::from(sb.wtime()) | hi(0x274))
    );
    say!("Mount count:              {}", sb.mnt_count());
    say!("Maximum mount count:      {}", sb.max_mnt_count() as i16);
    say!(
        "Last checked:             {}",
        ctime(i64::from(sb.lastcheck()) | hi(0x277))
    );
    match sb.checkinterval() {
        0 => say!("Check interval:           0 (<none>)"),
        n => say!("Check interval:           {n} ({} days)", n / 86_400),
    }
}

/// The superblock's identity: UUID, label, features by name, state.
fn print_identity(sb: &uext4::format::superblock::Superblock) {
    use uext4::format::features::*;
    let uuid = sb.uuid();
    let u = |r: std::ops::Range<usize>| {
        uuid[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    say!(
        "Filesystem UUID:          {}-{}-{}-{}-{}",
        u(0..4),
        u(4..6),
        u(6..8),
        u(8..10),
        u(10..16)
    );
    say!("Volume name:              {}", sb.volume_name());
    let mut feats = names(sb.feature_compat(), COMPAT_NAMES);
    feats.extend(names(sb.feature_incompat(), INCOMPAT_NAMES));
    feats.extend(names(sb.feature_ro_compat(), RO_COMPAT_NAMES));
    say!("Features:                 {}", feats.join(" "));
    if sb.has_incompat(INCOMPAT_CASEFOLD) {
        // As dumpe2fs: "utf8-12.1", and the flags when there are any.
        let name = match sb.encoding() {
            uext4::format::superblock::ENCODING_UTF8_12_1 => "utf8-12.1".to_string(),
            n => format!("unknown ({n})"),
        };
        let strict = sb.encoding_flags() & uext4::format::superblock::ENCODING_FLAG_STRICT != 0;
        say!(
            "Character encoding:       {name}{}",
            if strict { " (strict)" } else { "" }
        );
    }
    say!(
        "State:                    {}",
        if sb.state() & 1 != 0 {
            "clean"
        } else {
            "not clean"
        }
    );
}

/// `info` of a filesystem uext4 cannot open (a feature it does not implement): what the
/// primary superblock says, and why it does not open.
fn info_superblock_only(img: &Img, why: &anyhow::Error) -> Result<()> {
    use uext4::format::superblock::{Superblock, SUPERBLOCK_SIZE};
    let image = &img.path;
    let dev = open_image(image, true).with_context(|| image.display().to_string())?;
    let (_, dev) = img.region_in(&dev)?;
    let mut b = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(1024, &mut b)
        .with_context(|| image.display().to_string())?;
    let sb = Superblock::from_bytes(&b);
    print_identity(&sb);
    say!("Block size:               {}", sb.block_size());
    say!("Block count:              {}", sb.blocks_count());
    say!(
        "Free blocks:              {} (superblock)",
        sb.free_blocks_count()
    );
    say!("Inode count:              {}", sb.inodes_count());
    say!(
        "Free inodes:              {} (superblock)",
        sb.free_inodes_count()
    );
    say!("Inode size:               {}", sb.inode_size());
    say!("Opens in uext4:           no: {}", why.root_cause());
    Ok(())
}

/// `info` of a whole disk: its partitions, what each holds, and how to name one.
fn info_partitions(image: &Path, dev: &Arc<dyn BlockDevice>, t: &Table) {
    let p = image.display();
    say!(
        "{p}: a whole disk with a {} partition table ({}-byte sectors), {} partition{}",
        t.scheme,
        t.sector_size,
        t.partitions.len(),
        if t.partitions.len() == 1 { "" } else { "s" }
    );
    say!(
        "{:>3}  {:>14}  {:>14}  {:>10}  {:<24}  {:<16}  holds",
        "#",
        "start (bytes)",
        "size (bytes)",
        "size",
        "type",
        "name"
    );
    let mut ext = Vec::new();
    for part in &t.partitions {
        let holds = if part.extended {
            "(the logical partitions)".to_string()
        } else {
            uext4::partition::identify_partition(dev, part).to_string()
        };
        if !part.extended && holds.starts_with("ext") {
            ext.push(part.number);
        }
        say!(
            "{:>3}  {:>14}  {:>14}  {:>10}  {:<24}  {:<16}  {holds}",
            part.number,
            part.start,
            part.len,
            human_size(part.len),
            part.type_name,
            part.name
        );
    }
    match ext.first() {
        Some(n) => say!(
            "Name a partition as {p}@N: uext4 info {p}@{n}, uext4 ls {p}@{n}:/, \
             uext4 mount {p}@{n} MOUNTPOINT (or -o partition={n})"
        ),
        None => say!("No partition holds ext2/3/4."),
    }
}

/// 1536 -> "1.5 KiB".
fn human_size(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

pub(super) fn info(arg: &Path) -> Result<()> {
    let img = image_arg(arg)?;
    if img.within == Within::Whole {
        // A whole disk or a qcow2 (VMDK, ...) image: say what it is instead of "not ext4".
        if let Ok(dev) = open_image(&img.path, true) {
            match identify(&*dev) {
                Contents::Ext { .. } => {}
                Contents::ImageFormat(f) => bail!("{}: {f}", img.path.display()),
                _ => match Table::read(&*dev) {
                    Ok(Some(t)) => {
                        info_partitions(&img.path, &dev, &t);
                        return Ok(());
                    }
                    Err(e) => bail!("{}: not ext4, and {e}", img.path.display()),
                    Ok(None) => {}
                },
            }
        }
    }
    let fs = match open_img(&img, true) {
        Ok(fs) => fs,
        // What the superblock says can still be shown.
        Err(e) => match e.downcast_ref::<Error>() {
            Some(Error::Unsupported(_) | Error::UnsupportedIncompat(_)) => {
                return info_superblock_only(&img, &e)
            }
            _ => return Err(e),
        },
    };
    let sb = fs.superblock();
    let g = &fs.geo;
    use uext4::format::features::*;
    if let Some(r) = img.region()? {
        say!(
            "Location:                 {}, {} bytes at offset {}",
            match img.within {
                Within::Partition(n) => format!("partition {n} of {}", img.path.display()),
                _ => format!("inside {}", img.path.display()),
            },
            r.len.unwrap_or(0),
            r.offset
        );
    }
    print_identity(&sb);
    say!("Block size:               {}", g.block_size);
    if g.cluster_bits > 0 {
        // bigalloc: blocks are allocated in clusters (dumpe2fs's line).
        say!(
            "Cluster size:             {}",
            g.block_size << g.cluster_bits
        );
    }
    say!("Block count:              {}", g.blocks_count);
    // From the group descriptors (the superblock's counts may lag, as the kernel's do).
    let st = fs.statfs();
    say!("Free blocks:              {}", st.blocks_free);
    say!("Available to users:       {}", st.blocks_avail);
    say!("Inode count:              {}", g.inodes_count);
    say!("Free inodes:              {}", st.files_free);
    say!("Inode size:               {}", g.inode_size);
    say!(
        "Groups:                   {} ({} blocks, {} inodes each)",
        g.group_count,
        g.blocks_per_group,
        g.inodes_per_group
    );
    if g.flex_bg_size > 1 {
        say!("Flex group size:          {}", g.flex_bg_size);
    }
    print_history(&sb);
    if sb.has_compat(COMPAT_HAS_JOURNAL) {
        let j = fs.getattr(sb.journal_inum()).map(|a| a.size).unwrap_or(0);
        say!(
            "Journal:                  inode {}, {} KiB",
            sb.journal_inum(),
            j / 1024
        );
        let mut b = vec![0u8; g.block_size as usize];
        let jsb = fs
            .read(sb.journal_inum(), 0, &mut b)
            .ok()
            .and_then(|_| uext4::journal::format::JournalSuperblock::parse(&b).ok());
        if let Some(js) = jsb {
            let mut f = Vec::new();
            for (bit, name) in [
                (0x1, "revoke"),
                (0x2, "64bit"),
                (0x4, "async_commit"),
                (0x8, "checksum_v2"),
                (0x10, "checksum_v3"),
                (0x20, "fast_commit"),
            ] {
                if js.feature_incompat & bit != 0 {
                    f.push(name);
                }
            }
            if js.feature_compat & 1 != 0 {
                f.push("checksum_v1");
            }
            say!(
                "Journal log:              {} blocks of {}, sequence {}, {}",
                js.maxlen,
                js.block_size,
                js.sequence,
                if js.start == 0 {
                    "empty"
                } else {
                    "holds transactions to replay"
                }
            );
            say!("Journal features:         {}", f.join(" "));
        }
    }
    if let Some(m) = fs.mmp_info() {
        say!("MMP:                      {m}");
    }
    if sb.error_count() > 0 {
        say!(
            "Errors recorded:          {} (last at inode {}, block {})",
            sb.error_count(),
            sb.last_error_ino(),
            sb.last_error_block()
        );
    }
    if let Some(r) = fs.read_only_reason() {
        say!("Opens read-only:          {r}");
    }
    print_on_disk(&img, &fs)
}

/// The image as it is on disk, read past the engine (which may have replayed the journal in
/// memory): the primary superblock's needs_recovery flag, state and orphan list, and the
/// journal superblock's sequence and start, in dumpe2fs -h's terms. Above it, `info` shows
/// what a read-only open sees; the two differ when the journal needs recovery.
fn print_on_disk(img: &Img, fs: &uext4::Fs) -> Result<()> {
    use uext4::format::features::INCOMPAT_RECOVER;
    use uext4::format::superblock::{Superblock, SUPERBLOCK_SIZE};
    let dev = open_image(&img.path, true).with_context(|| img.path.display().to_string())?;
    let (_, dev) = img.region_in(&dev)?;
    let mut b = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(1024, &mut b)
        .with_context(|| img.path.display().to_string())?;
    let sb = Superblock::from_bytes(&b);
    let replayed = fs.journal_replayed_in_memory();
    say!(
        "On disk:                  {}",
        if replayed {
            "as follows; everything above is after the journal's replay in memory (what a \
             read-only open sees; the image is not changed)"
        } else {
            "as above"
        }
    );
    let recover = sb.feature_incompat() & INCOMPAT_RECOVER != 0;
    say!(
        "Needs recovery:           {}",
        if recover { "yes" } else { "no" }
    );
    // dumpe2fs's "Filesystem state": clean or not clean, "with errors" when flagged.
    say!(
        "Filesystem state:         {}{}",
        if sb.state() & 1 != 0 {
            "clean"
        } else {
            "not clean"
        },
        if sb.state() & 2 != 0 {
            " with errors"
        } else {
            ""
        }
    );
    if sb.last_orphan() != 0 {
        say!("First orphan inode:       {}", sb.last_orphan());
    }
    if replayed {
        say!(
            "Free blocks:              {} (superblock)",
            sb.free_blocks_count()
        );
        say!(
            "Free inodes:              {} (superblock)",
            sb.free_inodes_count()
        );
    }
    // The journal superblock where the journal inode starts (nothing moves a journal).
    let jino = sb.journal_inum();
    let first = (jino != 0)
        .then(|| fs.ext_list(jino).ok())
        .flatten()
        .and_then(|l| l.into_iter().find(|e| e.lblk == 0));
    if let Some(e) = first {
        let bs = fs.geo.block_size as usize;
        let mut jb = vec![0u8; bs];
        dev.read_at(e.pblk * bs as u64, &mut jb)
            .with_context(|| img.path.display().to_string())?;
        match uext4::journal::format::JournalSuperblock::parse(&jb) {
            Ok(js) => {
                say!("Journal sequence:         {:#010x}", js.sequence);
                say!(
                    "Journal start:            {}{}",
                    js.start,
                    if js.start == 0 {
                        " (empty)"
                    } else {
                        " (holds transactions to replay)"
                    }
                );
            }
            Err(e) => say!("Journal superblock:       {e}"),
        }
        print_fast_commits(fs, &dev, jino);
    }
    Ok(())
}

/// The journal's fast-commit area on disk, if it has one: its size and whether it holds fast
/// commits that recovery would replay (those of the transaction the log ends at).
fn print_fast_commits(
    fs: &uext4::Fs,
    dev: &std::sync::Arc<dyn uext4::blockdev::BlockDevice>,
    jino: u32,
) {
    let Ok(exts) = fs.ext_list(jino) else {
        return;
    };
    let map = uext4::journal::JournalMap::new(
        exts.iter()
            .map(|e| (e.lblk, e.pblk, e.len))
            .collect::<Vec<_>>(),
    );
    let Ok(j) = uext4::journal::Journal::open(dev.clone(), fs.geo.block_size, map) else {
        return;
    };
    let Some(area) = j.fast_commit_area() else {
        let n = j.superblock().num_fc_blks;
        if n != 0 {
            println!(
                "Journal fast commits:     {n} blocks set aside (s_num_fc_blks), an area once a \
                 read-write mount sets the journal's fast_commit feature"
            );
        }
        return;
    };
    let held = match j.log_end_tid() {
        Ok(None) => "none to replay (the log is empty)".to_string(),
        Ok(Some(tid)) => match j
            .read_fast_commit_area()
            .and_then(|b| uext4::format::fast_commit::scan(&b, tid))
        {
            Ok(fc) if fc.is_empty() => format!("none of transaction {tid} to replay"),
            Ok(fc) => format!(
                "{} fast commit(s) of transaction {tid} to replay ({} records, {} blocks)",
                fc.commits,
                fc.records.len(),
                fc.blocks
            ),
            Err(e) => format!("unreadable: {e}"),
        },
        Err(e) => format!("unreadable log: {e}"),
    };
    println!(
        "Journal fast commits:     area of {} blocks (journal blocks {}..{}), {held}",
        area.len(),
        area.start,
        area.end
    );
}
