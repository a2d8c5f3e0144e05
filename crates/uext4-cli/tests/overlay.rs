//! uext4 under the kernel's overlayfs, and uext4 as tools that start fuse2fs call it.
//!
//! - A container session (copy-up, whiteouts, an opaque directory, a directory rename, many
//!   write-temp-then-rename installs, xattr changes, hard links) on an overlay whose upper
//!   layer is a uext4 mount gives the same merged tree, entry by entry (type, mode, size,
//!   content, xattrs), as the same session over the kernel's ext4; the image is e2fsck-clean
//!   afterwards, and the kernel's ext4 mounts it with the overlay reading the same from it.
//! - Apptainer's exact fuse2fs command line (`fuse2fs -f -o allow_other[,ro][,fakeroot]
//!   /proc/self/fd/3 TARGET`, the image on descriptor 3) runs `uext4` through a `fuse2fs`
//!   link, TARGET a directory or a /dev/fuse descriptor the caller mounted (`/dev/fd/N`).
//! - `mount -t fuse.uext4` through the installed helper (scripts/install.sh), when present.
//!
//! Each needs root, /dev/fuse and overlayfs (or a loop device): without them it prints
//! `SKIP:` and passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_uext4")
}

/// A scratch directory, unmounted (whatever is mounted under it) and removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("uext4-ov-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn p(&self, rel: &str) -> String {
        self.0.join(rel).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let me = self.0.display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut mine: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&me))
            .collect();
        mine.reverse();
        for m in mine {
            let _ = Command::new("umount").arg("-l").arg(m).output();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The lower layer every session starts from.
const LOWER: &str = r#"set -e; cd "$1"
printf 'lower a\n' > a; printf 'h\n' > h; chmod 644 a h
mkdir -p d e r/deep; printf x > d/x; printf y > d/y; printf z > e/z; printf q > r/q
printf deep > r/deep/f; head -c 300000 /dev/urandom > big; ln -s a sym
setfattr -n user.lower -v 1 d/y"#;

/// The container session, run in the merged directory.
const SESSION: &str = r#"set -e; cd "$1"
printf 'more\n' >> a                       # copy-up of a written file
chmod 600 h                                # copy-up of metadata only
rm d/x big                                 # whiteouts
rm -r e; mkdir e; printf n > e/n           # an opaque directory over a lower one
mv r r2                                    # a lower directory renamed (EXDEV: mv copies)
mkdir new; printf 1 > new/one; mv new new2 # an upper directory renamed
for i in $(seq 1 60); do printf "v$i" > conf.tmp; mv conf.tmp conf; done
for i in $(seq 1 20); do printf "w$i" > r2/deep/.f.tmp; mv r2/deep/.f.tmp r2/deep/f; done
setfattr -n user.k -v v a; setfattr -n user.k2 -v 2 d/y; setfattr -x user.lower d/y
setfattr -n user.dir -v yes e
ln a a2; ln d/y d/y2; ln -s e/n sym2
mkfifo fifo; touch -d @1000000000 d/y
rm sym; mv h h2"#;

/// Every entry under `dir`: path, type, mode, size, content hash, xattrs (user.*), sorted.
const DESCRIBE: &str = r#"cd "$1"; find . -mindepth 1 | LC_ALL=C sort | while read -r p; do
  t=$(stat -c '%F %a %s' "$p"); c=-
  if [ -f "$p" ] && [ ! -L "$p" ]; then c=$(md5sum < "$p" | cut -c1-32); fi
  if [ -L "$p" ]; then c=$(readlink "$p"); fi
  x=$(getfattr -h -d -m '^user\.' -e hex "$p" 2>/dev/null | grep -v '^#' | tr '\n' ' ')
  echo "$p | $t | $c | $x"
done"#;

fn run(script: &str, arg: &str) -> String {
    let o = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg("script")
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "script on {arg} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn overlay(lower: &str, base: &str, merged: &str) {
    sh(&format!("mkdir -p {base}/upper {base}/work {merged}"));
    let o = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={lower},upperdir={base}/upper,workdir={base}/work"
        ))
        .arg(merged)
        .output()
        .unwrap();
    let dmesg = sh("dmesg 2>/dev/null | grep overlayfs | tail -5 || true");
    assert!(
        o.status.success(),
        "overlay over {base}: {} (kernel log: {dmesg})",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn container_session_matches_the_kernels_ext4_as_upper() {
    if !overlay_usable("the overlay tests") {
        return;
    }
    let d = Dir::new("session");
    let lower = d.p("lower");
    std::fs::create_dir_all(&lower).unwrap();
    run(LOWER, &lower);
    // Reference: the kernel's ext4 as the upper layer.
    let kimg = d.p("k.img");
    let uimg = d.p("u.img");
    for img in [&kimg, &uimg] {
        sh(&format!(
            "truncate -s 256M {img} && mke2fs -q -F -t ext4 {img}"
        ));
    }
    let (kmnt, kmerged) = (d.p("kmnt"), d.p("kmerged"));
    sh(&format!("mkdir -p {kmnt} && mount -o loop {kimg} {kmnt}"));
    overlay(&lower, &kmnt, &kmerged);
    run(SESSION, &kmerged);
    let want = run(DESCRIBE, &kmerged);
    sh(&format!("umount {kmerged} && umount {kmnt}"));
    assert!(want.lines().count() > 15, "{want}");
    // uext4 as the upper layer.
    let (umnt, umerged) = (d.p("umnt"), d.p("umerged"));
    std::fs::create_dir_all(&umnt).unwrap();
    let o = Command::new(bin())
        .args(["mount", "-o", "allow_other"])
        .arg(&uimg)
        .arg(&umnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    overlay(&lower, &umnt, &umerged);
    run(SESSION, &umerged);
    let got = run(DESCRIBE, &umerged);
    assert_eq!(
        got, want,
        "the merged tree over uext4 (left) differs from the one over the kernel's ext4"
    );
    // Whiteouts and the opaque directory are in the upper layer as overlayfs writes them.
    let upper = format!("{umnt}/upper");
    sh(&format!(
        "test -c {upper}/big && test \"$(stat -c %t:%T {upper}/big)\" = 0:0 && \
         test -c {upper}/d/x && getfattr -n trusted.overlay.opaque {upper}/e | grep -q '\"y\"'"
    ));
    sh(&format!("umount {umerged}"));
    let o = Command::new(bin())
        .arg("umount")
        .arg(&umnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    e2fsck_clean(Path::new(&uimg));
    // The kernel's ext4 mounts the image uext4 wrote, and the overlay reads the same from it.
    sh(&format!("mount -o loop {uimg} {umnt}"));
    overlay(&lower, &umnt, &umerged);
    let again = run(DESCRIBE, &umerged);
    sh(&format!("umount {umerged} && umount {umnt}"));
    assert_eq!(
        again, want,
        "the overlay over the kernel's mount of uext4's image differs"
    );
    e2fsck_clean(Path::new(&uimg));
}

/// Apptainer's command line: `fuse2fs -f -o allow_other[,ro][,fakeroot] /proc/self/fd/3
/// TARGET`, the image on descriptor 3.
#[test]
fn apptainers_fuse2fs_command_line() {
    if !fuse_usable("the overlay tests") {
        return;
    }
    let d = Dir::new("fuse2fs");
    let img = d.p("img");
    sh(&format!(
        "truncate -s 64M {img} && mke2fs -q -F -t ext4 {img}"
    ));
    let shim = d.p("fuse2fs");
    std::os::unix::fs::symlink(bin(), &shim).unwrap();
    let target = d.p("target");
    std::fs::create_dir_all(&target).unwrap();
    // A directory as TARGET, read-write with fakeroot: an ordinary user acts as root.
    let script = format!(
        r#"set -e
exec 3<>{img}
{shim} -f -o allow_other,fakeroot /proc/self/fd/3 {target} & pid=$!
for i in $(seq 100); do grep -q " {target} fuse.uext4 " /proc/mounts && break; sleep 0.1; done
grep " {target} " /proc/mounts
printf secret > {target}/root-only; chmod 600 {target}/root-only
setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '
  cat {target}/root-only; printf mine > {target}/by-nobody; chown 0:0 {target}/by-nobody
  chmod 4755 {target}/by-nobody'
stat -c '%u %g %a' {target}/by-nobody
umount {target}; wait $pid"#
    );
    let out = sh(&script);
    assert!(
        out.contains("fuse.uext4 rw,nosuid,nodev"),
        "fakeroot implies nosuid,nodev: {out}"
    );
    assert!(out.contains("secret"), "{out}");
    assert!(out.trim_end().ends_with("0 0 4755"), "{out}");
    e2fsck_clean(Path::new(&img));
    // Read-only, and TARGET a /dev/fuse descriptor the caller mounted (/dev/fd/N).
    let script = format!(
        r#"set -e
exec 3<{img}
python3 - {shim} {target} <<'PY'
import os, sys, subprocess, time
shim, target = sys.argv[1], sys.argv[2]
fd = os.open("/dev/fuse", os.O_RDWR)
st = os.stat(target)
opts = f"fd={{fd}},rootmode={{st.st_mode & 0o170000:o}},user_id=0,group_id=0,allow_other"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(b"img", target.encode(), b"fuse.uext4", 1, opts.encode()) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
p = subprocess.Popen([shim, "-f", "-o", "allow_other,ro", "/proc/self/fd/3", f"/dev/fd/{{fd}}"],
                     pass_fds=(3, fd))
os.close(fd)
print(open(os.path.join(target, "by-nobody")).read())
subprocess.run(["umount", target], check=True)
print("exit", p.wait(timeout=30))
PY"#
    );
    let out = sh(&script);
    assert!(out.contains("mine"), "{out}");
    assert!(out.contains("exit 0"), "{out}");
    e2fsck_clean(Path::new(&img));
}

/// `mount -t fuse.uext4` through the helper scripts/install.sh puts in /sbin, and the
/// subtype in /proc/mounts.
#[test]
fn mount_helper_and_subtype() {
    if !fuse_usable("the overlay tests") {
        return;
    }
    let d = Dir::new("helper");
    let img = d.p("img");
    let mnt = d.p("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!(
        "truncate -s 64M {img} && mke2fs -q -F -t ext4 {img}"
    ));
    // An unknown key=value option is named as unknown.
    let o = Command::new(bin())
        .args(["mount", "-o", "colour=blue"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown mount option \"colour=blue\""),
        "{err}"
    );
    // mount.fuse3's form: `uext4 IMAGE MOUNTPOINT -o OPTIONS`.
    let o = Command::new(bin())
        .arg(&img)
        .arg(&mnt)
        .args(["-o", "rw,nosuid,nodev,allow_other"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = sh(&format!("grep ' {mnt} ' /proc/mounts"));
    assert!(
        line.starts_with(&format!("{img} {mnt} fuse.uext4 rw,nosuid,nodev")),
        "{line}"
    );
    sh(&format!("printf x > {mnt}/f; umount {mnt}"));
    wait_server_gone(&img);
    e2fsck_clean(Path::new(&img));
    if !Path::new("/sbin/mount.fuse.uext4").exists() {
        eprintln!("SKIP: /sbin/mount.fuse.uext4 not installed (scripts/install.sh)");
        return;
    }
    sh(&format!(
        "mount -t fuse.uext4 {img} {mnt} -o allow_other && grep -q ' {mnt} fuse.uext4 ' \
         /proc/mounts && test \"$(cat {mnt}/f)\" = x && umount {mnt}"
    ));
    wait_server_gone(&img);
    e2fsck_clean(Path::new(&img));
}
