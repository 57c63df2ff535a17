#!/usr/bin/env bash
# File data on an object store (issue 19 item 6): the same workloads on a server of an
# image-backed file system ("image") and of one made with `crest mkfs --data` ("objects",
# on the one-node Ceph of scripts/object-store.sh), in the same run:
#   - a big file written with cp (+ sync) and read cold with cat, through one mount each:
#     seconds, MiB/s, and the server process's CPU (every thread) per GiB moved; the
#     removal of the last round's file (and, for objects, the collector's deletes, waited
#     for before the write) counted apart;
#   - the data store's own speed through the same HTTP client (crest-objbench: objects of
#     the mount's size, one at a time, as cp writes them; and as many at once as the
#     kernel's readahead asks, for reads), what the mount's rate is held against;
#   - untar of the kernel subset (+ sync): small files stay in the image.
# Prints medians over the rounds and the ratios the issue sets (objects / image CPU, the
# store's own / the mount's rate, objects / image untar).
#
#   bench/objects.sh [--size-mib N] [--rounds N] [--tar small|smoke|none]
#     --size-mib N   the big file (default 1024)
#     --rounds N     rounds (default 3)
#     --tar T        the kernel subset (small, default), ~200 of its files (smoke), none
# Needs root (mounts, drop_caches). Logs: /var/tmp/crest-objects-logs.
# shellcheck source=bench/lib.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

size_mib=1024; rounds=3; tar=small
while [ $# -gt 0 ]; do
  case $1 in
    --size-mib) size_mib=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --tar) tar=$2; shift ;;
    -h | --help) sed -n '2,/^# shellcheck/{/^# shellcheck/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "objects: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $size_mib =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ && $tar =~ ^(small|smoke|none)$ ]] ||
  { echo "objects: bad arguments (see --help)" >&2; exit 2; }

bench_init objects
eval "$(bash scripts/object-store.sh start)"
data_url=$CREST_DATA_URL/bench-$$
targets="image objects"
declare -A PID=() W=() WCPU=() R=() RCPU=() U=() D=()
mnt() { echo "$BENCH_BASE/mnt/$1"; }
mount_target() {
  mkdir -p "$(mnt "$1")"
  bench_fg "$BENCH_BIN/crest" mount --insecure -o own_session "127.0.0.1:${BENCH_PORT[$1]}" "$(mnt "$1")" >/dev/null
  BENCH_MOUNTS+=("$(mnt "$1")")
}
# CPU seconds of the whole server process.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); split($0, f, " "); printf "%.3f\n", (f[12] + f[13]) / hz }' "/proc/${PID[$1]}/stat"; }
now() { date +%s.%N; }

bench_crest_server image --insecure
PID[image]=$BENCH_LAST_PID
BENCH_MKFS_ARGS=(--data "$data_url")
bench_crest_server objects --insecure
BENCH_MKFS_ARGS=()
PID[objects]=$BENCH_LAST_PID
head -c $((size_mib << 20)) /dev/urandom >"$BENCH_BASE/src.bin"
for t in $targets; do mount_target "$t"; done
# The objects of the image still in the bucket.
in_bucket() { CREST_DATA_URL=$data_url "$BENCH_BIN/crest-objbench" --count-objects; }
for ((n = 1; n <= rounds; n++)); do
  for t in $targets; do
    f=$(mnt "$t")/big
    # The last round's file removed: what that costs the server (for objects, until the
    # collector has deleted them all) is counted apart from the write.
    c0=$(cpu "$t")
    rm -f "$f"; sync -f "$(mnt "$t")"
    if [ "$t" = objects ] && [ "$n" -gt 1 ]; then
      for _ in $(seq 120); do [ "$(in_bucket)" = 0 ] && break; sleep 0.5; done
    fi
    c1=$(cpu "$t")
    [ "$n" = 1 ] || D[$t@$n]=$(echo "($c1 - $c0) * 1000 * 1024 / $size_mib" | bc -l)
    c0=$(cpu "$t") t0=$(now)
    cp "$BENCH_BASE/src.bin" "$f"; sync -f "$f"
    t1=$(now) c1=$(cpu "$t")
    W[$t@$n]=$(echo "$t1 - $t0" | bc -l) WCPU[$t@$n]=$(echo "($c1 - $c0) * 1000 * 1024 / $size_mib" | bc -l)
    bench_fg "$BENCH_BIN/crest" umount "$(mnt "$t")"; bench_drop; mount_target "$t"
    c0=$(cpu "$t") t0=$(now)
    cat "$f" >/dev/null
    t1=$(now) c1=$(cpu "$t")
    R[$t@$n]=$(echo "$t1 - $t0" | bc -l) RCPU[$t@$n]=$(echo "($c1 - $c0) * 1000 * 1024 / $size_mib" | bc -l)
  done
