#!/usr/bin/env bash
# Installs the uext4 binary, its mount helpers, man pages and shell completions, so that tools
# that start fuse2fs-like programs find it and people find its manual and Tab:
#   $BINDIR/uext4                  (default $PREFIX/bin; PREFIX defaults to /usr/local)
#   $BINDIR/uext4-bench            the benchmark harness `uext4 bench` runs (beside uext4)
#   $SBINDIR/mount.fuse.uext4      (default /sbin, or $PREFIX/sbin when PREFIX is given)
#                                  mount(8)'s helper for -t fuse.uext4 and fstab
#   $SBINDIR/mount.uext4           the same, for -t uext4
#   $MANDIR/man1/uext4.1, uext4-CMD.1 ...   (default $PREFIX/share/man) from `uext4 manpages`
#   $DATADIR/bash-completion/completions/uext4, $DATADIR/zsh/site-functions/_uext4,
#   $DATADIR/fish/vendor_completions.d/uext4.fish   (default $PREFIX/share) from
#                                  `uext4 completions SHELL`
# Each helper is a symbolic link to the binary, which reads mount(8)'s and mount.fuse3's
# argument forms when called by those names (and fuse2fs's when called `fuse2fs`).
# Builds the release binaries first if they are missing. Run as root for the default
# directories; `PREFIX=$HOME/.local scripts/install.sh` installs for one user.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PREFIX:-}" ]; then
  SBINDIR=${SBINDIR:-$PREFIX/sbin}
fi
PREFIX=${PREFIX:-/usr/local}
BINDIR=${BINDIR:-$PREFIX/bin}
SBINDIR=${SBINDIR:-/sbin}
MANDIR=${MANDIR:-$PREFIX/share/man}
DATADIR=${DATADIR:-$PREFIX/share}
bin=${CARGO_TARGET_DIR:-target}/release/uext4
[ -x "$bin" ] && [ -x "$bin-bench" ] || cargo build --release -p uext4-cli -p uext4-bench
install -d "$BINDIR" "$SBINDIR"
for b in uext4 uext4-bench; do
  install -m 0755 "${bin%/uext4}/$b" "$BINDIR/$b.new"
  mv -f "$BINDIR/$b.new" "$BINDIR/$b"
done
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.fuse.uext4"
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.uext4"

# Man pages and completions come from the installed binary's own command definitions.
pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
"$BINDIR/uext4" manpages "$pages"
install -d "$MANDIR/man1"
install -m 0644 "$pages"/*.1 "$MANDIR/man1/"
install -d "$DATADIR/bash-completion/completions" "$DATADIR/zsh/site-functions" \
  "$DATADIR/fish/vendor_completions.d"
"$BINDIR/uext4" completions bash >"$DATADIR/bash-completion/completions/uext4"
"$BINDIR/uext4" completions zsh >"$DATADIR/zsh/site-functions/_uext4"
"$BINDIR/uext4" completions fish >"$DATADIR/fish/vendor_completions.d/uext4.fish"
echo "installed $BINDIR/uext4, $BINDIR/uext4-bench, $SBINDIR/mount.fuse.uext4," \
  "$SBINDIR/mount.uext4, $(ls "$pages" | wc -l) man pages in $MANDIR/man1, completions" \
  "for bash, zsh and fish in $DATADIR"
