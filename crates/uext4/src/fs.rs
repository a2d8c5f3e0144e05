//! The filesystem façade: `Fs` composes the state subsystems (superblock state, geometry,
//! buffer cache, block allocator, inode cache, transactions, journal, buffered-mode registry)
//! and opens and mounts them. It imports state modules only; the operations are `impl Fs`
//! blocks in files this one does not import (tests/layers.rs keeps that so).
//!
//! `Fs` is `Send + Sync`: every public operation may be called from many threads at once. The
//! lock ranking, in the order the types nest, is written once: docs/ARCHITECTURE.md, "Locks".

use crate::bcache::BufferCache;
use crate::blockdev::{BlockDevice, Counted, IoCounters};
use crate::error::{Corruption, Error, Result};
use crate::format::features::*;
use crate::format::group_desc::GroupDesc;
use crate::format::inode::RawInode;
use crate::format::superblock::*;
use crate::geometry::Geometry;
use crate::icache::{InodeCache, InodeRef, InodeState};
use crate::mballoc::GroupState;
use crate::mballoc::{BlockAllocator, PendingFrees};
use crate::super_info::{superblock_location, SuperInfo};
use crate::transaction::{Handle, TxnManager};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Options for opening a filesystem, as mount options: `MountOptions::default()` opens
/// read-write, journaled, with data written through to the device; [`MountOptions::ro`]
/// opens read-only.
///
/// ```
/// use uext4::{ErrorsBehaviour, MountOptions};
///
/// let opts = MountOptions {
///     errors: ErrorsBehaviour::RemountRo,
///     commit_interval_secs: 5,
///     ..MountOptions::default()
/// };
/// assert!(!opts.read_only);
/// assert!(MountOptions::ro().read_only);
/// ```
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Nothing on the device is ever written. A journal that needs recovery is replayed into
    /// memory (`blockdev::OverlayDevice`): the filesystem is seen recovered while the image
    /// stays byte for byte as it was. Orphans are left for a read-write open.
    pub read_only: bool,
    /// Do not load or replay the journal: the filesystem as it is on the device, as the
    /// kernel's `noload` and fuse2fs's `norecovery` (which, as here, implies read-only).
    pub norecovery: bool,
    /// What to do on a corruption error.
    pub errors: ErrorsBehaviour,
    /// Seconds between background commits (0: only on fsync, size threshold and unmount).
    pub commit_interval_secs: u64,
    /// DAX: map the image into memory (`open_path` only): reads and writes are one memory copy.
    pub dax: bool,
    /// With `dax`, copy large writes with non-temporal stores instead of cached copies. On by
    /// default, chosen by measurement (BENCHMARKS.md, "DAX: cached copy or non-temporal
    /// stores"): overwrites leave the cache to the data that is read.
    pub dax_non_temporal: bool,
    /// Map an image that is a file on tmpfs, as `dax` does (`open_path`, read-write, not
    /// buffered). On tmpfs the page cache is the storage: pread/pwrite copy into the same
    /// pages a mapping reaches with one memory copy and no system call, and msync has nothing
    /// to write. On by default; `nodax` (mount) turns it off.
    pub map_tmpfs: bool,
    /// Buffered mode (not with `dax`): writes that allocate are cached and written back later
    /// in large runs (delayed allocation, see delalloc.rs); fsync writes back, then commits.
    pub buffered: bool,
    /// Buffered mode: cached data beyond which a write first writes back.
    pub buffered_limit_bytes: u64,
    /// Where the device zeroes for free (`BlockDevice::zeroes_cheaply`: an image on tmpfs,
    /// where a punched hole reads as zeros), fallocate zeroes the blocks it allocates inside
    /// the file's size and maps them written, not unwritten. Writes into them are then
    /// overwrites: no conversion, no journal handle, no commit for fdatasync (R4). Blocks
    /// past the size (KEEP_SIZE) stay unwritten, as e2fsck wants.
    /// On by default; `prealloc=unwritten` (mount) turns it off, giving the kernel's layout.
    pub prealloc_zeroed: bool,
    /// Reproducible builds (SOURCE_DATE_EPOCH): no time the filesystem records is later than
    /// this (seconds since the epoch; later ones are stored as it), and new inodes get
    /// generations from a sequence seeded by the hash seed instead of random ones, so the
    /// same operations on the same image give the same bytes.
    pub time_clamp: Option<i64>,
    /// In-memory inodes kept beyond those in use (about 1 KiB each); past it, inodes nothing
    /// needs are dropped and read back from the inode table when next used.
    pub inode_cache_limit: usize,
    /// Metadata blocks kept in memory, in bytes (a soft limit: blocks in use or not yet
    /// committed stay). A builder writing a tree it does not read back keeps it small.
    pub cache_limit_bytes: usize,
    /// Where on the device the filesystem lies, when not at its start: a partition of a
    /// whole-disk image ([`crate::partition::Table`] finds one by number) or an image at an
    /// offset inside a container file. `Fs::open_path` and `Fs::open_dev` then see only that
    /// window ([`crate::blockdev::RegionDevice`]): nothing outside it is read or written. An
    /// offset that is not a multiple of 512, past the end, or a window running past the end
    /// is refused (`Error::Invalid`). `None` (the default): the whole device.
    ///
    /// ```no_run
    /// use uext4::{blockdev::Region, Fs, MountOptions};
    /// let opts = MountOptions {
    ///     region: Some(Region { offset: 1 << 20, len: Some(64 << 20) }),
    ///     ..MountOptions::ro()
    /// };
    /// let fs = Fs::open_path("disk.img".as_ref(), opts)?;
    /// # Ok::<(), uext4::Error>(())
    /// ```
    pub region: Option<crate::blockdev::Region>,
    /// When reads and listings update atime (`atime.rs`). Default: never, so that tools
    /// reading an image change nothing in it; a mount asks for relatime, as mount(8) does.
    pub atime: AtimePolicy,
    /// fscrypt master keys (raw key files' bytes): files and directories whose policy names
    /// one of them (by v1 descriptor as the fscrypt and e4crypt tools compute it, or by v2
    /// identifier) are read and written in the clear; others show no-key names and refuse
    /// their contents with ENOKEY. Never printed (`Debug` shows only their count and sizes).
    pub keys: Vec<crate::crypto::EncryptionKey>,
    /// Which quota limits hold, per type in the kernel's order (user, group, project): the
    /// `usrquota`, `grpquota` and `prjquota` mount options. Usage is kept whatever this says,
    /// wherever the image has quota files; without the option for a type its limits are not
    /// enforced (no EDQUOT) and a project's limit is not what statfs reports for its
    /// directories, as the kernel's ext4 enables quota limits (ext4_enable_quotas). Default:
    /// none, as a mount without the options.
    pub quota_limits: [bool; 3],
    /// fsync writes fast commits where the image has the fast_commit feature and the change
    /// fits them (fast_commit/commit.rs), else a full commit. On by default, as the kernel
    /// (which has no option to turn them off); `nofast_commit` (mount) turns them off.
    pub fast_commit: bool,
}

