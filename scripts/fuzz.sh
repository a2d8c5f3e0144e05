#!/usr/bin/env bash
# Builds and runs the libFuzzer harnesses of fuzz/ (stable Rust: see docs/SECURITY.md, "Fuzzing").
#   scripts/fuzz.sh --list                    the harnesses
#   scripts/fuzz.sh --build                   build them (exit 3: they cannot be built here)
#   scripts/fuzz.sh TARGET [SECONDS] [ARGS]   run one (default 60 s); ARGS go to libFuzzer
#   scripts/fuzz.sh --all SECONDS             a bounded run of every harness, one after another;
#                                             fails if any finds a crash, hang or leak
#   scripts/fuzz.sh --campaign SECONDS [TARGET...]
#                                             every harness (or those named) in turn, SECONDS
#                                             each, at nice 19, corpora kept in
#                                             target/fuzz-corpus; figures per harness (executions,
#                                             cov, ft, corpus, findings) appended to
#                                             $UEXT4_FUZZ_FIGURES (target/fuzz-campaign.txt)
# Seeds: scripts/fuzz-seeds.sh makes them (target/fuzz-seeds) when missing. Findings (crash-*,
# timeout-*, oom-*) land in target/fuzz-findings/TARGET.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
targets=(image_read journal_replay image_write partition tar devtable nbd)
host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')
build_dir=$root/target/fuzz-build
bin() { echo "$build_dir/$host/release/$1"; }

build() {
  [ -n "$host" ] || { echo "fuzz: rustc is not installed"; return 3; }
  # The instrumentation cargo-fuzz gives, all of it stable: SanitizerCoverage's inline 8-bit
  # counters, PC table and comparison tracing for libFuzzer; debug assertions and overflow
  # checks on. No AddressSanitizer (-Zsanitizer needs nightly). --target keeps build scripts
  # and proc macros uninstrumented.
  local flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
  flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
  flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
  local log rc=0
  log=$(cd fuzz && RUSTFLAGS="$flags" CARGO_TARGET_DIR="$build_dir" \
        cargo build --release --locked --target "$host" --bins 2>&1) || rc=$?
  printf '%s\n' "$log" | tail -20
  if [ $rc -ne 0 ]; then
    # A lock file that no longer matches the manifests is the project's mistake, not this
    # machine's: a failure, not a skip.
    if grep -q "cannot update the lock file" <<<"$log"; then
      echo "fuzz: fuzz/Cargo.lock does not match the manifests (run cargo tree in fuzz/ and commit it)"
      return 1
    fi
    return 3
  fi
  for t in "${targets[@]}"; do [ -x "$(bin "$t")" ] || { echo "fuzz: $t did not build"; return 3; }; done
}

seeds() {
  [ -d target/fuzz-seeds/images ] || bash scripts/fuzz-seeds.sh >/dev/null || return 3
}

# run TARGET SECONDS [libFuzzer args]: prints libFuzzer's last status line; 0 when no finding.
run() {
  local t=$1 secs=$2; shift 2
  local corpus=$root/target/fuzz-corpus/$t findings=$root/target/fuzz-findings/$t
  mkdir -p "$corpus" "$findings"
  local seed_dirs=()
  [ -d "target/fuzz-seeds/corpus/$t" ] && seed_dirs+=("$root/target/fuzz-seeds/corpus/$t")
  local log=$root/target/fuzz-findings/$t.log
  # Input sizes: an image harness's input is a seed choice and edits (and operations), a few
  # hundred bytes at most, used whole from the start; the others take raw bytes: a GPT with
  # its entries, tar headers with data, an NBD handshake with replies.
  local len
  case $t in
    image_read|journal_replay|image_write) len=(-max_len=384 -len_control=0) ;;
    partition) len=(-max_len=20480) ;;
    tar|nbd) len=(-max_len=16384) ;;
    *) len=(-max_len=4096) ;;
  esac
  # -timeout: one input over 10 s is a hang; -rss_limit_mb: 2 GiB is unbounded memory;
  # -malloc_limit_mb: one allocation over 512 MiB is an allocation sized by the image.
  (cd "$findings" && UEXT4_FUZZ_SEEDS=$root/target/fuzz-seeds/images \
     "$(bin "$t")" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
     "${len[@]}" -print_final_stats=1 -artifact_prefix="$findings/" "$@" \
     "$corpus" "${seed_dirs[@]}" >"$log" 2>&1)
  local rc=$?
  local last
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  echo "$t: $last"
  if [ $rc -ne 0 ]; then
    echo "$t: FINDING (exit $rc), see $log"; grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5
    return 1
  fi
}

figures() {
  local t=$1 log=$root/target/fuzz-findings/$1.log
  local execs cov ft corpus
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # A run that stopped on a finding prints no final statistics: its last status line.
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(ls "$root/target/fuzz-corpus/$t" | wc -l)
  local found
  found=$(ls "$root/target/fuzz-findings/$t" | wc -l)
  printf '%s %s executions=%s cov=%s ft=%s corpus=%s findings=%s\n' \
    "$(date -u +%FT%TZ)" "$t" "${execs:-0}" "${cov:-0}" "${ft:-0}" "$corpus" "$found"
}

case ${1:-} in
  --list) printf '%s\n' "${targets[@]}" ;;
  --build) build ;;
  --all)
    secs=${2:?"--all SECONDS"}
    build || exit $?
    seeds || exit 3
    bad=0
    for t in "${targets[@]}"; do run "$t" "$secs" || bad=1; done
    exit $bad ;;
  --campaign)
    secs=${2:?"--campaign SECONDS [TARGET...]"}
    shift 2
    out=${UEXT4_FUZZ_FIGURES:-$root/target/fuzz-campaign.txt}
    build || exit $?
    seeds || exit 3
    [ $# -gt 0 ] || set -- "${targets[@]}"
    for t in "$@"; do
      nice -n 19 "$0" --run-built "$t" "$secs"
      figures "$t" >> "$out"
    done ;;
  --run-built) run "$2" "$3" ;;
  ""|-h|--help) sed -n '2,17p' "$0" ;;
  *)
    t=$1 secs=${2:-60}; shift; [ $# -gt 0 ] && shift
    printf '%s\n' "${targets[@]}" | grep -qx "$t" || { echo "fuzz: no harness $t (--list)"; exit 2; }
    build || exit $?
    seeds || exit 3
    run "$t" "$secs" "$@" ;;
esac
