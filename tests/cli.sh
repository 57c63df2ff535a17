#!/usr/bin/env bash
# The crest command as mkfs(8), fsck(8), mount(8) and umount(8) users expect it, run
# against the real binary, real images, a real server and real FUSE mounts (root):
#   fsck    exit 0 clean, 4 damage (either superblock copy, both, and their mirrors), 1 after
#           --repair rewrote damaged copies from their mirrors, 8 no image / not crest,
#           16 usage; --json is one valid JSON object in every case;
#   mkfs    refuses ext4 / XFS / swap / crest / random data without --force, naming it;
#           with --force wipes the old signature (blkid no longer sees it); empty is fine;
#   umount  refuses a tmpfs and an unmounted directory; -l detaches a busy crest mount;
#   mount   waits for the mount (readiness pipe): a dead port, an already mounted
#           directory and a peer that is no crest server fail non-zero without "mounted";
#           mount.fuse.crest is silent on success and exits 32 on failure; spaces in
#           paths; HOST alone means port 7410; syntax errors fail at once;
#   bench   every phase measured on a crest mount (--json, the table), nothing left behind.
# Each check prints PASS/FAIL; exits non-zero if any failed.
#   CREST_BIN   the crest binary (default target/release/crest)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-cli.XXXXXX)
fails=0
pids=()
mounts=()

cleanup() {
  # Unmount by mountinfo, not `mountpoint`: a mount whose server is gone answers ENOTCONN,
  # and a broken build may have stacked several mounts on one directory.
  for m in "${mounts[@]}"; do
    for _ in 1 2 3 4; do
      grep -qF " $(printf '%s' "$m" | sed 's/ /\\040/g') " /proc/self/mountinfo || break
      umount -l "$m" 2>/dev/null || break
    done
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp" "${CREST_STATE_DIR:-/var/lib/crest}/log/crest-mount$(printf '%s' "$tmp" | tr / _)"*.log
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
silent_about_mounted() {
  if grep -q "mounted on" "$tmp/out"; then fail "$1" "printed \"mounted\"; $(said)"; else pass "$1"; fi
}
# json NAME PYEXPR CMD...: stdout is one JSON object d for which PYEXPR holds.
json() {
  local name=$1 cond=$2; shift 2
  run "$@"
  if python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($cond) else 1)" <"$tmp/out"; then
    pass "$name"
  else
    fail "$name" "JSON not valid or not ($cond); $(said)"
  fi
}
# crest_mounted DIR: DIR is a fuse.crest mount point (mountinfo escapes spaces as \040).
crest_mounted() { grep -F " $(printf '%s' "$1" | sed 's/ /\\040/g') " /proc/self/mountinfo | grep -q " - fuse.crest "; }

echo "== fsck: exit codes and JSON"
img=$tmp/img
"$crest" mkfs --size 64M "$img" >/dev/null || { echo "mkfs failed" >&2; exit 1; }
expect fsck-clean-exit-0 0 "$crest" fsck "$img"
json fsck-clean-json "d['clean'] is True and d['exit_code'] == 0 and d['problems'] == []" "$crest" fsck --json "$img"
cp "$img" "$tmp/bad0"
printf 'garbage' | dd of="$tmp/bad0" bs=1 seek=$((64 * 1024 + 40)) conv=notrunc status=none
expect fsck-damaged-copy-1-exit-4 4 "$crest" fsck "$tmp/bad0"
mentions fsck-damaged-copy-1-named "(at byte 65536)"
json fsck-damaged-copy-1-json "d['clean'] is False and d['exit_code'] == 4 and any('byte 65536' in p for p in d['problems'])" \
  "$crest" fsck --json "$tmp/bad0"
