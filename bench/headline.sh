#!/usr/bin/env bash
# The headline benchmark (issue 4, SPEC §5) in one run, on seven targets:
#   local      a directory on the scratch disk file system (CREST_BENCH_DIR, default /var/tmp)
#   bindfs     bindfs over a directory of it: the local FUSE floor (ratios are against this)
#   sshfs      sshfs to an sshd on loopback          sshfs-rtt  the same through the delay proxy
#   crest      crest on loopback (mutual TLS)        crest-rtt  the same through the delay proxy
#   crest-insecure  crest on loopback with --insecure: what TLS costs
# Workload per target: untar the kernel tar (+ sync -f), read every file back cold
# (unmount/remount and drop caches first), rm -rf (+ sync -f), then in one directory N
# creates (+ syncfs), N stats (cold) and N unlinks (cold, + syncfs) with crest-metabench;
# 1,000 durable 4 KiB writes (crest bench), a 2 GiB file written (to durable) and read cold.
# Then round trips: a raw TCP ping-pong (4 B, 64 B, 1 KiB) against crest requests (getattr;
# writes carrying 4 B, 64 B, 1 KiB) on loopback and through the delay proxy.
# The delay proxy (crest-delay-proxy) adds half of --rtt-us to each direction of crest's and
# sshfs's connections alike. Prints real/user/sys seconds (of the workload's own processes)
# and ratios computed from the times measured in this run. Exits 1 if a measurement failed,
# except sshfs's own errors (tar's utime/chown of symlinks and "directory renamed" through
# sshfs), which are reported as results.
#
#   bench/headline.sh [--full] [--quick] [--rounds N] [--rtt-us N] [--only T1,T2,...] [--count N] [--tar PATH]
#     --full      the whole kernel tree (linux-6.1-full.tar, ~80K files) instead of the ~20K subset
#     --quick     smoke run (~30 s): a ~200-file tar cut from the subset, 500 files, short pings
#     --rounds N  run the workload N times, every target once a round (default 3; --quick: 1):
#                 medians, and ratios taken against the same round's baseline
#     --rtt-us N  emulated round trip of the *-rtt targets and the proxied pings (default 200)
#     --only L    comma-separated targets (default: all seven)
#     --count N   files for the metadata phases (default 10000; --quick: 500)
#     --tar PATH  any tar instead
#     --io-threads N  the crest servers' connection threads (crest serve --io-threads)
# Needs root (mounts, drop_caches, sshd), fuse3, bindfs, sshfs, openssh-server
# (scripts/setup.sh installs them). Logs: /var/tmp/crest-headline-logs.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

all_targets="local bindfs sshfs sshfs-rtt crest crest-insecure crest-rtt"
tar_dir=/dev/shm/crest-bench
tarball='' full=0 quick=0 rtt_us=200 only='' count='' rounds=''
while [ $# -gt 0 ]; do
  case $1 in
    --full) full=1 ;;
    --quick) quick=1 ;;
    --rtt-us) rtt_us=$2; shift ;;
    --rtt-us=*) rtt_us=${1#*=} ;;
    --rounds) rounds=$2; shift ;;
    --rounds=*) rounds=${1#*=} ;;
    --only) only=$2; shift ;;
    --only=*) only=${1#*=} ;;
    --count) count=$2; shift ;;
    --count=*) count=${1#*=} ;;
    --tar) tarball=$(realpath -m "$2"); shift ;;
    --tar=*) tarball=$(realpath -m "${1#*=}") ;;
    --io-threads) BENCH_IO_THREADS=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "headline: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $rtt_us =~ ^[0-9]+$ ]] || { echo "headline: --rtt-us wants microseconds" >&2; exit 2; }
