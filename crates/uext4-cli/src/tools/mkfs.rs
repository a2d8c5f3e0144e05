//! `uext4 mkfs`: a new filesystem with mke2fs's defaults and options, optionally filled from a
//! host directory (`-d`), reproducible byte for byte from the same inputs.
//!
//! Reproducible builds follow the convention of reproducible-builds.org: with
//! `SOURCE_DATE_EPOCH` set, every time the image records is clamped to it (creation times,
//! copied files' times, commit blocks), inode generations come from a sequence seeded by the
//! hash seed, and a UUID and hash seed not given with `-U` / `-E hash_seed=` are derived from
//! the epoch and the label (name-based UUIDs), so the same tree and options give the same
//! bytes on any machine. Directory entries are copied in name order.

use crate::image::{image_arg, open, parse_size, Img, Within};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::blockdev::{BlockDevice, FileDevice, Region, RegionDevice};
use uext4::image::{is_nbd_uri, open_image};
use uext4::partition::{identify, Contents};

#[derive(Args)]
pub struct MkfsArgs {
    /// Size, like 64M or 2G (default: the existing file's or device's size); `fit`: the
    /// smallest that holds what -d gives with --fit-free per cent free.
    #[arg(long)]
    size: Option<String>,
    /// 1024 or 4096 (default: as mke2fs, 1024 below 512 MiB, else 4096)
    #[arg(long)]
    block_size: Option<u32>,
    /// Journal size in MiB (0: no journal; default: mke2fs's default for the size).
    #[arg(long)]
    journal_size: Option<u32>,
    /// Filesystem type: ext4, ext3 (journal, block maps) or ext2 (neither), as mke2fs -t
    #[arg(short = 't', default_value = "ext4")]
    fs_type: String,
    /// Features to set or clear, mke2fs style: -O ^metadata_csum,metadata_csum_seed
    #[arg(short = 'O')]
    features: Option<String>,
    /// The filesystem label (at most 16 bytes), as mke2fs -L.
    #[arg(short = 'L')]
    label: Option<String>,
    /// The filesystem's UUID (default: random, or with SOURCE_DATE_EPOCH derived from it).
    #[arg(short = 'U')]
    uuid: Option<String>,
    /// Extended options, mke2fs style: hash_seed=UUID, root_owner[=UID:GID],
    /// quotatype=usrquota:grpquota:prjquota.
    #[arg(short = 'E')]
    extended: Option<String>,
    /// Number of inodes (as mke2fs -N).
    #[arg(short = 'N')]
    inodes: Option<u64>,
    /// Bytes per inode (as mke2fs -i; default by size, as mke2fs).
    #[arg(short = 'i')]
    inode_ratio: Option<u32>,
    /// Cluster size with -O bigalloc, like 16K or 65536 (as mke2fs -C; default 16 blocks).
    #[arg(short = 'C')]
    cluster_size: Option<String>,
    /// Inode size in bytes (as mke2fs -I: 128, 256, ... up to the block size).
    #[arg(short = 'I')]
    inode_size: Option<u16>,
    /// Per cent of blocks reserved for the superuser (as mke2fs -m; default 5).
    #[arg(short = 'm')]
    reserved_percent: Option<f64>,
    /// Fill the new filesystem from this directory or tar archive (plain, gzip or zstd; `-`
    /// reads it from stdin), as mke2fs -d: its contents become the root's, with modes, owners,
    /// times (ns), xattrs, hard links, holes and special files.
    #[arg(short = 'd')]
    root_dir: Option<PathBuf>,
    /// Every file owned by root (0:0) whatever the tree or archive says (genext2fs's -U);
    /// modes are kept. A device table (-D) and -E root_owner= still set the owners they name.
    #[arg(long = "all-root", alias = "squash-uids")]
    all_root: bool,
    /// A genext2fs-style device table applied after filling: NAME TYPE MODE UID GID MAJOR
    /// MINOR START INC COUNT per line (device nodes and owners without root).
    #[arg(short = 'D', long = "devtable")]
    devtable: Option<PathBuf>,
    /// With --size fit: the share of blocks and inodes left free after filling, in per cent
    /// (besides the -m reserve).
    #[arg(long = "fit-free", default_value_t = 10.0)]
    fit_free: f64,
    /// Overwrite a filesystem that is already there (without it, mkfs refuses).
    #[arg(short = 'F', long)]
    force: bool,
    /// The image file (made if missing) or block device; IMAGE@N, IMAGE@offset=BYTES.
    image: PathBuf,
}

