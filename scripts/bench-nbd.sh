#!/bin/bash
# Issue 30's measure: a fio job of crates/uext4-bench/src/workloads (WORKLOAD, overwrite-4k by
# default) at JOBS jobs through `uext4 mount` of an image opened locally against the same image
# served by nbdkit's file plugin over a Unix socket (`nbd+unix://`, or TCP loopback with
# NBD_TCP=1), alternated, ROUNDS rounds; IOPS and the NBD fraction of local. With
# BEFORE=ANOTHER_UEXT4_BINARY, that binary runs in the same rounds.
# Usage: scripts/bench-nbd.sh [UEXT4_BINARY] [ROUNDS] [JOBS] [SECONDS]   (prints a Markdown table)
# Needs root, /dev/fuse, fio and nbdkit; images in /dev/shm, each checked with e2fsck -fn.
set -euo pipefail
cd "$(dirname "$0")/.."
U=$(realpath "${1:-target/release/uext4}")
ROUNDS=${2:-3}
JOBS=${3:-8}
SECS=${4:-5}
for t in fio nbdkit e2fsck ${NBD_TCP:+ss}; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed (scripts/install-deps.sh)"; exit 0; }
done
W=$(mktemp -d /dev/shm/uext4-bench-nbd.XXXXXX)
trap 'mountpoint -q "$W/mnt" && umount -l "$W/mnt"; rm -rf "$W"' EXIT
mkdir -p "$W/mnt"
JOB=$PWD/crates/uext4-bench/src/workloads/${WORKLOAD:-overwrite-4k}.fio
[ -f "$JOB" ] || { echo "no workload $JOB"; exit 2; }

fio_iops() {
  DIR=$W/mnt fio --output-format=terse --terse-version=3 "$JOB" --numjobs="$JOBS" \
    --runtime="$1" --ramp_time=1 2>/dev/null | awk -F';' '{s += $49} END {print s}'
}

# One point: IOPS of binary $1 on a local mount and over NBD.
point() {
  local b=$1 img=$W/img sock=$W/nbd.sock local_iops nbd_iops pid uri
  rm -f "$img" "$sock"
  "$b" mkfs --size 2G "$img" >/dev/null
  "$b" mount "$img" "$W/mnt" 2>/dev/null
  fio_iops 1 >/dev/null # lays the files out
  local_iops=$(fio_iops "$SECS")
  "$b" umount "$W/mnt"
  if [ "${NBD_TCP:-0}" = 1 ]; then
    local port=$((20000 + RANDOM % 20000))
    nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$port" file file="$img" & pid=$!
    # Listening, without connecting (a probe connection would be an aborted client to it).
    for _ in $(seq 100); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
    uri="nbd://127.0.0.1:$port/"
  else
    nbdkit -f --exit-with-parent -U "$sock" file file="$img" & pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    uri="nbd+unix:///?socket=$sock"
  fi
  "$b" mount "$uri" "$W/mnt" 2>/dev/null
  nbd_iops=$(fio_iops "$SECS")
  "$b" umount "$W/mnt"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  e2fsck -fn "$img" >/dev/null 2>&1 || { echo "e2fsck -fn found problems ($b)" >&2; exit 1; }
  echo "$local_iops $nbd_iops"
}

via="Unix socket"; [ "${NBD_TCP:-0}" = 1 ] && via="TCP loopback"
echo "${WORKLOAD:-overwrite-4k}, $JOBS jobs:"
echo
echo "| round | binary | local IOPS | NBD ($via) IOPS | NBD / local |"
echo "|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  for b in ${BEFORE:+"$BEFORE"} "$U"; do
    read -r l n < <(point "$b")
    name=after; [ "$b" = "${BEFORE:-}" ] && name=before
    echo "| $r | $name | $l | $n | $(awk -v a="$n" -v b="$l" 'BEGIN {printf "%.2f", a / b}') |"
  done
done
