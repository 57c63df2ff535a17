#!/usr/bin/env bash
# Datasets as a user meets them, on a real TLS server and real FUSE mounts (root):
#   crest dataset create/list/get/set/destroy (--json, --stdin, per-name failures);
#   mount -o dataset=NAME shows that tree only (its root's owner and mode, its own inode
#   numbers), a hard link between datasets is EXDEV, a dataset that does not exist is
#   refused; quota (EDQUOT, df shows it), readonly (EROFS, lifted again), atime=off (a
#   read moves no access time where the default dataset's does); destroy refused while
#   mounted; scrub finds a bad data block by path (reads give EIO) and rewrites a bad
#   metadata copy from its twin while the server runs; fsck finds a bad copy offline and
#   fsck --repair rewrites it; everything survives a server restart, and fsck is clean; a
#   snapshot asked for right after a kill -9 and restart holds what the mount replays.
# Each check prints PASS/FAIL; exits non-zero if any failed.
#   CREST_BIN   the crest binary (default target/release/crest)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-ds.XXXXXX)
export CREST_STATE_DIR=$tmp/state
fails=0
server=
mounts=("$tmp/m0" "$tmp/m1" "$tmp/m2" "$tmp/m3")

cleanup() {
  for m in "${mounts[@]}"; do
    grep -qF " $m " /proc/self/mountinfo && umount -l "$m" 2>/dev/null
  done
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "$*"; fi; }
# Damages one random byte of one copy of the (never changed, so never copied again) leaf
# of dataset $2's tree in image $1: its two copies are the only blocks of this file
# system whose header names that tree. Prints the damaged byte's offset.
damage_copy() {
  python3 - "$1" "$2" "$RANDOM" <<'PY'
import random, struct, sys
path, dataset, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
owner = 5 if dataset == 5 else (1 << 32) + dataset
with open(path, "r+b") as f:
    data = f.read()
    fsid = data[65536 + 52:65536 + 68]
    blocks = [b for b in range(len(data) // 4096)
              if data[b * 4096 + 32:b * 4096 + 48] == fsid
              and struct.unpack_from("<Q", data, b * 4096 + 64)[0] == owner]
    assert len(blocks) == 2 and data[blocks[0] * 4096:][:4096] == data[blocks[1] * 4096:][:4096], blocks
    rng = random.Random(seed)
    at = rng.choice(blocks) * 4096 + rng.randrange(80, 4096)
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    print(at, "seed", seed, file=sys.stderr)
PY
}
copies_equal() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
owner = 5 if int(sys.argv[2]) == 5 else (1 << 32) + int(sys.argv[2])
data = open(sys.argv[1], "rb").read()
fsid = data[65536 + 52:65536 + 68]
blocks = [data[b * 4096:][:4096] for b in range(len(data) // 4096)
          if data[b * 4096 + 32:b * 4096 + 48] == fsid and struct.unpack_from("<Q", data, b * 4096 + 64)[0] == owner]
sys.exit(0 if len(blocks) == 2 and blocks[0] == blocks[1] else 1)
PY
}
port=$(free_port)
addr=127.0.0.1:$port
ds() { "$crest" dataset --server "$addr" "$@"; }
serve() {
  "$crest" serve "$tmp/img" --listen "$addr" >>"$tmp/serve.log" 2>&1 &
  server=$!
  wait_listen "$port" || { echo "server did not start: $(tail -5 "$tmp/serve.log")"; exit 1; }
}
mkdir -p "${mounts[@]}"
"$crest" mkfs --size 256M "$tmp/img" >/dev/null
serve

echo "== create, list, get"
expect create-home 0 ds create home -o quota=1M -o user:team=ops --root 1000:1000:750
expect create-scratch 0 ds create scratch
expect create-na 0 ds create na -o atime=off
expect create-twice-refused 1 ds create home
mentions create-twice-says-exists "exists"
expect create-bad-name-refused 1 ds create "a/b"
expect create-bad-prop-refused 1 ds create other -o copies=3
run ds list --json
python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if sorted(x['name'] for x in d)==['default','home','na','scratch'] else 1)" <"$tmp/out" &&
  pass list-json || fail list-json "$(said)"
run ds get home quota --json
python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['properties']=={'quota':'1048576'} else 1)" <"$tmp/out" &&
  pass get-json || fail get-json "$(said)"
run ds get home
grep -q "user:team *ops" "$tmp/out" && pass get-all || fail get-all "$(said)"

