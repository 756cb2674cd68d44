#!/usr/bin/env bash
# Build dist/edge-agent_<version>_<arch>.deb with plain dpkg-deb (no debian/ source tree):
# a venv at /opt/edge-agent made with the distribution's /usr/bin/python3, holding the
# project and the pins of packaging/requirements.lock (hash-checked), plus the unit, the
# default config (conffiles) and the maintainer scripts of packaging/debian/.
# docs/install.md says what it contains and why; `make deb` runs it.
#
# Reproducible where the tools allow: every mtime is SOURCE_DATE_EPOCH (default: the last
# commit's time), .pyc files are hash-based (no timestamps) and compiled with a fixed hash
# seed, the one compiled sdist (systemd-python) is built in a fixed folder mapped out of
# its objects, and nothing records the build folder. docs/install.md reports what was
# measured.
#
# Environment (all optional):
#   VERSION      the package version (default: pyproject.toml's)
#   OUT          output folder (default: dist)
#   WHEELHOUSE   a folder of extra wheels installed over the locked ones, unhashed (e.g.
#                a JetPack build of ctranslate2); a wheel there replaces the locked
#                project of the same name
#   EXCLUDE      locked projects to leave out, space separated (default on arm64: those
#                packaging/vendor.txt marks as NVIDIA's on a Jetson, i.e. ctranslate2,
#                whose CUDA build the platform provides; see docs/install.md)
#   ARCH         the package's architecture (default: this machine's). Another one
#                (`make deb ARCH=arm64` on amd64) builds inside a Debian root of that
#                architecture under qemu: packaging/build-foreign.sh
#   SOURCE_DATE_EPOCH  the timestamp of every file
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."

HOST_ARCH=$(dpkg --print-architecture)
case ${ARCH:-$HOST_ARCH} in
  "$HOST_ARCH") ;;
  arm64) exec bash packaging/build-foreign.sh arm64 ;;
  *) echo "[deb] error: ARCH=$ARCH: amd64 or arm64" >&2; exit 1 ;;
esac

PKG=edge-agent
PREFIX=/opt/edge-agent
# The device's interpreter, not a developer's: the venv's bin/python links to it.
PYTHON=/usr/bin/python3
OUT=${OUT:-dist}
ARCH=$HOST_ARCH
VERSION=${VERSION:-$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || stat -c %Y pyproject.toml)
fi
export SOURCE_DATE_EPOCH
export PYTHONHASHSEED=0          # set and frozenset constants in .pyc files in one order
export LC_ALL=C.UTF-8 TZ=UTC
case $ARCH in
  arm64) EXCLUDE=${EXCLUDE-$(awk '!/^#/ && $2 == "yes" { print $1 }' packaging/vendor.txt)} ;;
  *) EXCLUDE=${EXCLUDE-} ;;
esac
WHEELHOUSE=${WHEELHOUSE:-}

