#!/usr/bin/env python3
"""The core of a dfVFS back end over uext4, without importing dfvfs: what dfVFS's file system
and file entry classes ask of pyfsext, answered by uext4.

    python3 dfvfs_adapter.py IMAGE [PATH]      # e.g. disk.img /etc

dfVFS opens a volume from a file object (the layer below: a raw image, a partition of one, an
EWF file...), then asks for file entries by path and by inode, their timestamps and their
extents. Each of those is one uext4 call.
"""

import stat
import sys

import uext4


class Ext4FileSystem:
    """dfVFS's EXTFileSystem: the volume opened from a file object."""

    def __init__(self, file_object, offset=0):
        self.fs = uext4.Filesystem(file_object, offset=offset)

    def entry_by_path(self, path):
        return Ext4FileEntry(self, self.fs.lstat(path).st_ino, path)

    def entry_by_inode(self, number):
        return Ext4FileEntry(self, number, None)

    def close(self):
        self.fs.close()


class Ext4FileEntry:
    """dfVFS's EXTFileEntry: one inode, named by path or by number."""

    def __init__(self, file_system, inode, path):
        self.file_system = file_system
        self.fs = file_system.fs
        self.inode_number = inode
        self.path = path
        self.record = self.fs.inode(inode)  # the inode as its table holds it

    def is_directory(self):
        return stat.S_ISDIR(self.record.mode)

    def timestamps(self):
        """All of ext4's times, in nanoseconds since the epoch (dtime in seconds; 0: none)."""
        r = self.record
        return {"atime": r.atime_ns, "ctime": r.ctime_ns, "mtime": r.mtime_ns,
                "crtime": r.crtime_ns, "dtime": r.dtime}

    def extents(self):
        """(offset, size, unwritten) in bytes, as dfVFS's GetExtents gives them."""
        bs = self.fs.stat("/").st_blksize
        return [(x.physical * bs, x.length * bs, x.unwritten) for x in self.record.extents]

    def sub_entries(self):
        # A directory by path where known, else by inode number.
        for e in self.fs.scandir(self.path if self.path else self.inode_number):
            yield Ext4FileEntry(self.file_system, e.inode(), e.path)

    def open(self):
        """The contents as a file object (read, seek, tell), by inode number."""
        return self.fs.open(self.inode_number)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as volume:  # the file object from the layer below
        fsys = Ext4FileSystem(volume)
        entry = fsys.entry_by_path(sys.argv[2] if len(sys.argv) > 2 else "/")
        same = fsys.entry_by_inode(entry.inode_number)
        assert same.timestamps() == entry.timestamps()
        print(entry.path, entry.inode_number, entry.timestamps())
        children = entry.sub_entries() if entry.is_directory() else [entry]
        for child in children:
            first = ""
            if not child.is_directory() and stat.S_ISREG(child.record.mode):
                with child.open() as f:
                    first = f.read(16)
            print(f"  <{child.inode_number}> {child.path} times={child.timestamps()} "
                  f"extents={child.extents()} first bytes={first!r}")
        fsys.close()


if __name__ == "__main__":
    main()
