#!/usr/bin/env bash
# Installs what building and testing crest needs on a fresh Debian machine, idempotently:
# rustfmt and clippy for the Rust toolchain (rustup; Rust itself must be present) and the
# Debian packages the build uses. Later issues add fuse3 and the POSIX suites here.
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
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "setup: $(cargo --version)"
