#!/usr/bin/env bash
# Big reads beside the store's thread (issue 18 item 3): a file read cold through a mount
# from a server that reads on its store's thread (`--reads-elsewhere-from 0`, "here") and
# from one that copies and checks big reads on other threads (the default, "elsewhere"),
# with the local disk as the floor. Every round, for each target: unmount, drop caches,
# mount, `cat` the file; the store thread's CPU (/proc/PID/task) is read around the cat.
# Prints, per target, the medians over the rounds of the time, MiB/s, that rate against
# the local disk's in the same round, and the store thread's CPU per GiB read (ms) against
# "here"'s.
#
#   bench/reads.sh [--size-mib N] [--rounds N] [--io-threads N]
#     --size-mib N    the file (default 2048)
#     --rounds N      rounds (default 3)
#     --io-threads N  both servers' connection threads (crest serve --io-threads)
# Needs root (mounts, drop_caches). Logs: /var/tmp/crest-reads-logs.
# shellcheck source=bench/lib.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

size_mib=2048; rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --size-mib) size_mib=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --io-threads) BENCH_IO_THREADS=$2; shift ;;
    -h | --help) sed -n '2,/^# shellcheck/{/^# shellcheck/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "reads: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $size_mib =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]] || { echo "reads: want positive numbers" >&2; exit 2; }

bench_init reads
declare -A SERVER_PID=() SECS=() CPU=()
targets="local here elsewhere"
mnt() { echo "$BENCH_BASE/mnt/$1"; }
mount_target() { mkdir -p "$(mnt "$1")"; bench_fg "$BENCH_BIN/crest" mount --insecure -o own_session "127.0.0.1:${BENCH_PORT[$1]}" "$(mnt "$1")" >/dev/null; BENCH_MOUNTS+=("$(mnt "$1")"); }
file_of() { if [ "$1" = local ]; then echo "$BENCH_BASE/local/big"; else echo "$(mnt "$1")/big"; fi; }
# The store thread's CPU seconds (0 for the local disk).
store_cpu() {
  if [ "$1" = local ]; then echo 0; else bench_thread_cpu "${SERVER_PID[$1]}" | awk '$1 == "crest-server" { print $2 }'; fi
}

bench_crest_server here --insecure --reads-elsewhere-from 0
SERVER_PID[here]=$BENCH_LAST_PID
bench_crest_server elsewhere --insecure
SERVER_PID[elsewhere]=$BENCH_LAST_PID
mkdir -p "$BENCH_BASE/local"
head -c $((size_mib << 20)) /dev/urandom >"$BENCH_BASE/src.bin"
for t in $targets; do
  [ "$t" = local ] || mount_target "$t"
  cp "$BENCH_BASE/src.bin" "$(file_of "$t")"
done
sync
for ((n = 1; n <= rounds; n++)); do
  for t in $targets; do
    if [ "$t" != local ]; then bench_fg "$BENCH_BIN/crest" umount "$(mnt "$t")"; fi
    bench_drop
    [ "$t" = local ] || mount_target "$t"
    c0=$(store_cpu "$t")
    t0=$(date +%s.%N)
    cat "$(file_of "$t")" >/dev/null
    t1=$(date +%s.%N)
    c1=$(store_cpu "$t")
    SECS[$t@$n]=$(echo "$t1 - $t0" | bc -l)
    CPU[$t@$n]=$(echo "($c1 - $c0) * 1000 * 1024 / $size_mib" | bc -l)
  done
done
for t in here elsewhere; do
  cmp -s "$BENCH_BASE/src.bin" "$(file_of "$t")" || { echo "reads: $t read other bytes" >&2; exit 1; }
done

echo "reads: a ${size_mib} MiB file read cold, ${rounds} rounds, io-threads ${BENCH_IO_THREADS:-default}"
printf '%-10s %8s %9s %9s %20s %11s\n' target secs MiB/s "x local" "store thread ms/GiB" "x here"
for t in $targets; do
  secs=() rates=() vs_local=() cpus=() vs_here=()
  for ((n = 1; n <= rounds; n++)); do
    secs+=("${SECS[$t@$n]}")
    rates+=("$(echo "$size_mib / ${SECS[$t@$n]}" | bc -l)")
    vs_local+=("$(bench_ratio "${SECS[local@$n]}" "${SECS[$t@$n]}")")
    if [ "$t" != local ]; then
      cpus+=("${CPU[$t@$n]}")
      vs_here+=("$(bench_ratio "${CPU[$t@$n]}" "${CPU[here@$n]}")")
    fi
  done
  printf '%-10s %8s %9.0f %9s %20s %11s\n' "$t" "$(bench_median "${secs[@]}")" "$(bench_median "${rates[@]}")" \
    "$(bench_median "${vs_local[@]}")" "$(if [ "$t" = local ]; then echo -; else printf '%.0f' "$(bench_median "${cpus[@]}")"; fi)" \
    "$(if [ "$t" = local ]; then echo -; else bench_median "${vs_here[@]}"; fi)"
done
