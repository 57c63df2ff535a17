#!/usr/bin/env bash
# Small O_APPEND writes (fstests generic/069's pattern, a log written a few bytes per call):
# N appends of B bytes each from one mount (dd oflag=append), on the local file system, a
# local FUSE passthrough (bindfs) and crest, in one run, then the file compared with the
# local one. Prints real/user/sys and ratios against bindfs and the local disk.
#   bench/append.sh [N] [B]   (default 200000 appends of 4 bytes)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
n=${1:-200000} bytes=${2:-4}
bench_init append
bench_crest_server crest
BENCH_ADDR[crest]=127.0.0.1:${BENCH_PORT[crest]}

targets="local bindfs crest"
for t in $targets; do
  bench_mount "$t"; d=$(bench_dir "$t")
  : >"$d/log"
  bench_time "append $t" "dd if=/dev/zero of='$d/log' bs=$bytes count=$n oflag=append conv=notrunc status=none"
  size=$(stat -c %s "$d/log")
  [ "$size" = $((n * bytes)) ] || { echo "append $t: $size bytes, not $((n * bytes))" >&2; BENCH_FAILED=1; }
  rm -f "$d/log"
  bench_umount "$t"
done
printf '\n%s appends of %s bytes, %s\n' "$n" "$bytes" "$(date -u +%F)"
bench_table "append" "$targets"
[ "$BENCH_FAILED" = 0 ]
