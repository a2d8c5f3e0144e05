#!/usr/bin/env bash
# fstests (xfstests), the Linux filesystems' regression suite, on a uext4 mount, and the same
# list on the kernel's ext4 and on fuse2fs for comparison.
#
#   scripts/fstests.sh                    the bounded list (tests/fstests-ci.txt) on uext4
#   scripts/fstests.sh --long             generic/quick
#   scripts/fstests.sh --auto             generic/auto
#   scripts/fstests.sh generic/035 ...    those tests
#   --systems uext4,ext4,fuse2fs          which systems to run the list on (default: uext4;
#                                         ext4 is the kernel's, on loop devices)
#   --all                                 the same as --systems uext4,ext4,fuse2fs
#   --report                              runs nothing: prints the table of the last (or the
#                                         running) run of that list and those systems
#
# Prints one table (pass / fail / not run per system) and, for uext4, the reason for every
# failure and not-run. Exits non-zero when a uext4 test fails that tests/fstests-expected.txt
# does not list as an expected failure (each line there names its reason).
#
# fstests cannot make or check a FUSE filesystem (with FSTYP=fuse its _scratch_mkfs only
# empties the mount and its fsck does nothing), so this script makes the test and scratch
# images itself, makes the scratch image afresh before every test, and after every test
# unmounts both, waits for the server to let go, and runs `e2fsck -fn` on both: any complaint
# fails that test. Each test runs in its own `./check` invocation for that reason.
#
# The fstests source: FSTESTS_SRC (a source directory or a .tar.gz of one: an upstream
# checkout, or the snapshot .ci/run names for CI, whose machines cannot download); without it
# the script skips. It is built once into
# /var/tmp/uext4-fstests (FSTESTS_CACHE) and reused while the source is
# the same. Build dependencies are installed with apt-get when missing (as root).
# Images and mount points live in FSTESTS_WORK (default: a directory under the cache); both must
# be reachable by fstests' unprivileged users (fsgqa runs fstests' helpers on the mounts), so
# the default cache is /var/tmp/uext4-fstests rather than root's home. FSTESTS_TEST_SIZE and
# FSTESTS_SCRATCH_SIZE set their sizes (4G each by default, sparse).
# Needs root, /dev/fuse and loop devices; skips with a message otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

list_mode=ci
systems=uext4
report=0
tests=()
while [ $# -gt 0 ]; do
  case $1 in
    --long) list_mode=quick ;;
    --auto) list_mode=auto ;;
    --all) systems=uext4,ext4,fuse2fs ;;
    --report) report=1 ;;
    --systems) systems=$2; shift ;;
    --systems=*) systems=${1#--systems=} ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    -*) echo "scripts/fstests.sh: unknown option $1" >&2; exit 2 ;;
    *) tests+=("$1"); list_mode=args ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: fstests needs root"; exit 0; fi
if [ ! -e /dev/fuse ]; then echo "SKIP: fstests needs /dev/fuse"; exit 0; fi

# --- the fstests source -------------------------------------------------------------------
src=${FSTESTS_SRC:-}
if [ -z "$src" ] || [ ! -e "$src" ]; then
  echo "SKIP: fstests source not found (set FSTESTS_SRC)"
  exit 0
fi

cache=${FSTESTS_CACHE:-/var/tmp/uext4-fstests}
mkdir -p "$cache"
chmod 755 "$cache"

need=()
for pair in make:make gcc:gcc autoconf:autoconf automake:automake libtoolize:libtool-bin \
            pkg-config:pkg-config gawk:gawk bc:bc killall:psmisc attr:attr quota:quota \
            xfs_io:xfsprogs mke2fs:e2fsprogs fio:fio dbench:dbench uuidgen:uuid-runtime \
            sqlite3:sqlite3 python3:python3 fuse2fs:fuse2fs fusermount3:fuse3 setcap:libcap2-bin; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
for pair in xfs/xfs.h:xfslibs-dev uuid/uuid.h:uuid-dev attr/libattr.h:libattr1-dev \
            acl/libacl.h:libacl1-dev libaio.h:libaio-dev gdbm.h:libgdbm-dev \
            liburing.h:liburing-dev sys/capability.h:libcap-dev; do
  [ -e "/usr/include/${pair%%:*}" ] || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null || echo "(some packages could not be installed: ${need[*]})"
  else
    echo "missing packages (install them): ${need[*]}" >&2
  fi
fi

# One build per source: the key is the tarball's checksum, or the directory's path and HEAD.
if [ -d "$src" ]; then
  key=$( (echo "$src"; git -C "$src" rev-parse HEAD 2>/dev/null; git -C "$src" status --porcelain 2>/dev/null) | sha256sum | cut -c1-16)