cp "$img" "$tmp/bad1"
printf '\001' | dd of="$tmp/bad1" bs=1 seek=$((1024 * 1024 + 3000)) conv=notrunc status=none
expect fsck-damaged-copy-2-exit-4 4 "$crest" fsck "$tmp/bad1"
mentions fsck-damaged-copy-2-named "(at byte 1048576)"
json fsck-damaged-copy-2-json "d['clean'] is False and any('byte 1048576' in p for p in d['problems'])" "$crest" fsck --json "$tmp/bad1"
cp "$tmp/bad0" "$tmp/bad01"
printf 'garbage' | dd of="$tmp/bad01" bs=1 seek=$((1024 * 1024 + 40)) conv=notrunc status=none
cp "$tmp/bad01" "$tmp/bad01m"
# (Both slots damaged, their mirrors at 512 and 768 KiB too: nothing left to open.)
for off in $((512 * 1024 + 40)) $((768 * 1024 + 40)); do
  printf 'garbage' | dd of="$tmp/bad01" bs=1 seek=$off conv=notrunc status=none
done
expect fsck-both-copies-exit-4 4 "$crest" fsck "$tmp/bad01"
mentions fsck-both-copies-named "no valid superblock"
json fsck-both-copies-json "d['clean'] is False and d['exit_code'] == 4 and 'superblock' in d['error']" "$crest" fsck --json "$tmp/bad01"
expect fsck-repair-nothing-to-repair-from-exit-4 4 "$crest" fsck --repair "$tmp/bad01"
mentions fsck-repair-says-nothing-repaired "nothing repaired"
# Both slots damaged, their mirrors intact: the mirrors open it, fsck --repair rewrites
# the slots (exit 1, errors corrected) and the image is clean again.
expect fsck-slots-bad-mirrors-good-exit-4 4 "$crest" fsck "$tmp/bad01m"
expect fsck-repair-from-mirrors-exit-1 1 "$crest" fsck --repair "$tmp/bad01m"
mentions fsck-repair-names-what "repaired: superblock copy"
expect fsck-after-repair-exit-0 0 "$crest" fsck "$tmp/bad01m"
json fsck-repair-clean-json "d['exit_code'] == 0 and d['repaired_count'] == 0" "$crest" fsck --repair --json "$tmp/bad01m"
expect fsck-missing-file-exit-8 8 "$crest" fsck "$tmp/nonexistent"
json fsck-missing-file-json "d['clean'] is False and d['exit_code'] == 8 and 'error' in d" "$crest" fsck --json "$tmp/nonexistent"
truncate -s 16M "$tmp/zeros"
expect fsck-not-crest-exit-8 8 "$crest" fsck "$tmp/zeros"
json fsck-not-crest-json "d['exit_code'] == 8 and 'magic' in d['error']" "$crest" fsck --json "$tmp/zeros"
expect fsck-bad-flag-exit-16 16 "$crest" fsck --bogus "$img"
expect fsck-no-image-exit-16 16 "$crest" fsck
expect fsck-help-exit-0 0 "$crest" fsck --help

