//! What the harnesses share: the seed images (made by scripts/fuzz-seeds.sh, never committed),
//! the metadata regions found in each by reading it with the engine, the edits a fuzz input
//! decodes to, and the walk that reads everything an image holds.
//!
//! The harnesses are structure-aware: an input is a seed choice and a list of edits, each
//! aimed at a block the engine read while opening and walking the pristine seed (superblock,
//! group descriptors, bitmaps, inode tables, extent and index blocks, directory and htree
//! blocks, xattr blocks, the journal, the orphan file), so every mutation lands in a structure
//! and not in free space.

use arbitrary::{Result as AResult, Unstructured};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use uext4::blockdev::{BlockDevice, MemDevice};
use uext4::{Fs, MountOptions};

/// Where the seeds are: `UEXT4_FUZZ_SEEDS`, or target/fuzz-seeds/images of the checkout.
pub fn seeds_dir() -> PathBuf {
    match std::env::var_os("UEXT4_FUZZ_SEEDS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/fuzz-seeds/images"
        )),
    }
}

/// One seed image and the blocks the engine reads from it.
pub struct Seed {
    /// The file name, for messages.
    pub name: String,
    /// The image's bytes.
    pub bytes: Vec<u8>,
    /// The filesystem block size.
    pub block_size: usize,
    /// Byte ranges (offset, length) the engine read: where edits land.
    pub regions: Vec<(usize, usize)>,
}

/// A device that remembers which blocks were read (to find a seed's metadata).
struct Reads {
    inner: MemDevice,
    read: Mutex<Vec<(u64, usize)>>,
}

impl BlockDevice for Reads {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read.lock().unwrap().push((off, buf.len()));
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// The superblock's block size (log_block_size at byte 1024 + 24).
fn block_size_of(img: &[u8]) -> usize {
    let log = u32::from_le_bytes(img[1048..1052].try_into().unwrap());
    1024usize << log.min(6)
}

/// Loads the seed images whose names `pick` accepts, each with the blocks `exercise` reads.
fn load(pick: impl Fn(&str) -> bool, exercise: impl Fn(Arc<dyn BlockDevice>)) -> Vec<Seed> {
    let dir = seeds_dir();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (make the seeds first: scripts/fuzz-seeds.sh)",
                dir.display()
            )
        })
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".img") && pick(n))
        .collect();
    names.sort();
    let mut seeds = Vec::new();
    for name in names {
        let bytes = std::fs::read(dir.join(&name)).unwrap();
        let bs = block_size_of(&bytes);
        let dev = Arc::new(Reads {
            inner: MemDevice::from_vec(bytes.clone()),
            read: Mutex::new(Vec::new()),
        });
        exercise(dev.clone());
        let mut blocks: Vec<usize> = Vec::new();
        for &(off, len) in dev.read.lock().unwrap().iter() {
            let first = off as usize / bs;
            let last = (off as usize + len.max(1) - 1) / bs;
            // A long read is file data or a table read at once: keep its first blocks.
            blocks.extend(first..=last.min(first + 16));
        }
        blocks.sort_unstable();
        blocks.dedup();
        let mut regions: Vec<(usize, usize)> = blocks.iter().map(|&b| (b * bs, bs)).collect();
        // The superblock on its own, whatever the block size.
        regions.push((1024, 1024));
        regions.retain(|&(o, l)| o + l <= bytes.len());
        seeds.push(Seed {
            name,
            bytes,
            block_size: bs,
            regions,
        });
    }
    assert!(
        !seeds.is_empty(),
        "no seed images in {} (scripts/fuzz-seeds.sh makes them)",
        dir.display()
    );
    seeds
}

/// The seeds for the harnesses that read images: every image, with the blocks a read-only
/// open and a walk read.
pub fn image_seeds() -> &'static [Seed] {
    static S: OnceLock<Vec<Seed>> = OnceLock::new();
    S.get_or_init(|| {
        load(
            |_| true,
            |dev| {
                if let Ok(fs) = Fs::open_dev(dev, MountOptions::ro()) {
                    let _ = walk(&fs);
                }
            },
        )
    })
}

/// The seeds with a journal to replay, with the blocks a read-write open (the replay) reads.
pub fn journal_seeds() -> &'static [Seed] {
    static S: OnceLock<Vec<Seed>> = OnceLock::new();
    S.get_or_init(|| {
        load(
            |n| n.starts_with("journal-"),
            |dev| {
                if let Ok(fs) = Fs::open_dev(dev, quiet_rw()) {
                    let _ = fs.unmount();
                }
            },
        )
    })
}

/// Read-write options for a harness: no background commits, small caches.
pub fn quiet_rw() -> MountOptions {
    MountOptions {
        commit_interval_secs: 0,
        cache_limit_bytes: 4 << 20,
        inode_cache_limit: 1024,
        ..MountOptions::default()
    }
}

