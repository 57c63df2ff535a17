#!/usr/bin/env bash
# What each phase of the headline workload costs crest, not just how long it takes: untar,
# cold read-back and rm -rf of a tar through one crest mount, each against a freshly
# started server (same image), with the CPU seconds the server and the mount daemon
# used and the operations the server served, by kind (from its shutdown log).
#   bench/cost.sh [TAR]      (default: the ~20K-file kernel subset)
# CREST_BIN=PATH measures that crest binary instead of building this tree's.
# Needs root (mounts, drop_caches). Scratch under CREST_BENCH_DIR (default /var/tmp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tar=${1:-/dev/shm/crest-bench/linux-6.1-small.tar}
[ -f "$tar" ] || bash "$root/../shared/bench/kernel-tars.sh" >&2
if [ -n "${CREST_BIN:-}" ]; then
  crest=$CREST_BIN # a build to compare (A/B runs against another)
else
  (cd "$root" && cargo build --release --locked -q -p crest)
  crest=$root/target/release/crest
fi
work=$(mktemp -d "${CREST_BENCH_DIR:-/var/tmp}/crest-cost.XXXXXX")
mnt=$work/mnt img=$work/img port=$((20000 + RANDOM % 20000)) server=
mkdir -p "$mnt"
cleanup() {
  "$crest" umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
"$crest" mkfs --size 16G "$img" >/dev/null
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; } # user + sys, seconds

phase() { # NAME COMMAND
  CREST_LOG=info "$crest" serve "$img" --listen "127.0.0.1:$port" >"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  "$crest" mount "127.0.0.1:$port" "$mnt" >/dev/null
  local daemon s0 c0 t0 t1
  daemon=$(pgrep -f "crest mount --foreground .*127.0.0.1:$port $mnt" | head -1)
  s0=$(cpu "$server") c0=$(cpu "$daemon") t0=$(date +%s.%N)
  bash -c "$2"
  t1=$(date +%s.%N)
  awk -v n="$1" -v t="$t1 - $t0" -v s="$(cpu "$server") $s0" -v c="$(cpu "$daemon") $c0" 'BEGIN {
    split(t, a, " - "); split(s, b, " "); split(c, d, " ")
    printf "%-6s real %6.2f s   server cpu %5.2f s   client cpu %5.2f s\n", n, a[1] - a[2], b[1] - b[2], d[1] - d[2] }'
  "$crest" umount "$mnt"
  sync
  echo 3 >/proc/sys/vm/drop_caches # the next phase starts cold
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=
  printf '       %s\n' "$(grep -o 'served.*' "$work/serve.log" | sed 's/\x1b\[[0-9;]*m//g')"
}

echo "crest cost of each phase, $(date -u '+%F %H:%M') UTC, $(git -C "$root" rev-parse --short HEAD), tar $(basename "$tar")"
phase untar "tar -xf '$tar' -C '$mnt' && sync -f '$mnt'"
phase read "cd '$mnt' && find . -type f -print0 | xargs -0 -r cat >/dev/null"
phase rm "rm -rf '$mnt'/* && sync -f '$mnt'"