/// When a read updates atime: the mount options noatime, relatime and strictatime, and
/// nodiratime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtimePolicy {
    /// Which accesses update atime.
    pub mode: AtimeMode,
    /// Listings never update a directory's atime.
    pub nodiratime: bool,
}

/// The atime mode: the kernel's MNT_NOATIME, MNT_RELATIME and MNT_STRICTATIME.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Never.
    #[default]
    NoAtime,
    /// When atime is not newer than mtime or ctime, or is a day old.
    Relative,
    /// On every access.
    Strict,
}

impl AtimePolicy {
    /// The kernel's default: relatime.
    pub const RELATIME: AtimePolicy = AtimePolicy {
        mode: AtimeMode::Relative,
        nodiratime: false,
    };
}

impl MountOptions {
    /// The defaults, read-only: nothing on the device is changed (a journal that needs
    /// recovery is replayed in memory; orphans are left for a read-write open).
    pub fn ro() -> MountOptions {
        MountOptions {
            read_only: true,
            ..Default::default()
        }
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            norecovery: false,
            errors: ErrorsBehaviour::RemountRo,
            commit_interval_secs: 5,
            dax: false,
            dax_non_temporal: true,
            map_tmpfs: true,
            buffered: false,
            buffered_limit_bytes: 128 << 20,
            prealloc_zeroed: true,
            inode_cache_limit: 1 << 17,
            cache_limit_bytes: 256 << 20,
            region: None,
            time_clamp: None,
            atime: AtimePolicy::default(),
            keys: Vec::new(),
            quota_limits: [false; 3],
            fast_commit: true,
        }
    }
}

/// What happens when the engine finds corruption (the `errors=` mount option).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorsBehaviour {
    /// Report the error and go on.
    Continue,
    /// Stop writing: the filesystem turns read-only.
    RemountRo,
    /// Panic (as the kernel panics).
    Panic,
}

/// Engine counters (besides the transaction's and the device's), shown by `uext4 stats`.
#[derive(Default, Debug)]
pub struct FsStats {
    /// Operations started.
    pub ops: AtomicU64,
    /// Writes into allocated blocks.
    pub overwrites: AtomicU64,
    /// Writes that allocated blocks.
    pub allocating_writes: AtomicU64,
    /// Bytes written by callers.
    pub user_bytes_written: AtomicU64,
    /// Bytes read by callers.
    pub user_bytes_read: AtomicU64,
    /// Bytes zeroed on the device (new blocks not fully written, holes made real).
    pub zeroed_bytes: AtomicU64,
}

