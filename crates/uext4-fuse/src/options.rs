//! Mount options: the `-o` list parsed, and what it asks of the engine.

use std::time::Duration;

/// Mount options, as `-o` gives them.
#[derive(Clone, Debug)]
pub struct Options {
    pub read_only: bool,
    /// Do not replay the journal: the image as it is on disk (implies `ro`, as fuse2fs's
    /// norecovery; the kernel's ext4 calls it noload).
    pub norecovery: bool,
    pub threads: usize,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// The kernel's write-back cache (FUSE_WRITEBACK_CACHE): `writeback_cache` on (with the
    /// reserve that keeps ENOSPC at write(2)), `nowriteback_cache` off, as by default.
    pub writeback_cache: Option<bool>,
    pub direct_io: bool,
    pub commit_secs: u64,
    pub errors: uext4::ErrorsBehaviour,
    pub dax: bool,
    /// Map an image on tmpfs as `dax` does (default; `nodax` turns it off, and `dax` off).
    pub map_tmpfs: bool,
    /// POSIX ACLs enforced by the kernel and inherited from default ACLs (FUSE_POSIX_ACL).
    pub acl: bool,
    /// Quota limits enforced, per type (user, group, project): `usrquota` (or `quota`),
    /// `grpquota`, `prjquota`, as the kernel's ext4 takes them; `noquota` none. Usage is kept
    /// on images with quota files either way.
    pub quota_limits: [bool; 3],
    /// The engine's buffered mode (delayed allocation): writes that allocate are cached and
    /// written back in large runs at fsync, every commit interval and at unmount.
    pub delalloc: bool,
    /// `prealloc=zeroed` (default) or `prealloc=unwritten`: see
    /// `uext4::MountOptions::prealloc_zeroed`.
    pub prealloc_zeroed: bool,
    /// fsync writes fast commits where the image has the fast_commit feature (default);
    /// `nofast_commit` turns them off (`uext4::MountOptions::fast_commit`).
    pub fast_commit: bool,
    /// nodev, nosuid, noexec (the generic mount flags, passed to the kernel). By default root's
    /// mounts allow device nodes and set-ID bits, and everyone's allow execution.
    pub nodev: bool,
    pub nosuid: bool,
    pub noexec: bool,
    /// fuse2fs's `fakeroot`: every caller acts as root on the image (no permission checks by
    /// the kernel or the server, chown and chmod allowed to all); implies nodev and nosuid.
    /// Whoever can reach the mount (everyone, with allow_other) can read and change every
    /// file in the image.
    pub fakeroot: bool,
    /// How requests reach the server: `-o transport=auto|uring|dev`.
    pub transport: TransportKind,
    /// When reads update atime: relatime (the default, as mount(8)), noatime, strictatime,
    /// and nodiratime. The server keeps atime: the kernel's FUSE leaves it to the server.
    pub atime: uext4::AtimePolicy,
    /// fscrypt master keys, from `key=FILE` (repeatable): raw key files' bytes (their
    /// `Debug` shows only their sizes).
    pub keys: Vec<uext4::EncryptionKey>,
    /// How long the kernel may keep a name (`entry_timeout=SECONDS`, as libfuse's) and an
    /// inode's attributes (`attr_timeout=SECONDS`) without asking again. The server is the
    /// image's only writer and tells the kernel of every change it did not make itself
    /// (docs/DESIGN.md, "Long timeouts"), so both default to a day, as virtiofsd's
    /// `cache=always`; under `delalloc` attributes default to a second, as background
    /// writeback changes a file's block count unasked.
    pub entry_timeout: Duration,
    pub attr_timeout: Option<Duration>,
    /// `noopen`: files are opened without an OPEN request (nor RELEASE at the last close),
    /// FUSE_NO_OPEN_SUPPORT. Only where OPEN decides nothing: on a read-only mount, or with
    /// `noatime` on an image without immutable, append-only or verity files (checked at
    /// mount; such flags are then refused); not with `writeback_cache` or `direct_io`.
    pub noopen: bool,
}

/// How requests reach the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportKind {
    /// FUSE over io_uring when the kernel offers it (kernel 6.14+ with the fuse module's
    /// `enable_uring` parameter on), reads of /dev/fuse otherwise.
    #[default]
    Auto,
    /// FUSE over io_uring or no mount: the mount fails when the kernel does not offer it.
    Uring,
    /// Reads and writes of /dev/fuse, one descriptor per loop thread.
    Dev,
}

impl Default for Options {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Options {
            read_only: false,
            norecovery: false,
            threads: cpus.max(2),
            allow_other: false,
            default_permissions: true,
            writeback_cache: None,
            direct_io: false,
            commit_secs: 5,
            errors: uext4::ErrorsBehaviour::RemountRo,
            dax: false,
            map_tmpfs: true,
            acl: true,
            quota_limits: [false; 3],
            delalloc: false,
            prealloc_zeroed: true,
            fast_commit: true,
            nodev: false,
            nosuid: false,
            noexec: false,
            fakeroot: false,
            transport: TransportKind::Auto,
            atime: uext4::AtimePolicy::RELATIME,
            keys: Vec::new(),
            entry_timeout: LONG_TIMEOUT,
            attr_timeout: None,
            noopen: false,
        }
    }
}

