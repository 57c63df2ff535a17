#!/usr/bin/env bash
# What an administrator operates crest with, against the real binary (root: it mounts):
#   version      --version names the release (Cargo.toml's), a commit of this repository
#                (12 hex digits, -dirty) or "unknown", and the protocol and on-disk format
#                versions the source defines (read from the source here, so a stale or
#                wrong constant in the output fails); -V is one line; `version --json`
#                says the same;
#   logs         a real server's warning (garbage from a peer) shows by default, not with
#                -q; its info lines only with -v; CREST_LOG wins over -q; log lines written
#                to a file or pipe carry no ESC byte, on a terminal they are coloured; to
#                the journal (JOURNAL_STREAM) they carry priorities and no timestamps;
#                --log-file appends (mode 0600) and takes the lines off stderr; a background
#                mount's log (its default one, and --log-file) has no ESC byte and follows
#                -q, -v (no debug lines) and -vv (debug lines);
#   completions  every shell's script is made; bash's passes `bash -n`, registers
#                `complete -p crest` and completes "crest mo" to mount;
#   man          `crest man DIR` writes crest.1, crest-mount.1, crest-dataset-create.1...,
#                each renders with groff without a warning, and they carry the options;
#   systemd      under a stand-in notification socket a server says READY=1 once it
#                listens, feeds a 0.4 s watchdog, says RELOADING=1 and READY=1 around a
#                SIGHUP and STOPPING=1 on SIGTERM.
# Each check prints PASS/FAIL; exits non-zero if any failed.
#   CREST_BIN        the crest binary (default target/release/crest)
#   CREST_OPS_KEEP=1 keep the scratch directory (logs, man pages) to look at
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-ops.XXXXXX)
# Credentials and the mount daemons' logs stay in here, not in /var/lib/crest.
export CREST_STATE_DIR=$tmp/state
unset CREST_LOG NO_COLOR JOURNAL_STREAM
fails=0
pids=()
mounts=()

