#!/bin/bash
# Runs a command with its reads from one block device capped, to stand in for a slower disk.
#
#   perf/read_cap.sh BYTES_PER_SECOND PATH -- COMMAND [ARG...]
#
# PATH is any file or folder on the device to cap (the checkpoint, a packed trunk); the cap applies
# to the whole disk under it, to COMMAND and every process it starts, and to O_DIRECT reads from
# io_uring as well as buffered ones (the kernel's block throttle counts the bios themselves).
# Checked on a plain virtio disk; under LVM, RAID or dm-crypt the cap goes on the disk below the
# volume, where the throttle may not see the volume's reads -- check with `k3flow probe` under it.
# Needs root and a cgroup hierarchy with the block-I/O controller: cgroup v1's blkio
# (blkio.throttle.read_bps_device) or cgroup v2's io (io.max rbps=). The cgroup, k3flow-read-cap,
# is left in place and rewritten by the next run; `rmdir` it when no process is in it any more.
# Exit codes: 2 for a bad argument or a host that cannot cap reads, else COMMAND's own.
set -euo pipefail

die() { echo "read_cap.sh: $*" >&2; exit 2; }
if [ $# -lt 4 ] || [ "$3" != "--" ]; then
  die "usage: perf/read_cap.sh BYTES_PER_SECOND PATH -- COMMAND [ARG...]"
fi
BPS=$1
TARGET=$2
shift 3
[[ $BPS =~ ^[1-9][0-9]*$ ]] || die "BYTES_PER_SECOND must be a positive whole number of bytes, got '$BPS'"
[ -e "$TARGET" ] || die "no such file or folder: $TARGET"
[ "$(id -u)" = 0 ] || die "capping reads needs root (a cgroup's block throttle)"

# The whole disk under TARGET: the block throttle takes a disk's major:minor, not a partition's.
source_dev=$(findmnt -no SOURCE --target "$TARGET" 2>/dev/null | head -1) || true
[ -b "$source_dev" ] || die "$TARGET is not on a block device (its mount source is '${source_dev:-none}')"
disk=$(lsblk -no PKNAME "$source_dev" 2>/dev/null | head -1 | tr -d ' ')
[ -n "$disk" ] || disk=$(basename "$source_dev")
majmin=$(lsblk -dno MAJ:MIN "/dev/$disk" 2>/dev/null | tr -d ' ')
[[ $majmin =~ ^[0-9]+:[0-9]+$ ]] || die "could not find the major:minor of /dev/$disk under $TARGET"

if [ -f /sys/fs/cgroup/blkio/cgroup.procs ]; then  # cgroup v1
  cg=/sys/fs/cgroup/blkio/k3flow-read-cap
  mkdir -p "$cg" || die "cannot create $cg"
  echo "$majmin $BPS" > "$cg/blkio.throttle.read_bps_device" || die "cannot write $cg/blkio.throttle.read_bps_device"
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2
  grep -qw io /sys/fs/cgroup/cgroup.controllers || die "the cgroup v2 hierarchy has no io controller"
  grep -qw io /sys/fs/cgroup/cgroup.subtree_control \
    || echo +io > /sys/fs/cgroup/cgroup.subtree_control || die "cannot enable the io controller"
  cg=/sys/fs/cgroup/k3flow-read-cap
  mkdir -p "$cg" || die "cannot create $cg"
  echo "$majmin rbps=$BPS" > "$cg/io.max" || die "cannot write $cg/io.max"
else
  die "no cgroup block-I/O controller mounted under /sys/fs/cgroup"
fi
echo $$ > "$cg/cgroup.procs" || die "cannot move into $cg"
exec "$@"