/// The default entry and attribute timeouts.
pub const LONG_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Every option name `-o` takes.
const KNOWN: &[&str] = &[
    "ro",
    "rw",
    "norecovery",
    "noload",
    "threads",
    "defaults",
    "async",
    "auto",
    "noauto",
    "nouser",
    "user",
    "users",
    "_netdev",
    "nofail",
    "noatime",
    "relatime",
    "nodiratime",
    "diratime",
    "norelatime",
    "lazytime",
    "atime",
    "strictatime",
    "sync",
    "dirsync",
    "nodev",
    "dev",
    "nosuid",
    "suid",
    "noexec",
    "exec",
    "allow_other",
    "default_permissions",
    "nodefault_permissions",
    "writeback_cache",
    "nowriteback_cache",
    "direct_io",
    "commit",
    "key",
    "dax",
    "nodax",
    "acl",
    "noacl",
    "delalloc",
    "prealloc",
    "fast_commit",
    "nofast_commit",
    "errors",
    "fakeroot",
    "transport",
    "entry_timeout",
    "attr_timeout",
    "noopen",
    "quota",
    "usrquota",
    "grpquota",
    "prjquota",
    "noquota",
];

impl Options {
    /// Parses a comma-separated option list; an unknown option is an error naming it.
    pub fn parse(list: &str) -> Result<Options, String> {
        let mut o = Options::default();
        for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let num = |v: Option<&str>| -> Result<u64, String> {
                v.ok_or_else(|| format!("option {k} needs a value ({k}=N)"))?
                    .parse::<u64>()
                    .map_err(|_| format!("option {k}: {:?} is not a number", v.unwrap_or("")))
            };
            if !KNOWN.contains(&k) {
                return Err(format!("unknown mount option {opt:?} (known: ro, rw, norecovery, threads=N, allow_other, default_permissions, writeback_cache, nowriteback_cache, direct_io, commit=SECONDS, key=FILE, errors=remount-ro|continue|panic, dax, nodax, acl, noacl, delalloc, prealloc=zeroed|unwritten, fakeroot, transport=auto|uring|dev, entry_timeout=SECONDS, attr_timeout=SECONDS, noopen, offset=BYTES, size=BYTES, partition=N, and the generic defaults, nodev, nosuid, noexec, noatime, relatime, strictatime, nodiratime)"));
            }
            let takes_value = matches!(
                k,
                "threads"
                    | "commit"
                    | "prealloc"
                    | "errors"
                    | "transport"
                    | "key"
                    | "entry_timeout"
                    | "attr_timeout"
            );
            if !takes_value && v.is_some() {
                return Err(format!("option {k} takes no value (write {k}, not {opt})"));
            }
            match k {
                "ro" => o.read_only = true,
                "rw" => o.read_only = false,
                "norecovery" | "noload" => o.norecovery = true,
                "threads" => match num(v)? {
                    n @ 1..=1024 => o.threads = n as usize,
                    _ => return Err("option threads= takes 1 to 1024".into()),
                },
                // fstab's generic options.
                "defaults" | "async" | "auto" | "noauto" | "nouser" | "user" | "users"
                | "_netdev" | "nofail" | "lazytime" => {}
                // The atime policy, as the kernel reads MS_NOATIME, MS_STRICTATIME and
                // MS_NODIRATIME: relatime unless one of the others is asked for.
                "noatime" => o.atime.mode = uext4::AtimeMode::NoAtime,
                "strictatime" => o.atime.mode = uext4::AtimeMode::Strict,
                "relatime" => o.atime.mode = uext4::AtimeMode::Relative,
                "atime" if o.atime.mode == uext4::AtimeMode::NoAtime => {
                    o.atime.mode = uext4::AtimeMode::Relative
                }
                "atime" | "norelatime" => {}
                "nodiratime" => o.atime.nodiratime = true,
                "diratime" => o.atime.nodiratime = false,
                "sync" | "dirsync" => {
                    return Err(format!(
                        "option {k}: writes are not synchronous; fsync makes them durable"
                    ))
                }
                "nodev" => o.nodev = true,
                "dev" => o.nodev = false,
                "nosuid" => o.nosuid = true,
                "suid" => o.nosuid = false,
                "noexec" => o.noexec = true,
                "exec" => o.noexec = false,
                "allow_other" => o.allow_other = true,
                "default_permissions" => o.default_permissions = true,
                "nodefault_permissions" => o.default_permissions = false,
                "writeback_cache" => o.writeback_cache = Some(true),
                "nowriteback_cache" => o.writeback_cache = Some(false),
                "direct_io" => o.direct_io = true,
                "commit" => o.commit_secs = num(v)?,
                "key" => {
                    let file = v
                        .filter(|f| !f.is_empty())
                        .ok_or("option key needs a file (key=FILE)")?;
                    let raw = std::fs::read(file)
                        .map_err(|e| format!("option key={file}: cannot read the key file: {e}"))?;
                    o.keys.push(uext4::EncryptionKey::new(raw));
                }
                "dax" => o.dax = true,
                "nodax" => {
                    o.dax = false;
                    o.map_tmpfs = false;
                }
                "acl" => o.acl = true,
                "noacl" => o.acl = false,
                "delalloc" => o.delalloc = true,
                "entry_timeout" => o.entry_timeout = seconds(k, v)?,
                "attr_timeout" => o.attr_timeout = Some(seconds(k, v)?),
                "noopen" => o.noopen = true,
                "quota" | "usrquota" => o.quota_limits[0] = true,
                "grpquota" => o.quota_limits[1] = true,
                "prjquota" => o.quota_limits[2] = true,
                "noquota" => o.quota_limits = [false; 3],
                "fast_commit" => o.fast_commit = true,
                "nofast_commit" => o.fast_commit = false,
                "fakeroot" => o.fakeroot = true,
                "prealloc" => {
                    o.prealloc_zeroed = match v {
                        Some("zeroed") => true,
                        Some("unwritten") => false,
                        _ => return Err("option prealloc= takes zeroed or unwritten".into()),
                    }
                }
                "transport" => {
                    o.transport = match v {
                        Some("auto") => TransportKind::Auto,
                        Some("uring") => TransportKind::Uring,
                        Some("dev") => TransportKind::Dev,
                        _ => return Err("option transport= takes auto, uring or dev".into()),
                    }
                }
                "errors" => {
                    o.errors = match v {
                        Some("remount-ro") => uext4::ErrorsBehaviour::RemountRo,
                        Some("continue") => uext4::ErrorsBehaviour::Continue,
                        Some("panic") => uext4::ErrorsBehaviour::Panic,
                        _ => {
                            return Err("option errors= takes remount-ro, continue or panic".into())
                        }
                    }
                }
                _ => return Err(format!("unknown mount option {opt:?}")),
            }
        }
        if o.norecovery && list.split(',').any(|x| x.trim() == "rw") {
            return Err(
                "option norecovery: without the journal the mount is read-only (drop rw)".into(),
            );
        }
        o.read_only |= o.norecovery;
        if o.noopen {
            o.check_noopen()?;
        }
        if o.fakeroot {
            // As fuse2fs: the server decides (everyone is root), and nothing in the image
            // can raise privileges on the host.
            o.default_permissions = false;
            // FUSE_POSIX_ACL makes the kernel check permissions (it turns default_permissions
            // on): ACLs are stored but not enforced, as with fuse2fs.
            o.acl = false;
            o.nodev = true;
            o.nosuid = true;
        }
        Ok(o)
    }

    /// `noopen` only where OPEN decides nothing the kernel can do without: see the field.
    fn check_noopen(&self) -> Result<(), String> {
        if !self.read_only && self.atime.mode != uext4::AtimeMode::NoAtime {
            return Err("option noopen: needs ro or noatime (reads that update atime must reach the server)".into());
        }
        if self.writeback_cache == Some(true) && !self.read_only {
            return Err("option noopen: not with writeback_cache (its opens for writing are how a nearly full image refuses cached writes)".into());
        }
        if self.direct_io {
            return Err(
                "option noopen: not with direct_io (only an OPEN reply can ask for uncached I/O)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The attribute timeout: as asked, or the default (a second under `delalloc`).
    pub fn attr_timeout(&self) -> Duration {
        self.attr_timeout.unwrap_or(if self.delalloc {
            Duration::from_secs(1)
        } else {
            LONG_TIMEOUT
        })
    }

    pub fn mount_options(&self) -> uext4::MountOptions {
        uext4::MountOptions {
            read_only: self.read_only,
            norecovery: self.norecovery,
            errors: self.errors,
            commit_interval_secs: self.commit_secs,
            dax: self.dax,
            map_tmpfs: self.map_tmpfs,
            buffered: self.delalloc,
            prealloc_zeroed: self.prealloc_zeroed,
            atime: self.atime,
            keys: self.keys.clone(),
            quota_limits: self.quota_limits,
            fast_commit: self.fast_commit,
            ..Default::default()
        }
    }
}

/// A timeout option's value: whole or fractional seconds, 0 to 10 years.
fn seconds(k: &str, v: Option<&str>) -> Result<Duration, String> {
    let v = v.ok_or_else(|| format!("option {k} needs a value ({k}=SECONDS)"))?;
    match v.parse::<f64>() {
        Ok(s) if (0.0..=315_360_000.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "option {k}: {v:?} is not a number of seconds from 0 to 315360000"
        )),
    }
}

#[cfg(test)]
mod tests;
