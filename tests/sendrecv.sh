#!/usr/bin/env bash
# Backup between two real TLS servers as a user does it (root): crest send | crest
# receive, full then incremental, gives a dataset whose every path matches the source
# snapshot in type, mode, owner, size, times, link count and hard-link groups, device
# number, symlink target, content (holes too) and xattrs (signatures of both mounted
# trees compared); a stream with one flipped byte, a stream cut short, a stream whose
# base the target lacks, and a receive into a mounted dataset are refused and change
# nothing; a target changed since its base needs --force; fsck is clean on both images.
# Sizes and offsets come from $RANDOM (the seed is printed).
#   CREST_BIN   the crest binary (default target/release/crest)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
crest=${CREST_BIN:-$root/target/release/crest}
[ -x "$crest" ] || { echo "build first: cargo build --release -p crest" >&2; exit 2; }
tmp=$(mktemp -d /tmp/crest-sr.XXXXXX)
export CREST_STATE_DIR=$tmp/state
fails=0
servers=()
mounts=("$tmp/src" "$tmp/dst" "$tmp/snap")
seed=${CREST_SR_SEED:-$RANDOM}
RANDOM=$seed
echo "CREST_SR_SEED=$seed"

cleanup() {
  for m in "${mounts[@]}"; do
    grep -qF " $m " /proc/self/mountinfo && umount -l "$m" 2>/dev/null
  done
  for s in "${servers[@]}"; do kill "$s" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "$*"; fi; }
# Everything a user can see of a tree, one line per path, hard links as groups.
signature() {
  python3 - "$1" <<'PY'
import hashlib, os, stat, sys
top = sys.argv[1]
first = {}
for d, dirs, files in os.walk(top):
    dirs.sort()
    for name in [""] + sorted(dirs + files):
        if name == "" and d != top:
            continue
        p = os.path.join(d, name) if name else d
        rel = os.path.relpath(p, top)
        st = os.lstat(p)
        line = [rel, oct(st.st_mode), st.st_uid, st.st_gid, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns]
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 20), b""):
                    h.update(b)
            line += [st.st_size, h.hexdigest()]
            key = st.st_ino
            line.append("link-of " + first.setdefault(key, rel))
        elif stat.S_ISLNK(st.st_mode):
            line += [os.readlink(p)]
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            line += [st.st_rdev]
        if not stat.S_ISLNK(st.st_mode):
            for x in sorted(os.listxattr(p, follow_symlinks=False)):
                line.append((x, hashlib.sha256(os.getxattr(p, x, follow_symlinks=False)).hexdigest()[:16]))
        print(*line)
PY
}
same_tree() {
  signature "$1" >"$tmp/sig.a" && signature "$2" >"$tmp/sig.b" && cmp -s "$tmp/sig.a" "$tmp/sig.b" && return 0
  diff "$tmp/sig.a" "$tmp/sig.b" | head -8
  return 1
}
flip_byte() {
  python3 - "$1" "$RANDOM" <<'PY'
import random, sys
path, seed = sys.argv[1], int(sys.argv[2])
data = bytearray(open(path, "rb").read())
at = random.Random(seed).randrange(len(data))
data[at] ^= 1 << random.Random(seed + 1).randrange(8)
open(path, "wb").write(data)
print("flipped byte", at, "of", len(data), file=sys.stderr)
PY
}

