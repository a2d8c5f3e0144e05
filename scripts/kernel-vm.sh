#!/usr/bin/env bash
# A real kernel as an oracle, in a small VM: boots Debian's kernel (linux-image-amd64, 6.1:
# CONFIG_UNICODE=y, CONFIG_FS_VERITY=y, fscrypt, quota v2 as a module) under KVM, with image
# files as virtio disks, runs a busybox shell script inside, and hands back its output and exit
# status. The host kernel may lack what the guest has (this one: no CONFIG_UNICODE, no
# CONFIG_FS_VERITY, no CONFIG_QFMT_V2), so casefolded, verity and quota images are read and
# written here by the kernel they were designed for.
#
# Usage:
#   scripts/kernel-vm.sh [--disk IMG]... [--file PATH]... [--vhost-user-fs SOCKET:TAG]...
#                        [--timeout S [--kill]] [--mem MIB] SCRIPT
#   scripts/kernel-vm.sh --check    exit 0 when a VM can boot here, else print "SKIP: why", exit 77
#   scripts/kernel-vm.sh --build    build (or find) the cached initramfs and print its path
#
# In the guest SCRIPT runs under busybox sh as root, from /, with: the disks as /dev/vda,
# /dev/vdb, ... in the order given (raw, written in place: mount them read-only for a
# read-only check); each --file as /in/BASENAME; each --vhost-user-fs as a virtio-fs device
# whose back end listens on SOCKET (`uext4 serve --vhost-user-fs SOCKET IMAGE`), mounted in
# the guest with `mount -t virtiofs TAG /mnt/...` (the guest's memory is then a shared memfd,
# as vhost-user needs; QEMU waits for the back end's socket, so start the back end first);
# an empty /mnt (mount points: mkdir under it);
# `uext4-vm-helper` on PATH (scripts/kernel-vm/helper.rs: chattr flags, fscrypt add-key and
# set-policy, fs-verity enable and measure, quotactl's Q_GETQUOTA, project ids, writes as
# another user, and name-exact bulk lookups, listings, creations and removals); the modules
# of ext4, quota v1/v2, virtio disks, virtio-fs and fscrypt's ciphers loaded.
# The script's stdout and stderr come back as this script's stdout and stderr (each over a
# serial port of its own, byte for byte), its exit status as this script's. After it ends,
# the guest unmounts what is still mounted under /mnt; any "EXT4-fs error", "EXT4-fs warning"
# or kernel oops/warning in the guest's log is printed to stderr and turns a 0 status into 3.
#
# Accelerator: KVM (`-cpu host`) when the CPU offers vmx or svm, else TCG (`-cpu max`, about
# 12 s a boot on a 2-core host; KVM, not measured here, is far faster). A /dev/kvm without
# vmx/svm (PVM, as on this project's build hosts) boots only kernels built as PVM guests:
# Debian's hangs in early boot there, so it is not used. UEXT4_VM_ACCEL=kvm insists on KVM,
# =tcg on TCG.
#
# Exit status: the script's; 77 with "SKIP: why" when no VM can run here (no
# qemu-system-x86_64, no kernel with CONFIG_UNICODE in /boot with its modules, no
# busybox-static, no rustc; with UEXT4_VM_ACCEL=kvm, no usable /dev/kvm with vmx/svm); 124
# when it ran past the timeout (60 s, or --timeout, or UEXT4_VM_TIMEOUT; QEMU then gets SIGTERM,
# or with --kill SIGKILL: a monitor that dies, leaving its vhost-user back ends mid-request);
# 125 when the VM ended without reporting a status. The guest's console (kernel log) is
# printed to stderr on 124/125, or always with UEXT4_VM_CONSOLE=1.
#
# Kernel: UEXT4_VM_KERNEL=/path/vmlinuz-VERSION (modules from /lib/modules/VERSION), else the
# newest /boot/vmlinuz-* whose config has CONFIG_UNICODE=y. The packages come from
# scripts/install-deps.sh (linux-image-amd64, qemu-system-x86, busybox-static).
#
# The initramfs (uncompressed cpio: static busybox, the modules with their modules.dep
# dependencies, compressed ones (.ko.xz, .ko.zst, .ko.gz) unpacked, an /init, the helper) is
# built once and cached under target/kernel-vm/KERNEL-VERSION-HASH/ (UEXT4_VM_CACHE to move it;
# HASH covers this script and the helper's source); each run appends a second small cpio with
# the script and the --file inputs, which the kernel unpacks over the first.
#
# Why a Rust helper rather than host binaries: busybox has no chattr and no fscrypt or
# fs-verity ioctls; fscrypt and fs-verity's tools (fscryptctl, fsverity) are dynamically linked
# to libraries of their own and libcrypto, and copying them with their ldd closure would tie
# the initramfs to what the host happens to have installed. One std-only source file compiled
# statically (glibc's libc.a) by the rustc that builds the project has no dependency at all
# and states each ioctl's layout where it is used.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
self="$root/scripts/kernel-vm.sh"
helper_src="$root/scripts/kernel-vm/helper.rs"

