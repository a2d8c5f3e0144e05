//! What every tool shares: where an image is (IMAGE, IMAGE@N, IMAGE@offset=..., an NBD URI,
//! IMAGE:PATH), opening it, the caller's identity, and finding paths inside it. The tools
//! import these; nothing here imports a tool.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uext4::blockdev::{BlockDevice, Region};
use uext4::image::open_image;
use uext4::partition::{identify, Contents, Table};
use uext4::{Error, Fs, MountOptions};

/// A mistake in how a command was called, found after clap parsed it (a size that is not
/// one, IMAGE without `:PATH`): exit status 2, as clap's own usage errors.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Whether `e` is a usage mistake ([`Usage`], under any context).
pub fn is_usage(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Usage>())
}

/// An error as one line for the user: its chain joined by ": ", without the "(os error N)"
/// that std appends to system errors (the words before it say the same).
pub fn plain(e: &anyhow::Error) -> String {
    let mut s = format!("{e:#}");
    while let Some(at) = s.find(" (os error ") {
        match s[at..].find(')') {
            Some(end) => s.replace_range(at..at + end + 1, ""),
            None => break,
        }
    }
    s
}

/// What stops a command from using `path` as its image, in the one wording every command
/// uses: the path, what is wrong, what to do. Missing, a directory, or not readable (with
/// `write`, not writable) by this user; `Ok` when none of these (an NBD URI is not checked).
pub(crate) fn check_image(path: &Path, write: bool) -> Result<()> {
    if uext4::image::is_nbd_uri(path) {
        return Ok(());
    }
    let p = path.display();
    // Named by what this user lacks, so that one image reads the same from every command.
    let denied = |what: &str| {
        anyhow!("{p}: permission denied (this user may not {what} it; run as one who may, or with sudo)")
    };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{p}: no such image file (check the name; uext4 mkfs --size SIZE {p} makes a new one)"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(denied("reach")),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            bail!("{p}: no such image file (a part of the path is not a directory)")
        }
        Ok(m) if m.is_dir() => {
            bail!("{p}: is a directory, not an image (name an image file or a block device)")
        }
        _ => {}
    }
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| anyhow!("{p}: a path with a NUL byte"))?;
    for (mode, what) in [(libc::R_OK, "read"), (libc::W_OK, "write")] {
        if mode == libc::W_OK && !write {
            break;
        }
        // SAFETY: a valid C string.
        if unsafe { libc::access(c.as_ptr(), mode) } != 0
            && matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EACCES | libc::EPERM)
            )
        {
            return Err(denied(what));
        }
    }
    Ok(())
}

/// Parses a size like 4096, 64K, 64M, 2G, 1T (the library's reading); a mistake is a usage
/// one.
pub fn parse_size(s: &str) -> Result<u64> {
    uext4::image_name::parse_size(s).map_err(usage)
}

/// A mistake the library found in a name (a size, what follows an `@`), as a usage mistake.
fn usage(e: Error) -> anyhow::Error {
    Usage(lib_message(e)).into()
}

/// The library's message for a mistake in a name, without its "invalid argument: " kind.
fn lib_message(e: Error) -> String {
    match e {
        Error::Invalid(m) => m,
        e => e.to_string(),
    }
}

pub use uext4::Within;

/// An image file, and where in it the filesystem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Img {
    pub path: PathBuf,
    pub within: Within,
}

impl Img {
    /// The image as written on the command line: `disk.img`, `disk.img@2`,
    /// `disk.img@offset=1048576`.
    pub fn name(&self) -> String {
        self.lib().name()
    }

    /// The library's name for it.
    fn lib(&self) -> uext4::ImageName {
        uext4::ImageName {
            path: self.path.clone(),
            within: self.within,
        }
    }

    /// Where the filesystem lies in the file (`None`: the whole file). Reads the partition
    /// table for `IMAGE@N`, and checks the region against the file; every failure is one line
    /// naming the image.
    pub fn region(&self) -> Result<Option<Region>> {
        check_image(&self.path, false)?;
        let dev = open_image(&self.path, true).with_context(|| self.path.display().to_string())?;
        self.region_in(&dev).map(|(r, _)| r)
    }

