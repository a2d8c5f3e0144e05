//! Bounded work whatever the image says: on-disk pointers that loop (the orphan list, extent
//! index blocks, the hashed index, EA inode references) or leave their structure (the
//! journal's log) end in an error naming the structure, never a hang, and
//! the reads around them stay bounded. Each image is crafted here with mke2fs, debugfs and
//! byte edits. (Allocation caps and other bounds are in corruption.rs and
//! fuzz_regressions.rs; docs/FUZZING.md lists them all.)

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use uext4::{Corruption, Fs, MountOptions};

fn debugfs_w(img: &Path, cmds: &str) {
    let script = scratch("bounds-cmds");
    std::fs::write(&script.0, cmds).unwrap();
    sh(&format!(
        "debugfs -w -f {} {} >/dev/null 2>&1",
        script.0.display(),
        img.display()
    ));
}

fn ino_of(img: &Path, path: &str) -> u32 {
    let out = sh(&format!(
        "debugfs -R 'stat {path}' {} 2>/dev/null",
        img.display()
    ));
    out.split_whitespace()
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no inode for {path}: {out}"))
}

fn put(img: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn corruption<T>(r: uext4::Result<T>) -> (Corruption, String) {
    match r {
        Err(e) => match e.corruption() {
            Some(k) => (k, e.to_string()),
            None => panic!("expected a corruption error, got {e}"),
        },
        Ok(_) => panic!("expected a corruption error, got success"),
    }
}

/// An orphan list whose two inodes name each other (i_dtime): the read-write open refuses it
/// as a cycle, naming the orphan list, instead of following it forever; read-only opens (which
/// leave orphans alone) read the rest of the image.
#[test]
fn an_orphan_list_that_loops_is_refused() {
    if !have(&["debugfs"]) {
        return;
    }
    let img = scratch("bounds-orphan");
    mke2fs(&img.0, "16M", &[]);
    debugfs_w(&img.0, "write /dev/null a\nwrite /dev/null b\nmkdir d\n");
    e2fsck_clean(&img.0);
    let (a, b) = (ino_of(&img.0, "a"), ino_of(&img.0, "b"));
    debugfs_w(
        &img.0,
        &format!(
            "unlink a\nunlink b\nsif <{a}> links_count 0\nsif <{b}> links_count 0\n\
             sif <{a}> dtime {b}\nsif <{b}> dtime {a}\nssv last_orphan {a}\n"
        ),
    );
    let (kind, msg) = corruption(Fs::open_path(&img.0, MountOptions::default()));
    assert_eq!(kind, Corruption::Orphan, "{msg}");
    assert!(msg.contains("cycle"), "{msg}");
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    assert!(fs.lookup(uext4::ROOT_INO, b"d").is_ok());
}

/// An extent index block made to point at itself (its header says depth 1, its one index
/// entry names its own block): each level must be one less deep than its parent, so the read
/// is refused at once, naming the inode, and no block is read twice.
#[test]
fn an_extent_index_block_that_points_at_itself_is_refused() {
    if !have(&["debugfs"]) {
        return;
    }
    let img = scratch("bounds-extent");
    mke2fs(&img.0, "16M", &["-O", "^metadata_csum"]);
    let data = scratch("bounds-extent-data");
    std::fs::write(&data.0, vec![b'a'; 40 * 4096]).unwrap();
    // Every other block punched out: 20 extents, past the 4 an inode holds, so a leaf block.
    let mut cmds = format!("write {} f\n", data.0.display());
    for i in (1..40).step_by(2) {
        cmds += &format!("punch f {i} {i}\n");
    }
    debugfs_w(&img.0, &cmds);
    e2fsck_clean(&img.0);
    let ex = sh(&format!(
        "debugfs -R 'ex f' {} 2>/dev/null",
        img.0.display()
    ));
    // " 0/ 1   1/  1     0 -    39  1292             40": the index entry's leaf block.
    let leaf: u64 = ex
        .lines()
        .find(|l| l.trim_start().starts_with("0/ 1"))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no index entry in\n{ex}"));
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let ino = fs.lookup(uext4::ROOT_INO, b"f").unwrap().ino;
    assert_eq!(read_all(&fs, ino).len(), 40 * 4096);
    drop(fs);
    // The leaf becomes an index node (depth 1) whose one entry is its own block.
    let mut node = vec![0u8; 24];
    node[0..2].copy_from_slice(&0xf30au16.to_le_bytes());
    node[2..4].copy_from_slice(&1u16.to_le_bytes()); // entries
    node[4..6].copy_from_slice(&340u16.to_le_bytes()); // max
    node[6..8].copy_from_slice(&1u16.to_le_bytes()); // depth
    node[16..20].copy_from_slice(&(leaf as u32).to_le_bytes()); // ei_leaf_lo
    put(&img.0, leaf * 4096, &node);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let mut buf = vec![0u8; 8192];
    let (kind, msg) = corruption(fs.read(ino, 0, &mut buf));
    assert_eq!(kind, Corruption::ExtentTree, "{msg}");
    assert!(msg.contains(&format!("inode {ino}")), "{msg}");
}

/// A hashed index whose root says it has a second level and whose entries all lead back to
/// the root block: a lookup in it is refused as damage of the index, not followed; the
/// directory is still listed (in block order), each entry once.
#[test]
fn an_htree_that_leads_back_to_its_root_is_refused() {
    if !have(&["debugfs", "e2fsck"]) {
        return;
    }
    let img = scratch("bounds-htree");
    mke2fs(&img.0, "16M", &["-O", "^metadata_csum"]);
    let mut cmds = String::from("mkdir big\n");
    for i in 0..300 {
        cmds += &format!("write /dev/null big/a-file-with-a-longer-name-{i}\n");
    }
    debugfs_w(&img.0, &cmds);
    sh(&format!(
        "e2fsck -fyD {} >/dev/null 2>&1; true",
        img.0.display()
    ));
    e2fsck_clean(&img.0);
    let blocks = sh(&format!(
        "debugfs -R 'blocks big' {} 2>/dev/null",
        img.0.display()
    ));
    let root: u64 = blocks.split_whitespace().next().unwrap().parse().unwrap();
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let big = fs.lookup(uext4::ROOT_INO, b"big").unwrap().ino;
    assert!(fs.lookup(big, b"a-file-with-a-longer-name-7").is_ok());
    drop(fs);
    // dx_root: "." (12 bytes), ".." (rec_len to the block's end), then the root info at 24:
    // reserved u32, hash version, info length, indirect levels (byte 30), flags; then the
    // count and limit at 32 and the entries (hash, block) from 40, the first block at 36.
    let f = std::fs::File::open(&img.0).unwrap();
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, root * 4096).unwrap();
    assert_eq!(b[29], 8, "not a dx root: {:?}", &b[24..40]);
    let count = u16::from_le_bytes([b[34], b[35]]) as usize;
    b[30] = 1;
    b[36..40].copy_from_slice(&0u32.to_le_bytes());
    for i in 1..count {
        b[40 + 8 * (i - 1) + 4..40 + 8 * i].copy_from_slice(&0u32.to_le_bytes());
    }
    put(&img.0, root * 4096, &b);
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let (kind, msg) = corruption(fs.lookup(big, b"a-file-with-a-longer-name-7"));
    assert_eq!(kind, Corruption::Directory, "{msg}");
    let mut names = std::collections::HashSet::new();
    let mut n = 0;
    let _ = fs.readdir(big, 0, &mut |e| {
        n += 1;
        names.insert(e.name);
        n < 100_000
    });
    assert_eq!(n, names.len(), "an entry listed twice");
    assert!(n <= 302, "{n} entries listed");
}