else
  key=$(sha256sum < "$src" | cut -c1-16)
fi
fst=$cache/build-$key/fstests
if [ ! -x "$fst/ltp/fsstress" ] || [ ! -f "$fst/.uext4-built" ]; then
  echo "building fstests from $src into $fst"
  rm -rf "$cache/build-$key"
  mkdir -p "$cache/build-$key"
  if [ -d "$src" ]; then
    cp -a "$src/." "$fst/"
  else
    tar xzf "$src" -C "$cache/build-$key" || { echo "cannot unpack $src"; exit 1; }
    # The snapshot unpacks to fstests/; another tarball may name its top directory otherwise.
    if [ ! -d "$fst" ]; then
      top=$(find "$cache/build-$key" -mindepth 1 -maxdepth 1 -type d | head -1)
      mv "$top" "$fst"
    fi
  fi
  if ! make -C "$fst" -j"$(nproc)" > "$cache/build-$key/build.log" 2>&1; then
    tail -30 "$cache/build-$key/build.log"
    echo "fstests build failed (log: $cache/build-$key/build.log)"
    exit 1
  fi
  touch "$fst/.uext4-built"
fi
echo "fstests: $fst"

# --- the list -----------------------------------------------------------------------------
expected=tests/fstests-expected.txt
case $list_mode in
  ci) mapfile -t tests < <(sed 's/#.*//' tests/fstests-ci.txt | awk 'NF {print $1}') ;;
  quick|auto) mapfile -t tests < <(cd "$fst" && awk -v g=$list_mode '!/^#/ && NF > 1 { for (i = 2; i <= NF; i++) if ($i == g) { print "generic/" $1; break } }' tests/generic/group.list) ;;
esac
[ ${#tests[@]} -gt 0 ] || { echo "no tests to run"; exit 2; }
IFS=, read -r -a syslist <<< "$systems"
for s in "${syslist[@]}"; do
  case $s in uext4|ext4|fuse2fs) ;; *) echo "unknown system $s (known: uext4, ext4, fuse2fs)" >&2; exit 2 ;; esac
done

U=${UEXT4_BIN:-${CARGO_TARGET_DIR:-target}/release/uext4}
[ $report = 1 ] || case " ${syslist[*]} " in
  *" uext4 "*)
    cargo build --release -q -p uext4-cli || exit 1
    # mount -t fuse.uext4 needs the helper (/sbin/mount.fuse.uext4): install this build.
    bash scripts/install.sh >/dev/null || exit 1
    U=/usr/local/bin/uext4 ;;
esac

# fstests' users.
getent group fsgqa >/dev/null || groupadd fsgqa
getent passwd fsgqa >/dev/null || useradd -m -g fsgqa fsgqa
getent passwd fsgqa2 >/dev/null || useradd -M fsgqa2
getent passwd 123456-fsgqa >/dev/null || useradd -M 123456-fsgqa 2>/dev/null

work=${FSTESTS_WORK:-$cache/work}
test_size=${FSTESTS_TEST_SIZE:-4G}
scratch_size=${FSTESTS_SCRATCH_SIZE:-4G}
per_test_timeout=${FSTESTS_TIMEOUT:-900}
mkdir -p "$work"
loops=()
cleanup() {
  for s in "${syslist[@]}"; do
    for m in "$work/$s/test" "$work/$s/scratch"; do
      mountpoint -q "$m" 2>/dev/null && umount "$m" 2>/dev/null
    done
  done
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
}
[ $report = 1 ] || trap cleanup EXIT

# Makes an image of system $1 at $2 with size $3.
mkimage() {
  case $1 in
    uext4) rm -f "$2"; "$U" mkfs --size "$3" "$2" >/dev/null ;;
    *) rm -f "$2"; truncate -s "$3" "$2" && mke2fs -q -F -t ext4 "$2" ;;
  esac
}

# Waits until no server has image $2 of system $1 open any more (umount returns before a FUSE
# server has written the image back and exited).
wait_released() {
  local i
  case $1 in
    uext4) flock -x -w 120 "$2" true ;;   # the server holds the image's flock while it runs
    fuse2fs) for i in $(seq 600); do fuser -s "$2" 2>/dev/null || return 0; sleep 0.2; done; return 1 ;;
  esac
}

# Unmounts whatever is still mounted of system $1.
unmount_all() {
  local m
  for m in "$work/$1/test" "$work/$1/scratch"; do
    mountpoint -q "$m" || continue
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}

