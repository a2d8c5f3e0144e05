#!/bin/bash
# A container session on a writable overlay, timed side by side on the stacks users have
# (issue 26, step 4):
#   kernel    the kernel's overlayfs, upper on the kernel's ext4 (loop-mounted image)
#   uext4     the kernel's overlayfs, upper on `uext4 mount -o allow_other IMG MNT`
#   uext4-wb  the same with `-o allow_other,writeback_cache`
#   fuse      fuse-overlayfs over `fuse2fs IMG MNT -o allow_other` (as Apptainer does today)
# Same lower tree (generated, fixed seed, ~3,100 files) and the same session for all; each
# upper is a fresh 2 GiB image made by the same mke2fs, in /dev/shm. Rounds are interleaved
# (kernel uext4 uext4-wb fuse, kernel uext4 ...); every phase is timed with date +%s.%N.
# Afterwards e2fsck -fn checks every image; a complaint about uext4's image fails the run.
# Usage (root): scripts/bench-overlay.sh [UEXT4_BINARY]   (ROUNDS=3 by default)
# Prints SKIP and exits 0 without root, /dev/fuse, overlayfs, fuse-overlayfs or fuse2fs.
set -euo pipefail
U=${1:-target/release/uext4}
ROUNDS=${ROUNDS:-3}
STACKS=${STACKS:-kernel uext4 uext4-wb fuse}

skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root"
[ -e /dev/fuse ] || skip "no /dev/fuse"
grep -qw overlay /proc/filesystems || modprobe overlay 2> /dev/null || true
grep -qw overlay /proc/filesystems || skip "no overlayfs in this kernel"
command -v fuse-overlayfs > /dev/null || skip "no fuse-overlayfs (scripts/install-deps.sh)"
command -v fuse2fs > /dev/null || skip "no fuse2fs (scripts/install-deps.sh)"
[ -e /dev/loop-control ] || skip "no loop devices for the kernel's ext4"
command -v python3 > /dev/null || skip "no python3"
PY=$(python3 -c 'import sys; print(sys.executable)') # not a version manager's shim: starts faster
[ -x "$U" ] || { echo "no uext4 binary at $U (cargo build --release -p uext4-cli)" >&2; exit 1; }
U=$(realpath "$U")

W=/dev/shm/uext4-bench-overlay
cleanup() {
    for m in $(awk -v w="$W" 'index($2, w) == 1 {print $2}' /proc/self/mounts | sort -r); do
        umount -l "$m" 2> /dev/null || true
    done
    rm -rf "$W"
}
cleanup
mkdir -p "$W"
trap cleanup EXIT

# The lower tree and the session's phases, in one small program (fixed seeds: every stack
# gets the same operations on the same files).
cat > "$W/session.py" <<'EOF'
import os, random, shutil, sys

def lower_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            out.append(os.path.relpath(os.path.join(d, f), root))
    return out

def gen(root):
    r = random.Random(26)
    for a in range(40):
        for b in range(3):
            p = os.path.join(root, "usr/lib/pkg%02d/sub%d" % (a, b))
            os.makedirs(p)
            for f in range(25):
                with open(os.path.join(p, "f%03d.py" % f), "wb") as o:
                    o.write(r.randbytes(r.randrange(0, 16384)))
        os.symlink("sub0/f000.py", os.path.join(root, "usr/lib/pkg%02d/link" % a))
    os.makedirs(os.path.join(root, "usr/bin"))
    for f in range(20):
        with open(os.path.join(root, "usr/bin/tool%02d" % f), "wb") as o:
            o.write(r.randbytes(1 << 20))
        os.chmod(os.path.join(root, "usr/bin/tool%02d" % f), 0o755)
    os.makedirs(os.path.join(root, "etc"))
    for f in range(100):
        with open(os.path.join(root, "etc/conf%03d" % f), "w") as o:
            o.write("key%d = %d\n" % (f, f) * 20)
    with open(root + ".list", "w") as o:  # the phases' file list, so they need not walk the tree
        o.write("\n".join(lower_files(root)))

def install(path, data):
    # dpkg's pattern: write a temporary, fsync it, rename it over the final name.
    tmp = path + ".dpkg-new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, path)

