//! The image tools: mkfs, info, ls, cat, cp, mkdir, rm, mv, ln, stat, truncate. Paths inside an
//! image are written IMAGE:PATH; IMAGE may be `disk.img@2` (partition 2 of a whole-disk image,
//! GPT or MBR, numbered as fdisk and lsblk number them) or `disk.img@offset=BYTES[,size=BYTES]`
//! (a filesystem at a byte offset, as in a SIF container); a file literally named so wins. Each tool opens the image, does its work and leaves the image
//! clean (`Fs::unmount`), so no root and no mount are needed.

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::blockdev::{BlockDevice, Region, RegionDevice};
use uext4::format::inode::Timestamp;
use uext4::image::open_image;
use uext4::namei::{RenameFlags, SetAttr, TimeSet};
use uext4::partition::{identify, Contents, Table};
use uext4::xattr::XattrFlags;
use uext4::{Attr, Error, Fs, MountOptions};

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per run
pub enum ToolCmd {
    /// Make a new ext4 (or ext3, ext2) filesystem (creates IMAGE if missing; IMAGE@N makes it
    /// in partition N, IMAGE@offset=BYTES at that offset of an existing file).
    Mkfs(crate::mkfs::MkfsArgs),
    /// Print a summary of the superblock and features; of a whole-disk image, its partitions
    /// (name one as IMAGE@N).
    Info { image: PathBuf },
    /// List a directory: IMAGE:PATH.
    Ls {
        #[arg(short = 'l')]
        long: bool,
        path: String,
    },
    /// Print a file: IMAGE:PATH.
    Cat { path: String },
    /// Copy files: SRC... DST, either side may be IMAGE:PATH (several sources go into the
    /// directory DST; `DIR/.` copies DIR's contents, as cp(1)).
    Cp {
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// The sources are tar archives (plain, gzip or zstd; `-` is stdin), unpacked in
        /// order into the image directory DST as they say (owners, devices, xattrs, holes).
        #[arg(long = "from-tar")]
        from_tar: bool,
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// Make directories: IMAGE:PATH.
    Mkdir {
        #[arg(short = 'p')]
        parents: bool,
        path: String,
    },
    /// Remove files (with -r, directories): IMAGE:PATH.
    Rm {
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        #[arg(short = 'f')]
        force: bool,
        path: String,
    },
    /// Rename or move inside one image.
    Mv { src: String, dst: String },
    /// Make a hard link (or with -s a symbolic link) inside an image.
    Ln {
        #[arg(short = 's')]
        symbolic: bool,
        target: String,
        link: String,
    },
    /// Show a file's attributes: IMAGE:PATH.
    Stat { path: String },
    /// Change permissions: MODE (octal, or symbolic as u+x,go-w) IMAGE:PATH.
    Chmod {
        #[arg(short = 'R')]
        recursive: bool,
        #[arg(allow_hyphen_values = true)]
        mode: String,
        path: String,
    },
    /// Change the owner: UID[:GID] (numeric) IMAGE:PATH.
    Chown {
        #[arg(short = 'R')]
        recursive: bool,
        /// Change a symlink itself, not what it points to.
        #[arg(short = 'h', long = "no-dereference")]
        no_deref: bool,
        owner: String,
        path: String,
    },
    /// Set a file's access and modification times (now, or as -d, -t or -r say); a missing
    /// file is made, as touch(1) makes it, unless -c.
    Touch {
        /// Only the access time.
        #[arg(short = 'a')]
        atime: bool,
        /// Only the modification time.
        #[arg(short = 'm')]
        mtime: bool,
        /// Do not create a missing file.
        #[arg(short = 'c', long = "no-create")]
        no_create: bool,
        /// A date: @SECONDS, YYYY-MM-DD[ HH:MM[:SS[.NS]]][Z|+HH:MM] (UTC unless a zone).
        #[arg(short = 'd', long = "date")]
        date: Option<String>,
        /// A stamp: [[CC]YY]MMDDhhmm[.ss] (UTC).
        #[arg(short = 't')]
        stamp: Option<String>,
        /// The times of this file (a host path or IMAGE:PATH).
        #[arg(short = 'r', long = "reference")]
        reference: Option<String>,
        path: String,
    },
    /// Set a file's size: IMAGE:PATH (a missing file is made, as truncate(1) makes it;
    /// with -c it is left missing).
    Truncate {
        #[arg(short = 's')]
        size: String,
        /// Do not create a missing file (and say nothing of it).
        #[arg(short = 'c', long = "no-create")]
        no_create: bool,
        path: String,
    },
}

impl ToolCmd {
    pub fn name(&self) -> &'static str {
        match self {
            ToolCmd::Mkfs(_) => "mkfs",
            ToolCmd::Info { .. } => "info",
            ToolCmd::Ls { .. } => "ls",
            ToolCmd::Cat { .. } => "cat",
            ToolCmd::Cp { .. } => "cp",
            ToolCmd::Mkdir { .. } => "mkdir",
            ToolCmd::Rm { .. } => "rm",
            ToolCmd::Mv { .. } => "mv",
            ToolCmd::Ln { .. } => "ln",
            ToolCmd::Stat { .. } => "stat",
            ToolCmd::Chmod { .. } => "chmod",
            ToolCmd::Chown { .. } => "chown",
            ToolCmd::Touch { .. } => "touch",
            ToolCmd::Truncate { .. } => "truncate",
        }
    }
}

/// Parses a size like 4096, 64K, 64M, 2G, 1T.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow!("{s:?} is not a size (like 4096, 64M, 2G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| anyhow!("size {s:?} is too large"))
}

/// Which part of an image file holds the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Within {
    /// The whole file (or device).
    Whole,
    /// `IMAGE@N`: partition N of a whole-disk image (GPT or MBR), numbered as fdisk and lsblk
    /// number them.
    Partition(u32),
    /// `IMAGE@offset=BYTES[,size=BYTES]`: a filesystem at a byte offset (a multiple of 512),
    /// as in a container file (Apptainer's SIF); to the end of the file without `size`.
    Offset { offset: u64, size: Option<u64> },
}

/// An image file, and where in it the filesystem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Img {
    pub path: PathBuf,
    pub within: Within,
}

impl Img {
    /// The image as written on the command line: `disk.img`, `disk.img@2`,
    /// `disk.img@offset=1048576`.
    pub fn name(&self) -> String {
        let p = self.path.display();
        match self.within {
            Within::Whole => p.to_string(),
            Within::Partition(n) => format!("{p}@{n}"),
            Within::Offset { offset, size: None } => format!("{p}@offset={offset}"),
            Within::Offset {
                offset,
                size: Some(s),
            } => format!("{p}@offset={offset},size={s}"),
        }
    }

