#!/usr/bin/env bash
# Builds crest and creates a file system image under ./.crest (override with CREST_DIR),
# then checks it. `crest serve` and `crest mount` come with the server and client; until
# then this is what a newcomer can run end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked
dir=${CREST_DIR:-$PWD/.crest}
mkdir -p "$dir"
img=$dir/crest.img
if [ ! -f "$img" ]; then
  target/release/crest mkfs --size "${CREST_SIZE:-2G}" "$img"
fi
target/release/crest fsck "$img"
echo
echo "image: $img  (check it any time: target/release/crest fsck $img)"
echo "remove it with: rm $img"