    /// The region, and the window onto it (the whole device for `Whole`).
    pub(crate) fn region_in(
        &self,
        dev: &Arc<dyn BlockDevice>,
    ) -> Result<(Option<Region>, Arc<dyn BlockDevice>)> {
        self.lib()
            .region_in(dev)
            .map_err(|e| anyhow!(lib_message(e)))
    }

    /// The region, once an ext2/3/4 superblock is known to be there: a partition or an offset
    /// that holds something else is refused, saying what it seems to hold. For a whole file
    /// that holds a partition table or a qcow2 (VMDK, ...) image, the error says how to reach
    /// the filesystem.
    pub(crate) fn fs_region(&self) -> Result<Option<Region>> {
        let dev = match open_image(&self.path, true) {
            Ok(d) => d,
            // Let the open report it (as it always has).
            Err(_) if self.within == Within::Whole => return Ok(None),
            Err(e) => return Err(e).with_context(|| self.path.display().to_string()),
        };
        let (region, view) = self.region_in(&dev)?;
        let contents = identify(&*view);
        if matches!(contents, Contents::Ext { .. }) {
            return Ok(region);
        }
        let path = self.path.display();
        match self.within {
            Within::Whole => {
                if let Contents::ImageFormat(f) = contents {
                    bail!("{path}: {f}");
                }
                if let Ok(Some(t)) = Table::read(&*dev) {
                    bail!(
                        "{path}: not ext4 itself but a whole disk: {}; name one as {path}@N \
                         (uext4 info {path} lists them)",
                        t.summary()
                    );
                }
                // The open says what is wrong (bad magic, too small, ...).
                Ok(None)
            }
            Within::Partition(n) => {
                bail!("{path}: partition {n} is not ext4 (it holds {contents})")
            }
            Within::Offset { offset, .. } => {
                bail!("{path}: no ext4 at offset {offset} (it holds {contents})")
            }
        }
    }

    /// The byte range of the file this names (for telling whether two overlap).
    pub(crate) fn range(&self) -> Result<(u64, u64)> {
        let size = open_image(&self.path, true)
            .with_context(|| self.path.display().to_string())?
            .size();
        Ok(match self.region()? {
            None => (0, size),
            Some(r) => (r.offset, r.len.map_or(size, |l| r.offset + l)),
        })
    }
}

/// The region of the filesystem `img` names, once ext2/3/4 is known to be there (for mount).
pub fn fs_region_of(img: &Img) -> Result<Option<Region>> {
    img.fs_region()
}

/// Opens the filesystem `img` names (see [`Img::fs_region`]).
pub(crate) fn open_img(img: &Img, read_only: bool) -> Result<Arc<Fs>> {
    check_image(&img.path, !read_only)?;
    let region = img.fs_region()?;
    open(&img.path, region, read_only)
}

/// Whether `p` is an existing file or device (not a directory).
fn is_image_file(p: &Path) -> bool {
    p.is_file()
        || std::fs::metadata(p)
            .map(|m| !m.is_dir() && !m.is_file())
            .unwrap_or(false)
}

/// What follows the `@` of `IMAGE@...` (the library's reading).
pub fn parse_within(spec: &str) -> Result<Within> {
    uext4::image_name::parse_within(spec).map_err(usage)
}

/// `IMAGE`, `IMAGE@N` or `IMAGE@offset=BYTES[,size=BYTES]`: `None` when no such file exists.
/// A file named by the whole text wins over the `@` forms.
fn parse_image(s: &str) -> Result<Option<Img>> {
    let n = uext4::ImageName::parse(s).map_err(usage)?;
    let there = uext4::image::is_nbd_uri(&n.path) || is_image_file(&n.path);
    Ok(there.then_some(Img {
        path: n.path,
        within: n.within,
    }))
}

/// An image argument without a path inside it (info, mkfs, mount): the `@` forms as in
/// [`parse_image`]; a name that matches nothing is taken as a file name (whose open then
/// says it is missing).
pub fn image_arg(p: &Path) -> Result<Img> {
    if let Some(s) = p.to_str() {
        if let Some(img) = parse_image(s)? {
            return Ok(img);
        }
    }
    Ok(Img {
        path: p.to_path_buf(),
        within: Within::Whole,
    })
}