/// Values an edit writes: the ones that find bounds bugs.
const INTERESTING: [u32; 16] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x10000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    12,
];

/// Applies the edits `u` decodes to a copy of `seed`: each picks a region and an offset in it,
/// then flips bits, writes a byte, a 16-bit or 32-bit value (little or big endian: ext4 or
/// jbd2), or copies bytes from another region (a pointer or a header moved elsewhere).
pub fn mutate(seed: &Seed, u: &mut Unstructured) -> AResult<Vec<u8>> {
    let mut img = seed.bytes.clone();
    let n = u.int_in_range(1..=12)?;
    for _ in 0..n {
        let (base, len) = seed.regions[u.choose_index(seed.regions.len())?];
        let at = base + u.choose_index(len)?;
        let room = base + len - at;
        match u.int_in_range(0..=6u8)? {
            0 => img[at] ^= 1 << u.int_in_range(0..=7)?,
            1 => img[at] = u.arbitrary()?,
            2 | 3 if room >= 2 => {
                let v = *u.choose(&INTERESTING)? as u16;
                let v = v.wrapping_add(u.int_in_range(0..=2)?);
                let b = if u.arbitrary()? {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                img[at..at + 2].copy_from_slice(&b);
            }
            4 if room >= 4 => {
                let v = if u.arbitrary()? {
                    *u.choose(&INTERESTING)?
                } else {
                    u.arbitrary()?
                };
                let b = if u.arbitrary()? {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                img[at..at + 4].copy_from_slice(&b);
            }
            5 => {
                let (from, flen) = seed.regions[u.choose_index(seed.regions.len())?];
                let k = u.int_in_range(1..=64usize)?.min(room).min(flen);
                let src = from + u.choose_index(flen - k + 1)?;
                img.copy_within(src..src + k, at);
            }
            _ => {
                let k = u.int_in_range(1..=16usize)?.min(room);
                img[at..at + k].fill(if u.arbitrary()? { 0 } else { 0xff });
            }
        }
    }
    Ok(img)
}

/// The image an input's first bytes describe: a seed of `seeds` they pick, with its edits applied; None
/// for an input too short to say, or an image that turns on MMP (see [`has_mmp`]).
pub fn mutated_image(seeds: &[Seed], u: &mut Unstructured) -> Option<Vec<u8>> {
    let i = u.choose_index(seeds.len()).ok()?;
    let img = mutate(&seeds[i], u).ok()?;
    (!has_mmp(&img)).then_some(img)
}

/// Whether the image turns on multi-mount protection (incompat 0x100): an open then waits
/// out the MMP interval, as the kernel does, up to minutes: not a hang worth reporting.
pub fn has_mmp(img: &[u8]) -> bool {
    img.len() >= 2048
        && u32::from_le_bytes(img[1024 + 0x60..1024 + 0x64].try_into().unwrap()) & 0x100 != 0
}

/// Walks the whole tree from the root, reading what each entry holds: entries, attributes,
/// file contents (the first 256 KiB), symlinks, xattrs. Bounded whatever the image says.
pub fn walk(fs: &Fs) -> uext4::Result<usize> {
    let mut stack = vec![uext4::ROOT_INO];
    let mut seen = std::collections::HashSet::new();
    let mut n = 0usize;
    let mut buf = vec![0u8; 65536];
    while let Some(d) = stack.pop() {
        if !seen.insert(d) || seen.len() > 2000 {
            continue;
        }
        let mut entries = Vec::new();
        let r = fs.readdir(d, 0, &mut |e| {
            entries.push(e);
            entries.len() < 5000
        });
        if r.is_err() {
            continue;
        }
        for e in entries {
            n += 1;
            if e.name == b"." || e.name == b".." || n > 20_000 {
                continue;
            }
            let Ok(a) = fs.lookup(d, &e.name) else {
                continue;
            };
            let _ = fs.getattr(a.ino);
            match a.mode & uext4::S_IFMT {
                uext4::S_IFDIR => stack.push(a.ino),
                uext4::S_IFREG => {
                    let mut off = 0u64;
                    while off < a.size.min(256 << 10) {
                        match fs.read(a.ino, off, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(r) => off += r as u64,
                        }
                    }
                }
                uext4::S_IFLNK => {
                    let _ = fs.readlink(a.ino);
                }
                _ => {}
            }
            if let Ok(names) = fs.listxattr(a.ino) {
                for x in names.iter().take(64) {
                    let _ = fs.getxattr(a.ino, x);
                }
            }
        }
    }
    Ok(n)
}

/// Opens `img` read-only over a device in memory, walks it, and checks that not one byte was
/// written (a read-only open replays a journal into memory only).
pub fn read_only_walk(img: Vec<u8>) {
    let dev = Arc::new(MemDevice::from_vec(img.clone()));
    if let Ok(fs) = Fs::open_dev(dev.clone(), MountOptions::ro()) {
        let _ = walk(&fs);
        drop(fs);
    }
    assert!(dev.to_vec() == img, "a read-only open wrote to the image");
}

/// A new, empty 4 MiB ext4 image (uext4's mkfs, mke2fs's defaults for the size), made once.
pub fn empty_image() -> &'static [u8] {
    static S: OnceLock<Vec<u8>> = OnceLock::new();
    S.get_or_init(|| {
        let size = 4u64 << 20;
        let dev = MemDevice::new(size);
        let opts = uext4::mkfs::MkfsOptions::like_mke2fs(size, None);
        uext4::mkfs::mkfs(&dev, &opts).expect("mkfs of the harness's empty image");
        dev.to_vec()
    })
}

/// A file of this process's own for an input a tool reads by path (a tar archive, a device
/// table), on tmpfs where there is one.
pub fn input_file(name: &str, data: &[u8]) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = dir.join(format!("uext4-fuzz-{}-{name}", std::process::id()));
    std::fs::write(&p, data).expect("writing the harness's input file");
    p
}

