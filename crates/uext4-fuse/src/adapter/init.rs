//! INIT: what this server asks of the kernel, and what it learns from the answer.

use super::{Reply, Uext4Fuse};
use crate::abi::{self, InitIn, InitOut};
use crate::reply;
use std::sync::atomic::Ordering;

impl Uext4Fuse {
    /// Agrees on the protocol version and on each capability the kernel offers and this
    /// server wants (a capability is used only when both sides name it).
    pub(super) fn init(&self, i: &InitIn, out: &mut [u8]) -> Reply {
        if i.major > abi::KERNEL_VERSION {
            // A newer major: answer with ours alone; the kernel asks again in our version.
            let o = InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                ..InitOut::default()
            };
            return Ok(reply::init(out, &o, abi::KERNEL_MINOR_VERSION));
        }
        // 7.12 brought the umask to create, mknod and mkdir, which the engine needs.
        if i.major < abi::KERNEL_VERSION || i.minor < 12 {
            tracing::error!("the kernel speaks FUSE {}.{}: too old", i.major, i.minor);
            return Err(libc::EPROTO);
        }
        let mut agreed = self.wanted() & i.flags;
        if agreed & abi::FUSE_POSIX_ACL == 0 {
            // Without ACLs the kernel applies the umask as usual.
            agreed &= !abi::FUSE_DONT_MASK;
        }
        // set-ID and capability removal on write/truncate/chown happens here, not by a
        // security.capability lookup the kernel would otherwise send before every write.
        self.killpriv.store(
            agreed & abi::FUSE_HANDLE_KILLPRIV_V2 != 0,
            Ordering::Relaxed,
        );
        if agreed & abi::FUSE_WRITEBACK_CACHE != 0 {
            self.fs
                .set_cache_reserve(self.cache_reserve_blocks().max(1));
        }
        // A listing the kernel keeps is not read again, so it updates no atime: under
        // strictatime every OPENDIR still decides whether the kernel may keep it.
        self.no_opendir.store(
            i.flags & abi::FUSE_NO_OPENDIR_SUPPORT != 0
                && self.opts.atime.mode != uext4::AtimeMode::Strict,
            Ordering::Relaxed,
        );
        // `-o noopen` (options.rs checked that OPEN decides nothing here).
        self.no_open.store(
            self.opts.noopen && i.flags & abi::FUSE_NO_OPEN_SUPPORT != 0,
            Ordering::Relaxed,
        );
        let acl = agreed & abi::FUSE_POSIX_ACL != 0;
        self.acl_on.store(acl, Ordering::Relaxed);
        self.dont_mask
            .store(acl && agreed & abi::FUSE_DONT_MASK != 0, Ordering::Relaxed);
        let max_write: u32 = 1 << 20;
        let max_readahead = i.max_readahead.min(1 << 20);
        let page = 4096;
        // Inodes of 128 bytes have no room for nanoseconds: times are whole seconds there, and
        // the kernel's cached times must be too (the kernel's ext4 sets s_time_gran the same).
        let time_gran = if self.fs.geo.inode_size <= 128 {
            1_000_000_000
        } else {
            1
        };
        let o = InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead,
            flags: agreed,
            // More requests in flight in the background (readahead, async direct I/O,
            // writeback) than the kernel's default of 12, for the loop threads to share.
            max_background: 64,
            congestion_threshold: 48,
            max_write,
            time_gran,
            max_pages: (max_write.max(max_readahead).div_ceil(page)) as u16,
        };
        Ok(reply::init(out, &o, i.minor))
    }

    /// Whether to ask for the kernel's write-back cache: only where `-o writeback_cache`
    /// asks (docs/DESIGN.md says why it is not the default: each fsync then costs one more
    /// round trip, and near full an overwrite is refused as a new write is).
    fn writeback_cache(&self) -> bool {
        !self.opts.read_only && self.opts.writeback_cache.unwrap_or(false)
    }

    /// The blocks kept for the kernel's write-back cache: twice what the kernel lets a FUSE
    /// mount hold dirty or under writeback (its bdi gets max_ratio 1% of the dirty threshold,
    /// with a strict limit; fs/fuse/inode.c fuse_bdi_init), the threshold taken at its
    /// largest (vm.dirty_bytes, or vm.dirty_ratio of all memory), plus 8 MiB for the
    /// mapping blocks their writeback may add. Twice, because the throttling lets writers run
    /// a little past the limit. At most an eighth of the free space (only where
    /// `-o writeback_cache` asked for the cache on a smaller image: then the reserve may fall
    /// short of what the kernel caches, and a write may fail at writeback instead).
    fn cache_reserve_blocks(&self) -> u64 {
        self.cache_reserve_wanted()
            .min(self.fs.free_beyond_cache_reserve() / 8)
    }

    /// `cache_reserve_blocks` before the cap.
    fn cache_reserve_wanted(&self) -> u64 {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let dirty_bytes: u64 = read("/proc/sys/vm/dirty_bytes").trim().parse().unwrap_or(0);
        let threshold = if dirty_bytes > 0 {
            dirty_bytes
        } else {
            let ratio: u64 = read("/proc/sys/vm/dirty_ratio")
                .trim()
                .parse()
                .unwrap_or(20);
            let mem_kib: u64 = read("/proc/meminfo")
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(64 << 20);
            mem_kib * 1024 / 100 * ratio.min(100)
        };
        let bytes = 2 * threshold / 100 + (8 << 20);
        // With bigalloc each cached block over a hole may take a whole cluster.
        bytes.div_ceil(self.fs.geo.block_size as u64) << self.fs.geo.cluster_bits
    }

    /// The capabilities this server asks for.
    fn wanted(&self) -> u64 {
        use abi::*;
        // Reads may be sent concurrently, and writes larger than a page; the reply says how
        // many pages a request may carry.
        let mut w = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_INIT_EXT;
        // Lookups, creates and removals in one directory run in parallel.
        w |= FUSE_PARALLEL_DIROPS;
        // Symlink targets never change: the kernel may cache them.
        w |= FUSE_CACHE_SYMLINKS;
        // ioctl on directories too (lsattr -d).
        w |= FUSE_HAS_IOCTL_DIR;
        // FUSE_ASYNC_DIO is left off: it sends even a small synchronous O_DIRECT write through
        // the background queue and completes it from the reply's thread: an extra hand-off
        // on every small direct write.
        if self.writeback_cache() {
            w |= FUSE_WRITEBACK_CACHE;
        }
        // Shared mmap keeps working on direct_io files (the direct_io option, and every
        // O_DIRECT open: see open_flags), and a direct write first writes back the dirty
        // cached pages of its range.
        w |= FUSE_DIRECT_IO_ALLOW_MMAP;
        w |= FUSE_HANDLE_KILLPRIV_V2;
        if self.opts.acl {
            w |= FUSE_POSIX_ACL | FUSE_DONT_MASK;
        }
        // readdirplus (entries with their attributes) when the kernel sees lookups follow a
        // listing, as for `ls -l`.
        w |= FUSE_DO_READDIRPLUS | FUSE_READDIRPLUS_AUTO;
        // File handles (name_to_handle_at, NFS export, overlayfs index=on) still open their
        // inode after the kernel dropped it: node ids are inode numbers, stable across
        // mounts, entries carry the inode's generation, and LOOKUP answers "." by node id
        // and ".." (see `lookup`).
        w |= FUSE_EXPORT_SUPPORT;
        // Idmapped mounts (mount_setattr with MOUNT_ATTR_IDMAP: containers, systemd-homed).
        // The kernel allows them only where it checks permissions itself (default_permissions,
        // or the ACLs that turn it on), and then sends no caller ids outside creates: see
        // `cred`.
        // Not for a guest: a request without ids would need the caller's /proc entry, which is
        // the guest's.
        if (self.opts.default_permissions || self.opts.acl) && !self.guest {
            w |= FUSE_ALLOW_IDMAP;
        }
        if self.uring {
            w |= FUSE_OVER_IO_URING;
        }
        w
    }
}