/// An IMAGE:PATH argument, or a host path.
pub(crate) enum Loc {
    Image(Img, String),
    Host(PathBuf),
}

pub(crate) fn parse_loc(s: &str) -> Result<Loc> {
    // An NBD URI ends at the first ':' after its authority (a ':' in the export name or the
    // socket path is written %3A): `nbd+unix:///disk?socket=/run/x.sock:/etc`.
    if uext4::image::is_nbd_uri(Path::new(s)) {
        let auth = uext4::image_name::nbd_authority_end(s);
        return match s[auth..].find(':').map(|i| auth + i) {
            Some(at) => {
                let path = match &s[at + 1..] {
                    "" => "/".to_string(),
                    p => p.to_string(),
                };
                let img = parse_image(&s[..at])?.expect("an NBD URI is an image");
                Ok(Loc::Image(img, path))
            }
            None => bail!(
                "{s}: expected NBD-URI:PATH (a ':' and the path inside the image after the URI)"
            ),
        };
    }
    // The image is the first prefix before a ':' that is an existing file or device (an image
    // name may itself contain ':'), or such a file followed by @N or @offset=BYTES.
    for (at, _) in s.match_indices(':') {
        let (img, path) = (&s[..at], &s[at + 1..]);
        if let Some(img) = parse_image(img)? {
            let path = if path.is_empty() {
                "/".to_string()
            } else {
                path.to_string()
            };
            return Ok(Loc::Image(img, path));
        }
    }
    Ok(Loc::Host(PathBuf::from(s)))
}

pub(crate) fn image_loc(s: &str) -> Result<(Img, String)> {
    match parse_loc(s)? {
        Loc::Image(i, p) => Ok((i, p)),
        Loc::Host(_) => match s.split_once(':') {
            Some((img, _)) => {
                check_image(Path::new(img), false)?;
                bail!("{img}: not an image file or block device")
            }
            None => Err(Usage(format!(
                "{s}: expected IMAGE:PATH (the path inside the image after a ':', as {s}:/)"
            ))
            .into()),
        },
    }
}

/// `--quiet`: the tools show no progress bar and print no notes.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_quiet(q: bool) {
    QUIET.store(q, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub(crate) fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// The fscrypt master keys given with `--key`, read once before a tool runs; every image a
/// tool opens gets them.
static KEYS: std::sync::OnceLock<Vec<uext4::EncryptionKey>> = std::sync::OnceLock::new();

/// Reads the `--key` files (their contents never appear in an error, only their names).
pub fn set_keys(files: &[PathBuf]) -> Result<()> {
    let mut keys = Vec::new();
    for f in files {
        let raw = std::fs::read(f)
            .with_context(|| format!("--key {}: cannot read the key file", f.display()))?;
        keys.push(uext4::EncryptionKey::new(raw));
    }
    let _ = KEYS.set(keys);
    Ok(())
}

/// The `--key` keys, in the order given.
pub(crate) fn keys() -> &'static [uext4::EncryptionKey] {
    KEYS.get().map(Vec::as_slice).unwrap_or(&[])
}

/// Opens an image for a tool. A read-write open claims the image first (the engine's
/// holder.rs: refused, naming the holder, while another program writes it). A read-only open
/// never writes: a journal left to replay (a crash, a killed mount) is replayed in memory.
pub(crate) fn open(image: &Path, region: Option<Region>, read_only: bool) -> Result<Arc<Fs>> {
    let opts = MountOptions {
        read_only,
        commit_interval_secs: 0,
        region,
        keys: keys().to_vec(),
        ..Default::default()
    };
    open_with(image, opts)
}

/// [`open`] with the engine's options given.
pub(crate) fn open_with(image: &Path, opts: MountOptions) -> Result<Arc<Fs>> {
    let read_only = opts.read_only;
    check_image(image, !read_only)?;
    let fs = Fs::open_path(image, opts).with_context(|| image.display().to_string())?;
    crate::sandbox::contain_tool(image, read_only)?;
    if !read_only && fs.is_read_only() {
        bail!(
            "{}: cannot be written: {}",
            image.display(),
            fs.read_only_reason().unwrap_or("read-only")
        );
    }
    if fs.journal_replayed_in_memory() && !quiet() {
        eprintln!(
            "uext4: note: {}: the journal needs recovery; replayed in memory only (the image \
             is not changed)",
            image.display()
        );
    }
    Ok(fs)
}