say() { printf '\033[1m[deb]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[deb]\033[0m error: %s\n' "$*" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps gcc pkg-config; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/setup.sh installs it as root: dpkg-dev, gcc, pkg-config)"
done
pkg-config --exists libsystemd || die "libsystemd-dev is missing (systemd-python is compiled)"
"$PYTHON" -c 'import ensurepip' 2>/dev/null || die "python3-venv is missing (apt-get install python3-venv)"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PYNEXT=$("$PYTHON" -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')

SECONDS=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/edge-agent-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
VENV=$ROOT$PREFIX
LOG=$WORK/build.log
run() { "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; die "failed: $*"; }; }
mkdir -p "$OUT" "$WORK/wheels"

say "edge-agent $VERSION ($ARCH, Python $PYVER from $PYTHON, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
# --- the build's own tools (pip, setuptools, wheel), pinned with hashes, not packaged.
run "$PYTHON" -m venv "$WORK/tools"
PIP=("$WORK/tools/bin/python" -m pip --disable-pip-version-check --no-input)
run "${PIP[@]}" install --require-hashes -r packaging/build-requirements.lock

# --- every locked dependency for this interpreter and machine, checked against its hash.
say "downloading the locked dependencies (hash-checked)"
run "${PIP[@]}" download --require-hashes --no-deps --no-build-isolation \
  -r packaging/requirements.lock -d "$WORK/wheels"

# Source distributions (systemd-python: a C extension against libsystemd) are built here
# with Debian's hardening flags, stripped (-s), in a fixed folder whose path is mapped out
# of the objects: pip's own build folder is random and would end up in them.
for sdist in "$WORK"/wheels/*.tar.gz; do
  [ -e "$sdist" ] || continue
  top=$(tar -tzf "$sdist" | sed -n "1s|/.*||p")
  run tar -xzf "$sdist" -C "$WORK"
  say "compiling $top"
  (
    cd "$WORK/$top"
    export DEB_BUILD_MAINT_OPTIONS=hardening=+all CPPFLAGS CFLAGS LDFLAGS
    CPPFLAGS=$(dpkg-buildflags --get CPPFLAGS)
    CFLAGS="$(dpkg-buildflags --get CFLAGS) -ffile-prefix-map=$WORK/$top=/usr/src/$top"
    LDFLAGS="$(dpkg-buildflags --get LDFLAGS) -s"
    run "${PIP[@]}" wheel --no-deps --no-build-isolation -w "$WORK/wheels" .
  )
  rm -f "$sdist"
done

# --- the project itself, as a wheel built from a copy (a build writes into its source).
mkdir "$WORK/project"
cp -r agent pipelines pyproject.toml README.md "$WORK/project/"
find "$WORK/project" -name __pycache__ -prune -exec rm -rf {} +
run "${PIP[@]}" wheel --no-deps --no-build-isolation -w "$WORK/wheels" "$WORK/project"

# --- what the platform provides instead (EXCLUDE), what the operator adds (WHEELHOUSE).
project_of() { basename "$1" | cut -d- -f1 | tr '[:upper:].-' '[:lower:]__'; }
drop() {
  local name=$1 wheel
  for wheel in "$WORK"/wheels/*.whl; do
    if [ "$(project_of "$wheel")" = "$name" ]; then rm -f "$wheel"; say "left out: $(basename "$wheel")"; fi
  done
}
for name in $EXCLUDE; do drop "$(echo "$name" | tr '[:upper:].-' '[:lower:]__')"; done
if [ -n "$WHEELHOUSE" ]; then
  for wheel in "$WHEELHOUSE"/*.whl; do
    [ -e "$wheel" ] || die "no wheels in WHEELHOUSE=$WHEELHOUSE"
    drop "$(project_of "$wheel")"
    cp "$wheel" "$WORK/wheels/"
    say "from the wheelhouse: $(basename "$wheel")"
  done
fi

# --- the venv. Built without the build host's site-packages (a package installed there
# would count as satisfied and be missing from the payload), then switched to see the
# device's: that is how torch, vLLM and a CUDA CTranslate2 from JetPack reach it.
wheels=("$WORK"/wheels/*.whl)
say "installing ${#wheels[@]} wheels into $PREFIX"
run "$PYTHON" -m venv --without-pip "$VENV"
run "${PIP[@]}" --python "$VENV/bin/python" install --no-deps --no-index --no-compile \
  "${wheels[@]}"
# The lock must satisfy the project (a dependency added to pyproject.toml without
# `make deb-lock` would otherwise be found missing only on a device).
# What EXCLUDE left out is the platform's to provide (`agentctl doctor` names it).
if ! "${PIP[@]}" --python "$VENV/bin/python" check >"$WORK/check.log" 2>&1; then
  cat "$WORK/check.log" >>"$LOG"
  unmet=$({ grep -v WARNING "$WORK/check.log" || true; } | while IFS= read -r line; do
    wanted=$(sed -n 's/^.* requires \([^,]*\), which is not installed\.$/\1/p' <<<"$line" \
      | tr '[:upper:].-' '[:lower:]__')
    [[ -n $wanted && " $(echo "$EXCLUDE" | tr '[:upper:].-' '[:lower:]__') " == *" $wanted "* ]] \
      || echo "$line"
  done)
  if [ -n "$unmet" ]; then
    echo "$unmet" | tail -n 5 >&2
    die "packaging/requirements.lock does not satisfy pyproject.toml: run make deb-lock"
  fi
  say "left to the platform: $(grep -c 'which is not installed' "$WORK/check.log") requirement(s) of EXCLUDE=$EXCLUDE"
fi
sed -i -e 's/^include-system-site-packages = false$/include-system-site-packages = true/' \
  -e "s|^command = .*|command = $PYTHON -m venv --system-site-packages $PREFIX|" "$VENV/pyvenv.cfg"
# Console scripts and activate scripts name the venv by its build path, direct_url.json the
# wheels' build folder; the RECORD files follow (relocate_venv.py).
run "$PYTHON" packaging/relocate_venv.py "$VENV" "$PREFIX"
rm -f "$VENV/bin/Activate.ps1"
rmdir "$VENV/include/python$PYVER" "$VENV/include"  # venv makes them; nothing goes there
# Modes as Debian wants them, contents untouched (the wheels' libraries stay byte for byte
# as published and hashed: stripping patchelf-repaired libraries can break them): shared
# objects are not executable, nor are modules without a #! line.
find "$VENV/lib" -type f -perm /111 -print0 | while IFS= read -r -d '' file; do
  case $(head -c 4 "$file" | od -An -c | tr -d ' ') in
    177ELF) if [[ $file == *.so || $file == *.so.* ]]; then chmod a-x "$file"; fi ;;
    \#!*) ;;
    *) chmod a-x "$file" ;;
  esac
done
if leaks=$(grep -rlF "$WORK" "$ROOT"); then
  die "the build folder is recorded in: $leaks"
fi
# Bytecode now rather than on the device: the service cannot write /opt (ProtectSystem=
# strict) and would compile every module in memory at each start. Hash-based and
# unchecked: no timestamps inside; dpkg owns the sources, which change only with the .pyc.
say "compiling bytecode"
run "$PYTHON" -m compileall -q -j0 --invalidation-mode unchecked-hash -s "$ROOT" -p / \
  "$VENV/lib"

# --- the rest of the file system.
install -d "$ROOT/usr/bin" "$ROOT/lib/systemd/system" "$ROOT/etc/edge-agent/profiles" \
  "$ROOT/usr/share/doc/$PKG" "$ROOT/usr/share/lintian/overrides"
for script in edge-agent agentctl; do
  ln -s "$PREFIX/bin/$script" "$ROOT/usr/bin/$script"
done
install -m 0644 systemd/edge-agent.service "$ROOT/lib/systemd/system/"
install -m 0644 configs/agent.yaml "$ROOT/etc/edge-agent/agent.yaml"
install -m 0644 configs/profiles/*.yaml "$ROOT/etc/edge-agent/profiles/"
# Our models (models/), in /usr/share/edge-agent/models (agent/engine/adapters.py looks
# there): adapters, merged into their base at the engine's first start, and the trained
# drafts beside them (agent/engine/draft.py: `<adapter>-eagle3`, config.json and shards).
# Weights, config and model card only: the loss curves stay in the source tree. The
# instant tier's reader (agent/reader.py) is one JSON file and its card.
for folder in models/*/; do
  install -d "$ROOT/usr/share/edge-agent/$folder"
  if [ -f "$folder"reader.json ]; then
    install -m 0644 "$folder"reader.json "$folder"MODEL_CARD.md "$ROOT/usr/share/edge-agent/$folder"
  elif [ -f "$folder"adapter_config.json ]; then
    install -m 0644 "$folder"adapter_config.json "$folder"adapter_model.safetensors \
      "$folder"adapter_meta.json "$folder"MODEL_CARD.md "$ROOT/usr/share/edge-agent/$folder"
    # a derivative of a base under its own terms carries them: a Gemma adapter without its
    # NOTICE and the terms is not shipped
    if grep -q '"licence": *"Gemma' "$folder"adapter_meta.json; then
      for terms in NOTICE GEMMA_TERMS.txt; do
        [ -f "$folder$terms" ] || { echo "build-deb: $folder$terms missing (Gemma Terms of Use)" >&2; exit 1; }
        install -m 0644 "$folder$terms" "$ROOT/usr/share/edge-agent/$folder"
      done
    fi
  else
    install -m 0644 "$folder"config.json "$folder"*.safetensors "$folder"MODEL_CARD.md \
      "$ROOT/usr/share/edge-agent/$folder"
    if [ -f "$folder"model.safetensors.index.json ]; then
      install -m 0644 "$folder"model.safetensors.index.json "$ROOT/usr/share/edge-agent/$folder"
    fi
  fi
done
install -d "$ROOT/etc/edge-agent/trusted_keys"  # fleet.trusted_keys_dir (docs/fleet.md)
install -m 0644 packaging/debian/copyright "$ROOT/usr/share/doc/$PKG/copyright"
install -d "$ROOT/usr/share/man/man1"
for page in packaging/man/*.1; do
  gzip -9n -c "$page" >"$ROOT/usr/share/man/man1/${page##*/}.gz"
done
install -m 0644 packaging/debian/lintian-overrides "$ROOT/usr/share/lintian/overrides/$PKG"
changelog_date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
sed -e "s/@VERSION@/$VERSION/" -e "s/@DATE@/$changelog_date/" packaging/debian/changelog.in \
  | gzip -9n >"$ROOT/usr/share/doc/$PKG/changelog.gz"

# --- DEBIAN/: control, conffiles, md5sums, maintainer scripts.
install -d "$ROOT/DEBIAN"
(cd "$ROOT" && find etc -type f | LC_ALL=C sort | sed 's|^|/|') >"$ROOT/DEBIAN/conffiles"
(cd "$ROOT" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' \
  | LC_ALL=C sort -z | xargs -0 md5sum) >"$ROOT/DEBIAN/md5sums"
for script in postinst prerm postrm; do
  install -m 0755 "packaging/debian/$script" "$ROOT/DEBIAN/$script"
done
# As dpkg-gencontrol counts it: files and symlinks rounded up to 1 KiB, 1 KiB per other
# inode (du would count directory sizes, which differ between file systems).
size_kb=$(cd "$ROOT" && find . -path ./DEBIAN -prune -o -printf '%y %s\n' \
  | awk '$1 == "f" || $1 == "l" { kb += int(($2 + 1023) / 1024); next } { kb += 1 } END { print kb }')
depends="python3 (>= $PYVER), python3 (<< $PYNEXT), $(bash packaging/shlibs.sh "$ROOT")"
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$size_kb/" \
  -e "s/@DEPENDS@/$depends/" packaging/debian/control.in >"$ROOT/DEBIAN/control"

# --- one timestamp, no group or other write bits, then the archive (owned by root).
chmod -R go-w "$ROOT"
find "$ROOT" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
deb="$OUT/${PKG}_${VERSION}_${ARCH}.deb"
say "dpkg-deb (zstd)"
run dpkg-deb --root-owner-group -Zzstd --build "$ROOT" "$deb"
say "$deb: $(du -h "$deb" | cut -f1), installed $((size_kb / 1024)) MiB, sha256 $(sha256sum "$deb" | cut -c1-16), built in ${SECONDS} s"
