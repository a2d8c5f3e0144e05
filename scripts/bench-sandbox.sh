#!/usr/bin/env bash
# One metadata round through a uext4 mount, for timing the contained server against
# -o nosandbox (BENCHMARKS.md, "The contained server"): a fresh 512 MiB image on /dev/shm,
# `cp -a /usr/include` into the mount, a stat walk (find -ls), reading every file, `rm -rf`,
# then unmount (the server writes the image back). Needs root and /dev/fuse.
#   farm-bench -n 8 --timeout 900 -- scripts/bench-sandbox.sh --vs 'scripts/bench-sandbox.sh nosandbox'
set -euo pipefail
U=${UEXT4_BIN:-target/release/uext4}
opts=${1:-}
work=$(mktemp -d)
img=/dev/shm/uext4-bench-sandbox-$$.img
trap 'umount -l "$work/m" 2>/dev/null || true; rm -rf "$work" "$img"' EXIT
mkdir "$work/m"
"$U" mkfs --size 512M "$img" >/dev/null
"$U" mount ${opts:+-o "$opts"} "$img" "$work/m"
cp -a /usr/include "$work/m/inc"
find "$work/m/inc" -ls >/dev/null
find "$work/m/inc" -type f -exec cat {} + >/dev/null
rm -rf "$work/m/inc"
"$U" umount "$work/m"
