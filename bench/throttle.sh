#!/usr/bin/env bash
# bench/throttle.sh RATE PATH CMD [ARGS...] - run CMD with reads from the block
# device that holds PATH limited to RATE bytes/s (suffix K, M or G: powers of
# 1000), by a cgroup of its own (v2 io.max, else v1 blkio.throttle); needs root.
#
# Why: "fraction of the I/O bound" needs the device's bandwidth, and a virtual
# disk's moves 1.0-2.8 GB/s between repetitions of the same read (the host's
# cache and neighbours), so a fraction measured against it says more about the
# host than about the engine. Under a throttle below what the device sustains,
# the bandwidth is a known constant (bench_io reads at RATE +-3 % at any block
# size and depth), like an SSD of that speed, and the engine's fraction of the
# bound is measurable. The limit counts every read the kernel sends to the
# device, O_DIRECT and buffered (page-cache misses, readahead) alike; cached
# pages are not reads and are not limited. Prints "throttle: ..." to stderr.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bench/throttle.sh RATE PATH CMD [ARGS...]" >&2; exit 2; }
rate=$1 path=$2; shift 2
case $rate in
*[Gg]) bps=$((${rate%?} * 1000000000)) ;;
*[Mm]) bps=$((${rate%?} * 1000000)) ;;
*[Kk]) bps=$((${rate%?} * 1000)) ;;
*[!0-9]* | '') echo "throttle: bad rate '$rate'" >&2; exit 2 ;;
*) bps=$rate ;;
esac
[ -e "$path" ] || { echo "throttle: $path: no such file or directory" >&2; exit 2; }
# the whole disk: the throttle works on a disk's queue, not on a partition
dev=$(stat -L -c '%Hd:%Ld' "$path")
[ -f "/sys/dev/block/$dev/partition" ] && dev=$(cat "/sys/dev/block/$dev/../dev")
[ -e "/sys/dev/block/$dev" ] || { echo "throttle: $path is not on a block device ($dev)" >&2; exit 2; }

if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
    root=/sys/fs/cgroup
    grep -qw io "$root/cgroup.subtree_control" || echo +io >"$root/cgroup.subtree_control"
    cg=$root/deltafin-throttle-$$
    mkdir "$cg"
    echo "$dev rbps=$bps" >"$cg/io.max"
elif [ -d /sys/fs/cgroup/blkio ]; then
    cg=/sys/fs/cgroup/blkio/deltafin-throttle-$$
    mkdir "$cg"
    echo "$dev $bps" >"$cg/blkio.throttle.read_bps_device"
else
    echo "throttle: no cgroup io controller (v2 io or v1 blkio) mounted" >&2
    exit 1
fi
# the group goes when the command has ended (a group with no tasks can be removed)
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo "throttle: reads of $dev ($(basename "$(readlink -f "/sys/dev/block/$dev")")) at most $bps B/s" >&2
bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' throttle "$cg" "$@"
