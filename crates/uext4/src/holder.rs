//! One writer at a time: the claim a read-write open takes on its image, and who else holds it.
//!
//! Two programs writing one ext4 image corrupt it (each caches bitmaps, the superblock and the
//! journal's position). The kernel keeps a block device to one mounter with an exclusive claim
//! (`bd_prepare_to_claim`); e2fsprogs opens devices with O_EXCL and relies on MMP across
//! nodes. An image file has neither, so a read-write open here, by the library, the image
//! tools or a mount alike, refuses when:
//! - another uext4 holds the image (the claim is an exclusive `flock` on it, kept for as long
//!   as the filesystem is open; a read-only `uext4 mount` holds a shared one);
//! - another process has the file open for writing (fuse2fs, e2fsck, debugfs -w, a loop
//!   setup): found through /proc/PID/fdinfo, whose `flags` give the open's access mode. An
//!   image handed to us open (/proc/self/fd/N, as Apptainer hands its overlay to fuse2fs) is
//!   shared with whoever handed it: descriptors on that same open file description (kcmp(2))
//!   do not count;
//! - a loop device is backed by it (the kernel may have it mounted);
//! - for a block device, the kernel refuses the exclusive open (it is mounted or claimed).
//!
//! The holder is named where it can be found. Without root only the caller's own processes
//! are visible in /proc: a best effort there, as e2fsck's own check is.

use crate::{Error, Result};
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub use crate::error::Holder;

fn in_use(who: String, by_uext4: bool) -> Error {
    Error::InUse(Holder { who, by_uext4 })
}

/// A read-write open's hold on its image: released when dropped (with the filesystem).
#[derive(Debug)]
pub struct WriterClaim {
    file: File,
}

impl Drop for WriterClaim {
    fn drop(&mut self) {
        // Unlocked explicitly: a child forked meanwhile by another thread shares the open file
        // description (and so the lock) until its exec closes it, and a reopen right after
        // would find the image still held.
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Claims `path` for writing, or says who holds it. Nothing is written either way.
pub fn claim_for_writing(path: &Path) -> Result<WriterClaim> {
    let md = std::fs::metadata(path)?;
    let file = if md.file_type().is_block_device() {
        // The kernel's own claim: EBUSY while it is mounted or exclusively open elsewhere.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    in_use(
                        "the block device is mounted or held by another program".to_string(),
                        false,
                    )
                } else {
                    e.into()
                }
            })?
    } else {
        File::open(path)?
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e.into());
        }
        let who = lock_holder(&md)
            .map(|(pid, shared)| {
                format!(
                    "{} holds it{}",
                    process(pid),
                    if shared { " (read-only)" } else { "" }
                )
            })
            .unwrap_or_else(|| "another uext4 mount or tool holds it".to_string());
        let who = format!("{who}: unmount it, or wait for the tool to finish");
        return Err(in_use(who, true));
    }
    if let Some((who, uext4)) = other_holder(&md, passed_descriptor(path)) {
        return Err(in_use(who, uext4));
    }
    Ok(WriterClaim { file })
}

/// The descriptor number when `path` names one of ours (/proc/self/fd/N, /dev/fd/N): an
/// image handed to us open, as Apptainer hands its overlay to fuse2fs.
fn passed_descriptor(path: &Path) -> Option<i32> {
    let s = path.to_str()?;
    ["/proc/self/fd/", "/dev/fd/"]
        .iter()
        .find_map(|p| s.strip_prefix(p)?.parse().ok())
}

/// Whether descriptor `theirs` of process `pid` is the same open file description as our
/// descriptor `ours` (kcmp(2)): the caller that handed us the image, and the other children
/// it started with the descriptor, share it with us and are not other writers.
fn same_description(pid: u32, ours: i32, theirs: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects named by pids and descriptor numbers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            std::process::id() as libc::c_long,
            pid as libc::c_long,
            KCMP_FILE,
            ours as libc::c_long,
            theirs as libc::c_long,
        )
    };
    r == 0
}

