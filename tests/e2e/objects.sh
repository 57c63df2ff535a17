#!/usr/bin/env bash
# End-to-end tests of file data in a data store's objects (issue 19, docs/objects.md): a
# real one-node Ceph with its RADOS Gateway (scripts/object-store.sh), a real `crest
# serve` of an image made with `crest mkfs --data`, real mounts and tools. Each check
# prints PASS/FAIL; the last line is "N passed, M failed".
#   CREST_BIN            the crest binary (default target/release/crest)
#   CREST_OBJECTS_SEED   seed of objects.py (printed)
#   CREST_FSX_SEED       seed of fsx (printed); CREST_FSX_OBJECT_OPS its operations (2000)
#   CREST_E2E_ONLY       run only checks whose name contains this word
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
crest=${CREST_BIN:-$root/target/release/crest}
objbench=$root/target/release/crest-objbench
[ -x "$crest" ] && [ -x "$objbench" ] || { echo "build first: cargo build --release" >&2; exit 2; }
eval "$(bash scripts/object-store.sh start)" || { echo "no object store" >&2; exit 2; }
prefix=e2e-$$-$RANDOM
data_url=$CREST_DATA_URL/$prefix
work=$(mktemp -d /tmp/crest-objects.XXXXXX)
chmod 755 "$work"
img=$work/img mnt=$work/mnt mnt2=$work/mnt2 mnt3=$work/mnt3
mkdir -p "$mnt" "$mnt2" "$mnt3"
port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
passed=0 failed=0 server=

