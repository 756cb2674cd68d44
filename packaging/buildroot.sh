#!/usr/bin/env bash
# Print the path of a Debian 12 root of architecture ARCH that can build the package
# (packaging/build-deb.sh run inside it: its own /usr/bin/python3, gcc, libsystemd-dev,
# dpkg-dev), debootstrapping it on first use. `make deb ARCH=arm64` uses it on an amd64
# machine, with qemu-user-static running the arm64 code (docs/install.md, "arm64").
#
# Cached under $BUILD_ROOTS (default build/roots, git-ignored) by what it is made of: a
# root is built in a temporary folder and renamed into place when complete, so an
# interrupted debootstrap never leaves half a root behind. About 6 minutes under emulation
# on the two-core dev box, once.
#
#   bash packaging/buildroot.sh arm64    ->  build/roots/bookworm-arm64-<key>
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:?usage: buildroot.sh ARCH}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What build-deb.sh runs: the interpreter and its venv module, the headers and compiler for
# systemd-python, dpkg-deb/dpkg-shlibdeps/dpkg-buildflags, and CA certificates for pip.
PACKAGES=python3,python3-venv,python3-dev,gcc,libc6-dev,pkg-config,libsystemd-dev,dpkg-dev,ca-certificates
ROOTS=${BUILD_ROOTS:-build/roots}

say() { printf '\033[1m[buildroot]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1m[buildroot]\033[0m error: %s\n' "$*" >&2; exit 1; }

key=$(printf '%s\n' "$SUITE" "$ARCH" "$MIRROR" "$PACKAGES" | sha256sum | cut -c1-12)
mkdir -p "$ROOTS"
ROOTS=$(cd "$ROOTS" && pwd)
root=$ROOTS/$SUITE-$ARCH-$key
if [ -d "$root" ]; then
  echo "$root"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
exec 9>"$ROOTS/.lock"
flock 9
if [ ! -d "$root" ]; then
  tmp=$(mktemp -d "$ROOTS/.$SUITE-$ARCH-$key.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  say "debootstrap $SUITE ($ARCH) into $root (log: $root.log)"
  SECONDS=0
  debootstrap --arch="$ARCH" --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/root" \
    "$MIRROR" >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; die "debootstrap failed"; }
  apt_clean=("$tmp/root/var/cache/apt/archives/"*.deb)
  rm -f "${apt_clean[@]}"
  mv "$tmp/root" "$root"
  say "done in ${SECONDS} s"
fi
echo "$root"
