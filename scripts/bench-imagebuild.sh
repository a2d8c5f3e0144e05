#!/bin/bash
# Image building, side by side: uext4 mkfs -d (from a tree and from its tarball), mke2fs -d and
# genext2fs (-d and -a), two rounds each; wall time and peak memory from /usr/bin/time -v.
# Usage: scripts/bench-imagebuild.sh [UEXT4_BINARY]   (prints a Markdown table)
# Inputs: a generated tree of about 50k entries in /dev/shm, and ~/.cargo/registry/src where
# present; every image is written to /dev/shm and checked with e2fsck -fn.
set -euo pipefail
U=${1:-target/release/uext4}
W=/dev/shm/uext4-bench-imagebuild
rm -rf "$W" && mkdir -p "$W"
trap 'rm -rf "$W"' EXIT

# 500 directories of 100 files (0 to 16 KiB, fixed seed) and a symlink each: 50.5k entries.
python3 - "$W/gen" <<'EOF'
import os, random, sys
random.seed(29)
root = sys.argv[1]
for d in range(500):
    p = os.path.join(root, "d%03d" % d)
    os.makedirs(p)
    for f in range(100):
        with open(os.path.join(p, "file-%03d.dat" % f), "wb") as o:
            o.write(random.randbytes(random.randrange(0, 16384)))
    os.symlink("file-000.dat", os.path.join(p, "link"))
EOF
inputs=("$W/gen")
if [ -d "$HOME/.cargo/registry/src" ]; then
    cp -a "$HOME/.cargo/registry/src" "$W/cargo"
    inputs+=("$W/cargo")
fi

measure() { # label, image, command...
    local label=$1 img=$2
    shift 2
    for round in 1 2; do
        rm -f "$img"
        /usr/bin/time -v -o "$W/time" "$@" > /dev/null 2> "$W/err" || { cat "$W/err"; exit 1; }
        e2fsck -fn "$img" > /dev/null 2>&1 || { echo "e2fsck failed: $label"; exit 1; }
        wall=$(awk -F': ' '/Elapsed/ {print $2}' "$W/time")
        rss=$(awk -F': ' '/Maximum resident/ {printf "%.0f", $2/1024}' "$W/time")
        echo "| $label | $round | $wall | $rss |"
    done
}

echo "| build | round | wall (m:ss) | peak RSS (MiB) |"
echo "|---|---|---|---|"
for t in "${inputs[@]}"; do
    name=$(basename "$t")
    entries=$(find "$t" | wc -l)
    mb=$(du -sm "$t" | cut -f1)
    tar --numeric-owner -cf "$t.tar" -C "$t" .
    echo "| **$name: $entries entries, $mb MiB** | | | |"
    img=$W/img
    measure "uext4 mkfs --size 2G -d DIR" "$img" "$U" mkfs --size 2G -d "$t" "$img"
    measure "uext4 mkfs --size 2G -d DIR.tar" "$img" "$U" mkfs --size 2G -d "$t.tar" "$img"
    measure "uext4 mkfs --size fit -d DIR" "$img" "$U" mkfs --size fit -d "$t" "$img"
    measure "mke2fs -q -F -t ext4 -d DIR IMG 2G" "$img" mke2fs -q -F -t ext4 -d "$t" "$img" 2G
    if command -v genext2fs > /dev/null; then
        measure "genext2fs -B 4096 -b 524288 -N 131072 -d DIR" "$img" \
            genext2fs -B 4096 -b 524288 -N 131072 -d "$t" "$img"
        measure "genext2fs -B 4096 -b 524288 -N 131072 -a DIR.tar" "$img" \
            genext2fs -B 4096 -b 524288 -N 131072 -a "$t.tar" "$img"
    fi
    rm -f "$t.tar"
done