/// Sizes an image gives are not allocation sizes: a symlink claiming 4 GiB, and an xattr value
/// in a block claiming 4 GiB, are refused naming their structure (a symlink is at most a block,
/// a value lies inside its block), before any buffer of that size.
#[test]
fn sizes_on_disk_do_not_size_allocations() {
    if !have(&["debugfs"]) {
        return;
    }
    let img = scratch("bounds-sizes");
    mke2fs(&img.0, "16M", &["-O", "^metadata_csum"]);
    let big = scratch("bounds-sizes-value");
    std::fs::write(&big.0, vec![b'v'; 2000]).unwrap();
    debugfs_w(
        &img.0,
        &format!(
            "symlink l /{}\nwrite /dev/null g\nea_set -f {} g user.big\n",
            "t".repeat(200),
            big.0.display()
        ),
    );
    e2fsck_clean(&img.0);
    let l = ino_of(&img.0, "l");
    debugfs_w(&img.0, &format!("sif <{l}> size 0xffffffff\n"));
    let st = sh(&format!(
        "debugfs -R 'stat g' {} 2>/dev/null",
        img.0.display()
    ));
    let xblock: u64 = st
        .split("File ACL:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("g has no xattr block: {st}"));
    // The block's first entry (after the 32-byte header): e_value_size at byte 8.
    put(&img.0, xblock * 4096 + 32 + 8, &u32::MAX.to_le_bytes());
    let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
    let (kind, msg) = corruption(fs.readlink(l));
    assert_eq!(kind, Corruption::Inode, "{msg}");
    let g = fs.lookup(uext4::ROOT_INO, b"g").unwrap().ino;
    let (kind, msg) = corruption(fs.getxattr(g, b"user.big"));
    assert_eq!(kind, Corruption::Xattr, "{msg}");
}

/// The physical block of logical block `lblk` of inode `ino`, as debugfs's bmap says.
fn bmap(img: &Path, ino: u32, lblk: u64) -> u64 {
    let out = sh(&format!(
        "debugfs -R 'bmap <{ino}> {lblk}' {} 2>/dev/null",
        img.display()
    ));
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("bmap <{ino}> {lblk}: {out:?}"))
}

