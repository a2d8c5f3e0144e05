//! Unpacking a tar archive (plain, gzip or zstd) into an image, without root: `uext4 mkfs -d
//! ARCHIVE` and `uext4 cp --from-tar ARCHIVE... IMAGE:DIR`.
//!
//! Everything is kept as the archive says, whoever runs it: owners (numeric), modes with the
//! set-id and sticky bits, character and block devices (major, minor), FIFOs, symlinks, hard
//! links, nanosecond mtimes (atime and ctime where PAX headers give them, else the mtime),
//! extended attributes (`SCHILY.xattr.*`, security.capability and POSIX ACLs among them;
//! `SCHILY.acl.access`/`.default` text ACLs with numeric ids) and holes: GNU sparse entries
//! (old GNU and PAX 0.0, 0.1 and 1.0) and, in any file, blocks that are all zeros are left
//! unwritten. Entries go in archive order; a later entry of the same name replaces an earlier
//! one (as tar does). Leading `/` and `./` are stripped; a path with a `..` component is
//! refused, so nothing lands outside the directory unpacked into. Directories missing from the
//! archive are made with mode 0755, owned by the caller; directory times are set last, so the
//! entries put in them do not change them.

use super::cp::rules::{make_entry, NewEntry};
use crate::image::clean_path;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use uext4::Timestamp;
use uext4::XattrFlags;
use uext4::{Error, Fs};
use uext4::{SetAttr, TimeSet};

/// Whether `p` names an archive rather than a directory tree: a regular file (or `-`, stdin).
pub fn is_archive(p: &Path) -> bool {
    p == Path::new("-") || std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// Opens an archive for reading, undoing its compression (told by its first bytes, not its
/// name): gzip, zstd or none. `-` is standard input. Reading and decompressing run on a
/// thread of their own ([`ReadAhead`]), beside the unpacking.
pub fn open_archive(path: &Path) -> Result<Box<dyn Read>> {
    Ok(Box::new(ReadAhead::new(decompressed(path)?)))
}

fn decompressed(path: &Path) -> Result<Box<dyn Read + Send>> {
    let raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path)?)
    };
    let mut r = BufReader::with_capacity(1 << 20, raw);
    let head = r.fill_buf()?.to_vec();
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(r))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(r)?)
    } else if head.starts_with(b"BZh") || head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        bail!(
            "bzip2 and xz archives are not read; decompress it first (xz -dc A.tar.xz | uext4 \
             ... -), or use gzip or zstd"
        )
    } else {
        Box::new(r)
    })
}

/// A stream read on a thread of its own, [`ReadAhead::PIECE`] bytes at a time and up to
/// [`ReadAhead::AHEAD`] pieces ahead of its reader (a bounded amount of memory).
struct ReadAhead {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    piece: Vec<u8>,
    at: usize,
}

impl ReadAhead {
    const PIECE: usize = 256 << 10;
    const AHEAD: usize = 4;

