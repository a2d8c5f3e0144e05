//! The image tools: mkfs, info, ls, cat, cp, mkdir, rm, mv, ln, stat, chmod, chown, touch,
//! truncate, fstrim, chattr, lsattr, label, fscrypt, verity, quota, one file per tool or family. Paths inside an
//! image are written IMAGE:PATH; IMAGE
//! may be `disk.img@2` (partition 2 of a whole-disk image, GPT or MBR, numbered as fdisk and
//! lsblk number them) or `disk.img@offset=BYTES[,size=BYTES]` (a filesystem at a byte offset,
//! as in a SIF container); a file literally named so wins. Each tool opens the image, does its
//! work and leaves the image clean (`Fs::unmount`), so no root and no mount are needed.

pub mod attrs;
mod build;
mod cat;
pub mod chattr;
pub mod cp;
pub mod devtable;
mod examine;
pub mod fit;
pub mod fscrypt;
mod fstrim;
mod info;
mod journal;
mod ls;
pub mod mkfs;
mod namespace;
mod quota;
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
    Info {
        /// One JSON object instead: each line's label in snake_case as a key (docs/USAGE.md).
        #[arg(long)]
        json: bool,
        /// The image file or block device (IMAGE@N, IMAGE@offset=BYTES, an NBD URI).
        image: PathBuf,
    },
    /// List a directory: IMAGE:PATH.
    #[command(disable_help_flag = true)]
    Ls {
        /// Long form: mode, links, owner, group, size, modification time, name.
        #[arg(short = 'l')]
        long: bool,
        /// With -l, sizes as 1.5K, 12M, 3.1G (powers of 1024), as ls -h.
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        /// Print help (ls's -h is --human-readable, as in ls(1)).
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Also the entries a removal left readable in the directory's blocks, marked
        /// `(deleted)`; entries in block order (read-only).
        #[arg(long)]
        deleted: bool,
        /// A JSON array instead: name, inode, type, deleted, mode, uid, gid, size, links,
        /// mtime {sec, nsec}, in the order the directory's blocks hold the entries.
        #[arg(long)]
        json: bool,
        /// The directory (or file) to list: IMAGE:PATH.
        path: String,
    },
    /// Print a file: IMAGE:PATH.
    Cat {
        /// The file to print: IMAGE:PATH.
        path: String,
    },
    /// Copy files: SRC... DST, either side may be IMAGE:PATH (several sources go into the
    /// directory DST; `DIR/.` copies DIR's contents, as cp(1)).
    Cp {
        /// Copy directories and what they hold (-R too).
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// The sources are tar archives (plain, gzip or zstd; `-` is stdin), unpacked in
        /// order into the image directory DST as they say (owners, devices, xattrs, holes).
        #[arg(long = "from-tar")]
        from_tar: bool,
        /// SRC... DST: host paths or IMAGE:PATH.
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// Make directories: IMAGE:PATH...
    Mkdir {
        /// Make missing parents too, and say nothing of a directory that exists.
        #[arg(short = 'p')]
        parents: bool,
        /// The directories to make: IMAGE:PATH...
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files (with -r, directories): IMAGE:PATH...
    Rm {
        /// Remove directories and what they hold (-R too).
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// Say nothing of a file that does not exist.
        #[arg(short = 'f')]
        force: bool,
        /// The files to remove: IMAGE:PATH...
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename or move inside one image.
    Mv {
        /// What to move: IMAGE:PATH.
        src: String,
        /// Where to: IMAGE:PATH in the same image (into it, if a directory).
        dst: String,
    },
    /// Make a hard link (or with -s a symbolic link) inside an image.
    Ln {
        /// Make a symbolic link (TARGET is then its text, stored as given).
        #[arg(short = 's')]
        symbolic: bool,
        /// What the link points to: IMAGE:PATH (with -s, any text).
        target: String,
        /// The new link: IMAGE:PATH.
        link: String,
    },
    /// Show a file's attributes, then its inode as debugfs's `stat` shows it (times raw and
    /// decoded, dtime, flags, extents or blocks, checksum, place on disk): IMAGE:PATH, or
    /// IMAGE:<N> for inode N, in use or not.
    Stat {
        /// One JSON object instead (fields in docs/USAGE.md).
        #[arg(long)]
        json: bool,
        /// The file: IMAGE:PATH, or IMAGE:<N> for inode N.
        path: String,
    },
    /// Change permissions: MODE (octal, or symbolic as u+x,go-w) IMAGE:PATH...
    Chmod {
        /// Also everything below the directories named.
        #[arg(short = 'R')]
        recursive: bool,
        /// Octal (0644) or symbolic (u+x,go-w), as chmod(1).
        #[arg(allow_hyphen_values = true)]
        mode: String,
        /// The files: IMAGE:PATH...
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Change the owner: UID[:GID] (numeric) IMAGE:PATH...
    Chown {
        /// Also everything below the directories named.
        #[arg(short = 'R')]
        recursive: bool,
        /// Change a symlink itself, not what it points to.
        #[arg(short = 'h', long = "no-dereference")]
        no_deref: bool,
        /// UID, UID:GID or :GID (numbers).
        owner: String,
        /// The files: IMAGE:PATH...
        #[arg(required = true)]
        paths: Vec<String>,
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
        /// The files: IMAGE:PATH...
        #[arg(required = true)]
        paths: Vec<String>,
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
        /// The image file or block device (IMAGE@N, IMAGE@offset=BYTES, an NBD URI).
        image: PathBuf,
    },
    /// Set a file's size: IMAGE:PATH (a missing file is made, as truncate(1) makes it;
    /// with -c it is left missing).
    Truncate {
        /// The new size in bytes, or with a suffix: 64K, 1M, 2G.
        #[arg(short = 's')]
        size: String,
        /// Do not create a missing file (and say nothing of it).
        #[arg(short = 'c', long = "no-create")]
        no_create: bool,
        /// The file: IMAGE:PATH.
        path: String,
    },
    /// Change inode flags, as chattr(1): MODE... (+-=[aAcCdDFijmPsStTux]) IMAGE:PATH.
    Chattr {
        /// Also everything below the directories named.
        #[arg(short = 'R')]
        recursive: bool,
        /// Set the project id (needs the project feature).
        #[arg(short = 'p')]
        project: Option<u32>,
        /// MODE... IMAGE:PATH: each MODE is +, - or = and flag letters (+i, -a, =e).
        #[arg(allow_hyphen_values = true, required = true, num_args = 1..)]
        args: Vec<String>,
    },
    /// List inode flags, as lsattr(1): IMAGE:PATH (a directory lists its entries).
    Lsattr {
        /// The directory itself, not its entries.
        #[arg(short = 'd')]
        dir_itself: bool,
        /// Also everything below.
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
        /// The file or directory: IMAGE:PATH.
        path: String,
    },
    /// The names of inodes, as debugfs's ncheck: IMAGE INODE... (read-only).
    Ncheck {
        /// The image file or block device.
        image: PathBuf,
        /// Inode numbers.
        #[arg(required = true)]
        inodes: Vec<u32>,
        /// A JSON array instead (docs/USAGE.md).
        #[arg(long)]
        json: bool,
    },
    /// The inodes owning blocks, as debugfs's icheck: IMAGE BLOCK... (read-only).
    Icheck {
        /// The image file or block device.
        image: PathBuf,
        /// Block numbers.
        #[arg(required = true)]
        blocks: Vec<u64>,
        /// A JSON array instead (docs/USAGE.md).
        #[arg(long)]
        json: bool,
    },
    /// Every inode record, its number first, as the Sleuth Kit's `ils -e` (with --deleted,
    /// as plain `ils`: inodes not in use that were used once): IMAGE (read-only).
    Inodes {
        /// Only the inodes not in use that were used once, as plain `ils`.
        #[arg(long)]
        deleted: bool,
        /// A JSON array of the same records instead (docs/USAGE.md).
        #[arg(long)]
        json: bool,
        /// The image file or block device.
        image: PathBuf,
    },
    /// The Sleuth Kit's body file (as `fls -r -m /` writes it) for every name, removed ones
    /// too, and every deleted inode no name reaches; `mactime -b FILE` makes the timeline:
    /// IMAGE (read-only).
    Timeline {
        /// The image file or block device.
        image: PathBuf,
    },
    /// The transactions the journal's log still holds and what each logged block is, as
    /// debugfs's `logdump -a`; or the older copies of one inode (--inode) or block (--block):
    /// IMAGE (read-only).
    Journal {
        /// The image file or block device.
        image: PathBuf,
        /// The copies of this inode that logged inode-table blocks hold, oldest first.
        #[arg(long, value_name = "N", conflicts_with = "block")]
        inode: Option<u32>,
        /// Only the transactions that logged this block.
        #[arg(long, value_name = "BLOCK")]
        block: Option<u64>,
        /// One JSON object instead (docs/USAGE.md).
        #[arg(long)]
        json: bool,
    },
    /// Deleted files brought back from older copies of their inodes in the journal, as
    /// extundelete --restore-all: IMAGE DIR (read-only on the image; writes under DIR).
    Recover {
        /// The image file or block device.
        image: PathBuf,
        /// Where to write the files (made if missing).
        dir: PathBuf,
        /// Only these inodes.
        #[arg(long = "inode", value_name = "N")]
        inodes: Vec<u32>,
        /// A JSON array of what was written instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Set and read encryption policies (fscrypt), as fscryptctl(8).
    #[command(subcommand)]
    Fscrypt(fscrypt::FscryptCmd),
    /// Enable fs-verity on a file and measure it, as fsverity(1).
    #[command(subcommand)]
    Verity(verity::VerityCmd),
    /// Report quota usage and limits, as repquota(8): [-ugP] IMAGE; set limits, as
    /// setquota(8): set -u|-g|-P ID BLOCK-SOFT BLOCK-HARD INODE-SOFT INODE-HARD IMAGE.
    Quota(quota::QuotaArgs),
    /// Print the filesystem label, or set it (at most 16 bytes), as e2label(8).
    Label {
        /// The image file or block device.
        image: PathBuf,
        /// The new label (none: print the current one).
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
            ToolCmd::Journal { .. } => "journal",
            ToolCmd::Recover { .. } => "recover",
            ToolCmd::Verity(_) => "verity",
            ToolCmd::Quota(_) => "quota",
        }
    }
}

/// A command of several operands, as coreutils run them: each in turn, a failure said (one
/// line, as main says the last) and the rest still done; the last failure is the result.
fn each(name: &str, paths: &[String], mut f: impl FnMut(&str) -> Result<()>) -> Result<()> {
    let mut failed = None;
    for p in paths {
        if let Err(e) = f(p) {
            if let Some(prev) = failed.replace(e) {
                eprintln!("uext4: {name}: {}", crate::image::plain(&prev));
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

pub fn run(cmd: ToolCmd) -> Result<()> {
    match cmd {
        ToolCmd::Mkfs(a) => crate::tools::mkfs::run(a),
        ToolCmd::Info { image, json: false } => info(&image),
        ToolCmd::Info { image, json: true } => info::info_json(&image),
        ToolCmd::Ls {
            json: true,
            deleted,
            path,
            ..
        } => examine::ls_json(&path, deleted),
        ToolCmd::Ls {
            long,
            human,
            deleted: true,
            path,
            ..
        } => examine::ls_deleted(&path, long, human),
        ToolCmd::Ls {
            long, human, path, ..
        } => ls(&path, long, human),
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
        ToolCmd::Mkdir { parents, paths } => each("mkdir", &paths, |p| mkdir(p, parents)),
        ToolCmd::Rm {
            recursive,
            force,
            paths,
        } => each("rm", &paths, |p| rm(p, recursive, force)),
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
            paths,
        } => each("chmod", &paths, |p| {
            crate::tools::attrs::chmod(&mode, p, recursive)
        }),
        ToolCmd::Chown {
            recursive,
            no_deref,
            owner,
            paths,
        } => each("chown", &paths, |p| {
            crate::tools::attrs::chown(&owner, p, recursive, no_deref)
        }),
        ToolCmd::Touch {
            atime,
            mtime,
            no_create,
            date,
            stamp,
            reference,
            paths,
        } => {
            let a = crate::tools::attrs::TouchArgs {
                atime_only: atime,
                mtime_only: mtime,
                no_create,
                date,
                stamp,
                reference,
            };
            each("touch", &paths, |p| crate::tools::attrs::touch(&a, p))
        }
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
        c @ (ToolCmd::Ncheck { .. }
        | ToolCmd::Timeline { .. }
        | ToolCmd::Inodes { .. }
        | ToolCmd::Icheck { .. }
        | ToolCmd::Journal { .. }
        | ToolCmd::Recover { .. }) => examine_cmd(c),
        ToolCmd::Verity(c) => verity::run(c),
        ToolCmd::Quota(a) => quota::run(a),
    }
}

/// The examiner's commands (read-only, below the namespace).
fn examine_cmd(cmd: ToolCmd) -> Result<()> {
    match cmd {
        ToolCmd::Ncheck {
            image,
            inodes,
            json,
        } => examine::ncheck(&image, &inodes, json),
        ToolCmd::Timeline { image } => examine::timeline(&image),
        ToolCmd::Inodes {
            deleted,
            image,
            json,
        } => examine::inodes(&image, deleted, json),
        ToolCmd::Icheck {
            image,
            blocks,
            json,
        } => examine::icheck(&image, &blocks, json),
        ToolCmd::Journal {
            image,
            inode,
            block,
            json,
        } => journal::journal(&image, journal::JournalOpts { json, inode, block }),
        ToolCmd::Recover {
            image,
            dir,
            inodes,
            json,
        } => journal::recover(&image, &dir, &inodes, json),
        _ => unreachable!("examine_cmd is given the examiner's commands only"),
    }
}