echo "== mount them"
expect mount-default 0 "$crest" mount "$addr" "$tmp/m0"
expect mount-home 0 "$crest" mount "$addr" "$tmp/m1" -o dataset=home
expect mount-scratch 0 "$crest" mount "$addr" "$tmp/m2" -o dataset=scratch
expect mount-unknown-refused 32 "$crest" mount "$addr" "$tmp/m3" -o dataset=nope
mentions mount-unknown-says-why "no dataset"
expect mount-na 0 "$crest" mount "$addr" "$tmp/m3" -o dataset=na
check home-root-owner [ "$(stat -c '%u:%g:%a' "$tmp/m1")" = "1000:1000:750" ]
echo main >"$tmp/m0/f"
echo home >"$tmp/m1/f"
mkdir "$tmp/m1/d" && cp "$root/README.md" "$tmp/m1/d/"
check datasets-apart [ "$(cat "$tmp/m0/f")" = main ] && [ "$(cat "$tmp/m1/f")" = home ]
check scratch-empty [ -z "$(ls -A "$tmp/m2")" ]
check home-inode-range [ "$(stat -c %i "$tmp/m1/f")" -gt $((1 << 40)) ]
check readme-copied cmp -s "$root/README.md" "$tmp/m1/d/README.md"
run ln "$tmp/m1/f" "$tmp/m2/f"
[ "$rc" != 0 ] && grep -qi "cross-device" "$tmp/err" && pass link-across-exdev || fail link-across-exdev "$(said)"

echo "== quota, readonly, atime"
run dd if=/dev/zero of="$tmp/m1/big" bs=64K count=32 conv=fsync
[ "$rc" != 0 ] && grep -qi "quota" "$tmp/err" && pass quota-edquot || fail quota-edquot "$(said)"
size_k=$(df -k --output=size "$tmp/m1" | tail -1 | tr -d ' ')
check df-shows-quota [ "$size_k" -le 1024 ]
rm -f "$tmp/m1/big"
expect set-readonly 0 ds set home readonly=on
run touch "$tmp/m1/ro"
[ "$rc" != 0 ] && grep -qi "read-only" "$tmp/err" && pass readonly-erofs || fail readonly-erofs "$(said)"
expect clear-readonly 0 ds set home readonly=
expect write-after-readonly-cleared 0 touch "$tmp/m1/rw"
for m in m0 m3; do
  echo data >"$tmp/$m/t"
  sync
done
before0=$(stat -c %X "$tmp/m0/t"); before3=$(stat -c %X "$tmp/m3/t")
sleep 1.2
cat "$tmp/m0/t" "$tmp/m3/t" >/dev/null
check atime-moves-in-default [ "$(stat -c %X "$tmp/m0/t")" -gt "$before0" ]
check atime-off-keeps-it [ "$(stat -c %X "$tmp/m3/t")" = "$before3" ]

echo "== snapshots"
snap() { "$crest" snapshot --server "$addr" "$@"; }
mkdir -p "$tmp/m1/tree"
for i in $(seq 1 150); do echo "record $i" >"$tmp/m1/tree/r$i"; done
cp -r "$root/crates/store/src" "$tmp/m1/tree/src"
# Taken while the mount holds what it wrote (answered itself, not yet written back): the
# snapshot waits for that writeback.
expect snapshot-create 0 snap create home@one
echo changed >"$tmp/m1/tree/r1"
rm "$tmp/m1/tree/r2"
mkdir -p "$tmp/s1"
mounts+=("$tmp/s1")
expect mount-snapshot 0 "$crest" mount "$addr" "$tmp/s1" -o dataset=home@one
check snapshot-holds-what-was-acknowledged [ "$(cat "$tmp/s1/tree/r1")" = "record 1" ] && [ -e "$tmp/s1/tree/r2" ] &&
  [ "$(ls "$tmp/s1/tree" | wc -l)" = 151 ]
check snapshot-tree-equal diff -r "$root/crates/store/src" "$tmp/s1/tree/src"
check dataset-moved-on [ "$(cat "$tmp/m1/tree/r1")" = changed ] && [ ! -e "$tmp/m1/tree/r2" ]
run touch "$tmp/s1/new"
[ "$rc" != 0 ] && grep -qi "read-only" "$tmp/err" && pass snapshot-read-only || fail snapshot-read-only "$(said)"
expect snapshot-destroy-mounted-refused 1 snap destroy home@one
"$crest" umount "$tmp/s1"
seq 1 300 | sed 's/^/home@n/' >"$tmp/names"
expect snapshot-create-many 0 snap create --stdin <"$tmp/names"
run snap list --json
python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if len(d)==301 else 1)" <"$tmp/out" &&
  pass snapshot-list-json || fail snapshot-list-json "$(said)"
