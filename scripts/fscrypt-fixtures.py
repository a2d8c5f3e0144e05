#!/usr/bin/env python3
"""Makes ext4 images with fscrypt-encrypted directories through the kernel, and a JSON
manifest of what the kernel shows with the key (names, contents, symlink targets) and
without it (no-key names), for crates/uext4/src/crypto/tests.rs.

Usage: fscrypt-fixtures.py OUTDIR
       fscrypt-fixtures.py --list IMAGE KEYFILE VERSION DIR
       fscrypt-fixtures.py --casefold-base IMAGE KEYFILE
       fscrypt-fixtures.py --android IMAGE KEYFILE

The third form is for encrypted casefolded directories, which a kernel without
CONFIG_UNICODE cannot mount: it makes IMAGE with `-O encrypt` (4 KiB blocks, 64 MiB),
loop-mounts it, adds a fresh v2 key (written to KEYFILE), makes the empty encrypted
directories `cf` and `big` (AES-256-XTS / AES-256-CTS, 16-byte padding), the kernel-filled
encrypted directory `kfill` and an empty v1 directory `v1` (the same key, by descriptor),
unmounts, and turns on `casefold` with tune2fs. It prints, as
JSON, the identifier and the directories' inode numbers. uext4 then casefolds the empty
directories (chattr +F needs the key) and fills them.

The second form loop-mounts IMAGE, adds the raw key in KEYFILE (VERSION 1: under the
descriptor the tools compute; 2: by identifier) and prints, as JSON, the listing of DIR
(relative to the image's root) as the kernel shows it with the key, in the manifest's form
(names, sizes, SHA-256 of contents, symlink targets): what tests compare with what uext4
wrote.

Per filesystem variant (plain `-O encrypt`, `-O encrypt,stable_inodes`,
`-O encrypt,inline_data`, `-O encrypt,casefold`) it makes OUTDIR/<variant>.img (4 KiB blocks), loop-mounts it,
and for each policy adds a fresh random 64-byte key (written as OUTDIR/<policy>.key, the
raw key bytes), makes a directory, sets the policy and fills it: an empty file, a small
file, a multi-block file, a sparse file, names of 1 to 255 bytes, a fast and a slow
symlink and a subdirectory with a file. It unmounts (which drops the keys), mounts
again and records the no-key names. Policies the kernel refuses (EINVAL, ENOPKG,
EOPNOTSUPP: modes missing from its crypto API, features missing from the filesystem) are
recorded as skipped, with the reason.

Prints `SKIP: why` and exits 0 where it cannot run (not root, no loop devices, no fscrypt).
Standard library only.
"""
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

# include/uapi/linux/fscrypt.h
FS_IOC_SET_ENCRYPTION_POLICY = 0x800C6613  # _IOR('f', 19, struct fscrypt_policy_v1)
FS_IOC_ADD_ENCRYPTION_KEY = 0xC0506617  # _IOWR('f', 23, struct fscrypt_add_key_arg)
KEY_SPEC_TYPE_DESCRIPTOR = 1
KEY_SPEC_TYPE_IDENTIFIER = 2
MODES = {"AES-256-XTS": 1, "AES-256-CTS": 4, "AES-128-CBC": 5, "AES-128-CTS": 6,
         "ADIANTUM": 9, "AES-256-HCTR2": 10}
PAD = {4: 0, 8: 1, 16: 2, 32: 3}
DIRECT_KEY, IV_INO_LBLK_64, IV_INO_LBLK_32 = 0x04, 0x08, 0x10

# (name, fs variant, version, contents, filenames, padding, extra flags)
POLICIES = [
    ("v1-xts-cts-pad4", "plain", 1, "AES-256-XTS", "AES-256-CTS", 4, 0),
    ("v1-xts-cts-pad32", "plain", 1, "AES-256-XTS", "AES-256-CTS", 32, 0),
    ("v2-xts-cts-pad16", "plain", 2, "AES-256-XTS", "AES-256-CTS", 16, 0),
    ("v2-xts-cts-pad4", "plain", 2, "AES-256-XTS", "AES-256-CTS", 4, 0),
    ("v2-xts-hctr2-pad32", "plain", 2, "AES-256-XTS", "AES-256-HCTR2", 32, 0),
    ("v2-cbc-cts-pad8", "plain", 2, "AES-128-CBC", "AES-128-CTS", 8, 0),
    ("v1-cbc-cts-pad16", "plain", 1, "AES-128-CBC", "AES-128-CTS", 16, 0),
    ("v2-adiantum-direct-pad4", "plain", 2, "ADIANTUM", "ADIANTUM", 4, DIRECT_KEY),
    ("v2-adiantum-pad16", "plain", 2, "ADIANTUM", "ADIANTUM", 16, 0),
    ("v1-adiantum-direct-pad32", "plain", 1, "ADIANTUM", "ADIANTUM", 32, DIRECT_KEY),
    ("v2-xts-cts-lblk64", "stable", 2, "AES-256-XTS", "AES-256-CTS", 16, IV_INO_LBLK_64),
    ("v2-xts-cts-lblk32", "stable", 2, "AES-256-XTS", "AES-256-CTS", 32, IV_INO_LBLK_32),
    ("v2-xts-cts-inline", "inline", 2, "AES-256-XTS", "AES-256-CTS", 16, 0),
    ("v2-xts-cts-casefold", "casefold", 2, "AES-256-XTS", "AES-256-CTS", 16, 0),
]
VARIANTS = {"plain": "encrypt", "stable": "encrypt,stable_inodes", "inline": "encrypt,inline_data",
            "casefold": "encrypt,casefold"}
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_CASEFOLD_FL = 0x80086601, 0x40086602, 0x40000000
BLOCK = 4096


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(0)


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def key_spec(kind, value):
    return struct.pack("<II32s", kind, 0, value)


