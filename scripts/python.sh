#!/usr/bin/env bash
# The Python package (crates/uext4-py): `pip install crates/uext4-py` into a temporary venv
# (maturin builds it; no build isolation and no index, so nothing is downloaded), then its
# pytest tests (crates/uext4-py/tests) against that install. maturin and pytest come from
# scripts/install-deps.sh; without pip, maturin or pytest this skips, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
skip() {
  echo "python package: skipped: $*"
  exit 0
}
command -v "$py" >/dev/null || skip "no $py"
"$py" -m pip --version >/dev/null 2>&1 || skip "no pip for $py"
"$py" -m maturin --version >/dev/null 2>&1 || skip "no maturin (scripts/install-deps.sh installs it)"
"$py" -m pytest --version >/dev/null 2>&1 || skip "no pytest (scripts/install-deps.sh installs it)"
"$py" -m venv --help >/dev/null 2>&1 || skip "no venv module for $py"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The venv sees the interpreter's own packages (maturin, pytest) and installs only uext4.
"$py" -m venv --system-site-packages "$tmp/venv"
export PATH="$tmp/venv/bin:$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
"$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index crates/uext4-py
# From elsewhere, so that the tests import the installed package.
root=$(pwd)
cd "$tmp"
"$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/uext4-py/tests" "$@"
