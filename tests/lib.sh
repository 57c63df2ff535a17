# Checks shared by the shell test suites (tests/*.sh). Source it
# after setting `tmp` (a scratch directory) and `fails=0`.

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
# run CMD...: runs it with stdout in $tmp/out, stderr in $tmp/err, exit code in $rc.
run() { "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
said() { echo "exit $rc; stdout: $(head -c 400 "$tmp/out"); stderr: $(head -c 600 "$tmp/err")"; }
# expect NAME CODE CMD...: the command exits CODE.
expect() {
  local name=$1 want=$2; shift 2
  run "$@"
  if [ "$rc" = "$want" ]; then pass "$name"; else fail "$name" "want exit $want; $(said)"; fi
}
# mentions NAME TEXT: the last command's stdout or stderr contains TEXT (case-insensitive).
mentions() { if grep -qiF -- "$2" "$tmp/out" "$tmp/err"; then pass "$1"; else fail "$1" "no \"$2\"; $(said)"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# listening PORT: something accepts connections on 127.0.0.1:PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# wait_listen PORT: something listens there within 10 s.
wait_listen() {
  for _ in $(seq 200); do listening "$1" && return 0; sleep 0.05; done
  return 1
}
# check NAME CMD...: PASS when the command succeeds.
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "not true: $*"; fi; }
# unmount_all DIR...: lazily unmounts each that is still mounted (for the EXIT traps; a
# directory mounted twice over is unmounted up to three times).
unmount_all() {
  local m
  for m in "$@"; do
    for _ in 1 2 3; do
      grep -qF " $m " /proc/self/mountinfo || break
      umount -l "$m" 2>/dev/null || break
    done
  done
}