/// An open ext2/3/4 filesystem: every operation, addressed by inode number as the VFS and
/// FUSE address them.
///
/// Open one with [`Fs::open_path`] (an image file, block device or NBD URI) or
/// [`Fs::open_dev`] (any [`BlockDevice`]); it comes as an `Arc<Fs>`, to share between
/// threads: every operation takes `&self` and locks what it changes. Operations that change
/// metadata are journaled: each joins the running transaction, which commits every
/// [`MountOptions::commit_interval_secs`], on [`Fs::commit`], [`Fs::sync`] and an fsync.
///
/// # Closing
/// Call [`Fs::unmount`] before dropping the last reference to a read-write filesystem: it
/// writes everything back, checkpoints the journal and marks the image clean. Dropping it
/// without `unmount` is a crash as far as the image is concerned, and the engine's tests
/// rely on that to simulate one: what was committed is in the journal and replays at the
/// next open, and what was not (the running transaction, and in buffered mode data not
/// yet written back) is lost. The drop logs a warning saying so (`tracing`), unless the
/// filesystem is read-only or has stopped after an error; [`Fs::crash`] drops one quietly.
pub struct Fs {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) io: Arc<IoCounters>,
    pub(crate) bcache: BufferCache,
    /// The filesystem's shape, read from the superblock at open.
    pub geo: Geometry,
    /// The superblock, free counters, read-only and stop flags (super_info.rs).
    pub(crate) sb: Arc<SuperInfo>,
    /// The block allocator's state: groups and their locks, table locations, the system
    /// zone, pending frees, the directory rotor (mballoc.rs).
    pub(crate) balloc: BlockAllocator,
    pub(crate) icache: InodeCache,
    pub(crate) txn: TxnManager,
    /// The journal was replayed into memory over the device (a read-only open of an image
    /// that needed recovery): `dev` is an `OverlayDevice`.
    replayed_in_memory: bool,
    pub(crate) opts: MountOptions,
    /// Serialises renames that move an entry between directories (rank 1).
    pub(crate) rename_lock: Mutex<()>,
    /// Operation counters.
    pub stats: FsStats,
    /// Reproducible builds: how many generations `next_generation` has handed out.
    pub(crate) generations: AtomicU64,
    /// The orphan list in chain order, head first (see orphan.rs). A leaf lock.
    pub(crate) orphans: Mutex<Vec<u32>>,
    /// Unlinked inodes too large to free in the handle that dropped their last link: on the
    /// orphan list, freed in pieces once that handle is done (orphan.rs). A leaf lock.
    pub(crate) deferred_deletes: Mutex<Vec<u32>>,
    /// Held around each piece handle of a large removal (rank: after the file's io_lock,
    /// before the barrier): one such handle at a time, so that concurrent removals, each
    /// bounded, cannot together outgrow the log.
    pub(crate) removal_lock: Mutex<()>,
    /// Inode numbers a front end still refers to (FUSE lookups the kernel has not forgotten):
    /// not reused for new inodes even when freed, so a stale kernel inode never aliases a new
    /// file. A leaf lock.
    pub(crate) pinned: Mutex<std::collections::HashSet<u32>>,
    /// The jbd2 journal (inode 8), when the filesystem has one and it is opened read-write.
    /// It writes committed transactions home itself (its checkpointer).
    pub(crate) journal: std::sync::OnceLock<Arc<crate::journal::Journal>>,
    /// Buffered mode's dirty inodes and their memory and space (delalloc.rs).
    pub(crate) delalloc: crate::delalloc_state::Registry<InodeRef>,
    /// A read-write `open_path`'s claim on its image (holder.rs), released at unmount (after
    /// which nothing is written) or when the `Fs` is dropped.
    pub(crate) claim: Mutex<Option<crate::holder::WriterClaim>>,
    /// This node's hold on the multi-mount protection block (read-write opens of `mmp`
    /// filesystems; mmp.rs): released at unmount. A leaf lock.
    pub(crate) mmp: Mutex<Option<crate::mmp::Mmp>>,
    /// Set once the open has succeeded (an `Fs` dropped inside the open, to reopen after a
    /// replay or on an error, is no unmount forgotten), cleared by [`Fs::crash`]: a drop
    /// without unmount warns only while it is set.
    warn_on_drop: std::sync::atomic::AtomicBool,
    /// The master keys given at mount (encrypt.rs).
    pub(crate) keyring: crate::crypto::Keyring,
    /// The filesystem has the `encrypt` feature: data paths look for encrypted inodes.
    pub(crate) crypt_enabled: bool,
    /// Serialises writes and truncates of encrypted files (read-modify-write of whole
    /// blocks; encrypt.rs).
    pub(crate) crypt_write_lock: Mutex<()>,
}

/// What the open after a journal replay carries over from the one that replayed.
#[derive(Default)]
pub(crate) struct Reopen {
    /// Replayed into an `OverlayDevice` (a read-only open), with the first open's read-only
    /// reason.
    pub(crate) in_memory: Option<Option<String>>,
    /// The MMP block, already held (a read-write open).
    pub(crate) mmp: Option<crate::mmp::Mmp>,
    /// Fast commits to replay once open (recovery.rs).
    pub(crate) fast_commits: Option<FcPending>,
}

/// Fast commits found by a recovery, to replay once the filesystem is open (recovery.rs).
pub(crate) struct FcPending {
    pub(crate) fc: crate::format::fast_commit::FastCommits,
    /// A read-only open replays them in memory on a writable open of its overlay, then opens
    /// the overlay again with these options and read-only reason.
    pub(crate) then_read_only: Option<(MountOptions, Option<String>)>,
}

/// Reads and validates the superblock of a device.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Err(Error::NotExt4(format!(
            "device is only {} bytes, too small to hold a superblock",
            dev.size()
        )));
    }
    let mut buf = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut buf)?;
    let sb = Superblock::from_bytes(&buf);
    if sb.magic() != EXT4_MAGIC {
        return Err(Error::NotExt4(format!(
            "bad superblock magic {:#06x} (expected 0xef53)",
            sb.magic()
        )));
    }
    if sb.has_metadata_csum() && sb.checksum_type() != CRC32C_CHKSUM {
        return Err(Error::corrupt(
            Corruption::Superblock,
            format!("superblock: unknown checksum type {}", sb.checksum_type()),
        ));
    }
    if !sb.verify_csum() {
        return Err(Error::bad_checksum(
            Corruption::Superblock,
            format!(
                "superblock checksum {:#010x} does not match computed {:#010x}",
                sb.checksum(),
                sb.csum()
            ),
        ));
    }
    Ok(sb)
}

/// Checks feature flags: an unknown incompat flag refuses, an unknown ro_compat flag forces
/// read-only (returned as the reason).
pub fn check_features(sb: &Superblock) -> Result<Option<String>> {
    let unknown_incompat = sb.feature_incompat() & !INCOMPAT_SUPPORTED;
    if unknown_incompat != 0 {
        return Err(Error::UnsupportedIncompat(
            names(unknown_incompat, INCOMPAT_NAMES).join(", "),
        ));
    }
    let (enc, enc_flags) = (sb.encoding(), sb.encoding_flags());
    if sb.has_incompat(INCOMPAT_CASEFOLD)
        && (enc != ENCODING_UTF8_12_1 || enc_flags & !ENCODING_FLAG_STRICT != 0)
    {
        // As the kernel's ext4_sb_read_encoding: one encoding is defined, and one flag.
        return Err(Error::Unsupported(format!(
            "casefold with filename encoding {enc}, flags {enc_flags:#x} (defined: utf8-12.1, 1; strict, 0x1)"
        )));
    }
    if sb.has_compat(COMPAT_HAS_JOURNAL) && sb.journal_inum() == 0 {
        return Err(Error::Unsupported(
            "external journal device (journal_dev set, no journal inode); only internal journals are supported".into(),
        ));
    }
    let unknown_ro = sb.feature_ro_compat() & !RO_COMPAT_SUPPORTED;
    if unknown_ro != 0 {
        return Ok(Some(crate::bigalloc::read_only_reason(unknown_ro)));
    }
    Ok(None)
}