echo "== mkfs: refuses what holds data or a file system without --force, wipes it with"
expect mkfs-over-crest-refused 1 "$crest" mkfs "$img"
mentions mkfs-over-crest-named "crest file system"
truncate -s 64M "$tmp/ext4"
mkfs.ext4 -F -q "$tmp/ext4" >/dev/null 2>&1
expect mkfs-over-ext4-refused 1 "$crest" mkfs "$tmp/ext4"
mentions mkfs-over-ext4-named "ext2/ext3/ext4"
[ "$(blkid -p -o value -s TYPE "$tmp/ext4")" = ext4 ] && pass mkfs-refusal-leaves-ext4 || fail mkfs-refusal-leaves-ext4 "blkid: $(blkid -p "$tmp/ext4")"
expect mkfs-force-over-ext4 0 "$crest" mkfs --force "$tmp/ext4"
type=$(blkid -p -o value -s TYPE "$tmp/ext4" 2>/dev/null)
[ "$type" != ext4 ] && pass mkfs-force-wipes-ext4 || fail mkfs-force-wipes-ext4 "blkid still says $type"
expect mkfs-forced-image-is-clean 0 "$crest" fsck "$tmp/ext4"
truncate -s 64M "$tmp/xfs"
printf 'XFSB' | dd of="$tmp/xfs" conv=notrunc status=none
expect mkfs-over-xfs-refused 1 "$crest" mkfs "$tmp/xfs"
mentions mkfs-over-xfs-named "XFS"
expect mkfs-force-over-xfs 0 "$crest" mkfs --force --size 64M "$tmp/xfs"
[ "$(head -c 4 "$tmp/xfs" | tr -d '\0')" != XFSB ] && pass mkfs-force-wipes-xfs || fail mkfs-force-wipes-xfs "XFSB still at 0"
truncate -s 64M "$tmp/swap"
mkswap "$tmp/swap" >/dev/null 2>&1
expect mkfs-over-swap-refused 1 "$crest" mkfs "$tmp/swap"
mentions mkfs-over-swap-named "swap"
expect mkfs-force-over-swap 0 "$crest" mkfs --force "$tmp/swap"
type=$(blkid -p -o value -s TYPE "$tmp/swap" 2>/dev/null)
[ "$type" != swap ] && pass mkfs-force-wipes-swap || fail mkfs-force-wipes-swap "blkid still says $type"
truncate -s 64M "$tmp/random"
head -c 100000 /dev/urandom | dd of="$tmp/random" bs=1 seek=300000 conv=notrunc status=none
expect mkfs-over-data-refused 1 "$crest" mkfs "$tmp/random"
mentions mkfs-over-data-named "data (a non-zero byte at offset 3000"
expect mkfs-force-over-data 0 "$crest" mkfs --force "$tmp/random"
: >"$tmp/empty"
expect mkfs-on-empty-file 0 "$crest" mkfs --size 64M "$tmp/empty"
truncate -s 64M "$tmp/allzero"
expect mkfs-on-all-zero-file 0 "$crest" mkfs "$tmp/allzero"
# An image a server is serving: mkfs --force (with and without --size) is refused before
# it writes a byte (the image compared byte for byte), and the server's file system stays
# clean once it stops.
"$crest" mkfs --size 64M "$tmp/served" >/dev/null
"$crest" serve "$tmp/served" --listen 127.0.0.1:0 >"$tmp/serve-served.log" 2>&1 &
served=$!
pids+=("$served")
for _ in $(seq 100); do grep -qs "serving" "$tmp/serve-served.log" && break; sleep 0.05; done
before=$(sha256sum <"$tmp/served")
expect mkfs-force-on-served-image-refused 1 "$crest" mkfs --force "$tmp/served"
mentions mkfs-force-on-served-image-named "in use by another crest process"
expect mkfs-force-size-on-served-image-refused 1 "$crest" mkfs --force --size 32M "$tmp/served"
[ "$(sha256sum <"$tmp/served")" = "$before" ] && pass mkfs-refusal-leaves-served-image-unchanged ||
  fail mkfs-refusal-leaves-served-image-unchanged "the image changed"
kill "$served"; wait "$served" 2>/dev/null
expect mkfs-refused-served-image-is-clean 0 "$crest" fsck "$tmp/served"

echo "== umount: only fuse.crest mounts"
mkdir -p "$tmp/tmpfs"
if mount -t tmpfs crest-cli-test "$tmp/tmpfs"; then
  mounts+=("$tmp/tmpfs")
  expect umount-refuses-tmpfs 32 "$crest" umount "$tmp/tmpfs"
  mentions umount-refuses-tmpfs-named "tmpfs"
  mountpoint -q "$tmp/tmpfs" && pass umount-leaves-tmpfs-mounted || fail umount-leaves-tmpfs-mounted "tmpfs is gone"
  expect umount-refuses-tmpfs-lazily 32 "$crest" umount -l "$tmp/tmpfs"
  umount "$tmp/tmpfs"
else
  fail umount-refuses-tmpfs "cannot mount a tmpfs to test with (not root?)"
fi
expect umount-not-mounted 32 "$crest" umount "$tmp/tmpfs"
mentions umount-not-mounted-named "not mounted"

