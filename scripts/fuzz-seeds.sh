#!/usr/bin/env bash
# Makes the fuzz harnesses' seeds (never committed: they are made here, from mke2fs, debugfs and
# uext4 mkfs): small images of every feature into DIR/images (default target/fuzz-seeds), and
# seed corpora for the harnesses that take raw bytes (partition tables, tar, device tables,
# NBD) into DIR/corpus/HARNESS.
#   scripts/fuzz-seeds.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/fuzz-seeds}
for t in mke2fs debugfs e2fsck; do
  command -v $t >/dev/null || { echo "fuzz-seeds: $t is not installed"; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/images" "$out/corpus"
work=$(mktemp -d)
# The same seeds every time (a corpus refers to its seeds by number): fixed UUIDs, hash seeds,
# times and contents.
export E2FSPROGS_FAKE_TIME=1700000000
fixed="-U 6c1b0a6e-8f5e-4a36-9b3e-2f0f5d7c1a01 -E hash_seed=9d0b3c2a-1e4f-4b6a-8c7d-5e6f7a8b9c0d"
trap 'rm -rf "$work"' EXIT

# The tree every image holds: small files (inline where the image has inline_data), a file
# with holes (many extents: an index block), a long and a short symlink, a directory with
# enough names for an htree (e2fsck -D indexes it), a FIFO, device nodes, xattrs.
src=$work/src
mkdir -p "$src/d/e" "$src/big"
echo hello > "$src/d/a"
head -c 100 /dev/zero | tr '\0' s > "$src/tiny"
noise() { python3 -c "import random,sys; r=random.Random($2); sys.stdout.buffer.write(bytes(r.getrandbits(8) for _ in range($1)))"; }
noise 20000 1 > "$src/d/e/medium"
for i in $(seq 0 23); do
  printf 'chunk %d' "$i" | dd of="$src/holes" bs=1024 seek=$((i * 3)) conv=notrunc status=none
done
ln -s target "$src/short"
ln -s "$(printf 'l%.0s' $(seq 1 120))" "$src/long"
for i in $(seq 0 140); do : > "$src/big/a-longer-file-name-to-fill-blocks-$i"; done
mkfifo "$src/fifo"
mknod "$src/chr" c 1 3 2>/dev/null || true
setfattr -n user.small -v hi "$src/d/a" 2>/dev/null || true
setfattr -n user.big -v "$(head -c 600 /dev/zero | tr '\0' x)" "$src/d/e/medium" 2>/dev/null || true

find "$src" -exec touch -h -d @1700000000 {} +

# NAME SIZE mke2fs-options...
image() {
  local name=$1 size=$2; shift 2
  local img=$out/images/$name.img
  mke2fs -q -F -E root_owner=0:0 $fixed -d "$src" "$@" "$img" "$size" >/dev/null
  e2fsck -fyD "$img" >/dev/null 2>&1 || true
  e2fsck -fn "$img" >/dev/null 2>&1 || { echo "fuzz-seeds: $name is not clean"; exit 1; }
}
image ext2 256K -t ext2 -b 1024 -N 200 -I 128
image ext3 2M -t ext3 -b 1024 -N 200 -O ^metadata_csum
image ext4-plain 512K -t ext4 -b 1024 -N 200 -O ^has_journal,^metadata_csum,^flex_bg
image ext4-csum 512K -t ext4 -b 1024 -N 200 -O ^has_journal
image ext4-inline 512K -t ext4 -b 1024 -N 200 -O ^has_journal,inline_data,^metadata_csum
image ext4-bigalloc 1M -t ext4 -b 1024 -C 4096 -N 200 -O ^has_journal,bigalloc,^metadata_csum
image ext4-orphan-file 2M -t ext4 -b 1024 -N 200 -O 64bit,metadata_csum,orphan_file
image ext4-casefold 512K -t ext4 -b 1024 -N 200 -O ^has_journal,casefold,^metadata_csum

# An orphan list (the superblock's, through the inodes' dtime): two files removed from their
# directory but still allocated, as a crash leaves them.
orphans() {
  local img=$1
  local a b
  a=$(debugfs -R "stat /d/a" "$img" 2>/dev/null | awk '/^Inode:/{print $2; exit}')
  b=$(debugfs -R "stat /tiny" "$img" 2>/dev/null | awk '/^Inode:/{print $2; exit}')
  debugfs -w -f - "$img" >/dev/null 2>&1 <<CMDS
unlink /d/a
unlink /tiny
sif <$a> links_count 0
sif <$b> links_count 0
sif <$a> dtime $b
ssv last_orphan $a
CMDS
}
orphans "$out/images/ext4-plain.img"

# Journals that need recovery (debugfs writes the transactions; the kernel's format):
# data blocks, a revoke record, and a transaction left uncommitted.
journal() {
  local name=$1 size=$2; shift 2
  local img=$out/images/$name.img
  mke2fs -q -F $fixed -d "$src" "$@" "$img" "$size" >/dev/null
  noise 1024 2 > "$work/blk"
  debugfs -w -f - "$img" >/dev/null 2>&1 <<CMDS
jo
jw -b 300,301,302 $work/blk
jc
jo
jw -r 301
jc
jo
jw -b 303 -c $work/blk
jc
CMDS
  dumpe2fs -h "$img" 2>/dev/null | grep -q needs_recovery || { echo "fuzz-seeds: $name has no journal to replay"; exit 1; }
}
journal journal-csum 2M -t ext4 -b 1024 -N 200
journal journal-v2 2M -t ext4 -b 1024 -N 200 -O ^metadata_csum
journal journal-ext3 2M -t ext3 -b 1024 -N 200

# One made by uext4's own mkfs, where it is built.
if [ -x target/release/uext4 ]; then
  SOURCE_DATE_EPOCH=1700000000 target/release/uext4 mkfs -q -U 6c1b0a6e-8f5e-4a36-9b3e-2f0f5d7c1a01 --size 512K --block-size 1024 --journal-size 0 -N 200 \
    -d "$src" "$out/images/uext4-mkfs.img" >/dev/null 2>&1 || true
fi

# Raw-byte seeds: a GPT and an MBR disk, tar archives, device tables, NBD replies.
c=$(realpath "$out")/corpus
mkdir -p "$c/partition" "$c/tar" "$c/devtable" "$c/nbd"
if command -v sfdisk >/dev/null; then
  truncate -s 64K "$work/disk"
  printf 'label: gpt\nfirst-lba: 34\nstart=40, size=20, type=L\nstart=64, size=20, type=L\n' |
    sfdisk -q "$work/disk" >/dev/null 2>&1 && head -c 20K "$work/disk" > "$c/partition/gpt"
  truncate -s 0 "$work/disk"; truncate -s 64K "$work/disk"
  printf 'label: dos\nstart=1, size=20, type=83\nstart=32, size=40, type=5\nstart=34, size=10, type=83\n' |
    sfdisk -q "$work/disk" >/dev/null 2>&1 && head -c 20K "$work/disk" > "$c/partition/mbr"
fi
(cd "$src" && tar --format=gnu -cf "$c/tar/gnu.tar" d short long fifo)
(cd "$src" && tar --format=pax --xattrs -cf "$c/tar/pax.tar" d tiny)
(cd "$src" && tar --format=ustar -cf "$c/tar/ustar.tar" d/e short)
printf '/dev d 755 0 0 - - - - -\n/dev/tty c 666 0 0 5 0 - - -\n/dev/hda b 640 0 0 3 0 0 1 4\n' > "$c/devtable/basic"
printf '# comment\n/etc d 700 10 10 - - - - -\n/dev/ttyS c 660 0 5 4 64 0 1 3\n' > "$c/devtable/more"
# What an NBD server says: the fixed newstyle handshake (NBD_OPT_GO answered with the
# export's size and flags, its block sizes, ACK), then simple replies to the harness's read,
# read, write and flush (cookies 1 to 4); once more where the export allows several connections.
python3 - "$c/nbd" <<'PY'
import struct, sys
def seed(flags):
    b = b"NBDMAGIC" + b"IHAVEOPT" + struct.pack(">H", 3)
    rep = lambda t, d: struct.pack(">QIII", 0x3e889045565a9, 7, t, len(d)) + d
    b += rep(3, struct.pack(">HQH", 0, 1 << 20, flags))
    b += rep(3, struct.pack(">HIII", 3, 512, 4096, 1 << 20))
    b += rep(1, b"")
    simple = lambda cookie, data=b"": struct.pack(">IIQ", 0x67446698, 0, cookie) + data
    return b + simple(1, bytes(512)) + simple(2, bytes(8192)) + simple(3) + simple(4)
open(sys.argv[1] + "/go", "wb").write(seed(1 | 4))
open(sys.argv[1] + "/multi-conn", "wb").write(seed(1 | 4 | 256))
PY
echo "fuzz-seeds: $(ls "$out/images" | wc -l) images in $out/images"
