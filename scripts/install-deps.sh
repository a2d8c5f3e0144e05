#!/usr/bin/env bash
# Installs what the tests and the demo need, when missing: e2fsprogs (mke2fs, e2fsck, debugfs),
# fuse3, fio, xfsprogs (xfs_io), attr, acl and capability tools, fuse2fs (the peer in benchmarks),
# fuse-overlayfs (the overlay users run over fuse2fs today, in scripts/bench-overlay.sh),
# gdisk and fdisk (sgdisk and sfdisk make the partitioned disks of the partition tests), nbdkit
# and qemu-utils (the NBD servers of the NBD backend's tests: nbdkit, qemu-nbd, qemu-img),
# linux-image-amd64, qemu-system-x86 and busybox-static (the kernel VM of scripts/kernel-vm.sh,
# an oracle with CONFIG_UNICODE and fs-verity where the host kernel has neither; installed
# without recommends), the Sleuth Kit (fls, ils: the examiner tests' oracle beside debugfs),
# fsverity (fsverity-utils: `fsverity digest`, the oracle of the verity tests), man-db (`man -l`
# renders the installed man pages in the packaging test), zsh and fish (the packaging test
# loads their completions), git, make, gcc and python3-venv (the tools the real-tools
# benchmark family runs, `uext4 bench --family tools`), and pjdfstest
# (through cargo). Safe to run again; does nothing when all is present.
set -euo pipefail

need=()
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v fusermount3 >/dev/null || need+=(fuse3)
[ -e /usr/include/fuse3/fuse.h ] || need+=(libfuse3-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v fio >/dev/null || need+=(fio)
command -v xfs_io >/dev/null || need+=(xfsprogs)
command -v getfattr >/dev/null || need+=(attr)
command -v getfacl >/dev/null || need+=(acl)
command -v setcap >/dev/null || need+=(libcap2-bin)
command -v fuse2fs >/dev/null || need+=(fuse2fs)
command -v fuse-overlayfs >/dev/null || need+=(fuse-overlayfs)
command -v sgdisk >/dev/null || need+=(gdisk)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v nbdkit >/dev/null || need+=(nbdkit)
command -v qemu-nbd >/dev/null || need+=(qemu-utils)
command -v fls >/dev/null || need+=(sleuthkit)
command -v extundelete >/dev/null || need+=(extundelete)
vm_need=()
command -v qemu-system-x86_64 >/dev/null || vm_need+=(qemu-system-x86)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || vm_need+=(busybox-static)
grep -qx 'CONFIG_UNICODE=y' /boot/config-* 2>/dev/null || vm_need+=(linux-image-amd64)
command -v fsverity >/dev/null || need+=(fsverity)
command -v man >/dev/null || need+=(man-db)
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
command -v git >/dev/null || need+=(git)
command -v make >/dev/null || need+=(make)
command -v cc >/dev/null || need+=(gcc)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing packages (install them, or run as root with apt-get): ${need[*]}" >&2
  fi
fi

if [ ${#vm_need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "installing: ${vm_need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${vm_need[@]}" >/dev/null
  else
    echo "missing packages (the kernel VM's; install them, or run as root): ${vm_need[*]}" >&2
  fi
fi

if ! command -v pjdfstest >/dev/null && [ "${UEXT4_SKIP_PJDFSTEST:-0}" != 1 ]; then
  echo "installing pjdfstest (cargo install pjdfstest)"
  cargo install --locked pjdfstest >/dev/null 2>&1 || cargo install pjdfstest >/dev/null 2>&1 || \
    echo "could not install pjdfstest; the POSIX suite will be skipped" >&2
fi

# maturin (the Python package's build backend, crates/uext4-py) and pytest (its tests), from
# PyPI into the interpreter that runs scripts/python.sh; the tests themselves download nothing.
py=${PYTHON:-python3}
if command -v "$py" >/dev/null && "$py" -m pip --version >/dev/null 2>&1; then
  if ! "$py" -m maturin --version >/dev/null 2>&1 || ! "$py" -m pytest --version >/dev/null 2>&1; then
    echo "installing maturin and pytest (pip)"
    "$py" -m pip install -q 'maturin>=1.4,<2' pytest || \
      echo "could not install maturin and pytest; the Python package's tests will be skipped" >&2
  fi
fi
