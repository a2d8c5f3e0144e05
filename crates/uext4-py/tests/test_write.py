"""Writes with readonly=False, then e2fsck -fn finds the image clean and a read-only open
sees them."""

import stat

import pytest
import uext4

from conftest import fsck_clean, mkfs


def test_writes(tmp_path, tree):
    img = str(tmp_path / "rw.img")
    mkfs(img, tree)
    data = bytes(range(251)) * 1000
    with uext4.Filesystem(img, readonly=False) as fs:
        assert not fs.readonly
        fs.mkdir("/new")
        fs.write_file("/new/data.bin", data)
        fs.write_file("/hello.txt", b"replaced\n")
        fs.symlink("data.bin", "/new/link")
        fs.setxattr("/new/data.bin", "user.k", b"v")
        fs.remove("/victim.txt")
        fs.mkdir("/gone")
        fs.rmdir("/gone")
        with pytest.raises(IsADirectoryError):
            fs.remove("/new")
        with pytest.raises(OSError) as e:
            fs.rmdir("/a")
        assert e.value.errno == 39  # ENOTEMPTY
        with pytest.raises(FileExistsError):
            fs.mkdir("/new")
    fsck_clean(img)
    with uext4.Filesystem(img) as fs:
        assert fs.open("/new/link").read() == data
        assert fs.open("/hello.txt").read() == b"replaced\n"
        assert fs.open("/a/hardlink.txt").read() == b"replaced\n"
        assert stat.S_IMODE(fs.stat("/new/data.bin").st_mode) == 0o644
        assert fs.getxattr("/new/data.bin", "user.k") == b"v"
        assert not fs.exists("/victim.txt") and not fs.exists("/gone")
        assert sorted(fs.listdir("/new")) == ["data.bin", "link"]


def test_left_open_is_closed_clean(tmp_path, tree):
    img = str(tmp_path / "drop.img")
    mkfs(img, tree)
    fs = uext4.Filesystem(img, readonly=False)
    fs.write_file("/x", b"x")
    del fs
    fsck_clean(img)
