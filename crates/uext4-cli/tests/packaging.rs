//! uext4 as a system tool: scripts/install.sh into a scratch prefix installs the binaries, the
//! mount helpers, man pages that `man -l` renders and completions that complete; `uext4 bench`
//! runs the harness installed beside it; `--version` names the commit; `cargo install --path`
//! (offline, from the lock file) brings a working `uext4`, and its bench once installed too. Usage mistakes exit 2
//! in one line (with clap's suggestion and the subcommand's help named), and a missing image,
//! a directory given as an image, an image the user may not read and one that is not ext4
//! read the same from every command. `man` and bash are needed for their parts (skipped with
//! a message without them).

use std::path::{Path, PathBuf};
use std::process::Command;
use uext4_testkit::*;

const UEXT4: Cli = Cli(env!("CARGO_BIN_EXE_uext4"));

/// The workspace root (scripts/ is there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// Runs bash with the installed completion sourced and the line `words` being completed at
/// its last word; the candidates.
fn complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let line = words.join(" ");
    let prog = format!(
        "source '{}' || exit 9; complete -p uext4 >/dev/null || exit 8; \
         COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; \
         _uext4 uext4 '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let o = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &prog])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "bash completion of {words:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn installs_into_a_prefix_with_man_pages_and_completions() {
    let prefix = Scratch::dir("pkg-prefix");
    let target = Path::new(env!("CARGO_BIN_EXE_uext4"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    // install.sh takes the binaries from $CARGO_TARGET_DIR/release.
    if !Path::new(env!("CARGO_BIN_EXE_uext4")).starts_with(target.join("release")) {
        eprintln!("SKIP: install.sh installs the release build; this test runs another");
        return;
    }
    UEXT4.build_beside("uext4-bench");
    let o = Command::new(root().join("scripts/install.sh"))
        .env("PREFIX", &prefix.0)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "install.sh: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let p = |rel: &str| prefix.0.join(rel);
    for f in ["bin/uext4", "bin/uext4-bench"] {
        assert!(p(f).is_file(), "{f} installed");
    }
    for helper in ["sbin/mount.uext4", "sbin/mount.fuse.uext4"] {
        assert_eq!(
            std::fs::read_link(p(helper)).unwrap(),
            p("bin/uext4"),
            "{helper}"
        );
    }
    let uext4 = p("bin/uext4");

    // mount(8)'s helper exits as mount(8) expects: 32 for a failed mount, 1 for a usage
    // mistake.
    let missing = prefix.0.join("missing.img");
    let o = Command::new(p("sbin/mount.uext4"))
        .arg(&missing)
        .arg(&prefix.0)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(32), "{err}");
    assert!(err.contains("no such image file"), "{err}");
    let o = Command::new(p("sbin/mount.fuse.uext4"))
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");

    // --version: the package version, the commit and its date.
    let v = Command::new(&uext4).arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&v.stdout).trim().to_string();
    let (_, rest) = v.split_once(" (").unwrap_or_else(|| panic!("{v}"));
    let (commit, date) = rest
        .trim_end_matches(')')
        .split_once(' ')
        .unwrap_or_else(|| panic!("{v}"));
    if Path::new(&root().join(".git")).exists() {
        assert!(
            commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{v}: no commit"
        );
        assert!(
            date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
            "{v}: no date"
        );
    }

    // `uext4 bench --help` is the installed harness's help, found beside uext4 (even with
    // nothing on PATH).
    let o = Command::new(&uext4)
        .args(["bench", "--help"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && help.contains("--family <FAMILY>"),
        "uext4 bench --help: {help}{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A page for uext4 and for every command (and the subcommands of fscrypt and verity).
    let man1 = p("share/man/man1");
    let mut pages: Vec<String> = std::fs::read_dir(&man1)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for want in [
        "uext4.1",
        "uext4-mount.1",
        "uext4-mkfs.1",
        "uext4-ls.1",
        "uext4-cp.1",
        "uext4-completions.1",
        "uext4-fscrypt.1",
        "uext4-verity.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "{want} in {pages:?}");
    }
    assert!(
        !pages
            .iter()
            .any(|p| p.contains("__") || p == "uext4-help.1"),
        "{pages:?}"
    );
    if have(&["man"]) {
        for page in &pages {
            let o = Command::new("man")
                .arg("-l")
                .arg(man1.join(page))
                .env("MANWIDTH", "100")
                .env("MANPAGER", "cat")
                .env("PAGER", "cat")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            let name = page.trim_end_matches(".1");
            assert!(
                o.status.success() && text.contains("SYNOPSIS") && text.contains(name),
                "man -l {page}: {text}{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        // The options are documented on the page.
        let o = Command::new("man")
            .arg("-l")
            .arg(man1.join("uext4-mkfs.1"))
            .env("MANPAGER", "cat")
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&o.stdout).contains("mke2fs -L"));
    } else {
        eprintln!("SKIP: man -l needs man (scripts/install-deps.sh installs man-db)");
    }

    for f in [
        "share/bash-completion/completions/uext4",
        "share/zsh/site-functions/_uext4",
        "share/fish/vendor_completions.d/uext4.fish",
    ] {
        let text = std::fs::read_to_string(p(f)).unwrap();
        assert!(text.contains("mkdir") && text.contains("block-size"), "{f}");
    }
    if have(&["bash"]) {
        let bash = p("share/bash-completion/completions/uext4");
        let c = complete(&bash, &["uext4", "mkd"]);
        assert_eq!(c, ["mkdir"], "a subcommand");
        let c = complete(&bash, &["uext4", "mkfs", "--block-"]);
        assert_eq!(c, ["--block-size"], "an option");
        let c = complete(&bash, &["uext4", "ls", "--human"]);
        assert_eq!(c, ["--human-readable"], "an option of ls");
        let c = complete(&bash, &["uext4", "completions", "fi"]);
        assert_eq!(c, ["fish"], "a value");
    }
    if have(&["fish"]) {
        let fish = p("share/fish/vendor_completions.d/uext4.fish");
        let complete = |line: &str| -> Vec<String> {
            let prog = format!("source '{}'; complete -C '{line}'", fish.display());
            let o = Command::new("fish")
                .args(["--no-config", "-c", &prog])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "fish: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            // "candidate\tdescription" lines.
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.split('\t').next().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(complete("uext4 mkd"), ["mkdir"], "fish: a subcommand");
        assert_eq!(
            complete("uext4 mkfs --block-"),
            ["--block-size"],
            "fish: an option"
        );
    } else {
        eprintln!("SKIP: fish completions need fish (scripts/install-deps.sh installs it)");
    }
    if have(&["zsh"]) {
        // zsh parses the file, and compinit registers it as the completion of uext4.
        let dir = p("share/zsh/site-functions");
        let o = Command::new("zsh")
            .arg("-n")
            .arg(dir.join("_uext4"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "zsh -n: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let prog = format!(
            "fpath=('{}' $fpath); autoload -Uz compinit; compinit -u -D; print -r -- ${{_comps[uext4]}}",
            dir.display()
        );
        let o = Command::new("zsh")
            .args(["-f", "-c", &prog])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "_uext4",
            "zsh compinit"
        );
    } else {
        eprintln!("SKIP: zsh completions need zsh (scripts/install-deps.sh installs it)");
    }
}

/// `cargo install --path crates/PACKAGE --root ROOT`, offline, from the lock file, into the
/// target directory under test (so only the binaries are linked again).
fn cargo_install(package: &str, root_dir: &Path, target: &Path) {
    let o = Command::new(env!("CARGO"))
        .args(["install", "-q", "--locked", "--offline", "--path"])
        .arg(root().join("crates").join(package))
        .arg("--root")
        .arg(root_dir)
        .arg("--target-dir")
        .arg(target)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cargo install {package}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn cargo_install_brings_a_working_uext4() {
    let exe = Path::new(env!("CARGO_BIN_EXE_uext4"));
    if !exe.parent().unwrap().ends_with("release") {
        eprintln!("SKIP: cargo install builds the release profile; this test runs another");
        return;
    }
    let target = exe.parent().unwrap().parent().unwrap();
    let dest = Scratch::dir("pkg-cargo-install");
    cargo_install("uext4-cli", &dest.0, target);
    let uext4 = dest.0.join("bin/uext4");
    let v = Command::new(&uext4).arg("--version").output().unwrap();
    assert!(v.status.success());
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("uext4 0."));
    // Alone, `uext4 bench` says how to get its harness.
    let o = Command::new(&uext4)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cargo install --path crates/uext4-bench"),
        "{err}"
    );
    // With the harness installed beside it, `uext4 bench` runs it.
    cargo_install("uext4-bench", &dest.0, target);
    let o = Command::new(&uext4)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && help.contains("--family <FAMILY>"),
        "{help}"
    );
}

#[test]
fn help_is_there_for_every_command() {
    let o = UEXT4.run(&["help", "mount"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "uext4 help mount");
    assert!(out.contains("Usage: uext4 mount"), "{out}");
    for opt in [
        "transport=",
        "norecovery",
        "fakeroot",
        "prealloc=",
        "noatime",
    ] {
        assert!(out.contains(opt), "mount --help names {opt}");
    }
    // Every argument of every command has a description.
    let top = UEXT4.ok(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help" && c != "bench")
        .collect();
    assert!(commands.len() > 20, "{commands:?}");
    for c in &commands {
        let help = UEXT4.ok(&[c, "--help"]);
        let mut section = "";
        for l in help.lines() {
            if l.ends_with(':') && !l.starts_with(' ') {
                section = l;
                continue;
            }
            if (section == "Arguments:" || section == "Options:") && l.starts_with("  ") {
                let t = l.trim();
                // A described entry has text after its name (or on the next lines).
                let undescribed = !t.contains("  ") && !t.starts_with("-h, --help");
                assert!(
                    !undescribed || help.contains(&format!("{t}\n          ")),
                    "uext4 {c} --help: {t:?} has no description"
                );
            }
        }
    }
}

#[test]
fn usage_mistakes_exit_2_in_one_line() {
    let img = Scratch::new("pkg-usage");
    UEXT4.ok(&["mkfs", "--size", "8M", img.s()]);
    let e = UEXT4.fails_with(&["mout"], 2);
    assert!(e.contains("did you mean ") && e.contains("'mount'?"), "{e}");
    assert!(e.contains("see uext4 --help"), "{e}");
    let e = UEXT4.fails_with(&["mkfs", "--bloc-size", "1024", img.s()], 2);
    assert!(e.contains("did you mean '--block-size'?"), "{e}");
    assert!(e.contains("see uext4 mkfs --help"), "{e}");
    let e = UEXT4.fails_with(&["fscrypt", "get-policy", "--bogus", &img.at("/")], 2);
    assert!(e.contains("see uext4 fscrypt get-policy --help"), "{e}");
    let e = UEXT4.fails_with(&["ls", img.s()], 2);
    assert!(e.contains("expected IMAGE:PATH"), "{e}");
    UEXT4.fails_with(&["mkfs", "--size", "10X", &format!("{}.new", img.s())], 2);
    UEXT4.fails_with(&["truncate", "-s", "lots", &img.at("/f")], 2);
    // ls's -h is human-readable sizes (as ls(1)), not help.
    UEXT4.ok(&["truncate", "-s", "1536", &img.at("/f")]);
    let out = UEXT4.ok(&["ls", "-lh", &img.at("/")]);
    let f = out.lines().find(|l| l.ends_with(" f")).expect("f listed");
    assert!(f.contains(" 1.5K "), "{f}");
    assert!(UEXT4.ok(&["ls", "--help"]).contains("--human-readable"));
    // Several operands, as coreutils take them.
    UEXT4.ok(&["mkdir", &img.at("/a"), &img.at("/b")]);
    UEXT4.ok(&["touch", &img.at("/a/x"), &img.at("/b/y")]);
    UEXT4.ok(&["chmod", "600", &img.at("/a/x"), &img.at("/b/y")]);
    UEXT4.ok(&["chown", "7:8", &img.at("/a/x"), &img.at("/b/y")]);
    let out = UEXT4.ok(&["ls", "-l", &img.at("/b")]);
    assert!(out.starts_with("-rw-------   1     7     8"), "{out}");
    // One missing operand fails, and the others are still done.
    let e = UEXT4.fails(&["rm", &img.at("/a/x"), &img.at("/nope"), &img.at("/b/y")]);
    assert!(e.contains("/nope"), "{e}");
    assert_eq!(UEXT4.ok(&["ls", &img.at("/a")]).trim(), "");
    assert_eq!(UEXT4.ok(&["ls", &img.at("/b")]).trim(), "");
    UEXT4.ok(&["rm", "-r", &img.at("/a"), &img.at("/b")]);
    if have(&["e2fsck"]) {
        e2fsck_clean_when(&img.0, "after the commands of several operands");
    }
}

/// The commands that take an image, as (name, arguments) with `I` for the image.
const COMMANDS: &[&[&str]] = &[
    &["info", "I"],
    &["ls", "I:/"],
    &["cat", "I:/f"],
    &["stat", "I:/"],
    &["mkdir", "I:/d"],
    &["rm", "I:/f"],
    &["touch", "I:/f"],
    &["chmod", "644", "I:/f"],
    &["truncate", "-s", "1", "I:/f"],
    &["cp", "I:/f", "/tmp"],
    &["lsattr", "I:/"],
    &["label", "I"],
    &["fstrim", "I"],
    &["ncheck", "I", "2"],
    &["timeline", "I"],
    &["mount", "I", "/tmp"],
];

/// Runs every command on `image`; each must fail with exit status 1 in one line saying
/// `uext4: CMD: ` and then the same words. Those words.
fn same_words(image: &str, run: impl Fn(&[&str]) -> std::process::Output) -> String {
    let mut seen: Option<(String, String)> = None;
    for c in COMMANDS {
        let args: Vec<String> = c.iter().map(|a| a.replace('I', image)).collect();
        // (Only the image placeholder: command names hold no capital I.)
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "uext4 {args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "uext4 {args:?}: {err}");
        assert!(!err.contains("os error"), "uext4 {args:?}: {err}");
        let words = err
            .trim()
            .strip_prefix(&format!("uext4: {}: ", c[0]))
            .unwrap_or_else(|| panic!("uext4 {args:?}: {err}"))
            .to_string();
        match &seen {
            None => seen = Some((c[0].to_string(), words)),
            Some((first, w)) => assert_eq!(&words, w, "uext4 {} against uext4 {first}", c[0]),
        }
    }
    seen.unwrap().1
}

#[test]
fn the_same_failure_reads_the_same_from_every_command() {
    let dir = Scratch::dir("pkg-voice");
    let missing = dir.0.join("missing.img").display().to_string();
    let w = same_words(&missing, |a| UEXT4.run(a));
    assert!(
        w.starts_with(&format!("{missing}: no such image file")),
        "{w}"
    );
    let w = same_words(dir.s(), |a| UEXT4.run(a));
    assert!(
        w.starts_with(&format!("{}: is a directory, not an image", dir.s())),
        "{w}"
    );
    let zeros = dir.0.join("zeros.img");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let w = same_words(zeros.to_str().unwrap(), |a| UEXT4.run(a));
    assert!(w.contains("not an ext2/3/4 filesystem"), "{w}");

    // Permission denied: an image only root may read, used by someone else.
    let img = dir.0.join("private.img");
    UEXT4.ok(&["mkfs", "--size", "8M", img.to_str().unwrap()]);
    std::fs::set_permissions(&img, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let as_other = |a: &[&str]| {
        if is_root() {
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(env!("CARGO_BIN_EXE_uext4"))
                .args(a)
                .output()
                .unwrap()
        } else {
            UEXT4.run(a)
        }
    };
    if is_root() && !have(&["setpriv"]) {
        eprintln!("SKIP: permission denied as root needs setpriv");
        return;
    }
    if !is_root() {
        std::fs::set_permissions(&img, std::os::unix::fs::PermissionsExt::from_mode(0o0)).unwrap();
    }
    let w = same_words(img.to_str().unwrap(), as_other);
    assert!(
        w.starts_with(&format!("{}: permission denied", img.display())),
        "{w}"
    );
}
