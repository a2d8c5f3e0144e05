//! The adapter driven directly, without the kernel: requests built as the kernel lays them
//! out, answers read as the kernel reads them. Covers what the mount tests reach only on some
//! kernels (STATX, TMPFILE, SYNCFS, RENAME2, BATCH_FORGET) and the deferred fsync replies.

use std::sync::{Arc, Mutex};
use uext4::{Fs, MountOptions};
use uext4_fuse::abi::{self, Fields};
use uext4_fuse::transport::{Answer, InHeader, RawRequest, Serve, Transport};
use uext4_fuse::{Options, Uext4Fuse};
use uext4_testkit::{e2fsck_clean, mke2fs, scratch};

/// Collects deferred replies: (unique, errno or 0).
#[derive(Default)]
struct Later(Mutex<Vec<(u64, i32)>>);

impl Transport for Later {
    fn reply_later(&self, unique: u64, body: Result<&[u8], i32>) -> std::io::Result<()> {
        self.0
            .lock()
            .unwrap()
            .push((unique, body.err().unwrap_or(0)));
        Ok(())
    }
}

struct Kernel {
    server: Uext4Fuse,
    later: Arc<Later>,
    from: Arc<dyn Transport>,
    out: Vec<u8>,
    unique: u64,
}

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

impl Kernel {
    fn new(server: Uext4Fuse) -> Kernel {
        let later = Arc::new(Later::default());
        Kernel {
            server,
            from: later.clone(),
            later,
            out: vec![0u8; (1 << 20) + 4096],
            unique: 0,
        }
    }

    /// Sends one request for `nodeid`; the reply's body, or its errno.
    fn call(
        &mut self,
        opcode: u32,
        nodeid: u64,
        fixed: &[u8],
        rest: &[u8],
    ) -> Result<Vec<u8>, i32> {
        self.unique += 1;
        let req = RawRequest {
            header: InHeader {
                opcode,
                nodeid,
                unique: self.unique,
                ..InHeader::default()
            },
            fixed,
            rest,
        };
        match self.server.serve(&req, &mut self.out, &self.from) {
            Answer::Reply(n) => Ok(self.out[..n].to_vec()),
            Answer::Error(e) => Err(e),
            Answer::None => Err(0),
        }
    }

    fn init(&mut self, offered: u64) -> abi::InitOut {
        let mut f = u32s(&[7, 44, 1 << 20, offered as u32, (offered >> 32) as u32]);
        f.resize(64, 0);
        abi::InitOut::parse(&self.call(abi::INIT, 0, &f, &[]).unwrap())
    }

    /// CREATE `name` in the root: its node id.
    fn create(&mut self, name: &str) -> u64 {
        let f = u32s(&[libc::O_RDWR as u32, 0o100644, 0o022, 0]);
        let r = self
            .call(abi::CREATE, 1, &f, format!("{name}\0").as_bytes())
            .unwrap();
        assert_eq!(r.len(), abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN);
        Fields(&r).u64(0)
    }
}

fn offered() -> u64 {
    abi::FUSE_INIT_EXT
        | abi::FUSE_ASYNC_READ
        | abi::FUSE_MAX_PAGES
        | abi::FUSE_DO_READDIRPLUS
        | abi::FUSE_HANDLE_KILLPRIV_V2
        | abi::FUSE_OVER_IO_URING
}

fn fs(img: &std::path::Path) -> Arc<Fs> {
    mke2fs(img, "32M", &[]);
    let o = MountOptions {
        commit_interval_secs: 0,
        ..MountOptions::default()
    };
    Fs::open_path(img, o).unwrap()
}

#[test]
fn init_agrees_on_what_both_sides_name() {
    let s = scratch("adapter-init");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    let o = k.init(offered());
    assert_eq!((o.major, o.minor, o.max_write), (7, 44, 1 << 20));
    assert_eq!(o.max_pages, 256);
    assert!(o.flags & abi::FUSE_HANDLE_KILLPRIV_V2 != 0);
    assert!(o.flags & abi::FUSE_DO_READDIRPLUS != 0);
    // Not asked for without with_uring; not offered, not agreed.
    assert_eq!(o.flags & abi::FUSE_OVER_IO_URING, 0);
    assert_eq!(o.flags & abi::FUSE_WRITEBACK_CACHE, 0);
    k.server.destroy();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()).with_uring(true));
    assert!(k.init(offered()).flags & abi::FUSE_OVER_IO_URING != 0);
    k.server.destroy();
    e2fsck_clean(&img);
}