echo "== mount against a real server"
port=$(free_port)
"$crest" serve "$img" --listen "127.0.0.1:$port" >"$tmp/serve.log" 2>&1 &
server=$!
pids+=("$server")
wait_listen "$port" || { cat "$tmp/serve.log" >&2; echo "server did not start" >&2; exit 1; }
mnt="$tmp/mnt with spaces"
mkdir -p "$mnt" "$tmp/m2" "$tmp/m3"
mounts+=("$mnt" "$tmp/m2" "$tmp/m3")
expect mount-spaces 0 "$crest" mount "127.0.0.1:$port" "$mnt"
mentions mount-says-mounted "mounted on $mnt"
crest_mounted "$mnt" && pass mount-spaces-in-mountinfo || fail mount-spaces-in-mountinfo "$(grep crest /proc/self/mountinfo)"
echo hello >"$mnt/file" && [ "$(cat "$mnt/file")" = hello ] && pass mount-spaces-works || fail mount-spaces-works "no round trip"
# crest status: the server names this mount's session, its certificate and dataset.
run "$crest" status --server "127.0.0.1:$port" --json
cp "$tmp/out" "$tmp/status.json"
python3 - "$tmp/out" "$mnt" <<'PY' && pass status-json || fail status-json "$(said)"
import json, sys
d = json.load(open(sys.argv[1]))
mine = [s for s in d["sessions"] if s["client"].endswith(":" + sys.argv[2])]
assert len(mine) == 1, d["sessions"]
assert mine[0]["connected"] and mine[0]["identity"] == "local" and mine[0]["dataset"] == "default", mine
assert d["sessions_total"] == len(d["sessions"]) >= 1 and not d["grace"], d
# The server's release, the protocol range and the version this mount speaks (the newest).
newest = d["protocols"].split("-")[1]
assert d["release"].startswith("crest ") and str(mine[0]["protocol"]) == newest, (d["release"], d["protocols"], mine)
assert 0 <= d["uptime_secs"] < 3600, d["uptime_secs"]
# What the session holds and when it was last heard (a connected mount: within its lease),
# space, and the counters since start.
assert mine[0]["heard_ms_ago"] is not None and mine[0]["heard_ms_ago"] < 30_000, mine
assert all(isinstance(mine[0][k], int) for k in ("rights_shared", "rights_exclusive", "open_handles")), mine
assert 0 < d["space_free_bytes"] <= d["space_total_bytes"], d
assert isinstance(d["errors"], dict) and all(k.startswith("E") for k in d["errors"]), d["errors"]
assert all(isinstance(d[k], int) for k in ("client_bytes_written", "client_bytes_read", "recalls", "fences")), d
assert d["service"] and all(v["count"] >= 1 for v in d["service"].values()), d["service"]
assert mine[0]["address"].startswith("127.0.0.1:") and mine[0]["changes_in_flight"] >= 0, mine
assert d["image"].endswith("/img"), d["image"]
assert [x["name"] for x in d["datasets"]] == ["default"] and d["datasets"][0]["inodes"] >= 2, d["datasets"]
assert sum(d["served"].values()) >= 1, d["served"]
PY
run "$crest" status --server "127.0.0.1:$port"
mentions status-table "(1 connected)"
mentions status-table-client "$mnt"
mentions status-table-release ", protocol "
mentions status-table-space "GiB free of"
mentions status-table-rights "RIGHTS S/X"
mentions status-table-datasets "datasets: default ("
# The mount's own view: its session (the one the server lists for it), its cache.
server_session=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([s["id"] for s in d["sessions"] if s["client"].endswith(":"+sys.argv[2])][0])' "$tmp/status.json" "$mnt" 2>/dev/null)
ls "$mnt" >/dev/null
run "$crest" status --mount "$mnt" --json
python3 - "$tmp/out" "$port" "$server_session" <<'PY' && pass mount-status-json || fail mount-status-json "$(said)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["connection"] == "open" and d["server"].endswith(":" + sys.argv[2]), d
assert str(d["session"]) == sys.argv[3] and d["protocol"] >= 14 and d["server_release"].startswith("crest "), d
assert d["cache"]["names"] >= 1 and d["calls_waiting"] >= 0, d
assert d["lookups"]["cached"] + d["lookups"]["sent"] >= 1, d
PY
run "$crest" status --mount "$mnt"
mentions mount-status-table "cache: "
run "$crest" status --mount "$mnt" --prometheus
python3 - "$tmp/out" "$mnt" <<'PY' && pass mount-status-prometheus || fail mount-status-prometheus "$(said)"
import sys
samples = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    name_labels, value = line.rsplit(" ", 1)
    name, labels = name_labels.split("{", 1)
    assert labels == 'mount="%s"}' % sys.argv[2], labels
    samples[name] = int(value)