targets=$all_targets
if [ -n "$only" ]; then
  targets=
  for t in ${only//,/ }; do
    [[ " $all_targets " == *" $t "* ]] || { echo "headline: unknown target $t (have: $all_targets)" >&2; exit 2; }
    targets+="$t "
  done
  targets=${targets% }
fi
has() { [[ " $targets " == *" $1 "* ]]; }
if [ $quick = 1 ]; then count=${count:-500}; pings=500; else count=${count:-10000}; pings=10000; fi
if [ $quick = 1 ]; then fsyncs=50; seq_mib=64; else fsyncs=1000; seq_mib=2048; fi
if ! [[ $count =~ ^[1-9][0-9]*$ ]]; then echo "headline: --count wants a positive number" >&2; exit 2; fi
if [ $quick = 1 ]; then rounds=${rounds:-1}; else rounds=${rounds:-3}; fi
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then echo "headline: --rounds wants a positive number" >&2; exit 2; fi

# The workload's tar.
subset=$tar_dir/linux-6.1-small.tar
if [ -z "$tarball" ]; then
  if [ $full = 1 ]; then tarball=$tar_dir/linux-6.1-full.tar; else tarball=$subset; fi
fi
if [ $quick = 1 ] && [ $full = 0 ]; then bench_tar "$subset"; else bench_tar "$tarball"; fi
bench_init headline
if [ $quick = 1 ] && [ $full = 0 ]; then
  bench_small_tar "$subset" "$BENCH_BASE/small.tar"
  tarball=$BENCH_BASE/small.tar
fi
entries=$(tar -tf "$tarball" | wc -l)

# Servers and proxies for the chosen targets.
if has sshfs || has sshfs-rtt; then
  if ! command -v sshfs >/dev/null || ! [ -x /usr/sbin/sshd ]; then
    echo "headline: sshfs and openssh-server are needed (bash scripts/setup.sh)" >&2; exit 1
  fi
  bench_sshd
  BENCH_ADDR[sshfs]=${BENCH_PORT[sshd]}
  if has sshfs-rtt; then
    bench_proxy sshd-proxy "${BENCH_PORT[sshd]}" "$rtt_us"
    BENCH_ADDR[sshfs-rtt]=${BENCH_PORT[sshd-proxy]}
  fi
fi
if has crest; then
  bench_crest_server crest
  BENCH_ADDR[crest]=127.0.0.1:${BENCH_PORT[crest]}
fi
if has crest-insecure; then
  bench_crest_server crest-insecure --insecure
  BENCH_ADDR[crest-insecure]=127.0.0.1:${BENCH_PORT[crest-insecure]}
fi
if has crest-rtt; then
  bench_crest_server crest-rtt
  bench_proxy crest-rtt-proxy "${BENCH_PORT[crest-rtt]}" "$rtt_us"
  BENCH_ADDR[crest-rtt]=127.0.0.1:${BENCH_PORT[crest-rtt-proxy]}
fi

# The file system workload, every target once a round (targets in the same order each
# round: the machine's drift moves a round's targets together).
meta="$BENCH_BIN/crest-metabench"
for ((round = 1; round <= rounds; round++)); do
for t in $targets; do
  echo "headline: [${SECONDS}s] round $round/$rounds: $t" >&2
  k="$t@$round"
  bench_mount "$t"; d=$(bench_dir "$t")
  bench_drop
  bench_time "untar $k" "tar -xf '$tarball' -C '$d' && sync -f '$d'"
  bench_cold "$t"
  bench_time "read $k" "cd '$d' && find . -type f -print0 | xargs -0 -r cat >/dev/null"
  bench_time "rm $k" "rm -rf '$d'/* && sync -f '$d' && [ -z \"\$(ls -A '$d')\" ]"
  mkdir -p "$d/meta"
  bench_drop
  bench_time "create $k" "'$meta' '$d/meta' --count $count --phase create --sync"
  bench_cold "$t"
  bench_time "stat $k" "'$meta' '$d/meta' --count $count --phase stat"
  bench_cold "$t"
  bench_time "unlink $k" "'$meta' '$d/meta' --count $count --phase unlink --sync"
  rmdir "$d/meta" 2>/dev/null || rm -rf "$d/meta"
  # Durable small writes, then one big file written to durable and read back cold.
  bench_time "fsync $k" "'$BENCH_BIN/crest' bench '$d' --big-size 0 --small-count 0 --fsync-count $fsyncs --json >'$BENCH_LOGS/fsync-$k.json'"
  BENCH_OPS[fsync $k]=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["results"][0]["ops_per_s"])' \
    "$BENCH_LOGS/fsync-$k.json" 2>/dev/null || echo -)
  bench_time "seqwrite $k" "dd if=/dev/zero of='$d/big' bs=1M count=$seq_mib conv=fsync status=none"
  bench_cold "$t"
  bench_time "seqread $k" "dd if='$d/big' of=/dev/null bs=1M status=none"
  rm -f "$d/big"
  bench_umount "$t"