done
for t in $targets; do
  cmp -s "$BENCH_BASE/src.bin" "$(mnt "$t")/big" || { echo "objects: $t read other bytes" >&2; exit 1; }
done
# The store's own, through the same client: 1 MiB objects, one at a time (as cp's writes
# come) and four at a time (about what the kernel's readahead keeps in flight).
count=$((size_mib < 256 ? size_mib : 256))
own1=$(CREST_DATA_URL=$data_url-own "$BENCH_BIN/crest-objbench" --size 1048576 --count "$count" --parallel 1)
own4=$(CREST_DATA_URL=$data_url-own "$BENCH_BIN/crest-objbench" --size 1048576 --count "$count" --parallel 4)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

if [ "$tar" != none ]; then
  src=/dev/shm/crest-bench/linux-6.1-small.tar
  bench_tar "$src"
  if [ "$tar" = smoke ]; then bench_small_tar "$src" "$BENCH_BASE/smoke.tar"; src=$BENCH_BASE/smoke.tar; fi
  for ((n = 1; n <= rounds; n++)); do
    for t in $targets; do
      d=$(mnt "$t")/tree$n
      t0=$(now)
      mkdir "$d" && tar -xf "$src" -C "$d" && sync -f "$d"
      t1=$(now)
      U[$t@$n]=$(echo "$t1 - $t0" | bc -l)
    done
  done
fi

med() { bench_median "$@"; }
echo "objects: a ${size_mib} MiB file written (cp + sync) and read cold (cat), ${rounds} rounds; server CPU is the whole process's"
printf '%-8s %9s %10s %15s %9s %10s %15s %10s\n' target "write s" "write MiB/s" "CPU ms/GiB wr" "read s" "read MiB/s" "CPU ms/GiB rd" "untar s"
for t in $targets; do
  ws=() wc=() rs=() rc=() us=()
  for ((n = 1; n <= rounds; n++)); do
    ws+=("${W[$t@$n]}") wc+=("${WCPU[$t@$n]}") rs+=("${R[$t@$n]}") rc+=("${RCPU[$t@$n]}")
    [ "$tar" = none ] || us+=("${U[$t@$n]}")
  done
  printf '%-8s %9.2f %10.0f %15.0f %9.2f %10.0f %15.0f %10s\n' "$t" "$(med "${ws[@]}")" "$(echo "$size_mib / $(med "${ws[@]}")" | bc -l)" \
    "$(med "${wc[@]}")" "$(med "${rs[@]}")" "$(echo "$size_mib / $(med "${rs[@]}")" | bc -l)" "$(med "${rc[@]}")" \
    "$(if [ "$tar" = none ]; then echo -; else printf '%.2f' "$(med "${us[@]}")"; fi)"
done
if [ "$rounds" -gt 1 ]; then
  for t in $targets; do
    ds=(); for ((n = 2; n <= rounds; n++)); do ds+=("${D[$t@$n]}"); done
    printf '%-8s server CPU per GiB removed (rm; for objects, until the collector deleted them): %.0f ms\n' "$t" "$(med "${ds[@]}")"
  done
fi
ratios() { # NAME ARRAY_A ARRAY_B: the median over rounds of A/B
  local -n a=$2 b=$3; local r=()
  for ((n = 1; n <= rounds; n++)); do r+=("$(bench_ratio "${a[objects@$n]}" "${b[image@$n]}")"); done
  printf '  %-44s %s\n' "$1" "$(med "${r[@]}")"
}
echo "ratios (medians over rounds; issue 19 asks: CPU <= 0.20, throughput <= 1.5, untar <= 1.3)"
ratios "server CPU per GiB written, objects / image" WCPU WCPU
ratios "server CPU per GiB read, objects / image" RCPU RCPU
[ "$tar" = none ] || ratios "untar time, objects / image" U U
obj_w=$(echo "$size_mib / $(med $(for ((n = 1; n <= rounds; n++)); do echo "${W[objects@$n]}"; done))" | bc -l)
obj_r=$(echo "$size_mib / $(med $(for ((n = 1; n <= rounds; n++)); do echo "${R[objects@$n]}"; done))" | bc -l)
printf '  %-44s %.2f (store %s MiB/s, mount %.0f)\n' "store's own PUT rate / the mount's write rate" \
  "$(echo "$(field "$own1" put_mib_s) / $obj_w" | bc -l)" "$(field "$own1" put_mib_s)" "$obj_w"
printf '  %-44s %.2f (store %s MiB/s, mount %.0f)\n' "store's own GET rate (4 at once) / mount's read" \
  "$(echo "$(field "$own4" get_mib_s) / $obj_r" | bc -l)" "$(field "$own4" get_mib_s)" "$obj_r"
echo "store's own, 1 MiB objects: one at a time $own1; four at a time $own4"