def add_key(mnt, raw, descriptor=None):
    """FS_IOC_ADD_ENCRYPTION_KEY; returns the identifier (v2) or the descriptor (v1)."""
    spec = key_spec(KEY_SPEC_TYPE_DESCRIPTOR, descriptor) if descriptor else key_spec(KEY_SPEC_TYPE_IDENTIFIER, b"")
    arg = bytearray(spec + struct.pack("<II32x", len(raw), 0) + raw)
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, arg, True)
    finally:
        os.close(fd)
    return bytes(arg[8:8 + 8]) if descriptor else bytes(arg[8:8 + 16])


def set_policy(path, version, contents, filenames, flags, key):
    if version == 1:
        arg = struct.pack("<BBBB8s", 0, contents, filenames, flags, key)
    else:
        arg = struct.pack("<BBBBB3x16s", 2, contents, filenames, flags, 0, key)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, arg)
    finally:
        os.close(fd)


def fill(d):
    """Files of every shape; returns nothing (the listing is taken afterwards)."""
    rnd = os.urandom
    open(os.path.join(d, "empty"), "wb").close()
    with open(os.path.join(d, "small.txt"), "wb") as f:
        f.write(b"hello, fscrypt\n")
    with open(os.path.join(d, "multi.bin"), "wb") as f:
        f.write(rnd(3 * BLOCK + 100))
    with open(os.path.join(d, "sparse.bin"), "wb") as f:
        f.write(rnd(BLOCK))
        f.seek(5 * BLOCK + 17)
        f.write(rnd(1000))
    for n in (1, 15, 16, 17, 31, 33, 100, 148, 149, 150, 200, 254, 255):
        name = ("n%d-" % n + "x" * 255)[:n] if n > 4 else "abcde"[:n]
        with open(os.path.join(d, name), "wb") as f:
            f.write(name.encode())
    os.symlink("small.txt", os.path.join(d, "fast-link"))
    os.symlink("/" + "t" * 120 + "/target", os.path.join(d, "slow-link"))
    os.mkdir(os.path.join(d, "sub"))
    with open(os.path.join(d, "sub", "inner.txt"), "wb") as f:
        f.write(b"inner\n")


def listing(d):
    """Entries of directory d (recursively) with the kernel's view, keyed by inode."""
    out = []
    for e in sorted(os.scandir(d), key=lambda e: e.name):
        st = os.lstat(e.path)
        rec = {"name_hex": os.fsencode(e.name).hex(), "ino": st.st_ino, "parent_ino": os.lstat(d).st_ino}
        if e.is_symlink():
            rec["type"] = "symlink"
            rec["target_hex"] = os.fsencode(os.readlink(e.path)).hex()
        elif e.is_dir():
            rec["type"] = "dir"
            out.extend(listing(e.path))
        else:
            rec["type"] = "file"
            with open(e.path, "rb") as f:
                data = f.read()
            rec["size"] = len(data)
            rec["sha256"] = hashlib.sha256(data).hexdigest()
        out.append(rec)
    return out


def nokey_listing(d):
    out = {}
    for e in os.scandir(d):
        st = os.lstat(e.path)
        out[st.st_ino] = os.fsencode(e.name).hex()
        if e.is_dir(follow_symlinks=False):
            out.update(nokey_listing(e.path))
    return out


def nokey_targets(d):
    out = {}
    for e in os.scandir(d):
        if e.is_symlink():
            try:
                out[os.lstat(e.path).st_ino] = os.fsencode(os.readlink(e.path)).hex()
            except OSError:
                pass
        elif e.is_dir(follow_symlinks=False):
            out.update(nokey_targets(e.path))
    return out