/// `-E` options.
#[derive(Default)]
struct Extended {
    hash_seed: Option<[u8; 16]>,
    root_owner: Option<(u32, u32)>,
    /// encoding=utf8: casefold (as mke2fs, the encoding implies the feature).
    encoding: bool,
    /// encoding_flags=strict.
    strict: bool,
    /// quotatype=usrquota:grpquota:prjquota: which quota files (with -O quota).
    quota_types: Option<[bool; 3]>,
}

fn parse_uuid(s: &str, what: &str) -> Result<[u8; 16]> {
    uuid::Uuid::parse_str(s)
        .map(|u| *u.as_bytes())
        .map_err(|e| anyhow!("{what} {s:?} is not a UUID ({e})"))
}

fn parse_extended(list: &str) -> Result<Extended> {
    let mut e = Extended::default();
    for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match opt.split_once('=') {
            Some(("hash_seed", v)) => e.hash_seed = Some(parse_uuid(v, "hash_seed")?),
            Some(("root_owner", v)) => {
                let (u, g) = v
                    .split_once(':')
                    .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
                    .ok_or_else(|| anyhow!("root_owner={v}: give UID:GID, like 1000:1000"))?;
                e.root_owner = Some((u, g));
            }
            None if opt == "root_owner" => e.root_owner = Some(crate::image::caller()),
            Some(("encoding", "utf8" | "utf8-12.1")) => e.encoding = true,
            Some(("encoding", v)) => {
                bail!("-E encoding={v}: unknown encoding (ext4 defines utf8, that is utf8-12.1)")
            }
            Some(("encoding_flags", v)) => {
                for flag in v.split('+').map(str::trim) {
                    match flag {
                        "strict" => e.strict = true,
                        "nostrict" => e.strict = false,
                        _ => bail!("-E encoding_flags={v}: unknown flag {flag:?} (known: strict)"),
                    }
                }
            }
            Some(("quotatype", v)) => {
                let mut t = [false; 3];
                for q in v.split(':').map(str::trim) {
                    match uext4::format::quota::QuotaType::parse(q) {
                        Some(k) => t[k.index()] = true,
                        None => bail!(
                            "-E quotatype={v}: unknown type {q:?} (usrquota, grpquota, prjquota)"
                        ),
                    }
                }
                e.quota_types = Some(t);
            }
            _ => bail!(
                "-E {opt}: unknown extended option (known: hash_seed=UUID, root_owner[=UID:GID], \
                 encoding=utf8, encoding_flags=strict, quotatype=usrquota:grpquota:prjquota)"
            ),
        }
    }
    Ok(e)
}

/// A name-based UUID for what a reproducible build did not give: the same for the same
/// epoch, label and purpose.
fn derived_uuid(epoch: i64, label: &str, purpose: &str) -> [u8; 16] {
    let name = format!("uext4 mkfs {purpose} {epoch} {label}");
    *uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).as_bytes()
}

/// mke2fs's choices for `size` with the command line's sizing options.
fn sizing(a: &MkfsArgs, size: u64, features: &uext4::mkfs::FeatureSet) -> uext4::mkfs::MkfsOptions {
    let mut o = uext4::mkfs::MkfsOptions::like_mke2fs(size, a.block_size);
    o.journal_blocks = a
        .journal_size
        .map(|m| ((m as u64) << 20).div_ceil(o.block_size as u64) as u32);
    if let Some(i) = a.inode_ratio {
        o.inode_ratio = i;
    }
    if let Some(i) = a.inode_size {
        o.inode_size = i;
    }
    o.inodes = a.inodes;
    if let Some(m) = a.reserved_percent {
        o.reserved_percent = m;
    }
    o.features = features.clone();
    // Checked in `run`.
    o.cluster_size = a
        .cluster_size
        .as_deref()
        .and_then(|c| crate::image::parse_size(c).ok())
        .map(|c| c.min(u32::MAX as u64) as u32);
    if features.bigalloc && a.inode_ratio.is_none() {
        // As mke2fs: its default bytes per inode are at least a cluster (a -i given stays).
        let cluster = o.cluster_size.unwrap_or(o.block_size.saturating_mul(16));
        o.inode_ratio = o.inode_ratio.max(cluster);
    }
    o
}

