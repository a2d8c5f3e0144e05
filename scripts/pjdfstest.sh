#!/usr/bin/env bash
# POSIX behaviour: runs pjdfstest (the Rust port, from crates.io) against a fresh uext4 mount
# and fails on any failure that is not listed in tests/pjdfstest-expected-failures.txt.
# Needs root (it switches users), /dev/fuse and fusermount3; skips with a message otherwise.
# UEXT4_MOUNT_OPTS adds mount options (e.g. writeback_cache, direct_io, dax, threads=16);
# UEXT4_PJDFSTEST_FS=ext3 runs it on an ext3 image, UEXT4_PJDFSTEST_MKE2FS_OPTS adds mke2fs options (see below);
# UEXT4_PJDFSTEST_NBD=1 runs it over NBD (nbdkit serving the image); with
# UEXT4_MOUNT_OPTS=transport=uring it runs over FUSE over io_uring.
set -uo pipefail
cd "$(dirname "$0")/.."
U=${UEXT4_BIN:-target/release/uext4}

if [ "$(id -u)" -ne 0 ]; then echo "SKIP pjdfstest: needs root (it switches users)"; exit 0; fi
if [ ! -e /dev/fuse ]; then echo "SKIP pjdfstest: no /dev/fuse"; exit 0; fi
command -v pjdfstest >/dev/null || cargo install --locked pjdfstest >/dev/null 2>&1 || cargo install pjdfstest >/dev/null 2>&1
command -v pjdfstest >/dev/null || { echo "pjdfstest could not be installed"; exit 1; }
[ -x "$U" ] || cargo build --release -q -p uext4-cli

# The suite switches to the users nobody and tests.
getent group tests >/dev/null || groupadd tests
getent passwd tests >/dev/null || useradd -g tests -M -N -s /usr/sbin/nologin tests
nobody_group=$(id -gn nobody)

work=$(mktemp -d)
chmod 755 "$work"   # other users must reach the mount point
img=/dev/shm/uext4-pjdfstest-$$.img
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
  cd /
  mountpoint -q "$mnt" && umount "$mnt"
  rm -rf "$work" "$img"
}
trap cleanup EXIT

cat > "$work/pjdfstest.toml" <<TOML
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [["nobody", "$nobody_group"], ["tests", "tests"]]
TOML
sed 's/allow_remount = false/allow_remount = true/' "$work/pjdfstest.toml" > "$work/pjdfstest-erofs.toml"

# The EROFS cases remount the filesystem with `mount -o remount,ro`; they run in a second,
# separate pass, because a remount to read-only fails (EBUSY) while a file is open for writing
# and some of the suite's open:: cases leave such descriptors in the runner (the kernel's ext4
# fails the same way in one pass). mount(8) hands mounts of
# type "fuse" to mount.fuse, which cannot remount; with -i it makes the mount(2) call itself
# (the kernel's FUSE then refuses writes with EROFS). This shim adds -i for remounts only.
mkdir -p "$work/bin"
real_mount=$(command -v mount)
cat > "$work/bin/mount" <<SH
#!/bin/sh
case " \$* " in *remount*) exec "$real_mount" -i "\$@";; esac
exec "$real_mount" "\$@"
SH
chmod 755 "$work/bin/mount"

# UEXT4_PJDFSTEST_FS=ext3 (or ext2) runs the suite on a filesystem made by mke2fs of that type,
# without the extents feature (files map their blocks with indirect blocks);
# UEXT4_PJDFSTEST_MKE2FS_OPTS adds mke2fs options (e.g. "-O meta_bg,^resize_inode").
if [ -n "${UEXT4_PJDFSTEST_FS:-}${UEXT4_PJDFSTEST_MKE2FS_OPTS:-}" ]; then
  # shellcheck disable=SC2086 # the options are words
  mke2fs -q -F -t "${UEXT4_PJDFSTEST_FS:-ext4}" ${UEXT4_PJDFSTEST_MKE2FS_OPTS:-} "$img" 1G || exit 1
else
  "$U" mkfs --size 1G "$img" || exit 1
fi
# UEXT4_PJDFSTEST_NBD=1 serves the image with nbdkit's file plugin on a Unix socket and mounts
# it through uext4's NBD client (nbd+unix://), so the same suite runs over networked storage.
src=$img
if [ "${UEXT4_PJDFSTEST_NBD:-0}" = 1 ]; then
  command -v nbdkit >/dev/null || { echo "SKIP: nbdkit is not installed (scripts/install-deps.sh installs it)"; exit 0; }
  sock="$work/nbd.sock"
  nbdkit -f --exit-with-parent -U "$sock" file file="$img" & nbdkit_pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  src="nbd+unix:///?socket=$sock"
fi
# transport=uring needs the fuse module's enable_uring, which the kernel reads at the mount's
# INIT: switched on around the mount and put back.
uring_param=/sys/module/fuse/parameters/enable_uring
uring_was=
case ",${UEXT4_MOUNT_OPTS:-}," in *,transport=uring,*)
  [ -w "$uring_param" ] || { echo "SKIP: transport=uring needs $uring_param (Linux 6.14+)"; exit 0; }
  uring_was=$(cat "$uring_param"); echo Y > "$uring_param";;
esac
"$U" mount -o "allow_other${UEXT4_MOUNT_OPTS:+,$UEXT4_MOUNT_OPTS}" "$src" "$mnt"; mrc=$?
[ -n "$uring_was" ] && echo "$uring_was" > "$uring_param"
[ $mrc -eq 0 ] || exit 1
chmod 777 "$mnt"
# The EXDEV cases need a directory on another filesystem (the one holding the mount point).
mkdir -p "$work/other"; chmod 777 "$work/other"
(cd "$mnt" && timeout 900 pjdfstest -c "$work/pjdfstest.toml" -p "$mnt" -s "$work/other") > "$work/out.txt" 2>&1
rc=$?
(cd "$mnt" && PATH="$work/bin:$PATH" timeout 300 pjdfstest -c "$work/pjdfstest-erofs.toml" -p "$mnt" erofs) >> "$work/out.txt" 2>&1
rc2=$?; [ $rc -ne 0 ] || rc=$rc2
cp "$work/out.txt" "${TMPDIR:-/tmp}/uext4-pjdfstest-last.log" 2>/dev/null
# (Returns once the server has written the image back: e2fsck below may look at once.)
"$U" umount "$mnt"
if [ -n "${nbdkit_pid:-}" ]; then kill "$nbdkit_pid"; wait "$nbdkit_pid" 2>/dev/null; fi
# Test lines end in "ok", "skipped" or "FAILED" (colours stripped); names may contain "failed".
sed 's/\x1b\[[0-9;]*m//g' "$work/out.txt" | awk '$NF == "FAILED" {print $1}' > "$work/failed.txt"
expected=tests/pjdfstest-expected-failures.txt
unexpected=$(grep -v -x -F -f <(grep -v '^#' "$expected" 2>/dev/null | sed 's/ *#.*//' | grep .) "$work/failed.txt" | grep . || true)
grep -a "^Summary" "$work/out.txt" | sed -e '1s/^/all but EROFS: /' -e '2s/^/EROFS pass:    /' || tail -3 "$work/out.txt"
fsck=$(e2fsck -fn "$img" 2>&1); frc=$?
if [ $frc -ne 0 ]; then echo "$fsck" | head -20; echo "e2fsck -fn found problems after pjdfstest"; exit 1; fi
if [ -n "$unexpected" ]; then
  echo "unexpected pjdfstest failures:"; echo "$unexpected"
  exit 1
fi
echo "pjdfstest: no unexpected failures (runner exit $rc), image e2fsck clean"