cleanup() {
  for m in "${mounts[@]}"; do
    grep -qF " $m " /proc/self/mountinfo && umount -l "$m" 2>/dev/null
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${CREST_OPS_KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
# has_esc FILE: FILE holds an ESC byte (the start of every ANSI colour code).
has_esc() { LC_ALL=C grep -q $'\x1b' "$1"; }
# soon_grep PATTERN FILE: PATTERN shows up in FILE within 2 s (a daemon writes it after
# the command that started it returned).
soon_grep() {
  for _ in $(seq 20); do grep -q -- "$1" "$2" && return 0; sleep 0.1; done
  return 1
}
# source_const FILE NAME: the value of `pub const NAME: u32 = N;` in FILE.
source_const() { sed -n "s/^pub const $2: u32 = \([0-9]*\);.*/\1/p" "$root/$1"; }

echo "== version"
release=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
protocol=$(source_const crates/proto/src/message.rs PROTOCOL_VERSION)
oldest_protocol=$(source_const crates/proto/src/message.rs OLDEST_PROTOCOL_VERSION)
format=$(source_const crates/store/src/engine/superblock.rs FORMAT_VERSION)
oldest_format=$(source_const crates/store/src/engine/superblock.rs OLDEST_FORMAT_VERSION)
[ -n "$release" ] && [ -n "$protocol" ] && [ -n "$format" ] ||
  { echo "cannot read the versions from the source (release '$release', protocol '$protocol', format '$format')" >&2; exit 2; }
expect version-exit-0 0 "$crest" --version
cp "$tmp/out" "$tmp/version"
head -1 "$tmp/version" | grep -qx "crest $release" && pass version-release || fail version-release "want crest $release; $(said)"
commit=$(sed -n 's/^commit: //p' "$tmp/version")
if [[ $commit =~ ^[0-9a-f]{12}(-dirty)?$ ]]; then
  # Not necessarily HEAD (built before the last commit), but one of this repository's.
  if ! git -C "$root" rev-parse --git-dir >/dev/null 2>&1 || git -C "$root" cat-file -e "${commit%-dirty}^{commit}" 2>/dev/null; then
    pass version-commit
  else
    fail version-commit "$commit is no commit of $root"
  fi
elif [ "$commit" = unknown ]; then
  pass version-commit
else
  fail version-commit "want 12 hex digits or unknown; $(said)"
fi
grep -qx "protocol: $protocol (speaks $oldest_protocol to $protocol)" "$tmp/version" && pass version-protocol ||
  fail version-protocol "want protocol $protocol (crates/proto); $(said)"
grep -qx "on-disk format: $format (opens $oldest_format to $format)" "$tmp/version" && pass version-format ||
  fail version-format "want on-disk format $format (crates/store); $(said)"
expect version-short-exit-0 0 "$crest" -V
[ "$(wc -l <"$tmp/out")" = 1 ] && grep -qx "crest $release (${commit})" "$tmp/out" && pass version-short ||
  fail version-short "want one line, crest $release ($commit); $(said)"
expect version-command 0 "$crest" version
cmp -s "$tmp/out" "$tmp/version" && pass version-command-same || fail version-command-same "$(diff "$tmp/version" "$tmp/out")"
run "$crest" version --json
python3 - "$tmp/out" "$release" "$commit" "$protocol" "$format" <<'PY' && pass version-json || fail version-json "$(said)"
import json, sys
d = json.load(open(sys.argv[1]))
release, commit, protocol, format_ = sys.argv[2:]
assert d["version"] == release and d["commit"] == commit, d
assert int(protocol) in d["protocols"] and d["format"] == int(format_), d
PY

echo "== on-disk format: an older image opens, and upgrades on request"
expect mkfs-old-format 0 "$crest" mkfs --size 64M --format-version "$oldest_format" "$tmp/old.img"
expect fsck-old-format 0 "$crest" fsck "$tmp/old.img"
expect upgrade 0 "$crest" upgrade "$tmp/old.img"
grep -q "upgraded from on-disk format $oldest_format to $format" "$tmp/out" && pass upgrade-says ||
  fail upgrade-says "$(said)"
expect upgrade-again 0 "$crest" upgrade "$tmp/old.img"
grep -q "already in on-disk format $format" "$tmp/out" && pass upgrade-idempotent || fail upgrade-idempotent "$(said)"
expect fsck-upgraded 0 "$crest" fsck "$tmp/old.img"
for off in 65576 1048616; do   # each superblock slot's version field (byte 40)
  v=$(od -An -tu4 -j "$off" -N4 "$tmp/old.img" | tr -d ' ')
  [ "$v" = "$format" ] && pass "upgraded-slot-$off" || fail "upgraded-slot-$off" "version $v"
done
expect mkfs-unknown-format 2 "$crest" mkfs --size 64M --format-version 9 "$tmp/new.img"

echo "== logs: -v, -q, CREST_LOG, --log-file, colour"
img=$tmp/img
"$crest" mkfs --size 64M "$img" >/dev/null || { echo "mkfs failed" >&2; exit 1; }
port=$(free_port)
# serve_once NAME [FLAGS...]: runs `crest FLAGS serve --insecure` on the image, sends it a
# connection of garbage (which it logs as a warning), stops it; stderr in $tmp/NAME.err.
serve_once() {
  local name=$1 pid; shift
  "$crest" "$@" serve --insecure "$img" --listen "127.0.0.1:$port" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pid=$!
  wait_listen "$port" || { fail "$name" "server did not start: $(cat "$tmp/$name.err")"; kill "$pid"; return; }
  printf 'GET / HTTP/1.0\r\n\r\n' >/dev/tcp/127.0.0.1/"$port"
  sleep 0.3
  kill -TERM "$pid"; wait "$pid"
}
serve_once default
grep -q "WARN crest" "$tmp/default.err" && pass log-default-warns || fail log-default-warns "$(cat "$tmp/default.err")"
grep -q "INFO crest" "$tmp/default.err" && fail log-default-no-info "$(cat "$tmp/default.err")" || pass log-default-no-info
has_esc "$tmp/default.err" && fail log-pipe-no-colour "ESC in a log written to a file" || pass log-pipe-no-colour
serve_once quiet -q
grep -q "WARN crest" "$tmp/quiet.err" && fail log-quiet-no-warning "$(cat "$tmp/quiet.err")" || pass log-quiet-no-warning
grep -q "serving" "$tmp/quiet.err" && pass log-quiet-still-says-serving || fail log-quiet-still-says-serving "$(cat "$tmp/quiet.err")"
serve_once verbose -v
grep -q "INFO crest: .*--disk-io" "$tmp/verbose.err" && pass log-verbose-info || fail log-verbose-info "$(cat "$tmp/verbose.err")"
CREST_LOG=info serve_once env -q
grep -q "INFO crest" "$tmp/env.err" && pass log-crest-log-wins || fail log-crest-log-wins "$(cat "$tmp/env.err")"
serve_once file -v --log-file "$tmp/crest.log"
cp "$tmp/crest.log" "$tmp/crest.log.first"
serve_once file2 --log-file "$tmp/crest.log"
grep -q "INFO crest: .*--disk-io" "$tmp/crest.log" && pass log-file-gets-lines || fail log-file-gets-lines "$(cat "$tmp/crest.log")"
first=$(stat -c %s "$tmp/crest.log.first")
[ "$(stat -c %s "$tmp/crest.log")" -gt "$first" ] && cmp -s -n "$first" "$tmp/crest.log.first" "$tmp/crest.log" &&
  pass log-file-appends || fail log-file-appends "the second run did not add to the first's lines: $(cat "$tmp/crest.log")"
has_esc "$tmp/crest.log" && fail log-file-no-colour "ESC in $tmp/crest.log" || pass log-file-no-colour
[ "$(stat -c %a "$tmp/crest.log")" = 600 ] && pass log-file-mode-600 || fail log-file-mode-600 "$(stat -c %a "$tmp/crest.log")"
grep -qE "(WARN|INFO) crest" "$tmp/file.err" && fail log-file-not-on-stderr "$(cat "$tmp/file.err")" || pass log-file-not-on-stderr
expect log-file-unwritable 1 "$crest" --log-file "$tmp/no/such/dir/log" mkfs --size 64M "$tmp/img-x"
mentions log-file-unwritable-named "$tmp/no/such/dir/log"
# Under systemd (JOURNAL_STREAM names stderr's device and inode): syslog priorities, no
# timestamps; a JOURNAL_STREAM that names another file (inherited) changes nothing.
: >"$tmp/journal.err"
JOURNAL_STREAM=$(stat -c %d:%i "$tmp/journal.err") serve_once journal -v
grep -q "^<6>crest: .*--disk-io" "$tmp/journal.err" && grep -q "^<4>crest_serve: " "$tmp/journal.err" &&
  ! grep -qE "^[0-9]{4}-" "$tmp/journal.err" && pass log-journal || fail log-journal "$(cat "$tmp/journal.err")"
JOURNAL_STREAM=1:2 serve_once inherited -v
grep -qE "^[0-9T:.-]+Z +INFO crest: " "$tmp/inherited.err" && pass log-journal-inherited ||
  fail log-journal-inherited "$(cat "$tmp/inherited.err")"
# On a terminal (script(1) gives the server a pty; timeout stops it as SIGTERM would)
# the same lines are coloured.
if command -v script >/dev/null 2>&1; then
  printf -v cmd '%q ' timeout --foreground -s TERM 1 "$crest" -v serve --insecure "$img" --listen "127.0.0.1:$port"
  script -qfec "$cmd" "$tmp/tty.log" >/dev/null 2>&1 </dev/null
  has_esc "$tmp/tty.log" && pass log-terminal-colour || fail log-terminal-colour "no ESC on a terminal: $(head -c 300 "$tmp/tty.log")"
else
  echo "SKIP log-terminal-colour: no script(1)"
fi

echo "== logs of a background mount"
"$crest" serve --insecure "$img" --listen "127.0.0.1:$port" >"$tmp/serve.log" 2>&1 &
pids+=("$!")
wait_listen "$port" || { cat "$tmp/serve.log" >&2; echo "server did not start" >&2; exit 1; }
mnt=$tmp/mnt
mkdir -p "$mnt"
mounts+=("$mnt")
daemon_log=$CREST_STATE_DIR/log/crest-mount$(printf '%s' "$mnt" | tr / _).log
# An option crest sets itself is a warning of the daemon's (it goes on without it).
expect mount-default 0 "$crest" mount --insecure -o fsname=mine "127.0.0.1:$port" "$mnt"
"$crest" umount "$mnt"
soon_grep "WARN crest_fuse.*fsname=mine" "$daemon_log" && pass mount-log-warns || fail mount-log-warns "$(cat "$daemon_log")"
has_esc "$daemon_log" && fail mount-log-no-colour "ESC in $daemon_log" || pass mount-log-no-colour
expect mount-quiet 0 "$crest" -q mount --insecure -o fsname=mine "127.0.0.1:$port" "$mnt"
"$crest" umount "$mnt"
grep -q "WARN crest" "$daemon_log" && fail mount-quiet-log "$(cat "$daemon_log")" || pass mount-quiet-log
# _netdev is mount(8)'s: the daemon says so at debug level, which -v leaves out, -vv not.
expect mount-log-file 0 "$crest" -v --log-file "$tmp/mount.log" mount --insecure -o _netdev "127.0.0.1:$port" "$mnt"
mentions mount-log-file-named "log: $tmp/mount.log"
"$crest" umount "$mnt"
soon_grep "INFO crest::mount: .*mounted on $mnt" "$tmp/mount.log" && pass mount-log-file-verbose || fail mount-log-file-verbose "$(cat "$tmp/mount.log")"
grep -q "DEBUG crest" "$tmp/mount.log" && fail mount-verbose-no-debug "$(cat "$tmp/mount.log")" || pass mount-verbose-no-debug
expect mount-very-verbose 0 "$crest" -vv --log-file "$tmp/mount2.log" mount --insecure -o _netdev "127.0.0.1:$port" "$mnt"
"$crest" umount "$mnt"
soon_grep "DEBUG crest_fuse.*_netdev" "$tmp/mount2.log" && pass mount-very-verbose-debug || fail mount-very-verbose-debug "$(cat "$tmp/mount2.log")"
has_esc "$tmp/mount.log" && fail mount-log-file-no-colour "ESC in $tmp/mount.log" || pass mount-log-file-no-colour

echo "== progress of long commands: on a terminal only, erased when done"
# (`script` gives the command a terminal; CREST_PROGRESS_AFTER_MS=0 shows the spinner at
# once, where an image this small would be checked before the usual half second.)
on_tty() { script -qec "$*" /dev/null; }
run on_tty "CREST_PROGRESS_AFTER_MS=0 '$crest' fsck '$img'"
mentions fsck-progress-on-terminal "checking $img: "
grep -q "read (" "$tmp/out" && pass fsck-progress-counts-bytes || fail fsck-progress-counts-bytes "$(said)"
# The spinner's line is erased (the last thing before the report is "erase line").
tr '\r' '\n' <"$tmp/out" | grep -v '^$' | tail -1 | grep -q "^.\[2K$img: generation .*: clean" &&
  pass fsck-progress-erased || fail fsck-progress-erased "$(cat -A "$tmp/out" | tail -c 400)"
run env CREST_PROGRESS_AFTER_MS=0 "$crest" fsck "$img"
if grep -q "checking" "$tmp/err" || has_esc "$tmp/err"; then fail fsck-no-progress-off-terminal "$(said)"
else pass fsck-no-progress-off-terminal; fi
"$crest" mkfs --size 64M "$tmp/open.img" >/dev/null
run on_tty "CREST_PROGRESS_AFTER_MS=0 timeout -s TERM 3 '$crest' serve --insecure '$tmp/open.img' --listen 127.0.0.1:$(free_port)"
mentions serve-open-progress "opening $tmp/open.img: "
mentions serve-open-progress-then-serving "serving $tmp/open.img"

echo "== shell completions"
for shell in bash zsh fish elvish powershell; do
  expect "completions-$shell" 0 "$crest" completions "$shell"
  [ -s "$tmp/out" ] && pass "completions-$shell-not-empty" || fail "completions-$shell-not-empty" "$(said)"
  cp "$tmp/out" "$tmp/completion.$shell"
done
expect completions-bad-shell 2 "$crest" completions tcsh
bash -n "$tmp/completion.bash" && pass completions-bash-parses || fail completions-bash-parses "bash -n failed"
run bash -c "source '$tmp/completion.bash' && complete -p crest"
[ "$rc" = 0 ] && pass completions-bash-registers || fail completions-bash-registers "$(said)"
run bash -c "source '$tmp/completion.bash'; COMP_WORDS=(crest mo); COMP_CWORD=1; COMP_LINE='crest mo'; COMP_POINT=8; _crest crest mo crest; echo \"\${COMPREPLY[*]}\""
grep -qw mount "$tmp/out" && pass completions-bash-completes || fail completions-bash-completes "$(said)"
if command -v zsh >/dev/null 2>&1; then
  zsh -n "$tmp/completion.zsh" && pass completions-zsh-parses || fail completions-zsh-parses "zsh -n failed"
fi
if command -v fish >/dev/null 2>&1; then
  fish -n "$tmp/completion.fish" && pass completions-fish-parses || fail completions-fish-parses "fish -n failed"
fi

echo "== man pages"
expect man-exit-0 0 "$crest" man "$tmp/man"
for page in crest crest-mount crest-serve crest-fsck crest-dataset-create crest-completions; do
  [ -s "$tmp/man/$page.1" ] && pass "man-$page" || fail "man-$page" "no $tmp/man/$page.1: $(ls "$tmp/man")"
done
n=$(find "$tmp/man" -name '*.1' | wc -l)
grep -q "wrote $n man pages" "$tmp/out" && pass man-says-how-many || fail man-says-how-many "$n pages; $(said)"
warned=0
for page in "$tmp"/man/*.1; do
  if ! groff -man -Tutf8 -ww -z "$page" 2>"$tmp/groff.err" || [ -s "$tmp/groff.err" ]; then
    warned=1
    fail "man-renders-$(basename "$page")" "$(head -c 400 "$tmp/groff.err")"
  fi
done
[ "$warned" = 0 ] && pass man-all-render
MANWIDTH=100 man -l "$tmp/man/crest-mount.1" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 0 ] && grep -q -- "--foreground" "$tmp/out" && pass man-mount-options || fail man-mount-options "$(said)"
MANWIDTH=100 man -l "$tmp/man/crest.1" >"$tmp/out" 2>"$tmp/err"
rc=$?
grep -q "CREST_LOG" "$tmp/out" && grep -q "crest-mount(1)" "$tmp/out" && pass man-crest-notes || fail man-crest-notes "$(said)"

echo "== systemd: Type=notify and the watchdog"
# A stand-in for systemd's notification socket: every datagram, one line each.
cat >"$tmp/notify.py" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", " ") + "\n")
PY
python3 "$tmp/notify.py" "$tmp/notify.sock" "$tmp/notify.log" &
pids+=($!)
for _ in $(seq 50); do [ -S "$tmp/notify.sock" ] && break; sleep 0.05; done
"$crest" mkfs --size 64M "$tmp/sd.img" >/dev/null
sd_port=$(free_port)
NOTIFY_SOCKET=$tmp/notify.sock WATCHDOG_USEC=400000 "$crest" serve "$tmp/sd.img" --listen "127.0.0.1:$sd_port" \
  --insecure -q 2>"$tmp/sd.err" &
sd=$!
pids+=("$sd")
soon_grep "^READY=1 STATUS=serving" "$tmp/notify.log" && pass sd-ready || fail sd-ready "$(cat "$tmp/notify.log" "$tmp/sd.err")"
listening "$sd_port" && pass sd-ready-means-listening || fail sd-ready-means-listening "nothing on $sd_port"
sleep 1
[ "$(grep -c '^WATCHDOG=1' "$tmp/notify.log")" -ge 3 ] && pass sd-watchdog-fed || fail sd-watchdog-fed "$(cat "$tmp/notify.log")"
kill -HUP "$sd"
soon_grep "^RELOADING=1" "$tmp/notify.log" && pass sd-reloading || fail sd-reloading "$(cat "$tmp/notify.log")"
[ "$(grep -c '^READY=1' "$tmp/notify.log")" -ge 2 ] || sleep 0.5
[ "$(grep -c '^READY=1' "$tmp/notify.log")" -ge 2 ] && pass sd-ready-after-reload || fail sd-ready-after-reload "$(cat "$tmp/notify.log")"
kill -TERM "$sd"
wait "$sd"
grep -q "^STOPPING=1" "$tmp/notify.log" && pass sd-stopping || fail sd-stopping "$(cat "$tmp/notify.log")"

echo "== ops: $fails failed"
[ "$fails" = 0 ]
