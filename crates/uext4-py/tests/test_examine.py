"""The examiner's side: inodes by number with their extents and times, deleted entries,
xattrs."""

import os
import subprocess
import sys

import pytest
import uext4

from conftest import fsck_clean, mkfs, need


def test_inode_and_extents(image, tree):
    want = open(os.path.join(tree, "a/b/c/large.bin"), "rb").read()
    with uext4.Filesystem(image) as fs:
        s = fs.stat("/a/b/c/large.bin")
        ino = fs.inode(s.st_ino)
        assert ino.number == s.st_ino and ino.allocated and ino.dtime == 0
        assert ino.size == len(want) and ino.mode == s.st_mode
        assert ino.mtime_ns == s.st_mtime_ns and ino.crtime_ns == s.st_birthtime_ns
        assert ino.uses_extents and not ino.inline_data and ino.map_damage is None
        assert ino.checksum_ok is True and len(ino.raw) >= 128
        bs = fs.stat("/").st_blksize
        # The extents read straight from the image give the file's bytes.
        got = bytearray()
        with open(image, "rb") as img:
            for x in sorted(ino.extents, key=lambda x: x.logical):
                assert x.logical * bs == len(got) and not x.unwritten
                img.seek(x.physical * bs)
                got += img.read(x.length * bs)
        assert bytes(got[: len(want)]) == want


def test_deleted_entries(tmp_path, tree):
    need("debugfs")
    img = str(tmp_path / "deleted.img")
    mkfs(img, tree)
    with uext4.Filesystem(img) as fs:
        victim = fs.stat("/victim.txt").st_ino
    subprocess.run(["debugfs", "-w", "-R", "rm /victim.txt", img], check=True, capture_output=True)
    fsck_clean(img)
    with uext4.Filesystem(img) as fs:
        assert "victim.txt" not in fs.listdir("/")
        live = {e.name for e in fs.scandir("/")}
        entries = list(fs.scandir("/", deleted=True))
        gone = [e for e in entries if e.deleted]
        assert [e.name for e in gone] == ["victim.txt"]
        assert gone[0].inode() == victim and gone[0].is_file()
        assert gone[0].stat().st_ino == victim
        assert {e.name for e in entries if not e.deleted} == live
        rec = fs.inode(victim)
        assert not rec.allocated and rec.dtime != 0 and rec.links_count == 0


def test_xattrs(tmp_path, tree):
    need("debugfs")
    img = str(tmp_path / "xattr.img")
    mkfs(img, tree)
    big = "v" * 3000
    for name, value in [("user.small", "1"), ("user.big", big), ("trusted.t", "tt")]:
        subprocess.run(["debugfs", "-w", "-R", f"ea_set /hello.txt {name} {value}", img],
                       check=True, capture_output=True)
    fsck_clean(img)
    with uext4.Filesystem(img) as fs:
        names = fs.listxattr("/hello.txt")
        assert {"user.small", "user.big", "trusted.t"} <= set(names)
        assert fs.getxattr("/hello.txt", "user.small") == b"1"
        assert fs.getxattr("/hello.txt", b"user.big") == big.encode()
        assert fs.getxattr("/link-to-file", "trusted.t") == b"tt"
        assert fs.listxattr("/a") == []


def test_dfvfs_adapter_example(image):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "dfvfs_adapter.py")
    out = subprocess.run([sys.executable, example, image, "/a"], check=True,
                         capture_output=True, text=True).stdout
    assert "/a/block.bin" in out and "extents=[(" in out


def _logdump_old(image):
    """(sequence, fs block, log block) of every tag debugfs's `logdump -aO` finds, old
    (checkpointed) transactions included. Where it stops ("end of journal") -O goes on."""
    out = subprocess.run(["debugfs", "-R", "logdump -aO", image], capture_output=True,
                         text=True).stdout
    seen, seq = set(), None
    for line in out.splitlines():
        # The descriptor's own header (its "Dumping ..." line numbers old ones wrongly).
        if line.startswith("Found expected sequence ") and "(descriptor block)" in line:
            seq = int(line.split()[3].rstrip(","))
        elif line.strip().startswith("FS block ") and seq is not None:
            w = line.split()
            seen.add((seq, int(w[2]), int(w[7])))
    return seen


def test_journal_history(tmp_path, tree):
    need("debugfs")
    img = str(tmp_path / "journal.img")
    mkfs(img, tree)
    with uext4.Filesystem(img, readonly=False) as fs:
        fs.write_file("/new.txt", b"first\n")
        fs.write_file("/new2.txt", b"second\n" * 1000)
        number = fs.stat("/new.txt").st_ino
        fs.remove("/victim.txt")
    fsck_clean(img)
    with uext4.Filesystem(img) as fs:
        txns = fs.journal()
        copies = fs.logged_inodes(number)
    assert txns and all(t.committed and t.commit_time_ns for t in txns)
    assert [t.sequence for t in txns] == sorted(t.sequence for t in txns)
    ours = {(t.sequence, b.block, b.log_block) for t in txns for b in t.blocks}
    assert ours == _logdump_old(img)
    # new.txt's inode was logged: its copies are its inode, in use with a link.
    assert copies and all(ino.number == number for _, ino in copies)
    assert copies[-1][1].size == len(b"first\n") and copies[-1][1].links_count == 1
