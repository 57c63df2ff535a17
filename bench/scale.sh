#!/usr/bin/env bash
# Many mounts of one server on this host (issue 18, SPEC §4 "Many clients"): how creates
# scale with the number of mounts. Each mount stands for a client machine: its own `crest
# mount -o own_session` (its own session and connection; without it mounts of one host
# share one). For each count of mounts, every round:
#   siblings  each mount creates --count files in a directory of its own, all of them
#             siblings under one parent (made by mount 1 before the clock starts);
#   subtrees  the same, each directory two levels down a top-level directory of its own;
#   shared    every mount creates --count files in one directory (names prefixed by the
#             mount), then every mount unlinks its own.
# Each phase ends with a syncfs per mount (`crest-metabench --sync`). Prints, per count of
# mounts, the medians over the rounds of: the aggregate rate (files of all mounts over the
# time until the last mount finished), that rate over one mount's in the same round, and
# the slowest mount's time over the fastest's (fairness).
#
#   bench/scale.sh [--mounts 1,2,4,8] [--count N] [--rounds N] [--insecure] [--io-threads N]
#                  [--one-session]
#     --mounts L  counts of mounts (default 1,2,4,8; 1 is always run: the ratios need it)
#     --count N   files per mount per phase (default 5000)
#     --rounds N  rounds (default 3)
#     --insecure  plaintext (default: mutual TLS, as a mount on the server's host)
#     --io-threads N  the server's connection threads (crest serve --io-threads)
#     --one-session   the mounts as one host makes them by default: bind mounts of the
#                 first, one session (docs/operations.md "Many mounts on one host")
# Needs root (mounts). Logs: /var/tmp/crest-scale-logs.
# shellcheck source=bench/lib.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mounts_list=1,2,4,8; count=5000; rounds=3; insecure=(); own=(-o own_session)
while [ $# -gt 0 ]; do
  case $1 in
    --mounts) mounts_list=$2; shift ;;
    --count) count=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --insecure) insecure=(--insecure) ;;
    --io-threads) BENCH_IO_THREADS=$2; shift ;;
    --one-session) own=() ;;
    -h | --help) sed -n '2,/^# Needs/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scale: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in "$count" "$rounds"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "scale: --count and --rounds want positive numbers" >&2; exit 2; }
done
counts=1
for n in ${mounts_list//,/ }; do
  [[ $n =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || { echo "scale: --mounts wants counts 1-64" >&2; exit 2; }
  [ "$n" = 1 ] || counts+=" $n"
done
max=0; for n in $counts; do [ "$n" -gt "$max" ] && max=$n; done

bench_init scale
bench_crest_server crest "${insecure[@]}"
server_pid=$BENCH_LAST_PID
addr=127.0.0.1:${BENCH_PORT[crest]}
mnt=()
for ((i = 1; i <= max; i++)); do
  d=$BENCH_BASE/mnt/m$i
  mkdir -p "$d"
  bench_fg "$BENCH_BIN/crest" mount "${insecure[@]}" "${own[@]}" "$addr" "$d" >/dev/null
  BENCH_MOUNTS+=("$d")
  mnt[i]=$d
done
meta=$BENCH_BIN/crest-metabench

declare -A AGG=() SPREAD=()   # "phase n round" → files/s of all mounts; slowest / fastest

# run_phase PHASE N ROUND DIR_OF_MOUNT PREFIX_OF_MOUNT METABENCH_PHASE: starts mount i's
# metabench in its directory for i in 1..N at once, waits for all, records the aggregate
# rate and the spread. DIR_OF_MOUNT and PREFIX_OF_MOUNT are functions of i.
run_phase() {
  local phase=$1 n=$2 r=$3 dir_of=$4 prefix_of=$5 mphase=$6 i start end pids=() secs
  start=$(date +%s.%N)
  for ((i = 1; i <= n; i++)); do
    "$meta" "$($dir_of "$i")" --count "$count" --phase "$mphase" --sync --prefix "$($prefix_of "$i")" \
      >"$BENCH_LOGS/$phase-$n-$r-m$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || { echo "scale: $phase with $n mounts, mount $((i + 1)) failed:" >&2
      tail -3 "$BENCH_LOGS/$phase-$n-$r-m$((i + 1)).log" >&2; exit 1; }
  done
  end=$(date +%s.%N)
  AGG[$phase $n $r]=$(echo "$n * $count / ($end - $start)" | bc -l)
  secs=$(cat "$BENCH_LOGS/$phase-$n-$r-m"*.log | sed -n 's/.* secs=\([0-9.]*\).*/\1/p' | sort -g)
  SPREAD[$phase $n $r]=$(echo "$(tail -1 <<<"$secs") / $(head -1 <<<"$secs")" | bc -l)
}

no_prefix() { echo ""; }
mount_prefix() { echo "m$1-"; }
for ((r = 1; r <= rounds; r++)); do
  for n in $counts; do
    echo "scale: [${SECONDS}s] round $r/$rounds: $n mount(s)" >&2
    base=${mnt[1]}/r$r-n$n
    mkdir -p "$base/sib" "$base/shared"
    for ((i = 1; i <= n; i++)); do mkdir -p "$base/sib/d$i" "${mnt[1]}/r$r-n$n-t$i/a/b"; done
    sync -f "${mnt[1]}"
    sib_dir() { echo "${mnt[$1]}/r$r-n$n/sib/d$1"; }
    sub_dir() { echo "${mnt[$1]}/r$r-n$n-t$1/a/b"; }
    shared_dir() { echo "${mnt[$1]}/r$r-n$n/shared"; }
    run_phase siblings "$n" "$r" sib_dir no_prefix create
    run_phase subtrees "$n" "$r" sub_dir no_prefix create
    run_phase shared "$n" "$r" shared_dir mount_prefix create
    run_phase shared-unlink "$n" "$r" shared_dir mount_prefix unlink
  done
done

# median KEY_PREFIX SUFFIX_ARRAY: the median over the rounds of ARRAY["KEY_PREFIX r"].
median_of() {
  local -n arr=$1
  local key=$2 r
  for ((r = 1; r <= rounds; r++)); do echo "${arr[$key $r]}"; done | sort -g |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
declare -A REL=()
for ((r = 1; r <= rounds; r++)); do
  for phase in siblings subtrees shared shared-unlink; do
    for n in $counts; do
      REL[$phase $n $r]=$(echo "${AGG[$phase $n $r]} / ${AGG[$phase 1 $r]}" | bc -l)
    done
  done
done
printf '\n%s files per mount per phase, %s round(s), %s, %s; medians over the rounds\n' "$count" "$rounds" \
  "$([ ${#insecure[@]} = 0 ] && echo "mutual TLS" || echo "--insecure")" \
  "$([ ${#own[@]} = 0 ] && echo "one session (bind mounts)" || echo "a session per mount")"
printf '%-14s %6s %12s %12s %16s\n' phase mounts "files/s" "x 1 mount" "slowest/fastest"
for phase in siblings subtrees shared shared-unlink; do
  for n in $counts; do
    printf '%-14s %6s %12.0f %12.2f %16.2f\n' "$phase" "$n" "$(median_of AGG "$phase $n")" \
      "$(median_of REL "$phase $n")" "$(median_of SPREAD "$phase $n")"
  done
done
# What the server's threads did over the whole run: the store's thread ("crest-server") is
# what stays serial; the connections' ("crest-io", with --io-threads) run beside it.
printf '\nserver CPU over the run (%s s of wall time), seconds by thread:\n' "$SECONDS"
bench_thread_cpu "$server_pid" | awk '{ printf "  %-16s %8s\n", $1, $2 }'