/// `--size fit`: the size that holds the input (see fit.rs).
fn fit_size(a: &MkfsArgs, features: &uext4::mkfs::FeatureSet) -> Result<u64> {
    let Some(d) = &a.root_dir else {
        bail!("--size fit needs -d DIR or -d ARCHIVE");
    };
    if d == Path::new("-") {
        bail!("--size fit reads the input twice: give the archive as a file, not stdin");
    }
    if !(0.0..100.0).contains(&a.fit_free) {
        bail!("--fit-free {}: a per cent from 0 to below 100", a.fit_free);
    }
    let isize = a.inode_size.unwrap_or(256);
    let need = if d.is_dir() {
        crate::tools::fit::measure_tree(d, isize, features.extents)
    } else {
        crate::tools::fit::measure_archive(d, isize, features.extents)
    }
    .with_context(|| format!("-d {}", d.display()))?;
    crate::tools::fit::fit(&need, a.fit_free, &|size| sizing(a, size, features))
}

pub fn run(mut a: MkfsArgs) -> Result<()> {
    // Options first: a wrong one leaves no file behind.
    let mut features = uext4::mkfs::FeatureSet::for_type(&a.fs_type)?;
    if let Some(f) = &a.features {
        features.apply(f)?;
    }
    if let Some(bs) = a.block_size.filter(|&b| b != 1024 && b != 4096) {
        bail!("--block-size {bs}: use 1024 or 4096");
    }
    let ext = parse_extended(a.extended.as_deref().unwrap_or(""))?;
    features.casefold |= ext.encoding;
    if ext.strict && !features.casefold {
        bail!("-E encoding_flags=strict needs the casefold feature (-O casefold)");
    }
    features.casefold_strict = ext.strict;
    if let Some(t) = ext.quota_types {
        // As mke2fs: project quotas bring the project feature.
        features.project |= t[2];
        features.quota_types = Some(t);
    }
    if let Some(c) = &a.cluster_size {
        crate::image::parse_size(c).with_context(|| format!("-C {c}"))?;
        if !features.bigalloc {
            bail!("-C {c}: a cluster size needs the bigalloc feature (-O bigalloc)");
        }
    }
    let uuid = a.uuid.as_deref().map(|u| parse_uuid(u, "-U")).transpose()?;
    let epoch = super::build::source_date_epoch()?;
    if let Some(d) = &a.root_dir {
        if !d.is_dir() && !crate::tools::tar::is_archive(d) {
            bail!(
                "-d {}: neither a directory nor an archive file",
                d.display()
            );
        }
    }
    if a.size.as_deref() == Some("fit") {
        let img = image_arg(&a.image)?;
        if img.within != Within::Whole || is_nbd_uri(&img.path) {
            bail!("--size fit makes an image file (not a partition, a region or an export)");
        }
        a.size = Some(fit_size(&a, &features)?.to_string());
    }
    let devtable = a
        .devtable
        .as_deref()
        .map(crate::tools::devtable::read)
        .transpose()?;
    let img = image_arg(&a.image)?;
    let created = !img.path.exists() && !is_nbd_uri(&img.path);
    let r = build(&a, &img, features, ext, uuid, epoch, devtable);
    if r.is_err() && created {
        // A failed mkfs leaves nothing of its own behind.
        let _ = std::fs::remove_file(&img.path);
    }
    r
}