    /// Where the filesystem lies in the file (`None`: the whole file). Reads the partition
    /// table for `IMAGE@N`, and checks the region against the file; every failure is one line
    /// naming the image.
    pub fn region(&self) -> Result<Option<Region>> {
        let dev = open_image(&self.path, true).with_context(|| self.path.display().to_string())?;
        self.region_in(&dev).map(|(r, _)| r)
    }

    /// The region, and the window onto it (the whole device for `Whole`).
    fn region_in(
        &self,
        dev: &Arc<dyn BlockDevice>,
    ) -> Result<(Option<Region>, Arc<dyn BlockDevice>)> {
        let region = match self.within {
            Within::Whole => return Ok((None, dev.clone())),
            Within::Offset { offset, size } => Region { offset, len: size },
            Within::Partition(n) => match Table::read(&**dev) {
                Ok(Some(t)) => t
                    .region_of(n)
                    .map_err(|e| anyhow!("{}: {e}", self.path.display()))?,
                Ok(None) => bail!(
                    "{}: no partition table (neither GPT nor MBR), so no partition {n}; for a \
                     filesystem at an offset write {}@offset=BYTES",
                    self.path.display(),
                    self.path.display()
                ),
                Err(e) => bail!("{}: {e}", self.path.display()),
            },
        };
        match RegionDevice::new(dev.clone(), region) {
            Ok(w) => Ok((Some(w.region()), Arc::new(w))),
            Err(Error::Invalid(m)) => bail!("{}: {m}", self.name()),
            Err(e) => bail!("{}: {e}", self.name()),
        }
    }

    /// The region, once an ext2/3/4 superblock is known to be there: a partition or an offset
    /// that holds something else is refused, saying what it seems to hold. For a whole file
    /// that holds a partition table or a qcow2 (VMDK, ...) image, the error says how to reach
    /// the filesystem.
    fn fs_region(&self) -> Result<Option<Region>> {
        let dev = match open_image(&self.path, true) {
            Ok(d) => d,
            // Let the open report it (as it always has).
            Err(_) if self.within == Within::Whole => return Ok(None),
            Err(e) => return Err(e).with_context(|| self.path.display().to_string()),
        };
        let (region, view) = self.region_in(&dev)?;
        let contents = identify(&*view);
        if matches!(contents, Contents::Ext { .. }) {
            return Ok(region);
        }
        let path = self.path.display();
        match self.within {
            Within::Whole => {
                if let Contents::ImageFormat(f) = contents {
                    bail!("{path}: {f}");
                }
                if let Ok(Some(t)) = Table::read(&*dev) {
                    bail!(
                        "{path}: not ext4 itself but a whole disk: {}; name one as {path}@N \
                         (uext4 info {path} lists them)",
                        t.summary()
                    );
                }
                // The open says what is wrong (bad magic, too small, ...).
                Ok(None)
            }
            Within::Partition(n) => {
                bail!("{path}: partition {n} is not ext4 (it holds {contents})")
            }
            Within::Offset { offset, .. } => {
                bail!("{path}: no ext4 at offset {offset} (it holds {contents})")
            }
        }
    }

    /// The byte range of the file this names (for telling whether two overlap).
    fn range(&self) -> Result<(u64, u64)> {
        let size = open_image(&self.path, true)
            .with_context(|| self.path.display().to_string())?
            .size();
        Ok(match self.region()? {
            None => (0, size),
            Some(r) => (r.offset, r.len.map_or(size, |l| r.offset + l)),
        })
    }
}

/// The region of the filesystem `img` names, once ext2/3/4 is known to be there (for mount).
pub fn fs_region_of(img: &Img) -> Result<Option<Region>> {
    img.fs_region()
}

/// Opens the filesystem `img` names (see [`Img::fs_region`]).
pub(crate) fn open_img(img: &Img, read_only: bool) -> Result<Arc<Fs>> {
    let region = img.fs_region()?;
    open(&img.path, region, read_only)
}

/// Whether `p` is an existing file or device (not a directory).
fn is_image_file(p: &Path) -> bool {
    p.is_file()
        || std::fs::metadata(p)
            .map(|m| !m.is_dir() && !m.is_file())
            .unwrap_or(false)
}

/// What follows the `@` of `IMAGE@...`.
pub fn parse_within(spec: &str) -> Result<Within> {
    if let Ok(n) = spec.parse::<u32>() {
        if n == 0 {
            bail!("partitions are numbered from 1 (as fdisk and lsblk number them)");
        }
        return Ok(Within::Partition(n));
    }
    if spec.starts_with("offset=") {
        let (mut offset, mut size) = (None, None);
        for part in spec.split(',') {
            match part.split_once('=') {
                Some(("offset", v)) => offset = Some(parse_size(v)?),
                Some(("size", v)) => size = Some(parse_size(v)?),
                _ => bail!("{part:?}: expected offset=BYTES or size=BYTES"),
            }
        }
        let offset = offset.unwrap_or(0);
        if size == Some(0) {
            bail!("size=0: the region is empty");
        }
        return Ok(Within::Offset { offset, size });
    }
    bail!("after '@' give a partition number (IMAGE@2) or offset=BYTES[,size=BYTES]")
}

/// `IMAGE`, `IMAGE@N` or `IMAGE@offset=BYTES[,size=BYTES]`: `None` when no such file exists.
/// A file named by the whole text wins over the `@` forms.
fn parse_image(s: &str) -> Result<Option<Img>> {
    if uext4::nbd::is_nbd_uri(s) {
        return parse_nbd_image(s).map(Some);
    }
    if is_image_file(Path::new(s)) {
        return Ok(Some(Img {
            path: PathBuf::from(s),
            within: Within::Whole,
        }));
    }
    if let Some((base, spec)) = s.rsplit_once('@') {
        if is_image_file(Path::new(base)) {
            let within = parse_within(spec).with_context(|| s.to_string())?;
            return Ok(Some(Img {
                path: PathBuf::from(base),
                within,
            }));
        }
    }
    Ok(None)
}

/// Where an NBD URI's authority (host and port) ends: after it, a ':' or '@' is ours.
fn nbd_authority_end(s: &str) -> usize {
    let start = s.find("://").map_or(0, |i| i + 3);
    start + s[start..].find(['/', '?']).unwrap_or(s.len() - start)
}

