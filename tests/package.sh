#!/usr/bin/env bash
# crest's Debian package as an administrator meets it (root): built (packaging/deb.sh),
# installed with dpkg on this machine, then used only through what it installed:
#   - the files are where Debian puts them (binary, mount helper link, unit, man pages,
#     completions) and /var/lib/crest is private;
#   - the unit's own ExecStart serves an image on a second network (a veth pair) with
#     metrics on loopback;
#   - a second "machine" (another network namespace, its own state directory) joins with
#     a token and mounts; the server's host mounts through `mount -t fuse.crest`; what one
#     writes the other reads;
#   - `crest status` and the metrics page see both sessions; the server restarted under
#     the mounts (as a package upgrade restarts it) loses nothing;
#   - unmounted, the image is clean; `dpkg --purge` removes the package and keeps the image.
# Leaves the machine as it found it: refuses to run where a crest package is installed,
# keeps the credentials of both "machines" in its own directories (CREST_STATE_DIR, as an
# instance's EnvironmentFile may set it), puts back /var/lib/crest's mode (or removes it
# if the package made it) and the mount helper link as they were. Each check prints
# PASS/FAIL; exits non-zero if any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "package.sh: needs root (dpkg, mounts, network namespaces)" >&2; exit 2; }
if dpkg-query -W -f '${Status}' crest 2>/dev/null | grep -q " installed$"; then
  echo "package.sh: a crest package is installed here; this test installs and removes its own: dpkg -r crest first" >&2
  exit 1
fi
state_mode=$(stat -c %a /var/lib/crest 2>/dev/null)
helper_link=$(readlink /sbin/mount.fuse.crest 2>/dev/null)
tmp=$(mktemp -d /tmp/crest-pkg.XXXXXX)
fails=0
server=
mounts=()
ns=crest-pkg$$
veth=cpk$$
inst=pkgtest$$
img=/var/lib/crest/images/$inst.img
installed=

