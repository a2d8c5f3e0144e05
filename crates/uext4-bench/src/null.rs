//! fuse-null: a FUSE server on the same transport and thread count as uext4 that does no
//! work. Files live only as names and sizes in one flat directory; reads return zeros, writes
//! are dropped. It measures the ceiling of the FUSE transport.

use crate::memfs::{answer, init, serve_until_unmounted, statfs};
use anyhow::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use uext4_fuse::abi;
use uext4_fuse::reply::{self, Dirents, WireAttr};
use uext4_fuse::request::Op;
use uext4_fuse::transport::{Answer, RawRequest, Serve, Transport};

const TTL: Duration = Duration::from_secs(1);

/// The open flags uext4's server gives (`Uext4Fuse::open_flags`), so both take the same path
/// through the kernel: an O_DIRECT open gets FOPEN_DIRECT_IO, without which the kernel ignores
/// FOPEN_PARALLEL_DIRECT_WRITES.
fn open_flags(flags: u32) -> u32 {
    let mut f = abi::FOPEN_PARALLEL_DIRECT_WRITES;
    if flags as i32 & libc::O_DIRECT != 0 {
        f |= abi::FOPEN_DIRECT_IO;
    }
    f
}

/// Names to inodes, inodes to sizes, the last inode number given.
type Files = (HashMap<Vec<u8>, u64>, HashMap<u64, u64>, u64);

struct Null {
    files: Mutex<Files>,
}

fn attr(ino: u64, size: u64, dir: bool) -> WireAttr {
    WireAttr {
        ino,
        size,
        blocks: size / 512,
        mode: if dir {
            libc::S_IFDIR | 0o777
        } else {
            libc::S_IFREG | 0o666
        },
        nlink: if dir { 2 } else { 1 },
        blksize: 4096,
        ..WireAttr::default()
    }
}

impl Null {
    fn serve_op(&self, ino: u64, op: Op<'_>, out: &mut [u8]) -> Result<usize, i32> {
        let mut f = self.files.lock();
        match op {
            // fuser's defaults, which this server had before.
            Op::Init(i) => Ok(init(&i, 0, 16, out)),
            Op::Lookup { name } => {
                let &i = f.0.get(name).ok_or(libc::ENOENT)?;
                Ok(reply::entry(
                    out,
                    0,
                    reply::Ttl::both(TTL),
                    &attr(i, f.1[&i], false),
                ))
            }
            Op::Getattr { .. } if ino == 1 => Ok(reply::attr(out, TTL, &attr(1, 4096, true))),
            Op::Getattr { .. } => {
                let &s = f.1.get(&ino).ok_or(libc::ENOENT)?;
                Ok(reply::attr(out, TTL, &attr(ino, s, false)))
            }
            Op::Setattr(_) if ino == 1 => Ok(reply::attr(out, TTL, &attr(1, 4096, true))),
            Op::Setattr(s) => {
                if let Some(size) = s.size {
                    f.1.insert(ino, size);
                }
                let s = f.1.get(&ino).copied().unwrap_or(0);
                Ok(reply::attr(out, TTL, &attr(ino, s, false)))
            }
            Op::Create { name, flags, .. } => {
                let i = match f.0.get(name) {
                    Some(&i) => i,
                    None => {
                        f.2 += 1;
                        let i = f.2;
                        f.0.insert(name.to_vec(), i);
                        f.1.insert(i, 0);
                        i
                    }
                };
                let a = attr(i, f.1[&i], false);
                Ok(reply::create(
                    out,
                    0,
                    reply::Ttl::both(TTL),
                    &a,
                    0,
                    open_flags(flags),
                ))
            }
            Op::Open { flags } => Ok(reply::open(out, 0, open_flags(flags))),
            Op::Read { offset, size } => {
                let len = f.1.get(&ino).copied().unwrap_or(0);
                let n = len.saturating_sub(offset).min(size as u64) as usize;
                out[..n].fill(0);
                Ok(n)
            }
            Op::Write { offset, data, .. } => {
                let end = offset + data.len() as u64;
                let s = f.1.entry(ino).or_insert(0);
                if *s < end {
                    *s = end;
                }
                Ok(reply::written(out, data.len() as u32))
            }
            Op::Flush | Op::Fsync { .. } | Op::Release | Op::Releasedir => Ok(0),
            Op::Opendir { .. } => Ok(reply::open(out, 0, 0)),
            Op::Unlink { name } => {
                let i = f.0.remove(name).ok_or(libc::ENOENT)?;
                f.1.remove(&i);
                Ok(0)
            }
            Op::Readdir {
                offset,
                size,
                plus: false,
            } => {
                let mut names: Vec<(&Vec<u8>, &u64)> = f.0.iter().collect();
                names.sort();
                let mut d = Dirents::new(out, size);
                for (i, (n, &ino)) in names.into_iter().enumerate().skip(offset as usize) {
                    if !d.add(ino, i as u64 + 1, libc::S_IFREG, n) {
                        break;
                    }
                }
                Ok(d.len())
            }
            Op::Statfs => Ok(statfs(out)),
            _ => Err(libc::ENOSYS),
        }
    }
}

impl Serve for Null {
    fn serve(&self, req: &RawRequest<'_>, out: &mut [u8], _from: &Arc<dyn Transport>) -> Answer {
        match Op::decode(req) {
            Ok(Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt) => Answer::None,
            Ok(op) => answer(self.serve_op(req.header.nodeid, op, out)),
            Err(e) => Answer::Error(e),
        }
    }
}

/// Serves the do-nothing filesystem at `mountpoint` until it is unmounted.
pub fn serve(mountpoint: &Path, threads: usize) -> Result<()> {
    let null = Null {
        files: Mutex::new((HashMap::new(), HashMap::new(), 1)),
    };
    serve_until_unmounted(Arc::new(null), "fuse-null", mountpoint, threads, false)
}