/// An NBD URI as an image, with an optional `@N` or `@offset=BYTES[,size=BYTES]` at its end
/// (after the export name and query: an '@' inside them is written `%40`).
fn parse_nbd_image(s: &str) -> Result<Img> {
    let auth = nbd_authority_end(s);
    if let Some(at) = s[auth..].rfind('@').map(|i| auth + i) {
        let within = parse_within(&s[at + 1..]).with_context(|| s.to_string())?;
        return Ok(Img {
            path: PathBuf::from(&s[..at]),
            within,
        });
    }
    Ok(Img {
        path: PathBuf::from(s),
        within: Within::Whole,
    })
}

/// An image argument without a path inside it (info, mkfs, mount): the `@` forms as in
/// [`parse_image`]; a name that matches nothing is taken as a file name (whose open then
/// says it is missing).
pub fn image_arg(p: &Path) -> Result<Img> {
    if let Some(s) = p.to_str() {
        if let Some(img) = parse_image(s)? {
            return Ok(img);
        }
    }
    Ok(Img {
        path: p.to_path_buf(),
        within: Within::Whole,
    })
}

/// An IMAGE:PATH argument, or a host path.
enum Loc {
    Image(Img, String),
    Host(PathBuf),
}

fn parse_loc(s: &str) -> Result<Loc> {
    // An NBD URI ends at the first ':' after its authority (a ':' in the export name or the
    // socket path is written %3A): `nbd+unix:///disk?socket=/run/x.sock:/etc`.
    if uext4::nbd::is_nbd_uri(s) {
        let auth = nbd_authority_end(s);
        return match s[auth..].find(':').map(|i| auth + i) {
            Some(at) => {
                let path = match &s[at + 1..] {
                    "" => "/".to_string(),
                    p => p.to_string(),
                };
                Ok(Loc::Image(parse_nbd_image(&s[..at])?, path))
            }
            None => bail!(
                "{s}: expected NBD-URI:PATH (a ':' and the path inside the image after the URI)"
            ),
        };
    }
    // The image is the first prefix before a ':' that is an existing file or device (an image
    // name may itself contain ':'), or such a file followed by @N or @offset=BYTES.
    for (at, _) in s.match_indices(':') {
        let (img, path) = (&s[..at], &s[at + 1..]);
        if let Some(img) = parse_image(img)? {
            let path = if path.is_empty() {
                "/".to_string()
            } else {
                path.to_string()
            };
            return Ok(Loc::Image(img, path));
        }
    }
    Ok(Loc::Host(PathBuf::from(s)))
}

pub(crate) fn image_loc(s: &str) -> Result<(Img, String)> {
    match parse_loc(s)? {
        Loc::Image(i, p) => Ok((i, p)),
        Loc::Host(_) => match s.split_once(':') {
            Some((img, _)) if !Path::new(img).exists() => bail!("{img}: no such image file"),
            Some((img, _)) => bail!("{img}: not an image file (a directory?)"),
            None => bail!("{s}: expected IMAGE:PATH"),
        },
    }
}

/// Opens an image for a tool. A read-write open claims the image first (the engine's
/// holder.rs: refused, naming the holder, while another program writes it). A read-only open
/// never writes: a journal left to replay (a crash, a killed mount) is replayed in memory.
pub(crate) fn open(image: &Path, region: Option<Region>, read_only: bool) -> Result<Arc<Fs>> {
    let fs = Fs::open_path(
        image,
        MountOptions {
            read_only,
            commit_interval_secs: 0,
            region,
            ..Default::default()
        },
    )
    .with_context(|| image.display().to_string())?;
    if !read_only && fs.is_read_only() {
        bail!(
            "{}: cannot be written: {}",
            image.display(),
            fs.read_only_reason().unwrap_or("read-only")
        );
    }
    if fs.journal_replayed_in_memory() {
        eprintln!(
            "uext4: note: {}: the journal needs recovery; replayed in memory only (the image \
             is not changed)",
            image.display()
        );
    }
    Ok(fs)
}

