"""Images made at test time by e2fsprogs (mke2fs -d from a host tree), the host tree kept to
compare with: the whole image, the same filesystem at an offset, and in partition 1 of a GPT
disk."""

import os
import shutil
import subprocess

import pytest

MIB = 1 << 20


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def need(*tools):
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} is not installed")


def make_tree(root):
    """A tree with small, block-sized, large and empty files, nesting, symlinks (to a file, to
    a directory, dangling), a hard link and a name that is not UTF-8."""
    os.makedirs(os.path.join(root, "a", "b", "c"))
    os.makedirs(os.path.join(root, "empty"))
    files = {
        "hello.txt": b"hello, ext4\n",
        "empty.bin": b"",
        "a/block.bin": bytes(range(256)) * 16,
        "a/b/odd.bin": os.urandom(4097),
        "a/b/c/large.bin": os.urandom(3 * MIB + 123),
        "a/b/c/deep.txt": b"deep\n" * 1000,
        "victim.txt": b"soon deleted\n" * 100,
    }
    for name, data in files.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    os.symlink("hello.txt", os.path.join(root, "link-to-file"))
    os.symlink("a/b", os.path.join(root, "link-to-dir"))
    os.symlink("nowhere", os.path.join(root, "dangling"))
    os.link(os.path.join(root, "hello.txt"), os.path.join(root, "a", "hardlink.txt"))
    with open(os.path.join(os.fsencode(root), b"caf\xe9-latin1"), "wb") as f:
        f.write(b"not utf-8\n")
    os.chmod(os.path.join(root, "a", "block.bin"), 0o600)


@pytest.fixture(scope="session")
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tree") / "root")
    os.mkdir(root)
    make_tree(root)
    return root


def mkfs(image, tree, *extra, size="64M"):
    need("mke2fs")
    run("mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-d", tree, *extra, image, size)


@pytest.fixture(scope="session")
def image(tmp_path_factory, tree):
    img = str(tmp_path_factory.mktemp("img") / "fs.img")
    mkfs(img, tree)
    return img


@pytest.fixture(scope="session")
def offset_image(tmp_path_factory, tree):
    img = str(tmp_path_factory.mktemp("img") / "offset.img")
    mkfs(img, tree, "-E", f"offset={3 * MIB}")
    return img, 3 * MIB


@pytest.fixture(scope="session")
def partitioned_image(tmp_path_factory, tree):
    need("sgdisk")
    img = str(tmp_path_factory.mktemp("img") / "disk.img")
    with open(img, "wb") as f:
        f.truncate(70 * MIB)
    run("sgdisk", "-o", "-n", "1:2048:0", "-t", "1:8300", img)
    # Made apart and copied in (mke2fs -E offset= would clear the partition table).
    part = img + ".part"
    mkfs(part, tree)
    with open(part, "rb") as src, open(img, "r+b") as dst:
        dst.seek(2048 * 512)
        dst.write(src.read())
    os.unlink(part)
    return img


def fsck_clean(image):
    """e2fsck -fn finds nothing to fix."""
    need("e2fsck")
    r = subprocess.run(["e2fsck", "-fn", image], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