def phase(name, m, lower):
    files = open(lower + ".list").read().split("\n")
    py = [f for f in files if f.endswith(".py")]
    r = random.Random(name)
    if name == "copyup":       # modify lower files in place: 400 small, the 20 big ones, etc
        for f in py[::7][:400] + [f for f in files if f.startswith("usr/bin/")]:
            with open(os.path.join(m, f), "ab") as o:
                o.write(b"# patched\n")
        for f in [f for f in files if f.startswith("etc/")]:
            with open(os.path.join(m, f), "r+") as o:
                o.write("changed")
    elif name == "install":    # 3,000 new files in new directories, 300 replacing lower files
        for p in range(30):
            d = os.path.join(m, "usr/local/lib/site/new%02d" % p)
            os.makedirs(d)
            for f in range(100):
                install(os.path.join(d, "m%03d.py" % f), r.randbytes(r.randrange(0, 16384)))
        for f in py[3::10][:300]:
            install(os.path.join(m, f), r.randbytes(r.randrange(0, 16384)))
    elif name == "whiteout":   # delete 500 lower files
        for f in py[5::6][:500]:
            if os.path.lexists(os.path.join(m, f)):
                os.unlink(os.path.join(m, f))
    elif name == "opaque":     # rm -rf 3 lower directories and make them again
        for a in (10, 20, 30):
            d = os.path.join(m, "usr/lib/pkg%02d" % a)
            shutil.rmtree(d)
            os.makedirs(os.path.join(d, "sub0"))
            for f in range(100):
                with open(os.path.join(d, "sub0/n%03d.py" % f), "wb") as o:
                    o.write(r.randbytes(r.randrange(0, 8192)))
    elif name == "rename":     # rename 2 lower directories (EXDEV: copied, as mv does) and 5 new ones
        for a in (11, 21):
            shutil.move(os.path.join(m, "usr/lib/pkg%02d" % a), os.path.join(m, "usr/lib/old%02d" % a))
        for p in range(5):
            os.rename(os.path.join(m, "usr/local/lib/site/new%02d" % p),
                      os.path.join(m, "usr/local/lib/site/renamed%02d" % p))
    elif name == "attrs":      # chmod, chown and user.* xattrs on 300 lower and 300 new files
        new = [os.path.join("usr/local/lib/site/new%02d/m%03d.py" % (p, f))
               for p in range(10, 30) for f in range(0, 100, 7)][:300]
        for f in [f for f in py[1::9] if os.path.exists(os.path.join(m, f))][:300] + new:
            p = os.path.join(m, f)
            os.chmod(p, 0o640)
            os.chown(p, 1000, 1000)
            os.setxattr(p, "user.pkg", b"owner=bench")
    elif name == "hardlink":   # 200 hard links to lower files, 200 to new files
        old = [f for f in py[2::11] if os.path.exists(os.path.join(m, f))][:200]
        new = ["usr/local/lib/site/new%02d/m%03d.py" % (p, f) for p in range(10, 30) for f in range(10)]
        os.makedirs(os.path.join(m, "usr/share/links"))
        for i, f in enumerate(old + new):
            os.link(os.path.join(m, f), os.path.join(m, "usr/share/links/l%04d" % i))
    elif name != "none":
        sys.exit("unknown phase " + name)

if sys.argv[1] == "gen":
    gen(sys.argv[2])
else:
    phase(sys.argv[1], sys.argv[2], sys.argv[3])
EOF
PHASES="copyup install whiteout opaque rename attrs hardlink"

L=$W/lower
mkdir -p "$L"
"$PY" "$W/session.py" gen "$L"
echo "lower tree: $(find "$L" -type f | wc -l) files, $(find "$L" | wc -l) entries, $(du -sm "$L" | cut -f1) MiB"

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; } # start, end
wait_mounted() { # mount point, pid of its server
    for _ in $(seq 200); do
        mountpoint -q "$1" && return 0
        kill -0 "$2" 2> /dev/null || { echo "the server for $1 exited" >&2; return 1; }
        sleep 0.05
    done
    echo "$1 not mounted after 10 s" >&2
    return 1
}