declare -A devs
setup_system() {
  local s=$1 d=$work/$1
  rm -rf "$d"; mkdir -p "$d/test" "$d/scratch" "$d/results"
  chmod 755 "$work" "$d"
  local tdev=$d/test.img sdev=$d/scratch.img fstyp=fuse subtyp="" opts="-o allow_other"
  case $s in
    uext4) subtyp=.uext4; mkimage uext4 "$tdev" "$test_size" || return 1 ;;
    fuse2fs) subtyp=.fuse2fs; mkimage fuse2fs "$tdev" "$test_size" || return 1 ;;
    ext4)
      fstyp=ext4; opts=""
      truncate -s "$test_size" "$tdev"; truncate -s "$scratch_size" "$sdev"
      tdev=$(losetup -f --show "$d/test.img") || return 1; loops+=("$tdev")
      sdev=$(losetup -f --show "$d/scratch.img") || return 1; loops+=("$sdev")
      mke2fs -q -F -t ext4 "$tdev" || return 1
      mke2fs -q -F -t ext4 "$sdev" || return 1 ;;
  esac
  devs[$s.test]=$tdev; devs[$s.scratch]=$sdev
  cat > "$d/config" <<CFG
export FSTYP=$fstyp
export FUSE_SUBTYP=$subtyp
export TEST_DEV=$tdev
export TEST_DIR=$d/test
export SCRATCH_DEV=$sdev
export SCRATCH_MNT=$d/scratch
export TEST_FS_MOUNT_OPTS="$opts"
export MOUNT_OPTIONS="$opts"
export RESULT_BASE=$d/results
CFG
  # `mount -o remount,ro` of a FUSE mount goes to its mount helper, which cannot remount;
  # the kernel's FUSE remounts read-only through mount(2) itself, which mount -i makes (as
  # scripts/pjdfstest.sh does). fstests finds this mount first in its PATH.
  if [ "$fstyp" = fuse ]; then
    mkdir -p "$d/bin"
    cat > "$d/bin/mount" <<SH
#!/bin/sh
case " \$* " in *remount*) exec $(command -v mount) -i "\$@";; esac
exec $(command -v mount) "\$@"
SH
    chmod 755 "$d/bin/mount"
    # The systems run side by side, and a df or statfs of every mount (fstests runs them)
    # holds a FUSE mount for as long as its server takes to answer: an unmount in that
    # moment fails with "target is busy" though nothing uses the mount. Retried for 5 s.
    cat > "$d/bin/umount" <<SH
#!/bin/sh
i=0
while :; do
  err=\$($(command -v umount) "\$@" 2>&1) && exit 0
  case \$err in *busy*) [ \$i -lt 25 ] || break; i=\$((i + 1)); sleep 0.2 ;; *) break ;; esac
done
echo "\$err" >&2
exit 32
SH
    chmod 755 "$d/bin/umount"
  fi
  # fstests compares the type df shows with FSTYP; the kernel shows a FUSE mount with a subtype
  # as fuse.SUBTYPE (fuse.uext4, fuse.ext4 for fuse2fs), which fstests' FSTYP=fuse does not
  # expect: its df goes through this filter, which shows those as fuse.
  if [ "$fstyp" = fuse ]; then
    cat > "$d/df" <<'DF'
#!/bin/sh
df "$@" | awk '$2 ~ /^fuse\./ { $2 = "fuse" } { print }'
DF
    chmod 755 "$d/df"
    echo "export DF_PROG=\"$d/df -T -P\"" >> "$d/config"
  fi
}

# e2fsck -fn on an image; prints the first complaint and fails when it finds anything.
fsck_image() {
  local out
  out=$(e2fsck -fn "$1" 2>&1) && return 0
  echo "e2fsck -fn $(basename "$1"): $(echo "$out" | sed -n '2,$p' | grep -v '^Pass [0-9]' | grep . | head -2 | tr '\n' ' ')"
  return 1
}

