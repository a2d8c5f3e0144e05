//! uext4-vm-helper: the few calls a kernel-VM guest script needs that busybox lacks: chattr's
//! FS_IOC_GETFLAGS/SETFLAGS (busybox has no chattr), fscrypt's add-key and set-policy, and
//! fs-verity's enable and measure; and bulk name operations whose answers are exact bytes
//! (busybox's shell and ls would have to quote names). One file, std only, built statically
//! on the host by scripts/kernel-vm.sh with `rustc -O -C target-feature=+crt-static`.
//!
//! Usage (NAMES: a file of names, one a line, as bytes; every answer is one line per name):
//!   flags PATH                 print the inode flags (hex)
//!   chattr +F|-F|+HEX PATH     set or clear FS_CASEFOLD_FL, or OR in a raw flag value
//!   list DIR                   "INO HEXNAME" per entry, "." and ".." left out
//!   lookup DIR NAMES           "INO" per name, or "-ERRNO"
//!   read DIR NAMES             the file's contents in hex per name, or "-ERRNO"
//!   create DIR NAMES           create each (O_EXCL), writing the name as its contents: "0" or "-ERRNO"
//!   mkdir DIR NAMES            "0" or "-ERRNO"
//!   unlink DIR NAMES           "0" or "-ERRNO"
//!   add-key MNT KEYFILE        FS_IOC_ADD_ENCRYPTION_KEY (v2): print the key identifier (hex)
//!   set-policy DIR IDHEX [PAD] FS_IOC_SET_ENCRYPTION_POLICY v2, AES-256-XTS/CTS, padding PAD (32)
//!   enable-verity FILE [BS]    FS_IOC_ENABLE_VERITY, SHA-256, block size BS (4096)
//!   measure-verity FILE        FS_IOC_MEASURE_VERITY: print "sha256:HEX"
//!   getquota DEV usr|grp|prj ID  quotactl Q_GETQUOTA: print "curspace curinodes bhardlimit
//!                              bsoftlimit ihardlimit isoftlimit" (space in bytes, limits in
//!                              1 KiB blocks and inodes, as struct if_dqblk holds them)
//!   setproj PATH ID            FS_IOC_FSSETXATTR: set the project id (PROJINHERIT on a directory)
//!   as UID GID PATH BYTES      write BYTES bytes to the new file PATH as UID:GID: "0" or "-ERRNO"

use std::ffi::CString;
use std::io::{BufRead, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};

extern "C" {
    fn ioctl(fd: i32, req: u64, ...) -> i32;
    fn open(path: *const i8, flags: i32, ...) -> i32;
    fn quotactl(cmd: i32, special: *const i8, id: i32, addr: *mut u8) -> i32;
    fn setresgid(r: u32, e: u32, s: u32) -> i32;
    fn setresuid(r: u32, e: u32, s: u32) -> i32;
    fn close(fd: i32) -> i32;
}

const FS_IOC_GETFLAGS: u64 = 0x8008_6601;
const FS_IOC_SETFLAGS: u64 = 0x4008_6602;
const FS_IOC_SET_ENCRYPTION_POLICY: u64 = 0x800c_6613;
const FS_IOC_ADD_ENCRYPTION_KEY: u64 = 0xc050_6617;
const FS_IOC_ENABLE_VERITY: u64 = 0x4080_6685;
const FS_IOC_MEASURE_VERITY: u64 = 0xc004_6686;
const FS_CASEFOLD_FL: u32 = 0x4000_0000;
const FS_IOC_FSGETXATTR: u64 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u64 = 0x401c_5820;
const FS_XFLAG_PROJINHERIT: u32 = 0x200;
/// Q_GETQUOTA (quotactl's QCMD(Q_GETQUOTA, type) = Q_GETQUOTA << 8 | type).
const Q_GETQUOTA: i32 = 0x80_0007;
const O_RDONLY: i32 = 0;
const O_NONBLOCK: i32 = 0o4000;