/// The user running the tool, who owns what it makes (as files made through a mount would be).
pub(crate) fn caller() -> (u32, u32) {
    // SAFETY: plain getters without arguments.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The process umask (read by setting and restoring it).
pub(crate) fn umask() -> u32 {
    // SAFETY: umask only swaps the process's mask.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    }
}

/// Leaves the image clean; the operation's own error comes first when both fail.
pub(crate) fn finish(fs: &Fs, image: &Path, r: Result<()>) -> Result<()> {
    let u = fs.unmount();
    r?;
    u.with_context(|| image.display().to_string())
}

/// Walks `path` from the root, following symlinks in the middle (and at the end with
/// `follow`). Returns the inode.
pub(crate) fn resolve(fs: &Fs, path: &str, follow: bool) -> uext4::Result<u32> {
    resolve_from(fs, 2, path, follow, &mut 0)
}

pub(crate) fn resolve_from(
    fs: &Fs,
    start: u32,
    path: &str,
    follow: bool,
    depth: &mut u32,
) -> uext4::Result<u32> {
    let mut cur = if path.starts_with('/') { 2 } else { start };
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    for (i, c) in comps.iter().enumerate() {
        let a = fs.lookup(cur, c.as_bytes())?;
        let last = i + 1 == comps.len();
        if a.mode & 0o170000 == 0o120000 && (!last || follow) {
            *depth += 1;
            if *depth > 40 {
                return Err(Error::Invalid("too many levels of symbolic links".into()));
            }
            let t = fs.readlink(a.ino)?;
            cur = resolve_from(fs, cur, &String::from_utf8_lossy(&t), true, depth)?;
        } else {
            cur = a.ino;
        }
    }
    Ok(cur)
}

/// Splits "a/b/c" into the parent's inode and "c".
pub(crate) fn parent_of(fs: &Fs, path: &str) -> Result<(u32, Vec<u8>)> {
    let trimmed = path.trim_end_matches('/');
    let (dir, name) = match trimmed.rsplit_once('/') {
        Some((d, n)) => (if d.is_empty() { "/" } else { d }, n),
        None => ("/", trimmed),
    };
    if name.is_empty() {
        bail!("{path}: needs a file name");
    }
    // As rm(1) refuses them: "a/." and "a/.." name a directory by another name, and
    // removing or replacing them by that name would act on a directory the path hides.
    if name == "." || name == ".." {
        bail!("refusing to remove, replace or make '.' or '..' (name the directory itself)");
    }
    let d = resolve(fs, dir, true).with_context(|| dir.to_string())?;
    Ok((d, name.as_bytes().to_vec()))
}

pub fn run(cmd: ToolCmd) -> Result<()> {
    match cmd {
        ToolCmd::Mkfs(a) => crate::mkfs::run(a),
        ToolCmd::Info { image } => info(&image),
        ToolCmd::Ls { long, path } => ls(&path, long),
        ToolCmd::Cat { path } => cat(&path),
        ToolCmd::Cp {
            recursive,
            from_tar,
            paths,
        } => {
            let (dst, srcs) = paths.split_last().expect("clap asks for two paths or more");
            if from_tar {
                return crate::tar::cp_from_tar(srcs, dst);
            }
            if srcs.len() > 1 && !is_directory(dst)? {
                bail!("{dst}: target is not a directory (several sources go into a directory)");
            }
            for src in srcs {
                cp(src, dst, recursive)?;
            }
            Ok(())
        }
        ToolCmd::Mkdir { parents, path } => mkdir(&path, parents),
        ToolCmd::Rm {
            recursive,
            force,
            path,
        } => rm(&path, recursive, force),
        ToolCmd::Mv { src, dst } => mv(&src, &dst),
        ToolCmd::Ln {
            symbolic,
            target,
            link,
        } => ln(&target, &link, symbolic),
        ToolCmd::Stat { path } => stat(&path),
        ToolCmd::Chmod {
            recursive,
            mode,
            path,
        } => crate::attrs::chmod(&mode, &path, recursive),
        ToolCmd::Chown {
            recursive,
            no_deref,
            owner,
            path,
        } => crate::attrs::chown(&owner, &path, recursive, no_deref),
        ToolCmd::Touch {
            atime,
            mtime,
            no_create,
            date,
            stamp,
            reference,
            path,
        } => crate::attrs::touch(
            &crate::attrs::TouchArgs {
                atime_only: atime,
                mtime_only: mtime,
                no_create,
                date,
                stamp,
                reference,
            },
            &path,
        ),
        ToolCmd::Truncate {
            size,
            no_create,
            path,
        } => truncate(&path, &size, !no_create),
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
    println!(
        "Filesystem UUID:          {}-{}-{}-{}-{}",
        u(0..4),
        u(4..6),
        u(6..8),
        u(8..10),
        u(10..16)
    );
    println!("Volume name:              {}", sb.volume_name());
    let mut feats = names(sb.feature_compat(), COMPAT_NAMES);
    feats.extend(names(sb.feature_incompat(), INCOMPAT_NAMES));
    feats.extend(names(sb.feature_ro_compat(), RO_COMPAT_NAMES));
    println!("Features:                 {}", feats.join(" "));
    println!(
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
    println!("Block size:               {}", sb.block_size());
    println!("Block count:              {}", sb.blocks_count());
    println!(
        "Free blocks:              {} (superblock)",
        sb.free_blocks_count()
    );
    println!("Inode count:              {}", sb.inodes_count());
    println!(
        "Free inodes:              {} (superblock)",
        sb.free_inodes_count()
    );
    println!("Inode size:               {}", sb.inode_size());
    println!("Opens in uext4:           no: {}", why.root_cause());
    Ok(())
}

/// `info` of a whole disk: its partitions, what each holds, and how to name one.
fn info_partitions(image: &Path, dev: &Arc<dyn BlockDevice>, t: &Table) {
    let p = image.display();
    println!(
        "{p}: a whole disk with a {} partition table ({}-byte sectors), {} partition{}",
        t.scheme,
        t.sector_size,
        t.partitions.len(),
        if t.partitions.len() == 1 { "" } else { "s" }
    );
    println!(
        "{:>3}  {:>14}  {:>14}  {:>10}  {:<24}  {:<16}  holds",
        "#", "start (bytes)", "size (bytes)", "size", "type", "name"
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
        println!(
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
        Some(n) => println!(
            "Name a partition as {p}@N: uext4 info {p}@{n}, uext4 ls {p}@{n}:/, \
             uext4 mount {p}@{n} MOUNTPOINT (or -o partition={n})"
        ),
        None => println!("No partition holds ext2/3/4."),
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

fn info(arg: &Path) -> Result<()> {
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
        println!(
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
    println!("Block size:               {}", g.block_size);
    println!("Block count:              {}", g.blocks_count);
    // From the group descriptors (the superblock's counts may lag, as the kernel's do).
    let st = fs.statfs();
    println!("Free blocks:              {}", st.blocks_free);
    println!("Available to users:       {}", st.blocks_avail);
    println!("Inode count:              {}", g.inodes_count);
    println!("Free inodes:              {}", st.files_free);
    println!("Inode size:               {}", g.inode_size);
    println!(
        "Groups:                   {} ({} blocks, {} inodes each)",
        g.group_count, g.blocks_per_group, g.inodes_per_group
    );
    if g.flex_bg_size > 1 {
        println!("Flex group size:          {}", g.flex_bg_size);
    }
    if sb.has_compat(COMPAT_HAS_JOURNAL) {
        let j = fs.getattr(sb.journal_inum()).map(|a| a.size).unwrap_or(0);
        println!(
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
            println!(
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
            println!("Journal features:         {}", f.join(" "));
        }
    }
    if let Some(m) = fs.mmp_info() {
        println!("MMP:                      {m}");
    }
    if sb.error_count() > 0 {
        println!(
            "Errors recorded:          {} (last at inode {}, block {})",
            sb.error_count(),
            sb.last_error_ino(),
            sb.last_error_block()
        );
    }
    if fs.journal_replayed_in_memory() {
        println!(
            "Needs recovery:           yes (the journal was replayed in memory for this view)"
        );
    }
    if let Some(r) = fs.read_only_reason() {
        println!("Opens read-only:          {r}");
    }
    Ok(())
}

fn mode_string(mode: u16) -> String {
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
fn civil_from_days(z: i64) -> (i64, u32, u32) {
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
fn fmt_date(sec: i64) -> String {
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
fn fmt_time(t: Timestamp) -> String {
    format!("{}.{:09} +0000", fmt_date(t.sec), t.nsec)
}

/// A name as ls -b shows it: printable UTF-8 as it is; backslash, control bytes and bytes
/// that are not UTF-8 as C escapes (`\n`, `\\`, `\377`).
fn escaped_name(b: &[u8]) -> String {
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

fn ls(path: &str, long: bool) -> Result<()> {
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

fn cat(path: &str) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, true).with_context(|| path.to_string())?;
    let a = fs.getattr(ino)?;
    if a.is_dir() {
        return Err(anyhow!(Error::IsDir)).with_context(|| path.to_string());
    }
    let size = a.size;
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = fs
            .read(ino, off, &mut buf)
            .with_context(|| path.to_string())?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

fn stat(path: &str) -> Result<()> {
    let (img, p) = image_loc(path)?;
    let fs = open_img(&img, true)?;
    let ino = resolve(&fs, &p, false).with_context(|| path.to_string())?;
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
    if let Ok(x) = fs.listxattr(ino) {
        for n in x {
            println!("xattr: {}", String::from_utf8_lossy(&n));
        }
    }
    Ok(())
}

fn mkdir(path: &str, parents: bool) -> Result<()> {
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
                        let ino =
                            resolve_from(&fs, cur, &String::from_utf8_lossy(&t), true, &mut 0)
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

/// The error for a directory that a recursive walk reaches a second time: in a sound image
/// every directory has one parent, so this is a cycle or a hard-linked directory made by
/// corruption. Recursing on would never end.
pub(crate) fn directory_cycle(ino: u32) -> Error {
    Error::corrupt(format!(
        "directory inode {ino} is reached twice (a directory cycle or a hard-linked directory); run e2fsck -f"
    ))
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

fn rm(path: &str, recursive: bool, force: bool) -> Result<()> {
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

fn mv(src: &str, dst: &str) -> Result<()> {
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

/// Makes room for a non-directory called `name` in `dir`, as cp(1) does: an existing
/// non-directory there goes; an existing directory is an error. (Re-copying a tree over an
/// earlier copy stopped with "file exists" at its first symlink or second hard link.)
pub(crate) fn make_room(fs: &Fs, dir: u32, name: &[u8]) -> Result<()> {
    match fs.lookup(dir, name) {
        Ok(a) if a.is_dir() => bail!(
            "cannot overwrite directory {} with a non-directory",
            String::from_utf8_lossy(name)
        ),
        Ok(_) => fs.unlink(dir, name)?,
        Err(Error::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn ln(target: &str, link: &str, symbolic: bool) -> Result<()> {
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

fn truncate(path: &str, size: &str, create: bool) -> Result<()> {
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

// ---- cp ----

/// A progress bar over the bytes a copy moves, shown on large copies to a terminal.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(total: u64) -> Progress {
        use std::io::IsTerminal;
        if total >= 64 << 20 && std::io::stderr().is_terminal() {
            let pb = indicatif::ProgressBar::new(total);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Progress(Some(pb))
        } else {
            Progress(None)
        }
    }
    fn add(&self, n: u64) {
        if let Some(p) = &self.0 {
            p.inc(n);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish_and_clear();
        }
    }
}

fn host_total(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| host_total(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Bytes of regular files under `ino`, to size the progress bar (errors count as 0); each
/// directory counted once (`seen`), so a corrupt image's directory cycle ends the walk.
fn image_total(fs: &Fs, ino: u32, seen: &mut std::collections::HashSet<u32>) -> u64 {
    let Ok(a) = fs.getattr(ino) else { return 0 };
    if !a.is_dir() {
        return if a.mode & 0o170000 == 0o100000 {
            a.size
        } else {
            0
        };
    }
    if !seen.insert(ino) {
        return 0;
    }
    let mut kids = Vec::new();
    let _ = fs.readdir(ino, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            kids.push(e.ino);
        }
        true
    });
    kids.into_iter().map(|k| image_total(fs, k, seen)).sum()
}

fn ts(sec: i64, nsec: i64) -> Timestamp {
    Timestamp {
        sec,
        nsec: nsec as u32,
    }
}

/// Host data segments of a file: (offset, length), via SEEK_DATA/SEEK_HOLE.
pub(crate) fn host_segments(f: &std::fs::File, size: u64) -> Vec<(u64, u64)> {
    use std::os::unix::io::AsRawFd;
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: plain lseek on an open descriptor.
        let d = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        let h = unsafe { libc::lseek(f.as_raw_fd(), d, libc::SEEK_HOLE) };
        let h = if h < 0 { size as i64 } else { h };
        out.push((d as u64, (h - d) as u64));
        pos = h;
    }
    out
}

struct HostToImage<'a> {
    fs: &'a Fs,
    links: HashMap<(u64, u64), u32>,
    progress: Progress,
    failed_at: Option<PathBuf>,
}

impl HostToImage<'_> {
    /// Copies `src` to `name` in `dir`; on failure remembers the deepest path that failed.
    fn copy(&mut self, src: &Path, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let r = self.copy_one(src, dir, name, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(src.to_path_buf());
        }
        r
    }

    fn copy_one(&mut self, src: &Path, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let md = std::fs::symlink_metadata(src)?;
        let fs = self.fs;
        let ft = md.file_type();
        let ino = if ft.is_dir() {
            if !recursive {
                bail!("{}: is a directory (use -r)", src.display());
            }
            let ino = match fs.lookup(dir, name) {
                Ok(a) if a.is_dir() => a.ino,
                _ => fs.mkdir(dir, name, md.mode(), md.uid(), md.gid())?.ino,
            };
            self.copy_entries(src, ino)?;
            ino
        } else if let Some(&existing) = self
            .links
            .get(&(md.dev(), md.ino()))
            .filter(|_| md.nlink() > 1)
        {
            make_room(fs, dir, name)?;
            fs.link(existing, dir, name)?;
            return Ok(());
        } else if ft.is_symlink() {
            let t = std::fs::read_link(src)?;
            make_room(fs, dir, name)?;
            fs.symlink(dir, name, t.as_os_str().as_bytes(), md.uid(), md.gid())?
                .ino
        } else if ft.is_file() {
            make_room(fs, dir, name)?;
            let ino = fs.create(dir, name, md.mode(), md.uid(), md.gid())?.ino;
            let f = std::fs::File::open(src)?;
            let mut buf = vec![0u8; 1 << 20];
            for (start, len) in host_segments(&f, md.len()) {
                let mut off = start;
                while off < start + len {
                    let n = ((start + len - off) as usize).min(buf.len());
                    f.read_exact_at(&mut buf[..n], off)?;
                    fs.write_all(ino, off, &buf[..n])?;
                    self.progress.add(n as u64);
                    off += n as u64;
                }
            }
            if fs.getattr(ino)?.size != md.len() {
                fs.truncate(ino, md.len())?;
            }
            ino
        } else {
            make_room(fs, dir, name)?;
            fs.mknod(dir, name, md.mode(), md.rdev() as u32, md.uid(), md.gid())?
                .ino
        };
        if md.nlink() > 1 && !ft.is_dir() {
            self.links.insert((md.dev(), md.ino()), ino);
        }
        self.copy_attributes(src, &md, ino, false)
    }

    /// Copies the entries of the host directory `src` into the image's directory `dir`, in
    /// name order (the same image from the same tree, whatever order the host lists it in).
    fn copy_entries(&mut self, src: &Path, dir: u32) -> Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(src)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            self.copy(&e.path(), dir, e.file_name().as_bytes(), true)?;
        }
        Ok(())
    }

    /// `cp -r DIR/. IMAGE:DEST`, as cp(1): DIR's contents into DEST, and DIR's own mode,
    /// owner, times and attributes onto DEST (`mkfs -d DIR` puts a tree in the root so).
    pub(crate) fn copy_contents(&mut self, src: &Path, dir: u32) -> Result<()> {
        let md = std::fs::metadata(src)?;
        if !md.is_dir() {
            bail!("{}: not a directory", src.display());
        }
        self.copy_entries(src, dir)?;
        self.copy_attributes(src, &md, dir, true)
    }

    /// Extended attributes, mode and times of `src` onto `ino` (and its owner with `owner`:
    /// made inodes get it at creation).
    fn copy_attributes(
        &mut self,
        src: &Path,
        md: &std::fs::Metadata,
        ino: u32,
        owner: bool,
    ) -> Result<()> {
        let fs = self.fs;
        let ft = md.file_type();
        // Symlinks too: they carry trusted. and security. attributes (never user. ones).
        match host_xattrs(src) {
            Ok(list) => {
                for (name, value) in list {
                    if let Err(e) = fs.setxattr(ino, &name, &value, XattrFlags::Any) {
                        warn_xattr(src, &name, e);
                    }
                }
            }
            Err(e) => warn_xattr(src, b"(list)", e),
        }
        let set = SetAttr {
            mode: if ft.is_symlink() {
                None
            } else {
                Some(md.mode())
            },
            uid: owner.then(|| md.uid()),
            gid: owner.then(|| md.gid()),
            atime: Some(TimeSet::At(ts(md.atime(), md.atime_nsec()))),
            mtime: Some(TimeSet::At(ts(md.mtime(), md.mtime_nsec()))),
            ..Default::default()
        };
        fs.setattr(ino, &set)?;
        Ok(())
    }
}

/// Copies the contents of the host directory `src` into the image directory `dir` (and
/// `src`'s own attributes onto `dir`), as `cp -a SRC/. DEST`.
pub(crate) fn copy_host_contents(fs: &Fs, src: &Path, dir: u32) -> Result<()> {
    let mut c = HostToImage {
        fs,
        links: HashMap::new(),
        progress: Progress::new(host_total(src)),
        failed_at: None,
    };
    let r = c.copy_contents(src, dir);
    match c.failed_at {
        Some(p) => r.with_context(|| p.display().to_string()),
        None => r,
    }
}

/// The extended attributes of a host path (not following a symlink): (name, value) pairs.
pub(crate) fn host_xattrs(p: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use std::ffi::CString;
    let c = CString::new(p.as_os_str().as_bytes())?;
    let mut names = vec![0u8; 4096];
    let n = loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name)?;
        let mut val = vec![0u8; 65536];
        // SAFETY: valid C strings and a buffer valid for its length.
        let got =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        val.truncate(got as usize);
        out.push((name.to_vec(), val));
    }
    Ok(out)
}

fn warn_xattr(what: &Path, name: &[u8], e: impl std::fmt::Display) {
    eprintln!(
        "uext4: cp: warning: {}: extended attribute {} not copied: {e}",
        what.display(),
        String::from_utf8_lossy(name)
    );
}

/// Gives a copied host file the image file's owner (when allowed: root, or the same user),
/// mode and times, in that order: a change of owner clears set-id bits.
fn set_host_times(fs: &Fs, p: &Path, a: &Attr) -> Result<()> {
    use std::ffi::CString;
    let c = CString::new(p.as_os_str().as_bytes())?;
    // SAFETY: a valid C string. Failure (not root) leaves the copier's ownership, as cp -p does.
    unsafe { libc::lchown(c.as_ptr(), a.uid, a.gid) };
    // Extended attributes after the owner (a chown drops security.capability), before the
    // mode; a symlink's too (trusted. and security. ones).
    for name in fs.listxattr(a.ino).unwrap_or_default() {
        let v = match fs.getxattr(a.ino, &name) {
            Ok(v) => v,
            Err(e) => {
                warn_xattr(p, &name, e);
                continue;
            }
        };
        let cn = CString::new(name.clone())?;
        // SAFETY: valid C strings and a buffer valid for its length.
        let r = unsafe { libc::lsetxattr(c.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if r != 0 {
            warn_xattr(p, &name, std::io::Error::last_os_error());
        }
    }
    if a.mode & 0o170000 != 0o120000 {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(a.mode as u32 & 0o7777))?;
    }
    let t = [
        libc::timespec {
            tv_sec: a.atime.sec as libc::time_t,
            tv_nsec: a.atime.nsec as libc::c_long,
        },
        libc::timespec {
            tv_sec: a.mtime.sec as libc::time_t,
            tv_nsec: a.mtime.nsec as libc::c_long,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

struct ImageToHost<'a> {
    fs: &'a Fs,
    links: HashMap<u32, PathBuf>,
    progress: Progress,
    failed_at: Option<PathBuf>,
    /// Directories entered so far (see `directory_cycle`).
    dirs_seen: std::collections::HashSet<u32>,
}

impl ImageToHost<'_> {
    /// Copies inode `ino` to `dst`; on failure remembers the deepest path that failed.
    fn copy(&mut self, ino: u32, dst: &Path, recursive: bool) -> Result<()> {
        let r = self.copy_one(ino, dst, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(dst.to_path_buf());
        }
        r
    }

    fn copy_one(&mut self, ino: u32, dst: &Path, recursive: bool) -> Result<()> {
        let fs = self.fs;
        let a = fs.getattr(ino)?;
        match a.mode & 0o170000 {
            0o040000 => {
                if !recursive {
                    bail!("the source is a directory (use -r)");
                }
                if !self.dirs_seen.insert(ino) {
                    return Err(directory_cycle(ino).into());
                }
                if !dst.is_dir() {
                    std::fs::create_dir(dst)?;
                }
                let mut entries = Vec::new();
                fs.readdir(ino, 0, &mut |e| {
                    entries.push(e);
                    true
                })?;
                for e in entries {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    self.copy(e.ino, &dst.join(std::ffi::OsStr::from_bytes(&e.name)), true)?;
                }
            }
            0o120000 => {
                let t = fs.readlink(ino)?;
                let _ = std::fs::remove_file(dst);
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), dst)?;
            }
            0o100000 => {
                if a.nlink > 1 {
                    if let Some(first) = self.links.get(&ino) {
                        let _ = std::fs::remove_file(dst);
                        std::fs::hard_link(first, dst)?;
                        return Ok(());
                    }
                    self.links.insert(ino, dst.to_path_buf());
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(dst)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut pos = 0u64;
                while pos < a.size {
                    let d = match fs.lseek_data_hole(ino, pos, true) {
                        Ok(d) => d,
                        Err(Error::Nxio) => break,
                        Err(e) => return Err(e.into()),
                    };
                    let h = fs.lseek_data_hole(ino, d, false)?;
                    let mut off = d;
                    while off < h {
                        let n = ((h - off) as usize).min(buf.len());
                        let got = fs.read(ino, off, &mut buf[..n])?;
                        f.write_all_at(&buf[..got], off)?;
                        self.progress.add(got as u64);
                        off += got as u64;
                        if got == 0 {
                            break;
                        }
                    }
                    pos = h;
                }
                f.set_len(a.size)?;
            }
            _ => {
                use std::ffi::CString;
                let c = CString::new(dst.as_os_str().as_bytes())?;
                // SAFETY: valid C string.
                if unsafe { libc::mknod(c.as_ptr(), a.mode as libc::mode_t, a.rdev as libc::dev_t) }
                    != 0
                {
                    return Err(std::io::Error::last_os_error().into());
                }
            }
        }
        set_host_times(fs, dst, &a)
    }
}

/// A copy between two images (or within one), engine to engine.
struct ImageToImage<'a> {
    src: &'a Fs,
    dst: &'a Fs,
    /// Source inode -> destination inode, for hard links.
    links: HashMap<u32, u32>,
    progress: Progress,
    /// The source path (as far as known) of the deepest failure.
    failed_at: Option<String>,
    /// Source directories entered so far (see `directory_cycle`).
    dirs_seen: std::collections::HashSet<u32>,
    /// Within one image: the directories this copy made or filled, which it must not copy
    /// again as sources (`cp -r img:/a img:/a/b`, or a corrupt entry leading back up).
    dirs_made: std::collections::HashSet<u32>,
}

impl ImageToImage<'_> {
    /// Within one image: refuses to copy directory `src` into `dst_dir` when that is `src`
    /// itself or below it (the copy would never end).
    fn refuse_into_itself(&self, src: u32, dst_dir: u32) -> Result<()> {
        let mut cur = dst_dir;
        for _ in 0..4096 {
            if cur == src {
                bail!("cannot copy a directory into itself");
            }
            if cur == 2 {
                return Ok(());
            }
            cur = self.dst.lookup(cur, b"..")?.ino;
        }
        bail!("directory tree too deep")
    }

    fn copy_children(&mut self, ino: u32, dir: u32) -> Result<()> {
        let mut entries = Vec::new();
        self.src.readdir(ino, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e);
            }
            true
        })?;
        for e in entries {
            self.copy(e.ino, dir, &e.name, true)?;
        }
        Ok(())
    }

    fn copy(&mut self, ino: u32, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let r = self.copy_one(ino, dir, name, recursive);
        if r.is_err() && self.failed_at.is_none() {
            self.failed_at = Some(String::from_utf8_lossy(name).into_owned());
        } else if let (Err(_), Some(p)) = (&r, &mut self.failed_at) {
            // Build the failing path up as the recursion unwinds.
            if !p.starts_with('/') {
                *p = format!("{}/{p}", String::from_utf8_lossy(name));
            }
        }
        r
    }

    fn copy_one(&mut self, ino: u32, dir: u32, name: &[u8], recursive: bool) -> Result<()> {
        let (src, dst) = (self.src, self.dst);
        let a = src.getattr(ino)?;
        let kind = a.mode as u32 & 0o170000;
        let new = match kind {
            0o040000 => {
                if !recursive {
                    bail!("the source is a directory (use -r)");
                }
                if self.dirs_made.contains(&ino) {
                    bail!("cannot copy a directory into itself");
                }
                if !self.dirs_seen.insert(ino) {
                    return Err(directory_cycle(ino).into());
                }
                let d = match dst.lookup(dir, name) {
                    Ok(e) if e.is_dir() => e.ino,
                    _ => dst.mkdir(dir, name, a.mode as u32, a.uid, a.gid)?.ino,
                };
                if std::ptr::eq(src, dst) {
                    self.dirs_made.insert(d);
                }
                self.copy_children(ino, d)?;
                d
            }
            _ if a.nlink > 1 && self.links.contains_key(&ino) => {
                make_room(dst, dir, name)?;
                dst.link(self.links[&ino], dir, name)?;
                return Ok(());
            }
            0o120000 => {
                let target = src.readlink(ino)?;
                make_room(dst, dir, name)?;
                dst.symlink(dir, name, &target, a.uid, a.gid)?.ino
            }
            0o100000 => {
                if let Ok(e) = dst.lookup(dir, name) {
                    if std::ptr::eq(src, dst) && e.ino == ino {
                        bail!("source and destination are the same file");
                    }
                }
                make_room(dst, dir, name)?;
                let f = dst.create(dir, name, a.mode as u32, a.uid, a.gid)?.ino;
                let mut buf = vec![0u8; 1 << 20];
                let mut pos = 0u64;
                while pos < a.size {
                    let d = match src.lseek_data_hole(ino, pos, true) {
                        Ok(d) => d,
                        Err(Error::Nxio) => break,
                        Err(e) => return Err(e.into()),
                    };
                    let h = src.lseek_data_hole(ino, d, false)?;
                    let mut off = d;
                    while off < h {
                        let n = ((h - off) as usize).min(buf.len());
                        let got = src.read(ino, off, &mut buf[..n])?;
                        if got == 0 {
                            break;
                        }
                        dst.write_all(f, off, &buf[..got])?;
                        self.progress.add(got as u64);
                        off += got as u64;
                    }
                    pos = h;
                }
                if dst.getattr(f)?.size != a.size {
                    dst.truncate(f, a.size)?;
                }
                f
            }
            _ => {
                make_room(dst, dir, name)?;
                dst.mknod(dir, name, a.mode as u32, a.rdev, a.uid, a.gid)?
                    .ino
            }
        };
        if a.nlink > 1 && kind != 0o040000 {
            self.links.insert(ino, new);
        }
        // Symlinks too (trusted. and security. attributes).
        for n in src.listxattr(ino).unwrap_or_default() {
            let r = src
                .getxattr(ino, &n)
                .and_then(|v| dst.setxattr(new, &n, &v, XattrFlags::Any));
            if let Err(e) = r {
                warn_xattr(Path::new(&*String::from_utf8_lossy(name)), &n, e);
            }
        }
        let set = SetAttr {
            mode: (kind != 0o120000).then_some(a.mode as u32),
            atime: Some(TimeSet::At(a.atime)),
            mtime: Some(TimeSet::At(a.mtime)),
            crtime: Some(a.crtime),
            ..Default::default()
        };
        dst.setattr(new, &set)?;
        Ok(())
    }
}

/// Whether `path` (host or IMAGE:PATH) is a directory.
fn is_directory(path: &str) -> Result<bool> {
    Ok(match parse_loc(path)? {
        Loc::Host(p) => p.is_dir(),
        Loc::Image(img, p) => {
            let fs = open_img(&img, true)?;
            resolve(&fs, &p, true).is_ok_and(|ino| fs.getattr(ino).is_ok_and(|a| a.is_dir()))
        }
    })
}

fn cp(src: &str, dst: &str, recursive: bool) -> Result<()> {
    match (parse_loc(src)?, parse_loc(dst)?) {
        (Loc::Host(s), Loc::Image(img, d)) => {
            let fs = open_img(&img, false)?;
            let total = host_total(&s);
            if src == "." || src.ends_with("/.") {
                // DIR/. : DIR's contents into the directory DST, as cp(1).
                let r = (|| -> Result<()> {
                    if !recursive {
                        bail!("{src}: is a directory (use -r)");
                    }
                    let dir = resolve(&fs, &d, true).with_context(|| dst.to_string())?;
                    if !fs.getattr(dir)?.is_dir() {
                        bail!("{dst}: not a directory");
                    }
                    copy_host_contents(&fs, &s, dir)
                })();
                return finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")));
            }
            let r = (|| -> Result<()> {
                let name = s
                    .file_name()
                    .ok_or_else(|| anyhow!("{src}: no file name"))?
                    .as_bytes()
                    .to_vec();
                let (dir, n) = match resolve(&fs, &d, true) {
                    Ok(ino) if fs.getattr(ino)?.is_dir() => (ino, name),
                    _ => parent_of(&fs, &d)?,
                };
                let mut c = HostToImage {
                    fs: &fs,
                    links: HashMap::new(),
                    progress: Progress::new(total),
                    failed_at: None,
                };
                let r = c.copy(&s, dir, &n, recursive);
                match c.failed_at {
                    Some(p) if p != s => r.with_context(|| p.display().to_string()),
                    _ => r,
                }
            })();
            finish(&fs, &img.path, r.with_context(|| format!("{src} -> {dst}")))
        }
        (Loc::Image(img, s), Loc::Host(d)) => {
            let fs = open_img(&img, true)?;
            let ino = resolve(&fs, &s, false).with_context(|| src.to_string())?;
            let total = if recursive {
                image_total(&fs, ino, &mut Default::default())
            } else {
                fs.getattr(ino)?.size
            };
            let whole_root = s.split('/').all(|c| c.is_empty() || c == ".");
            let target = if d.is_dir() && whole_root {
                // The image's root: its contents go into the directory.
                d
            } else if d.is_dir() {
                let name = s
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .filter(|n| !n.is_empty())
                    .unwrap_or("root");
                d.join(name)
            } else {
                d
            };
            let mut c = ImageToHost {
                fs: &fs,
                links: HashMap::new(),
                progress: Progress::new(total),
                failed_at: None,
                dirs_seen: Default::default(),
            };
            let r = c.copy(ino, &target, recursive);
            let r = match c.failed_at {
                Some(p) if p != target => r.with_context(|| p.display().to_string()),
                _ => r,
            };
            r.with_context(|| format!("{src} -> {dst}"))
        }
        (Loc::Image(si, s), Loc::Image(di, d)) => {
            // Directly between the two engines; one engine when both sides are the same image.
            let same_file = std::fs::canonicalize(&si.path)? == std::fs::canonicalize(&di.path)?;
            let same = same_file && si.within == di.within;
            if same_file && !same {
                // Two parts of one file: fine when they are apart (two partitions), never
                // when one overlaps the other.
                let (a, b) = (si.range()?, di.range()?);
                if a.0 < b.1 && b.0 < a.1 {
                    bail!("{src} -> {dst}: the two overlap in {}", si.path.display());
                }
            }
            let dfs = open_img(&di, false)?;
            let sfs = if same {
                dfs.clone()
            } else {
                match open_img(&si, true) {
                    Ok(f) => f,
                    Err(e) => return finish(&dfs, &di.path, Err(e)),
                }
            };
            let r = (|| -> Result<()> {
                let ino = resolve(&sfs, &s, false).with_context(|| src.to_string())?;
                let total = if recursive {
                    image_total(&sfs, ino, &mut Default::default())
                } else {
                    sfs.getattr(ino)?.size
                };
                let mut c = ImageToImage {
                    src: &sfs,
                    dst: &dfs,
                    links: HashMap::new(),
                    progress: Progress::new(total),
                    failed_at: None,
                    dirs_seen: Default::default(),
                    dirs_made: Default::default(),
                };
                let target = resolve(&dfs, &d, true)
                    .ok()
                    .filter(|&t| dfs.getattr(t).map(|a| a.is_dir()).unwrap_or(false));
                let name = s
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .filter(|n| !n.is_empty() && *n != ".")
                    .map(|n| n.as_bytes().to_vec());
                let r = match (target, name) {
                    // The root into an existing directory: its entries go into it.
                    (Some(t), None) => {
                        if same && sfs.getattr(ino)?.is_dir() {
                            c.refuse_into_itself(ino, t)?;
                        }
                        c.copy_children(ino, t)
                    }
                    (Some(t), Some(n)) => {
                        if same && sfs.getattr(ino)?.is_dir() {
                            c.refuse_into_itself(ino, t)?;
                        }
                        c.copy(ino, t, &n, recursive)
                    }
                    (None, _) => {
                        let (pd, pn) = parent_of(&dfs, &d)?;
                        if same && sfs.getattr(ino)?.is_dir() {
                            c.refuse_into_itself(ino, pd)?;
                        }
                        c.copy(ino, pd, &pn, recursive)
                    }
                };
                match c.failed_at {
                    Some(p) => r.with_context(|| p),
                    None => r,
                }
            })();
            finish(&dfs, &di.path, r.with_context(|| format!("{src} -> {dst}")))
        }
        (Loc::Host(_), Loc::Host(_)) => {
            bail!("one side of cp must be IMAGE:PATH (an existing image file)")
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_on_a_terminal_are_escaped_as_ls_b() {
        assert_eq!(super::escaped_name(b"plain name"), "plain name");
        assert_eq!(super::escaped_name(b"a\nb\tc\\d"), "a\\nb\\tc\\\\d");
        assert_eq!(super::escaped_name(b"x\xffy\x01"), "x\\377y\\001");
        assert_eq!(super::escaped_name("é".as_bytes()), "é");
    }
}
