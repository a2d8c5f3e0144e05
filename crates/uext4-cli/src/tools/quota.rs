//! `uext4 quota`: the quota files of an image (the `quota` feature), as repquota(8) reports
//! them and setquota(8) sets limits. The kernel's FUSE does not pass quotactl(2) on, so on a
//! uext4 mount these tools, not quota(1), are the way to the limits; usage is kept by the
//! engine as files change.

use crate::image::*;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use uext4::format::quota::{Dquot, QuotaType};

/// Which quota types a command is about (none given: every type the image keeps).
#[derive(Args, Clone, Copy, Default)]
pub struct Types {
    /// User quotas.
    #[arg(short = 'u', long = "user")]
    user: bool,
    /// Group quotas.
    #[arg(short = 'g', long = "group")]
    group: bool,
    /// Project quotas.
    #[arg(short = 'P', long = "project")]
    project: bool,
}

impl Types {
    fn chosen(self) -> Vec<QuotaType> {
        let picked: Vec<QuotaType> = [
            (self.user, QuotaType::User),
            (self.group, QuotaType::Group),
            (self.project, QuotaType::Project),
        ]
        .into_iter()
        .filter_map(|(on, t)| on.then_some(t))
        .collect();
        if picked.is_empty() {
            QuotaType::ALL.to_vec()
        } else {
            picked
        }
    }
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct QuotaArgs {
    #[command(subcommand)]
    cmd: Option<QuotaCmd>,
    #[command(flatten)]
    types: Types,
    /// The image file or block device (IMAGE@N, IMAGE@offset=BYTES, an NBD URI).
    image: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum QuotaCmd {
    /// Set one id's limits, as setquota(8): -u|-g|-P ID BLOCK-SOFT BLOCK-HARD INODE-SOFT
    /// INODE-HARD IMAGE (block limits in KiB, or with K, M, G, T; 0: no limit).
    Set {
        #[command(flatten)]
        types: Types,
        /// The user, group or project id (a number).
        id: u32,
        /// Space soft limit (KiB; 64M, 2G with a suffix).
        block_soft: String,
        /// Space hard limit.
        block_hard: String,
        /// Inode soft limit.
        inode_soft: u64,
        /// Inode hard limit.
        inode_hard: u64,
        /// The image file or block device.
        image: PathBuf,
    },
    /// Set the grace periods of a type, as setquota -t: -u|-g|-P BLOCK-GRACE INODE-GRACE
    /// IMAGE (seconds).
    Grace {
        #[command(flatten)]
        types: Types,
        /// How long space may stay over a soft limit (seconds).
        block_grace: u32,
        /// How long inodes may stay over a soft limit (seconds).
        inode_grace: u32,
        /// The image file or block device.
        image: PathBuf,
    },
}

/// The one type a changing command names.
fn one_type(types: Types, what: &str) -> Result<QuotaType> {
    match types.chosen()[..] {
        [t] => Ok(t),
        _ => Err(Usage(format!("quota {what}: give one of -u, -g, -P")).into()),
    }
}

/// A block limit as setquota takes it: a number of KiB, or a size with a suffix; in bytes.
fn block_limit(s: &str) -> Result<u64> {
    if s.chars().all(|c| c.is_ascii_digit()) {
        let k: u64 = s.parse().map_err(|_| anyhow!("{s:?} is not a number"))?;
        return k
            .checked_mul(1024)
            .ok_or_else(|| anyhow!("{s:?} is too large"));
    }
    parse_size(s)
}

pub fn run(a: QuotaArgs) -> Result<()> {
    match a.cmd {
        Some(QuotaCmd::Set {
            types,
            id,
            block_soft,
            block_hard,
            inode_soft,
            inode_hard,
            image,
        }) => {
            let t = one_type(types, "set")?;
            let lim = Dquot {
                bsoftlimit: block_limit(&block_soft)?,
                bhardlimit: block_limit(&block_hard)?,
                isoftlimit: inode_soft,
                ihardlimit: inode_hard,
                ..Default::default()
            };
            let img = image_arg(&image)?;
            let fs = open_img(&img, false)?;
            let r = fs
                .set_dquot_limits(t, id, &lim)
                .map(|_| ())
                .map_err(anyhow::Error::from)
                .with_context(|| format!("{} quota of id {id}", t.name()));
            finish(&fs, &img.path, r)
        }
        Some(QuotaCmd::Grace {
            types,
            block_grace,
            inode_grace,
            image,
        }) => {
            let t = one_type(types, "grace")?;
            let img = image_arg(&image)?;
            let fs = open_img(&img, false)?;
            let r = fs
                .set_quota_grace(t, block_grace, inode_grace)
                .map_err(anyhow::Error::from)
                .with_context(|| format!("{} quota grace times", t.name()));
            finish(&fs, &img.path, r)
        }
        None => {
            let Some(image) = a.image else {
                return Err(Usage(
                    "give an image (uext4 quota IMAGE, or uext4 quota set ...)".into(),
                )
                .into());
            };
            report(&image, a.types)
        }
    }
}

/// `uext4 quota [-ugP] IMAGE`: repquota's layout, one table per type the image keeps.
fn report(image: &std::path::Path, types: Types) -> Result<()> {
    let img = image_arg(image)?;
    let fs = open_img(&img, true)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut any = false;
    for t in types.chosen() {
        let Some(r) = fs.quota_report(t)? else {
            continue;
        };
        any = true;
        println!("*** Report for {} quotas on {}", t.name(), img.name());
        println!(
            "Block grace time: {}; Inode grace time: {}",
            period(r.info.bgrace as u64),
            period(r.info.igrace as u64)
        );
        println!("{:>38}{:>29}", "Block limits", "File limits");
        let head = match t {
            QuotaType::User => "User",
            QuotaType::Group => "Group",
            QuotaType::Project => "Project",
        };
        println!(
            "{head:<12}{:>10}{:>10}{:>10}{:>8}{:>9}{:>7}{:>7}{:>8}",
            "used", "soft", "hard", "grace", "used", "soft", "hard", "grace"
        );
        println!("{}", "-".repeat(81));
        for q in &r.entries {
            println!("{}", row(q, now).trim_end());
        }
        println!();
    }
    if !any {
        bail!(
            "{}: the image keeps no quotas (no quota feature, or none of these types)",
            image.display()
        );
    }
    Ok(())
}

/// One entry as repquota prints it: `#ID`, the over-limit marks, space in KiB, inodes.
fn row(q: &Dquot, now: u64) -> String {
    let over = |used: u64, soft: u64, hard: u64| {
        if (hard != 0 && used >= hard) || (soft != 0 && used > soft) {
            '+'
        } else {
            '-'
        }
    };
    let kib = |b: u64| b.div_ceil(1024);
    let grace = |t: u64| match t {
        0 => String::new(),
        t if t <= now => "none".into(),
        t => period(t - now),
    };
    format!(
        "{:<10}{}{}{:>10}{:>10}{:>10}{:>8}{:>9}{:>7}{:>7}{:>8}",
        format!("#{}", q.id),
        over(q.curspace, q.bsoftlimit, q.bhardlimit),
        over(q.curinodes, q.isoftlimit, q.ihardlimit),
        kib(q.curspace),
        kib(q.bsoftlimit),
        kib(q.bhardlimit),
        if q.bsoftlimit != 0 {
            grace(q.btime)
        } else {
            String::new()
        },
        q.curinodes,
        q.isoftlimit,
        q.ihardlimit,
        if q.isoftlimit != 0 {
            grace(q.itime)
        } else {
            String::new()
        },
    )
}

/// A time span as repquota writes grace times: "7days", "05:30".
fn period(secs: u64) -> String {
    if secs >= 24 * 3600 {
        format!("{}days", secs.div_ceil(24 * 3600))
    } else {
        format!("{:02}:{:02}", secs / 3600, (secs % 3600).div_ceil(60))
    }
}