expect destroy-dataset-with-snapshots-refused 1 ds destroy home
expect rollback-mounted-refused 1 snap rollback home@n300
for _ in 1 2 3 4 5 6 7 8 9 10; do snap destroy home@one >/dev/null 2>&1 && break; sleep 0.3; done
expect snapshot-destroy-many 0 snap destroy --stdin <"$tmp/names"
run snap list
[ "$(wc -l <"$tmp/out")" = 1 ] && pass snapshots-gone || fail snapshots-gone "$(said)"

echo "== destroy"
expect destroy-mounted-refused 1 ds destroy scratch
mentions destroy-mounted-says-why "mounted"
"$crest" umount "$tmp/m2"
"$crest" umount "$tmp/m3"
run ds destroy --stdin <<<"scratch
na
nope"
[ "$rc" = 1 ] && grep -q "nope" "$tmp/err" && pass destroy-stdin-per-name || fail destroy-stdin-per-name "$(said)"
run ds list
! grep -qE "^(scratch|na) " "$tmp/out" && grep -q "^home " "$tmp/out" && pass destroyed-gone || fail destroyed-gone "$(said)"
expect destroy-default-refused 1 ds destroy default

echo "== rollback"
echo before >"$tmp/m1/rb"
expect snapshot-for-rollback 0 snap create home@rb
echo after >"$tmp/m1/rb"
echo more >"$tmp/m1/rb2"
"$crest" umount "$tmp/m1"
for _ in 1 2 3 4 5 6 7 8 9 10; do snap rollback home@rb >/dev/null 2>&1 && break; sleep 0.3; done
expect remount-after-rollback 0 "$crest" mount "$addr" "$tmp/m1" -o dataset=home
check rolled-back [ "$(cat "$tmp/m1/rb")" = before ] && [ ! -e "$tmp/m1/rb2" ]
"$crest" umount "$tmp/m1"
for _ in 1 2 3 4 5 6 7 8 9 10; do snap destroy home@rb >/dev/null 2>&1 && break; sleep 0.3; done
expect remount-home-again 0 "$crest" mount "$addr" "$tmp/m1" -o dataset=home

echo "== scrub"
expect scrub-clean 0 "$crest" scrub --server "$addr" --restart
mentions scrub-clean-says "0 not repairable"
python3 -c "import sys; sys.stdout.buffer.write(bytes((i * 7 + 3) % 251 for i in range(16384)))" >"$tmp/m1/victim"
sync -f "$tmp/m1/victim"
"$crest" umount "$tmp/m1"
sleep 0.5
python3 - "$tmp/img" <<'PY'
import sys
pat = bytes((i * 7 + 3) % 251 for i in range(16384))[:4096]
with open(sys.argv[1], "r+b") as f:
    data = f.read()
    at = data.find(pat)
    assert at >= 0, "victim block not found"
    f.seek(at + 123)
    b = f.read(1)
    f.seek(at + 123)
    f.write(bytes([b[0] ^ 0x20]))
PY
run "$crest" scrub --server "$addr" --json
[ "$rc" = 4 ] && python3 -c "import json,sys; d=json.load(sys.stdin); u=d['unrepaired']; sys.exit(0 if len(u)==1 and u[0]['dataset']=='home' and u[0]['path']=='/victim' else 1)" <"$tmp/out" &&
  pass scrub-finds-by-path || fail scrub-finds-by-path "$(said)"
expect remount-home-for-eio 0 "$crest" mount "$addr" "$tmp/m1" -o dataset=home
run cat "$tmp/m1/victim"
[ "$rc" != 0 ] && grep -qi "input/output" "$tmp/err" && pass damaged-read-eio || fail damaged-read-eio "$(said)"
rm -f "$tmp/m1/victim"

echo "== metadata copies"
expect create-dup 0 ds create dup
run ds list --json
dup=$(python3 -c "import json,sys; print([x['id'] for x in json.load(sys.stdin) if x['name']=='dup'][0])" <"$tmp/out")
# Its leaf reaches the disk with the next commit (at most the commit interval).
for _ in $(seq 60); do copies_equal "$tmp/img" "$dup" && break; sleep 0.2; done
check dup-leaf-in-two-copies copies_equal "$tmp/img" "$dup"
damage_copy "$tmp/img" "$dup"
copies_equal "$tmp/img" "$dup" && fail dup-copies-differ-after-damage "still equal" || pass dup-copies-differ-after-damage
run "$crest" scrub --server "$addr" --restart --json
[ "$rc" = 0 ] && python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['repaired_count']>=1 and not d['unrepaired'] else 1)" <"$tmp/out" &&
  pass scrub-repairs-a-metadata-copy || fail scrub-repairs-a-metadata-copy "$(said)"