/// Why an open is read-only (an unsupported ro_compat feature, a read-only device, a replay
/// kept in memory), setting `opts.read_only` where it must be.
fn read_only_reason(
    sb: &Superblock,
    dev: &dyn BlockDevice,
    opts: &mut MountOptions,
    in_memory: &Option<Option<String>>,
) -> Result<Option<String>> {
    let mut ro_reason = check_features(sb)?;
    if ro_reason.is_none() && dev.read_only() && !opts.read_only {
        ro_reason = Some("the image or device is not writable".into());
    }
    if let Some(Some(r)) = in_memory {
        ro_reason.get_or_insert_with(|| r.clone());
    }
    if ro_reason.is_some() || dev.read_only() || opts.norecovery {
        opts.read_only = true;
    }
    Ok(ro_reason)
}

/// The mount's master keys as a keyring; a key of a bad size is named by its place.
fn keyring_of(opts: &MountOptions) -> Result<crate::crypto::Keyring> {
    crate::crypto::Keyring::of(&opts.keys)
        .map_err(|(i, e)| Error::Invalid(format!("encryption key {i} of {}: {e}", opts.keys.len())))
}

impl Fs {
    /// Opens the filesystem on `dev`: checks the superblock, features and group descriptors.
    /// (`Fs::open_path` opens a file or block device by path; `fs.open(ino)` opens a file.)
    ///
    /// ```
    /// use std::sync::Arc;
    /// use uext4::blockdev::MemDevice;
    /// use uext4::mkfs::{mkfs, MkfsOptions};
    ///
    /// // A filesystem in memory.
    /// let dev = Arc::new(MemDevice::new(8 << 20));
    /// mkfs(&*dev, &MkfsOptions::like_mke2fs(8 << 20, None))?;
    /// let fs = uext4::Fs::open_dev(dev, uext4::MountOptions::default())?;
    /// fs.mkdir(uext4::ROOT_INO, b"dir", 0o755, 0, 0)?;
    /// fs.unmount()?;
    /// # Ok::<(), uext4::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NotExt4`] for a device that holds no ext2/3/4 filesystem,
    /// [`Error::UnsupportedIncompat`] for a feature it does not implement (an unsupported
    /// read-only compatible feature opens read-only instead), [`Error::MmpBusy`] when
    /// another node holds it, and corruption and I/O errors.
    pub fn open_dev(dev: Arc<dyn BlockDevice>, opts: MountOptions) -> Result<Arc<Fs>> {
        let dev: Arc<dyn BlockDevice> = match opts.region {
            Some(r) => Arc::new(crate::blockdev::RegionDevice::new(dev, r)?),
            None => dev,
        };
        Fs::open_dev_again(dev, opts, Reopen::default())
    }

    /// `open_dev` once the device is the filesystem's own (its region), and the open again
    /// after a journal replay (`reopen`).
    pub(crate) fn open_dev_again(
        dev: Arc<dyn BlockDevice>,
        mut opts: MountOptions,
        reopen: Reopen,
    ) -> Result<Arc<Fs>> {
        let Reopen {
            in_memory,
            mmp,
            fast_commits,
        } = reopen;
        let sb = read_superblock(&*dev)?;
        let ro_reason = read_only_reason(&sb, &*dev, &mut opts, &in_memory)?;
        // Multi-mount protection before anything is written (journal recovery included).
        let mmp = match mmp {
            Some(m) => Some(m),
            None => crate::mmp::protect(&dev, &sb, opts.read_only)?,
        };
        let geo = Geometry::from_superblock(&sb, dev.size())?;
        let io = Arc::new(IoCounters::default());
        let counted: Arc<dyn BlockDevice> = Arc::new(Counted {
            inner: dev.clone(),
            io: io.clone(),
        });
        let (bs, blocks) = (geo.block_size as usize, geo.blocks_count);
        let bcache = BufferCache::new(counted.clone(), bs, blocks, opts.cache_limit_bytes);
        let (balloc, free_blocks, free_inodes) = BlockAllocator::load(&geo, &bcache)?;

        let max_txn = 4096usize;
        let keyring = keyring_of(&opts)?;
        let crypt_enabled = geo.encrypt;
        let fs = Arc::new(Fs {
            dev: counted,
            io,
            bcache,
            geo,
            sb: Arc::new(SuperInfo::new(
                sb,
                free_blocks,
                free_inodes,
                opts.read_only,
                ro_reason,
            )),
            balloc,
            icache: InodeCache::new(opts.inode_cache_limit),
            txn: TxnManager::new(1, max_txn),
            replayed_in_memory: in_memory.is_some(),
            opts,
            rename_lock: Mutex::new(()),
            stats: FsStats::default(),
            generations: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            deferred_deletes: Mutex::new(Vec::new()),
            removal_lock: Mutex::new(()),
            pinned: Mutex::new(std::collections::HashSet::new()),
            journal: std::sync::OnceLock::new(),
            delalloc: Default::default(),
            claim: Mutex::new(None),
            mmp: Mutex::new(mmp),
            warn_on_drop: Default::default(),
            keyring,
            crypt_enabled,
            crypt_write_lock: Mutex::new(()),
        });
        if let Some(m) = &*fs.mmp.lock() {
            let weak = Arc::downgrade(&fs);
            m.start(Box::new(move |why| {
                if let Some(fs) = weak.upgrade() {
                    fs.mmp_taken_over(why);
                }
            }))?;
        }
        if fs.opts.norecovery {
            // The image as it is on the device, journal or not (read-only: see above).
            if fs.superblock().has_incompat(INCOMPAT_RECOVER) {
                tracing::warn!(
                    "norecovery: the journal is not replayed; what it holds is not seen"
                );
            }
            fs.check_root()?;
        } else if fs.superblock().has_compat(COMPAT_HAS_JOURNAL) {
            let needs = fs.superblock().has_incompat(INCOMPAT_RECOVER);
            let journal = fs.load_journal()?;
            if needs || journal.needs_recovery() {
                return Fs::recover_and_reopen(fs, dev, journal, in_memory);
            }
            // Before anything is written (the journal's features below): a refused open leaves
            // the image as it was.
            fs.check_root()?;
            if !fs.is_read_only() {
                // As the kernel at mount: checksum v3 tags with metadata_csum, 64-bit with 64bit.
                let mut journal = journal;
                let sb = fs.superblock();
                journal.set_features(sb.has_metadata_csum(), sb.is_64bit())?;
                if sb.has_compat(COMPAT_FAST_COMMIT) {
                    journal.enable_fast_commit()?;
                }
                journal.set_time_clamp(fs.opts.time_clamp);
                fs.txn
                    .max_blocks
                    .store(journal.max_transaction_blocks(), Ordering::Relaxed);
                let journal = Arc::new(journal);
                journal.start_checkpointer(Box::new(FsCheckpointHooks {
                    sb: fs.sb.clone(),
                    pending_free: fs.balloc.pending_free.clone(),
                }))?;
                let _ = fs.journal.set(journal);
                if fs.fc_enabled() {
                    fs.txn.start_fc_tracking();
                }
            }
        } else {
            fs.check_root()?;
        }
        if !fs.is_read_only() {
            fs.mark_mounted()?;
            let n = fs.process_orphans()?;
            if n > 0 {
                tracing::info!("freed {n} orphaned inodes left by a crash");
            }
            if fs.opts.commit_interval_secs > 0 {
                spawn_committer(Arc::downgrade(&fs), fs.opts.commit_interval_secs)?;
            }
        }
        fs.warn_on_drop.store(true, Ordering::Release);
        match fast_commits {
            Some(fc) => Fs::finish_fast_commits(fs, dev, fc),
            None => Ok(fs),
        }
    }