/// The parent process id of the process at `proc` (/proc/PID).
fn parent_of(proc: &Path) -> Option<u32> {
    let st = std::fs::read_to_string(proc.join("stat")).ok()?;
    // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
    let rest = &st[st.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `m` is the same file (or block device) as `md`.
fn same_file(md: &std::fs::Metadata, m: &std::fs::Metadata) -> bool {
    if md.file_type().is_block_device() {
        m.file_type().is_block_device() && m.rdev() == md.rdev()
    } else {
        m.dev() == md.dev() && m.ino() == md.ino()
    }
}

/// "uext4 (pid 1234)": a process by its command name.
fn process(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    match comm.trim() {
        "" => format!("process {pid}"),
        c => format!("{c} (pid {pid})"),
    }
}

/// The process holding a `flock` on the file, from /proc/locks, and whether its lock is
/// shared. Lines read `1: FLOCK  ADVISORY  WRITE 1234 08:02:5678 0 EOF`, the device's
/// major and minor in hex.
fn lock_holder(md: &std::fs::Metadata) -> Option<(u32, bool)> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let dev = md.dev();
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        md.ino()
    );
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // A waiter's line reads "1: -> FLOCK ...": it holds nothing, and f[1] is "->".
        if f.len() < 6 || f[1] != "FLOCK" || f[5] != want {
            return None;
        }
        Some((f[4].parse().ok()?, f[3] == "READ"))
    })
}

/// Whether the process at `proc` is a child of ours between fork and exec (our program still,
/// holding copies of our descriptors until exec closes them): another thread of ours starting a
/// program is not another writer.
fn forked_not_yet_exec(proc: &Path, me: u32, my_exe: Option<&Path>) -> bool {
    parent_of(proc) == Some(me)
        && my_exe.is_some()
        && std::fs::read_link(proc.join("exe")).ok().as_deref() == my_exe
}

/// Another process with the file open for writing, or a loop device backed by it; and
/// whether that process is a uext4 (a server that has let go of its claim and is exiting).
fn other_holder(md: &std::fs::Metadata, passed: Option<i32>) -> Option<(String, bool)> {
    let me = std::process::id();
    let my_exe = std::fs::read_link("/proc/self/exe").ok();
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || forked_not_yet_exec(&p.path(), me, my_exe.as_deref()) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if !std::fs::metadata(fd.path()).is_ok_and(|m| same_file(md, &m)) {
                continue;
            }
            let theirs = fd.file_name().to_str().and_then(|n| n.parse().ok());
            if let (Some(ours), Some(theirs)) = (passed, theirs) {
                if same_description(pid, ours, theirs) {
                    continue;
                }
            }
            let info = std::fs::read_to_string(p.path().join("fdinfo").join(fd.file_name()))
                .unwrap_or_default();
            let writing = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .is_some_and(|f| f & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32);
            if writing {
                let exe = std::fs::read_link(p.path().join("exe")).ok();
                let uext4 = exe.is_some() && exe == my_exe
                    || std::fs::read_to_string(p.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "uext4");
                return Some((format!("{} has it open for writing", process(pid)), uext4));
            }
        }
    }
    for l in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let Ok(back) = std::fs::read_to_string(l.path().join("loop/backing_file")) else {
            continue;
        };
        if std::fs::metadata(back.trim_end()).is_ok_and(|m| same_file(md, &m)) {
            let dev = format!("/dev/{}", l.file_name().to_string_lossy());
            return Some((
                format!(
                    "it backs the loop device {dev} (the kernel may have it mounted): unmount \
                     it and detach it (losetup -d {dev})"
                ),
                false,
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_and_names_this_process() {
        let dir = std::env::temp_dir().join(format!("uext4-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("img");
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let first = claim_for_writing(&img).unwrap();
        match claim_for_writing(&img) {
            Err(Error::InUse(h)) => {
                assert!(h.by_uext4, "{h}");
                assert!(
                    h.who.contains(&format!("pid {}", std::process::id())),
                    "{h}"
                )
            }
            other => panic!("second claim: {other:?}"),
        }
        drop(first);
        let again = claim_for_writing(&img);
        assert!(again.is_ok(), "{again:?}");
        drop(again);
        // A writer in another process.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdout(std::fs::OpenOptions::new().append(true).open(&img).unwrap())
            .spawn()
            .unwrap();
        // Give the child time to exist with the descriptor (it inherits it at fork).
        let r = claim_for_writing(&img);
        let _ = child.kill();
        let _ = child.wait();
        match r {
            Err(Error::InUse(h)) => {
                assert!(!h.by_uext4, "{h}");
                assert!(
                    h.who.contains("open for writing") && h.who.contains("sleep"),
                    "{h}"
                )
            }
            other => panic!("claim beside a writer: {other:?}"),
        }
        // A reader does not stop a writer.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(File::open(&img).unwrap())
            .spawn()
            .unwrap();
        let r = claim_for_writing(&img);
        let _ = child.kill();
        let _ = child.wait();
        assert!(r.is_ok(), "{r:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