declare -A status reason
run_one() {
  local s=$1 t=$2 d=$work/$1 res st why=""
  res=$d/results/$t
  rm -f "$res".*
  mkdir -p "$(dirname "$res")"
  case $s in
    uext4|fuse2fs) mkimage "$s" "${devs[$s.scratch]}" "$scratch_size" || { status[$s.$t]=fail; reason[$s.$t]="cannot make the scratch image"; return; } ;;
  esac
  (cd "$fst" && PATH="$d/bin:$PATH" HOST_OPTIONS=$d/config timeout "$per_test_timeout" ./check "$t") > "$d/check.log" 2>&1
  local rc=$?
  cp "$d/check.log" "$res.check.log" 2>/dev/null
  unmount_all "$s"
  if [ "$s" != ext4 ]; then
    wait_released "$s" "${devs[$s.test]}" || why="server did not release the test image; "
    wait_released "$s" "${devs[$s.scratch]}" || why="server did not release the scratch image; "
  fi
  if [ -f "$res.notrun" ]; then
    st=notrun; why="$why$(head -1 "$res.notrun")"
  elif [ $rc = 124 ]; then
    st=fail; why="${why}timed out after $per_test_timeout s"
  elif grep -q "^Passed all 1 tests" "$d/check.log"; then
    st=pass
  else
    st=fail
    if [ -f "$res.out.bad" ]; then
      why="$why$(diff -u "$fst/tests/$t.out" "$res.out.bad" 2>/dev/null | sed -n '4,$p' | grep '^[-+]' | head -3 | cut -c1-100 | tr '\n' ' ')"
    fi
    [ -n "$why" ] || why=$(grep -E "^$t|_check|failed|mismatch" "$d/check.log" | head -2 | tr '\n' ' ' | cut -c1-200)
  fi
  # e2fsck on both images after every test (the scratch image when the test used it and
  # did not ask for it to go unchecked).
  local f
  if ! f=$(fsck_image "${devs[$s.test]}"); then st=fail; why="$f; $why"; fi
  if [ "$st" != notrun ] && grep -q "_require_scratch" "$fst/tests/$t" && ! grep -q "_require_scratch_nocheck" "$fst/tests/$t"; then
    if ! f=$(fsck_image "${devs[$s.scratch]}"); then st=fail; why="$f; $why"; fi
  fi
  status[$s.$t]=$st; reason[$s.$t]=$why
}

[ $report = 1 ] || for s in "${syslist[@]}"; do
  setup_system "$s" || { echo "cannot set up $s"; exit 1; }
done
# The systems run side by side, each through the list in order, each in its own directories.
run_system() {
  local s=$1 t ts
  : > "$work/$s/status.tsv"
  for t in "${tests[@]}"; do
    ts=$SECONDS
    run_one "$s" "$t"
    printf '%s\t%s\t%s\n' "$t" "${status[$s.$t]}" "${reason[$s.$t]}" >> "$work/$s/status.tsv"
    printf '%-8s %-13s %-7s %4ss\n' "$s" "$t" "${status[$s.$t]}" $((SECONDS - ts))
  done
}
t0=$SECONDS
pids=()
[ $report = 1 ] || for s in "${syslist[@]}"; do
  run_system "$s" & pids+=($!)
done
[ ${#pids[@]} = 0 ] || wait "${pids[@]}"
for s in "${syslist[@]}"; do
  [ -f "$work/$s/status.tsv" ] || continue
  while IFS=$'\t' read -r t st why; do
    status[$s.$t]=$st; reason[$s.$t]=$why
  done < "$work/$s/status.tsv"
done

# --- the table ----------------------------------------------------------------------------
echo
line=$(printf '%-13s' test)
for s in "${syslist[@]}"; do line+=$(printf ' %-7s' "$s"); done
echo "$line"
for t in "${tests[@]}"; do
  line=$(printf '%-13s' "$t")
  for s in "${syslist[@]}"; do line+=$(printf ' %-7s' "${status[$s.$t]:--}"); done
  echo "$line"
done
echo
printf '%-8s %5s %5s %7s\n' system pass fail "not run"
for s in "${syslist[@]}"; do
  p=0 f=0 n=0
  for t in "${tests[@]}"; do
    case ${status[$s.$t]:-} in pass) p=$((p + 1)) ;; fail) f=$((f + 1)) ;; notrun) n=$((n + 1)) ;; esac
  done
  printf '%-8s %5d %5d %7d\n' "$s" $p $f $n
done
if [ $report = 1 ]; then echo "(${#tests[@]} tests in the list; - : not run yet)"; else echo "(${#tests[@]} tests, $((SECONDS - t0)) s)"; fi

rc=0
case " ${syslist[*]} " in
  *" uext4 "*)
    echo
    echo "uext4, every test that did not pass (E: listed in $expected):"
    for t in "${tests[@]}"; do
      st=${status[uext4.$t]:-}
      [ -z "$st" ] || [ "$st" = pass ] && continue
      listed=$(awk -v t="$t" -v st="$st" '$1 == t && $2 == st' "$expected" 2>/dev/null)
      mark=" "; [ -n "$listed" ] && mark=E
      printf '%s %-13s %-6s %s\n' "$mark" "$t" "$st" "${reason[uext4.$t]}"
      if [ "$st" = fail ] && [ -z "$listed" ]; then rc=1; fi
    done
    for t in "${tests[@]}"; do
      if [ "${status[uext4.$t]:-}" = pass ] && awk -v t="$t" '$1 == t && $2 == "fail" {f=1} END {exit !f}' "$expected" 2>/dev/null; then
        echo "  $t passes now: remove it from $expected"
      fi
    done
    [ $rc = 0 ] && echo "fstests: no unexpected uext4 failures" || echo "fstests: unexpected uext4 failures (not in $expected)" ;;
esac
exit $rc
