#!/usr/bin/env bash
# Installs what building and testing crest needs on a fresh Debian machine, idempotently:
# rustfmt and clippy for the Rust toolchain (rustup; Rust itself must be present), the
# Debian packages the build, the mount tests and the benchmarks use (fuse3, attr, acl, bindfs,
# e2fsprogs and util-linux for tests/cli.sh; groff-base and man-db for tests/ops.sh;
# sshfs and openssh-server for bench/headline.sh), the POSIX suites (pjdfstest, fsx) and the
# users pjdfstest switches to.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no cargo found; crest needs Rust 1.89 or newer (rustup, https://rustup.rs)" >&2
    exit 1
  fi
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v setfattr >/dev/null 2>&1 || need+=(attr)
# tests/e2e/acl.py: POSIX ACLs on a crest mount against the local disk.
command -v setfacl >/dev/null 2>&1 || need+=(acl)
command -v bindfs >/dev/null 2>&1 || need+=(bindfs)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
command -v bc >/dev/null 2>&1 || need+=(bc)
# tests/cli.sh: real ext4 and swap signatures for mkfs to refuse, blkid to see them wiped.
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v blkid >/dev/null 2>&1 || need+=(util-linux)
command -v mkswap >/dev/null 2>&1 || need+=(util-linux)
# tests/ops.sh: the man pages rendered (groff) and read (man).
command -v groff >/dev/null 2>&1 || need+=(groff-base)
command -v man >/dev/null 2>&1 || need+=(man-db)
command -v sshfs >/dev/null 2>&1 || need+=(sshfs)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The POSIX suites run on real mounts (tests/e2e/run.sh).
for tool in pjdfstest fsx; do
  command -v "$tool" >/dev/null 2>&1 || cargo install --locked "$tool"
done
# pjdfstest switches to these users and groups.
getent group nogroup >/dev/null || groupadd nogroup
id nobody >/dev/null 2>&1 || useradd -M -g nogroup -s /usr/sbin/nologin nobody
id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests
[ -e /dev/fuse ] || echo "setup: warning: /dev/fuse is missing; mounts will fail" >&2
echo "setup: $(cargo --version)"
