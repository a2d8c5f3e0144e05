//! The library's examples (crates/uext4/examples, crates/uext4-fuse/examples) run as a user
//! would run them, on scratch images: `build_image` makes an image from a host tree that
//! e2fsck passes and the kernel-independent tools read back, `walk_tree` lists it as
//! `find -printf '%y %s %P'` lists the tree, `read_file` gives a file's bytes, and
//! `mount_image` serves it through FUSE (where root and /dev/fuse are there).
//!
//! `cargo test` builds the examples; they are found beside this test's binary.

use std::path::PathBuf;
use std::process::Command;
use uext4_testkit::*;

/// target/<profile>/examples/NAME, from target/<profile>/deps/THIS_TEST.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is not built (cargo test builds examples)",
        p.display()
    );
    p
}

fn run(name: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(example(name)).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A host tree: nested directories, files of several sizes, a symlink.
fn host_tree(tag: &str) -> Scratch {
    let t = Scratch::dir(tag);
    sh(&format!(
        "cd {}; mkdir -p a/b/c empty; echo hello > hello.txt; head -c 70000 /dev/urandom > a/big.bin; \
         head -c 4096 /dev/urandom > a/b/block.bin; : > a/b/c/zero; ln -s ../hello.txt a/link; \
         chmod 600 a/big.bin",
        t.s()
    ));
    t
}

#[test]
fn build_walk_and_read_examples_agree_with_the_host_tree() {
    if !have(&["e2fsck"]) {
        println!("SKIP: needs e2fsprogs");
        return;
    }
    let tree = host_tree("examples-tree");
    let img = scratch("examples");
    run("build_image", &[img.s(), "32", tree.s()]);
    e2fsck_clean(&img.0);
    let ours = String::from_utf8(run("walk_tree", &[img.s()])).unwrap();
    let theirs = sh(&format!(
        "cd {} && find . -mindepth 1 -printf '%y %s %P\\n'",
        tree.s()
    ));
    // Directory sizes differ between filesystems: compare them by name only.
    let norm = |s: &str| {
        let mut v: Vec<String> = s
            .lines()
            .map(|l| {
                let w: Vec<&str> = l.splitn(3, ' ').collect();
                if w[0] == "d" {
                    format!("d - {}", w[2])
                } else {
                    l.to_string()
                }
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(norm(&ours), norm(&theirs));
    for f in [
        "hello.txt",
        "a/big.bin",
        "a/b/block.bin",
        "a/b/c/zero",
        "a/link",
    ] {
        let got = run("read_file", &[img.s(), &format!("/{f}")]);
        assert!(got == std::fs::read(tree.p(f)).unwrap(), "{f} differs");
    }
}

#[test]
fn the_mount_example_serves_an_image() {
    if !fuse_usable("the mount example") || !have(&["e2fsck"]) {
        return;
    }
    let tree = host_tree("examples-mount-tree");
    let img = scratch("examples-mount");
    run("build_image", &[img.s(), "32", tree.s()]);
    let mnt = Scratch::dir("examples-mnt");
    let exe = std::env::current_exe().unwrap();
    let server = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/mount_image");
    if !server.exists() {
        println!("SKIP: build the uext4-fuse examples (cargo test --workspace builds them)");
        return;
    }
    let mut child = Command::new(&server)
        .args([img.s(), mnt.s()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // However the checks below end, the mount goes (and the server with it).
    struct Unmount<'a>(&'a Scratch);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0 .0).status();
        }
    }
    let guard = Unmount(&mnt);
    let start = std::time::Instant::now();
    while !mnt.p("hello.txt").exists() {
        assert!(start.elapsed().as_secs() < 20, "the example did not mount");
        assert!(child.try_wait().unwrap().is_none(), "the example exited");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read(mnt.p("a/big.bin")).unwrap(),
        std::fs::read(tree.p("a/big.bin")).unwrap()
    );
    std::fs::write(mnt.p("new.txt"), b"through the mount\n").unwrap();
    drop(guard);
    assert!(
        child.wait().unwrap().success(),
        "the example failed after the unmount"
    );
    e2fsck_clean(&img.0);
    let got = run("read_file", &[img.s(), "/new.txt"]);
    assert_eq!(got, b"through the mount\n");
}
