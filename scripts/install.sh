#!/usr/bin/env bash
# Installs the built `crest` into /usr/local/bin and the mount helper that
# `mount -t fuse.crest` and /etc/fstab use (/sbin/mount.fuse.crest → crest).
set -euo pipefail
cd "$(dirname "$0")/.."
install -m 755 target/release/crest /usr/local/bin/crest
ln -sf /usr/local/bin/crest /sbin/mount.fuse.crest
