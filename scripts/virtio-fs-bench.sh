#!/usr/bin/env bash
# virtio-fs against virtio-blk, inside one guest: `uext4 serve --vhost-user-fs` serving an image
# (the guest's FUSE client talks to uext4; the host's kernel never parses the image), beside a
# second image of the same size attached as a virtio disk and mounted by the guest's own ext4.
# The same busybox workload runs on each in turn (scripts/kernel-vm.sh boots the guest):
#
#   create   N empty files in one directory, then sync
#   stat     `ls -l` of that directory (a lookup and getattr per file, cold on virtio-fs)
#   rename   each file renamed once, then sync
#   unlink   every file removed, then sync
#   fsync4k  200 times: a 4 KiB file written and fsynced
#   write    M MiB written sequentially (1 MiB writes), then fsync
#   read     the same M MiB read back after dropping the guest's caches
#
# and a table gives seconds on each and their ratio (virtio-fs / virtio-blk: below 1 is
# virtio-fs faster). Under TCG (no KVM) the guest's own ext4 pays for emulated instructions
# that uext4, running on the host, does not, so only the ratios mean anything, and they lean
# towards virtio-fs; under KVM the guest's kernel runs at native speed.
#
# Usage: scripts/virtio-fs-bench.sh [--files N] [--mib M]     (defaults 2000 and 128)
# Needs what scripts/kernel-vm.sh needs, and target/release/uext4 (UEXT4=path to use another).
# The image uext4 served is checked with e2fsck -fn at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
uext4=${UEXT4:-$root/target/release/uext4}
files=2000
mib=128
while [ $# -gt 0 ]; do
  case "$1" in
    --files) files=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "virtio-fs-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$uext4" ] || { echo "virtio-fs-bench: no $uext4 (cargo build --release -p uext4-cli)" >&2; exit 2; }
"$root/scripts/kernel-vm.sh" --check >/dev/null || { "$root/scripts/kernel-vm.sh" --check; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/uext4-vfsbench.XXXXXX")
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

size=$((mib * 2 + 256))M
mke2fs -q -F -t ext4 -b 4096 "$work/vfs.img" "$size"
mke2fs -q -F -t ext4 -b 4096 "$work/blk.img" "$size"
"$uext4" serve --vhost-user-fs "$work/sock" "$work/vfs.img" 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 100); do [ -S "$work/sock" ] && break; sleep 0.1; done
[ -S "$work/sock" ] || { cat "$work/serve.log" >&2; exit 1; }

cat >"$work/run.sh" <<EOF
files=$files
mib=$mib
EOF
cat >>"$work/run.sh" <<'EOF'
now() { cut -d' ' -f1 /proc/uptime; }
lap() { t=$(now); echo "$1 $2 $(awk "BEGIN { print $t - $t0 }")"; t0=$(now); }
mkdir -p /mnt/v /mnt/b
mount -t virtiofs bench /mnt/v || exit 1
mount -t ext4 /dev/vda /mnt/b || exit 1
for fs in v b; do
  d=/mnt/$fs/bench
  mkdir -p $d/m $d/s
  sync
  t0=$(now)
  i=0; while [ $i -lt $files ]; do : >$d/m/f$i; i=$((i + 1)); done; sync; lap $fs create
  ls -l $d/m >/dev/null; lap $fs stat
  i=0; while [ $i -lt $files ]; do mv $d/m/f$i $d/m/g$i; i=$((i + 1)); done; sync; lap $fs rename
  rm -r $d/m; sync; lap $fs unlink
  i=0; while [ $i -lt 200 ]; do
    dd if=/dev/zero of=$d/s/f$i bs=4096 count=1 conv=fsync 2>/dev/null; i=$((i + 1))
  done; lap $fs fsync4k
  dd if=/dev/zero of=$d/data bs=1M count=$mib conv=fsync 2>/dev/null; lap $fs write
  sync; echo 3 >/proc/sys/vm/drop_caches; t0=$(now)
  dd if=$d/data of=/dev/null bs=1M 2>/dev/null; lap $fs read
done
EOF

out=$("$root/scripts/kernel-vm.sh" --disk "$work/blk.img" --vhost-user-fs "$work/sock:bench" \
  --mem 1024 --timeout 1200 "$work/run.sh")
for _ in $(seq 300); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
wait "$serve_pid" || { echo "virtio-fs-bench: uext4 serve failed:" >&2; cat "$work/serve.log" >&2; exit 1; }
serve_pid=""

printf '%-9s %12s %12s %8s\n' workload virtio-fs virtio-blk ratio
for w in create stat rename unlink fsync4k write read; do
  v=$(awk -v w=$w '$1 == "v" && $2 == w { print $3 }' <<<"$out")
  b=$(awk -v w=$w '$1 == "b" && $2 == w { print $3 }' <<<"$out")
  awk -v w=$w -v v="$v" -v b="$b" 'BEGIN { printf "%-9s %11.2fs %11.2fs %8.2f\n", w, v, b, (b > 0 ? v / b : 0) }'
done
echo "($files files, $mib MiB; seconds in the guest; ratio virtio-fs / virtio-blk)"
e2fsck -fn "$work/vfs.img" >"$work/fsck.log" 2>&1 || { cat "$work/fsck.log" >&2; exit 1; }
echo "e2fsck -fn: the image uext4 served is clean"