#[test]
fn fsyncs_are_answered_later_and_do_not_hold_their_threads() {
    let s = scratch("adapter-fsync");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    k.init(offered());
    let ino = k.create("f");
    let mut w = u64s(&[0, 0]);
    w.extend(u32s(&[5, 0, 0, 0, 0, 0]));
    assert_eq!(
        Fields(&k.call(abi::WRITE, ino, &w, b"hello").unwrap()).u32(0),
        5
    );
    // 64 fsyncs from 64 threads: every call returns (Answer::None), and each is answered once.
    let server = Arc::new(k.server);
    let from = k.from.clone();
    let threads: Vec<_> = (0..64u64)
        .map(|i| {
            let (server, from) = (server.clone(), from.clone());
            std::thread::spawn(move || {
                let f = u64s(&[0, 0]);
                let req = RawRequest {
                    header: InHeader {
                        opcode: abi::FSYNC,
                        nodeid: ino,
                        unique: 1000 + i,
                        ..InHeader::default()
                    },
                    fixed: &f,
                    rest: &[],
                };
                let mut out = vec![0u8; 4096];
                server.serve(&req, &mut out, &from)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), Answer::None);
    }
    let mut got = k.later.0.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, (1000..1064).map(|u| (u, 0)).collect::<Vec<_>>());
    server.destroy();
    e2fsck_clean(&img);
}

#[test]
fn tmpfile_statx_rename2_syncfs_and_forgets() {
    let s = scratch("adapter-new-ops");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    k.init(offered());
    // TMPFILE: an open inode with no name, which LINK names.
    let f = u32s(&[libc::O_RDWR as u32, 0o100600, 0o022, 0]);
    let r = k.call(abi::TMPFILE, 1, &f, b"/\0").unwrap();
    let tmp = Fields(&r).u64(0);
    assert_eq!(Fields(&r).u32(40 + 64), 0, "no links yet");
    let r = k.call(abi::LINK, 1, &u64s(&[tmp]), b"named\0").unwrap();
    assert_eq!(Fields(&r).u32(40 + 64), 1);
    assert_eq!(k.call(abi::RELEASE, tmp, &[0; 24], &[]), Ok(vec![]));
    // STATX: the basic stats and a birth time (256-byte inodes).
    let mut sx = vec![0u8; 24];
    sx[20..24].copy_from_slice(&(abi::STATX_BASIC_STATS | abi::STATX_BTIME).to_ne_bytes());
    let r = k.call(abi::STATX, tmp, &sx, &[]).unwrap();
    let st = Fields(&r[32..]);
    assert_eq!(st.u32(0), abi::STATX_BASIC_STATS | abi::STATX_BTIME);
    assert_eq!(st.u16(28) as u32, 0o100600 & !0o022);
    assert!(st.u64(80) > 0, "birth time");
    // RENAME2 with RENAME_EXCHANGE swaps a file and a directory; NOREPLACE refuses.
    let d = u32s(&[0o755, 0o022]);
    k.call(abi::MKDIR, 1, &d, b"dir\0").unwrap();
    let mut x = u64s(&[1]);
    x.extend(u32s(&[libc::RENAME_EXCHANGE, 0]));
    assert_eq!(k.call(abi::RENAME2, 1, &x, b"named\0dir\0"), Ok(vec![]));
    let r = k.call(abi::LOOKUP, 1, &[], b"dir\0").unwrap();
    assert_eq!(Fields(&r).u64(0), tmp);
    let mut x = u64s(&[1]);
    x.extend(u32s(&[libc::RENAME_NOREPLACE, 0]));
    assert_eq!(
        k.call(abi::RENAME2, 1, &x, b"named\0dir\0"),
        Err(libc::EEXIST)
    );
    assert_eq!(k.call(abi::SYNCFS, 1, &[0; 8], &[]), Ok(vec![]));
    // BATCH_FORGET gets no reply; locks are the kernel's (ENOSYS).
    let mut fg = u32s(&[2, 0]);
    fg.truncate(8);
    let entries = u64s(&[tmp, 2, tmp, 1]);
    assert_eq!(k.call(abi::BATCH_FORGET, 0, &fg, &entries), Err(0));
    assert_eq!(k.call(abi::GETLK, tmp, &[0; 48], &[]), Err(libc::ENOSYS));
    assert_eq!(k.call(abi::INTERRUPT, 0, &[0; 8], &[]), Err(0));
    k.server.destroy();
    e2fsck_clean(&img);
}

