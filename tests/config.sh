#!/usr/bin/env bash
# The configuration file (--config, /etc/crest/crest.toml), against the real binary (root:
# it mounts):
#   file       [serve] listen and insecure make `crest serve IMG --config F` serve there,
#              plaintext: a real `crest mount --insecure` of that address works (a file
#              written shows in ls), and the background mount daemon is handed --config F;
#              [log] level = "info" shows the server's info lines;
#   flags win  --listen on the command line beats the file's address (which stays
#              closed), -q beats its level;
#   SIGHUP     a running server takes the file's log level again (its debug lines appear),
#              and keeps going as it was when the file no longer parses;
#   errors     an unknown key, a value of the wrong type: exit 2, naming the file, the key
#              and the line, and nothing served; --config of a missing file: exit 2,
#              naming it.
# Each check prints PASS/FAIL; exits non-zero if any failed.
#   CREST_BIN  the crest binary (default target/release/crest)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-config.XXXXXX)
export CREST_STATE_DIR=$tmp/state
unset CREST_LOG
fails=0
pids=()
mnt=$tmp/mnt

cleanup() {
  grep -qF " $mnt " /proc/self/mountinfo && umount -l "$mnt" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
# soon_grep PATTERN FILE: PATTERN shows up in FILE within 2 s (the server says where it
# serves just after it starts listening).
soon_grep() {
  for _ in $(seq 20); do grep -q -- "$1" "$2" && return 0; sleep 0.1; done
  return 1
}
# stop PID: SIGTERM, as a service manager stops a server; its exit code in $rc.
stop() { kill -TERM "$1"; wait "$1"; rc=$?; }

img=$tmp/img
"$crest" mkfs --size 64M "$img" >/dev/null || { echo "mkfs failed" >&2; exit 1; }
port=$(free_port)
cfg=$tmp/crest.toml
cat >"$cfg" <<EOF
# written by tests/config.sh
[log]
level = "info"

[serve]
listen = "127.0.0.1:$port"
insecure = true
EOF

echo "== a server configured by the file"
"$crest" serve "$img" --config "$cfg" >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
pids+=("$server")
if wait_listen "$port"; then pass serve-listens-from-file; else fail serve-listens-from-file "$(cat "$tmp/serve.err")"; fi
soon_grep "serving $img on 127.0.0.1:$port" "$tmp/serve.err" && pass serve-says-where || fail serve-says-where "$(cat "$tmp/serve.err")"
grep -q "INFO crest" "$tmp/serve.err" && pass log-level-from-file || fail log-level-from-file "$(cat "$tmp/serve.err")"
mkdir -p "$mnt"
expect mount-configured-server 0 "$crest" mount --insecure --config "$cfg" "127.0.0.1:$port" "$mnt"
echo hello >"$mnt/hello" 2>"$tmp/err"
run ls "$mnt"
[ "$rc" = 0 ] && grep -qx hello "$tmp/out" && pass ls-sees-file || fail ls-sees-file "$(said)"
# The daemon re-runs crest: it must read this file too, not the default one.
daemon=$(ps -eo args | grep -F -- "--ready-pipe" | grep -F -- "$mnt" | grep -v grep)
[[ $daemon == *"--config $cfg"* ]] && pass daemon-gets-config || fail daemon-gets-config "daemon: $daemon"
expect umount 0 "$crest" umount "$mnt"
stop "$server"
[ "$rc" = 0 ] && pass server-stops || fail server-stops "exit $rc; $(cat "$tmp/serve.err")"

echo "== flags beat the file"
port2=$(free_port)
"$crest" serve "$img" --config "$cfg" --listen "127.0.0.1:$port2" -q >"$tmp/serve2.out" 2>"$tmp/serve2.err" &
server=$!
pids+=("$server")
if wait_listen "$port2"; then pass listen-flag-wins; else fail listen-flag-wins "$(cat "$tmp/serve2.err")"; fi
listening "$port" && fail file-address-unused "something listens on $port" || pass file-address-unused
stop "$server"
grep -q "INFO crest" "$tmp/serve2.err" && fail quiet-flag-wins "$(cat "$tmp/serve2.err")" || pass quiet-flag-wins

echo "== SIGHUP takes the file again, under the flags"
port3=$(free_port)
printf '[log]\nlevel = "warn"\n[serve]\nlisten = "127.0.0.1:%s"\ninsecure = true\n' "$port3" >"$tmp/hup.toml"
"$crest" serve "$img" --config "$tmp/hup.toml" >"$tmp/hup.out" 2>"$tmp/hup.err" &
server=$!
pids+=("$server")
wait_listen "$port3" || fail hup-serves "$(cat "$tmp/hup.err")"
sed -i 's/level = "warn"/level = "debug"/' "$tmp/hup.toml"
kill -HUP "$server"
soon_grep "reloaded: log warn,crest=debug" "$tmp/hup.err" && pass hup-reloads-level || fail hup-reloads-level "$(cat "$tmp/hup.err")"
# Now at debug: a client's connection is logged (it was not at warn).
mkdir -p "$mnt"
"$crest" mount --insecure "127.0.0.1:$port3" "$mnt" >/dev/null 2>&1
soon_grep "client connected" "$tmp/hup.err" && pass hup-level-applies || fail hup-level-applies "$(cat "$tmp/hup.err")"
"$crest" umount "$mnt" >/dev/null 2>&1
# A file broken meanwhile changes nothing: the server says so and goes on.
printf '[serve]\nlisten-on = "x"\n' >"$tmp/hup.toml"
kill -HUP "$server"
soon_grep "not reloaded" "$tmp/hup.err" && pass hup-broken-file-kept || fail hup-broken-file-kept "$(cat "$tmp/hup.err")"
kill -0 "$server" 2>/dev/null && pass hup-server-goes-on || fail hup-server-goes-on "$(cat "$tmp/hup.err")"
stop "$server"

echo "== a broken file is refused, naming the file, the key and the line"
printf '[serve]\nlisten = "127.0.0.1:%s"\nlisten-on = "0.0.0.0:7410"\n' "$port" >"$tmp/bad.toml"
expect unknown-key-exit-2 2 timeout 10 "$crest" serve "$img" --config "$tmp/bad.toml"
mentions unknown-key-named "listen-on"
mentions unknown-key-line "line 3"
mentions unknown-key-file "$tmp/bad.toml"
listening "$port" && fail unknown-key-serves-nothing "something listens on $port" || pass unknown-key-serves-nothing
printf '[mount]\ninsecure = true\ntimeout = "30"\n' >"$tmp/type.toml"
expect wrong-type-exit-2 2 "$crest" mount --config "$tmp/type.toml" "127.0.0.1:$port" "$mnt"
mentions wrong-type-named "timeout"
mentions wrong-type-line "line 3"
mentions wrong-type-says-type "invalid type"
expect missing-config-exit-2 2 "$crest" serve "$img" --config "$tmp/nonexistent.toml"
mentions missing-config-named "$tmp/nonexistent.toml"

[ "$fails" = 0 ] && echo "config: all passed" || { echo "config: $fails failed"; exit 1; }
