#!/usr/bin/env bash
# Rolling upgrades between releases, with real binaries, real servers and real FUSE mounts
# (root): the previous release (packaging/previous-release names its commit; built from
# it) and this tree's. One image, one port, TLS as users run it.
#   1. this release's client mounts the previous release's server (its hello in the newest
#      protocol is refused, and said again in the server's);
#   2. the server is upgraded under that mount: it carries on, and speaks the newest
#      protocol after its reconnect;
#   3. the previous release's client mounts the upgraded server (answered in its version);
#   4. the server is downgraded under both mounts: both carry on;
# and between steps both mounts write new files and read back every file written so far
# (sizes seeded and printed), `crest status` names each session's protocol, and fsck
# finds the image clean at the end.
#   CREST_BIN        this tree's crest (default target/release/crest)
#   CREST_PREV_BIN   the previous release's crest (default: built from its commit, kept in
#                    /var/tmp/crest-prev/ for the next run)
#   CREST_SEED       the file sizes' seed (default: random, printed)
# Each check prints PASS/FAIL; exits non-zero if any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-upgrade.XXXXXX)
fails=0
server=
mounts=()
seed=${CREST_SEED:-$RANDOM}
echo "seed $seed (CREST_SEED=$seed to repeat)"

cleanup() {
  unmount_all "${mounts[@]}"
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"

# The previous release: its commit, built once into /var/tmp/crest-prev/.
read -r prev_release prev_commit <"$root/packaging/previous-release"
prev=${CREST_PREV_BIN:-/var/tmp/crest-prev/crest-$prev_release-${prev_commit:0:12}}
if [ ! -x "$prev" ]; then
  if ! git -C "$root" cat-file -e "$prev_commit^{commit}" 2>/dev/null; then
    echo "FAIL previous-release: commit $prev_commit ($prev_release) is not in $root's history" \
      "(a shallow clone?); set CREST_PREV_BIN to its binary" >&2
    exit 1
  fi
  echo "building the previous release, $prev_release ($prev_commit)"
  src=$(mktemp -d /var/tmp/crest-prev-src.XXXXXX)
  git -C "$root" archive "$prev_commit" | tar -x -C "$src"
  # (The same target directory: its dependencies are built already. The build leaves the
  # old binary at target/release/crest, so this tree's is built again after it.)
  if ! (cd "$src" && CREST_BUILD_COMMIT=${prev_commit:0:12} CARGO_TARGET_DIR=$root/target \
        cargo build --release --locked -q -p crest); then
    echo "FAIL previous-release: $prev_release did not build" >&2
    rm -rf "$src"
    exit 1
  fi
  mkdir -p "$(dirname "$prev")"
  cp "$root/target/release/crest" "$prev.new" && mv "$prev.new" "$prev"
  rm -rf "$src"
  (cd "$root" && cargo build --release --locked -q -p crest) || { echo "FAIL: this tree no longer builds" >&2; exit 1; }
fi
"$crest" version >"$tmp/new.version" && "$prev" version >"$tmp/prev.version"
echo "this release:     $(tr '\n' ' ' <"$tmp/new.version")"
echo "previous release: $(tr '\n' ' ' <"$tmp/prev.version")"
new_protocol=$(sed -n 's/^protocol: \([0-9]*\).*/\1/p' "$tmp/new.version")
prev_protocol=$(sed -n 's/^protocol: \([0-9]*\).*/\1/p' "$tmp/prev.version")
check releases-differ [ "$(head -2 "$tmp/new.version")" != "$(head -2 "$tmp/prev.version")" ]

export CREST_STATE_DIR=$tmp/state
port=$(free_port)
addr=127.0.0.1:$port
img=$tmp/img
"$crest" mkfs --size 512M "$img" >/dev/null || { echo "mkfs failed" >&2; exit 1; }

# start BIN: serves the image with BIN on the port (the same one each time).
start() {
  "$1" serve "$img" --listen "$addr" >>"$tmp/serve.log" 2>&1 &
  server=$!
  wait_listen "$port" || { fail "server-start" "$(tail -5 "$tmp/serve.log")"; return 1; }
}
# stop: SIGTERM (commits and exits, as a service manager's stop does).
stop() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=; }