assert samples["crest_mount_connected"] == 1 and samples["crest_mount_cache_names"] >= 1, samples
assert len(samples) == 11, samples
assert samples["crest_mount_lookups_cached_total"] + samples["crest_mount_lookups_sent_total"] >= 1, samples
PY
expect mount-status-prometheus-needs-mount 2 "$crest" status --prometheus
# A mount daemon's own Prometheus endpoint (-o metrics=ADDR).
mport=$(free_port)
mkdir -p "$tmp/m-metrics"
mounts+=("$tmp/m-metrics")
expect mount-with-metrics 0 "$crest" mount -o "metrics=127.0.0.1:$mport" "127.0.0.1:$port" "$tmp/m-metrics"
ls "$tmp/m-metrics" >/dev/null
python3 - "$mport" "$tmp/m-metrics" <<'PY' && pass mount-metrics-endpoint || fail mount-metrics-endpoint "see above"
import sys, urllib.request, urllib.error
base = f"http://127.0.0.1:{sys.argv[1]}"
page = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
assert f'crest_mount_connected{{mount="{sys.argv[2]}"}} 1' in page.splitlines(), page
try:
    urllib.request.urlopen(base + "/", timeout=10)
    raise SystemExit("/ answered")
except urllib.error.HTTPError as e:
    assert e.code == 404, e.code
PY
expect mount-metrics-bad-address 32 "$crest" mount -o "metrics=nowhere" "127.0.0.1:$port" "$tmp/m2"
mentions mount-metrics-bad-address-said "metrics=IP:PORT"
"$crest" umount "$tmp/m-metrics"
expect mount-status-not-crest 1 "$crest" status --mount /proc
python3 -c 'import os, sys; names = os.listxattr(sys.argv[1]); sys.exit(1 if "crest.status" in names else 0)' "$mnt" &&
  pass mount-status-not-listed || fail mount-status-not-listed "listed, or listxattr failed"
# crest stats while the mount works: its creates show up per second, with their times.
( for i in $(seq 400); do echo "$i" >"$mnt/stats-$i"; sync -f "$mnt" 2>/dev/null; done ) &
busy=$!
run "$crest" stats --server "127.0.0.1:$port" --interval 0.3 --count 4 --json
wait "$busy"
rm -f "$mnt"/stats-*
python3 - "$tmp/out" <<'PY' && pass stats-json || fail stats-json "$(said)"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 4, lines
busy = [l for l in lines if l["ops_per_sec"] > 0]
assert busy, lines
# Some kind was served with a time measured, and the rates add up.
timed = [k for l in busy for k in l["kinds"].values() if k["mean_us"] is not None]
assert timed and all(t["mean_us"] >= 0 for t in timed), busy
for l in busy:
    assert abs(sum(k["ops_per_sec"] for k in l["kinds"].values()) - l["ops_per_sec"]) < 1e-6 * max(1, l["ops_per_sec"]), l
    assert l["sessions_connected"] >= 1, l
