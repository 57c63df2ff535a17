#!/usr/bin/env bash
# Snapshots at scale (seed 004: "destroy 10K snapshots in one call"), end to end through the
# command line against a real server (--insecure, loopback): a dataset holding a tree of
# files with a mount writing to it, N snapshots taken in one call (`crest snapshot create
# --stdin`), the files changed, then all N destroyed in one call. Prints wall times next to
# ZFS's seed figures (3.6-4.9 s to destroy 10,000 snapshots) and the target (<= 0.5 s).
# Then scrub throughput (seed 003): M MiB of file data written through the mount, caches
# dropped, `crest scrub` (every copy of every node and data block) timed against reading
# as many bytes of a local file on the same disk cold (dd, O_DIRECT).
#
#   bench/snapshots.sh [--count N] [--scrub-mib M]     (defaults 10000, 512)
# Needs root (a FUSE mount) and a release build (cargo build --release -p crest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
count=10000 scrub_mib=512
while [ $# -gt 0 ]; do
  case $1 in
    --count) count=$2; shift 2 ;;
    --scrub-mib) scrub_mib=$2; shift 2 ;;
    *) echo "usage: $0 [--count N] [--scrub-mib M]" >&2; exit 2 ;;
  esac
done
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /var/tmp/crest-snapbench.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr=127.0.0.1:$port
server=
cleanup() {
  grep -qF " $tmp/m " /proc/self/mountinfo && umount -l "$tmp/m"
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$crest" mkfs --size 4G "$tmp/img" >/dev/null
"$crest" serve "$tmp/img" --listen "$addr" --insecure >"$tmp/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
  sleep 0.1
done
snap() { "$crest" snapshot --server "$addr" --insecure "$@"; }
"$crest" dataset --server "$addr" --insecure create bench
mkdir -p "$tmp/m"
"$crest" mount "$addr" "$tmp/m" --insecure -o dataset=bench >/dev/null
cp -r "$root/crates" "$tmp/m/tree"
seq 1 "$count" | sed 's/^/bench@s/' >"$tmp/names"
secs() { python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.3f}')" "$1"; }
t0=$(date +%s.%N)
snap create --stdin <"$tmp/names"
create=$(secs "$t0")
# The dataset moves on: every snapshot holds blocks the dataset no longer uses.
find "$tmp/m/tree" -name '*.rs' | head -200 | while read -r f; do echo "// changed" >>"$f"; done
sync -f "$tmp/m/tree"
t0=$(date +%s.%N)
snap destroy --stdin <"$tmp/names"
destroy=$(secs "$t0")
left=$(snap list | tail -n +2 | wc -l)
[ "$left" = 0 ] || { echo "snapshots left: $left" >&2; exit 1; }
printf '\n%-34s %12s %22s\n' "$count snapshots, one call each" "crest (s)" "ZFS seed figure (s)"
printf '%-34s %12s %22s\n' "create" "$create" "-"
printf '%-34s %12s %22s\n' "destroy (target <= 0.5 s)" "$destroy" "3.6 - 4.9"

# Scrub throughput against the disk's own cold read speed.
dd if=/dev/urandom of="$tmp/local" bs=1M count="$scrub_mib" status=none
cp "$tmp/local" "$tmp/m/data"
sync -f "$tmp/m/data"
sync
echo 3 >/proc/sys/vm/drop_caches
t0=$(date +%s.%N)
dd if="$tmp/local" of=/dev/null bs=8M iflag=direct status=none
disk=$(secs "$t0")
echo 3 >/proc/sys/vm/drop_caches
"$crest" scrub --server "$addr" --insecure --restart --json >"$tmp/scrub.json" || {
  echo "scrub found damage: $(cat "$tmp/scrub.json")" >&2
  exit 1
}
read -r mib scrub_s <<<"$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['bytes'] >> 20, f\"{d['seconds']:.3f}\")" "$tmp/scrub.json")"
rate() { python3 -c "import sys; print(f'{float(sys.argv[1]) / max(float(sys.argv[2]), 1e-6):.0f}')" "$1" "$2"; }
printf '\n%-34s %12s %12s %12s\n' "scrub ($scrub_mib MiB written)" "MiB" "seconds" "MiB/s"
printf '%-34s %12s %12s %12s\n' "crest scrub (all copies)" "$mib" "$scrub_s" "$(rate "$mib" "$scrub_s")"
printf '%-34s %12s %12s %12s\n' "disk read, cold (dd 8M O_DIRECT)" "$scrub_mib" "$disk" "$(rate "$scrub_mib" "$disk")"