# write DIR N: N files of seeded random sizes (0 to ~300 KiB) under DIR, their sums kept.
written=$tmp/sums
: >"$written"
write() {
  mkdir -p "$1" || return 1
  python3 - "$1" "$2" "$seed" "$written" <<'PY'
import hashlib, os, random, sys
d, n, seed, sums = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(f"{seed}:{d}")
with open(sums, "a") as out:
    for i in range(n):
        size = rng.choice([0, 1, 4095, 4096, 4097, rng.randrange(1, 300_000)])
        data = rng.randbytes(size)
        p = os.path.join(d, f"f{i}")
        with open(p, "wb") as f:
            f.write(data)
        out.write(f"{hashlib.sha256(data).hexdigest()}  {os.path.relpath(p, os.path.dirname(os.path.dirname(d)))}\n")
PY
}
# readback MNT: every file written so far, through MNT, has the bytes it was written with.
readback() { (cd "$1/.." && sed "s|  [^/]*/|  $(basename "$1")/|" "$written" | sha256sum --quiet -c -); }
# protocol_of CLIENT: the protocol `crest status` (of this release's server) gives the
# session whose client name ends in CLIENT: 0 until its client has said hello since the
# server started (a session restored from its record is listed before its client is back).
protocol_of() {
  "$crest" status --server "$addr" --json | python3 -c '
import json, sys
s = [x for x in json.load(sys.stdin)["sessions"] if x["connected"] and x["client"].endswith(sys.argv[1])]
print(s[0]["protocol"] if len(s) == 1 else f"{len(s)} sessions")' "$1"
}
# speaks MNT WANT: within 30 s the mount's session is back and speaks protocol WANT.
speaks() {
  local got
  for _ in $(seq 150); do
    got=$(protocol_of "$1")
    [ "$got" = "$2" ] && return 0
    sleep 0.2
  done
  echo "session of $1 speaks $got, want $2" >&2
  return 1
}
# carries_on MNT: the mount answers a look-up of a name it has never seen (which only the
# server can answer: a mount that did not reconnect hangs here, and times out).
carries_on() {
  timeout 60 python3 -c '
import os, sys
try:
    os.stat(sys.argv[1])
except FileNotFoundError:
    sys.exit(0)
sys.exit(1)' "$1/never-$RANDOM"
}

mkdir -p "$tmp/a" "$tmp/b"
mounts+=("$tmp/a" "$tmp/b")

echo "== this release's client on the previous release's server"
start "$prev" || exit 1
expect new-client-mounts-old-server 0 "$crest" mount "$addr" "$tmp/a"
check new-client-writes write "$tmp/a/step1" 40
check new-client-reads-back readback "$tmp/a"
run "$crest" status --server "$addr"
[ "$rc" = 0 ] && pass new-status-of-old-server || fail new-status-of-old-server "$(said)"

echo "== the server upgraded under the mount"
stop
start "$crest" || exit 1
check speaks-newest-after-upgrade speaks "$tmp/a" "$new_protocol"
check mount-carries-on-after-upgrade carries_on "$tmp/a"
check reads-back-after-upgrade readback "$tmp/a"
check writes-after-upgrade write "$tmp/a/step2" 40

echo "== the previous release's client on this release's server"
expect old-client-mounts-new-server 0 "$prev" mount "$addr" "$tmp/b"
check old-client-reads-back readback "$tmp/b"
check old-client-writes write "$tmp/b/step3" 40
check new-client-reads-old-clients-files readback "$tmp/a"
check old-client-speaks-its-version speaks "$tmp/b" "$prev_protocol"
run "$prev" status --server "$addr"
[ "$rc" = 0 ] && pass old-status-of-new-server || fail old-status-of-new-server "$(said)"

echo "== the server downgraded under both mounts"
stop
start "$prev" || exit 1
check new-mount-carries-on-after-downgrade carries_on "$tmp/a"
check old-mount-carries-on-after-downgrade carries_on "$tmp/b"
check new-client-writes-after-downgrade write "$tmp/a/step4" 30
check old-client-writes-after-downgrade write "$tmp/b/step5" 30
check new-client-reads-all-after-downgrade readback "$tmp/a"
check old-client-reads-all-after-downgrade readback "$tmp/b"

echo "== unmounted, the image is clean"
for m in "$tmp/a" "$tmp/b"; do "$crest" umount "$m" || fail umount "$m"; done
stop
expect fsck-clean 0 "$crest" fsck "$img"

if [ "$fails" -gt 0 ]; then
  echo "$fails upgrade check(s) failed (seed $seed); server log:" >&2
  tail -20 "$tmp/serve.log" >&2
  exit 1
fi
echo "all upgrade checks passed"
