#!/usr/bin/env bash
# The whole test suite: formatting, lints, every unit/property/crash/corruption test of the
# workspace (release mode: the crash tests replay thousands of power cuts), the benches
# once in smoke mode, the CLI against a real image file, real FUSE mounts against a real
# server process (pjdfstest, fsx, the kernel-tree round trip, kill -9 of the server), and
# a short fuzz run.
#   CREST_FSX_OPS=N          fsx operations on the mount (default 100000)
#   CREST_CRASH_SEEDS=N      more crash-test workloads (default 16)
#   CREST_CRASH_THOROUGH=1   every single-write drop and more subsets per flush window
#   CREST_FUZZ_SECONDS=N     seconds per fuzz target (default 20; 0 skips fuzzing)
#   CREST_SIM_SEEDS=N        random simulator seeds per mode: short and long outages,
#                            without and with server crashes, and server crashes
#                            between commits (default 100; 50 with long outages too)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== fmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== tests"
cargo test --workspace --release --locked

echo "== coherence simulator: random seeds (each printed; a failure names its seed)"
CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-100} cargo test --release --locked -p crest-sim --test coherence
CREST_SIM_OUTAGES=long CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-100} cargo test --release --locked -p crest-sim --test coherence
CREST_SIM_SERVER_CRASHES=only CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-100} cargo test --release --locked -p crest-sim --test coherence
CREST_SIM_SERVER_CRASHES=only CREST_SIM_OUTAGES=long CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-100} cargo test --release --locked -p crest-sim --test coherence
CREST_SIM_SERVER_CRASHES=only CREST_SIM_LOST_CHANGES=on CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-100} cargo test --release --locked -p crest-sim --test coherence
# Crashes between commits with long outages: 50 random seeds unless told (CREST_SIM_SEEDS),
# the slowest mode.
CREST_SIM_SERVER_CRASHES=only CREST_SIM_LOST_CHANGES=on CREST_SIM_OUTAGES=long CREST_SIM_SEEDS=${CREST_SIM_SEEDS:-50} cargo test --release --locked -p crest-sim --test coherence

echo "== benches (smoke)"
cargo test --workspace --release --locked --benches

echo "== cli on a real image file: mkfs, fsck, serve, mount, umount, mount.fuse.crest (tests/cli.sh)"
cargo build --release --locked -p crest
bash tests/cli.sh

echo "== what operators use: --version, -v/-q/--log-file/CREST_LOG, completions, man pages (tests/ops.sh)"
bash tests/ops.sh
bash tests/config.sh   # /etc/crest/crest.toml and --config: keys, flags win, errors named

echo "== datasets as users meet them: create, mount one, quota, readonly, atime, destroy (tests/datasets.sh)"
bash tests/datasets.sh

echo "== backup between two servers: send | receive, full and incremental, bad streams (tests/sendrecv.sh)"
bash tests/sendrecv.sh

echo "== security as users meet it: TLS by default, join tokens, revocation, --insecure (tests/security.sh)"
bash tests/security.sh

echo "== rolling upgrades: the previous release's server and client against this one's (tests/upgrade.sh)"
bash tests/upgrade.sh

echo "== real mounts: pjdfstest, fsx, kernel-tree round trip, kill -9 (tests/e2e/run.sh)"
bash scripts/install.sh
bash tests/e2e/run.sh

echo "== file data in objects: a one-node Ceph (scripts/object-store.sh), an image made with --data, two mounts, kill -9, the store stopped, the collector, fsck (tests/e2e/objects.sh)"
cargo build --release --locked -p crest-benchtools
ceph_was_up=0
bash scripts/object-store.sh status >/dev/null 2>&1 && ceph_was_up=1
bash tests/e2e/objects.sh
[ "$ceph_was_up" = 1 ] || bash scripts/object-store.sh stop

echo "== the Debian package: built, installed, served by its unit's command, joined from another network namespace, removed (tests/package.sh)"
bash tests/package.sh

echo "== snapshot and scrub benchmark tooling (smoke: 1,000 snapshots, 64 MiB scrubbed)"
bash bench/snapshots.sh --count 1000 --scrub-mib 64

echo "== headline benchmark tooling (smoke: tiny tar, 500 files; sshfs only in full runs)"
bash bench/headline.sh --quick --only local,bindfs,crest,crest-rtt

echo "== many-mounts benchmark tooling (smoke: 1 and 2 mounts, 100 files each)"
bash bench/scale.sh --mounts 2 --count 100 --rounds 1

echo "== idle-client benchmark tooling (smoke: 10 sessions, 2 mounts, 1 s idle)"
bash bench/sessions.sh --sessions 1,10 --mounts 2 --idle-secs 1

if [ "${CREST_FUZZ_SECONDS:-20}" != 0 ] && [ -f scripts/fuzz.sh ]; then
  echo "== fuzz (smoke)"
  CREST_FUZZ_SECONDS=${CREST_FUZZ_SECONDS:-20} bash scripts/fuzz.sh
fi
echo "== all tests passed"