fn die(msg: &str) -> ! {
    eprintln!("uext4-vm-helper: {msg}");
    std::process::exit(2)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn err_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// A descriptor for ioctls: files and directories alike, read-only.
struct Fd(i32);

impl Fd {
    fn open(p: &str) -> Fd {
        let c = CString::new(p).unwrap();
        let fd = unsafe { open(c.as_ptr(), O_RDONLY | O_NONBLOCK) };
        if fd < 0 {
            die(&format!("open {p}: errno {}", errno()));
        }
        Fd(fd)
    }
    fn ioctl(&self, req: u64, arg: *mut u8, what: &str) {
        if unsafe { ioctl(self.0, req, arg) } != 0 {
            die(&format!("{what}: errno {}", errno()));
        }
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        unsafe { close(self.0) };
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    if s.len() % 2 != 0 {
        die(&format!("odd hex {s}"));
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or_else(|_| die("bad hex")))
        .collect()
}

fn names(file: &str) -> Vec<Vec<u8>> {
    let f = std::fs::File::open(file).unwrap_or_else(|e| die(&format!("{file}: {e}")));
    std::io::BufReader::new(f)
        .split(b'\n')
        .map(|l| l.unwrap())
        .collect()
}

fn join(dir: &str, name: &[u8]) -> PathBuf {
    Path::new(dir).join(std::ffi::OsStr::from_bytes(name))
}

fn get_flags(p: &str) -> u32 {
    let mut v: u32 = 0;
    Fd::open(p).ioctl(FS_IOC_GETFLAGS, &mut v as *mut u32 as *mut u8, "FS_IOC_GETFLAGS");
    v
}

fn chattr(spec: &str, p: &str) {
    let old = get_flags(p);
    let mut v = match spec {
        "+F" => old | FS_CASEFOLD_FL,
        "-F" => old & !FS_CASEFOLD_FL,
        s if s.starts_with('+') => {
            old | u32::from_str_radix(&s[1..], 16).unwrap_or_else(|_| die("bad flag"))
        }
        _ => die(&format!("chattr: {spec}")),
    };
    Fd::open(p).ioctl(FS_IOC_SETFLAGS, &mut v as *mut u32 as *mut u8, "FS_IOC_SETFLAGS");
}

fn add_key(mnt: &str, keyfile: &str) {
    let raw = std::fs::read(keyfile).unwrap_or_else(|e| die(&format!("{keyfile}: {e}")));
    // struct fscrypt_add_key_arg: key_spec {type, reserved, u[32]}, raw_size, key_id,
    // reserved[8], raw[].
    let mut arg = vec![0u8; 80 + raw.len()];
    arg[0..4].copy_from_slice(&2u32.to_ne_bytes()); // FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
    arg[40..44].copy_from_slice(&(raw.len() as u32).to_ne_bytes());
    arg[80..].copy_from_slice(&raw);
    Fd::open(mnt).ioctl(FS_IOC_ADD_ENCRYPTION_KEY, arg.as_mut_ptr(), "FS_IOC_ADD_ENCRYPTION_KEY");
    println!("{}", hex(&arg[8..24]));
}

fn set_policy(dir: &str, id: &str, pad: u32) {
    let id = unhex(id);
    if id.len() != 16 {
        die("a v2 key identifier is 16 bytes");
    }
    let pad_code = match pad {
        4 => 0,
        8 => 1,
        16 => 2,
        32 => 3,
        _ => die("padding: 4, 8, 16 or 32"),
    };
    // struct fscrypt_policy_v2: version, contents mode, filenames mode, flags, reserved[4],
    // identifier[16].
    let mut p = [0u8; 24];
    p[0] = 2;
    p[1] = 1; // FSCRYPT_MODE_AES_256_XTS
    p[2] = 4; // FSCRYPT_MODE_AES_256_CTS
    p[3] = pad_code;
    p[8..].copy_from_slice(&id);
    Fd::open(dir).ioctl(FS_IOC_SET_ENCRYPTION_POLICY, p.as_mut_ptr(), "FS_IOC_SET_ENCRYPTION_POLICY");
}

fn enable_verity(file: &str, block_size: u32) {
    // struct fsverity_enable_arg: version, hash_algorithm, block_size, salt_size, salt_ptr,
    // sig_size, reserved, sig_ptr, reserved[11] (128 bytes).
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&1u32.to_ne_bytes());
    a[4..8].copy_from_slice(&1u32.to_ne_bytes()); // FS_VERITY_HASH_ALG_SHA256
    a[8..12].copy_from_slice(&block_size.to_ne_bytes());
    Fd::open(file).ioctl(FS_IOC_ENABLE_VERITY, a.as_mut_ptr(), "FS_IOC_ENABLE_VERITY");
}

fn measure_verity(file: &str) {
    // struct fsverity_digest: digest_algorithm, digest_size (in: room), digest[].
    let mut d = [0u8; 4 + 64];
    d[2..4].copy_from_slice(&64u16.to_ne_bytes());
    Fd::open(file).ioctl(FS_IOC_MEASURE_VERITY, d.as_mut_ptr(), "FS_IOC_MEASURE_VERITY");
    let alg = u16::from_ne_bytes([d[0], d[1]]);
    let n = u16::from_ne_bytes([d[2], d[3]]) as usize;
    let name = if alg == 1 { "sha256" } else { "sha512" };
    println!("{name}:{}", hex(&d[4..4 + n]));
}

fn getquota(dev: &str, kind: &str, id: &str) {
    let t = match kind {
        "usr" => 0,
        "grp" => 1,
        "prj" => 2,
        _ => die("quota type: usr, grp or prj"),
    };
    let id: i32 = id.parse().unwrap_or_else(|_| die("bad id"));
    // struct if_dqblk: bhardlimit, bsoftlimit, curspace, ihardlimit, isoftlimit, curinodes,
    // btime, itime (u64 each), valid (u32), padding.
    let mut q = [0u64; 9];
    let c = CString::new(dev).unwrap();
    if unsafe { quotactl((Q_GETQUOTA << 8) | t, c.as_ptr(), id, q.as_mut_ptr() as *mut u8) } != 0 {
        die(&format!("quotactl Q_GETQUOTA {kind} {id}: errno {}", errno()));
    }
    println!("{} {} {} {} {} {}", q[2], q[5], q[0], q[1], q[3], q[4]);
}

fn setproj(path: &str, id: &str) {
    let id: u32 = id.parse().unwrap_or_else(|_| die("bad project id"));
    // struct fsxattr: xflags, extsize, nextents, projid, cowextsize, pad[8].
    let mut x = [0u8; 28];
    let f = Fd::open(path);
    f.ioctl(FS_IOC_FSGETXATTR, x.as_mut_ptr(), "FS_IOC_FSGETXATTR");
    x[12..16].copy_from_slice(&id.to_ne_bytes());
    if std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false) {
        let fl = u32::from_ne_bytes([x[0], x[1], x[2], x[3]]) | FS_XFLAG_PROJINHERIT;
        x[0..4].copy_from_slice(&fl.to_ne_bytes());
    }
    f.ioctl(FS_IOC_FSSETXATTR, x.as_mut_ptr(), "FS_IOC_FSSETXATTR");
}

