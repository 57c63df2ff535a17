#!/usr/bin/env bash
# Installs the built `crest` into /usr/local/bin, the mount helper that
# `mount -t fuse.crest` and /etc/fstab use (/sbin/mount.fuse.crest → crest), and the
# server's systemd unit (packaging/systemd/crest-server@.service).
set -euo pipefail
cd "$(dirname "$0")/.."
install -m 755 target/release/crest /usr/local/bin/crest
ln -sf /usr/local/bin/crest /sbin/mount.fuse.crest
# The server as a systemd service (crest-server@NAME serves /var/lib/crest/images/NAME.img).
# (/var/lib/crest holds root's keys: private, or crest refuses it.)
install -d -m 755 /etc/systemd/system
install -d -m 700 /var/lib/crest /var/lib/crest/images
install -m 644 packaging/systemd/crest-server@.service /etc/systemd/system/
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
