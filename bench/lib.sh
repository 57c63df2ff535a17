# shellcheck shell=bash disable=SC2034  # (variables here are for the scripts that source it)
# The pieces the benchmark scripts (bench/untar.sh, bench/headline.sh) share: the build,
# the kernel tars, a scratch directory, crest servers, delay proxies, a loopback sshd, the
# file systems under test (mount, unmount, where), timing, and the result table. Every
# mount and process made here is undone on exit, also on Ctrl-C or a failure.
#
# Use: `source bench/lib.sh; bench_init NAME` from a script under `set -euo pipefail`.
# Environment: CREST_BENCH_DIR (default /var/tmp: the scratch directory goes there and must
# not be tmpfs, so "local" is a real disk file system), CARGO_TARGET_DIR (as cargo).

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_MOUNTS=()            # mountpoints to unmount on exit, in order of mounting
BENCH_PIDS=()              # processes to stop on exit
BENCH_FAILED=0             # how many timed commands failed
declare -A BENCH_T=()      # "phase target" → "real user sys"
declare -A BENCH_ERR=()    # "phase target" → why the command failed (its time is kept)
declare -A BENCH_OPS=()    # "phase target" → operations per second (metabench)
declare -A BENCH_PORT=()   # server or proxy name → its port
declare -A BENCH_ADDR=()   # target → the address it mounts (crest, sshfs)
BENCH_MKFS_ARGS=()         # more `crest mkfs` arguments for the next bench_crest_server