PY
run "$crest" stats --server "127.0.0.1:$port" --interval 0.2 --count 2
[ "$rc" = 0 ] && [ "$(wc -l <"$tmp/out")" = 3 ] && grep -q "ops/s" "$tmp/out" && pass stats-table || fail stats-table "$(said)"
expect stats-interval-too-short 1 "$crest" stats --server "127.0.0.1:$port" --interval 0.01 --count 1
# crest bench on the mount: every phase measured, nothing left behind.
run "$crest" bench "$mnt" --big-size 3M --block-size 64K --small-size 3000 --small-count 40 --fsync-count 5 -p 2 --json
python3 - "$tmp/out" <<'PY' && pass bench-json || fail bench-json "$(said)"
import json, sys
d = json.load(open(sys.argv[1]))
phases = {r["phase"]: r for r in d["results"]}
want = {"write big file": 96, "read big file": 96, "write small files": 80, "read small files": 80,
        "stat small files": 80, "4 KiB write + fsync": 10, "delete small files": 80}
assert {k: v["ops"] for k, v in phases.items()} == want, phases
assert phases["read big file"]["bytes"] == 2 * 3 * 1024 * 1024
assert all(v["ops_per_s"] > 0 and v["latency_us"]["max"] >= v["latency_us"]["p50"] for v in phases.values())
PY
[ "$(ls -A "$mnt")" = file ] && pass bench-cleans-up || fail bench-cleans-up "$(ls -A "$mnt")"
run "$crest" bench "$mnt" --big-size 1M --small-count 3 --fsync-count 1
grep -q "^write big file" "$tmp/out" && grep -q "^delete small files" "$tmp/out" && pass bench-table || fail bench-table "$(said)"
expect bench-bad-size 1 "$crest" bench "$mnt" --big-size 3Q
expect mount-already-mounted 32 "$crest" mount "127.0.0.1:$port" "$mnt"
mentions mount-already-mounted-named "already mounted"
silent_about_mounted mount-already-mounted-no-mounted
# A busy mount (a process has its cwd in it): -l detaches it anyway.
(cd "$mnt" && exec sleep 30) &
busy=$!
pids+=("$busy")
sleep 0.2
expect umount-lazy-busy 0 "$crest" umount -l "$mnt"
crest_mounted "$mnt" && fail umount-lazy-gone "still in mountinfo" || pass umount-lazy-gone
kill "$busy" 2>/dev/null
expect mount-again-after-lazy 0 "$crest" mount "127.0.0.1:$port" "$mnt"
expect umount-spaces 0 "$crest" umount "$mnt"
crest_mounted "$mnt" && fail umount-spaces-gone "still in mountinfo" || pass umount-spaces-gone
# crest umount returns once the mount's daemon has ended its session (what it wrote made
# durable, goodbye said): a server restarted right after has no session to wait for.
daemon_of() {  # the pids whose last argument is $1 (a mount daemon's is its mount point)
  for c in /proc/[0-9]*/cmdline; do
    [ "$(tr '\0' '\n' <"$c" 2>/dev/null | tail -n 1)" = "$1" ] && basename "$(dirname "$c")"
  done
}
expect mount-to-leave 0 "$crest" mount "127.0.0.1:$port" "$mnt"
head -c 3M /dev/urandom >"$mnt/last"
sum=$(md5sum <"$mnt/last")
expect umount-waits 0 "$crest" umount "$mnt"
kill "$server"
left=$(daemon_of "$mnt")
[ -z "$left" ] && pass umount-daemon-gone || fail umount-daemon-gone "still running: $left"
wait "$server" 2>/dev/null
"$crest" -v serve "$img" --listen "127.0.0.1:$port" >"$tmp/serve2.log" 2>&1 &
server=$!
pids+=("$server")
wait_listen "$port" || { cat "$tmp/serve2.log" >&2; echo "server did not start again" >&2; exit 1; }
grep -q "session restored" "$tmp/serve2.log" && fail umount-session-ended "$(grep restored "$tmp/serve2.log")" ||
  pass umount-session-ended
expect mount-after-restart 0 "$crest" mount "127.0.0.1:$port" "$mnt"
[ "$(md5sum <"$mnt/last")" = "$sum" ] && pass umount-kept-last-write || fail umount-kept-last-write "differs"
rm -f "$mnt/last"
expect umount-after-restart 0 "$crest" umount "$mnt"