@contextlib.contextmanager
def loop_mounted(img, prefix):
    """IMAGE loop-mounted on a fresh directory (SKIP where it cannot be), unmounted after."""
    mnt = tempfile.mkdtemp(prefix=prefix)
    try:
        r = subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True, text=True)
        if r.returncode != 0:
            skip("cannot loop-mount the image: " + " ".join(r.stderr.split()))
        try:
            yield mnt
        finally:
            run("umount", mnt)
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        os.rmdir(mnt)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    outdir = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        skip("not root")
    if not shutil.which("mke2fs") or not shutil.which("mount"):
        skip("no mke2fs or mount")
    if not os.path.exists("/sys/fs/ext4/features/encryption"):
        skip("the kernel's ext4 has no encryption")
    os.makedirs(outdir, exist_ok=True)
    manifest = {"block_size": BLOCK, "images": {}, "policies": []}
    for variant, features in VARIANTS.items():
        img = os.path.join(outdir, variant + ".img")
        if os.path.exists(img):
            os.remove(img)
        run("mke2fs", "-q", "-F", "-t", "ext4", "-b", str(BLOCK), "-I", "256", "-O", features, img, "32M")
        mnt = tempfile.mkdtemp(prefix="fscrypt-fixture-")
        try:
            r = subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True, text=True)
            if r.returncode != 0:
                if variant == "plain":
                    skip("cannot loop-mount an ext4 image: " + r.stderr.strip())
                # A feature this kernel lacks (casefold needs CONFIG_UNICODE).
                why = f"cannot mount -O {features}: " + " ".join(r.stderr.split())
                for (name, pvariant, *_rest) in POLICIES:
                    if pvariant == variant:
                        manifest["policies"].append({"name": name, "image": variant, "skipped": why})
                        print(f"{name}: skipped: {why}")
                continue
            manifest["images"][variant] = {"image": variant + ".img", "features": features}
            for (name, pvariant, version, cmode, fmode, pad, extra) in POLICIES:
                if pvariant != variant:
                    continue
                rec = {"name": name, "image": variant, "version": version, "contents_mode": MODES[cmode],
                       "filenames_mode": MODES[fmode], "flags": PAD[pad] | extra}
                raw = os.urandom(64)
                with open(os.path.join(outdir, name + ".key"), "wb") as f:
                    f.write(raw)
                rec["key_file"] = name + ".key"
                d = os.path.join(mnt, name)
                os.mkdir(d)
                try:
                    if variant == "casefold":
                        # Casefolding is set on the empty directory, before its policy.
                        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                        try:
                            fl = bytearray(4)
                            fcntl.ioctl(fd, FS_IOC_GETFLAGS, fl, True)
                            flags = struct.unpack("<i", fl)[0] | FS_CASEFOLD_FL
                            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("<i", flags))
                        finally:
                            os.close(fd)
                    if version == 1:
                        desc = hashlib.sha512(hashlib.sha512(raw).digest()).digest()[:8]
                        add_key(mnt, raw, desc)
                        set_policy(d, 1, MODES[cmode], MODES[fmode], rec["flags"], desc)
                    else:
                        ident = add_key(mnt, raw)
                        rec["identifier"] = ident.hex()
                        set_policy(d, 2, MODES[cmode], MODES[fmode], rec["flags"], ident)
                    fill(d)
                except OSError as e:
                    if e.errno in (errno.EINVAL, errno.ENOPKG, errno.EOPNOTSUPP, errno.ENOKEY):
                        rec["skipped"] = f"{os.strerror(e.errno)} ({errno.errorcode[e.errno]})"
                        manifest["policies"].append(rec)
                        print(f"{name}: skipped: {rec['skipped']}")
                        continue
                    raise
                rec["dir_ino"] = os.lstat(d).st_ino
                rec["entries"] = listing(d)
                manifest["policies"].append(rec)
                print(f"{name}: {len(rec['entries'])} entries")
            run("umount", mnt)
            # Again without the keys: they went with the unmount.
            run("mount", "-o", "loop", img, mnt)
            for rec in manifest["policies"]:
                if rec["image"] != variant or "skipped" in rec:
                    continue
                d = os.path.join(mnt, rec["name"])
                nk = nokey_listing(d)
                tg = nokey_targets(d)
                for e in rec["entries"]:
                    e["nokey_name_hex"] = nk.get(e["ino"])
                    if e["ino"] in tg:
                        e["nokey_target_hex"] = tg[e["ino"]]
            run("umount", mnt)
        finally:
            subprocess.run(["umount", mnt], capture_output=True)
            os.rmdir(mnt)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("manifest:", os.path.join(outdir, "manifest.json"))


