#!/usr/bin/env bash
# build-deb.sh for another architecture than the machine's (`make deb ARCH=arm64` on amd64):
# the same script, run inside a Debian 12 root of that architecture (packaging/buildroot.sh)
# under systemd-nspawn, its code executed by qemu-user-static through binfmt_misc. So the
# venv is made by that root's own /usr/bin/python3 from the locked aarch64 wheels, and the
# one C extension is compiled by its gcc: nothing of the machine's amd64 userland is in it.
#
# The checkout is bound read-only at /src, the output folder at /out, a build folder on
# disk at /build (the venv is 700 MiB; the root's overlay is a tmpfs) and a pip cache
# (build/pip-cache/ARCH: the wheels are hash-checked, so a cached download is the same
# bytes) at /root/.cache/pip. The root itself is never written (--volatile=overlay).
# Environment: as build-deb.sh (VERSION, OUT, EXCLUDE, WHEELHOUSE, SOURCE_DATE_EPOCH).
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."
ARCH=${1:?usage: build-foreign.sh ARCH}

say() { printf '\033[1m[deb]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[deb]\033[0m error: %s\n' "$*" >&2; exit 1; }

case $ARCH in
  arm64) qemu=aarch64 ;;
  *) die "no foreign build for $ARCH (arm64 only)" ;;
esac
[ "$(id -u)" = 0 ] || die "a foreign build needs root (debootstrap, systemd-nspawn)"
command -v systemd-nspawn >/dev/null || die "systemd-nspawn is missing (apt-get install systemd-container)"
binfmt=/proc/sys/fs/binfmt_misc/qemu-$qemu
if [ ! -e "$binfmt" ] || [ "$(head -n 1 "$binfmt")" != enabled ]; then
  die "qemu-$qemu is not registered with binfmt_misc: sudo bash packaging/qemu-setup.sh (qemu-user-static, binfmt-support, binfmt_misc mounted)"
fi
# F: the interpreter is opened at registration, so it runs inside a root that lacks it.
grep -q '^flags: .*F' "$binfmt" || die "qemu-$qemu is registered without the F flag (qemu-user-static's registration has it)"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then  # as build-deb.sh: the root has no git
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || stat -c %Y pyproject.toml)
fi
root=$(bash packaging/buildroot.sh "$ARCH")
OUT=${OUT:-dist}
mkdir -p "$OUT" "build/pip-cache/$ARCH"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/edge-agent-deb-$ARCH.XXXXXX")
trap 'rm -rf "$work"' EXIT

argv=(systemd-nspawn --quiet --register=no --keep-unit --as-pid2 --pipe
      --directory="$root" --volatile=overlay --resolv-conf=copy-host
      --machine="edge-agent-build-$ARCH-$$" --chdir=/src
      --bind-ro="$PWD:/src" --bind="$OUT:/out" --bind="$work:/build"
      --bind="$PWD/build/pip-cache/$ARCH:/root/.cache/pip"
      --setenv=OUT=/out --setenv=TMPDIR=/build --setenv=SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH"
      --setenv=HOME=/root --setenv=LC_ALL=C.UTF-8)
# The machine's way to PyPI, passed on: a CA bundle (e.g. of a TLS-inspecting proxy) and
# an index. The downloads are hash-checked, so they change nothing in the package.
if [ -n "${PIP_CERT:-}" ]; then
  argv+=(--bind-ro="$(realpath "$PIP_CERT"):/etc/ssl/pip-cert.pem" --setenv=PIP_CERT=/etc/ssl/pip-cert.pem)
fi
for var in PIP_INDEX_URL PIP_DEFAULT_TIMEOUT https_proxy HTTPS_PROXY http_proxy HTTP_PROXY no_proxy; do
  [ -n "${!var:-}" ] && argv+=(--setenv="$var=${!var}")
done
[ -n "${VERSION:-}" ] && argv+=(--setenv=VERSION="$VERSION")
[ -n "${EXCLUDE+set}" ] && argv+=(--setenv=EXCLUDE="$EXCLUDE")
if [ -n "${WHEELHOUSE:-}" ]; then
  argv+=(--bind-ro="$(cd "$WHEELHOUSE" && pwd):/wheelhouse" --setenv=WHEELHOUSE=/wheelhouse)
fi
say "building inside $root (qemu-$qemu)"
"${argv[@]}" bash packaging/build-deb.sh
