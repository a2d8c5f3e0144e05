//! The FUSE server: serves a [`uext4::Fs`] to the kernel through a FUSE layer of its own, over
//! /dev/fuse (one loop thread per CPU, at least 2, each on its own cloned descriptor) or FUSE
//! over io_uring (one queue per CPU) where the kernel offers it. The crate translates and
//! nothing more:
//! - [`options`]: the `-o` list and what it asks of the engine;
//! - [`transport`]: what a transport hands the handler and takes back; [`abi`], [`request`],
//!   [`reply`]: the wire format, decoded and encoded;
//! - `dev`, [`dev_uring`] and [`virtio_fs`]: the three transports (/dev/fuse, FUSE over
//!   io_uring, and virtqueues from a virtual machine's kernel, as a vhost-user-fs back end);
//!   [`notify`]: messages to the kernel unasked;
//! - `adapter`: each request to one engine call and its reply, with the caller's credentials;
//!   every rule about files (ACLs, modes, set-ID bits, ownership, group commit of fsyncs)
//!   is the engine's;
//! - `convert`: inode numbers (FUSE's root 1 is ext4's root 2), times, attributes, and the
//!   one mapping from engine errors to errno ([`errno`]);
//! - `mount`: mounting (mount(2) for root, fusermount3 for others, `/dev/fd/N`) and
//!   unmounting; `session`: INIT, then the transports' threads until the mount is gone.
//!
//! `uext4 stats` reads the engine's counters as JSON from the virtual extended attribute
//! [`STATS_XATTR`] (`user.uext4.stats`) of the mount's root. It is answered by getxattr only
//! and never listed, so programs that enumerate attributes (pjdfstest, cp -a, tar) do not see
//! it; a real attribute of that name on the root would be shadowed. [`SERVER_XATTR`]
//! (`user.uext4.server`) answers the same way with the server's process id, which `uext4
//! umount` waits on.

pub mod abi;
mod adapter;
mod convert;
mod dev;
pub mod dev_uring;
mod mount;
pub mod notify;
pub mod options;
pub mod reply;
pub mod request;
mod session;
pub mod transport;
pub mod virtio_fs;

pub use adapter::Uext4Fuse;
pub use convert::errno;
pub use dev::Agreed;
pub use mount::{bind_mount, fd_path, unmount};
pub use options::{Options, TransportKind};
pub use session::{asks_uring, serve, serve_with, Served};
pub use virtio_fs::{serve_vhost_user, VirtioFs};

/// The virtual attribute on the mount's root that `uext4 stats` reads.
pub const STATS_XATTR: &[u8] = b"user.uext4.stats";
/// The virtual attribute on the mount's root that holds the server's process id (decimal).
pub const SERVER_XATTR: &[u8] = b"user.uext4.server";
