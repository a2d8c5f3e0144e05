//! Host-side helpers: shell commands, extended attributes, a seeded random source.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

/// Runs a bash command, panicking with its output on failure; its stdout.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("bash").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Lower-case hex of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex string (as `hex` writes it, or getfattr's `-e hex` without `0x`).
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Runs a Python fixture script (`python3 SCRIPT ARGS...`): its stdout, or None where it
/// cannot run here (no python3, or the script printed `SKIP: why`; the reason is printed).
/// Panics with its output when it fails.
pub fn fixture_script(script: &Path, args: &[&std::ffi::OsStr]) -> Option<String> {
    let Ok(run) = Command::new("python3").arg(script).args(args).output() else {
        eprintln!("SKIP: no python3");
        return None;
    };
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    if stdout.contains("SKIP:") {
        eprintln!("{stdout}");
        return None;
    }
    assert!(
        run.status.success(),
        "fixture script {} failed: {stdout}{}",
        script.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    Some(stdout)
}

/// A host path's extended attributes (not following a symlink), sorted; empty where the host
/// has none or no support.
pub fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: valid C strings and a buffer valid for its length.
        let got =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(got >= 0, "getxattr {}", p.display());
        v.truncate(got as usize);
        out.push((name.to_vec(), v));
    }
    out.sort();
    out
}

/// Sets an extended attribute (not following a symlink); false where the host refuses it.
pub fn set_xattr(p: &Path, name: &str, value: &[u8]) -> bool {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer valid for its length.
    unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

/// A small deterministic pseudo-random source (xorshift64) for tests that damage or drop
/// things at random places: the same seed gives the same run.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.max(1);
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Every extended attribute of inode `ino` of an open filesystem, by full name.
pub fn fs_xattrs(fs: &uext4::Fs, ino: u32) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    fs.listxattr(ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = fs.getxattr(ino, &n).unwrap();
            (n, v)
        })
        .collect()
}

/// A whole file of an open filesystem, read in as many calls as it takes.
pub fn read_all(fs: &uext4::Fs, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let n = fs.read(ino, done as u64, &mut buf[done..]).unwrap();
        assert!(n > 0, "read returned 0 at {done} of {size}");
        done += n;
    }
    buf
}
