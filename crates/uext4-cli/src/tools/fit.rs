//! `mkfs --size fit`: the smallest image that holds a tree or an archive with a share of it
//! left free, computed before anything is written (never by shrinking afterwards).
//!
//! The input is walked once and what it needs is counted for both block sizes mke2fs may
//! choose (1 KiB below 512 MiB, 4 KiB above): data blocks (holes skipped), extent index (or
//! indirect) blocks, directory blocks (an htree's leaves counted half full), long symlinks'
//! blocks, xattr blocks for attributes that do not fit in the inode, and inodes (hard links
//! once). What a filesystem of a given size offers is not estimated but measured: the
//! candidate is made by the engine's own mkfs (the same options: inode ratio or count, inode
//! size, reserve, journal, features) into a sparse device in memory, and its superblock's free
//! counts are read. The size is then searched for (in MiB): the smallest where the free
//! blocks, less the reserved ones and what the input needs, are at least PERCENT of all blocks,
//! and the free inodes, less those needed, at least PERCENT of all inodes.

use anyhow::{bail, Result};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use uext4::blockdev::BlockDevice;

/// What an input needs, for 1 KiB and 4 KiB blocks.
#[derive(Default, Debug, Clone, Copy)]
pub struct Need {
    pub blocks: [u64; 2],
    pub inodes: u64,
}

const SIZES: [u64; 2] = [1024, 4096];

impl Need {
    fn for_block_size(&self, bs: u32) -> u64 {
        self.blocks[(bs == 4096) as usize]
    }

    /// A regular file with data in `segs` (offset, length); the rest are holes.
    fn file(&mut self, segs: &[(u64, u64)], extents: bool) {
        let segments = segs.len() as u64;
        for (i, bs) in SIZES.iter().enumerate() {
            let d: u64 = segs
                .iter()
                .filter(|s| s.1 > 0)
                .map(|&(o, l)| (o + l).div_ceil(*bs) - o / bs)
                .sum();
            let meta = if extents {
                // At most 32768 blocks an extent; four in the inode, 340 (or 84) an index block.
                let ext = segments + d / 32768;
                let per = (bs - 12) / 12;
                if ext <= 4 {
                    0
                } else {
                    ext.div_ceil(per) + ext.div_ceil(per * per)
                }
            } else {
                let apb = bs / 4;
                if d <= 12 {
                    0
                } else {
                    d.div_ceil(apb) + d.div_ceil(apb * apb) + 2
                }
            };
            self.blocks[i] += d + meta;
        }
    }

    /// A directory of `entries` names whose lengths add up to `name_bytes`.
    fn dir(&mut self, entries: u64, name_bytes: u64) {
        let bytes = 24 + entries * 8 + name_bytes + entries * 3;
        for (i, bs) in SIZES.iter().enumerate() {
            let usable = bs - 12;
            self.blocks[i] += if bytes <= usable {
                1
            } else {
                // An htree: a root block, leaves about half full after splits, index blocks.
                let leaves = bytes.div_ceil(usable / 2);
                1 + leaves + leaves / ((bs - 8) / 8)
            };
        }
    }

    /// A symlink to `len` bytes (60 and over take a block).
    fn symlink(&mut self, len: u64) {
        if len >= 60 {
            self.blocks[0] += len.div_ceil(1024);
            self.blocks[1] += 1;
        }
    }

    /// Extended attributes of `bytes` (names and values with their entry headers): a block
    /// when they do not fit in the inode.
    fn xattrs(&mut self, bytes: u64, inode_size: u16) {
        let in_inode = (inode_size as u64).saturating_sub(128 + 32 + 4);
        if bytes > in_inode {
            self.blocks[0] += bytes.div_ceil(1024 - 32);
            self.blocks[1] += bytes.div_ceil(4096 - 32);
        }
    }
}

fn xattr_bytes<'a>(list: impl Iterator<Item = (&'a [u8], usize)>) -> u64 {
    list.map(|(n, v)| 16 + (n.len() as u64).next_multiple_of(4) + (v as u64).next_multiple_of(4))
        .sum()
}

