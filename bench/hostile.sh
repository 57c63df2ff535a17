#!/usr/bin/env bash
# An honest mount's latency beside hostile peers (issue 43, findings 2, 3 and 5): a real
# `crest serve --insecure` on a scratch image and a real FUSE `crest mount`, on which an
# honest probe (`crest-flood probe`: create a file, write 4 KiB, close, stat, unlink, in a
# directory of its own, each iteration timed) runs first on a quiet server, then beside
# each hostile load of `crest-flood` (raw wire protocol, a session of its own):
#   parked-reads  reads parked behind another session's exclusive rights, released together (2)
#   fallocate     1 GiB fallocated in requests of 4 MiB back to back, punched out again, repeatedly (3)
#   fence-storm   255 sessions make a change each, then all drop their connections (5)
#   recall-hoard  the probe's directory acquired, its recall never answered (5)
#   lock-flood    pipelined requests of 16 SetLock operations on a file keeping 4,096 (5)
#   fsync-flood   pipelined small writes with an fsync each (5)
# Prints a table: per scenario the probe's iterations, p50, p99 and max (ms), p99 against
# the quiet run's, and iterations over 1 s (the target: p99 within 3x of quiet, none over
# 1 s); then what each flood did.
#
#   bench/hostile.sh [--quick] [--seconds N] [--modes m1,m2] [--mib N]
# --quick: ~5 s a scenario (default 20). Needs root (the mount). Scratch: CREST_BENCH_DIR
# (default /var/tmp); logs: /var/tmp/crest-hostile-logs/.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

secs=20
mib=1024
all_modes=parked-reads,fallocate,fence-storm,recall-hoard,lock-flood,fsync-flood
modes=$all_modes
warm=2    # seconds a flood runs before the probe starts
settle=5  # seconds between scenarios (fences, commits and recalls of the last one end)
usage() { echo "usage: $0 [--quick] [--seconds N] [--modes $all_modes] [--mib N]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) secs=5 ;;
    --seconds) secs=${2:?}; shift ;;
    --modes) modes=${2:?}; shift ;;
    --mib) mib=${2:?}; shift ;;
    -h | --help) usage ;;
    *) usage ;;
  esac
  shift
done
for m in ${modes//,/ }; do
  case ",$all_modes," in *",$m,"*) ;; *) echo "hostile.sh: unknown mode $m" >&2; usage ;; esac
done

bench_init hostile
flood=$BENCH_BIN/crest-flood
# All of --insecure's clients are one identity; the honest mount stands for another
# host's, so the floods' sessions must not count against its limit.
bench_crest_server crest --insecure --max-sessions-per-client 1024
addr=127.0.0.1:${BENCH_PORT[crest]}
BENCH_ADDR[crest-insecure]=$addr
bench_mount crest-insecure
mnt=$(bench_dir crest-insecure)
mkdir "$mnt/probe"

declare -A FAIL=()  # scenario → what went wrong

# probe NAME SECONDS: the honest probe on the mount; its line goes to $BENCH_LOGS/NAME.probe.
probe() {
  local rc=0
  bench_fg "$flood" probe --dir "$mnt/probe" --seconds "$2" >"$BENCH_LOGS/$1.probe" 2>&1 || rc=$?
  [ "$rc" = 0 ] || FAIL[$1]="probe exit $rc: $(grep -v '^crest-flood probe ' "$BENCH_LOGS/$1.probe" | head -1)"
}

# scenario MODE: MODE's flood for warm + secs seconds, the probe beside it for the last
# secs; then waits for the flood to finish what it has in flight, and for the server to
# settle.
scenario() {
  local mode=$1 pid rc=0 args
  case $mode in
    fallocate) args=(fallocate "$addr" --mib "$mib") ;;
    recall-hoard) args=(recall-hoard "$addr" --path probe) ;;
    *) args=("$mode" "$addr") ;;
  esac
  bench_daemon "$BENCH_LOGS/$mode.flood" "$flood" "${args[@]}" --seconds $((warm + secs))
  pid=$BENCH_LAST_PID
  sleep "$warm"
  kill -0 "$pid" 2>/dev/null || FAIL[$mode]="the flood ended before the probe started"
  probe "$mode" "$secs"
  wait "$pid" || rc=$?
  [ "$rc" = 0 ] || FAIL[$mode]="${FAIL[$mode]:+${FAIL[$mode]}; }flood exit $rc: $(grep -v '^crest-flood mode=' "$BENCH_LOGS/$mode.flood" | head -1)"
  sleep "$settle"
  timeout 120 stat "$mnt/probe" >/dev/null || FAIL[$mode]="${FAIL[$mode]:+${FAIL[$mode]}; }the mount did not answer a stat afterwards"
}

# field FILE KEY: KEY's value in the probe line of FILE ("-" if none).
field() { sed -n "s/^crest-flood probe .*\b$2=\([^ ]*\).*/\1/p" "$1" | tail -1 | grep . || echo -; }

probe warmup 1
probe quiet "$secs"
for m in ${modes//,/ }; do scenario "$m"; done
sleep "$settle"
probe quiet-after "$secs"

if rev=$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null); then
  git -C "$BENCH_ROOT" diff --quiet HEAD -- crates || rev+="+changes"
else
  rev="(not a git tree)"
fi
echo
echo "crest: an honest mount's probe beside hostile loads, $(date -u '+%Y-%m-%d %H:%M UTC'), $rev, $(nproc) cores, ${secs} s a scenario"
echo "(probe: create, write 4 KiB, close, stat, unlink per iteration; target: p99 within 3x of quiet, none over 1 s)"
echo
quiet_p99=$(field "$BENCH_LOGS/quiet.probe" p99_ms)
printf '| %-14s | %10s | %8s | %8s | %9s | %11s | %6s |\n' scenario iterations "p50 ms" "p99 ms" "max ms" "p99 / quiet" "> 1 s"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..16})" "$(printf -- '-%.0s' {1..12})" "$(printf -- '-%.0s' {1..10})" \
  "$(printf -- '-%.0s' {1..10})" "$(printf -- '-%.0s' {1..11})" "$(printf -- '-%.0s' {1..13})" "$(printf -- '-%.0s' {1..8})"
for s in quiet ${modes//,/ } quiet-after; do
  f=$BENCH_LOGS/$s.probe
  p99=$(field "$f" p99_ms)
  mark=' '
  [ -z "${FAIL[$s]:-}" ] || mark='!'
  printf '| %-14s | %10s | %8s | %8s | %9s | %11s | %6s |\n' "$s$mark" "$(field "$f" n)" "$(field "$f" p50_ms)" "$p99" \
    "$(field "$f" max_ms)" "$(bench_ratio "$p99" "$quiet_p99")" "$(field "$f" over_1s)"
done
echo
echo "what each flood did:"
for m in ${modes//,/ }; do
  printf '  %s\n' "$(grep '^crest-flood mode=' "$BENCH_LOGS/$m.flood" | tail -1 || echo "$m: no report")"
done
for s in quiet ${modes//,/ } quiet-after; do
  errs=$(field "$BENCH_LOGS/$s.probe" errors)
  [ "$errs" = 0 ] || [ "$errs" = - ] || echo "! $s: the probe saw $errs failed iterations: $(grep 'first error' "$BENCH_LOGS/$s.probe" | head -1)"
  [ -z "${FAIL[$s]:-}" ] || echo "! $s: ${FAIL[$s]}"
done
echo "logs: $BENCH_LOGS"