# bench_init NAME: scratch directory, exit traps, build. Sets BENCH_BASE, BENCH_BIN,
# BENCH_LOGS.
bench_init() {
  local name=$1
  cd "$BENCH_ROOT" || return
  BENCH_BASE=$(mktemp -d "${CREST_BENCH_DIR:-/var/tmp}/crest-$name.XXXXXX")
  BENCH_LOGS=${CREST_BENCH_LOGS:-/var/tmp/crest-$name-logs}
  rm -rf "$BENCH_LOGS"; mkdir -p "$BENCH_LOGS"
  trap bench_cleanup EXIT
  trap 'echo "bench: interrupted" >&2; exit 130' INT
  trap 'exit 143' TERM HUP
  if [ "$(stat -f -c %T "$BENCH_BASE")" = tmpfs ]; then
    echo "bench: warning: $BENCH_BASE is on tmpfs; \"local\" is not a disk file system" >&2
  fi
  cargo build --release --locked -q -p crest -p crest-benchtools
  BENCH_BIN=${CARGO_TARGET_DIR:-$BENCH_ROOT/target}/release
  case $BENCH_BIN in /*) ;; *) BENCH_BIN=$BENCH_ROOT/$BENCH_BIN ;; esac
}

# Unmounts everything mounted here (newest first; a FUSE mount that will not unmount has its
# connection aborted and is detached), stops every process started here (SIGTERM, then
# SIGKILL after 10 s), removes the scratch directory.
bench_cleanup() {
  local i m p
  set +e
  # What bench_fg was running, with everything it started (a tar, a mount helper).
  [ -n "${BENCH_FG:-}" ] && kill -TERM -- "-$BENCH_FG" 2>/dev/null
  for ((i = ${#BENCH_MOUNTS[@]} - 1; i >= 0; i--)); do
    m=${BENCH_MOUNTS[i]}
    bench_is_mounted "$m" || continue
    timeout 30 fusermount3 -u "$m" 2>/dev/null || timeout 30 umount "$m" 2>/dev/null || bench_force_umount "$m"
  done
  for p in "${BENCH_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${BENCH_PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ -n "${BENCH_BASE:-}" ] && rm -rf "$BENCH_BASE"
}

# bench_is_mounted DIR: whether DIR is a mount point (without touching the file system
# there, which may hang if its FUSE daemon does).
bench_is_mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

# bench_force_umount DIR: aborts DIR's FUSE connection (fusectl; every request pending on
# it fails) and detaches it.
bench_force_umount() {
  local minor ctl=/sys/fs/fuse/connections
  minor=$(awk -v m="$1" '$5 == m { split($3, d, ":"); print d[2] }' /proc/self/mountinfo | tail -1)
  if [ -n "$minor" ]; then
    [ -d "$ctl/$minor" ] || mount -t fusectl none "$ctl" 2>/dev/null
    [ -w "$ctl/$minor/abort" ] && echo 1 >"$ctl/$minor/abort"
  fi
  umount -l "$1" 2>/dev/null || fusermount3 -u -z "$1" 2>/dev/null
  echo "bench: $1 would not unmount; its FUSE connection was aborted" >&2
}

# bench_daemon LOG COMMAND...: starts COMMAND in the background, in a session of its own so
# a Ctrl-C on the terminal reaches only this script (whose cleanup then unmounts before it
# stops the servers), output to LOG; stopped on exit.
bench_daemon() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 &
  BENCH_LAST_PID=$!
  bench_track "$BENCH_LAST_PID"
}

# bench_fg COMMAND...: runs COMMAND and waits for it, as a background job in a process group
# of its own. Why: bash waits for a foreground command before acting on a Ctrl-C, and drops
# the Ctrl-C altogether when that command catches SIGINT and exits normally (FUSE daemons
# while mounting, crest do), so the script would carry on. A `wait` is interrupted at once,
# the INT trap runs, and cleanup stops the group (BENCH_FG).
bench_fg() {
  local rc=0
  setsid "$@" &
  BENCH_FG=$!
  wait "$BENCH_FG" || rc=$?
  BENCH_FG=
  return "$rc"
}

# bench_track PID: stop this process on exit.
bench_track() { BENCH_PIDS+=("$1"); }

# bench_port_used PORT [STATE]: whether a TCP socket (in STATE, hex as in /proc/net/tcp:
# 0A = listening) has local port PORT. Reads /proc instead of connecting, so servers never
# see a probe connection.
bench_port_used() {
  awk -v p="$(printf '%04X' "$1")" -v st="${2:-}" \
    'FNR > 1 { split($2, a, ":"); if (a[2] == p && (st == "" || $4 == st)) f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A loopback TCP port no socket uses, below the ephemeral range (so no connection made
# later takes it either).
bench_free_port() {
  local port lo=32768
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range || true
  [ "$lo" -gt 12000 ] || lo=32768
  while :; do
    port=$((10000 + RANDOM % (lo - 10000)))
    bench_port_used "$port" || { echo "$port"; return; }
  done
}

# bench_wait_port PORT PID: until something listens on PORT; fails if PID died first or
# after 20 s.
bench_wait_port() {
  local _
  for _ in $(seq 400); do
    bench_port_used "$1" 0A && return 0
    kill -0 "$2" 2>/dev/null || { echo "bench: process $2 died before listening on port $1" >&2; return 1; }
    sleep 0.05
  done
  echo "bench: nothing listens on port $1 after 20 s" >&2
  return 1
}

# bench_tar PATH: the kernel tar at PATH, built by kernel-tars.sh if missing.
bench_tar() {
  local tarball=$1 builder
  [ -f "$tarball" ] && return 0
  for builder in "$BENCH_ROOT/../shared/bench/kernel-tars.sh" /work/shared/bench/kernel-tars.sh ''; do
    [ -f "$builder" ] && break
  done
  [ -n "$builder" ] || { echo "bench: $tarball is missing and kernel-tars.sh is not found" >&2; return 1; }
  bash "$builder" "$(dirname "$tarball")" >&2
}

# bench_small_tar SRC OUT: ~200 files of the kernel subset SRC (mm, ipc, init) as the tar
# OUT, for smoke runs.
bench_small_tar() {
  local x
  x=$(mktemp -d "$BENCH_BASE/smalltar.XXXXXX")
  tar -xf "$1" -C "$x" linux-6.1-small/mm linux-6.1-small/ipc linux-6.1-small/init
  tar -cf "$2" -C "$x" linux-6.1-small
  rm -rf "$x"
}

# bench_drop: write back and drop the page, dentry and inode caches (root only; warns once
# otherwise).
bench_drop() {
  sync
  if ! echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
    [ -n "${BENCH_DROP_WARNED:-}" ] || echo "bench: warning: cannot drop caches (not root?)" >&2
    BENCH_DROP_WARNED=1
  fi
}

# bench_thread_cpu PID: the CPU seconds (user + system) of PID's threads, summed by thread
# name without a trailing number ("crest-server 12.31", "iou-wrk 0.40"), busiest first.
bench_thread_cpu() {
  local pid=$1 hz t
  hz=$(getconf CLK_TCK)
  for t in /proc/"$pid"/task/*; do
    # comm may hold spaces: the fields after the ")" are fixed.
    printf '%s %s\n' "$(cat "$t/comm" 2>/dev/null)" "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12 + $13 }')"
  done | awk -v hz="$hz" 'NF >= 2 { n = $1; sub(/-[0-9]+$/, "", n); s[n] += $NF } END { for (n in s) printf "%s %.2f\n", n, s[n] / hz }' | sort -k2 -gr
}

# bench_crest_server NAME [ARGS...]: mkfs an image and serve it on a free loopback port
# (BENCH_PORT[NAME]), with `crest serve` ARGS (e.g. --insecure) and, if BENCH_IO_THREADS
# is set, `--io-threads $BENCH_IO_THREADS`.
bench_crest_server() {
  local name=$1 port threads=()
  port=$(bench_free_port)
  [ -z "${BENCH_IO_THREADS:-}" ] || threads=(--io-threads "$BENCH_IO_THREADS")
  "$BENCH_BIN/crest" mkfs --size 16G "${BENCH_MKFS_ARGS[@]}" "$BENCH_BASE/$name.img" >/dev/null
  bench_daemon "$BENCH_LOGS/$name.log" "$BENCH_BIN/crest" serve "$BENCH_BASE/$name.img" --listen "127.0.0.1:$port" \
    "${threads[@]}" "${@:2}"
  bench_wait_port "$port" "$BENCH_LAST_PID"
  BENCH_PORT[$name]=$port
}

# bench_proxy NAME UPSTREAM_PORT RTT_US: a delay proxy in front of UPSTREAM_PORT
# (BENCH_PORT[NAME]); its counters go to $BENCH_LOGS/NAME.log every second.
bench_proxy() {
  local name=$1 port
  port=$(bench_free_port)
  bench_daemon "$BENCH_LOGS/$name.log" \
    "$BENCH_BIN/crest-delay-proxy" --listen "127.0.0.1:$port" --connect "127.0.0.1:$2" --rtt-us "$3" --stats-every 1
  bench_wait_port "$port" "$BENCH_LAST_PID"
  BENCH_PORT[$name]=$port
}

# bench_sshd: an sshd for root on a free loopback port (BENCH_PORT[sshd]) with a fresh
# host key and client key ($BENCH_BASE/ssh/id), public-key login only.
bench_sshd() {
  local d=$BENCH_BASE/ssh port sftp=internal-sftp
  mkdir -p "$d" /run/sshd
  chmod 700 "$d"
  ssh-keygen -q -t ed25519 -N '' -f "$d/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$d/id"
  cp "$d/id.pub" "$d/authorized_keys"
  [ -x /usr/lib/openssh/sftp-server ] && sftp=/usr/lib/openssh/sftp-server
  port=$(bench_free_port)
  cat >"$d/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $d/host_key
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp $sftp
EOF
  bench_daemon "$BENCH_LOGS/sshd.log" /usr/sbin/sshd -D -e -f "$d/sshd_config"
  bench_wait_port "$port" "$BENCH_LAST_PID"
  BENCH_PORT[sshd]=$port
}

# The sshfs options used (besides port): a generated key, no host key check, no prompts;
# caching as sshfs defaults it.
bench_sshfs_opts() {
  echo "IdentityFile=$BENCH_BASE/ssh/id,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR"
}

# The file systems under test. A target's directory is where the workload runs.
#   local      a directory in the scratch directory (CREST_BENCH_DIR, a disk file system)
#   bindfs     bindfs over a directory of the same file system (the local FUSE floor)
#   sshfs      sshfs to the loopback sshd, files on the same file system
#   sshfs-rtt  the same through a delay proxy (BENCH_ADDR[sshfs-rtt] = its port)
#   crest      crest mount of a crest server on loopback (image on the same file system;
#              mutual TLS, as crest runs by default)
#   crest-insecure  the same with --insecure (plaintext: what TLS costs)
#   crest-rtt  crest through a delay proxy
# BENCH_ADDR[target] holds the port (sshfs*) or address (crest*) to mount.
bench_dir() {
  case $1 in
    local) echo "$BENCH_BASE/local" ;;
    *) echo "$BENCH_BASE/mnt/$1" ;;
  esac
}

bench_mount() {
  local t=$1 d
  d=$(bench_dir "$t")
  mkdir -p "$d" "$BENCH_BASE/src/$t"
  case $t in
    local) return 0 ;;
    bindfs) bench_fg bindfs "$BENCH_BASE/src/$t" "$d" ;;
    sshfs | sshfs-rtt)
      bench_fg sshfs -o "port=${BENCH_ADDR[$t]},$(bench_sshfs_opts)" "root@127.0.0.1:$BENCH_BASE/src/$t" "$d" ;;
    crest | crest-rtt) bench_fg "$BENCH_BIN/crest" mount "${BENCH_ADDR[$t]}" "$d" >/dev/null ;;
    crest-insecure) bench_fg "$BENCH_BIN/crest" mount --insecure "${BENCH_ADDR[$t]}" "$d" >/dev/null ;;
    *) echo "bench: unknown target $t" >&2; return 1 ;;
  esac
  BENCH_MOUNTS+=("$d")
}

bench_umount() {
  local t=$1 d
  d=$(bench_dir "$t")
  case $t in
    local) return 0 ;;
    crest | crest-rtt | crest-insecure) bench_fg "$BENCH_BIN/crest" umount "$d" ;;
    *) bench_fg fusermount3 -u "$d" ;;
  esac
}

# bench_cold TARGET: the next access finds nothing cached: unmount, drop caches, mount.
bench_cold() { bench_umount "$1"; bench_drop; bench_mount "$1"; }

# bench_time KEY COMMAND: runs COMMAND with `bash -c`, stores "real user sys" (seconds) in
# BENCH_T[KEY] and, for metabench output, ops/s in BENCH_OPS[KEY]. If it exits non-zero, its
# time is still kept, and BENCH_ERR[KEY] says how it failed (the table marks it with "!").
# Its output goes to $BENCH_LOGS/KEY.log.
bench_time() {
  local key=$1 cmd=$2 log tf rc=0 ops
  log="$BENCH_LOGS/${key// /_}.log"
  tf=$(mktemp "$BENCH_BASE/time.XXXXXX")
  { TIMEFORMAT='%R %U %S'; time bench_fg bash -c "$cmd" >"$log" 2>&1; } 2>"$tf" || rc=$?
  BENCH_T[$key]=$(tail -1 "$tf")
  rm -f "$tf"
  if [ "$rc" != 0 ]; then
    BENCH_FAILED=$((BENCH_FAILED + 1))
    BENCH_ERR[$key]="exit $rc, $(grep -c . "$log") lines of errors, first: $(head -1 "$log")"
    echo "bench: $key failed (exit $rc); $log ends with:" >&2
    tail -3 "$log" | sed 's/^/    /' >&2
  fi
  ops=$(sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' "$log" | tail -1)
  [ -z "$ops" ] || BENCH_OPS[$key]=$ops
}

# bench_ratio A B: A / B to two decimals, or "-" when either is missing or B is zero.
bench_ratio() {
  case "$1 $2" in *-* | " "* | *" ") echo "-"; return ;; esac
  if [ "$(echo "$2 == 0" | bc)" = 1 ]; then echo "-"; else printf '%.2f' "$(echo "$1 / $2" | bc -l)"; fi
}

# bench_median V...: the median of the numbers given (the mean of the middle two for an even
# count), "-" when there are none.
bench_median() {
  [ $# -gt 0 ] || { echo -; return; }
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR % 2) printf "%.2f\n", v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# bench_table "PHASES" "TARGETS" [ROUNDS]: real/user/sys per phase and target, real time
# against bindfs and local (when they ran), and ops/s where the workload counted operations.
# With ROUNDS, the keys are "phase target@round" for rounds 1..ROUNDS: each figure is the
# median over the rounds, and each ratio the median of the rounds' ratios (a target against
# the baseline of its own round, as machine noise moves both), with the spread of those
# ratios (min-max) beside it when there is more than one round. A "!" marks a command that
# failed (its time is still shown); the reasons follow the table.
bench_table() {
  local phase t r u s mark key n rounds=${3:-} reals users syss br lr bx lx ops
  local -a suffixes=("")
  if [ -n "$rounds" ]; then suffixes=(); for ((n = 1; n <= rounds; n++)); do suffixes+=("@$n"); done; fi
  printf '%-8s %-14s %10s %8s %8s %9s %11s %9s %11s %10s\n' phase target real user sys "x bindfs" "(spread)" "x local" "(spread)" "ops/s"
  for phase in $1; do
    for t in $2; do
      reals=() users=() syss=() bx=() lx=() ops=() mark=' '
      for n in "${suffixes[@]}"; do
        key="$phase $t$n"
        [ -z "${BENCH_ERR[$key]:-}" ] || mark='!'
        [ -n "${BENCH_OPS[$key]:-}" ] && [ "${BENCH_OPS[$key]}" != - ] && ops+=("${BENCH_OPS[$key]}")
        [ -n "${BENCH_T[$key]:-}" ] || continue
        read -r r u s <<<"${BENCH_T[$key]}"
        [ -n "$r" ] || continue
        reals+=("$r"); users+=("${u:-0}"); syss+=("${s:-0}")
        read -r br _ <<<"${BENCH_T[$phase bindfs$n]:-}"
        read -r lr _ <<<"${BENCH_T[$phase local$n]:-}"
        r=$(bench_ratio "$r" "${br:--}"); [ "$r" = - ] || bx+=("$r")
        r=$(bench_ratio "${reals[-1]}" "${lr:--}"); [ "$r" = - ] || lx+=("$r")
      done
      printf '%-8s %-14s %9s%s %8s %8s %9s %11s %9s %11s %10s\n' "$phase" "$t" \
        "$(bench_median "${reals[@]}")" "$mark" "$(bench_median "${users[@]}")" "$(bench_median "${syss[@]}")" \
        "$(bench_median "${bx[@]}")" "$(bench_spread "${bx[@]}")" "$(bench_median "${lx[@]}")" "$(bench_spread "${lx[@]}")" \
        "$(if [ ${#ops[@]} = 0 ]; then echo -; else printf '%.0f' "$(bench_median "${ops[@]}")"; fi)"
    done
  done
  for phase in $1; do
    for t in $2; do
      for n in "${suffixes[@]}"; do
        key="$phase $t$n"
        [ -z "${BENCH_ERR[$key]:-}" ] || printf '! %s: %s\n' "$key" "${BENCH_ERR[$key]}"
      done
    done
  done
}

# bench_spread V...: "min-max" of two or more numbers; empty otherwise.
bench_spread() {
  [ $# -gt 1 ] || return 0
  printf '%s\n' "$@" | sort -g | sed -n '1h;${H;x;s/\n/-/;p}'
}

# bench_pairs PHASES A B ROUNDS: for each phase, A's real time over B's in each round (B the
# baseline of A's own round), and their median: what A costs over B (crest's TLS against
# --insecure, say).
bench_pairs() {
  local phase n a b r
  local -a ratios
  printf '%-8s %9s %11s   %s\n' phase median "(spread)" "per round"
  for phase in $1; do
    ratios=()
    for ((n = 1; n <= $4; n++)); do
      read -r a _ <<<"${BENCH_T[$phase $2@$n]:-}"
      read -r b _ <<<"${BENCH_T[$phase $3@$n]:-}"
      r=$(bench_ratio "${a:--}" "${b:--}"); [ "$r" = - ] || ratios+=("$r")
    done
    printf '%-8s %9s %11s   %s\n' "$phase" "$(bench_median "${ratios[@]}")" "$(bench_spread "${ratios[@]}")" "${ratios[*]:-}"
  done
}