pa=$(free_port)
pb=$(free_port)
while [ "$pb" = "$pa" ]; do pb=$(free_port); done
A=127.0.0.1:$pa
B=127.0.0.1:$pb
for s in a b; do "$crest" mkfs --size 512M "$tmp/$s.img" >/dev/null; done
"$crest" serve "$tmp/a.img" --listen "$A" >>"$tmp/a.log" 2>&1 &
servers+=($!)
"$crest" serve "$tmp/b.img" --listen "$B" >>"$tmp/b.log" 2>&1 &
servers+=($!)
wait_listen "$pa" && wait_listen "$pb" || { echo "servers did not start"; tail "$tmp"/*.log; exit 1; }
mkdir -p "${mounts[@]}"
mnt() { "$crest" mount "$1" "$2" -o "dataset=$3" >/dev/null; }
umnt() { "$crest" umount "$1"; }

echo "== a tree with everything in it"
expect dataset-create 0 "$crest" dataset create proj --server "$A"
mnt "$A" "$tmp/src" proj
s=$tmp/src
cp -a "$root/crates" "$root/docs" "$s/"
mkdir -p "$s/odd/deep/er"
ln "$s/docs/format.md" "$s/odd/hard"
ln -s ../docs/format.md "$s/odd/soft"
ln -s "$(head -c 900 /dev/zero | tr '\0' x)" "$s/odd/longlink"
mkfifo "$s/odd/fifo"
mknod "$s/odd/null" c 1 3
size=$((RANDOM * 3000 + 1))
truncate -s "$size" "$s/odd/sparse"
head -c $((RANDOM % 9000 + 1)) /dev/urandom | dd of="$s/odd/sparse" bs=1 seek=$((RANDOM * 97)) conv=notrunc status=none
for f in "$s/odd/hard" "$s/odd/deep"; do
  setfattr -n user.small -v "v$RANDOM" "$f"
  setfattr -n user.big -v "0x$(head -c $((RANDOM % 6000 + 2000)) /dev/urandom | od -An -tx1 | tr -d ' \n')" "$f"
done
chown 1234:5678 "$s/odd/deep"
chmod 4750 "$s/odd/hard"
touch -d '1999-12-31 23:59:59.123456789' "$s/odd/fifo"
expect snapshot-one 0 "$crest" snapshot create proj@one --server "$A"

echo "== full send and receive"
run bash -c "'$crest' send proj@one --server '$A' | '$crest' receive copy --server '$B'"
[ "$rc" = 0 ] && grep -q "received copy@one" "$tmp/out" && pass full-receive || fail full-receive "$(said)"
mnt "$A" "$tmp/snap" proj@one
mnt "$B" "$tmp/dst" copy@one
check full-snapshot-identical same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/dst"
mnt "$B" "$tmp/dst" copy
check full-dataset-identical same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/dst"
umnt "$tmp/snap"

echo "== changes, incremental send"
rm -rf "$s/crates/cli" "$s/odd/null"
mv "$s/crates/store" "$s/moved-store"
mv "$s/docs/protocol.md" "$s/odd/hard" 2>/dev/null # over a hard link
echo appended >>"$s/docs/format.md"
truncate -s $((RANDOM * 10)) "$s/odd/sparse"
fallocate -p -o $((RANDOM % 4 * 4096 + RANDOM % 100)) -l $((RANDOM % 20000 + 1)) "$s/moved-store/src/send.rs"
setfattr -n user.big -v "0x$(head -c 3000 /dev/urandom | od -An -tx1 | tr -d ' \n')" "$s/odd/deep"
setfattr -x user.small "$s/odd/deep"
mkdir "$s/new" && cp "$root/README.md" "$s/new/" && ln -s README.md "$s/new/l"
chmod 700 "$s/odd/deep/er"
expect snapshot-two 0 "$crest" snapshot create proj@two --server "$A"
expect send-incremental 0 bash -c "'$crest' send proj@two -i @one --server '$A' >'$tmp/incr.bin'"
expect receive-incremental 0 "$crest" receive copy --server "$B" <"$tmp/incr.bin"
mnt "$A" "$tmp/snap" proj@two
mnt "$B" "$tmp/dst" copy@two
check incremental-snapshot-identical same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/dst"
umnt "$tmp/snap"
mnt "$A" "$tmp/snap" proj@one
mnt "$B" "$tmp/dst" copy@one
check base-kept same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/dst"
umnt "$tmp/snap"

echo "== bad streams change nothing"
echo "third" >"$s/third"
expect snapshot-three 0 "$crest" snapshot create proj@three --server "$A"
"$crest" send proj@three -i proj@two --server "$A" >"$tmp/good.bin"
cp "$tmp/good.bin" "$tmp/flipped.bin"
flip_byte "$tmp/flipped.bin"
expect flipped-refused 1 "$crest" receive copy --server "$B" <"$tmp/flipped.bin"
head -c $(($(stat -c %s "$tmp/good.bin") * (RANDOM % 90 + 5) / 100)) "$tmp/good.bin" >"$tmp/cut.bin"
expect cut-refused 1 "$crest" receive copy --server "$B" <"$tmp/cut.bin"
mentions cut-says-why "cut short"
expect wrong-base-refused 1 "$crest" receive other --server "$B" <"$tmp/good.bin"
mnt "$B" "$tmp/dst" copy
expect mounted-target-refused 1 "$crest" receive copy --server "$B" <"$tmp/good.bin"
mentions mounted-says-why "mounted"
mnt "$A" "$tmp/snap" proj@two
check target-unchanged same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/snap"
touch "$tmp/dst/local-change"
umnt "$tmp/dst"
expect changed-target-refused 1 "$crest" receive copy --server "$B" <"$tmp/good.bin"
mentions changed-says-force "--force"
expect forced-receive 0 "$crest" receive --force copy --server "$B" <"$tmp/good.bin"
mnt "$A" "$tmp/snap" proj@three
mnt "$B" "$tmp/dst" copy
check forced-identical same_tree "$tmp/snap" "$tmp/dst"
umnt "$tmp/dst"
umnt "$tmp/snap"
umnt "$tmp/src"
run "$crest" snapshot list --server "$B"
grep -q "copy@three" "$tmp/out" && pass snapshots-listed || fail snapshots-listed "$(said)"

echo "== both images clean"
for s in "${servers[@]}"; do kill "$s"; done
wait 2>/dev/null
servers=()
expect fsck-source 0 "$crest" fsck "$tmp/a.img"
expect fsck-target 0 "$crest" fsck "$tmp/b.img"

echo "sendrecv.sh: $fails failed"
[ "$fails" = 0 ]