/// A journal superblock whose log lies outside the journal (a log longer than the inode
/// maps, a first log block of 0 or past the end, a start outside the log): the read-write
/// open, which walks the log from there and wraps at its end, refuses each at once, naming
/// the field. (Without metadata_csum, so that no checksum stands in front of the fields.)
#[test]
fn a_journal_superblock_whose_log_leaves_the_journal_is_refused() {
    if !have(&["debugfs"]) {
        return;
    }
    let base = scratch("bounds-jsb-base");
    mke2fs(&base.0, "32M", &["-O", "^metadata_csum"]);
    let jsb = bmap(&base.0, 8, 0) * 4096;
    let blocks = std::fs::metadata(&base.0).unwrap().len() / 4096;
    // (field offset, value, what the error names): big-endian jbd2 fields.
    for (off, value, says) in [
        (16u64, blocks as u32 * 2, "does not fit the journal inode"),
        (20, 0, "first log block"),
        (20, 1 << 30, "first log block"),
        (28, 1 << 30, "journal superblock"),
    ] {
        let img = scratch("bounds-jsb");
        std::fs::copy(&base.0, &img.0).unwrap();
        put(&img.0, jsb + off, &value.to_be_bytes());
        let (kind, msg) = corruption(Fs::open_path(&img.0, MountOptions::default()));
        assert_eq!(kind, Corruption::Journal, "field at {off}: {msg}");
        assert!(
            msg.contains(says) && !msg.contains('\n'),
            "field at {off}: {msg}"
        );
    }
}

/// Extended attribute entries whose EA inode reference leads nowhere it may: to the inode
/// itself (a reference loop), to an ordinary file (no EA_INODE flag), past the inode table.
/// Reading the attribute is refused as damage of the attributes, naming the inode, and the
/// file's data still reads. (Without metadata_csum: else the inode's checksum refuses the
/// edit first.)
#[test]
fn an_ea_inode_reference_that_loops_or_strays_is_refused() {
    if !have(&["debugfs"]) {
        return;
    }
    let base = scratch("bounds-ea-base");
    mke2fs(
        &base.0,
        "32M",
        &["-O", "ea_inode,^metadata_csum", "-I", "256"],
    );
    let value = scratch("bounds-ea-value");
    std::fs::write(&value.0, vec![b'v'; 9000]).unwrap();
    debugfs_w(
        &base.0,
        &format!("write /dev/null plain\nwrite {} f\n", value.0.display()),
    );
    let (f, plain) = (ino_of(&base.0, "f"), ino_of(&base.0, "plain"));
    // (uext4 sets the value: debugfs's ea_set leaves the owner's i_blocks short of the EA
    // inode's blocks, which e2fsck reports.)
    let fs = Fs::open_path(&base.0, MountOptions::default()).unwrap();
    fs.setxattr(f, b"user.big", &[b'v'; 9000], uext4::XattrFlags::Any)
        .unwrap();
    fs.unmount().unwrap();
    e2fsck_clean(&base.0);
    let fs = Fs::open_path(&base.0, MountOptions::ro()).unwrap();
    assert_eq!(fs.getxattr(f, b"user.big").unwrap(), vec![b'v'; 9000]);
    drop(fs);
    // The entry (in the inode's extra space): e_value_inum 4 bytes into it; found by the
    // EA inode number it holds now, just before the name "big".
    let imap = sh(&format!(
        "debugfs -R 'imap <{f}>' {} 2>/dev/null",
        base.0.display()
    ));
    let nums: Vec<u64> = imap
        .split(|c: char| !c.is_ascii_hexdigit() && c != 'x')
        .filter_map(|w| match w.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => w.parse().ok(),
        })
        .collect();
    // "Inode F is part of block group G\n\tlocated at block B, offset 0xOFF"
    let at = nums[nums.len() - 2] * 4096 + nums[nums.len() - 1];
    let raw = std::fs::read(&base.0).unwrap()[at as usize..at as usize + 256].to_vec();
    let name = raw
        .windows(3)
        .position(|w| w == b"big")
        .expect("the entry's name in the inode");
    let inum_at = at + name as u64 - 16 + 4;
    for (to, says) in [
        (f, "out of range"),
        (plain, "EA_INODE"),
        (1 << 30, "out of range"),
    ] {
        let img = scratch("bounds-ea");
        std::fs::copy(&base.0, &img.0).unwrap();
        put(&img.0, inum_at, &to.to_le_bytes());
        let fs = Fs::open_path(&img.0, MountOptions::ro()).unwrap();
        let (kind, msg) = corruption(fs.getxattr(f, b"user.big"));
        assert_eq!(kind, Corruption::Xattr, "EA inode {to}: {msg}");
        assert!(
            msg.contains(&format!("inode {f}")) && msg.contains(says),
            "{msg}"
        );
        assert_eq!(read_all(&fs, f), vec![b'v'; 9000]);
    }
}
