#!/usr/bin/env bash
# Runs every test of the project, installing what is missing first.
#   scripts/test.sh          the full default suite (CI runs this; well under 20 minutes)
#   scripts/test.sh --long   also the slow suites (long crash-checker run, full kernel trees)
set -uo pipefail
cd "$(dirname "$0")/.."

long=0
[ "${1:-}" = "--long" ] && long=1

bash scripts/install-deps.sh

passed=0
failed=0
failures=()
suite() {
  local name=$1; shift
  echo "=== $name"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
  fi
}

export RUST_BACKTRACE=1
if [ $long = 1 ]; then
  export UEXT4_CRASH_STATES=${UEXT4_CRASH_STATES:-3000}
else
  export UEXT4_QUICK=1
fi

suite "build (release)" cargo build --release --workspace
suite "cargo tests (unit, model, kernel compatibility, corruption, crash, tools, mount)" \
  cargo test --release --workspace -- --test-threads=2
for s in scripts/pjdfstest.sh scripts/workloads.sh scripts/bench-quick.sh; do
  [ -x "$s" ] && suite "$s" "$s"
done

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed suite: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