#[test]
fn readdirplus_packs_entries_with_attributes() {
    let s = scratch("adapter-readdir");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    k.init(offered());
    for i in 0..20 {
        k.create(&format!("file-{i}"));
    }
    let r = k.call(abi::OPENDIR, 1, &[0; 8], &[]).unwrap();
    assert!(Fields(&r).u32(8) & abi::FOPEN_CACHE_DIR != 0);
    let mut rd = u64s(&[0, 0]);
    rd.extend(u32s(&[4096, 0, 0, 0, 0, 0]));
    let r = k.call(abi::READDIRPLUS, 1, &rd, &[]).unwrap();
    let (mut at, mut names) = (0, Vec::new());
    while at < r.len() {
        let e = Fields(&r[at + abi::ENTRY_OUT_LEN..]);
        let len = e.u32(16) as usize;
        let name = &r[at + abi::ENTRY_OUT_LEN + 24..][..len];
        names.push(String::from_utf8(name.to_vec()).unwrap());
        at += (abi::ENTRY_OUT_LEN + 24 + len).next_multiple_of(8);
    }
    assert_eq!(names.len(), 23, "., .., lost+found and 20 files: {names:?}");
    // A small size stops early, at an entry boundary.
    let mut rd = u64s(&[0, 0]);
    rd.extend(u32s(&[200, 0, 0, 0, 0, 0]));
    let r = k.call(abi::READDIRPLUS, 1, &rd, &[]).unwrap();
    assert_eq!(r.len(), 160, "\".\" alone: 128 + 24 + 1, padded to 8");
    k.server.destroy();
    e2fsck_clean(&img);
}

/// File handles: with FUSE_EXPORT_SUPPORT the kernel decodes a handle whose inode it dropped by
/// LOOKUP of "." under the handle's node id, and finds a directory's parent by LOOKUP of "..".
/// A node id naming no inode in use (freed, reserved, out of range, or the root's inode number,
/// which is no node id) is ESTALE; a reused number comes with a new generation.
#[test]
fn lookup_of_dot_and_dotdot_by_node_id() {
    let s = scratch("adapter-handles");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    assert!(k.init(offered() | abi::FUSE_EXPORT_SUPPORT).flags & abi::FUSE_EXPORT_SUPPORT != 0);
    let r = k
        .call(
            abi::CREATE,
            1,
            &u32s(&[libc::O_RDWR as u32, 0o100644, 0o022, 0]),
            b"f\0",
        )
        .unwrap();
    let (f, fgen) = (Fields(&r).u64(0), Fields(&r).u64(8));
    assert_ne!(fgen, 0, "a new inode's generation");
    assert_eq!(k.call(abi::RELEASE, f, &[0; 24], &[]), Ok(vec![]));
    let r = k.call(abi::LOOKUP, f, &[], b".\0").unwrap();
    assert_eq!((Fields(&r).u64(0), Fields(&r).u64(8)), (f, fgen));
    let r = k
        .call(abi::MKDIR, 1, &u32s(&[0o755, 0o022]), b"d\0")
        .unwrap();
    let d = Fields(&r).u64(0);
    let r = k
        .call(abi::MKDIR, d, &u32s(&[0o755, 0o022]), b"e\0")
        .unwrap();
    let e = Fields(&r).u64(0);
    let parent =
        |k: &mut Kernel, n: u64| Fields(&k.call(abi::LOOKUP, n, &[], b"..\0").unwrap()).u64(0);
    assert_eq!(parent(&mut k, e), d);
    assert_eq!(parent(&mut k, d), 1);
    assert_eq!(parent(&mut k, 1), 1);
    assert_eq!(
        Fields(&k.call(abi::LOOKUP, 1, &[], b".\0").unwrap()).u64(0),
        1
    );
    assert_eq!(
        Fields(&k.call(abi::LOOKUP, e, &[], b".\0").unwrap()).u64(0),
        e
    );
    for bad in [2, 8, 1 << 33 | f, 1 << 30] {
        assert_eq!(
            k.call(abi::LOOKUP, bad, &[], b".\0"),
            Err(libc::ESTALE),
            "{bad}"
        );
    }
    // Removed, then forgotten (CREATE and the "." lookup): stale, and stays so once a new
    // file takes the number.
    assert_eq!(k.call(abi::UNLINK, 1, &[], b"f\0"), Ok(vec![]));
    assert_eq!(k.call(abi::LOOKUP, f, &[], b".\0"), Err(libc::ESTALE));
    assert_eq!(k.call(abi::FORGET, f, &u64s(&[2]), &[]), Err(0));
    assert_eq!(k.call(abi::LOOKUP, f, &[], b".\0"), Err(libc::ESTALE));
    let n = k.create("g");
    let r = k.call(abi::LOOKUP, n, &[], b".\0").unwrap();
    assert!(
        n != f || Fields(&r).u64(8) != fgen,
        "a reused number's generation"
    );
    k.server.destroy();
    e2fsck_clean(&img);
}

