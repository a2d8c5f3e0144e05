//! The image tools: mkfs, info, ls, cat, cp, mkdir, rm, mv, ln, stat, chmod, chown, touch,
//! truncate, fstrim, chattr, lsattr, label, fscrypt, verity, one file per tool or family. Paths inside an
//! image are written IMAGE:PATH; IMAGE
//! may be `disk.img@2` (partition 2 of a whole-disk image, GPT or MBR, numbered as fdisk and
//! lsblk number them) or `disk.img@offset=BYTES[,size=BYTES]` (a filesystem at a byte offset,
//! as in a SIF container); a file literally named so wins. Each tool opens the image, does its
//! work and leaves the image clean (`Fs::unmount`), so no root and no mount are needed.

pub mod attrs;
mod cat;
pub mod chattr;
pub mod cp;
pub mod devtable;
mod examine;
pub mod fit;
pub mod fscrypt;
mod fstrim;
mod info;
mod ls;
pub mod mkfs;
mod namespace;
mod stat;
pub mod tar;
pub mod verity;

use cat::cat;
use cp::{cp, is_directory};
use fstrim::fstrim;
use info::info;
use ls::ls;
use namespace::{ln, mkdir, mv, rm, truncate};
use stat::stat;

use anyhow::{bail, Result};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per run
pub enum ToolCmd {
    /// Make a new ext4 (or ext3, ext2) filesystem (creates IMAGE if missing; IMAGE@N makes it
    /// in partition N, IMAGE@offset=BYTES at that offset of an existing file).
    Mkfs(crate::tools::mkfs::MkfsArgs),
    /// Print a summary of the superblock and features; of a whole-disk image, its partitions
    /// (name one as IMAGE@N).
    Info { image: PathBuf },
    /// List a directory: IMAGE:PATH.
    Ls {
        #[arg(short = 'l')]
        long: bool,
        /// Also the entries a removal left readable in the directory's blocks, marked
        /// `(deleted)`; entries in block order (read-only).
        #[arg(long)]
        deleted: bool,
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
    /// Show a file's attributes, then its inode as debugfs's `stat` shows it (times raw and
    /// decoded, dtime, flags, extents or blocks, checksum, place on disk): IMAGE:PATH, or
    /// IMAGE:<N> for inode N, in use or not.
    Stat {
        /// One JSON object instead (fields in docs/USAGE.md).
        #[arg(long)]
        json: bool,
        path: String,
    },
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
    /// Give the image's free blocks back to its storage, as fstrim(8): holes in an image
    /// file, TRIM to an NBD server.
    Fstrim {
        /// Free runs shorter than this are left (bytes, or 64K, 1M, ...).
        #[arg(short = 'm', long = "minimum")]
        minimum: Option<String>,
        /// Say how many bytes were trimmed.
        #[arg(short = 'v', long = "verbose")]
        verbose: bool,
        image: PathBuf,
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
    /// Change inode flags, as chattr(1): MODE... (+-=[aAcCdDFijmPsStTux]) IMAGE:PATH.
    Chattr {
        #[arg(short = 'R')]
        recursive: bool,
        /// Set the project id (needs the project feature).
        #[arg(short = 'p')]
        project: Option<u32>,
        #[arg(allow_hyphen_values = true, required = true, num_args = 1..)]
        args: Vec<String>,
    },
    /// List inode flags, as lsattr(1): IMAGE:PATH (a directory lists its entries).
    Lsattr {
        /// The directory itself, not its entries.
        #[arg(short = 'd')]
        dir_itself: bool,
        #[arg(short = 'R')]
        recursive: bool,
        /// Entries starting with '.' too.
        #[arg(short = 'a')]
        all: bool,
        /// Show the project id.
        #[arg(short = 'p')]
        project: bool,
        /// Show the generation.
        #[arg(short = 'v')]
        version: bool,
        path: String,
    },
    /// The names of inodes, as debugfs's ncheck: IMAGE INODE... (read-only).
    Ncheck {
        image: PathBuf,
        #[arg(required = true)]
        inodes: Vec<u32>,
    },
    /// The inodes owning blocks, as debugfs's icheck: IMAGE BLOCK... (read-only).
    Icheck {
        image: PathBuf,
        #[arg(required = true)]
        blocks: Vec<u64>,
    },
    /// Every inode record, its number first, as the Sleuth Kit's `ils -e` (with --deleted,
    /// as plain `ils`: inodes not in use that were used once): IMAGE (read-only).
    Inodes {
        #[arg(long)]
        deleted: bool,
        image: PathBuf,
    },
    /// The Sleuth Kit's body file (as `fls -r -m /` writes it) for every name, removed ones
    /// too, and every deleted inode no name reaches; `mactime -b FILE` makes the timeline:
    /// IMAGE (read-only).
    Timeline { image: PathBuf },
    /// Set and read encryption policies (fscrypt), as fscryptctl(8).
    #[command(subcommand)]
    Fscrypt(fscrypt::FscryptCmd),
    /// Enable fs-verity on a file and measure it, as fsverity(1).
    #[command(subcommand)]
    Verity(verity::VerityCmd),
    /// Print the filesystem label, or set it (at most 16 bytes), as e2label(8).
    Label {
        image: PathBuf,
        label: Option<String>,
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
            ToolCmd::Fstrim { .. } => "fstrim",
            ToolCmd::Chattr { .. } => "chattr",
            ToolCmd::Lsattr { .. } => "lsattr",
            ToolCmd::Label { .. } => "label",
            ToolCmd::Fscrypt(_) => "fscrypt",
            ToolCmd::Ncheck { .. } => "ncheck",
            ToolCmd::Timeline { .. } => "timeline",
            ToolCmd::Inodes { .. } => "inodes",
            ToolCmd::Icheck { .. } => "icheck",
            ToolCmd::Verity(_) => "verity",
        }
    }
}

pub fn run(cmd: ToolCmd) -> Result<()> {
    match cmd {
        ToolCmd::Mkfs(a) => crate::tools::mkfs::run(a),
        ToolCmd::Info { image } => info(&image),
        ToolCmd::Ls {
            long,
            deleted: true,
            path,
        } => examine::ls_deleted(&path, long),
        ToolCmd::Ls { long, path, .. } => ls(&path, long),
        ToolCmd::Cat { path } => cat(&path),
        ToolCmd::Cp {
            recursive,
            from_tar,
            paths,
        } => {
            let (dst, srcs) = paths.split_last().expect("clap asks for two paths or more");
            if from_tar {
                return crate::tools::tar::cp_from_tar(srcs, dst);
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
        ToolCmd::Stat { json, path } => stat(&path, json),
        ToolCmd::Fstrim {
            minimum,
            verbose,
            image,
        } => fstrim(&image, minimum.as_deref(), verbose),
        ToolCmd::Chmod {
            recursive,
            mode,
            path,
        } => crate::tools::attrs::chmod(&mode, &path, recursive),
        ToolCmd::Chown {
            recursive,
            no_deref,
            owner,
            path,
        } => crate::tools::attrs::chown(&owner, &path, recursive, no_deref),
        ToolCmd::Touch {
            atime,
            mtime,
            no_create,
            date,
            stamp,
            reference,
            path,
        } => crate::tools::attrs::touch(
            &crate::tools::attrs::TouchArgs {
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
        ToolCmd::Chattr {
            recursive,
            project,
            args,
        } => {
            let (path, modes) = args
                .split_last()
                .expect("clap asks for one argument or more");
            chattr::chattr(modes, project, path, recursive)
        }
        ToolCmd::Lsattr {
            dir_itself,
            recursive,
            all,
            project,
            version,
            path,
        } => {
            let o = chattr::LsattrOpts {
                dir_itself,
                recursive,
                all,
                project,
                version,
            };
            chattr::lsattr(&path, o)
        }
        ToolCmd::Label { image, label } => chattr::label(&image, label.as_deref()),
        ToolCmd::Fscrypt(c) => fscrypt::run(c),
        ToolCmd::Ncheck { image, inodes } => examine::ncheck(&image, &inodes),
        ToolCmd::Timeline { image } => examine::timeline(&image),
        ToolCmd::Inodes { deleted, image } => examine::inodes(&image, deleted),
        ToolCmd::Icheck { image, blocks } => examine::icheck(&image, &blocks),
        ToolCmd::Verity(c) => verity::run(c),
    }
}