    /// Refuses a filesystem whose root inode is unusable, as the kernel's mount does ("get
    /// root inode failed", "corrupt root inode, run e2fsck"): with the root deleted the whole
    /// tree looked empty without a word, and with the root a file the mount point gave EIO.
    fn check_root(&self) -> Result<()> {
        let bad = |why: &str| {
            Error::corrupt(
                Corruption::Inode,
                format!(
                    "the root directory (inode {}) {why}; run e2fsck -f",
                    crate::format::inode::ROOT_INO
                ),
            )
        };
        let root = match self.iget(crate::format::inode::ROOT_INO) {
            Ok(r) => r,
            Err(Error::NotFound) => return Err(bad("is not in use")),
            Err(e) => return Err(e),
        };
        let st = root.state.lock();
        if st.raw.links_count() == 0 {
            return Err(bad("has no links (it was deleted)"));
        }
        if !st.raw.is_dir() {
            return Err(bad("is not a directory"));
        }
        if st.raw.size() == 0 {
            return Err(bad("is empty (no '.' and '..')"));
        }
        Ok(())
    }

    /// Opens an image file or block device by path. A read-write open first claims the image
    /// (holder.rs): it is refused, naming the holder, while another program writes it.
    ///
    /// A path written as an NBD URI (`nbd://host[:port]/export`,
    /// `nbd+unix:///export?socket=PATH`: [`NbdDevice`](crate::NbdDevice)) opens that
    /// export of an NBD server
    /// instead. Nothing local is claimed for it: the server decides who may write (it may
    /// export read-only, which opens read-only).
    ///
    /// ```no_run
    /// let fs = uext4::Fs::open_path("disk.img".as_ref(), uext4::MountOptions::ro())?;
    /// println!("{} free blocks", fs.statfs().blocks_free);
    /// # Ok::<(), uext4::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Fs::open_dev`], and [`Error::InUse`] while another program writes the image.
    pub fn open_path(path: &std::path::Path, opts: MountOptions) -> Result<Arc<Fs>> {
        let mut opts = opts;
        opts.read_only |= opts.norecovery;
        if crate::image::is_nbd_uri(path) {
            return Fs::open_dev(crate::image::open_image(path, opts.read_only)?, opts);
        }
        let claim = if opts.read_only {
            None
        } else {
            Some(crate::holder::claim_for_writing(path)?)
        };
        let fs = Fs::open_path_unclaimed(path, opts)?;
        if let Some(c) = claim.filter(|_| !fs.is_read_only()) {
            *fs.claim.lock() = Some(c);
        }
        Ok(fs)
    }

    fn open_path_unclaimed(path: &std::path::Path, opts: MountOptions) -> Result<Arc<Fs>> {
        let how = crate::image::Access {
            read_only: opts.read_only,
            dax: opts.dax,
            non_temporal: opts.dax_non_temporal,
            map_tmpfs: opts.map_tmpfs && !opts.buffered,
        };
        Fs::open_dev(crate::image::open_local(path, how)?, opts)
    }

    /// Whether the device is the mapped image (`dax`, or an image on tmpfs).
    pub fn is_mapped(&self) -> bool {
        self.dev.is_mapped()
    }

    /// Whether the filesystem refuses writes (opened read-only, or turned read-only after an
    /// error).
    pub fn is_read_only(&self) -> bool {
        self.sb.is_read_only()
    }

    /// Whether the journal needed recovery and, the open being read-only, was replayed into
    /// memory: what is seen is the recovered filesystem; the device is unchanged.
    pub fn journal_replayed_in_memory(&self) -> bool {
        self.replayed_in_memory
    }

