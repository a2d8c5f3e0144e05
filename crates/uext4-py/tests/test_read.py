"""Reading a tree back: every file's bytes, stat fields, listdir and walk equal the host
tree's, through a path, a path-like, an open file, io.BytesIO, an offset and a partition."""

import io
import os
import pathlib
import stat

import pytest
import uext4

from conftest import fsck_clean


def host_walk(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = "/" + os.path.relpath(dirpath, root)
        rel = "/" if rel == "/." else rel
        out[rel] = (sorted(dirnames), sorted(filenames))
    return out


def image_walk(fs):
    return {d: (sorted(ds), sorted(fs_)) for d, ds, fs_ in fs.walk("/")}


def check_tree(fs, root):
    walked = image_walk(fs)
    lost = walked.pop("/lost+found")
    assert lost == ([], [])
    walked["/"][0].remove("lost+found")
    assert walked == host_walk(root)
    for d, (dirs, files) in walked.items():
        names = fs.listdir(d)
        if d == "/":
            names.remove("lost+found")
        assert sorted(names) == sorted(os.listdir(os.path.join(root, d.lstrip("/")) or root))
        for name in dirs + files:
            p = os.path.join(d, name)
            h = os.lstat(os.path.join(root, p.lstrip("/")))
            s = fs.lstat(p)
            assert stat.S_IFMT(s.st_mode) == stat.S_IFMT(h.st_mode), p
            assert stat.S_IMODE(s.st_mode) == stat.S_IMODE(h.st_mode), p
            assert (s.st_uid, s.st_gid) == (h.st_uid, h.st_gid), p
            assert int(s.st_mtime) == int(h.st_mtime), p
            assert s.st_mtime_ns // 10**9 == int(h.st_mtime)
            assert s.st_birthtime is not None and s.st_birthtime_ns is not None
            if stat.S_ISREG(h.st_mode):
                assert s.st_size == h.st_size, p
                assert s.st_nlink == h.st_nlink, p
                with open(os.path.join(root, p.lstrip("/")), "rb") as f:
                    want = f.read()
                with fs.open(p) as f:
                    assert f.read() == want, p
            elif stat.S_ISLNK(h.st_mode):
                assert fs.readlink(p) == os.readlink(os.path.join(root, p.lstrip("/")))


def test_through_a_path(image, tree):
    with uext4.Filesystem(image) as fs:
        check_tree(fs, tree)
    assert fs.closed


def test_through_a_pathlike(image, tree):
    with uext4.Filesystem(pathlib.Path(image)) as fs:
        check_tree(fs, tree)


def test_through_an_open_file(image, tree):
    with open(image, "rb") as f, uext4.Filesystem(f) as fs:
        check_tree(fs, tree)


def test_through_bytesio(image, tree):
    with open(image, "rb") as f:
        data = io.BytesIO(f.read())
    with uext4.Filesystem(data) as fs:
        check_tree(fs, tree)


def test_through_an_offset(offset_image, tree):
    path, offset = offset_image
    with uext4.Filesystem(path, offset=offset) as fs:
        check_tree(fs, tree)
    with open(path, "rb") as f, uext4.Filesystem(f, offset=offset) as fs:
        check_tree(fs, tree)


def test_through_a_partition(partitioned_image, tree):
    with uext4.Filesystem(partitioned_image, partition=1) as fs:
        check_tree(fs, tree)
    with open(partitioned_image, "rb") as f, uext4.Filesystem(f, partition=1) as fs:
        check_tree(fs, tree)
    with pytest.raises(OSError):
        uext4.Filesystem(partitioned_image, partition=2)


def test_reading_leaves_the_image_unchanged(image, tree):
    before = open(image, "rb").read()
    with uext4.Filesystem(image) as fs:
        check_tree(fs, tree)
        list(fs.scandir("/", deleted=True))
        fs.inode(2)
    assert open(image, "rb").read() == before
    fsck_clean(image)


def test_file_objects(image, tree):
    want = open(os.path.join(tree, "a/b/c/large.bin"), "rb").read()
    with uext4.Filesystem(image) as fs:
        with fs.open("/a/b/c/large.bin") as f:
            assert isinstance(f, io.BufferedReader)
            assert f.seek(-100, os.SEEK_END) == len(want) - 100
            assert f.read() == want[-100:]
            f.seek(5000)
            assert f.tell() == 5000
            assert f.read(10) == want[5000:5010]
            assert f.seek(10, os.SEEK_CUR) == 5020
        assert f.closed
        with fs.open("/a/b/c/large.bin", buffering=0) as raw:
            assert isinstance(raw, uext4.File) and isinstance(raw, io.RawIOBase)
            assert raw.readable() and raw.seekable() and not raw.writable()
            buf = bytearray(70000)
            assert raw.readinto(buf) == 70000 and bytes(buf) == want[:70000]
            raw.seek(-10, 2)
            n = raw.readinto(memoryview(buf)[:100])
            assert n == 10 and bytes(buf[:10]) == want[-10:]
            assert raw.read() == b""
            raw.seek(0)
            assert raw.readall() == want
            with pytest.raises(io.UnsupportedOperation):
                raw.fileno()
        with pytest.raises(ValueError):
            raw.read()
        with fs.open("/a/b/c/deep.txt") as f:
            assert f.readline() == b"deep\n"
            assert len(f.readlines()) == 999
        ino = fs.stat("/hello.txt").st_ino
        with fs.open(ino) as f:
            assert f.read() == b"hello, ext4\n"


def test_stat_and_symlinks(image):
    with uext4.Filesystem(image) as fs:
        s = fs.stat("/link-to-file")
        assert stat.S_ISREG(s.st_mode) and s.st_size == 12
        assert stat.S_ISLNK(fs.lstat("/link-to-file").st_mode)
        assert fs.stat("/link-to-dir/c/deep.txt").st_size == 5000
        assert fs.stat("/a/hardlink.txt").st_ino == fs.stat("/hello.txt").st_ino
        assert fs.stat("/hello.txt").st_nlink == 2
        r = fs.stat("/")
        assert r.st_ino == 2 and r[1] == 2 and len(r) == 10 and r[0] == r.st_mode
        assert r[8] == int(r.st_mtime)
        assert isinstance(r.flags, int) and isinstance(r.generation, int)
        assert fs.stat(2).st_ino == 2
        assert fs.exists("/hello.txt") and not fs.exists("/dangling") and not fs.exists("/no")
        assert fs.readlink("/dangling") == "nowhere"
        assert fs.readlink(b"/dangling") == b"nowhere"
        assert b"caf\xe9-latin1" in fs.listdir(b"/")


def test_errors(image):
    with uext4.Filesystem(image) as fs:
        with pytest.raises(FileNotFoundError) as e:
            fs.stat("/nope")
        assert e.value.errno == 2 and e.value.filename == "/nope"
        with pytest.raises(FileNotFoundError):
            fs.open("/dangling")
        with pytest.raises(NotADirectoryError):
            fs.stat("/hello.txt/x")
        with pytest.raises(NotADirectoryError):
            fs.listdir("/hello.txt")
        with pytest.raises(IsADirectoryError):
            fs.open("/a")
        with pytest.raises(OSError) as e:
            fs.write_file("/new", b"x")
        assert e.value.errno == 30  # EROFS: opened read-only
        with pytest.raises(OSError) as e:
            fs.getxattr("/hello.txt", "user.none")
        assert e.value.errno == 61  # ENODATA
    with pytest.raises(ValueError):
        fs.stat("/")
    with pytest.raises(FileNotFoundError):
        uext4.Filesystem("/no/such/image")
    with pytest.raises(TypeError):
        uext4.Filesystem(42.0)
    with pytest.raises(ValueError):
        uext4.Filesystem(io.BytesIO(b""), readonly=False)


def test_scandir_and_walk(image, tree):
    with uext4.Filesystem(image) as fs:
        with fs.scandir("/") as it:
            entries = {e.name: e for e in it}
        assert entries["a"].is_dir() and not entries["a"].is_symlink()
        assert entries["hello.txt"].is_file() and entries["hello.txt"].path == "/hello.txt"
        assert entries["link-to-dir"].is_symlink() and entries["link-to-dir"].is_dir()
        assert not entries["link-to-dir"].is_dir(follow_symlinks=False)
        assert not entries["dangling"].is_file()
        assert entries["hello.txt"].inode() == fs.stat("/hello.txt").st_ino
        assert entries["hello.txt"].stat().st_size == 12
        assert os.fspath(entries["a"]) == "/a"
        assert not any(e.deleted for e in entries.values())
        # os.walk's conventions: symlinks to directories listed, not followed; pruning.
        top = next(iter(fs.walk("/")))
        assert "link-to-dir" in top[1]
        seen = []
        for d, dirs, files in fs.walk("/"):
            seen.append(d)
            if d == "/":
                dirs[:] = ["a"]
        assert seen == ["/", "/a", "/a/b", "/a/b/c"]
        followed = [d for d, _, _ in fs.walk("/", followlinks=True)]
        assert "/link-to-dir/c" in followed
        up = [d for d, _, _ in fs.walk("/a", topdown=False)]
        assert up == ["/a/b/c", "/a/b", "/a"]
        errors = []
        assert list(fs.walk("/nope", onerror=errors.append)) == []
        assert isinstance(errors[0], FileNotFoundError)


def test_typed():
    """The wheel carries the stubs and the py.typed marker (maturin adds it with uext4.pyi)."""
    d = os.path.dirname(uext4.__file__)
    assert os.path.exists(os.path.join(d, "py.typed"))
    assert os.path.exists(os.path.join(d, "__init__.pyi"))