fn build(
    a: &MkfsArgs,
    img: &Img,
    features: uext4::mkfs::FeatureSet,
    ext: Extended,
    uuid: Option<[u8; 16]>,
    epoch: Option<i64>,
    devtable: Option<Vec<(usize, crate::tools::devtable::Line)>>,
) -> Result<()> {
    // Held until the new filesystem is written: no one else writes the image meanwhile. (An
    // NBD export has nothing local to claim: its server decides who writes it.)
    let _claim = if img.path.exists() && !is_nbd_uri(&img.path) {
        Some(
            uext4::image::claim_for_writing(&img.path)
                .with_context(|| img.path.display().to_string())?,
        )
    } else {
        None
    };
    let (dev, size, fresh, region) = if img.within == Within::Whole && is_nbd_uri(&img.path) {
        nbd_target(a, img)?
    } else if img.within == Within::Whole {
        whole_target(a)?
    } else {
        region_target(a, img)?
    };
    if let (false, Contents::Ext { kind, .. }) = (a.force, identify(&*dev)) {
        bail!(
            "{}: already holds an {kind} filesystem; give --force to overwrite it",
            img.name()
        );
    }
    let label = a.label.clone().unwrap_or_default();
    let mut o = sizing(a, size, &features);
    o.uuid = uuid.or(epoch.map(|e| derived_uuid(e, &label, "uuid")));
    o.hash_seed = ext
        .hash_seed
        .or(epoch.map(|e| derived_uuid(e, &label, "hash_seed")));
    o.time = epoch;
    // As mke2fs run by an ordinary user with root_owner: the root directory is the caller's,
    // so the user's own mount of the image is writable.
    o.root_owner = ext.root_owner.unwrap_or_else(crate::image::caller);
    o.label = label;
    o.assume_zeroed = fresh;
    uext4::mkfs::mkfs(&*dev, &o).with_context(|| img.name())?;
    drop(dev);
    if a.root_dir.is_some() || a.all_root || devtable.is_some() {
        let fs = uext4::Fs::open_path(&img.path, super::build::options(region)?)
            .with_context(|| img.name())?;
        let r = match &a.root_dir {
            Some(d) if d.is_dir() => {
                crate::tools::cp::copy_host_contents(&fs, d, fs.root_ino(), fresh)
            }
            Some(d) => {
                let mut u = crate::tools::tar::Unpacker::new(&fs, fs.root_ino());
                u.unpack(d).and_then(|()| u.finish())
            }
            None => Ok(()),
        };
        let r = r.with_context(|| {
            format!(
                "-d {}",
                a.root_dir.as_deref().unwrap_or(Path::new("")).display()
            )
        });
        let r = r.and_then(|()| match a.all_root {
            true => crate::tools::attrs::squash_owners(&fs, fs.root_ino()),
            false => Ok(()),
        });
        // An explicit root_owner wins over the directory's own owner.
        let r = r.and_then(|()| match ext.root_owner {
            Some((uid, gid)) => {
                let set = uext4::SetAttr {
                    uid: Some(uid),
                    gid: Some(gid),
                    ..Default::default()
                };
                fs.setattr(fs.root_ino(), &set)
                    .map(|_| ())
                    .map_err(Into::into)
            }
            None => Ok(()),
        });
        let r = r.and_then(|()| match (&a.devtable, &devtable) {
            (Some(p), Some(t)) => crate::tools::devtable::apply(&fs, p, t),
            _ => Ok(()),
        });
        let u = fs.unmount();
        r?;
        u.with_context(|| img.name())?;
    }
    summary(img, region, &o)
}

/// One line of summary, read back from what was written.
fn summary(img: &Img, region: Option<Region>, o: &uext4::mkfs::MkfsOptions) -> Result<()> {
    let fs = open(&img.path, region, true)?;
    let st = fs.statfs();
    let journal = if fs
        .superblock()
        .has_compat(uext4::format::features::COMPAT_HAS_JOURNAL)
    {
        let j = fs
            .getattr(fs.superblock().journal_inum())
            .map(|a| a.size)
            .unwrap_or(0);
        format!("a {} MiB journal", j >> 20)
    } else {
        "no journal".to_string()
    };
    println!(
        "{}: {}, {} MiB, {} blocks of {} bytes, {} inodes, {journal}",
        img.name(),
        o.features.type_name(),
        (fs.geo.blocks_count * fs.geo.block_size as u64) >> 20,
        fs.geo.blocks_count,
        fs.geo.block_size,
        st.files
    );
    Ok(())
}