check scrub-rewrote-the-copy copies_equal "$tmp/img" "$dup"
# A copies=2 dataset: a file's blocks are stored twice; one bad copy reads as if nothing
# happened, and scrub rewrites it.
expect create-copies-2 0 ds create c2 -o copies=2
expect mount-c2 0 "$crest" mount "$addr" "$tmp/m3" -o dataset=c2
python3 -c "import sys; sys.stdout.buffer.write(bytes((i * 13 + 5) % 253 for i in range(65536)))" >"$tmp/m3/twice"
sync -f "$tmp/m3/twice"
"$crest" umount "$tmp/m3"
sleep 0.5
data_copies() {
  python3 - "$@" <<'PY'
import random, sys
pat = bytes((i * 13 + 5) % 253 for i in range(65536))[8192:12288]
with open(sys.argv[1], "r+b") as f:
    data = f.read()
    at = [i for i in range(0, len(data), 4096) if data[i:i + 4096] == pat]
    if len(sys.argv) > 2:
        rng = random.Random(int(sys.argv[2]))
        victim = rng.choice(at) + rng.randrange(4096)
        f.seek(victim)
        f.write(bytes([data[victim] ^ 0x08]))
        print(victim, "seed", sys.argv[2], file=sys.stderr)
    print(len(at))
PY
}
check c2-block-in-two-copies [ "$(data_copies "$tmp/img")" = 2 ]
data_copies "$tmp/img" "$RANDOM" >/dev/null
expect remount-c2 0 "$crest" mount "$addr" "$tmp/m3" -o dataset=c2
python3 -c "import sys; sys.stdout.buffer.write(bytes((i * 13 + 5) % 253 for i in range(65536)))" >"$tmp/want"
check c2-reads-right-with-one-bad-copy cmp -s "$tmp/want" "$tmp/m3/twice"
"$crest" umount "$tmp/m3"
run "$crest" scrub --server "$addr" --restart --json
[ "$rc" = 0 ] && python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if not d['unrepaired'] else 1)" <"$tmp/out" &&
  pass c2-scrub-clean-after || fail c2-scrub-clean-after "$(said)"
check c2-both-copies-good-again [ "$(data_copies "$tmp/img")" = 2 ]

echo "== restart"
"$crest" umount "$tmp/m0"
"$crest" umount "$tmp/m1"
kill "$server"; wait "$server"; server=
damage_copy "$tmp/img" "$dup"
expect fsck-finds-a-bad-copy 4 "$crest" fsck "$tmp/img"
mentions fsck-names-the-copy "copy at block"
expect fsck-repair 1 "$crest" fsck --repair "$tmp/img"
mentions fsck-repair-says "repaired:"
check fsck-repair-rewrote-the-copy copies_equal "$tmp/img" "$dup"
expect fsck-clean 0 "$crest" fsck "$tmp/img"
serve
expect remount-home 0 "$crest" mount "$addr" "$tmp/m1" -o dataset=home
check home-kept [ "$(cat "$tmp/m1/f")" = home ] && cmp -s "$root/README.md" "$tmp/m1/d/README.md"
run ds get home user:team
grep -q ops "$tmp/out" && pass props-kept || fail props-kept "$(said)"

echo "== a snapshot across a crash and replay"
# Written and closed (acknowledged), not synced; the server is killed before it commits,
# restarted, and a snapshot asked for before the mount is back: it must wait for the
# mount to replay the write, and hold it.
printf 'acked' >"$tmp/m1/acked"
# The mount's daemon is held stopped across the restart so the snapshot surely comes
# first; it must still wait for the daemon's replay.
mpid=$(pgrep -f -- " $tmp/m1\$" | head -1)
kill -STOP "$mpid"
kill -9 "$server"; wait "$server" 2>/dev/null; server=
serve
snap create home@crash >"$tmp/snap-crash.out" 2>&1 &
snapper=$!
sleep 1
kill -CONT "$mpid"
wait "$snapper"
rc=$?
[ "$rc" = 0 ] && pass snapshot-across-a-crash || fail snapshot-across-a-crash "exit $rc: $(cat "$tmp/snap-crash.out")"
expect mount-snapshot-across-a-crash 0 "$crest" mount "$addr" "$tmp/m0" -o dataset=home@crash
check snapshot-holds-the-replayed-write [ "$(cat "$tmp/m0/acked" 2>/dev/null)" = acked ]
check live-dataset-holds-it-too [ "$(cat "$tmp/m1/acked")" = acked ]
"$crest" umount "$tmp/m0"
"$crest" umount "$tmp/m1"
echo "== datasets: $fails failed"
[ "$fails" = 0 ]