echo "== mount helper (argv[0] mount.fuse.crest, as mount(8) runs it)"
mkdir -p "$tmp/bin"
ln -s "$crest" "$tmp/bin/mount.fuse.crest"
expect helper-success-exit-0 0 "$tmp/bin/mount.fuse.crest" "127.0.0.1:$port" "$tmp/m2" -o rw,_netdev
[ ! -s "$tmp/out" ] && [ ! -s "$tmp/err" ] && pass helper-success-silent || fail helper-success-silent "$(said)"
crest_mounted "$tmp/m2" && pass helper-mounted || fail helper-mounted "not in mountinfo"
expect helper-already-mounted-exit-32 32 "$tmp/bin/mount.fuse.crest" "127.0.0.1:$port" "$tmp/m2"
"$crest" umount "$tmp/m2"
expect mount-unknown-option-refused 32 "$crest" mount -o rw,bogus,noexec "127.0.0.1:$port" "$tmp/m2"
mentions mount-unknown-option-named '"bogus"'
crest_mounted "$tmp/m2" && { fail mount-unknown-option-not-mounted "mounted"; "$crest" umount "$tmp/m2"; } ||
  pass mount-unknown-option-not-mounted
expect helper-unknown-option-refused 32 "$tmp/bin/mount.fuse.crest" "127.0.0.1:$port" "$tmp/m2" -o rw,x-systemd.automount,bogus

echo "== mount(8) and its helper: suid and dev only when asked (crest.suid, crest.dev)"
# mount(8) runs /sbin/mount.fuse.crest; in a mount namespace of its own, /sbin holds just
# this build's helper. mount(8) keeps suid and dev (its defaults) from a helper.
mkdir -p "$tmp/sbin"
ln -sf "$crest" "$tmp/sbin/mount.fuse.crest"
mount8() { # OPTIONS: mount -t fuse.crest with them; the mount's options, then unmounted
  unshare -m --propagation private sh -c '
    mount --bind "$1" /sbin && mount -t fuse.crest ${2:+-o "$2"} "$3" "$4" || exit 32
    grep -F " $4 " /proc/self/mountinfo | cut -d" " -f6; "$5" umount "$4"' _ \
    "$tmp/sbin" "$1" "127.0.0.1:$port" "$tmp/m2" "$crest"
}
run mount8 ""
case ",$(cat "$tmp/out")," in *,nosuid,*nodev,*|*,nodev,*nosuid,*) pass mount8-default-nosuid-nodev ;;
  *) fail mount8-default-nosuid-nodev "$(said)" ;; esac
run mount8 "crest.suid,crest.dev"
if [ "$rc" = 0 ] && [ -s "$tmp/out" ] && ! grep -qE 'nosuid|nodev' "$tmp/out"; then pass mount8-crest-suid-dev
else fail mount8-crest-suid-dev "$(said)"; fi
expect mount8-unknown-option-32 32 mount8 "bogus"
# A remount through mount(8) hands the helper the mount's current options (user_id=0,...).
remount8() {
  unshare -m --propagation private sh -c '
    mount --bind "$1" /sbin && mount -t fuse.crest "$2" "$3" && mount -o remount,ro "$3" || exit 32
    grep -F " $3 " /proc/self/mountinfo | cut -d" " -f6; "$4" umount "$3"' _ \
    "$tmp/sbin" "127.0.0.1:$port" "$tmp/m2" "$crest"
}
run remount8
if [ "$rc" = 0 ] && grep -q '^ro' "$tmp/out"; then pass mount8-remount-ro; else fail mount8-remount-ro "$(said)"; fi