done
done

# Round trips: raw TCP against crest requests, on loopback and through a delay proxy.
echo "headline: [${SECONDS}s] round trips" >&2
port=$(bench_free_port)
bench_daemon "$BENCH_LOGS/echo.log" "$BENCH_BIN/crest-tcp-pingpong" --server "127.0.0.1:$port"
bench_wait_port "$port" "$BENCH_LAST_PID"
BENCH_PORT[echo]=$port
bench_proxy echo-proxy "${BENCH_PORT[echo]}" "$rtt_us"
bench_crest_server rpc
bench_proxy rpc-proxy "${BENCH_PORT[rpc]}" "$rtt_us"
rt_failed=0
rt() { # name command...: its output in $BENCH_LOGS/rt-NAME.log; a failure is reported, not fatal
  "${@:2}" >"$BENCH_LOGS/rt-$1.log" 2>&1 || {
    rt_failed=$((rt_failed + 1)); echo "headline: round trip $1 failed:" >&2
    tail -3 "$BENCH_LOGS/rt-$1.log" | sed 's/^/    /' >&2; }
}
rt tcp-lo "$BENCH_BIN/crest-tcp-pingpong" --connect "127.0.0.1:${BENCH_PORT[echo]}" --count "$pings"
rt tcp-rtt "$BENCH_BIN/crest-tcp-pingpong" --connect "127.0.0.1:${BENCH_PORT[echo-proxy]}" --count "$pings"
rt crest-lo "$BENCH_BIN/crest-rpc-ping" "127.0.0.1:${BENCH_PORT[rpc]}" --count "$pings"
rt crest-rtt "$BENCH_BIN/crest-rpc-ping" "127.0.0.1:${BENCH_PORT[rpc-proxy]}" --count "$pings"
# rt_get NAME MATCH FIELD: FIELD (median_us, p99_us) of the line of rt-NAME.log containing MATCH.
rt_get() {
  local v
  v=$(grep -F -- "$2 " "$BENCH_LOGS/rt-$1.log" 2>/dev/null | sed -n "s/.* $3=\([0-9.]*\).*/\1/p" | head -1)
  echo "${v:--}"
}

# The report.
printf '\ncrest headline benchmark, %s, %s, %s cores, kernel %s\n' "$(date -u '+%F %H:%M UTC')" \
  "$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" "$(nproc)" "$(uname -r)"
printf 'tar: %s (%s entries); metadata phases: %s files in one directory; emulated round trip (*-rtt): %s us\n' \
  "$(basename "$tarball")" "$entries" "$count" "$rtt_us"
printf 'scratch file system: %s on %s\n' "$(stat -f -c %T "$BENCH_BASE")" "${CREST_BENCH_DIR:-/var/tmp}"
if has sshfs || has sshfs-rtt; then
  printf 'sshfs %s, options: -o port=PORT,%s (other options sshfs defaults)\n' \
    "$(sshfs --version 2>&1 | sed -n 's/^SSHFS version //p')" "$(bench_sshfs_opts | sed "s|$BENCH_BASE|SCRATCH|g")"
