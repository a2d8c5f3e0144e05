#!/bin/bash
# Image building, side by side: uext4 mkfs -d (from a tree and from its tarball), mke2fs -d and
# genext2fs (-d and -a), alternated, ROUNDS rounds each; wall time, CPU time (user + system)
# and peak memory from /usr/bin/time -v.
# Usage: scripts/bench-imagebuild.sh [UEXT4_BINARY] [ROUNDS]   (prints a Markdown table)
# With BEFORE=ANOTHER_UEXT4_BINARY, that binary's tree builds are measured in the same rounds.
# Inputs, generated with fixed seeds in /dev/shm: `small` (105 directories of 100 files of
# 0-24 KiB), `gen` (500 directories of 100 files of 0-16 KiB and a symlink each) and `wide`
# (20 directories of 2,500 files of 0-4 KiB: large directories), plus a copy of
# ~/.cargo/registry/src where present. Every image is written to /dev/shm and checked with
# e2fsck -fn.
set -euo pipefail
U=${1:-target/release/uext4}
ROUNDS=${2:-2}
W=/dev/shm/uext4-bench-imagebuild
rm -rf "$W" && mkdir -p "$W"
trap 'rm -rf "$W"' EXIT

python3 - "$W" <<'EOF'
import os, random, sys
w = sys.argv[1]
def tree(name, seed, dirs, files, most, link):
    random.seed(seed)
    for d in range(dirs):
        p = os.path.join(w, name, "d%03d" % d)
        os.makedirs(p)
        for f in range(files):
            with open(os.path.join(p, "file-%04d.dat" % f), "wb") as o:
                o.write(random.randbytes(random.randrange(0, most)))
        if link:
            os.symlink("file-0000.dat", os.path.join(p, "link"))
tree("small", 7, 105, 100, 24576, False)
tree("gen", 29, 500, 100, 16384, True)
tree("wide", 31, 20, 2500, 4096, False)
EOF
inputs=("$W/small" "$W/gen" "$W/wide")
if [ -d "$HOME/.cargo/registry/src" ]; then
    cp -a "$HOME/.cargo/registry/src" "$W/cargo"
    inputs+=("$W/cargo")
fi

# One run: wall seconds, CPU seconds and peak RSS (MiB) of the command, as "wall cpu rss".
run() { # image, command...
    local img=$1
    shift
    rm -f "$img"
    /usr/bin/time -v -o "$W/time" "$@" > /dev/null 2> "$W/err" || { cat "$W/err" >&2; exit 1; }
    e2fsck -fn "$img" > /dev/null 2>&1 || { echo "e2fsck failed: $*" >&2; exit 1; }
    awk -F': ' '/Elapsed/ {n = split($2, t, ":"); w = t[n] + (n > 1 ? t[n-1] * 60 : 0)}
        /User time/ {u = $2} /System time/ {s = $2}
        /Maximum resident/ {r = $2 / 1024}
        END {printf "%.2f %.2f %.0f\n", w, u + s, r}' "$W/time"
}

echo "| input | build | wall s (rounds) | CPU s (rounds) | peak RSS MiB |"
echo "|---|---|---|---|---|"
img=$W/img
for t in "${inputs[@]}"; do
    name=$(basename "$t")
    entries=$(find "$t" | wc -l)
    mb=$(du -sm "$t" | cut -f1)
    tar --numeric-owner -cf "$t.tar" -C "$t" .
    labels=("uext4 mkfs -d DIR" "uext4 mkfs -d DIR.tar" "mke2fs -d DIR" "genext2fs -d DIR"
        "genext2fs -a DIR.tar" "uext4 mkfs --size fit -d DIR" "before: uext4 mkfs -d DIR"
        "before: uext4 mkfs -d DIR.tar")
    declare -A wall=() cpu=() rss=()
    for round in $(seq "$ROUNDS"); do
        for i in "${!labels[@]}"; do
            case $i in
                0) cmd=("$U" mkfs --size 2G -d "$t" "$img") ;;
                1) cmd=("$U" mkfs --size 2G -d "$t.tar" "$img") ;;
                2) cmd=(mke2fs -q -F -t ext4 -d "$t" "$img" 2G) ;;
                3) cmd=(genext2fs -B 4096 -b 524288 -N 131072 -d "$t" "$img") ;;
                4) cmd=(genext2fs -B 4096 -b 524288 -N 131072 -a "$t.tar" "$img") ;;
                5) cmd=("$U" mkfs --size fit -d "$t" "$img") ;;
                6) cmd=("${BEFORE:-}" mkfs --size 2G -d "$t" "$img") ;;
                7) cmd=("${BEFORE:-}" mkfs --size 2G -d "$t.tar" "$img") ;;
            esac
            if { [ "$i" = 3 ] || [ "$i" = 4 ]; } && ! command -v genext2fs > /dev/null; then
                continue
            fi
            if [ "$i" -ge 6 ] && [ -z "${BEFORE:-}" ]; then
                continue
            fi
            read -r w c r < <(run "$img" "${cmd[@]}")
            wall[$i]="${wall[$i]:+${wall[$i]}, }$w"
            cpu[$i]="${cpu[$i]:+${cpu[$i]}, }$c"
            rss[$i]="${rss[$i]:+${rss[$i]}, }$r"
        done
    done
    for i in "${!labels[@]}"; do
        [ -n "${wall[$i]:-}" ] || continue
        echo "| $name: $entries entries, $mb MiB | ${labels[$i]} | ${wall[$i]} | ${cpu[$i]} | ${rss[$i]} |"
    done
    unset wall cpu rss
    rm -f "$t.tar"
done