/// The whole image file or device: made (or grown) to the size asked.
/// Where mkfs writes: the device (a window for a region), the filesystem's size, whether the
/// device reads as zeros already (a new file), and the region in the image file.
type Target = (Arc<dyn BlockDevice>, u64, bool, Option<Region>);

/// A whole NBD export: its size, or less with `--size`.
fn nbd_target(a: &MkfsArgs, img: &Img) -> Result<Target> {
    let dev = open_image(&img.path, false).with_context(|| img.name())?;
    if dev.read_only() {
        bail!("{}: the NBD server exports it read-only", img.name());
    }
    let size = match a.size.as_deref().map(parse_size).transpose()? {
        Some(w) if w > dev.size() => bail!(
            "{}: --size {w} is larger than the export ({} bytes)",
            img.name(),
            dev.size()
        ),
        Some(w) => w,
        None => dev.size(),
    };
    Ok((dev, size, false, None))
}

fn whole_target(a: &MkfsArgs) -> Result<Target> {
    let exists = a.image.exists();
    if exists || a.image.is_symlink() {
        crate::image::check_image(&a.image, true)?;
    }
    let cur = if exists {
        FileDevice::open(&a.image, true)?.size()
    } else {
        0
    };
    let size = match &a.size {
        Some(s) => parse_size(s)?,
        None if cur > 0 => cur,
        None => bail!(
            "{}: the image does not exist: give --size (like --size 1G)",
            a.image.display()
        ),
    };
    let is_file = !exists || std::fs::metadata(&a.image)?.is_file();
    let fresh = is_file && (!exists || cur == 0);
    if is_file {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&a.image)
            .with_context(|| a.image.display().to_string())?;
        if f.metadata()?.len() < size {
            f.set_len(size)?;
        }
    }
    let dev = FileDevice::open(&a.image, false).with_context(|| a.image.display().to_string())?;
    Ok((Arc::new(dev), size, fresh, None))
}

/// mkfs inside a partition (`IMAGE@N`) or at an offset (`IMAGE@offset=BYTES`) of an existing
/// file: the window onto it, the filesystem's size (the partition's or what is left of the
/// file, or `--size` where it fits), and its region. The offset form with `--size` grows a
/// file that is too short; a partition is never grown.
fn region_target(a: &MkfsArgs, img: &Img) -> Result<Target> {
    let want = a.size.as_deref().map(parse_size).transpose()?;
    crate::image::check_image(&img.path, true)?;
    if let (Within::Offset { offset, size }, Some(w)) = (img.within, want) {
        let end = offset
            .checked_add(size.unwrap_or(w))
            .ok_or_else(|| anyhow!("{}: offset and size overflow", img.name()))?;
        if !is_nbd_uri(&img.path) && std::fs::metadata(&img.path)?.is_file() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&img.path)
                .with_context(|| img.path.display().to_string())?;
            if f.metadata()?.len() < end {
                f.set_len(end)?;
            }
        }
    }
    let region = img.region()?;
    let dev = open_image(&img.path, false).with_context(|| img.path.display().to_string())?;
    if dev.read_only() {
        bail!("{}: cannot be written", img.path.display());
    }
    let r = region.ok_or_else(|| anyhow!("{}: no region", img.name()))?;
    let win = RegionDevice::new(dev, r).map_err(|e| anyhow!("{}: {e}", img.name()))?;
    let size = match want {
        Some(w) if w > win.size() => bail!(
            "{}: --size {w} is larger than the {} bytes there",
            img.name(),
            win.size()
        ),
        Some(w) => w,
        None => win.size(),
    };
    Ok((Arc::new(win), size, false, region))
}