    /// Why the filesystem was opened read-only, if it was forced.
    pub fn read_only_reason(&self) -> Option<&str> {
        self.sb.read_only_reason()
    }

    /// The time to record now: the clock, or `MountOptions::time_clamp` if that is earlier.
    pub(crate) fn now(&self) -> crate::format::inode::Timestamp {
        crate::format::inode::Timestamp::now().at_most(self.opts.time_clamp)
    }

    /// A copy of the in-memory superblock, counters brought up to date.
    pub fn superblock(&self) -> Superblock {
        self.sb.lock().clone()
    }

    /// Drops this reference as a crash would leave the image, without the warning a drop
    /// without [`Fs::unmount`] logs (see [`Fs`]'s "Closing"): for tests and tools that
    /// simulate a crash. When it is the last reference, the running transaction is lost and
    /// the committed ones replay at the next open.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use uext4::{blockdev::MemDevice, mkfs, Fs, MountOptions, ROOT_INO};
    ///
    /// let dev = Arc::new(MemDevice::new(8 << 20));
    /// mkfs::mkfs(&*dev, &mkfs::MkfsOptions::like_mke2fs(8 << 20, None))?;
    /// let fs = Fs::open_dev(dev.clone(), MountOptions::default())?;
    /// fs.mkdir(ROOT_INO, b"kept", 0o755, 0, 0)?;
    /// fs.commit()?;
    /// fs.crash();
    /// // The next open replays the journal: the committed directory is there.
    /// let fs = Fs::open_dev(dev, MountOptions::default())?;
    /// assert!(fs.lookup(ROOT_INO, b"kept").is_ok());
    /// fs.unmount()?;
    /// # Ok::<(), uext4::Error>(())
    /// ```
    pub fn crash(self: Arc<Self>) {
        self.warn_on_drop.store(false, Ordering::Release);
    }

    /// Why the filesystem stopped writing, if it did.
    pub fn stop_reason(&self) -> Option<String> {
        self.sb.stop_reason()
    }

    /// The device's I/O counters.
    pub fn io_counters(&self) -> &IoCounters {
        &self.io
    }

    /// The transaction counters.
    pub fn txn_stats(&self) -> &crate::transaction::TxnStats {
        &self.txn.stats
    }

    /// Stops the filesystem writing (the first reason is kept): later changes fail with
    /// `Error::Stopped`, and unmount leaves the superblock marked not clean.
    pub(crate) fn stop(&self, why: &str) {
        self.sb.stop(why);
    }