/// What the host tree `root` needs (its contents; the root directory is the image's own).
pub fn measure_tree(root: &Path, inode_size: u16, extents: bool) -> Result<Need> {
    let mut need = Need::default();
    let mut links = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let (mut entries, mut names) = (0u64, 0u64);
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            // The status relative to the directory read (not following a symlink).
            let md = e.metadata()?;
            entries += 1;
            names += e.file_name().len() as u64;
            if md.nlink() > 1 && !md.is_dir() && !links.insert((md.dev(), md.ino())) {
                continue;
            }
            need.inodes += 1;
            let ft = md.file_type();
            if ft.is_dir() {
                stack.push(p.clone());
            } else if ft.is_symlink() {
                need.symlink(md.len());
            } else if ft.is_file() && md.blocks() * 512 < md.len() {
                // Fewer blocks than bytes: holes to skip.
                let f = std::fs::File::open(&p)?;
                need.file(&crate::host::host_segments(&f, md.len()), extents);
            } else if ft.is_file() && md.len() > 0 {
                need.file(&[(0, md.len())], extents);
            }
            if let Ok(x) = crate::host::host_xattrs(&p) {
                need.xattrs(
                    xattr_bytes(x.iter().map(|(n, v)| (&n[..], v.len()))),
                    inode_size,
                );
            }
        }
        need.dir(entries, names);
    }
    Ok(need)
}

/// What the archive at `path` needs.
pub fn measure_archive(path: &Path, inode_size: u16, extents: bool) -> Result<Need> {
    let mut need = Need::default();
    // Per directory (by path): entries and name bytes.
    let mut dirs: HashMap<Vec<u8>, (u64, u64)> = HashMap::new();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    crate::tools::tar::for_each_member(path, &mut |m, _data| {
        let kind = m.h.entry_type().as_byte();
        if matches!(kind, b'g' | b'V') {
            return Ok(());
        }
        let path = m
            .pax
            .iter()
            .rev()
            .find(|(k, _)| k == "GNU.sparse.name")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| m.path.clone());
        let comps = crate::image::clean_path(&path)?;
        let Some((name, parent)) = comps.split_last() else {
            return Ok(());
        };
        let key = comps.join(&b'/');
        // A later entry of the same name replaces the earlier one: counted once.
        if !seen.insert(key.clone()) {
            return Ok(());
        }
        let d = dirs.entry(parent.join(&b'/')).or_default();
        d.0 += 1;
        d.1 += name.len() as u64;
        match kind {
            b'1' => return Ok(()),
            b'5' | b'D' => {
                dirs.entry(key).or_default();
            }
            b'2' => need.symlink(m.link.len() as u64),
            b'3' | b'4' | b'6' => {}
            _ => match &m.gnu_sparse {
                Some((map, _)) => need.file(map, extents),
                None => need.file(&[(0, m.size)], extents),
            },
        }
        need.inodes += 1;
        let x = m
            .pax
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("SCHILY.xattr.")?.as_bytes(), v.len())));
        need.xattrs(xattr_bytes(x), inode_size);
        Ok(())
    })?;
    // Directories the archive does not list are made.
    let listed: Vec<Vec<u8>> = dirs.keys().cloned().collect();
    for k in listed {
        let mut p = &k[..];
        while let Some(i) = p.iter().rposition(|&b| b == b'/') {
            p = &p[..i];
            if !dirs.contains_key(p) {
                dirs.insert(p.to_vec(), (1, 0));
                need.inodes += 1;
            }
        }
    }
    for (k, (entries, names)) in dirs {
        // The root is the image's own directory: its blocks count too.
        let _ = k;
        need.dir(entries, names);
    }
    Ok(need)
}

/// A device in memory that holds only the blocks written (mkfs of a candidate size).
struct Sparse {
    size: u64,
    pages: parking_lot::Mutex<HashMap<u64, Box<[u8]>>>,
}