skip() {
  echo "SKIP: $*"
  exit 77
}

# The kernel to boot: sets vmlinuz, kver.
find_kernel() {
  vmlinuz=${UEXT4_VM_KERNEL:-}
  if [ -z "$vmlinuz" ]; then
    local k
    for k in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
      if grep -qx 'CONFIG_UNICODE=y' "/boot/config-${k#/boot/vmlinuz-}" 2>/dev/null; then
        vmlinuz=$k
        break
      fi
    done
  fi
  [ -n "$vmlinuz" ] || skip "no kernel with CONFIG_UNICODE=y in /boot (apt-get install linux-image-amd64)"
  [ -r "$vmlinuz" ] || skip "cannot read $vmlinuz"
  kver=${vmlinuz##*/vmlinuz-}
  [ -f "/lib/modules/$kver/modules.dep" ] || skip "no /lib/modules/$kver/modules.dep"
}

# The accelerator: sets accel (qemu's -accel and -cpu arguments).
find_accel() {
  local want=${UEXT4_VM_ACCEL:-auto} hw=0
  grep -qwE 'vmx|svm' /proc/cpuinfo && hw=1
  if [ "$want" = kvm ] || { [ "$want" = auto ] && [ "$hw" = 1 ]; }; then
    [ -c /dev/kvm ] || skip "no /dev/kvm"
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || skip "/dev/kvm is not usable by $(id -un)"
    [ "$hw" = 1 ] || skip "/dev/kvm without vmx/svm (a PVM-style /dev/kvm runs only kernels built as its guests)"
    accel=(-accel kvm -cpu host)
  else
    accel=(-accel tcg,thread=single -cpu max)
  fi
}

check() {
  find_accel
  command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
  command -v cpio >/dev/null || skip "no cpio"
  command -v rustc >/dev/null || skip "no rustc (the guest helper is built with it)"
  busybox=""
  local b
  for b in /bin/busybox /usr/bin/busybox; do
    if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then
      busybox=$b
      break
    fi
  done
  [ -n "$busybox" ] || skip "no static busybox (apt-get install busybox-static)"
  find_kernel
}

# Prints the ELF kernel inside a bzImage: the first xz, zstd or gzip stream in it that
# unpacks to an ELF file. Booted directly (PVH entry), it skips the firmware's real-mode
# loader and the decompressor, which is most of a boot without KVM.
extract_vmlinux() {
  local img=$1 magic tool off
  for magic in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
    tool=${magic%%:*}
    for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$img" | cut -d: -f1 | head -5); do
      case $tool in
        xz) tail -c +$((off + 1)) "$img" | xz -dc --single-stream 2>/dev/null >"$cache/try" || true ;;
        zstd) tail -c +$((off + 1)) "$img" | zstd -qdc 2>/dev/null >"$cache/try" || true ;;
        gzip) tail -c +$((off + 1)) "$img" | gzip -dc 2>/dev/null >"$cache/try" || true ;;
      esac
      if [ "$(head -c 4 "$cache/try" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
        cat "$cache/try"
        rm -f "$cache/try"
        return 0
      fi
    done
  done
  rm -f "$cache/try"
  return 1
}

# Module names the guest loads (with what modules.dep says they need first).
WANT="ext4 virtio_blk virtio_pci crc32c_generic crc32c_intel quota_v1 quota_v2 xts cts ecb
  sha512_generic sha256_generic aesni_intel virtiofs"