    fn new(mut inner: Box<dyn Read + Send>) -> ReadAhead {
        let (tx, rx) = std::sync::mpsc::sync_channel(Self::AHEAD);
        // Ends at the end of the stream, on an error, or when the reader is dropped.
        std::thread::spawn(move || loop {
            let mut piece = vec![0u8; Self::PIECE];
            let mut got = 0;
            let r = loop {
                match inner.read(&mut piece[got..]) {
                    Ok(0) => break Ok(()),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => break Err(e),
                }
                if got == piece.len() {
                    break Ok(());
                }
            };
            piece.truncate(got);
            let last = got == 0 || r.is_err();
            if got > 0 && tx.send(Ok(piece)).is_err() {
                return;
            }
            if let Err(e) = r {
                let _ = tx.send(Err(e));
            }
            if last {
                return;
            }
        });
        ReadAhead {
            rx,
            piece: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.piece.len() {
            match self.rx.recv() {
                Ok(p) => {
                    self.piece = p?;
                    self.at = 0;
                }
                // The thread ended: the end of the stream.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `uext4 cp --from-tar ARCHIVE... IMAGE:DIR`: each archive unpacked into the directory, in
/// order (later entries replace earlier ones of the same name).
pub fn cp_from_tar(archives: &[String], dst: &str) -> Result<()> {
    let (img, d) = crate::image::image_loc(dst)?;
    // As mkfs -d: SOURCE_DATE_EPOCH clamps the times the copy records.
    let fs = super::cp::open_for_copy(&img)?;
    let r = (|| -> Result<()> {
        let dir = crate::image::resolve(&fs, &d, true).with_context(|| dst.to_string())?;
        if !fs.getattr(dir)?.is_dir() {
            bail!("{dst}: not a directory");
        }
        let mut u = Unpacker::new(&fs, dir);
        for a in archives {
            u.unpack(Path::new(a)).with_context(|| a.clone())?;
        }
        u.finish()
    })();
    crate::image::finish(&fs, &img.path, r)
}

/// A PAX time: seconds with an optional fraction, possibly negative ("-1.5").
fn pax_time(v: &[u8]) -> Option<Timestamp> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = whole.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: i64 = digits.parse().ok()?;
    Some(if !neg {
        Timestamp {
            sec,
            nsec: nsec as u32,
        }
    } else if nsec == 0 {
        Timestamp { sec: -sec, nsec: 0 }
    } else {
        Timestamp {
            sec: -sec - 1,
            nsec: (1_000_000_000 - nsec) as u32,
        }
    })
}

/// A text ACL as GNU tar and star store it in `SCHILY.acl.access` (`user::rw-,user:1000:r--,
/// group::r-x,mask::r-x,other::r--`, entries split by ',' or newlines; star's fourth field is
/// the numeric id) to the VFS form of `system.posix_acl_*`. Named users and groups need a
/// numeric id: the host's user database says nothing about the image's.
fn acl_text_to_vfs(text: &[u8]) -> Result<Vec<u8>> {
    let text = std::str::from_utf8(text).map_err(|_| anyhow!("not UTF-8"))?;
    let mut entries: Vec<(u16, u16, u32)> = Vec::new();
    for e in text
        .split([',', '\n'])
        .map(|e| e.split('#').next().unwrap_or("").trim())
        .filter(|e| !e.is_empty())
    {
        let f: Vec<&str> = e.split(':').collect();
        if f.len() < 3 {
            bail!("{e:?}: not TAG:QUALIFIER:PERMS");
        }
        let perm = f[2].bytes().try_fold(0u16, |p, c| match c {
            b'r' => Ok(p | 4),
            b'w' => Ok(p | 2),
            b'x' => Ok(p | 1),
            b'-' => Ok(p),
            _ => Err(anyhow!("{e:?}: bad permissions")),
        })?;
        let qual = f.get(3).copied().unwrap_or(f[1]);
        let id = |q: &str| -> Result<u32> {
            q.parse()
                .map_err(|_| anyhow!("{e:?}: a named user or group needs a numeric id"))
        };
        let (tag, id) = match (f[0], f[1].is_empty()) {
            ("user" | "u", true) => (0x01, u32::MAX),
            ("user" | "u", false) => (0x02, id(qual)?),
            ("group" | "g", true) => (0x04, u32::MAX),
            ("group" | "g", false) => (0x08, id(qual)?),
            ("mask" | "m", _) => (0x10, u32::MAX),
            ("other" | "o", _) => (0x20, u32::MAX),
            _ => bail!("{e:?}: unknown ACL tag"),
        };
        entries.push((tag, perm, id));
    }
    entries.sort_by_key(|&(t, _, id)| (t, id));
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    Ok(v)
}

/// One member of an archive, with what its extension headers said.
pub(crate) struct Member {
    pub h: tar::Header,
    pub path: Vec<u8>,
    pub link: Vec<u8>,
    /// Bytes of data stored in the archive.
    pub size: u64,
    /// PAX records (global ones first), in order.
    pub pax: Vec<(String, Vec<u8>)>,
    /// An old GNU sparse file: its (offset, length) segments and its size.
    pub gnu_sparse: Option<(Vec<(u64, u64)>, u64)>,
}

/// Walks the archive at `path` (`-`: stdin), calling `f` on each member with its data.
///
/// The stream is walked here, header by header, with the tar crate decoding each header
/// (numbers in octal or base-256, the ustar prefix, GNU sparse maps): the crate's own iterator
/// reads PAX records line by line, so a record whose value holds a newline (a binary xattr such
/// as an ACL or a capability, GNU tar's text ACLs) breaks it and the records after it. PAX
/// records are parsed by their length here.
pub(crate) fn for_each_member(
    path: &Path,
    f: &mut dyn FnMut(&Member, &mut dyn Read) -> Result<()>,
) -> Result<()> {
    let mut r = open_archive(path)?;
    let mut global: Vec<(String, Vec<u8>)> = Vec::new();
    let mut local: Option<Vec<(String, Vec<u8>)>> = None;
    let (mut long_name, mut long_link) = (None, None);
    let mut hb = [0u8; 512];
    let mut index = 0u64;
    loop {
        index += 1;
        let at = || format!("entry {index}");
        if !read_block(&mut r, &mut hb).with_context(at)? {
            if local.is_some() || long_name.is_some() || long_link.is_some() {
                bail!("{}: the archive ends after an extension header", at());
            }
            break;
        }
        if hb.iter().all(|&b| b == 0) {
            // The end-of-archive marker.
            break;
        }
        let mut h = tar::Header::new_old();
        h.as_mut_bytes().copy_from_slice(&hb);
        check_sum(&h).with_context(|| {
            if index == 1 {
                "not a tar archive".to_string()
            } else {
                at()
            }
        })?;
        let stored = h.entry_size().with_context(at)?;
        match h.entry_type().as_byte() {
            b'x' => {
                local =
                    Some(parse_pax(&read_data(&mut r, stored).with_context(at)?).with_context(at)?);
                continue;
            }
            b'g' => {
                global.extend(
                    parse_pax(&read_data(&mut r, stored).with_context(at)?).with_context(at)?,
                );
                continue;
            }
            b'L' => {
                long_name = Some(until_nul(read_data(&mut r, stored).with_context(at)?));
                continue;
            }
            b'K' => {
                long_link = Some(until_nul(read_data(&mut r, stored).with_context(at)?));
                continue;
            }
            _ => {}
        }
        let mut pax = global.clone();
        pax.extend(local.take().unwrap_or_default());
        let get = |k: &str| {
            pax.iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let path = get("path")
            .or(long_name.take())
            .unwrap_or_else(|| h.path_bytes().into_owned());
        let link = get("linkpath")
            .or(long_link.take())
            .or_else(|| h.link_name_bytes().map(|l| l.into_owned()))
            .unwrap_or_default();
        let size = match get("size") {
            Some(v) => pax_num(&v).with_context(at)?,
            None => stored,
        };
        // Old GNU sparse: the map is in the header and in extension blocks after it.
        let mut gnu_sparse = None;
        if h.entry_type().as_byte() == b'S' {
            let g = h
                .as_gnu()
                .ok_or_else(|| anyhow!("{}: a sparse entry without a GNU header", at()))?;
            let mut map = Vec::new();
            for sp in g.sparse.iter().filter(|sp| !sp.is_empty()) {
                map.push((sp.offset()?, sp.length()?));
            }
            let mut more = g.is_extended();
            while more {
                let mut ext = tar::GnuExtSparseHeader::new();
                if !read_block(&mut r, ext.as_mut_bytes())? {
                    bail!("{}: the archive ends inside a sparse map", at());
                }
                for sp in ext.sparse.iter().filter(|sp| !sp.is_empty()) {
                    map.push((sp.offset()?, sp.length()?));
                }
                more = ext.is_extended();
            }
            gnu_sparse = Some((map, g.real_size()?));
        }
        let name = String::from_utf8_lossy(&path).into_owned();
        let m = Member {
            h,
            path,
            link,
            size,
            pax,
            gnu_sparse,
        };
        let mut data = (&mut r).take(size);
        f(&m, &mut data).with_context(|| format!("entry {index} ({name})"))?;
        // What the entry did not read, and the padding to the next header.
        let left = data.limit() + (512 - size % 512) % 512;
        let skipped = std::io::copy(&mut (&mut r).take(left), &mut std::io::sink())
            .with_context(|| format!("entry {index} ({name})"))?;
        if skipped < left {
            bail!("entry {index} ({name}): the archive ends inside it");
        }
    }
    Ok(())
}

/// Reads one 512-byte block: false at the end of the input before its first byte.
fn read_block(r: &mut dyn Read, b: &mut [u8]) -> Result<bool> {
    let mut got = 0;
    while got < b.len() {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!("the archive ends inside a header"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// The data of an extension header (PAX records, a GNU long name), and its padding.
fn read_data(r: &mut dyn Read, size: u64) -> Result<Vec<u8>> {
    if size > 64 << 20 {
        bail!("an extension header of {size} bytes");
    }
    let mut v = vec![0u8; size.next_multiple_of(512) as usize];
    r.read_exact(&mut v)
        .map_err(|_| anyhow!("the archive ends inside an extension header"))?;
    v.truncate(size as usize);
    Ok(v)
}

fn until_nul(mut v: Vec<u8>) -> Vec<u8> {
    if let Some(i) = v.iter().position(|&b| b == 0) {
        v.truncate(i);
    }
    v
}

/// The header's checksum: the sum of its bytes with the checksum field as spaces (unsigned,
/// or signed as some old tars wrote it).
fn check_sum(h: &tar::Header) -> Result<()> {
    let b = h.as_bytes();
    let field = |i: usize| if (148..156).contains(&i) { b' ' } else { b[i] };
    let unsigned: u32 = (0..512).map(|i| field(i) as u32).sum();
    let signed: i32 = (0..512).map(|i| field(i) as i8 as i32).sum();
    let want = h
        .cksum()
        .map_err(|_| anyhow!("bad header (its checksum field is not a number)"))?;
    if want != unsigned && want as i32 != signed {
        bail!("bad header checksum (a damaged or truncated archive)");
    }
    Ok(())
}

/// PAX records: "LENGTH KEY=VALUE\n", LENGTH counting the whole record (values may hold
/// newlines and any byte).
fn parse_pax(mut d: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    while !d.is_empty() {
        if d.iter().all(|&b| b == 0) {
            break;
        }
        let sp = d
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| anyhow!("a malformed PAX record"))?;
        let len: usize = std::str::from_utf8(&d[..sp])
            .ok()
            .and_then(|l| l.parse().ok())
            .filter(|&l| l > sp + 2 && l <= d.len())
            .ok_or_else(|| anyhow!("a malformed PAX record"))?;
        let rec = &d[sp + 1..len];
        if rec.last() != Some(&b'\n') {
            bail!("a malformed PAX record");
        }
        let rec = &rec[..rec.len() - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| anyhow!("a malformed PAX record"))?;
        let key = std::str::from_utf8(&rec[..eq]).map_err(|_| anyhow!("a PAX key is not UTF-8"))?;
        out.push((key.to_string(), rec[eq + 1..].to_vec()));
        d = &d[len..];
    }
    Ok(out)
}

fn pax_num(v: &[u8]) -> Result<u64> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| anyhow!("a PAX number that is not one"))
}

/// What an entry makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Link,
    Symlink,
    Char,
    Block,
    Fifo,
}

/// What an entry says of itself, besides its data.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timestamp,
    atime: Option<Timestamp>,
    ctime: Option<Timestamp>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Unpacks archives into one directory of an image.
pub struct Unpacker<'a> {
    fs: &'a Fs,
    root: u32,
    /// Directories reached so far, by their path below `root` ("a/b"): no lookup per entry.
    dirs: HashMap<Vec<u8>, u32>,
    /// Directories whose times are set at the end: (inode, atime, mtime, ctime).
    dir_times: Vec<(u32, Timestamp, Timestamp, Timestamp)>,
    /// Who owns the directories the archive does not list.
    owner: (u32, u32),
    buf: Vec<u8>,
    batch: super::cp::Batch,
}

impl<'a> Unpacker<'a> {
    pub fn new(fs: &'a Fs, root: u32) -> Self {
        Unpacker {
            fs,
            root,
            dirs: HashMap::new(),
            dir_times: Vec::new(),
            owner: crate::image::caller(),
            buf: vec![0; 1 << 20],
            batch: Default::default(),
        }
    }

    /// Unpacks the archive at `path` (`-`: stdin), entry by entry in archive order. Errors
    /// name the entry.
    pub fn unpack(&mut self, path: &Path) -> Result<()> {
        for_each_member(path, &mut |m, data| self.entry(m, data))
    }

    /// Sets the directories' times (last, in reverse order of their entries).
    pub fn finish(self) -> Result<()> {
        for &(ino, atime, mtime, ctime) in self.dir_times.iter().rev() {
            let set = SetAttr {
                atime: Some(TimeSet::At(atime)),
                mtime: Some(TimeSet::At(mtime)),
                ctime: Some(ctime),
                ..Default::default()
            };
            self.fs.setattr(ino, &set)?;
        }
        Ok(())
    }

    /// The directory `comps` names below the root, made (0755, the caller's) where missing.
    /// Symlinks on the way are followed inside the image.
    fn dir(&mut self, comps: &[&[u8]]) -> Result<u32> {
        let mut cur = self.root;
        let mut key = Vec::new();
        for (i, c) in comps.iter().enumerate() {
            if i > 0 {
                key.push(b'/');
            }
            key.extend_from_slice(c);
            if let Some(&d) = self.dirs.get(&key) {
                cur = d;
                continue;
            }
            let fs = self.fs;
            cur = match fs.lookup(cur, c) {
                Ok(a) if a.is_dir() => a.ino,
                Ok(a) if a.mode & 0o170000 == 0o120000 => {
                    let t = fs.readlink(a.ino)?;
                    let ino =
                        crate::image::resolve_from(fs, cur, &String::from_utf8_lossy(&t), true)?;
                    if !fs.getattr(ino)?.is_dir() {
                        bail!("{}: not a directory", String::from_utf8_lossy(&key));
                    }
                    ino
                }
                Ok(_) => bail!("{}: not a directory", String::from_utf8_lossy(&key)),
                Err(Error::NotFound) => fs.mkdir(cur, c, 0o755, self.owner.0, self.owner.1)?.ino,
                Err(e) => return Err(e.into()),
            };
            self.dirs.insert(key.clone(), cur);
        }
        Ok(cur)
    }

    fn entry(&mut self, m: &Member, data: &mut dyn Read) -> Result<()> {
        let pax = &m.pax;
        let get = |k: &str| pax.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v);
        let h = &m.h;
        let kind = match h.entry_type().as_byte() {
            // Headers for the archive as a whole, a volume label: nothing to make.
            b'g' | b'V' => return Ok(()),
            // Regular, contiguous, GNU sparse (expanded by the tar crate).
            b'0' | 0 | b'7' | b'S' => Kind::File,
            b'1' => Kind::Link,
            b'2' => Kind::Symlink,
            b'3' => Kind::Char,
            b'4' => Kind::Block,
            // A directory, or GNU's dumpdir (a directory with a listing).
            b'5' | b'D' => Kind::Dir,
            b'6' => Kind::Fifo,
            c if c.is_ascii_graphic() => bail!("unknown entry type '{}'", c as char),
            c => bail!("unknown entry type {c:#04x}"),
        };
        let path = match get("GNU.sparse.name") {
            Some(n) => n.clone(),
            None => m.path.clone(),
        };
        let comps = clean_path(&path)?;
        let meta = member_meta(m, &path)?;
        let fs = self.fs;
        let Some((name, parent)) = comps.split_last() else {
            // The archive's own root ("./"): its attributes go onto the directory unpacked into.
            if kind != Kind::Dir {
                bail!("an entry with an empty name that is not a directory");
            }
            return self.apply(self.root, &path, &meta, true);
        };
        let dir = self.dir(parent)?;
        let key = comps.join(&b'/');
        let is_dir = kind == Kind::Dir;
        if !is_dir {
            self.dirs.remove(&key);
        }
        let (uid, gid) = (meta.uid, meta.gid);
        let ino = match kind {
            Kind::Dir => {
                let ino = match fs.lookup(dir, name) {
                    Ok(a) if a.is_dir() => a.ino,
                    _ => {
                        crate::image::make_room(fs, dir, name)?;
                        fs.mkdir(dir, name, meta.mode, uid, gid)?.ino
                    }
                };
                self.dirs.insert(key, ino);
                return self.apply(ino, &path, &meta, true);
            }
            Kind::Link => {
                let target = &m.link;
                let tc = clean_path(target)?;
                let (tn, tp) = tc
                    .split_last()
                    .ok_or_else(|| anyhow!("a hard link to the root"))?;
                let td = self.dir(tp)?;
                let t = fs.lookup(td, tn).map_err(|err| {
                    anyhow!("hard link to {}: {err}", String::from_utf8_lossy(target))
                })?;
                if t.is_dir() {
                    bail!("a hard link to a directory");
                }
                if t.ino == fs.lookup(dir, name).map(|a| a.ino).unwrap_or(0) {
                    return Ok(());
                }
                crate::image::make_room(fs, dir, name)?;
                fs.link(t.ino, dir, name)?;
                return Ok(());
            }
            Kind::Symlink => {
                if m.link.is_empty() {
                    bail!("a symlink without a target");
                }
                make_entry(fs, dir, name, NewEntry::Symlink(&m.link), 0o777, (uid, gid))?
            }
            Kind::Char | Kind::Block | Kind::Fifo => {
                // A FIFO has no device number (GNU tar leaves the fields blank).
                let (major, minor) = match kind {
                    Kind::Fifo => (0, 0),
                    _ => (
                        h.device_major()?.unwrap_or(0),
                        h.device_minor()?.unwrap_or(0),
                    ),
                };
                let rdev = (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12);
                let ft = match kind {
                    Kind::Char => 0o020000,
                    Kind::Block => 0o060000,
                    _ => 0o010000,
                };
                let special = NewEntry::Special(rdev);
                make_entry(fs, dir, name, special, ft | meta.mode, (uid, gid))?
            }
            Kind::File => {
                let ino = make_entry(fs, dir, name, NewEntry::File, meta.mode, (uid, gid))?;
                let size = if let Some((map, size)) = &m.gnu_sparse {
                    self.segments(data, ino, map, *size)?;
                    *size
                } else if get("GNU.sparse.name").is_some() || get("GNU.sparse.major").is_some() {
                    self.pax_sparse(data, ino, pax)?
                } else {
                    self.copy_data(data, ino, 0, m.size)?;
                    m.size
                };
                if fs.getattr(ino)?.size != size {
                    fs.truncate(ino, size)?;
                }
                ino
            }
        };
        self.apply(ino, &path, &meta, false)
    }

    /// Extended attributes, owner, mode and times (a directory's times at the end).
    fn apply(&mut self, ino: u32, path: &[u8], m: &Meta, dir: bool) -> Result<()> {
        let fs = self.fs;
        for (name, value) in &m.xattrs {
            if let Err(e) = fs.setxattr(ino, name, value, XattrFlags::Any) {
                warn(path, &String::from_utf8_lossy(name), e);
            }
        }
        let symlink = fs.getattr(ino)?.mode & 0o170000 == 0o120000;
        let atime = m.atime.unwrap_or(m.mtime);
        let ctime = m.ctime.unwrap_or(m.mtime);
        let set = SetAttr {
            mode: (!symlink).then_some(m.mode),
            uid: Some(m.uid),
            gid: Some(m.gid),
            atime: (!dir).then_some(TimeSet::At(atime)),
            mtime: (!dir).then_some(TimeSet::At(m.mtime)),
            ctime: Some(ctime),
            ..Default::default()
        };
        fs.setattr(ino, &set)?;
        if dir {
            self.dir_times.push((ino, atime, m.mtime, ctime));
        }
        self.batch.made_one(fs)
    }

    /// Copies `len` bytes from `r` to file `ino` at `off`, leaving blocks that are all zeros
    /// unwritten (holes).
    fn copy_data(&mut self, r: &mut dyn Read, ino: u32, off: u64, len: u64) -> Result<()> {
        let bs = self.fs.geo.block_size as u64;
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let want = ((end - pos) as usize).min(self.buf.len());
            let buf = &mut self.buf[..want];
            r.read_exact(buf).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => anyhow!("the archive ends inside this file"),
                _ => e.into(),
            })?;
            // Runs of blocks (aligned in the file) that are not all zeros.
            let mut i = 0usize;
            while i < want {
                let blk_end = |i: usize| {
                    let a = pos + i as u64;
                    (((a / bs + 1) * bs - pos) as usize).min(want)
                };
                let e0 = blk_end(i);
                if buf[i..e0].iter().all(|&b| b == 0) {
                    i = e0;
                    continue;
                }
                let start = i;
                let mut j = e0;
                while j < want {
                    let e1 = blk_end(j);
                    if buf[j..e1].iter().all(|&b| b == 0) {
                        break;
                    }
                    j = e1;
                }
                self.fs.write_all(ino, pos + start as u64, &buf[start..j])?;
                i = j;
            }
            pos += want as u64;
        }
        Ok(())
    }

    /// A PAX sparse file (GNU tar's formats 0.0, 0.1 and 1.0): its map, then the data of each
    /// segment in turn. Returns the file's size.
    fn pax_sparse(
        &mut self,
        data: &mut dyn Read,
        ino: u32,
        pax: &[(String, Vec<u8>)],
    ) -> Result<u64> {
        let get = |k: &str| pax.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v);
        let num = |v: &[u8]| -> Result<u64> {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| anyhow!("bad number in a sparse map"))
        };
        let size = match get("GNU.sparse.realsize").or(get("GNU.sparse.size")) {
            Some(v) => num(v)?,
            None => bail!("a sparse file without its size"),
        };
        let mut map: Vec<(u64, u64)> = Vec::new();
        let major = get("GNU.sparse.major").map(|v| num(v)).transpose()?;
        let mut r = BufReader::new(data);
        if major == Some(1) {
            // 1.0: the map is at the start of the data, decimal lines, padded to 512 bytes.
            let mut used = 0u64;
            let mut line = |r: &mut BufReader<&mut dyn Read>| -> Result<u64> {
                let mut s = Vec::new();
                let n = r.read_until(b'\n', &mut s)?;
                if n == 0 || n > 32 {
                    bail!("bad sparse map");
                }
                used += n as u64;
                num(&s)
            };
            let count = line(&mut r)?;
            if count > 1 << 24 {
                bail!("bad sparse map");
            }
            for _ in 0..count {
                let o = line(&mut r)?;
                let l = line(&mut r)?;
                map.push((o, l));
            }
            let pad = (512 - used % 512) % 512;
            std::io::copy(&mut (&mut r).take(pad), &mut std::io::sink())?;
        } else if let Some(m) = get("GNU.sparse.map") {
            let v: Vec<u64> = m.split(|&b| b == b',').map(num).collect::<Result<_>>()?;
            if !v.len().is_multiple_of(2) {
                bail!("bad sparse map");
            }
            map = v.chunks(2).map(|c| (c[0], c[1])).collect();
        } else {
            // 0.0: offset and numbytes pairs, repeated in order.
            let mut off = None;
            for (k, v) in pax {
                match k.as_str() {
                    "GNU.sparse.offset" => off = Some(num(v)?),
                    "GNU.sparse.numbytes" => {
                        let o = off.take().ok_or_else(|| anyhow!("bad sparse map"))?;
                        map.push((o, num(v)?));
                    }
                    _ => {}
                }
            }
        }
        self.segments(&mut r, ino, &map, size)?;
        Ok(size)
    }

    /// The data of a sparse file's segments, stored one after the other.
    fn segments(
        &mut self,
        r: &mut dyn Read,
        ino: u32,
        map: &[(u64, u64)],
        size: u64,
    ) -> Result<()> {
        for &(o, l) in map {
            if o.checked_add(l).is_none_or(|end| end > size) {
                bail!("a sparse segment lies past the file's end");
            }
            self.copy_data(r, ino, o, l)?;
        }
        Ok(())
    }
}

