#!/usr/bin/env bash
# Let this machine run arm64 code (root; idempotent): qemu-user-static registered with
# binfmt_misc, with the F flag, so that `make deb ARCH=arm64` and `make deb-test-arm64` can
# run an arm64 Debian root under systemd-nspawn. Changes kernel state for the whole machine
# (binfmt_misc), which is why `make deb ARCH=arm64` only checks and this is a separate step.
set -euo pipefail
say() { printf '\033[1m[qemu]\033[0m %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "[qemu] error: needs root" >&2; exit 1; }
if ! command -v qemu-aarch64-static >/dev/null || ! command -v update-binfmts >/dev/null; then
  say "apt-get install qemu-user-static binfmt-support"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    qemu-user-static binfmt-support >/dev/null
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  say "mount binfmt_misc"
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
update-binfmts --enable qemu-aarch64 2>/dev/null || true
head -n 2 /proc/sys/fs/binfmt_misc/qemu-aarch64
