#!/usr/bin/env bash
# What idle clients cost a server (issue 18, "the cost of a client is small and bounded"):
#   1. sessions: crest-sessions opens 1, 100 and 1,000 sessions with the real client core
#      (one connection and one session each, as a mount has), lets them idle, and reads
#      the server's CPU and resident memory meanwhile (and its own CPU: the clients' timers);
#   2. mounts: real FUSE mounts of one server (crest mount -o own_session: a session each, as
#      mounts of as many machines would hold; mounts of one host share one), left idle: the server's CPU
#      and memory, and what each mount process holds of its own (anonymous memory: its
#      pages of the crest binary are shared by all of them).
# Prints a table per part. Mutual TLS by default (the host's own certificate, so the
# server runs with --max-sessions-per-client above the largest count).
#
#   bench/sessions.sh [--sessions 1,100,1000] [--mounts 10,100] [--idle-secs N] [--insecure]
# Needs root (mounts). Scratch: CREST_BENCH_DIR (default /var/tmp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sessions=1,100,1000
mounts=10,100
idle=10
insecure=
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) sessions=$2; shift ;;
    --mounts) mounts=$2; shift ;;
    --idle-secs) idle=$2; shift ;;
    --insecure) insecure=--insecure ;;
    *) echo "usage: $0 [--sessions L] [--mounts L] [--idle-secs N] [--insecure]" >&2; exit 2 ;;
  esac
  shift
done
(cd "$root" && cargo build -q --release -p crest -p crest-benchtools)
crest=$root/target/release/crest
tool=$root/target/release/crest-sessions
# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
tmp=$(mktemp -d "${CREST_BENCH_DIR:-/var/tmp}/crest-sessions.XXXXXX")
server=
mnts=()
cleanup() {
  for m in "${mnts[@]}"; do umount -l "$m" 2>/dev/null || true; done
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
most=$(tr ',' '\n' <<<"$sessions,$mounts" | sort -n | tail -1)

start_server() {
  [ -n "$server" ] && { kill "$server"; wait "$server" 2>/dev/null || true; }
  rm -f "$tmp/img"
  "$crest" mkfs --size 1G "$tmp/img" >/dev/null
  port=$(free_port)
  "$crest" serve "$tmp/img" --listen "127.0.0.1:$port" --max-sessions-per-client $((most + 10)) $insecure \
    >"$tmp/serve.log" 2>&1 &
  server=$!
  wait_listen "$port" || { cat "$tmp/serve.log" >&2; exit 1; }
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# A mount process's own memory (its pages of the crest binary are shared by all mounts).
anon_kib() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }
hz=$(getconf CLK_TCK)

echo "crest idle-client cost, $(date -u '+%Y-%m-%d %H:%M UTC'), $(cd "$root" && git rev-parse --short HEAD), $(nproc) cores, ${insecure:-mutual TLS}, idle ${idle} s"
echo
echo "sessions (crest-sessions: the client core, one connection each)"
start_server
printf '%-10s %16s %16s %20s %18s\n' sessions "server CPU %core" "server RSS MiB" "server KiB/session" "clients CPU %core"
"$tool" "127.0.0.1:$port" --server-pid "$server" --sessions "$sessions" --idle-secs "$idle" $insecure |
  while read -r _ kv; do
    declare -A f=()
    for p in $kv; do f[${p%%=*}]=${p#*=}; done
    printf '%-10s %16s %16s %20s %18s\n' "${f[sessions]}" "${f[server_cpu_pct]}" "${f[server_rss_mib]}" \
      "${f[rss_per_session_kib]}" "${f[clients_cpu_pct]}"
  done

echo
echo "mounts (crest mount: FUSE, left idle)"
start_server
base=$(rss_kib "$server")
printf '%-10s %16s %16s %20s %18s\n' mounts "server CPU %core" "server RSS MiB" "server KiB/mount" "anon MiB/mount"
have=0
for want in ${mounts//,/ }; do
  while [ "$have" -lt "$want" ]; do
    m=$tmp/m$have
    mkdir -p "$m"
    "$crest" mount $insecure -o own_session "127.0.0.1:$port" "$m" >/dev/null
    mnts+=("$m")
    have=$((have + 1))
  done
  sleep 2
  t0=$(ticks "$server"); s0=$(date +%s%N)
  sleep "$idle"
  t1=$(ticks "$server"); s1=$(date +%s%N)
  rss=$(rss_kib "$server")
  mount_rss=0
  for m in "${mnts[@]}"; do
    for c in /proc/[0-9]*/cmdline; do
      if [ "$(tr '\0' '\n' <"$c" 2>/dev/null | tail -n 1)" = "$m" ]; then
        p=$(basename "$(dirname "$c")")
        mount_rss=$((mount_rss + $(anon_kib "$p")))
      fi
    done
  done
  ls "${mnts[0]}" >/dev/null  # still answering
  awk -v w="$want" -v t=$((t1 - t0)) -v hz="$hz" -v ns=$((s1 - s0)) -v rss="$rss" -v base="$base" -v mr="$mount_rss" \
    'BEGIN { printf "%-10s %16.2f %16.1f %20.1f %18.1f\n", w, t / hz / (ns / 1e9) * 100, rss / 1024, (rss - base) / w, mr / w / 1024 }'
done