# Prints, in load order, the modules.dep paths of $WANT and their dependencies.
module_order() {
  local dep="/lib/modules/$kver/modules.dep"
  awk -v want="$WANT" '
    function norm(p,   b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.[a-z]+)?$/, "", b); gsub(/-/, "_", b); return b }
    function add(m,   n, i, d) {
      if (m in done) return
      done[m] = 1
      n = split(deps[m], d, " ")
      for (i = n; i >= 1; i--) add(d[i])
      print m
    }
    {
      m = $1; sub(/:$/, "", m)
      deps[m] = ""
      for (i = 2; i <= NF; i++) deps[m] = deps[m] " " $i
      byname[norm(m)] = m
    }
    END {
      n = split(want, w, /[ \n]+/)
      for (i = 1; i <= n; i++) if (w[i] != "" && (w[i] in byname)) add(byname[w[i]])
    }' "$dep"
}

build() {
  local hash cache
  hash=$(cat "$self" "$helper_src" | sha256sum | cut -c1-12)
  cache="${UEXT4_VM_CACHE:-$root/target/kernel-vm}/$kver-$hash"
  initramfs="$cache/initramfs.cpio"
  vmlinux="$cache/vmlinux"
  [ -f "$initramfs" ] && [ -f "$vmlinux" ] && return
  mkdir -p "$cache"
  exec 9>"$cache.lock"
  flock 9
  if [ -f "$initramfs" ] && [ -f "$vmlinux" ]; then
    exec 9>&-
    return
  fi
  local tree="$cache/tree"
  rm -rf "$tree"
  mkdir -p "$tree"/{bin,sbin,dev,proc,sys,mnt,in,tmp,lib/modules}
  cp "$busybox" "$tree/bin/busybox"
  rustc -O -C target-feature=+crt-static -C strip=symbols "$helper_src" \
    -o "$tree/bin/uext4-vm-helper" 2>"$cache/rustc.log" ||
    { cat "$cache/rustc.log" >&2; echo "kernel-vm: the helper did not build" >&2; exit 1; }
  local m base
  : >"$tree/modules.list"
  for m in $(module_order); do
    base=${m##*/}
    case "$base" in
      *.ko) cp "/lib/modules/$kver/$m" "$tree/lib/modules/$base" ;;
      *.ko.xz) xz -dc "/lib/modules/$kver/$m" >"$tree/lib/modules/${base%.xz}" ;;
      *.ko.zst) zstd -qdc "/lib/modules/$kver/$m" >"$tree/lib/modules/${base%.zst}" ;;
      *.ko.gz) gzip -dc "/lib/modules/$kver/$m" >"$tree/lib/modules/${base%.gz}" ;;
      *) continue ;;
    esac
    echo "${base%.ko*}.ko" >>"$tree/modules.list"
  done
  grep -q '^ext4.ko$' "$tree/modules.list" ||
    grep -q '/ext4.ko' "/lib/modules/$kver/modules.builtin" ||
    { echo "kernel-vm: no ext4 module for $kver" >&2; exit 1; }
  cat >"$tree/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmp /tmp
exec </dev/null >/dev/ttyS0 2>&1
echo 1 >/proc/sys/kernel/printk
for m in $(cat /modules.list); do
  insmod "/lib/modules/$m" || echo "kernel-vm: insmod $m failed"
done
for t in ttyS1 ttyS2 ttyS3; do stty -F /dev/$t raw -echo; done
cd /
sh /run.sh >/dev/ttyS1 2>/dev/ttyS2
rc=$?
for m in $(grep ' /mnt' /proc/mounts | cut -d' ' -f2 | sort -r); do
  umount "$m" || echo "kernel-vm: umount $m failed" >/dev/ttyS2
done
sync
bad=$(dmesg | grep -E 'EXT4-fs (error|warning)|WARNING:|BUG:|Oops|Call Trace' || true)
if [ -n "$bad" ]; then
  echo "kernel-vm: the guest kernel complained:" >/dev/ttyS2
  echo "$bad" >/dev/ttyS2
  [ "$rc" = 0 ] && rc=3
