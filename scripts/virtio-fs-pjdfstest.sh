#!/usr/bin/env bash
# POSIX behaviour over virtio-fs: pjdfstest (the Rust port, as scripts/pjdfstest.sh runs it on
# the FUSE mount) inside a guest booted by scripts/kernel-vm.sh, on an image served by
# `uext4 serve --vhost-user-fs`, the guest's kernel being the FUSE client. The runner goes in
# with its `ldd` closure and is started through the dynamic loader (as `uext4 bench --family
# virtio-fs` does with the bench); /etc/passwd and /etc/group in the guest name the users it
# switches to (nobody, tests). The EXDEV cases' second filesystem is the guest's tmpfs; the
# EROFS cases run in a second pass, as in scripts/pjdfstest.sh (they remount the tag read-only
# with the guest's busybox mount). Fails on a failure not listed in
# tests/pjdfstest-expected-failures.txt, or when e2fsck -fn finds the image unclean.
#
# Usage: scripts/virtio-fs-pjdfstest.sh [--timeout S]     (the guest's limit, default 1500 s)
# Needs target/release/uext4, pjdfstest on PATH (cargo install pjdfstest) and what
# scripts/kernel-vm.sh needs; prints "SKIP: why" and exits 0 where those are missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
U=${UEXT4_BIN:-$root/target/release/uext4}
limit=1500
[ "${1:-}" = --timeout ] && limit=$2
pj=$(command -v pjdfstest) || { echo "SKIP: no pjdfstest on PATH (cargo install pjdfstest)"; exit 0; }
[ -x "$U" ] || { echo "SKIP: no $U (cargo build --release -p uext4-cli)"; exit 0; }
why=$("$root/scripts/kernel-vm.sh" --check) || { echo "$why"; exit 0; }

work=$(mktemp -d "${TMPDIR:-/tmp}/uext4-vfs-pjd.XXXXXX")
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$U" mkfs --size 1G "$work/fs.img" >/dev/null || exit 1
"$U" serve --vhost-user-fs "$work/sock" "$work/fs.img" 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 100); do [ -S "$work/sock" ] && break; sleep 0.1; done
[ -S "$work/sock" ] || { cat "$work/serve.log"; exit 1; }

printf 'root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false\ntests:x:1000:1000::/:/bin/false\n' >"$work/passwd"
printf 'root:x:0:\nnogroup:x:65534:\ntests:x:1000:\n' >"$work/group"
printf '%s\n' '[features]' 'posix_fallocate = {}' 'rename_ctime = {}' 'utime_now = {}' \
  'utimensat = {}' '' '[settings]' 'naptime = 0.01' 'allow_remount = false' '' \
  '[dummy_auth]' 'entries = [["nobody", "nogroup"], ["tests", "tests"]]' >"$work/pjdfstest.toml"
sed 's/allow_remount = false/allow_remount = true/' "$work/pjdfstest.toml" >"$work/erofs.toml"
files=(--file "$work/passwd" --file "$work/group" --file "$work/pjdfstest.toml" --file "$work/erofs.toml" --file "$pj")
loader=""
for l in $(ldd "$pj" | grep -o '/[^ ]*'); do
  files+=(--file "$l")
  case "${l##*/}" in ld-linux*) loader="/in/${l##*/} --library-path /in" ;; esac
done
{
  echo 'mkdir -p /etc /mnt/v /tmp/other'
  echo 'cp /in/passwd /in/group /etc/'
  echo 'mount -t virtiofs pjd /mnt/v || exit 1'
  echo 'chmod 777 /mnt/v /tmp/other'
  echo "cd /mnt/v && $loader /in/pjdfstest -c /in/pjdfstest.toml -p /mnt/v -s /tmp/other"
  echo 'echo "runner exit $?"'
  echo "cd /mnt/v && $loader /in/pjdfstest -c /in/erofs.toml -p /mnt/v erofs"
  echo 'echo "runner exit $?"'
} >"$work/run.sh"
"$root/scripts/kernel-vm.sh" --vhost-user-fs "$work/sock:pjd" --mem 1024 --timeout "$limit" \
  "${files[@]}" "$work/run.sh" >"$work/out.txt" 2>"$work/err.txt"
vrc=$?
for _ in $(seq 300); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
wait "$serve_pid"
src=$?
serve_pid=""
cp "$work/out.txt" "${TMPDIR:-/tmp}/uext4-vfs-pjdfstest-last.log" 2>/dev/null
[ "$vrc" -lt 124 ] || { tail -20 "$work/err.txt"; echo "the guest did not finish ($vrc)"; exit 1; }
[ "$src" = 0 ] || { cat "$work/serve.log"; echo "uext4 serve exited $src"; exit 1; }
sed -i 's/\x1b\[[0-9;]*m//g' "$work/out.txt"
awk '$NF == "FAILED" {print $1}' "$work/out.txt" >"$work/failed.txt"
expected=$root/tests/pjdfstest-expected-failures.txt
unexpected=$(grep -v -x -F -f <(grep -v '^#' "$expected" 2>/dev/null | sed 's/ *#.*//' | grep .) "$work/failed.txt" | grep . || true)
grep -a "^Summary\|^runner exit" "$work/out.txt" | sed -e '1s/^/all but EROFS: /' -e '3s/^/EROFS pass:    /' || tail -5 "$work/out.txt"
e2fsck -fn "$work/fs.img" >"$work/fsck.txt" 2>&1 || { head -20 "$work/fsck.txt"; echo "e2fsck -fn found problems"; exit 1; }
if [ -n "$unexpected" ]; then
  echo "unexpected pjdfstest failures over virtio-fs:"
  echo "$unexpected"
  exit 1
fi
[ "$(grep -c "^Summary" "$work/out.txt")" = 2 ] || { echo "pjdfstest did not finish both passes"; exit 1; }
echo "pjdfstest over virtio-fs: no unexpected failures, image e2fsck clean"