cleanup() {
  unmount_all "${mounts[@]}"
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  ip link del "${veth}h" 2>/dev/null
  [ -n "$installed" ] && dpkg --purge crest >/dev/null 2>&1
  rm -f "$img"
  if [ -z "$state_mode" ]; then
    rm -rf /var/lib/crest
  else
    chmod "$state_mode" /var/lib/crest
  fi
  # (dpkg --purge took the helper link scripts/install.sh had made, if any.)
  if [ -n "$helper_link" ]; then ln -sfn "$helper_link" /sbin/mount.fuse.crest; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"

echo "== build"
deb=$(bash "$root/packaging/deb.sh" | tail -1)
[ -f "$root/$deb" ] || { echo "FAIL package-built: packaging/deb.sh printed '$deb'" >&2; exit 1; }
deb=$root/$deb
pass package-built
dpkg-deb -c "$deb" | awk '{print $6}' >"$tmp/contents"
for f in ./usr/bin/crest ./sbin/mount.fuse.crest ./lib/systemd/system/crest-server@.service \
  ./usr/share/man/man1/crest.1.gz ./usr/share/man/man1/crest-serve.1.gz \
  ./usr/share/bash-completion/completions/crest ./usr/share/zsh/vendor-completions/_crest \
  ./usr/share/fish/vendor_completions.d/crest.fish; do
  grep -qx -- "$f" "$tmp/contents" && pass "contains-$f" || fail "contains-$f" "$(cat "$tmp/contents")"
done
dpkg-deb -f "$deb" Depends | grep -q fuse3 && pass depends-fuse3 || fail depends-fuse3 "$(dpkg-deb -f "$deb" Depends)"

echo "== install"
expect dpkg-install 0 dpkg -i "$deb"
installed=1
[ "$(/usr/bin/crest version | sed -n 's/^commit: //p')" = "$("$root/target/release/crest" version | sed -n 's/^commit: //p')" ] &&
  pass installed-binary-is-this-build || fail installed-binary-is-this-build "$(/usr/bin/crest version)"
[ "$(readlink /sbin/mount.fuse.crest)" = /usr/bin/crest ] && pass mount-helper-link ||
  fail mount-helper-link "$(ls -l /sbin/mount.fuse.crest)"
[ "$(stat -c %a /var/lib/crest)" = 700 ] && pass state-dir-private || fail state-dir-private "$(stat -c %a /var/lib/crest)"
# (Without man(1) installed, systemd-analyze says so about Documentation=; nothing else.)
systemd-analyze verify "/lib/systemd/system/crest-server@.service" >"$tmp/verify" 2>&1
grep -v "Command 'man " "$tmp/verify" | grep -q . && fail unit-verifies "$(cat "$tmp/verify")" || pass unit-verifies

echo "== the unit's server, on a network of its own"
# (The host's credentials in a directory of the test's own: the server's CA, the token,
# the host's mount. systemd would pass it from /etc/crest/server-NAME.env.)
export CREST_STATE_DIR=$tmp/host
ip netns add "$ns" && ip link add "${veth}h" type veth peer name "${veth}c" && ip link set "${veth}c" netns "$ns" &&
  ip addr add 10.77.0.1/24 dev "${veth}h" && ip link set "${veth}h" up &&
  ip netns exec "$ns" ip addr add 10.77.0.2/24 dev "${veth}c" && ip netns exec "$ns" ip link set "${veth}c" up &&
  ip netns exec "$ns" ip link set lo up || { echo "FAIL netns: cannot make the second machine's network" >&2; exit 1; }
port=$(free_port)
mport=$(free_port)
addr=10.77.0.1:$port
/usr/bin/crest mkfs --size 256M "$img" >/dev/null || { echo "FAIL mkfs" >&2; exit 1; }
# What systemd would run for crest-server@$inst with CREST_SERVE_ARGS set.
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/crest-server@.service)
exec_start=${exec_start//%i/$inst}
exec_start=${exec_start//\$CREST_SERVE_ARGS/--listen $addr --metrics 127.0.0.1:$mport}
echo "ExecStart: $exec_start"
start() {
  # shellcheck disable=SC2086
  $exec_start >>"$tmp/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/10.77.0.1/$port") 2>/dev/null && return 0; sleep 0.05; done
  fail server-listens "$(tail -5 "$tmp/serve.log")"
  return 1
}
start || exit 1
pass server-listens

echo "== a second machine joins and mounts; the server's host mounts with mount -t fuse.crest"
there() { CREST_STATE_DIR=$tmp/machine2 nsenter --net="/run/netns/$ns" /usr/bin/crest "$@"; }
run /usr/bin/crest token create --ttl 10m
token=$(cat "$tmp/out")
expect machine2-joins 0 there join "$addr" "$token"
mkdir -p "$tmp/m2" "$tmp/m1"
mounts+=("$tmp/m2" "$tmp/m1")
expect machine2-mounts 0 there mount "$addr" "$tmp/m2"
expect host-mounts-with-mount-t 0 mount -t fuse.crest "$addr" "$tmp/m1"
# (The other machine's root is squashed to an anonymous user by default: it writes where
# the host lets anyone.)
mkdir -m 1777 "$tmp/m1/shared"
touch "$tmp/m2/not-allowed" 2>/dev/null && fail machine2-root-squashed "wrote in the root directory" ||
  pass machine2-root-squashed
head -c 300000 /dev/urandom >"$tmp/blob"
cp "$tmp/blob" "$tmp/m2/shared/blob" && sync -f "$tmp/m2"
cmp -s "$tmp/blob" "$tmp/m1/shared/blob" && pass host-reads-machine2s-file || fail host-reads-machine2s-file "differs"
echo "from the host" >"$tmp/m1/shared/note"
[ "$(cat "$tmp/m2/shared/note" 2>/dev/null)" = "from the host" ] && pass machine2-reads-hosts-file ||
  fail machine2-reads-hosts-file "$(cat "$tmp/m2/shared/note")"

echo "== watched: status and metrics"
run /usr/bin/crest status --server "$addr" --json
python3 - "$tmp/out" <<'PY' && pass status-sees-both || fail status-sees-both "$(said)"
import json, sys
d = json.load(open(sys.argv[1]))
connected = [s for s in d["sessions"] if s["connected"]]
assert len(connected) == 2, d["sessions"]
# The host's own certificate and the joined machine's.
assert sorted(s["identity"] == "local" for s in connected) == [False, True], connected
PY
python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
  "http://127.0.0.1:$mport/metrics" >"$tmp/metrics" 2>&1
grep -q '^crest_sessions{state="connected"} 2$' "$tmp/metrics" && pass metrics-see-both || fail metrics-see-both "$(head -c 600 "$tmp/metrics")"
# The Grafana dashboard in the repository asks only for series this server exports.
python3 - "$root/packaging/grafana/crest-server.json" "$tmp/metrics" <<'PY' && pass dashboard-matches-metrics ||
import json, re, sys
dash = json.load(open(sys.argv[1]))
exported = {l.split("{")[0].split(" ")[0] for l in open(sys.argv[2]) if l.startswith("crest_")}
ids = [p["id"] for p in dash["panels"]]
assert len(ids) == len(set(ids)) and dash["uid"], ids
asked = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"\bcrest_[a-z_]+", t["expr"])}
assert asked and asked <= exported, sorted(asked - exported)
PY
  fail dashboard-matches-metrics "see above"

echo "== the server restarted under both mounts"
kill -TERM "$server"; wait "$server" 2>/dev/null; server=
start || exit 1
echo "after the restart" >"$tmp/m2/shared/after"
[ "$(cat "$tmp/m1/shared/after" 2>/dev/null)" = "after the restart" ] && pass both-carry-on ||
  fail both-carry-on "$(cat "$tmp/m1/shared/after")"
cmp -s "$tmp/blob" "$tmp/m1/shared/blob" && cmp -s "$tmp/blob" "$tmp/m2/shared/blob" && pass nothing-lost ||
  fail nothing-lost "blob differs"

echo "== unmounted, stopped, removed"
umount "$tmp/m1" && pass umount-host || fail umount-host "busy?"
there umount "$tmp/m2" && pass umount-machine2 || fail umount-machine2 "busy?"
kill -TERM "$server"; wait "$server" 2>/dev/null; server=
expect fsck-clean 0 /usr/bin/crest fsck "$img"
expect dpkg-remove 0 dpkg --purge crest
installed=
[ ! -e /usr/bin/crest ] && [ -f "$img" ] && pass removed-keeps-image || fail removed-keeps-image "$(ls -l /usr/bin/crest "$img" 2>&1)"

if [ "$fails" -gt 0 ]; then
  echo "$fails package check(s) failed; server log:" >&2
  tail -20 "$tmp/serve.log" >&2
  exit 1
fi
echo "all package checks passed"
