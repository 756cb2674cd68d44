#!/usr/bin/env bash
# Regenerate the package's pins (maintainer step: `make deb-lock`, then commit both files).
#
# requirements.lock: what goes into /opt/edge-agent, i.e. edge-agent's base dependencies
# plus the `systemd` and `asr` extras, every one pinned (==) with the SHA-256 of every file
# PyPI has for that version. The resolution is universal (uv's --universal): one file for
# Debian 12's Python 3.11 on amd64 and JetPack 6's Python 3.10 on arm64, forked by
# environment markers where a version differs. build-deb.sh installs it with pip's
# --require-hashes. The `llm` extra is left out on purpose: vLLM and torch come from the
# platform (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
/usr/bin/python3 -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
compile=("$tools/venv/bin/uv" pip compile --quiet --universal --python-version 3.10
         --generate-hashes --no-header --index-url https://pypi.org/simple)
"${compile[@]}" pyproject.toml --extra systemd --extra asr -o packaging/requirements.lock
"${compile[@]}" packaging/build-requirements.in -o packaging/build-requirements.lock
echo "packaging/requirements.lock: $(grep -c '==' packaging/requirements.lock) pins"
echo "packaging/build-requirements.lock: $(grep -c '==' packaging/build-requirements.lock) pins"
