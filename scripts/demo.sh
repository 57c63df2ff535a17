#!/usr/bin/env bash
# Builds crest, creates an image under ./.crest (override with CREST_DIR), starts
# `crest serve` on it in the background and mounts it on ./.crest/mnt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked
bash scripts/install.sh
dir=${CREST_DIR:-$PWD/.crest}
addr=${CREST_ADDR:-127.0.0.1:7410}
mkdir -p "$dir/mnt"
img=$dir/crest.img
[ -f "$img" ] || crest mkfs --size "${CREST_SIZE:-4G}" "$img"
if ! grep -q " $dir/mnt " /proc/mounts; then
  if ! pgrep -f "crest serve $img" >/dev/null; then
    nohup crest serve "$img" --listen "$addr" >"$dir/serve.log" 2>&1 &
    echo $! >"$dir/serve.pid"
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null && break; sleep 0.05; done
  fi
  crest mount "$addr" "$dir/mnt"
fi
df -h "$dir/mnt"
cat <<MSG

crest is mounted on $dir/mnt (server $addr, image $img, log $dir/serve.log).
Stop it with:
  crest umount $dir/mnt && kill \$(cat $dir/serve.pid)     # the server commits and exits
Check the image afterwards with:
  crest fsck $img
MSG
