#!/usr/bin/env bash
# Runs each reference workload (crates/uext4-bench/src/workloads) briefly through fio on a uext4 mount, then
# checks the image with e2fsck -fn. Needs root, /dev/fuse and fio; skips with a message otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
U=${UEXT4_BIN:-target/release/uext4}
W=$(cd "${UEXT4_WORKLOADS:-crates/uext4-bench/src/workloads}" 2>/dev/null && pwd)

if [ "$(id -u)" -ne 0 ] || [ ! -e /dev/fuse ]; then echo "SKIP workloads: needs root and /dev/fuse"; exit 0; fi
command -v fio >/dev/null || { echo "SKIP workloads: fio is not installed"; exit 0; }
[ -n "$W" ] && [ -d "$W" ] || { echo "workloads: the workloads folder ${UEXT4_WORKLOADS:-crates/uext4-bench/src/workloads} is missing"; exit 1; }
[ -x "$U" ] || cargo build --release -q -p uext4-cli

work=$(mktemp -d); chmod 755 "$work"
img=/dev/shm/uext4-workloads-$$.img
mnt=$work/mnt; mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work" "$img"' EXIT
failed=0
run() {
  local name=$1; shift
  rm -f "$img"
  "$U" mkfs --size 3G "$img" >/dev/null || return 1
  "$U" mount "$img" "$mnt" || return 1
  if ! out=$(cd "$mnt" && DIR="$mnt" "$@" 2>&1); then
    echo "$out" | tail -5; echo "workload $name: FAILED"; failed=1; umount "$mnt"; return
  fi
  # (Returns once the server has written the image back: e2fsck may look at once.)
  "$U" umount "$mnt"
  if ! e2fsck -fn "$img" >/dev/null 2>&1; then e2fsck -fn "$img" | head -20; echo "workload $name: e2fsck found problems"; failed=1; return; fi
  echo "workload $name: ok, e2fsck clean"
}
# Command-line options come before the job file, whose size= wins: files are laid out at full size.
quick=(--runtime=2 --ramp_time=0 --numjobs=2)
run overwrite-4k fio "${quick[@]}" "$W/overwrite-4k.fio"
run mixed-randrw-4k fio "${quick[@]}" "$W/mixed-randrw-4k.fio"
run fsync-randwrite-16k fio "${quick[@]}" --filesize=4m "$W/fsync-randwrite-16k.fio"
if [ "${UEXT4_LONG:-0}" = 1 ]; then
  run pwrite-1g bash "$W/pwrite-1g.sh" "$mnt"
elif command -v xfs_io >/dev/null; then
  run pwrite-64m bash -c 'for b in 4k 16m; do rm -f "$DIR/p"; for ph in allocate overwrite; do xfs_io -f -c "pwrite -q -b $b 0 64m" -c fsync "$DIR/p"; done; done'
fi
[ $failed = 0 ]