# One session on one stack: prints "stack round t_phase... t_sync t_umount total".
session() { # stack, round
    local s=$1 round=$2 img=$W/$1.img base=$W/$1.mnt m=$W/$1.merged pid="" opid=""
    rm -f "$img"
    truncate -s 2G "$img"
    mke2fs -q -F -t ext4 "$img"
    mkdir -p "$base" "$m"
    case $s in
        kernel) mount -o loop "$img" "$base" ;;
        uext4) "$U" mount -o allow_other "$img" "$base" ;;
        uext4-wb) "$U" mount -o allow_other,writeback_cache "$img" "$base" ;;
        fuse)
            fuse2fs "$img" "$base" -o allow_other -f > "$W/fuse2fs.log" 2>&1 &
            pid=$!
            wait_mounted "$base" "$pid" ;;
    esac
    mkdir -p "$base/upper" "$base/work"
    if [ "$s" = fuse ]; then
        fuse-overlayfs -f -o "lowerdir=$L,upperdir=$base/upper,workdir=$base/work" "$m" \
            > "$W/fuse-overlayfs.log" 2>&1 &
        opid=$!
        wait_mounted "$m" "$opid"
    else
        mount -t overlay overlay -o "lowerdir=$L,upperdir=$base/upper,workdir=$base/work" "$m"
    fi
    local line="| $s | $round |" t0 t1 start
    start=$(now)
    for p in $PHASES; do
        t0=$(now)
        "$PY" "$W/session.py" "$p" "$m" "$L"
        t1=$(now)
        line+=" $(secs "$t0" "$t1") |"
    done
    # sync: syncfs on the merged tree; umount: the overlay, then the upper, until its
    # server has written the image and exited.
    t0=$(now)
    sync -f "$m"
    t1=$(now)
    line+=" $(secs "$t0" "$t1") |"
    t0=$(now)
    umount "$m"
    [ -z "$opid" ] || wait "$opid" || true
    case $s in
        kernel) umount "$base" ;;
        uext4*) "$U" umount "$base" ;;
        fuse) umount "$base"; wait "$pid" || true ;;
    esac
    t1=$(now)
    line+=" $(secs "$t0" "$t1") | $(secs "$start" "$t1") |"
    echo "$line"
    echo "$line" >> "$W/rows"
    # e2fsck -fn on every image; a complaint fails the run for uext4, is reported for the others.
    if ! e2fsck -fn "$img" > "$W/fsck.log" 2>&1; then
        echo "e2fsck -fn complains about $s's image (round $round):"
        head -20 "$W/fsck.log"
        case $s in uext4*) exit 1 ;; esac
        echo "$s round $round: e2fsck complained" >> "$W/complaints"
    fi
    rm -f "$img"
}

# What every phase costs before any file operation (starting the interpreter, reading the list).
floor=()
for _ in 1 2 3; do
    t0=$(date +%s.%N); "$PY" "$W/session.py" none "$L" "$L"; t1=$(date +%s.%N)
    floor+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
done
echo "per-phase floor (the program starting, no file operations): ${floor[*]} s"
echo

hdr="| stack | round |"
sep="|---|---|"
for p in $PHASES sync umount total; do hdr+=" $p |"; sep+="---|"; done
echo "$hdr"
echo "$sep"
for round in $(seq "$ROUNDS"); do
    for s in $STACKS; do session "$s" "$round"; done
done

# Medians per stack and phase, then the ratios of the total.
echo
echo "Medians of $ROUNDS rounds (seconds):"
echo
echo "$hdr" | sed 's/ round |//'
echo "$sep" | sed 's/|---|---|/|---|/'
python3 - "$W/rows" "$STACKS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    rows.setdefault(cells[0], []).append([float(c) for c in cells[2:]])
med = {}
for s in sys.argv[2].split():
    if s in rows:
        med[s] = [statistics.median(col) for col in zip(*rows[s])]
        print("| %s | %s |" % (s, " | ".join("%.2f" % v for v in med[s])))
print()
for a, b in (("uext4", "kernel"), ("uext4", "fuse"), ("uext4-wb", "kernel"), ("uext4-wb", "fuse")):
    if a in med and b in med:
        print("total %s / %s: %.2f" % (a, b, med[a][-1] / med[b][-1]))
EOF
if [ -e "$W/complaints" ]; then
    echo
    echo "e2fsck complaints (not uext4's):"
    cat "$W/complaints"
fi
