#!/usr/bin/env bash
# virtio-fs against virtio-blk, inside one guest: now `uext4 bench --family virtio-fs`
# (crates/uext4-bench/src/virtio_fs.rs and guest.rs; BENCHMARKS.md, "virtio-fs"). This script
# only runs it, with its arguments (--guest-entries N, --guest-mib M, --quick, --out DIR,
# --serve-options OPTS; see `uext4 bench --help`).
#
# Usage: scripts/virtio-fs-bench.sh [ARGS...]
# Needs target/release/uext4 and uext4-bench (cargo build --release -p uext4-cli -p uext4-bench;
# UEXT4_BENCH=path to use another harness) and what scripts/kernel-vm.sh needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${UEXT4_BENCH:-$root/target/release/uext4-bench}
[ -x "$bench" ] || { echo "virtio-fs-bench: no $bench (cargo build --release -p uext4-cli -p uext4-bench)" >&2; exit 2; }
exec "$bench" --family virtio-fs "$@"
