#!/usr/bin/env bash
# Brings up a one-node Ceph cluster with its RADOS Gateway (S3 API) on 127.0.0.1, from the
# Debian packages, for tests of crest's object-store data back-end.
#
# Usage:
#   scripts/object-store.sh start         start the cluster (or find it running) and print
#                                         export lines for eval; progress goes to stderr:
#                                           eval "$(scripts/object-store.sh start)"
#   scripts/object-store.sh status        say whether it runs (exit 0 if it does, 1 if not)
#   scripts/object-store.sh stop [--keep] stop its daemons and remove the state directory
#                                         (--keep leaves the directory and its logs)
#   scripts/object-store.sh -h|--help     this text
#
# start installs what is missing with apt-get (ceph-mon ceph-mgr ceph-osd radosgw
# ceph-common ceph-base curl procps), makes one mon, one mgr, one OSD and one radosgw, all
# run as root from the state directory with its own ceph.conf (nothing in /etc/ceph is read
# or written), creates an S3 user "crest" with fresh keys and a bucket, and prints (and writes to $CREST_CEPH_DIR/env,
# for a later `source`) AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL,
# AWS_REGION and CREST_DATA_URL. Run while up, it checks the gateway and prints them again;
# a state directory left by a dead or half-dead cluster is wiped and the cluster made afresh.
#
# Environment:
#   CREST_CEPH_DIR      state directory (default /var/tmp/crest-ceph)
#   CREST_RGW_PORT      loopback port of the gateway (default 7480)
#   CREST_MON_PORT      loopback port of the monitor, msgr2 only (default 3300)
#   CREST_BUCKET        bucket to create (default crest)
#   CREST_CEPH_STORE    OSD object store: bluestore (default) or memstore
#   CREST_CEPH_TIMEOUT  seconds each wait may take before start fails (default 180)
#
# Choices: bluestore on a 10 GiB sparse file in the state directory (it starts as reliably
# as memstore here, and keeps data on disk like a real back-end; memstore keeps it in RAM).
# auth none, which needs the messenger modes set to crc or the clients never authenticate.
# Pool size 1, 8 PGs a pool without the autoscaler, osd_memory_target 1 GiB, and the mgr
# with no optional module enabled, so the cluster stays small on a 2-core machine (idle, all
# four daemons take under 1% of a core; the mgr's always-on modules stay: disabling them
# turns the health to HEALTH_ERR). The bucket is made with curl --aws-sigv4. The gateway's
# frontend sets TCP_NODELAY: without it every small request on a reused connection waited
# ~40 ms (Nagle's algorithm against delayed ACKs: a 1,000-byte ranged GET 43 ms, 1-3 ms
# with it).
set -euo pipefail

DIR=${CREST_CEPH_DIR:-/var/tmp/crest-ceph}
RGW_PORT=${CREST_RGW_PORT:-7480}
MON_PORT=${CREST_MON_PORT:-3300}
BUCKET=${CREST_BUCKET:-crest}
STORE=${CREST_CEPH_STORE:-bluestore}
TIMEOUT=${CREST_CEPH_TIMEOUT:-180}
REGION=us-east-1
CONF=$DIR/ceph.conf
MARK=$DIR/.crest-object-store
# Each daemon: its name, which is also the stem of its pid and log files.
DAEMONS=(client.rgw.a osd.0 mgr.x mon.a)

log() { printf 'object-store: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

# The EXIT trap while starting: a start that fails stops what it started, keeping the logs.
abort_start() {
  trap - EXIT
  stop_daemons
  log "start failed; logs kept in $DIR/log (\`$0 stop\` removes them)"
  exit 1
}

usage() {
  sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p}}' "$0"
}

ceph_cli() { ceph -c "$CONF" --connect-timeout 10 "$@"; }

install_packages() {
  local need=() tool pkg
  for tool in ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd radosgw:radosgw \
    radosgw-admin:ceph-common ceph:ceph-common monmaptool:ceph-base curl:curl pgrep:procps; do
    pkg=${tool#*:}
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("$pkg")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing ${need[*]}"
  apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${need[@]}" >&2
}

# Whether pid is a live process: not gone, and not a zombie its parent has yet to reap.
live() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ]
}

