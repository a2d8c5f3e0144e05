#!/usr/bin/env bash
# The main job, on a fresh machine: build uext4, make a default image, copy a tree into it
# without mounting, list and read it back, mount it through FUSE (when /dev/fuse is usable),
# show the engine's counters, unmount, and check the image with e2fsck.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mke2fs >/dev/null && command -v fusermount3 >/dev/null || bash scripts/install-deps.sh
cargo build --release -q -p uext4-cli
U=target/release/uext4
dir=$(if [ -d /dev/shm ]; then echo /dev/shm; else echo "${TMPDIR:-/tmp}"; fi)
img=$dir/uext4-demo.img
rm -f "$img"

echo "== uext4 mkfs --size 512M $img"
$U mkfs --size 512M "$img"
$U info "$img"

echo; echo "== uext4 cp -r crates $img:/src (no mount, no root needed)"
$U cp -r crates "$img:/src"
$U ls -l "$img:/src"
$U cat "$img:/src/uext4/Cargo.toml" | sed -n 1,3p
$U stat "$img:/src/uext4/src/lib.rs" | sed -n 1,3p

if [ -e /dev/fuse ] && command -v fusermount3 >/dev/null; then
  mnt=$(mktemp -d)
  echo; echo "== uext4 mount $img $mnt"
  trap 'mountpoint -q "$mnt" && umount "$mnt"; rmdir "$mnt" 2>/dev/null || true' EXIT
  $U mount "$img" "$mnt"
  du -sh "$mnt/src"
  dd if=/dev/zero of="$mnt/file" bs=1M count=64 status=none conv=fsync
  grep -rl "Fs::open" "$mnt/src" | sed -n 1,3p
  echo "== uext4 stats $mnt"
  $U stats "$mnt"
  # Unmounts and returns once the server has written everything back (umount(8) would
  # return before that).
  $U umount "$mnt"
  rmdir "$mnt"
else
  echo "(no usable /dev/fuse here: skipping the mount part)"
fi

echo; echo "== e2fsck -fn $img"
e2fsck -fn "$img"
if [ "${UEXT4_DEMO_KEEP:-1}" = 1 ]; then
  echo "demo done: $img"
else
  rm -f "$img"; echo "demo done"
fi
