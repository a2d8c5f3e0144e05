//! `uext4 serve --vhost-user-fs`: an image served to a virtual machine over virtio-fs, end to
//! end. QEMU (TCG here) boots Debian's kernel (scripts/kernel-vm.sh) with a vhost-user-fs
//! device whose back end is `uext4 serve`; the guest's kernel mounts the tag and is the
//! client, the host's kernel never parses the image.
//!
//! - The guest checks a tree the host put in the image (sizes, SHA-256 of every file, a
//!   symlink), writes files and fsyncs them, makes a bounded set of POSIX changes (rename,
//!   rename over a file, hard and symbolic links, chmod, chown, truncate down and up, an open
//!   file unlinked and still read, rmdir of a full and an empty directory, utimes, 300
//!   entries in a directory), unmounts and mounts the tag again on the same connection, and
//!   powers off. The back end must then end by itself (exit 0), the image pass `e2fsck -fn`,
//!   and the kernel's ext4 (a loop mount; uext4's own reader where that cannot run) read
//!   back what the guest wrote. A second image, served `-o ro` to the same guest under
//!   another tag, is read there, refuses a create and a touch, and is byte for byte
//!   unchanged afterwards.
//! - The monitor killed (SIGKILL) while the guest writes and fsyncs: the back end ends by
//!   itself, the image is clean, and every file whose fsync had returned in the guest is
//!   there whole.
//! - Without a VM: bad arguments fail in one line, and SIGTERM or a monitor that connects
//!   and goes away end the back end with a clean image.
//! - Once the monitor connected, the back end is contained (a new socket and a host file are
//!   refused), and the guest's whole session above runs so.
//!
//! The VM tests print `SKIP: ...` and pass where no VM can run (no qemu-system-x86_64 or no
//! vhost-user-fs-pci in it, no guest kernel, no static busybox).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));
const TAG: &str = "uext4tag";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `uext4 serve` process, killed on drop if it is still running (a failed assertion must
/// not leave it behind).
struct Backend {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Backend {
    /// Starts serving `img` on `dir/sock` with `-o opts`, and waits until the socket listens.
    fn start(img: &Path, dir: &Scratch, opts: &str) -> Backend {
        Backend::start_with(img, dir, opts, &[])
    }

    /// [`Backend::start`] with variables added to its environment.
    fn start_with(img: &Path, dir: &Scratch, opts: &str, env: &[(&str, &str)]) -> Backend {
        let socket = dir.p("sock");
        let log = dir.p("serve.log");
        let mut cmd = Command::new(UEXT4.0);
        cmd.envs(env.iter().copied());
        cmd.arg("serve").arg("--vhost-user-fs").arg(&socket);
        if !opts.is_empty() {
            cmd.args(["-o", opts]);
        }
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .arg(img)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut b = Backend { child, socket, log };
        let t0 = Instant::now();
        while !b.socket.exists() {
            if let Some(st) = b.child.try_wait().unwrap() {
                panic!(
                    "uext4 serve exited ({st}) before listening: {}",
                    b.log_text()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no socket after 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        b
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 30 s) for the back end to end by itself; its exit status.
    fn wait_exit(&mut self) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let log = self.log_text();
                assert!(!log.contains("panicked"), "uext4 serve panicked: {log}");
                return st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "uext4 serve still running 30 s after its monitor left: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child, by its pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a VM run printed and how it ended, or None where no VM can run here (SKIP said).
struct VmRun {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Whether a VM with a vhost-user-fs device can run here; says why not.
fn vm_usable() -> bool {
    let out = Command::new("bash")
        .arg(root().join("scripts/kernel-vm.sh"))
        .arg("--check")
        .output()
        .expect("bash");
    if out.status.code() == Some(77) {
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
        return false;
    }
    assert!(out.status.success(), "kernel-vm.sh --check: {out:?}");
    let help = Command::new("qemu-system-x86_64")
        .args(["-device", "help"])
        .output()
        .expect("qemu-system-x86_64");
    if !String::from_utf8_lossy(&help.stdout).contains("\"vhost-user-fs-pci\"") {
        println!("SKIP: this qemu-system-x86_64 has no vhost-user-fs-pci device");
        return false;
    }
    true
}

/// Boots the guest with each back end's socket as its tag, runs `script` with `inputs` as
/// /in/NAME, and returns what it printed.
fn vm(
    dir: &Scratch,
    backends: &[(&Backend, &str)],
    script: &str,
    inputs: &[(&str, &[u8])],
    extra: &[&str],
) -> VmRun {
    std::fs::write(dir.p("run.sh"), script).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/kernel-vm.sh"));
    for (b, tag) in backends {
        cmd.arg("--vhost-user-fs")
            .arg(format!("{}:{tag}", b.socket.display()));
    }
    for (name, data) in inputs {
        std::fs::write(dir.p(name), data).unwrap();
        cmd.arg("--file").arg(dir.p(name));
    }
    cmd.args(extra).arg(dir.p("run.sh"));
    let t0 = Instant::now();
    let out = cmd.output().expect("bash");
    println!("VM ran {:.1} s", t0.elapsed().as_secs_f64());
    VmRun {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The `== NAME` sections of a guest's output, each a list of lines.
fn sections(out: &str) -> BTreeMap<String, Vec<String>> {
    let mut s: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur = String::new();
    for l in out.lines() {
        match l.strip_prefix("== ") {
            Some(name) => cur = name.to_string(),
            None => s.entry(cur.clone()).or_default().push(l.to_string()),
        }
    }
    s
}

/// `KEY VALUE...` lines as a map.
fn facts(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut r = xorshift(seed);
    (0..n).map(|_| r() as u8).collect()
}

/// `seq A B` as busybox prints it.
fn seq(a: u64, b: u64) -> Vec<u8> {
    (a..=b)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

/// `sha256sum` lines for every file under `dir`, paths relative to it (`./NAME`), sorted.
fn host_sums(dir: &Path) -> Vec<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg("find . -type f | LC_ALL=C sort | xargs sha256sum")
        .current_dir(dir)
        .output()
        .expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Reads the image's files back with the kernel's ext4 (a read-only loop mount) where this
/// can run, else with uext4's own reader.
struct ReadBack {
    kernel: Option<KernelMount>,
    img: PathBuf,
}

impl ReadBack {
    fn new(img: &Path) -> ReadBack {
        let kernel = can_loop_mount().then(|| KernelMount::new(img));
        ReadBack {
            kernel,
            img: img.to_path_buf(),
        }
    }

    fn read(&self, path: &str) -> Vec<u8> {
        match &self.kernel {
            Some(k) => std::fs::read(k.dir.join(path.trim_start_matches('/'))).unwrap(),
            None => {
                let at = format!("{}:{path}", self.img.display());
                let o = UEXT4.run(&["cat", &at]);
                assert!(o.status.success(), "uext4 cat {at}: {o:?}");
                o.stdout
            }
        }
    }

    /// (mode, links, uid, gid, size, inode, mtime) of `path`; None where it does not exist.
    fn stat(&self, path: &str) -> Option<(u32, u64, u32, u32, u64, u64, i64)> {
        match &self.kernel {
            Some(k) => {
                let m = std::fs::symlink_metadata(k.dir.join(path.trim_start_matches('/'))).ok()?;
                Some((
                    m.permissions().mode(),
                    m.nlink(),
                    m.uid(),
                    m.gid(),
                    m.size(),
                    m.ino(),
                    m.mtime(),
                ))
            }
            None => {
                let fs = uext4::Fs::open_path(&self.img, opts::read_only()).unwrap();
                let ino = fs
                    .lookup_path(uext4::ROOT_INO, path.as_bytes(), false)
                    .ok()?;
                let a = fs.getattr(ino).unwrap();
                Some((
                    a.mode as u32,
                    a.nlink as u64,
                    a.uid,
                    a.gid,
                    a.size,
                    a.ino as u64,
                    a.mtime.sec,
                ))
            }
        }
    }
}

const GUEST_TREE_AND_WRITES: &str = r#"
mkdir -p /mnt/v
mount -t virtiofs uext4tag /mnt/v || { dmesg | tail -20; exit 1; }
cd /mnt/v
echo "== sums"
(cd host && find . -type f | sort | xargs sha256sum)
echo "== sizes"
(cd host && find . -type f | sort | xargs stat -c '%s %n')
echo "== facts"
echo "link $(readlink host/link)"
echo "via_link $(sha256sum < host/link | cut -d' ' -f1)"
mkdir new
cp /in/payload.bin new/payload.bin
seq 1 200000 > new/seq.txt
dd if=/dev/zero bs=4096 count=300 2>/dev/null | tr '\0' z > new/z.bin
sync new/payload.bin new/seq.txt new/z.bin && echo "fsync ok"
mkdir p
echo a > p/r1; mv p/r1 p/r2
echo "renamed_old $(test -e p/r1 && echo present || echo gone) $(cat p/r2)"
echo b > p/r3; mv p/r3 p/r2
echo "rename_over $(cat p/r2) $(test -e p/r3 && echo present || echo gone)"
ln p/r2 p/h
echo "hardlink $(stat -c %h p/r2) $(test "$(stat -c %i p/r2)" = "$(stat -c %i p/h)" && echo same || echo differ)"
ln -s r2 p/s
echo "symlink $(readlink p/s) $(cat p/s)"
chmod 0640 p/r2
echo "chmod $(stat -c %a p/h)"
chown 1000:1001 p/h
echo "chown $(stat -c %u:%g p/r2)"
seq 1 5000 > p/t; truncate -s 1000 p/t
seq 1 5000 | head -c 1000 > /tmp/t1
echo "truncate_down $(stat -c %s p/t) $(cmp -s p/t /tmp/t1 && echo same || echo differ)"
truncate -s 8192 p/t
echo "truncate_up $(stat -c %s p/t) $(tail -c 7192 p/t | tr -d '\000' | wc -c)"
seq 1 1000 > p/u
exec 3<p/u
rm p/u
echo "unlinked_open $(test -e p/u && echo present || echo gone) $(cat <&3 | wc -l)"
exec 3<&-
mkdir p/d; echo x > p/d/f
rmdir p/d 2>/dev/null && echo "rmdir_full removed" || echo "rmdir_full refused"
rm p/d/f; rmdir p/d && echo "rmdir_empty removed"
touch -d '2001-02-03 04:05:06' p/r2
echo "mtime $(stat -c %Y p/r2)"
mkdir p/many
i=0; while [ $i -lt 300 ]; do : > p/many/f$i; i=$((i+1)); done
echo "many $(ls p/many | wc -l)"
sync -f . && echo "syncfs ok"
cd /
umount /mnt/v && echo "umount ok"
mount -t virtiofs uext4tag /mnt/v && echo "remount ok"
mkdir -p /mnt/r
mount -t virtiofs rotag /mnt/r && echo "ro_mount ok"
echo "ro_read $(sha256sum < /mnt/r/host/text.txt | cut -d' ' -f1)"
echo x 2>/dev/null > /mnt/r/new && echo "ro_write allowed" || echo "ro_write refused"
touch /mnt/r/host/text.txt 2>/dev/null && echo "ro_touch allowed" || echo "ro_touch refused"
echo "== after"
(cd /mnt/v/new && sha256sum payload.bin seq.txt z.bin)
"#;

/// The tree the host puts in the image: (path under host/, contents).
fn host_tree() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("one", b"1".to_vec()),
        ("page-less-one", bytes(1, 4095)),
        ("page", bytes(2, 4096)),
        ("odd", bytes(3, 65537)),
        ("text.txt", seq(1, 3000)),
        ("sub/dir/deep.bin", bytes(4, (1 << 20) + 13)),
        ("big.bin", bytes(5, (3 << 20) + 7)),
    ]
}

#[test]
fn a_guest_reads_the_tree_writes_and_the_image_stays_clean() {
    if !have(&["e2fsck", "mke2fs"]) || !vm_usable() {
        return;
    }
    let dir = Scratch::dir("vfs-e2e");
    let tree = dir.p("tree");
    for (path, data) in host_tree() {
        let p = tree.join("host").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    std::os::unix::fs::symlink("sub/dir/deep.bin", tree.join("host/link")).unwrap();
    let img = dir.p("fs.img");
    mke2fs(&img, "64M", &["-d", tree.to_str().unwrap()]);
    let payload = bytes(6, (2 << 20) + 5);
    // Once the monitor is connected the back end is contained as a mount's server is: a new
    // socket and a host file are refused from then on (probes from a thread of its own).
    let probe = [("UEXT4_SANDBOX_PROBE", "socket,open=/etc/hostname")];
    let mut b = Backend::start_with(&img, &dir, "", &probe);
    // A second image, served read-only beside it.
    let ro_dir = Scratch::dir("vfs-e2e-ro");
    let ro_img = ro_dir.p("ro.img");
    mke2fs(&ro_img, "32M", &["-d", tree.to_str().unwrap()]);
    let ro_before = std::fs::read(&ro_img).unwrap();
    let mut ro = Backend::start(&ro_img, &ro_dir, "ro");
    let run = vm(
        &dir,
        &[(&b, TAG), (&ro, "rotag")],
        GUEST_TREE_AND_WRITES,
        &[("payload.bin", &payload)],
        &["--timeout", "110"],
    );
    if run.status == Some(77) {
        println!("{}", run.stdout.trim());
        return;
    }
    assert_eq!(
        run.status,
        Some(0),
        "the guest failed:\n{}\n{}\nback end: {}",
        run.stdout,
        run.stderr,
        b.log_text()
    );
    let st = b.wait_exit();
    assert!(st.success(), "uext4 serve: {st}: {}", b.log_text());
    assert!(!b.socket.exists(), "the socket outlived the back end");
    e2fsck_clean_when(&img, "after the guest's session");
    let log = b.log_text();
    for p in ["socket", "open=/etc/hostname"] {
        assert!(
            log.contains(&format!("sandbox probe: {p}: refused")),
            "{p} was not refused: {log}"
        );
    }

    let s = sections(&run.stdout);
    assert_eq!(s["sums"], host_sums(&tree.join("host")), "{}", run.stdout);
    let sizes: Vec<String> = {
        let mut t: Vec<_> = host_tree()
            .into_iter()
            .map(|(p, d)| format!("{} ./{p}", d.len()))
            .collect();
        t.sort_by(|a, b| {
            a.split_once(' ')
                .unwrap()
                .1
                .cmp(b.split_once(' ').unwrap().1)
        });
        t
    };
    assert_eq!(s["sizes"], sizes);
    let f = facts(&s["facts"]);
    let want: &[(&str, &str)] = &[
        ("link", "sub/dir/deep.bin"),
        ("fsync", "ok"),
        ("renamed_old", "gone a"),
        ("rename_over", "b gone"),
        ("hardlink", "2 same"),
        ("symlink", "r2 b"),
        ("chmod", "640"),
        ("chown", "1000:1001"),
        ("truncate_down", "1000 same"),
        ("truncate_up", "8192 0"),
        ("unlinked_open", "gone 1000"),
        ("rmdir_full", "refused"),
        ("rmdir_empty", "removed"),
        ("mtime", "981173106"),
        ("many", "300"),
        ("syncfs", "ok"),
        ("umount", "ok"),
        ("remount", "ok"),
        ("ro_mount", "ok"),
        ("ro_write", "refused"),
        ("ro_touch", "refused"),
    ];
    for (k, v) in want {
        assert_eq!(
            f.get(*k).map(String::as_str),
            Some(*v),
            "{k}: {}",
            run.stdout
        );
    }
    let text = host_tree()
        .into_iter()
        .find(|(p, _)| *p == "text.txt")
        .unwrap()
        .1;
    assert_eq!(f["ro_read"], sha256_hex(&text));
    let st = ro.wait_exit();
    assert!(st.success(), "uext4 serve -o ro: {st}: {}", ro.log_text());
    assert!(
        std::fs::read(&ro_img).unwrap() == ro_before,
        "the read-only image changed"
    );
    let deep = host_tree()
        .into_iter()
        .find(|(p, _)| *p == "sub/dir/deep.bin")
        .unwrap()
        .1;
    assert_eq!(f["via_link"], sha256_hex(&deep));

    // What the guest wrote, read back by the host's kernel (or uext4), and as the guest saw
    // it after mounting the tag again.
    let rb = ReadBack::new(&img);
    let z = vec![b'z'; 300 * 4096];
    let seq_txt = seq(1, 200000);
    let news: [(&str, &[u8]); 3] = [
        ("payload.bin", &payload),
        ("seq.txt", &seq_txt),
        ("z.bin", &z),
    ];
    let mut after = Vec::new();
    for (name, data) in news {
        assert!(
            rb.read(&format!("/new/{name}")) == data,
            "new/{name} differs"
        );
        after.push(format!("{}  {name}", sha256_hex(data)));
    }
    assert_eq!(s["after"], after);
    assert_eq!(rb.read("/p/r2"), b"b\n");
    let r2 = rb.stat("/p/r2").unwrap();
    let h = rb.stat("/p/h").unwrap();
    assert_eq!(
        (r2.0 & 0o7777, r2.1, r2.2, r2.3, r2.6),
        (0o640, 2, 1000, 1001, 981173106)
    );
    assert_eq!(r2.5, h.5, "p/h is not a hard link of p/r2");
    assert_eq!(rb.stat("/p/s").unwrap().0 & 0o170000, 0o120000);
    assert_eq!(rb.stat("/p/t").unwrap().4, 8192);
    assert_eq!(&rb.read("/p/t")[..1000], &seq(1, 5000)[..1000]);
    for gone in ["/p/u", "/p/r1", "/p/r3", "/p/d"] {
        assert!(rb.stat(gone).is_none(), "{gone} is still there");
    }
    drop(rb);
}

/// SHA-256 as `sha256sum` prints it.
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

const GUEST_WRITES_UNTIL_KILLED: &str = r#"
mkdir -p /mnt/v
mount -t virtiofs uext4tag /mnt/v || { dmesg | tail -20; exit 1; }
mkdir -p /mnt/v/w
n=0
while true; do
  seq $n $((n + 20000)) > /mnt/v/w/f$n
  sync /mnt/v/w/f$n && echo "synced $n"
  n=$((n + 1))
done
"#;

#[test]
fn a_monitor_killed_mid_write_leaves_a_clean_image() {
    if !have(&["e2fsck", "mke2fs"]) || !vm_usable() {
        return;
    }
    let dir = Scratch::dir("vfs-kill");
    let img = dir.p("fs.img");
    mke2fs(&img, "64M", &[]);
    let mut b = Backend::start(&img, &dir, "");
    // The boot takes ~12 s under TCG here; the guest then writes until QEMU is killed, 40 s
    // after it started (room for a slower machine's boot).
    let run = vm(
        &dir,
        &[(&b, TAG)],
        GUEST_WRITES_UNTIL_KILLED,
        &[],
        &["--timeout", "40", "--kill"],
    );
    if run.status == Some(77) {
        println!("{}", run.stdout.trim());
        return;
    }
    assert_eq!(run.status, Some(124), "{}\n{}", run.stdout, run.stderr);
    let st = b.wait_exit();
    assert!(st.success(), "uext4 serve: {st}: {}", b.log_text());
    e2fsck_clean_when(&img, "after the monitor was killed");
    let synced: Vec<u64> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("synced ")?.trim().parse().ok())
        .collect();
    assert!(
        !synced.is_empty(),
        "the guest fsynced nothing in 40 s (a boot that slow?): {}",
        run.stdout
    );
    println!(
        "{} files fsynced in the guest before the kill",
        synced.len()
    );
    let rb = ReadBack::new(&img);
    for n in synced {
        assert!(
            rb.read(&format!("/w/f{n}")) == seq(n, n + 20000),
            "w/f{n} differs"
        );
    }
}

#[test]
fn serve_refuses_bad_input_and_ends_cleanly_without_a_guest() {
    if !have(&["e2fsck", "mke2fs"]) {
        return;
    }
    let dir = Scratch::dir("vfs-cli");
    let img = dir.p("fs.img");
    mke2fs(&img, "32M", &[]);
    let img_s = img.to_str().unwrap();
    // A path that is not a socket is never replaced.
    let file = dir.p("not-a-socket");
    std::fs::write(&file, b"keep").unwrap();
    let err = UEXT4.fails(&["serve", "--vhost-user-fs", file.to_str().unwrap(), img_s]);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    // A wrong option is a usage error (2); a missing image a failure (1), in one line each.
    let sock = dir.p("sock");
    let sock_s = sock.to_str().unwrap();
    let err = UEXT4.fails_with(
        &["serve", "--vhost-user-fs", sock_s, "-o", "bogus", img_s],
        2,
    );
    assert!(err.contains("bogus"), "{err}");
    let missing = dir.p("missing.img");
    UEXT4.fails(&[
        "serve",
        "--vhost-user-fs",
        sock_s,
        missing.to_str().unwrap(),
    ]);
    e2fsck_clean(&img);

    // SIGTERM before any monitor connected: the image is written back, the socket removed.
    let mut b = Backend::start(&img, &dir, "");
    b.signal(libc::SIGTERM);
    let st = b.wait_exit();
    assert!(st.success(), "{st}: {}", b.log_text());
    assert!(!sock.exists());
    e2fsck_clean_when(&img, "after SIGTERM");

    // A monitor that connects and leaves without a word.
    let mut b = Backend::start(&img, &dir, "");
    drop(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    let st = b.wait_exit();
    assert!(st.success(), "{st}: {}", b.log_text());
    e2fsck_clean_when(&img, "after a silent monitor");

    // One that sends garbage: the session ends (a failure, said in one line), the image
    // written back.
    let mut b = Backend::start(&img, &dir, "");
    {
        use std::io::Write;
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let _ = c.write_all(&[0xff; 64]);
    }
    let st = b.wait_exit();
    let log = b.log_text();
    assert!(st.code() == Some(0) || st.code() == Some(1), "{st}: {log}");
    assert!(
        log.lines()
            .filter(|l| l.starts_with("uext4: ") && l.contains("error"))
            .count()
            <= 1,
        "{log}"
    );
    e2fsck_clean_when(&img, "after a monitor that sent garbage");
}
