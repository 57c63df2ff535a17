#!/usr/bin/env bash
# Builds crest's Debian package with cargo-deb: target/debian/crest_VERSION-1_ARCH.deb,
# holding
#   /usr/bin/crest                                the binary (release build)
#   /sbin/mount.fuse.crest -> /usr/bin/crest      for mount -t fuse.crest and /etc/fstab
#   /lib/systemd/system/crest-server@.service     crest-server@NAME serves /var/lib/crest/images/NAME.img
#   /usr/share/man/man1/crest*.1.gz               a page per command (crest man)
#   bash, zsh and fish completions                (crest completions)
# and a postinst that makes /var/lib/crest (mode 700) and its images/ directory.
# Prints the package's path last. Installs cargo-deb if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb.sh: installing cargo-deb" >&2
  cargo install cargo-deb --locked -q
fi
cargo build --release --locked -q -p crest
extra=target/deb-extra
rm -rf "$extra"
mkdir -p "$extra/man" "$extra/completions"
target/release/crest man "$extra/man" >/dev/null
gzip -9n "$extra"/man/*.1
target/release/crest completions bash >"$extra/completions/crest"
target/release/crest completions zsh >"$extra/completions/_crest"
target/release/crest completions fish >"$extra/completions/crest.fish"
# The unit as scripts/install.sh ships it, for the binary where the package puts it.
sed -e 's|/usr/local/bin/crest|/usr/bin/crest|' \
    -e 's|^# scripts/install.sh puts this file in /etc/systemd/system.|# Installed by the crest package (its own copy: /etc/systemd/system overrides it).|' \
    packaging/systemd/crest-server@.service >"$extra/crest-server@.service"
grep -q '^ExecStart=/usr/bin/crest ' "$extra/crest-server@.service" ||
  { echo "deb.sh: the unit's ExecStart was not rewritten" >&2; exit 1; }
ln -s /usr/bin/crest "$extra/mount.fuse.crest"
cargo deb -p crest --no-build --strip --locked -q --output target/debian/ >/dev/null
ls -t target/debian/crest_*.deb | head -1