/// The user running the tool, who owns what it makes (as files made through a mount would be).
pub(crate) fn caller() -> (u32, u32) {
    // SAFETY: plain getters without arguments.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The process umask (read by setting and restoring it).
pub(crate) fn umask() -> u32 {
    // SAFETY: umask only swaps the process's mask.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    }
}

/// Leaves the image clean; the operation's own error comes first when both fail.
pub(crate) fn finish(fs: &Fs, image: &Path, r: Result<()>) -> Result<()> {
    let u = fs.unmount();
    r?;
    u.with_context(|| image.display().to_string())
}

/// Walks `path` from the root, following symlinks in the middle (and at the end with
/// `follow`). Returns the inode.
pub(crate) fn resolve(fs: &Fs, path: &str, follow: bool) -> uext4::Result<u32> {
    resolve_from(fs, 2, path, follow)
}

/// [`resolve`] from directory `start` (the engine's `Fs::lookup_path`), where a path may
/// also begin at an inode named by number (`<12>/name`).
pub(crate) fn resolve_from(fs: &Fs, start: u32, path: &str, follow: bool) -> uext4::Result<u32> {
    // debugfs's `<N>`: the path starts at inode N.
    let trimmed = path.trim_start_matches('/');
    let (first, rest) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    match inode_number(first) {
        Some(n) => fs.lookup_path(n, rest.as_bytes(), follow),
        None => fs.lookup_path(start, path.as_bytes(), follow),
    }
}

/// `<N>` (debugfs's way of naming an inode by number): N.
pub(crate) fn inode_number(p: &str) -> Option<u32> {
    p.strip_prefix('<')?.strip_suffix('>')?.parse().ok()
}

/// Splits "a/b/c" into the parent's inode and "c".
pub(crate) fn parent_of(fs: &Fs, path: &str) -> Result<(u32, Vec<u8>)> {
    let trimmed = path.trim_end_matches('/');
    let (dir, name) = match trimmed.rsplit_once('/') {
        Some((d, n)) => (if d.is_empty() { "/" } else { d }, n),
        None => ("/", trimmed),
    };
    if name.is_empty() {
        bail!("{path}: needs a file name");
    }
    // As rm(1) refuses them: "a/." and "a/.." name a directory by another name, and
    // removing or replacing them by that name would act on a directory the path hides.
    if name == "." || name == ".." {
        bail!("refusing to remove, replace or make '.' or '..' (name the directory itself)");
    }
    let d = resolve(fs, dir, true).with_context(|| dir.to_string())?;
    Ok((d, name.as_bytes().to_vec()))
}

/// The error for a directory that a recursive walk reaches a second time: in a sound image
/// every directory has one parent, so this is a cycle or a hard-linked directory made by
/// corruption. Recursing on would never end.
pub(crate) fn directory_cycle(ino: u32) -> Error {
    Error::corrupt(uext4::Corruption::Directory, format!(
        "directory inode {ino} is reached twice (a directory cycle or a hard-linked directory); run e2fsck -f"
    ))
}

/// Makes room for a non-directory called `name` in `dir`, as cp(1) does: an existing
/// non-directory there goes; an existing directory is an error. (Re-copying a tree over an
/// earlier copy stopped with "file exists" at its first symlink or second hard link.)
pub(crate) fn make_room(fs: &Fs, dir: u32, name: &[u8]) -> Result<()> {
    match fs.lookup(dir, name) {
        Ok(a) if a.is_dir() => bail!(
            "cannot overwrite directory {} with a non-directory",
            String::from_utf8_lossy(name)
        ),
        Ok(_) => fs.unlink(dir, name)?,
        Err(Error::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// A path in an archive as components, with `/`, `.` and empty components dropped; `..` is
/// refused (it could name something outside the directory unpacked into).
pub(crate) fn clean_path(p: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => bail!("a '..' in the path would leave the image's root; refused"),
            c => out.push(c),
        }
    }
    Ok(out)
}