log() { printf '%s\n' "$*" >&2; }
start_server() {
  "$crest" serve "$img" --listen "$addr" >>"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  log "server did not start"; cat "$work/serve.log" >&2; return 1
}
stop_server() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; server=; }
unmount() { "$crest" umount "$1" 2>/dev/null || umount -l "$1" 2>/dev/null; }
cleanup() {
  for m in "$mnt3" "$mnt2" "$mnt"; do unmount "$m"; done
  pkill -CONT -f "radosgw -c" 2>/dev/null
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT
check() { # name command...
  local name=$1; shift
  if [ -n "${CREST_E2E_ONLY:-}" ] && [[ $name != *"$CREST_E2E_ONLY"* ]]; then return 0; fi
  log "== $name"
  local t0=$SECONDS
  if "$@"; then passed=$((passed + 1)); log "PASS $name ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); log "FAIL $name ($((SECONDS - t0)) s)"; fi
}
status() { "$crest" status --server "$addr" --json; }
counter() { status | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }
objects_in_bucket() { CREST_DATA_URL=$data_url "$objbench" --count-objects; }

"$crest" mkfs --size 4G --data "$data_url" "$img" >/dev/null
start_server
"$crest" mount "$addr" "$mnt" >/dev/null
"$crest" mount -o own_session "$addr" "$mnt2" >/dev/null

head -c $((48 << 20)) /dev/urandom >"$work/src"
# (Long enough to be cut short: the kill tests write it.)
head -c $((192 << 20)) /dev/urandom >"$work/long"

blksize_is_an_objects_worth() { : >"$mnt/probe" && [ "$(stat -c %o "$mnt/probe")" = 1048576 ] && rm "$mnt/probe"; }
check blksize-1MiB blksize_is_an_objects_worth

coherence_across_mounts() {
  (cd "$root/tests/e2e" && python3 objects.py "$mnt" "$mnt2") >&2
}
check coherence-two-mounts coherence_across_mounts

# setuid and setgid dropped by writes that go to objects as by the others (privs.py).
privs_on_objects() { (cd "$root/tests/e2e" && CREST_E2E_ROUNDS=10 python3 privs.py "$mnt" "$mnt2") >&2; }
check privileges-dropped-on-objects privs_on_objects

fsx_on_objects() {
  mkdir -p "$mnt/fsx" || return 1
  local mapped0
  mapped0=$(counter objects_mapped)
  local seed=${CREST_FSX_SEED:-$RANDOM}
  log "fsx seed $seed (CREST_FSX_SEED)"
  fsx -f "$root/tests/e2e/fsx-objects.toml" -N "${CREST_FSX_OBJECT_OPS:-2000}" -S "$seed" \
    -P "$work" "$mnt/fsx/file" >"$work/fsx.log" 2>&1
  local rc=$?
  tail -2 "$work/fsx.log" >&2; [ $rc = 0 ] || tail -40 "$work/fsx.log" >&2
  log "objects mapped by fsx: $(($(counter objects_mapped) - mapped0))"
  [ $rc = 0 ] && grep -q 'A-OK' "$work/fsx.log" && [ $(($(counter objects_mapped) - mapped0)) -gt 0 ]
}
check fsx-objects fsx_on_objects

# cp writes 1 MiB pieces (st_blksize): objects; B reads them back located, checked.
copy_goes_through_objects() {
  local mapped0 located0
  mapped0=$(counter objects_mapped) located0=$(counter reads_located)
  cp "$work/src" "$mnt/copied" && sync -f "$mnt/copied" || return 1
  cmp "$work/src" "$mnt2/copied" || return 1
  local mapped located written
  mapped=$(counter objects_mapped) located=$(counter reads_located) written=$(counter client_bytes_written)
  log "objects mapped $mapped0 -> $mapped, located reads $located0 -> $located, bytes through the server $written"
  [ $((mapped - mapped0)) -ge 48 ] && [ $((located - located0)) -gt 0 ]
}
check copy-through-objects copy_goes_through_objects

# A snapshot of object-backed files sent as a stream carries their data (the server reads
# the objects), and a copy received from it reads the same.
send_carries_object_data() {
  "$crest" snapshot create default@sent --server "$addr" >/dev/null || return 1
  "$crest" send default@sent --server "$addr" >"$work/stream" || return 1
  local size
  size=$(stat -c %s "$work/stream")
  log "stream of $size bytes"
  [ "$size" -gt $((48 << 20)) ] || return 1
  "$crest" receive copy --server "$addr" <"$work/stream" >/dev/null || return 1
  "$crest" mount -o own_session,dataset=copy@sent "$addr" "$mnt3" >/dev/null || return 1
  cmp "$work/src" "$mnt3/copied"
  local rc=$?
  unmount "$mnt3"
  "$crest" snapshot destroy default@sent --server "$addr" >/dev/null
  return $rc
}
check send-carries-object-data send_carries_object_data

# kill -9 of the server while a writer fsyncs: the writer's mount replays what the
# server had not made durable; the fsynced file is whole.
server_killed_mid_write() {
  dd if="$work/long" of="$mnt/k9" bs=1M conv=fsync status=none 2>"$work/dd.err" &
  local dd=$!
  sleep 0.$((2 + RANDOM % 5))
  kill -9 "$server"; wait "$server" 2>/dev/null; server=
  start_server || return 1
  wait "$dd" || { cat "$work/dd.err" >&2; return 1; }
  cmp "$work/long" "$mnt/k9" && cmp "$work/long" "$mnt2/k9"
}
check server-kill9-mid-write server_killed_mid_write

# kill -9 of a mount mid-upload: another mount never sees a partial object; every MiB
# of the file is either all the writer's bytes or a hole.
client_killed_mid_upload() {
  "$crest" mount -o own_session "$addr" "$mnt3" >/dev/null || return 1
  local pid
  pid=$(pgrep -f "crest mount .* $mnt3\$" | head -1)
  dd if="$work/long" of="$mnt3/kc" bs=1M status=none 2>/dev/null &
  local dd=$!
  sleep 0.$((3 + RANDOM % 5))
  kill -9 "$pid"; wait "$dd" 2>/dev/null
  umount -l "$mnt3" 2>/dev/null
  [ -e "$mnt/kc" ] || { log "(the create itself never reached the server)"; return 0; }
  python3 - "$work/long" "$mnt/kc" <<'PY'
import sys
src, got = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
M = 1 << 20
bad = [i for i in range(0, len(got), M) if got[i:i + M] not in (src[i:i + M][:len(got[i:i + M])], bytes(len(got[i:i + M])))]
print(f"{len(got)} bytes made it; {len(bad)} MiB pieces neither whole nor absent", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}
check client-kill9-mid-upload client_killed_mid_upload

# The data store stopped: a write to it fails with EIO once the mount's timeout passes
# (nothing hangs for ever), and what was written before still reads once it is back.
store_down_gives_eio() {
  "$crest" mount -o own_session --timeout 4 "$addr" "$mnt3" >/dev/null || return 1
  pkill -STOP -f "radosgw -c" || return 1
  local t0=$SECONDS rc
  dd if="$work/src" of="$mnt3/down" bs=1M count=2 status=none 2>"$work/down.err"
  rc=$?
  pkill -CONT -f "radosgw -c"
  log "dd exited $rc after $((SECONDS - t0)) s: $(head -c 200 "$work/down.err")"
  unmount "$mnt3"
  [ $rc != 0 ] && grep -q "Input/output error" "$work/down.err" && [ $((SECONDS - t0)) -lt 20 ] &&
    cmp "$work/src" "$mnt2/copied"
}
check store-down-eio store_down_gives_eio

# Everything removed: the collector deletes every object (the killed mount's grants go
# when its session is fenced), and fsck finds the bucket and the image in agreement.
collected_and_consistent() {
  rm -rf "${mnt:?}"/* && sync -f "$mnt" || return 1
  local n=-1
  for _ in $(seq 60); do
    n=$(objects_in_bucket) || return 1
    [ "$n" = 0 ] && break
    sleep 1
  done
  log "objects left in the bucket: $n (deleted by the collector: $(counter objects_deleted))"
  [ "$n" = 0 ] || return 1
  unmount "$mnt2"; unmount "$mnt"; stop_server
  "$crest" fsck "$img" >"$work/fsck.out" 2>&1
  local rc=$?
  cat "$work/fsck.out" >&2
  [ $rc = 0 ] && grep -q "0 orphans, 0 missing" "$work/fsck.out"
}
check collected-fsck-clean collected_and_consistent

# fsck names an object of the image nobody references (an orphan), and leaves alone
# keys of the bucket that are not the image's.
fsck_finds_orphans() {
  local under bucket=${CREST_DATA_URL#s3://}
  under=$(grep -o "under [^ :]*" "$work/fsck.out" | head -1 | cut -d' ' -f2)
  [ -n "$under" ] || return 1
  # (RGW wants x-amz-content-sha256, which curl's --aws-sigv4 does not add.)
  printf orphan >"$work/orphan"
  for key in "${under}000000fffffffff0" "$prefix/not-crest"; do
    curl -sf -o /dev/null --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
      -H "x-amz-content-sha256: $(sha256sum <"$work/orphan" | cut -d' ' -f1)" \
      -X PUT --data-binary "@$work/orphan" "$AWS_ENDPOINT_URL/$bucket/$key" || return 1
  done
  "$crest" fsck "$img" >"$work/fsck2.out" 2>&1
  cat "$work/fsck2.out" >&2
  grep -q "1 orphans, 0 missing" "$work/fsck2.out" && grep -q "${under}000000fffffffff0" "$work/fsck2.out"
}
check fsck-finds-orphans fsck_finds_orphans

log "$passed passed, $failed failed"
[ "$failed" = 0 ]