any_live() {
  local pid
  for pid; do live "$pid" && return 0; done
  return 1
}

# The pids of the daemons: from their pid files, and any process still naming our ceph.conf.
daemon_pids() {
  local name pid
  for name in "${DAEMONS[@]}"; do
    pid=$(cat "$DIR/run/$name.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && live "$pid"; then echo "$pid"; fi
  done
  if [ -f "$CONF" ]; then
    for pid in $(pgrep -f -- "-c $CONF( |$)"); do live "$pid" && echo "$pid"; done
  fi
}

alive() {
  local pid
  pid=$(cat "$DIR/run/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && live "$pid"
}

all_alive() {
  local name
  for name in "${DAEMONS[@]}"; do alive "$name" || return 1; done
}

endpoint() {
  if [ -f "$DIR/env" ]; then
    sed -n 's/^export AWS_ENDPOINT_URL=//p' "$DIR/env"
  else
    echo "http://127.0.0.1:$RGW_PORT"
  fi
}

gateway_answers() {
  curl -s -o /dev/null -m 5 -w '%{http_code}' "$1/" 2>/dev/null | grep -q '^[1-5]'
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Stops every daemon: SIGTERM, then SIGKILL after 30 s.
stop_daemons() {
  local pids i
  mapfile -t pids < <(daemon_pids | sort -u)
  [ ${#pids[@]} -eq 0 ] && return 0
  log "stopping pids ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do
    any_live "${pids[@]}" || return 0
    sleep 0.5
  done
  log "still running after 30 s; SIGKILL"
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.5
}

# Fails unless the state directory is absent, empty or made by this script: its pid files
# are not someone else's, nor its files for wiping.
check_ours() {
  [ -e "$DIR" ] || return 0
  case "$DIR" in '' | / | /var | /var/tmp | /tmp) die "refusing to use '$DIR'" ;; esac
  if [ ! -f "$MARK" ] && [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR exists and is not an object-store state directory; set CREST_CEPH_DIR"
  fi
}

wipe_dir() {
  check_ours
  rm -rf "$DIR"
}

write_conf() {
  local fsid=$1
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$MON_PORT
public network = 127.0.0.0/8
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms mon cluster mode = crc
ms mon service mode = crc
ms client mode = crc
ms cluster mode = crc
ms service mode = crc
run dir = $DIR/run
keyring = $DIR/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
mon data avail crit = 1
mgr initial modules =
mgr disabled modules = diskprediction_local
$(daemon_conf)
EOF
}

# A daemon's section: where its log, pid file and admin socket go.
conf_section() {
  cat <<EOF
[$1]
log file = $DIR/log/\$name.log
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
EOF
}

# One section a daemon, with its data and its own settings.
daemon_conf() {
  conf_section mon
  echo "mon data = $DIR/mon/\$id"
  conf_section mgr
  echo "mgr data = $DIR/mgr/\$id"
  conf_section osd
  cat <<EOF
osd data = $DIR/osd/\$id
osd objectstore = $STORE
osd memory target = 1073741824
osd op num shards = 2
osd op num threads per shard = 1
bluestore block path = $DIR/osd/\$id.block
bluestore block create = true
bluestore block size = 10737418240
memstore device bytes = 2147483648
EOF
  conf_section client.rgw.a
  cat <<EOF
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw data = $DIR/rgw
rgw enable usage log = false
rgw thread pool size = 64
EOF
}

# Waits until "$@" succeeds, TIMEOUT seconds at most; else shows the log tail and fails.
wait_for() {
  local what=$1 logname=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$what: not ready after $TIMEOUT s; the tail of its logs:"
      tail -n 30 "$DIR/log/$logname.launch" "$DIR/log/$logname.log" >&2 2>/dev/null || true
      die "$what did not come up"
    fi
    sleep 1
  done
}

# Runs a daemon (it forks into the background), its own output going to log/NAME.launch.
launch() {
  local name=$1
  shift
  "$@" >>"$DIR/log/$name.launch" 2>&1 ||
    { tail -n 30 "$DIR/log/$name.launch" >&2; die "$name: $* failed"; }
}

osd_up() { ceph_cli osd stat | grep -q ' 1 up'; }

start_mon() {
  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mkdir -p "$DIR"/{run,log,mon/a,mgr/x,osd/0,rgw}
  touch "$MARK"
  write_conf "$fsid"
  : >"$DIR/keyring"
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$MON_PORT]" \
    "$DIR/monmap" >/dev/null
  launch mon.a ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap"
  launch mon.a ceph-mon -c "$CONF" -i a
  wait_for "mon" mon.a ceph_cli mon stat
  log "mon up (fsid $fsid)"
}

start_mgr_osd() {
  local uuid id
  launch mgr.x ceph-mgr -c "$CONF" -i x
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph_cli osd new "$uuid")
  [ "$id" = 0 ] || die "expected osd id 0, got '$id'"
  launch osd.0 ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid"
  launch osd.0 ceph-osd -c "$CONF" -i 0
  wait_for "osd ($STORE)" osd.0 osd_up
  log "osd up ($STORE)"
}

start_rgw() {
  launch client.rgw.a radosgw -c "$CONF" -n client.rgw.a
  wait_for "radosgw on port $RGW_PORT" client.rgw.a gateway_answers "http://127.0.0.1:$RGW_PORT"
  log "radosgw answers on http://127.0.0.1:$RGW_PORT"
}

hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }

# The S3 user with fresh keys, its bucket, and the env file.
make_user_and_bucket() {
  local access secret url=http://127.0.0.1:$RGW_PORT code
  access=$(hex 10 | tr 'a-f' 'A-F')
  secret=$(hex 20)
  radosgw-admin -c "$CONF" user create --uid=crest --display-name=crest \
    --access-key="$access" --secret-key="$secret" >/dev/null
  # RGW wants x-amz-content-sha256, which this curl does not add: the hash of no payload.
  code=$(curl -s -o "$DIR/log/bucket-create.out" -w '%{http_code}' -X PUT \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$access:$secret" \
    -H "x-amz-content-sha256: $(sha256sum </dev/null | cut -d' ' -f1)" "$url/$BUCKET")
  [ "$code" = 200 ] || die "creating bucket $BUCKET: HTTP $code: $(cat "$DIR/log/bucket-create.out")"
  cat >"$DIR/env" <<EOF
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_ENDPOINT_URL=$url
export AWS_REGION=$REGION
export CREST_DATA_URL=s3://$BUCKET
EOF
  log "user crest and bucket $BUCKET made"
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "start must run as root"
  if [ -f "$DIR/env" ] && all_alive && gateway_answers "$(endpoint)"; then
    log "already running at $(endpoint)"
    cat "$DIR/env"
    return 0
  fi
  install_packages
  if [ -e "$DIR" ]; then
    check_ours
    log "wiping stale $DIR"
    stop_daemons
    wipe_dir
  fi
  port_free "$RGW_PORT" || die "port $RGW_PORT is taken; set CREST_RGW_PORT"
  port_free "$MON_PORT" || die "port $MON_PORT is taken; set CREST_MON_PORT"
  case "$STORE" in bluestore | memstore) ;; *) die "CREST_CEPH_STORE: bluestore or memstore" ;; esac
  log "starting in $DIR"
  trap abort_start EXIT
  start_mon
  start_mgr_osd
  start_rgw
  make_user_and_bucket
  trap - EXIT
  cat "$DIR/env"
}

cmd_stop() {
  local keep=${1:-}
  [ -z "$keep" ] || [ "$keep" = --keep ] || die "stop: unknown option $keep"
  [ -e "$DIR" ] || { log "nothing at $DIR"; return 0; }
  check_ours
  stop_daemons
  if [ "$keep" = --keep ]; then
    log "stopped; $DIR kept"
  else
    wipe_dir
    log "stopped; $DIR removed"
  fi
}

cmd_status() {
  local name state=0
  [ -e "$DIR" ] || { echo "not running (no $DIR)"; return 1; }
  for name in "${DAEMONS[@]}"; do
    if alive "$name"; then
      echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
    else
      echo "$name: not running"
      state=1
    fi
  done
  if gateway_answers "$(endpoint)"; then
    echo "gateway: answers at $(endpoint)"
  else
    echo "gateway: does not answer at $(endpoint)"
    state=1
  fi
  return $state
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  status) cmd_status ;;
  -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
