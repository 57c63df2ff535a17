#!/usr/bin/env bash
# crest's security boundary as users meet it, with the real binary, real servers and
# real FUSE mounts (root). Three "hosts" share this machine, each with a state directory
# of its own (CREST_STATE_DIR): `host` serves, `other` joins it, `third` serves another
# image with a CA of its own.
#   - TLS by default: the server's host mounts with no flag; another host without
#     credentials is refused and told what to do; plaintext never gets in;
#   - a join token works once, not after it expires, not forged, not at another server;
#   - a client pins its server's CA and the server admits only certificates it issued;
#   - another host's root is squashed: refused where nobody may write, told so;
#   - a revoked client is disconnected within seconds and cannot come back, while the
#     server's host goes on;
#   - --insecure only on loopback; state directories open to others are refused; mounts
#     are nosuid,nodev unless asked; the mount log is never written through a link;
#   - a joined host renews its certificate (short lives here) when a third is left, for
#     its own name, not earlier, not once revoked, and its mounts go on past the expiry
#     of the certificate it joined with.
# Each check prints PASS/FAIL; exits non-zero if any failed.
#   CREST_BIN   the crest binary (default target/release/crest)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-sec.XXXXXX)
fails=0
pids=()
mounts=()

cleanup() {
  unmount_all "${mounts[@]}"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
# as HOST CMD...: crest with HOST's state directory.
as() { local h=$1; shift; CREST_STATE_DIR=$tmp/$h "$crest" "$@"; }
serve() { # HOST IMAGE PORT [ARGS]
  as "$1" mkfs --size 256M "$tmp/$2" >/dev/null || return 1
  CREST_STATE_DIR=$tmp/$1 "$crest" serve "$tmp/$2" --listen "127.0.0.1:$3" "${@:4}" >"$tmp/$2.log" 2>&1 &
  pids+=("$!")
  wait_listen "$3"
}
# mnt NAME: a mount point $tmp/NAME, unmounted at the end (not in a subshell: it records it).
mnt() { mkdir -p "$tmp/$1"; mounts+=("$tmp/$1"); }

echo "== TLS by default: the server's host mounts with no flag"
port=$(free_port)
serve host img "$port" || { echo "server did not start" >&2; cat "$tmp/img.log" >&2; exit 1; }
addr=127.0.0.1:$port
check state-dir-private [ "$(stat -c %a "$tmp/host")" = 700 ]
check state-files-private [ -z "$(find "$tmp/host" -type f -perm /077)" ]
mnt m-host; m_host=$tmp/m-host
expect host-mounts 0 as host mount "$addr" "$m_host"
echo "from host" >"$m_host/a" 2>/dev/null
check host-reads-back [ "$(cat "$m_host/a" 2>/dev/null)" = "from host" ]
opts=$(grep -F " $m_host " /proc/self/mountinfo | cut -d' ' -f6)
check mount-nosuid-nodev-by-default bash -c "[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]]"
log=$tmp/host/log/crest-mount$(printf '%s' "$m_host" | tr / _).log
check mount-log-private [ "$(stat -c %a "$log" 2>/dev/null)" = 600 ]

echo "== another host: refused without credentials, told what to do"
mnt m-other; m_other=$tmp/m-other
expect other-without-credentials-exit-32 32 as other mount "$addr" "$m_other"
mentions other-without-credentials-told "crest join"
check other-not-mounted bash -c "! grep -qF ' $m_other ' /proc/self/mountinfo"
expect plaintext-to-tls-exit-32 32 as other mount --insecure "$addr" "$m_other"
check plaintext-not-mounted bash -c "! grep -qF ' $m_other ' /proc/self/mountinfo"

echo "== join tokens: once, not expired, not forged, not for another server"
run as host token create --ttl 10m
token=$(cat "$tmp/out")
check token-printed bash -c "[[ '$token' == crest1-* ]]"
expect other-joins 0 as other join "$addr" "$token"
check joined-credentials-private [ -z "$(find "$tmp/other" -type f -perm /077)" ]
expect token-second-use-refused 1 as spare join "$addr" "$token"
mentions token-second-use-named "used"
forged=$(printf '%s' "$token" | python3 -c 'import sys; t=sys.stdin.read().split("-"); s=t[2]; t[2]=("0" if s[0]!="0" else "1")+s[1:]; print("-".join(t))')
run as host token create --ttl 10m
expect forged-token-refused 1 as spare join "$addr" "$forged"
run as host token create --ttl 1s
short=$(cat "$tmp/out")
sleep 2
expect expired-token-refused 1 as spare join "$addr" "$short"
check spare-has-no-credentials [ ! -e "$tmp/spare/joined" ]

echo "== joined: root squashed, coherent over TLS"
mkdir -m 1777 "$m_host/pub"
expect other-mounts 0 as other mount "$addr" "$m_other"
check other-sees-host [ "$(cat "$m_other/a" 2>/dev/null)" = "from host" ]
# Its root is nobody on the server: the root directory (0755, root's) is not its to write
# in, and the refusal reaches the writer at once, at open: whether the create goes to the
# server while the host's change to the root makes it shared, or a second later, when the
# mount could take the root whole and answer creates itself (it answers none of a caller
# the server squashes: the kernel let root through).
writes() { python3 -c 'import sys; f = open(sys.argv[1], "w"); f.write(sys.argv[2]); f.close()' "$@" 2>/dev/null; }
check squashed-root-refused bash -c "$(declare -f writes); ! writes '$m_other/b' 'x'"
sleep 1.2
check squashed-root-refused-later bash -c "$(declare -f writes); ! writes '$m_other/b2' 'x'"
check squashed-root-left-nothing bash -c "[ ! -e '$m_host/b' ] && [ ! -e '$m_host/b2' ]"
# Directories of uid 1000's that the other host's mount holds whole, because uid 1000
# made a file in each there: that user's changes are answered by the mount, its squashed
# root's are refused at once (create, chmod, rename, unlink), not later by the writeback.
# One directory per change: a refused writeback costs the mount its hold.
chmod 711 "$tmp"  # uid 1000 reaches the mounts, not what is beside them
for d in create chmod rename unlink; do
  mkdir "$m_host/pub/$d" && chown 1000:1000 "$m_host/pub/$d"
done
sleep 1.2
as1000() { setpriv --reuid 1000 --regid 1000 --clear-groups "$@"; }
for d in create chmod rename unlink; do
  check "unsquashed-user-writes-$d" as1000 bash -c "$(declare -f writes); writes '$m_other/pub/$d/mine' 'x'"
done
h=$m_other/pub
check squashed-root-create-refused-in-held bash -c "$(declare -f writes); ! writes '$h/create/root' 'x'"
check squashed-root-chmod-refused-in-held bash -c "! chmod 777 '$h/chmod/mine' 2>/dev/null"
check squashed-root-rename-refused-in-held bash -c "! mv '$h/rename/mine' '$h/rename/moved' 2>/dev/null"
check squashed-root-unlink-refused-in-held bash -c "! rm -f '$h/unlink/mine' 2>/dev/null"
sleep 0.5
for d in create chmod rename unlink; do
  check "held-directory-as-user-left-it-$d" bash -c "[ \"\$(ls '$m_host/pub/$d')\" = mine ] && [ \"\$(stat -c %a '$m_host/pub/$d/mine')\" = 644 ]"
done
# A set-user-ID bit the joined host's policy does not allow is dropped by the server; the
# mount that holds the directory does not answer the chmod itself and shows what was kept.
check setuid-dropped-where-set as1000 bash -c "$(declare -f writes); writes '$h/create/s' 'x' && chmod 4755 '$h/create/s' && [ \"\$(stat -c %a '$h/create/s')\" = 755 ]"
check setuid-dropped-on-server bash -c "sleep 0.3; [ \"\$(stat -c %a '$m_host/pub/create/s')\" = 755 ]"
writes "$m_other/pub/b" "from other"
check host-sees-other [ "$(cat "$m_host/pub/b" 2>/dev/null)" = "from other" ]
check squashed-owner [ "$(stat -c %u "$m_host/pub/b" 2>/dev/null)" = 65534 ]

echo "== pinned CAs: another host's server, another host's token"
port3=$(free_port)
serve third img3 "$port3" || fail third-serves "$(cat "$tmp/img3.log")"
addr3=127.0.0.1:$port3
key() { printf '%s' "$1" | tr -c 'A-Za-z0-9.-' _; }
cp -r "$tmp/other/joined/$(key "$addr")" "$tmp/other/joined/$(key "$addr3")"
mnt m-third; m_third=$tmp/m-third
expect wrong-ca-exit-32 32 as other mount "$addr3" "$m_third"
mentions wrong-ca-named "do not trust"
run as third token create --ttl 10m
expect foreign-token-refused 1 as spare join "$addr" "$(cat "$tmp/out")"
mentions foreign-token-named "not the one the token names"

echo "== identities: the server names a joining host; a bad exports.json is refused, not obeyed"
# Policies for this machine's own host name and for "ops": what a token holder would ask for.
hn=$(cat /proc/sys/kernel/hostname)
exports=$tmp/host/exports.json
printf '{"clients": {"%s": {"admin": true}, "ops": {"admin": true}}}\n' "$hn" >"$exports"
chmod 600 "$exports"
run as host token create --ttl 10m
expect spare-joins 0 as spare join "$addr" "$(cat "$tmp/out")"
expect joined-name-not-chosen-by-joiner 1 as spare dataset create by-spare --server "$addr"
mentions joined-name-not-admin "admin"
run as host cert list --json
check joined-names-unique python3 -c "import json,sys; n=[c['name'] for c in json.load(open('$tmp/out'))]; sys.exit(0 if len(n) == len(set(n)) and '$hn' not in n else 1)"
expect named-token-for-issued-name-refused 1 as host token create --name local
server_pid=${pids[0]}
printf '{ "clients": { typo\n' >"$exports"
kill -HUP "$server_pid"
reloaded=1
for _ in $(seq 100); do grep -q "NOT reloaded" "$tmp/img.log" && { reloaded=0; break; }; sleep 0.05; done
check bad-exports-reload-says-not-reloaded [ "$reloaded" = 0 ]
check server-alive-after-bad-exports kill -0 "$server_pid"
mnt m-typo
expect host-mounts-despite-bad-exports 0 as host mount "$addr" "$tmp/m-typo"
check host-reads-despite-bad-exports [ "$(cat "$tmp/m-typo/a" 2>/dev/null)" = "from host" ]
# SIGHUP ends no crest process: a mount daemon blocks it (in main, before anything else:
# every thread inherits it) and a thread of its own takes it to open its log again, as
# logrotate expects; the server ignores it until its handler takes over.
daemon=$(pgrep -x crest -a | grep -F -- "$tmp/m-typo" | awk '{print $1}' | head -1)
mask=$(awk '/^SigBlk:/ {print $2}' "/proc/$daemon/status" 2>/dev/null)
check mount-daemon-blocks-sighup bash -c "[ -n '$mask' ] && (( 16#$mask & 1 ))"
daemon_log=$tmp/host/log/crest-mount$(printf '%s' "$tmp/m-typo" | tr / _).log
mv "$daemon_log" "$daemon_log.1"
kill -HUP "$daemon"
for _ in $(seq 100); do grep -qs "opened again" "$daemon_log" && break; sleep 0.05; done
check mount-daemon-reopens-log-on-sighup grep -q "opened again" "$daemon_log"
check mount-daemon-alive-after-sighup kill -0 "$daemon"
check mount-works-after-sighup [ "$(cat "$tmp/m-typo/a" 2>/dev/null)" = "from host" ]
rm -f "$daemon_log.1"
as host umount "$tmp/m-typo" >/dev/null 2>&1
rm -f "$exports"
kill -HUP "$server_pid"
# A server sent SIGHUP as soon as it listens: a reload, never the end of it. (Its handler
# is in place a moment after it listens; until then the signal is ignored: a SIGHUP until
# one is taken as a reload.)
port5=$(free_port)
as host mkfs --size 64M "$tmp/img5" >/dev/null
CREST_STATE_DIR=$tmp/host "$crest" serve "$tmp/img5" --listen "127.0.0.1:$port5" >"$tmp/img5.log" 2>&1 &
hup_pid=$!
pids+=("$hup_pid")
wait_listen "$port5"
for _ in $(seq 200); do
  grep -q "reloaded" "$tmp/img5.log" && break
  kill -HUP "$hup_pid" 2>/dev/null || break
  sleep 0.05
done
check server-survives-early-sighups bash -c "kill -0 $hup_pid && grep -q reloaded '$tmp/img5.log'"

echo "== revocation: the client is put out, the host goes on"
run as host cert list --json
check cert-list-json python3 -c "import json,sys; d=json.load(open('$tmp/out')); n={c['name'] for c in d}; sys.exit(0 if 'local' in n and len(d) >= 2 else 1)"
name=$(python3 -c "import json; print([c['name'] for c in json.load(open('$tmp/out')) if c['via'].startswith('token')][0])")
expect revoke 0 as host cert revoke "$name"
out=1
for _ in $(seq 100); do
  if ! ls "$m_other" >/dev/null 2>&1; then out=0; break; fi
  sleep 0.1
done
check revoked-client-put-out [ "$out" = 0 ]
check host-goes-on [ "$(cat "$m_host/pub/b" 2>/dev/null)" = "from other" ]
umount -l "$m_other" 2>/dev/null
expect revoked-client-kept-out 32 as other mount "$addr" "$m_other"
mentions revoked-client-told "revoked"

echo "== --insecure: loopback only, both ends"
expect insecure-beyond-loopback-refused 1 as host serve "$tmp/img3" --listen "0.0.0.0:$(free_port)" --insecure
mentions insecure-beyond-loopback-named "loopback"
port4=$(free_port)
serve host img4 "$port4" --insecure || fail insecure-serves "$(cat "$tmp/img4.log")"
mnt m-plain; m_plain=$tmp/m-plain
expect insecure-mount 0 as other mount --insecure "127.0.0.1:$port4" "$m_plain"
check insecure-works bash -c "echo x >'$m_plain/x' && [ \"\$(cat '$m_plain/x')\" = x ]"
as other umount "$m_plain" >/dev/null 2>&1
expect insecure-mount-option 0 as other mount -o insecure,suid,dev "127.0.0.1:$port4" "$m_plain"
opts=$(grep -F " $m_plain " /proc/self/mountinfo | cut -d' ' -f6)
check suid-dev-when-asked bash -c "[[ ,$opts, != *,nosuid,* && ,$opts, != *,nodev,* ]]"
mnt m-x
expect tls-client-to-insecure-server-32 32 as host mount "127.0.0.1:$port4" "$tmp/m-x"

echo "== state directories and logs"
chmod 755 "$tmp/host"
expect open-state-dir-refused 1 as host token create
mentions open-state-dir-told "chmod 700"
chmod 700 "$tmp/host"
as other umount "$m_plain" >/dev/null 2>&1
plog=$tmp/other/log/crest-mount$(printf '%s' "$m_plain" | tr / _).log
: >"$tmp/victim"
rm -f "$plog"; ln -s "$tmp/victim" "$plog"
expect mount-over-planted-link 0 as other mount --insecure "127.0.0.1:$port4" "$m_plain"
check log-not-written-through-link bash -c "[ ! -s '$tmp/victim' ] && [ -f '$plog' ] && [ ! -L '$plog' ]"

echo "== certificate lifetime: a joined host renews its certificate and goes on past the first one's expiry"
# A server of its own whose client certificates live 60 s (hidden flag, for tests): the
# host renews with 20 s left (a third), and its mount, which reconnects after the first
# certificate expired, and a new mount and `crest status` after it, still get in.
life=60
port6=$(free_port); mport6=$(free_port)
mkdir -p -m 700 "$tmp/rhost"
printf '{"clients": {"renewer": {"admin": true, "root_squash": false}}}\n' >"$tmp/rhost/exports.json"
chmod 600 "$tmp/rhost/exports.json"
serve rhost img6 "$port6" --client-cert-lifetime "$life" --metrics "127.0.0.1:$mport6" || fail renewal-serves "$(cat "$tmp/img6.log")"
rserver=${pids[-1]}
addr6=127.0.0.1:$port6
run as rhost token create --ttl 10m --name renewer
expect renewal-host-joins 0 as renewer join "$addr6" "$(cat "$tmp/out")"
joined_at=$(date +%s)
# fp HOST: the fingerprint of the certificate HOST keeps for the server.
fp() { as "$1" cert list --joined --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["fingerprint"])'; }
first=$(fp renewer)
run as renewer cert list --joined --json
check renewal-joined-cert-listed python3 -c "import json,sys; c=json.load(open('$tmp/out'))[0]; sys.exit(0 if c['name'] == 'renewer' and c['expires'] - c['issued'] == $life and c['renew_from'] == c['expires'] - $life // 3 else 1)"
run as renewer cert list
mentions renewal-cert-list-shows-time-left "expires in"
run as rhost cert list
mentions renewal-server-list-shows-time-left "valid "
expect renewal-not-due-does-nothing 0 as renewer cert renew "$addr6"
mentions renewal-not-due-said "not due"
expect renewal-too-early-refused 1 as renewer cert renew --now "$addr6"
mentions renewal-too-early-named "too early"
check renewal-too-early-issued-nothing [ "$(fp renewer)" = "$first" ]
mnt m-renew; m_renew=$tmp/m-renew
expect renewal-mount 0 as renewer -v mount "$addr6" "$m_renew"
echo "before" >"$m_renew/f" 2>/dev/null
check renewal-mount-works [ "$(cat "$m_renew/f" 2>/dev/null)" = before ]
run "$crest" status --mount "$m_renew"
mentions renewal-mount-status-shows-cert "client certificate renewer"
run "$crest" status --mount "$m_renew" --prometheus
mentions renewal-mount-metric "crest_mount_client_cert_seconds_left{mount="
rlog=$tmp/renewer/log/crest-mount$(printf '%s' "$m_renew" | tr / _).log
check renewal-warning-logged grep -q "WARNING: the client certificate for $addr6" "$rlog"
curl -s "http://127.0.0.1:$mport6/metrics" >"$tmp/metrics6"
check renewal-server-metric grep -q '^crest_client_cert_soonest_expiry_timestamp_seconds [0-9]' "$tmp/metrics6"
# The mount's daemon renews once a third is left: the register gets the successor.
renewed=1
for _ in $(seq $((life + 10))); do
  as rhost cert list --json >"$tmp/reg" 2>/dev/null
  grep -q "renewal of ${first:0:16}" "$tmp/reg" && { renewed=0; break; }
  sleep 1
done
check renewal-by-mount-daemon [ "$renewed" = 0 ]
second=$(fp renewer)
check renewal-new-cert-kept bash -c "[ -n '$second' ] && [ '$second' != '$first' ]"
check renewal-keeps-name python3 -c "import json,sys; r=[c for c in json.load(open('$tmp/reg')) if c['fingerprint'] == '$second']; sys.exit(0 if r and r[0]['name'] == 'renewer' else 1)"
check renewal-logged grep -q "renewed: ${second:0:16} replaces ${first:0:16}" "$rlog"
run "$crest" status --mount "$m_renew"
mentions renewal-mount-status-shows-new-cert "${second:0:16}"
# Past the first certificate's expiry, a reconnect of the mount (its policy changed: the
# server closes its connection) presents what is kept now and gets in.
while [ "$(date +%s)" -le $((joined_at + life + 2)) ]; do sleep 1; done
printf '{"clients": {"renewer": {"admin": true, "root_squash": false, "anon_uid": 4242}}}\n' >"$tmp/rhost/exports.json"
kill -HUP "$rserver"
sleep 1
echo "after" >"$m_renew/g" 2>/dev/null
check renewal-mount-reconnects-after-first-expired bash -c "[ \"\$(cat '$m_renew/g' 2>/dev/null)\" = after ] && [ \"\$(cat '$m_renew/f' 2>/dev/null)\" = before ]"
run "$crest" status --mount "$m_renew" --json
check renewal-mount-reconnected python3 -c "import json,sys; v=json.load(open('$tmp/out')); sys.exit(0 if v['reconnects'] >= 1 and v['connection'] == 'open' else 1)"
expect renewal-status-after-first-expired 0 as renewer status --server "$addr6"
mentions renewal-status-shows-cert "this host's certificate for $addr6: renewer"
mnt m-renew2
expect renewal-new-mount-after-first-expired 0 as renewer mount -o own_session "$addr6" "$tmp/m-renew2"
check renewal-new-mount-works [ "$(cat "$tmp/m-renew2/f" 2>/dev/null)" = before ]
as renewer umount "$tmp/m-renew2" >/dev/null 2>&1
# Revoking the name reaches every certificate renewed under it; a revoked one renews nothing.
expect renewal-revoke-by-name 0 as rhost cert revoke renewer
check renewal-revoke-covers-successors [ "$(grep -c '^revoked renewer' "$tmp/out")" -ge 2 ]
expect renewal-revoked-refused 1 as renewer cert renew --now "$addr6"
mentions renewal-revoked-named "revoked"
as renewer umount "$m_renew" >/dev/null 2>&1

echo "== security: $fails failed"
[ "$fails" = 0 ]