/// An inode the kernel still holds (looked up, not forgotten) whose last name goes, by RMDIR,
/// UNLINK or a RENAME over it, answers GETATTR with link count 0 until the kernel's FORGET
/// (or BATCH_FORGET) lets it go, as the kernel's ext4 keeps it until its last iput: a
/// process's working directory removed by another must still stat (fstests generic/011's
/// `chdir("..")` got ENOENT). Forgotten, it is freed.
#[test]
fn removed_inodes_live_until_the_kernel_forgets_them() {
    let s = scratch("adapter-forget-removed");
    let img = s.0.clone();
    let mut k = Kernel::new(Uext4Fuse::new(fs(&img), Options::default()));
    k.init(offered());
    let nlink = |k: &mut Kernel, node: u64| {
        k.call(abi::GETATTR, node, &[0; 16], &[])
            .map(|r| Fields(&r).u32(16 + 64))
    };
    let r = k
        .call(abi::MKDIR, 1, &u32s(&[0o755, 0o022]), b"d\0")
        .unwrap();
    let d = Fields(&r).u64(0);
    let f = k.create("f");
    assert_eq!(k.call(abi::RELEASE, f, &[0; 24], &[]), Ok(vec![]));
    let x = k.create("x");
    assert_eq!(k.call(abi::RELEASE, x, &[0; 24], &[]), Ok(vec![]));
    let y = k.create("y");
    assert_eq!(k.call(abi::RELEASE, y, &[0; 24], &[]), Ok(vec![]));
    assert_eq!(k.call(abi::RMDIR, 1, &[], b"d\0"), Ok(vec![]));
    assert_eq!(k.call(abi::UNLINK, 1, &[], b"f\0"), Ok(vec![]));
    assert_eq!(k.call(abi::RENAME, 1, &u64s(&[1]), b"y\0x\0"), Ok(vec![]));
    for (node, what) in [(d, "rmdir"), (f, "unlink"), (x, "renamed over")] {
        assert_eq!(nlink(&mut k, node), Ok(0), "{what}");
    }
    assert_eq!(nlink(&mut k, y), Ok(1));
    assert_eq!(k.call(abi::FORGET, d, &u64s(&[1]), &[]), Err(0));
    assert_eq!(nlink(&mut k, d), Err(libc::ENOENT), "forgotten directory");
    let mut fg = u32s(&[2, 0]);
    fg.truncate(8);
    assert_eq!(
        k.call(abi::BATCH_FORGET, 0, &fg, &u64s(&[f, 1, x, 1])),
        Err(0)
    );
    assert_eq!(nlink(&mut k, f), Err(libc::ENOENT), "forgotten file");
    assert_eq!(
        nlink(&mut k, x),
        Err(libc::ENOENT),
        "forgotten file renamed over"
    );
    k.server.destroy();
    e2fsck_clean(&img);
}