    /// Fails if the filesystem may not be written.
    #[inline]
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.sb.check_writable()
    }

    /// Starts a handle for a metadata change of at most `credits` blocks, committing first if
    /// the running transaction is full.
    pub(crate) fn start(&self, credits: usize) -> Result<Handle<'_>> {
        self.check_writable()?;
        if self.txn.wants_commit() {
            self.commit()?;
        }
        Ok(self.txn.start(credits))
    }

    /// Starts a handle for a change of up to `credits` blocks in a transaction that has room
    /// for them below its commit threshold (committing the running one first if not): for
    /// the large pieces of a removal.
    pub(crate) fn start_with_room(&self, credits: usize) -> Result<Handle<'_>> {
        self.check_writable()?;
        if self.txn.running_len() + credits > self.txn.max_blocks.load(Ordering::Relaxed) {
            self.commit()?;
        }
        Ok(self.txn.start(credits))
    }

    /// Marks the superblock as mounted (state not clean) and writes it.
    fn mark_mounted(&self) -> Result<()> {
        let now = self.now().sec as u32;
        let journaled = self.journal.get().is_some();
        let bytes = self.sb.encode(false, |sb| {
            sb.set_mtime(now);
            let v = sb.mnt_count().wrapping_add(1);
            sb.set_mnt_count(v);
            let v = sb.state() & !STATE_VALID;
            sb.set_state(v);
            if journaled {
                // As the kernel: needs_recovery is set while the journal is in use.
                let f = sb.feature_incompat() | INCOMPAT_RECOVER;
                sb.set_feature_incompat(f);
            }
        });
        self.dev.write_at(SUPERBLOCK_OFFSET, &bytes)?;
        self.dev.flush()?;
        Ok(())
    }

    /// Records a corruption in the superblock error fields, as the kernel does, and stops
    /// further writes (per the errors= behaviour). Returns the error for `?`.
    pub(crate) fn fail(&self, err: Error, ino: u32, blk: u64, func: &str) -> Error {
        if !err.is_corruption() {
            return err;
        }
        tracing::error!(ino, blk, func, "{err}");
        if self.opts.errors == ErrorsBehaviour::Panic {
            panic!("uext4: {err} (errors=panic)");
        }
        if self.dev.read_only() || self.is_read_only() {
            return err;
        }
        // s_*_error_errcode holds the kernel's EXT4_ERR_* numbers, not errno values.
        const EXT4_ERR_EFSBADCRC: u8 = 4;
        const EXT4_ERR_EFSCORRUPTED: u8 = 5;
        let code = match err {
            Error::BadChecksum { .. } => EXT4_ERR_EFSBADCRC,
            _ => EXT4_ERR_EFSCORRUPTED,
        };
        {
            let now = self.now().sec as u32;
            let bytes = self.sb.encode(false, |sb| {
                let v = sb.state() | STATE_ERROR;
                sb.set_state(v);
                let v = sb.error_count().wrapping_add(1);
                sb.set_error_count(v);
                if sb.first_error_time() == 0 {
                    sb.set_first_error_time(now);
                    sb.set_first_error_ino(ino);
                    sb.set_first_error_block(blk);
                    sb.set_error_func(true, func);
                    sb.set_first_error_errcode(code);
                }
                sb.set_last_error_time(now);
                sb.set_last_error_ino(ino);
                sb.set_last_error_block(blk);
                sb.set_error_func(false, func);
                sb.set_last_error_errcode(code);
            });
            let _ = self.dev.write_at(SUPERBLOCK_OFFSET, &bytes);
            let _ = self.dev.flush();
        }
        if self.opts.errors == ErrorsBehaviour::RemountRo {
            self.stop(&err.to_string());
        }
        err
    }

    /// Writes the descriptor of group `g` (already changed in `state`) into its GDT block.
    pub(crate) fn write_group_desc(
        &self,
        h: &mut Handle<'_>,
        g: u32,
        state: &mut GroupState,
    ) -> Result<()> {
        state.desc.set_csum(self.geo.gd_csum, g);
        let blk = self.geo.gdt_block_of(g);
        let buf = self.bcache.get(blk)?;
        {
            let mut data = buf.write();
            let off = (g % self.geo.descs_per_block) as usize * self.geo.desc_size as usize;
            let bytes = state.desc.as_bytes();
            data[off..off + bytes.len()].copy_from_slice(bytes);
        }
        h.dirty(&buf);
        Ok(())
    }

    /// Total and free counts, for statfs.
    pub fn statfs(&self) -> StatFs {
        let overhead = self.overhead_blocks();
        let sb = self.sb.lock();
        StatFs {
            block_size: self.geo.block_size,
            blocks: self.geo.blocks_count - overhead,
            blocks_free: self.free_blocks_unreserved(),
            blocks_avail: self
                .free_blocks_unreserved()
                .saturating_sub(sb.r_blocks_count()),
            files: self.geo.inodes_count as u64,
            files_free: self.sb.free_inodes.load(Ordering::Relaxed),
            name_max: 255,
        }
    }

    /// Free blocks less those that buffered data not yet written back holds (its data and
    /// the mapping blocks its writeback may need) and the kernel's write-cache reserve.
    fn free_blocks_unreserved(&self) -> u64 {
        self.sb
            .free_blocks
            .load(Ordering::Relaxed)
            .saturating_sub(self.delalloc_held_blocks() + self.cache_reserve())
    }

    /// Blocks used by the filesystem's own fixed metadata (superblocks, GDT, bitmaps, inode
    /// tables), as the kernel subtracts them in statfs.
    fn overhead_blocks(&self) -> u64 {
        let recorded =
            crate::bigalloc::recorded_overhead_blocks(&self.sb.lock(), self.geo.cluster_bits);
        let g = &self.geo;
        if let Some(o) = recorded {
            return o;
        }
        let itb = (g.inodes_per_group as u64 * g.inode_size as u64).div_ceil(g.block_size as u64);
        let mut o = g.first_data_block;
        for grp in 0..g.group_count {
            o += g.group_overhead(grp) as u64 + 2 + itb;
        }
        o
    }

    /// Writes the superblock (with current free counts) through a handle.
    pub(crate) fn write_superblock_to_buffer(&self, h: &mut Handle<'_>) -> Result<()> {
        let buf = self.superblock_to_buffer(|_| {})?;
        h.dirty(&buf);
        Ok(())
    }

    /// Encodes the superblock (with current free counts, after `edit`) into its buffer.
    pub(crate) fn superblock_to_buffer(
        &self,
        edit: impl FnOnce(&mut Superblock),
    ) -> Result<Arc<crate::bcache::Buffer>> {
        let bytes = self.sb.encode(true, edit);
        let (blk, off) = superblock_location(self.geo.block_size);
        let buf = self.bcache.get(blk)?;
        buf.write()[off..off + SUPERBLOCK_SIZE].copy_from_slice(&bytes);
        Ok(buf)
    }

    /// How many inodes are in memory (bounded by `MountOptions::inode_cache_limit` plus those
    /// in use).
    pub fn cached_inodes(&self) -> usize {
        self.icache.len()
    }

    /// Keeps (or stops keeping) an inode number from being reused while a front end refers
    /// to it. A pinned inode that loses its last link stays alive (on the orphan list, its
    /// attributes readable, link count 0) until it is unpinned and [`Fs::forgotten`], as an
    /// open one does until its release: the FUSE kernel may still ask for it (the working
    /// directory of a process, removed by another).
    pub fn pin_ino(&self, ino: u32, pinned: bool) {
        let mut p = self.pinned.lock();
        if pinned {
            p.insert(ino);
        } else {
            p.remove(&ino);
        }
    }

    /// Reads group `g`'s descriptor (a copy).
    pub fn group_desc(&self, g: u32) -> GroupDesc {
        self.balloc.groups[g as usize].lock().desc.clone()
    }

    /// Whether a block number is inside the filesystem and outside the fixed metadata of group 0's
    /// superblock area: used to validate pointers read from disk. `kind` names the structure
    /// that holds the pointer, which a bad one shows damaged.
    pub(crate) fn check_block(
        &self,
        kind: Corruption,
        blk: u64,
        len: u64,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        self.check_file_block(kind, 0, blk, len, what)
    }

    /// As `check_block`, for blocks that inode `ino` maps: the journal inode's own blocks are
    /// in the system zone, and it alone may map them.
    pub(crate) fn check_file_block(
        &self,
        kind: Corruption,
        ino: u32,
        blk: u64,
        len: u64,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        if blk < self.geo.first_data_block + 1
            || blk
                .checked_add(len)
                .is_none_or(|e| e > self.geo.blocks_count)
        {
            return Err(Error::corrupt(
                kind,
                format!("{}: block {blk} (+{len}) is outside the filesystem", what()),
            ));
        }
        let zone = self.balloc.system_zone.read().overlap(blk, blk + len);
        if let Some((s, e)) = zone.filter(|_| ino == 0 || ino != self.sb.lock().journal_inum()) {
            return Err(Error::corrupt(
                kind,
                format!(
                    "{}: block {blk} (+{len}) lies in the filesystem's own structures (blocks \
                     {s}..{e}: superblock, descriptors, bitmaps, inode tables or journal)",
                    what()
                ),
            ));
        }
        Ok(())
    }

    /// Another node took the MMP block: stop as after a lost transaction, so that nothing more
    /// of this node's reaches the device (the journal's contents stay for recovery).
    fn mmp_taken_over(&self, why: &str) {
        let _ = self.txn.lost.set(why.to_string());
        self.stop(why);
        if let Some(j) = self.journal.get() {
            j.abort(why);
        }
    }

    /// The MMP block in words, as read now (`uext4 info`): `None` without the `mmp` feature.
    pub fn mmp_info(&self) -> Option<String> {
        crate::mmp::describe(&self.dev, &self.superblock())
    }

    pub(crate) fn new_raw_inode(&self) -> RawInode {
        RawInode::new(self.geo.inode_size as usize)
    }
}