fi
echo "$rc" >/dev/ttyS3
poweroff -f
INIT
  chmod +x "$tree/init"
  (cd "$tree" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$cache/tmp.cpio"
  mv "$cache/tmp.cpio" "$initramfs"
  extract_vmlinux "$vmlinuz" >"$cache/tmp.vmlinux" ||
    { echo "kernel-vm: no ELF kernel found inside $vmlinuz" >&2; exit 1; }
  mv "$cache/tmp.vmlinux" "$vmlinux"
  exec 9>&-
}

timeout_s=${UEXT4_VM_TIMEOUT:-60}
timeout_sig=TERM
mem=512
disks=()
files=()
vufs=()
script=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check; echo "kernel-vm: $vmlinuz"; exit 0 ;;
    --build) check; build; echo "$initramfs"; exit 0 ;;
    --disk) disks+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --vhost-user-fs) vufs+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --kill) timeout_sig=KILL; shift ;;
    --mem) mem=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "kernel-vm: unknown option $1" >&2; exit 2 ;;
    *) [ -z "$script" ] || { echo "kernel-vm: one script" >&2; exit 2; }; script=$1; shift ;;
  esac
done
[ -n "$script" ] || { echo "usage: scripts/kernel-vm.sh [--disk IMG]... [--file PATH]... SCRIPT" >&2; exit 2; }
check
build

run=$(mktemp -d "${TMPDIR:-/tmp}/uext4-vm.XXXXXX")
trap 'rm -rf "$run"' EXIT
mkdir -p "$run/extra/in"
cp "$script" "$run/extra/run.sh"
for f in "${files[@]}"; do
  cp "$f" "$run/extra/in/${f##*/}"
done
(cd "$run/extra" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$run/extra.cpio"
cat "$initramfs" "$run/extra.cpio" >"$run/initrd"
: >"$run/console" >"$run/out" >"$run/err" >"$run/rc"

drives=()
for d in "${disks[@]}"; do
  [ -f "$d" ] || { echo "kernel-vm: no image $d" >&2; exit 2; }
  drives+=(-drive "file=$d,format=raw,if=virtio,cache=unsafe")
done

shares=()
if [ ${#vufs[@]} -gt 0 ]; then
  qemu-system-x86_64 -device help 2>/dev/null | grep -q '"vhost-user-fs-pci"' ||
    skip "this qemu-system-x86_64 has no vhost-user-fs-pci device"
  # vhost-user maps the guest's memory in the back end: it must be a shared file.
  shares+=(-object "memory-backend-memfd,id=mem,size=${mem}M,share=on" -numa node,memdev=mem)
  i=0
  for v in "${vufs[@]}"; do
    sock=${v%:*}
    tag=${v##*:}
    [ "$sock" != "$v" ] && [ -n "$tag" ] || { echo "kernel-vm: --vhost-user-fs SOCKET:TAG, not $v" >&2; exit 2; }
    [ -S "$sock" ] || { echo "kernel-vm: no vhost-user socket $sock" >&2; exit 2; }
    shares+=(-chardev "socket,id=vufs$i,path=$sock" -device "vhost-user-fs-pci,chardev=vufs$i,tag=$tag")
    i=$((i + 1))
  done
fi

status=0
timeout -s "$timeout_sig" "$timeout_s" qemu-system-x86_64 "${accel[@]}" -smp 1 -m "$mem" \
  -nodefaults -nographic -no-reboot -monitor none \
  -kernel "$vmlinux" -initrd "$run/initrd" \
  -append "console=ttyS0 ${UEXT4_VM_APPEND:-quiet} panic=-1 rdinit=/init mitigations=off" \
  -serial "file:$run/console" -serial "file:$run/out" -serial "file:$run/err" \
  -serial "file:$run/rc" \
  "${drives[@]}" "${shares[@]}" </dev/null >"$run/qemu.log" 2>&1 || status=$?

cat "$run/out"
cat "$run/err" >&2
rc=$(tr -dc '0-9' <"$run/rc")
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "kernel-vm: timed out after ${timeout_s}s" >&2
  rc=124
elif [ -z "$rc" ]; then
  echo "kernel-vm: the VM ended without a status (qemu exit $status)" >&2
  cat "$run/qemu.log" >&2
  rc=125
fi
if [ "$rc" -ge 124 ] || [ "${UEXT4_VM_CONSOLE:-0}" = 1 ]; then
  echo "--- guest console ---" >&2
  cat "$run/console" >&2
fi
exit "$rc"