fi
printf 'real/user/sys: seconds, of the workload processes (tar, cat, rm, metabench); "x bindfs": real / bindfs real;\n'
printf '"!": the command reported errors (its time is still shown; what it said is below the table)\n'
printf 'fsync: %s x (4 KiB write + fsync) with crest bench; seqwrite: %s MiB (dd, conv=fsync); seqread: it, cold\n\n' \
  "$fsyncs" "$seq_mib"
phases="untar read rm create stat unlink fsync seqwrite seqread"
printf 'rounds: %s; each figure is the median over them, each ratio the median of the rounds'"'"' ratios\n\n' "$rounds"
bench_table "$phases" "$targets" "$rounds"
if has crest && has crest-insecure; then
  printf '\nwhat TLS costs: crest (mutual TLS) real / crest-insecure real, per round and median\n'
  bench_pairs "$phases" crest crest-insecure "$rounds"
fi

printf '\nround trips, one at a time on one connection (median / p99 us; "x tcp" = crest median / tcp median)\n'
printf '%-14s %19s %19s %7s   %19s %19s %7s\n' "" "tcp loopback" "crest loopback" "x tcp" \
  "tcp +${rtt_us}us" "crest +${rtt_us}us" "x tcp"
rt_row() { # label tcp-size crest-match
  local tl tlp cl clp tr trp cr crp
  tl=$(rt_get tcp-lo "size_bytes=$2" median_us); tlp=$(rt_get tcp-lo "size_bytes=$2" p99_us)
  tr=$(rt_get tcp-rtt "size_bytes=$2" median_us); trp=$(rt_get tcp-rtt "size_bytes=$2" p99_us)
  cl=$(rt_get crest-lo "$3" median_us); clp=$(rt_get crest-lo "$3" p99_us)
  cr=$(rt_get crest-rtt "$3" median_us); crp=$(rt_get crest-rtt "$3" p99_us)
  printf '%-14s %19s %19s %7s   %19s %19s %7s\n' "$1" "$tl / $tlp" "$cl / $clp" "$(bench_ratio "$cl" "$tl")" \
    "$tr / $trp" "$cr / $crp" "$(bench_ratio "$cr" "$tr")"
}
rt_row "4 B write" 4 "op=write size_bytes=4"
rt_row "64 B write" 64 "op=write size_bytes=64"
rt_row "1 KiB write" 1024 "op=write size_bytes=1024"
rt_row "getattr vs 4 B" 4 "op=getattr size_bytes=0"
tl=$(rt_get tcp-lo size_bytes=64 median_us); tr=$(rt_get tcp-rtt size_bytes=64 median_us)
if [ "$tl" != - ] && [ "$tr" != - ]; then
  printf 'delay proxy: adds %.1f us to a 64 B TCP round trip (requested %s us)\n' "$(echo "$tr - $tl" | bc -l)" "$rtt_us"
fi
for p in sshd-proxy crest-rtt-proxy echo-proxy rpc-proxy; do
  [ -s "$BENCH_LOGS/$p.log" ] || continue
  printf 'delay proxy %-15s %s\n' "$p:" "$(grep -F 'connections=' "$BENCH_LOGS/$p.log" | tail -1 | sed 's/^crest-delay-proxy: //')"
done
# sshfs is not POSIX enough for every step of the workload (tar's utime/chown of symlinks,
# directory inode numbers that change): its errors are results, shown above. Any other
# failure fails the run.
failed=0
for key in "${!BENCH_ERR[@]}"; do
  [[ $key == *" sshfs"* ]] || failed=$((failed + 1))
done
failed=$((failed + rt_failed))
if [ "$failed" != 0 ]; then
  echo "headline: $failed measurement(s) failed; logs in $BENCH_LOGS" >&2
  exit 1
fi
