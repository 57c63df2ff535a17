#!/usr/bin/env bash
# The untar workload on crest, the local file system and a local FUSE passthrough (bindfs)
# in one run: untar the kernel subset, read every file back cold (after unmount/remount and
# dropping the page cache), rm -rf. Prints real/user/sys per phase and ratios against
# bindfs and the local file system. (bench/headline.sh runs this and more on more targets.)
#   bench/untar.sh [TAR]   (default: the ~20K-file kernel subset from kernel-tars.sh)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
tarball=$(realpath -m "${1:-/dev/shm/crest-bench/linux-6.1-small.tar}")
bench_tar "$tarball"
bench_init untar
bench_crest_server crest
BENCH_ADDR[crest]=127.0.0.1:${BENCH_PORT[crest]}

targets="local bindfs crest"
for t in $targets; do
  bench_mount "$t"; d=$(bench_dir "$t")
  bench_drop
  bench_time "untar $t" "tar -xf '$tarball' -C '$d' && sync -f '$d'"
  bench_cold "$t"
  bench_time "read $t" "cd '$d' && find . -type f -print0 | xargs -0 cat >/dev/null"
  bench_time "rm $t" "rm -rf '$d'/* && sync -f '$d'"
  bench_umount "$t"
done
printf '\n%s, %s\n' "$(basename "$tarball")" "$(date -u +%F)"
bench_table "untar read rm" "$targets"
[ "$BENCH_FAILED" = 0 ]