/// Directories of a walked image that the write harness works in: the root and those below it.
fn dirs_of(fs: &Fs) -> Vec<u32> {
    let mut dirs = vec![uext4::ROOT_INO];
    for path in [&[&b"d"[..]][..], &[b"big"], &[b"d", b"e"], &[b"lost+found"]] {
        let mut at = uext4::ROOT_INO;
        let mut ok = true;
        for c in path {
            match fs.lookup(at, c) {
                Ok(a) => at = a.ino,
                Err(_) => ok = false,
            }
        }
        if ok {
            dirs.push(at);
        }
    }
    dirs
}

/// Names in `dir` (the first 64), to aim the operations at entries that exist.
fn names_in(fs: &Fs, dir: u32) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let _ = fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            v.push(e.name);
        }
        v.len() < 64
    });
    v
}

/// Runs the operations `u` decodes on an image opened read-write: create, mkdir, write,
/// truncate, punch, rename, unlink, rmdir, xattrs, on entries that exist and new ones.
pub fn operate(fs: &Fs, u: &mut Unstructured) -> AResult<()> {
    let dirs = dirs_of(fs);
    let n = u.int_in_range(1..=10)?;
    for _ in 0..n {
        let dir = *u.choose(&dirs)?;
        let names = names_in(fs, dir);
        let existing = |u: &mut Unstructured| -> AResult<Vec<u8>> {
            if names.is_empty() || u.ratio(1, 4)? {
                Ok(format!("n{}", u.int_in_range(0..=9u8)?).into_bytes())
            } else {
                Ok(u.choose(&names)?.clone())
            }
        };
        let name = existing(u)?;
        let ino = fs.lookup(dir, &name).map(|a| a.ino);
        match u.int_in_range(0..=10u8)? {
            0 => drop(fs.create(dir, &name, 0o100644, 0, 0)),
            1 => drop(fs.mkdir(dir, &name, 0o40755, 0, 0)),
            2 | 3 => {
                if let Ok(ino) = ino {
                    let off = u.int_in_range(0..=(1u64 << 20))?;
                    let len = u.int_in_range(1..=70_000usize)?;
                    let _ = fs.write(ino, off, &vec![0x5a; len]);
                }
            }
            4 => {
                if let Ok(ino) = ino {
                    let _ = fs.truncate(ino, u.int_in_range(0..=(1u64 << 20))?);
                }
            }
            5 => {
                if let Ok(ino) = ino {
                    let off = u.int_in_range(0..=(1u64 << 19))?;
                    let len = u.int_in_range(1..=(1u64 << 18))?;
                    let _ = fs.fallocate(ino, uext4::FALLOC_FL_PUNCH_HOLE | 1, off, len);
                }
            }
            6 => {
                let to_dir = *u.choose(&dirs)?;
                let to = existing(u)?;
                let _ = fs.rename(dir, &name, to_dir, &to, Default::default());
            }
            7 => drop(fs.unlink(dir, &name)),
            8 => drop(fs.rmdir(dir, &name)),
            9 => {
                if let Ok(ino) = ino {
                    let len = u.int_in_range(0..=1500usize)?;
                    let _ = fs.setxattr(ino, b"user.f", &vec![7; len], uext4::XattrFlags::Any);
                }
            }
            _ => {
                if let Ok(ino) = ino {
                    let _ = fs.removexattr(ino, b"user.small");
                    let _ = fs.removexattr(ino, b"user.big");
                }
            }
        }
    }
    Ok(())
}
