#!/usr/bin/env bash
# What a big image costs (issue 18, item 6): for each inode count, an image made through
# the store (`crates/store/examples/fill-image.rs`: directories of 1,000 entries, some
# inline data, some extents, xattrs, hard links), then
#   fsck      wall time and peak memory (`crest fsck`, /usr/bin/time)
#   open      how long `crest serve` takes from start to listening, and its memory then
# Prints one row per count.
#
#   bench/bigimage.sh [--inodes 100000,1000000] [--dir /var/tmp]
# Images are sparse files of ~1 KiB per inode, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
counts=100000,1000000
dir=/var/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --inodes) counts=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: bench/bigimage.sh [--inodes N,N...] [--dir DIR]" >&2; exit 2 ;;
  esac
done
cargo build -q --release -p crest -p crest-store --example fill-image
crest=target/release/crest
img="$dir/crest-bigimage.$$.img"
trap 'pkill -f "serve $img" 2>/dev/null; rm -f "$img"' EXIT
port=$((20000 + $$ % 20000))
printf '%-10s %-10s %-12s %-14s %-10s %-14s\n' inodes fill_s fsck_s fsck_peak_MiB open_s serve_RSS_MiB
IFS=, read -ra ns <<< "$counts"
for n in "${ns[@]}"; do
  rm -f "$img"
  gib=$(( n / 500000 + 4 ))
  t0=$(date +%s.%N)
  target/release/examples/fill-image "$img" "$n" "$gib" 2>/dev/null
  fill=$(echo "$(date +%s.%N) - $t0" | bc)
  out=$( { /usr/bin/time -f "%e %M" "$crest" fsck "$img" >/dev/null; } 2>&1 | tail -1)
  read -r fsck_s fsck_kib <<< "$out"
  t0=$(date +%s.%N)
  "$crest" serve "$img" --listen "127.0.0.1:$port" --insecure -q >/dev/null 2>&1 &
  for _ in $(seq 1 6000); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.01; done
  open_s=$(echo "$(date +%s.%N) - $t0" | bc)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$(pgrep -f "serve $img" | head -1)/status")
  pkill -f "serve $img"; sleep 0.5
  printf '%-10s %-10.1f %-12s %-14s %-10.2f %-14s\n' "$n" "$fill" "$fsck_s" "$((fsck_kib / 1024))" "$open_s" "$((rss / 1024))"
done
