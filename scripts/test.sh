#!/usr/bin/env bash
# Runs every test of the project, installing what is missing first.
#   scripts/test.sh          the full default suite (CI runs this; well under 20 minutes)
#   scripts/test.sh --long   also the slow suites (long crash-checker run, more random cases)
# Ends with one line "N passed, N failed" over the suites it ran; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

long=0
for a in "$@"; do
  case $a in
    --long) long=1 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument $a (known: --long)" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh || echo "(some dependencies could not be installed; suites that need them skip)"
command -v cargo >/dev/null || { echo "cargo is not installed (https://rustup.rs)"; echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
failures=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT
suite() {
  local name=$1; shift
  echo "=== $name"
  local t0=$SECONDS
  if "$@"; then
    passed=$((passed + 1))
    echo "=== $name: passed ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "=== $name: FAILED ($((SECONDS - t0)) s)"
  fi
}

export RUST_BACKTRACE=1
if [ $long = 1 ]; then
  export UEXT4_CRASH_STATES=${UEXT4_CRASH_STATES:-3000}
  export UEXT4_EXTENT_CASES=${UEXT4_EXTENT_CASES:-500}
  export UEXT4_LONG=1
else
  export UEXT4_QUICK=1
fi

# Every cargo test (unit, model, kernel compatibility, corruption, crash, journal, mkfs, tools,
# mount, bench smoke test); the tests that need root, a loop device or FUSE skip with a message.
cargo_tests() {
  cargo test --release --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } }
       END { printf "cargo tests: %d passed, %d failed, %d ignored\n", p, f, g }' "$log"
  return "$rc"
}

suite "build (release)" cargo build --release --workspace
# The habits: formatting, lints and docs are checked like tests.
suite "cargo fmt --check" cargo fmt --all --check
suite "cargo clippy -D warnings" cargo clippy --release --workspace --all-targets -- -D warnings
suite "cargo doc -D warnings" env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
# The library without its optional parts (NBD, GPT, the mapped backend), as an embedder may
# build it; and the published crates packaged and built from their packages as crates.io
# would (`cargo publish --dry-run` without the upload; offline: the dependencies are the ones
# the build above fetched).
suite "uext4 --no-default-features" env RUSTFLAGS="-D warnings" cargo check -p uext4 --no-default-features
# Cargo verifies each package against the others through a temporary local registry, and
# takes a registry crate's version for its fingerprint: a later run would build uext4-fuse
# against the uext4 an earlier run compiled. So the verification builds in its own target
# directory, from which our own crates' artifacts (and their unpackings in the cargo home;
# the "-HASH" directories are local registries, never crates.io) go first.
cargo_package() {
  local dir=target/package-verify
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/uext4-* \
    "$dir"/debug/.fingerprint/uext4-* "$dir"/debug/deps/*uext4* "$dir"/debug/build/uext4-*
  cargo package --offline --allow-dirty --workspace --target-dir "$dir" \
    --exclude uext4-testkit --exclude uext4-py --exclude uext4-bench
}
suite "cargo package" cargo_package
# The mount helpers (mount -t fuse.uext4, fstab), for the overlay suite's helper test.
if [ "$(id -u)" -eq 0 ]; then
  suite "scripts/install.sh" bash scripts/install.sh
fi
suite "cargo tests" cargo_tests
suite "scripts/demo.sh" env UEXT4_DEMO_KEEP=0 bash scripts/demo.sh
# The Python package: pip-installed into a temporary venv, its pytest tests (skips without
# pip, maturin or pytest).
suite "python package" bash scripts/python.sh
for s in scripts/pjdfstest.sh scripts/workloads.sh; do
  [ -f "$s" ] && suite "$s" bash "$s"
done
# The fuzz harnesses (fuzz/, docs/FUZZING.md): a bounded run of each, 30 s (300 s with --long),
# from the corpus earlier runs left in target/fuzz-corpus; fails on a crash, hang or runaway
# memory. Skips in one line where the harnesses cannot be built (scripts/fuzz.sh exits 3).
fuzz_suite() {
  local secs=30
  [ $long = 1 ] && secs=300
  bash scripts/fuzz.sh --all "${UEXT4_FUZZ_SECONDS:-$secs}"
  local rc=$?
  if [ $rc -eq 3 ]; then
    echo "scripts/fuzz.sh: the fuzz harnesses cannot be built here (see above); skipped"
    return 0
  fi
  return $rc
}
suite "scripts/fuzz.sh --all" fuzz_suite
# fstests (xfstests) through a uext4 mount: the bounded list (tests/fstests-ci.txt), or
# generic/quick with --long; e2fsck after every test; skips without the fstests source.
if [ $long = 1 ]; then
  suite "scripts/fstests.sh --long" bash scripts/fstests.sh --long
else
  suite "scripts/fstests.sh" bash scripts/fstests.sh
fi
# POSIX behaviour again on an ext3 image (indirect block maps instead of extents).
suite "scripts/pjdfstest.sh on ext3" env UEXT4_PJDFSTEST_FS=ext3 bash scripts/pjdfstest.sh
suite "scripts/pjdfstest.sh over NBD" env UEXT4_PJDFSTEST_NBD=1 bash scripts/pjdfstest.sh
suite "scripts/pjdfstest.sh over io_uring" env UEXT4_MOUNT_OPTS=transport=uring bash scripts/pjdfstest.sh
# The same suite inside a guest over virtio-fs (uext4 serve; skips without QEMU or a guest kernel).
suite "scripts/virtio-fs-pjdfstest.sh" bash scripts/virtio-fs-pjdfstest.sh

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed suite: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