def list_with_key(img, key_file, version, rel):
    if os.geteuid() != 0:
        skip("not root")
    with open(key_file, "rb") as f:
        raw = f.read()
    with loop_mounted(img, "fscrypt-list-") as mnt:
        if version == 1:
            add_key(mnt, raw, hashlib.sha512(hashlib.sha512(raw).digest()).digest()[:8])
        else:
            add_key(mnt, raw)
        print(json.dumps(listing(os.path.join(mnt, rel))))


def fresh_image(img, key_file, features):
    """A new 64 MiB image at IMG with `features` (SKIP where the kernel cannot fill it), and
    a fresh random 64-byte key written to KEY_FILE: the key's bytes."""
    if os.geteuid() != 0:
        skip("not root")
    if not shutil.which("mke2fs") or not shutil.which("tune2fs") or not shutil.which("mount"):
        skip("no mke2fs, tune2fs or mount")
    if not os.path.exists("/sys/fs/ext4/features/encryption"):
        skip("the kernel's ext4 has no encryption")
    if os.path.exists(img):
        os.remove(img)
    run("mke2fs", "-q", "-F", "-t", "ext4", "-b", str(BLOCK), "-I", "256", "-N", "16384",
        "-O", features, img, "64M")
    raw = os.urandom(64)
    with open(key_file, "wb") as f:
        f.write(raw)
    return raw


def casefold_base(img, key_file):
    raw = fresh_image(img, key_file, "encrypt")
    out = {}
    with loop_mounted(img, "fscrypt-cf-") as mnt:
        ident = add_key(mnt, raw)
        out["identifier"] = ident.hex()
        for name in ("cf", "big", "kfill"):
            d = os.path.join(mnt, name)
            os.mkdir(d)
            set_policy(d, 2, MODES["AES-256-XTS"], MODES["AES-256-CTS"], PAD[16], ident)
            out[name + "_ino"] = os.lstat(d).st_ino
        fill(os.path.join(mnt, "kfill"))
        out["kfill"] = listing(os.path.join(mnt, "kfill"))
        desc = hashlib.sha512(hashlib.sha512(raw).digest()).digest()[:8]
        add_key(mnt, raw, desc)
        d = os.path.join(mnt, "v1")
        os.mkdir(d)
        set_policy(d, 1, MODES["AES-256-XTS"], MODES["AES-256-CTS"], PAD[16], desc)
        out["v1_ino"] = os.lstat(d).st_ino
    run("tune2fs", "-O", "casefold", img)
    print(json.dumps(out))


def android_base(img, key_file):
    """The kernel's part of an Android-like userdata image (crates/uext4/tests/android.rs):
    `-O encrypt,stable_inodes,inline_data` (metadata_csum is mke2fs's default), 256-byte
    inodes; `data` encrypted as Android's FBE with inline crypto (v2, AES-256-XTS/CTS,
    IV_INO_LBLK_64, 16-byte padding) and filled; empty `media` (casefolded later by uext4)
    and `data-ci` (encrypted, to be casefolded); small plain files and a small directory the
    kernel stores inline. Prints JSON: the identifier, inode numbers, the listing of `data`
    with the key and its no-key names. The caller turns casefold, quota, project and verity
    on with tune2fs."""
    raw = fresh_image(img, key_file, "encrypt,stable_inodes,inline_data")
    out = {}
    flags = PAD[16] | IV_INO_LBLK_64
    with loop_mounted(img, "fscrypt-android-") as mnt:
        ident = add_key(mnt, raw)
        out["identifier"] = ident.hex()
        for name in ("data", "data-ci"):
            d = os.path.join(mnt, name)
            os.mkdir(d)
            set_policy(d, 2, MODES["AES-256-XTS"], MODES["AES-256-CTS"], flags, ident)
            out[name.replace("-", "_") + "_ino"] = os.lstat(d).st_ino
        fill(os.path.join(mnt, "data"))
        out["data"] = listing(os.path.join(mnt, "data"))
        os.mkdir(os.path.join(mnt, "media"))
        out["media_ino"] = os.lstat(os.path.join(mnt, "media")).st_ino
        os.mkdir(os.path.join(mnt, "system"))
        for i in range(5):
            with open(os.path.join(mnt, "system", "prop%d" % i), "wb") as f:
                f.write(b"ro.build.prop%d=%s\n" % (i, b"v" * (10 * i)))
        out["system"] = listing(os.path.join(mnt, "system"))
    with loop_mounted(img, "fscrypt-android-") as mnt:
        nk = nokey_listing(os.path.join(mnt, "data"))
        for e in out["data"]:
            e["nokey_name_hex"] = nk.get(e["ino"])
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--casefold-base":
        casefold_base(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "--android":
        android_base(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 6 and sys.argv[1] == "--list":
        list_with_key(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