const PAGE: u64 = 4096;

impl BlockDevice for Sparse {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let pages = self.pages.lock();
        for (i, b) in buf.iter_mut().enumerate() {
            let a = off + i as u64;
            *b = pages.get(&(a / PAGE)).map_or(0, |p| p[(a % PAGE) as usize]);
        }
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if off + buf.len() as u64 > self.size {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"));
        }
        let mut pages = self.pages.lock();
        let mut i = 0usize;
        while i < buf.len() {
            let a = off + i as u64;
            let (pg, at) = (a / PAGE, (a % PAGE) as usize);
            let n = (PAGE as usize - at).min(buf.len() - i);
            let chunk = &buf[i..i + n];
            if let Some(p) = pages.get_mut(&pg) {
                p[at..at + n].copy_from_slice(chunk);
            } else if chunk.iter().any(|&b| b != 0) {
                let mut p = vec![0u8; PAGE as usize].into_boxed_slice();
                p[at..at + n].copy_from_slice(chunk);
                pages.insert(pg, p);
            }
            i += n;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn zeroes_cheaply(&self) -> bool {
        true
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        let mut pages = self.pages.lock();
        let mut a = off;
        while a < off + len {
            let (pg, at) = (a / PAGE, (a % PAGE) as usize);
            let n = ((PAGE as usize - at) as u64).min(off + len - a) as usize;
            if let Some(p) = pages.get_mut(&pg) {
                p[at..at + n].fill(0);
            }
            a += n as u64;
        }
        Ok(())
    }
}

/// What a filesystem made with `opts` offers: (blocks, free blocks less the reserve, inodes,
/// free inodes, block size).
fn offers(opts: &uext4::mkfs::MkfsOptions) -> Result<(u64, u64, u64, u64, u32)> {
    let dev = Sparse {
        size: opts.size,
        pages: Default::default(),
    };
    let mut o = opts.clone();
    o.assume_zeroed = true;
    uext4::mkfs::mkfs(&dev, &o)?;
    let mut b = vec![0u8; 1024];
    dev.read_at(1024, &mut b)?;
    let sb = uext4::format::superblock::Superblock::from_bytes(&b);
    Ok((
        sb.blocks_count(),
        sb.free_blocks_count().saturating_sub(sb.r_blocks_count()),
        sb.inodes_count() as u64,
        sb.free_inodes_count() as u64,
        sb.block_size(),
    ))
}

/// The smallest size (a whole number of MiB) whose filesystem, made by `make(size)`, holds
/// `need` with `percent` of its blocks and inodes still free.
pub fn fit(
    need: &Need,
    percent: f64,
    make: &dyn Fn(u64) -> uext4::mkfs::MkfsOptions,
) -> Result<u64> {
    const MIB: u64 = 1 << 20;
    let holds = |mib: u64| -> bool {
        let o = make(mib * MIB);
        match offers(&o) {
            Ok((blocks, avail, inodes, free_inodes, bs)) => {
                let nb = need.for_block_size(bs);
                let left_b = avail as f64 - nb as f64;
                let left_i = free_inodes as f64 - need.inodes as f64;
                left_b >= blocks as f64 * percent / 100.0
                    && left_i >= (inodes as f64 * percent / 100.0).max(0.0)
                    && left_b >= 0.0
                    && left_i >= 0.0
            }
            Err(_) => false,
        }
    };
    // The block size changes at 512 MiB (mke2fs's "small" type): search below it first.
    let mut lo = 1u64;
    let mut hi = 2u64;
    while !holds(hi) {
        lo = hi;
        hi *= 2;
        if hi > 64 << 20 {
            bail!("the input does not fit in any size up to 64 TiB");
        }
    }
    if hi > 512 && lo < 511 && holds(511) {
        hi = 511;
    } else if hi > 512 {
        lo = lo.max(511);
    }
    // lo does not hold (or is the floor), hi holds.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * MIB)
}