impl Fs {
    /// Opens the journal of inode s_journal_inum through its extent map.
    fn load_journal(&self) -> Result<crate::journal::Journal> {
        let ino = self.sb.lock().journal_inum();
        // Straight from the inode table: bitmaps may be torn until the journal is replayed.
        let raw = self.read_raw_inode(ino)?;
        let mut st = InodeState {
            raw,
            extents: None,
            orphaned: false,
            deleted: false,
            dying: false,
            creating: false,
            delalloc: None,
            no_capability: false,
            crypt: None,
            verity: None,
            may_inline: false,
        };
        self.ext_load(ino, &mut st).map_err(|e| {
            Error::corrupt(Corruption::Journal, format!("journal inode {ino}: {e}"))
        })?;
        let extents: Vec<_> = st
            .extents
            .as_ref()
            .map(|c| c.map.values().copied().collect())
            .unwrap_or_default();
        let map = crate::journal::JournalMap(
            extents
                .iter()
                .filter(|e| !e.unwritten)
                .map(|e| (e.lblk, e.pblk, e.len))
                .collect(),
        );
        // The journal's blocks belong to the filesystem from now on (a block-mapped
        // journal's indirect blocks are not added: its map is read once, here).
        self.balloc.system_zone.write().add(
            extents
                .iter()
                .map(|e| (e.pblk, e.pblk + e.len as u64))
                .collect(),
        );
        crate::journal::Journal::open(self.dev.clone(), self.geo.block_size, map)
    }
}

/// What the journal's checkpointer tells the filesystem: the state it touches, shared.
pub(crate) struct FsCheckpointHooks {
    pub(crate) sb: Arc<SuperInfo>,
    pub(crate) pending_free: PendingFrees,
}

impl crate::journal::CheckpointHooks for FsCheckpointHooks {
    fn checkpointed(&self, tid: u64) {
        self.pending_free.release(tid);
    }
    fn failed(&self, why: &str) {
        self.sb.stop(why);
    }
}

/// Commits the running transaction every `secs` seconds while the filesystem lives.
/// The background committer: commits every `secs` seconds, and also as soon as the
/// filesystem goes quiet after a change (no handle started for one tick), so that what a
/// burst of metadata operations did is durable a tick or two after it ends rather than up to
/// `secs` later. A FUSE mount needs this: `sync` and `syncfs` do not reach its server (the
/// kernel sends FUSE_SYNCFS only to fuseblk mounts). Continuous activity commits on the
/// period only, as before.
fn spawn_committer(fs: std::sync::Weak<Fs>, secs: u64) -> std::io::Result<()> {
    let tick = std::time::Duration::from_millis(50);
    std::thread::Builder::new()
        .name("uext4-commit".into())
        .spawn(move || {
            let mut waited = std::time::Duration::ZERO;
            let mut seen = 0u64;
            let mut changed = false;
            loop {
                std::thread::sleep(tick);
                waited += tick;
                let Some(fs) = fs.upgrade() else { return };
                if fs.is_read_only() || fs.txn.lost.get().is_some() {
                    // Nothing more can be committed (after a lost transaction, ever).
                    return;
                }
                let started = fs.txn.stats.handles_started.load(Ordering::Relaxed);
                let quiet = started == seen;
                seen = started;
                if waited.as_secs() >= secs {
                    waited = std::time::Duration::ZERO;
                    changed = false;
                    // Buffered data goes down first, so the commit carries its extents.
                    if let Err(e) = fs.delalloc_writeback_all() {
                        tracing::error!("background writeback failed: {e}");
                    }
                    if let Err(e) = fs.commit() {
                        tracing::error!("background commit failed: {e}");
                    }
                } else if !quiet {
                    changed = true;
                } else if changed {
                    changed = false;
                    if let Err(e) = fs.commit() {
                        tracing::error!("background commit failed: {e}");
                    }
                }
            }
        })
        .map(|_| ())
}

/// statfs numbers.
#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    /// The block size in bytes.
    pub block_size: u32,
    /// Blocks in the filesystem.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks an unprivileged user may use (free less reserved).
    pub blocks_avail: u64,
    /// Inodes in the filesystem.
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
    /// The longest name, in bytes.
    pub name_max: u32,
}

impl Drop for Fs {
    /// Does not unmount: a drop without [`Fs::unmount`] leaves the image as a crash would
    /// (the engine's crash tests rely on it), so it says so, once.
    fn drop(&mut self) {
        if !self.is_read_only()
            && !self.sb.is_stopped()
            && self.warn_on_drop.load(Ordering::Acquire)
        {
            tracing::warn!(
                "a read-write filesystem was dropped without unmount: its running transaction \
                 (and in buffered mode, data not yet written back) is lost, and the image is \
                 left dirty; the next open replays the journal"
            );
        }
    }
}