/// Writes `bytes` bytes to the new file `path` as `uid`:`gid` (this process takes those ids
/// and ends; the calling shell stays root): "0", or "-ERRNO" of the first failure (EDQUOT
/// past a limit).
fn write_as(uid: &str, gid: &str, path: &str, bytes: &str) {
    let (uid, gid): (u32, u32) = (uid.parse().unwrap_or_else(|_| die("uid")), gid.parse().unwrap_or_else(|_| die("gid")));
    let n: usize = bytes.parse().unwrap_or_else(|_| die("bytes"));
    if unsafe { setresgid(gid, gid, gid) } != 0 || unsafe { setresuid(uid, uid, uid) } != 0 {
        die(&format!("setresuid: errno {}", errno()));
    }
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| {
            f.write_all(&vec![0x5a; n])?;
            f.sync_all()
        });
    match r {
        Ok(()) => println!("0"),
        Err(e) => println!("-{}", err_of(&e)),
    }
}

fn each(dir: &str, file: &str, mut f: impl FnMut(PathBuf, &[u8]) -> Result<String, i32>) {
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    for n in names(file) {
        let line = f(join(dir, &n), &n).unwrap_or_else(|e| format!("-{e}"));
        writeln!(out, "{line}").unwrap();
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> &str { a.get(i).map(String::as_str).unwrap_or_else(|| die("too few arguments")) };
    match arg(0) {
        "flags" => println!("{:x}", get_flags(arg(1))),
        "chattr" => chattr(arg(1), arg(2)),
        "list" => {
            let out = std::io::stdout();
            let mut out = std::io::BufWriter::new(out.lock());
            let rd = std::fs::read_dir(arg(1)).unwrap_or_else(|e| die(&format!("{}: {e}", arg(1))));
            for e in rd {
                let e = e.unwrap_or_else(|e| die(&format!("readdir: {e}")));
                writeln!(out, "{} {}", e.ino(), hex(&e.file_name().into_vec())).unwrap();
            }
        }
        "lookup" => each(arg(1), arg(2), |p, _| {
            std::fs::symlink_metadata(p).map(|m| m.ino().to_string()).map_err(|e| err_of(&e))
        }),
        "read" => each(arg(1), arg(2), |p, _| std::fs::read(p).map(|b| hex(&b)).map_err(|e| err_of(&e))),
        "create" => each(arg(1), arg(2), |p, n| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(|e| err_of(&e))?;
            f.write_all(n).map_err(|e| err_of(&e))?;
            Ok("0".into())
        }),
        "mkdir" => each(arg(1), arg(2), |p, _| std::fs::create_dir(p).map(|_| "0".into()).map_err(|e| err_of(&e))),
        "unlink" => each(arg(1), arg(2), |p, _| std::fs::remove_file(p).map(|_| "0".into()).map_err(|e| err_of(&e))),
        "add-key" => add_key(arg(1), arg(2)),
        "set-policy" => set_policy(arg(1), arg(2), a.get(3).map_or(32, |s| s.parse().unwrap_or_else(|_| die("bad padding")))),
        "enable-verity" => enable_verity(arg(1), a.get(2).map_or(4096, |s| s.parse().unwrap_or_else(|_| die("bad block size")))),
        "measure-verity" => measure_verity(arg(1)),
        "getquota" => getquota(arg(1), arg(2), arg(3)),
        "setproj" => setproj(arg(1), arg(2)),
        "as" => write_as(arg(1), arg(2), arg(3), arg(4)),
        c => die(&format!("unknown command {c}")),
    }
}
