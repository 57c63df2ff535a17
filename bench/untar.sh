#!/usr/bin/env bash
# The headline workload on crest, the local file system and a local FUSE passthrough
# (bindfs) in one run: untar the kernel subset, read every file back cold (after
# unmount/remount and dropping the page cache), rm -rf. Prints real/user/sys per phase and
# ratios against bindfs and the local file system.
#   bench/untar.sh [TAR]   (default: the ~20K-file kernel subset from kernel-tars.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
tarball=${1:-/dev/shm/crest-bench/linux-6.1-small.tar}
root=$PWD
[ -f "$tarball" ] || bash "$(ls -d "$root/../shared/bench/kernel-tars.sh" /work/shared/bench/kernel-tars.sh 2>/dev/null | head -1)" "$(dirname "$tarball")"
cargo build --release --locked -q
bash scripts/install.sh
base=${CREST_BENCH_DIR:-/var/tmp}/crest-untar.$$
mkdir -p "$base"/{local,bindsrc,bind,crestmnt}
port=$((20000 + RANDOM % 20000)); addr=127.0.0.1:$port
crest mkfs --size 16G "$base/crest.img" >/dev/null
crest serve "$base/crest.img" --listen "$addr" >"$base/serve.log" 2>&1 &
server=$!
cleanup() {
  crest umount "$base/crestmnt" 2>/dev/null || true
  fusermount3 -u "$base/bind" 2>/dev/null || true
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
  rm -rf "$base"
}
trap cleanup EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done

mount_fs() { case $1 in
  crest) crest mount "$addr" "$base/crestmnt" >/dev/null ;;
  bindfs) bindfs "$base/bindsrc" "$base/bind" ;;
  local) ;; esac; }
umount_fs() { case $1 in
  crest) crest umount "$base/crestmnt" ;;
  bindfs) fusermount3 -u "$base/bind" ;;
  local) ;; esac; }
dir_of() { case $1 in crest) echo "$base/crestmnt" ;; bindfs) echo "$base/bind" ;; local) echo "$base/local" ;; esac; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

declare -A T
timeit() { # key command...
  local t0 u0 s0 t1
  local out; out=$( { TIMEFORMAT='%R %U %S'; time "${@:2}" >/dev/null 2>&1; } 2>&1 | tail -1 )
  T[$1]=$out
}
for fs in local bindfs crest; do
  mount_fs $fs; d=$(dir_of $fs)
  drop
  timeit "$fs untar" bash -c "tar -xf '$tarball' -C '$d' && sync -f '$d'"
  umount_fs $fs; drop; mount_fs $fs
  timeit "$fs read" bash -c "cd '$d' && find . -type f -print0 | xargs -0 cat >/dev/null"
  timeit "$fs rm" bash -c "rm -rf '$d'/* && sync -f '$d'"
  umount_fs $fs
done
printf '\n%s, %s\n' "$(basename "$tarball")" "$(date -u +%F)"
printf '%-8s %-6s %9s %9s %9s %10s %10s\n' phase fs real user sys "x bindfs" "x local"
for phase in untar read rm; do
  read -r lr _ _ <<<"${T[local $phase]}"; read -r br _ _ <<<"${T[bindfs $phase]}"
  for fs in local bindfs crest; do
    read -r r u s <<<"${T[$fs $phase]}"
    printf '%-8s %-6s %9s %9s %9s %10.2f %10.2f\n' "$phase" "$fs" "$r" "$u" "$s" \
      "$(echo "$r / $br" | bc -l)" "$(echo "$r / $lr" | bc -l)"
  done
done