echo "== mount failures: dead port, syntax, not a crest server"
dead=$(free_port)
# Both dead-port mounts wait out the connect timeout (10 s): run them side by side.
("$crest" mount "127.0.0.1:$dead" "$tmp/m2" >"$tmp/dead.out" 2>"$tmp/dead.err"; echo $? >"$tmp/dead.rc") &
("$tmp/bin/mount.fuse.crest" "127.0.0.1:$dead" "$tmp/m3" >"$tmp/hdead.out" 2>"$tmp/hdead.err"; echo $? >"$tmp/hdead.rc") &
# Syntax errors fail at once, before any daemon starts.
start=$(date +%s%N)
expect mount-bad-port 32 "$crest" mount "127.0.0.1:99999" "$tmp/m3"
mentions mount-bad-port-named "bad server address"
expect mount-bad-host 32 "$crest" mount "no host!:1" "$tmp/m3"
expect mount-bad-option 32 "$crest" mount -o "ro, rw" "127.0.0.1:$port" "$tmp/m3"
mentions mount-bad-option-named "bad mount option"
expect helper-bad-usage-exit-1 1 "$tmp/bin/mount.fuse.crest" "127.0.0.1:$port"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$ms" -lt 3000 ] && pass syntax-errors-at-once || fail syntax-errors-at-once "took $ms ms"
# Peers that are no crest server: an HTTP server, one that sends garbage, one that hangs up.
cat >"$tmp/peer.py" <<'EOF'
import socket, sys
mode, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen(16)
while True:
    c, _ = s.accept()
    if mode == "http":
        c.recv(4096); c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    elif mode == "garbage":
        c.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    c.close()
EOF
for mode in http garbage close; do
  p=$(free_port)
  python3 "$tmp/peer.py" $mode "$p" &
  pids+=("$!")
  wait_listen "$p"
  start=$(date +%s)
  expect "mount-$mode-peer-fails" 32 "$crest" mount "127.0.0.1:$p" "$tmp/m3"
  mentions "mount-$mode-peer-named" "127.0.0.1:$p is not a crest server"
  silent_about_mounted "mount-$mode-peer-no-mounted"
  [ $(($(date +%s) - start)) -lt 5 ] && pass "mount-$mode-peer-at-once" || fail "mount-$mode-peer-at-once" "took $(($(date +%s) - start)) s"
done
wait_for() { for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
wait_for "$tmp/dead.rc"
rc=$(cat "$tmp/dead.rc"); cp "$tmp/dead.out" "$tmp/out"; cp "$tmp/dead.err" "$tmp/err"
[ "$rc" = 32 ] && pass mount-dead-port-exit-32 || fail mount-dead-port-exit-32 "$(said)"
mentions mount-dead-port-refused "connection refused"
silent_about_mounted mount-dead-port-no-mounted
crest_mounted "$tmp/m2" && fail mount-dead-port-not-mounted "mounted anyway" || pass mount-dead-port-not-mounted
wait_for "$tmp/hdead.rc"
rc=$(cat "$tmp/hdead.rc"); cp "$tmp/hdead.out" "$tmp/out"; cp "$tmp/hdead.err" "$tmp/err"
[ "$rc" = 32 ] && pass helper-failure-exit-32 || fail helper-failure-exit-32 "$(said)"
[ ! -s "$tmp/out" ] && pass helper-failure-no-stdout || fail helper-failure-no-stdout "$(said)"

echo "== HOST alone means the default port (7410)"
if python3 -c "import socket; socket.create_connection(('127.0.0.1', 7410), 0.5)" 2>/dev/null; then
  echo "SKIP mount-default-port: something already listens on 127.0.0.1:7410"
else
  "$crest" mkfs --size 64M "$tmp/img2" >/dev/null
  "$crest" serve "$tmp/img2" >"$tmp/serve2.log" 2>&1 &
  pids+=("$!")
  wait_listen 7410
  expect mount-default-port 0 "$crest" mount 127.0.0.1 "$tmp/m3"
  grep -F " $tmp/m3 " /proc/self/mountinfo | grep -q " - fuse.crest 127.0.0.1:7410 " && pass mount-default-port-source ||
    fail mount-default-port-source "$(grep -F "$tmp/m3" /proc/self/mountinfo)"
  "$crest" umount "$tmp/m3"
fi

kill "$server"
wait "$server"
expect fsck-after-serving 0 "$crest" fsck "$img"
echo "== cli: $fails failed"
[ "$fails" = 0 ]