fn warn(path: &[u8], name: &str, e: impl std::fmt::Display) {
    eprintln!(
        "uext4: warning: {}: extended attribute {name} not set: {e}",
        String::from_utf8_lossy(path)
    );
}

/// A member's owner, mode, times and extended attributes (PAX records win over the header).
fn member_meta(m: &Member, path: &[u8]) -> Result<Meta> {
    let pax = &m.pax;
    let get = |k: &str| pax.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v);
    let h = &m.h;
    let num = |v: u64, what: &str| -> Result<u32> {
        u32::try_from(v).map_err(|_| anyhow!("{what} {v} does not fit in 32 bits"))
    };
    let mtime = match get("mtime") {
        Some(v) => pax_time(v).ok_or_else(|| anyhow!("bad PAX mtime"))?,
        None => Timestamp {
            sec: h.mtime()? as i64,
            nsec: 0,
        },
    };
    let id = |k: &str, v: u64| -> Result<u32> {
        match get(k) {
            Some(p) => num(pax_num(p)?, k),
            None => num(v, k),
        }
    };
    let mut meta = Meta {
        mode: h.mode()? & 0o7777,
        uid: id("uid", h.uid()?)?,
        gid: id("gid", h.gid()?)?,
        mtime,
        atime: get("atime").and_then(|v| pax_time(v)),
        ctime: get("ctime").and_then(|v| pax_time(v)),
        xattrs: Vec::new(),
    };
    for (k, v) in pax {
        if let Some(n) = k.strip_prefix("SCHILY.xattr.") {
            meta.xattrs.push((n.as_bytes().to_vec(), v.clone()));
        } else if let Some(which) = k.strip_prefix("SCHILY.acl.") {
            let name = match which {
                "access" => "system.posix_acl_access",
                "default" => "system.posix_acl_default",
                _ => continue,
            };
            match acl_text_to_vfs(v) {
                Ok(a) => meta.xattrs.push((name.as_bytes().to_vec(), a)),
                Err(err) => warn(path, name, err),
            }
        }
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined() {
        assert_eq!(clean_path(b"/a//./b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(clean_path(b"./").unwrap().is_empty());
        assert!(clean_path(b"a/../../etc").is_err());
        assert!(clean_path(b"..").is_err());
    }

    #[test]
    fn pax_times() {
        let t = pax_time(b"1700000000.5").unwrap();
        assert_eq!((t.sec, t.nsec), (1700000000, 500_000_000));
        let t = pax_time(b"-1.25").unwrap();
        assert_eq!((t.sec, t.nsec), (-2, 750_000_000));
        assert!(pax_time(b"x").is_none());
    }

    #[test]
    fn text_acls() {
        let v =
            acl_text_to_vfs(b"user::rw-,user:1000:r--,group::r--,mask::r--,other::---").unwrap();
        assert_eq!(v.len(), 4 + 5 * 8);
        assert!(acl_text_to_vfs(b"user:bob:r--").is_err());
    }
}
