#!/usr/bin/env bash
# Fuzzes crest-store and crest-proto with the cargo-fuzz targets in fuzz/ (decode_node,
# decode_items, transactions; decode_frame for the wire; server_ops: the server core under
# arbitrary sessions and requests, fsck after; client_core: the client core under a
# hostile server; decode_records: session records and root items read back at open;
# receive_stream: send streams from a hostile sender, undone cleanly when refused).
# First replays every saved reproducer in fuzz/regressions/ through its target (a file
# named <target>-<n> belongs to <target>), then runs each target for CREST_FUZZ_SECONDS
# seconds (default 30: CI's smoke run; give more for a real hunt).
#
# Needs the nightly toolchain; installs cargo-fuzz if it is missing.
#
# Environment:
#   CREST_FUZZ_SECONDS    seconds per target (default 30)
#   CREST_FUZZ_TARGETS    space-separated targets to run (default: all of them)
#   CREST_FUZZ_SANITIZER  cargo-fuzz sanitizer (default none: the store is safe Rust
#                         without unsafe code, panics and the targets' own checks are what
#                         find bugs, and AddressSanitizer makes `transactions` 4-10x slower;
#                         use `address` to also check the dependencies' unsafe code)
#   CREST_FUZZ_JOBS       libFuzzer -fork jobs per target (default 1: a single process)
#
# Corpora grow in fuzz/corpus/<target>, crashes land in fuzz/artifacts/<target> (both
# ignored by git). A crash fails the script; copy a small reproducer to
# fuzz/regressions/<target>-<n> so every later run replays it (other files there, such
# as its README, are skipped).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

seconds="${CREST_FUZZ_SECONDS:-30}"
sanitizer="${CREST_FUZZ_SANITIZER:-none}"
jobs="${CREST_FUZZ_JOBS:-1}"
all_targets=(decode_node decode_items transactions decode_frame server_ops client_core decode_records receive_stream)
read -r -a targets <<<"${CREST_FUZZ_TARGETS:-${all_targets[*]}}"

if ! rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    echo "fuzz.sh: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# Extra libFuzzer flags per target.
target_args() {
    case "$1" in
        # A node is one 4 KiB block plus the header fields of the input.
        decode_node) echo "-max_len=8192" ;;
        # Room for a few frames with bodies of some size.
        decode_frame) echo "-max_len=16384" ;;
        *) echo "" ;;
    esac
}

fuzz() {
    cargo +nightly fuzz run --sanitizer "$sanitizer" "$@"
}

echo "fuzz.sh: building the targets (sanitizer: $sanitizer)"
cargo +nightly fuzz build --sanitizer "$sanitizer"

# 1. Replay the saved reproducers: each must now run without a crash.
replayed=0
if [ -d regressions ]; then
    for f in regressions/*-*; do
        [ -f "$f" ] || continue
        base="$(basename "$f")"
        target="${base%-*}"
        if [ ! -f "fuzz_targets/$target.rs" ]; then
            echo "fuzz.sh: $f names no target (expected <target>-<n>)" >&2
            exit 1
        fi
        echo "fuzz.sh: replaying $f through $target"
        fuzz "$target" "$f"
        replayed=$((replayed + 1))
    done
fi
echo "fuzz.sh: $replayed regression input(s) replayed"

# 2. Fuzz each target for a while.
for target in "${targets[@]}"; do
    echo "fuzz.sh: fuzzing $target for ${seconds}s"
    mkdir -p "corpus/$target"
    read -r -a extra <<<"$(target_args "$target")"
    if [ "$jobs" -gt 1 ]; then
        extra+=("-fork=$jobs")
    fi
    fuzz "$target" "corpus/$target" -- -max_total_time="$seconds" "${extra[@]}"
done
echo "fuzz.sh: ${#targets[@]} target(s) fuzzed for ${seconds}s each, no crash"
