//! FUSE mounts made by the `uext4` binary.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Mounts `img` at `mnt` with the `uext4` binary `bin` (`bin mount OPTS IMG MNT`); panics
/// with its error output if the mount fails.
pub fn uext4_mount(bin: &str, img: &Path, mnt: &Path, opts: &[&str]) {
    let o = Command::new(bin)
        .arg("mount")
        .args(opts)
        .arg(img)
        .arg(mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Unmounts `mnt` with umount(8) and waits until the server of `img` is gone.
pub fn umount_and_wait(mnt: &Path, img: &Path) {
    assert!(Command::new("umount").arg(mnt).status().unwrap().success());
    wait_server_gone(img);
}

/// Waits until no uext4 server serves `img` any more: `umount` returns before the server has
/// written the image back and exited. Panics after 20 s.
pub fn wait_server_gone(img: impl AsRef<Path>) {
    let name = img.as_ref().to_string_lossy().into_owned();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let busy = Command::new("pgrep")
            .args(["-f", &format!("uext4 mount -f .*{name}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not exit after unmount");
}
