#!/usr/bin/env bash
# Regenerate agent/sparkplug/sparkplug_b_pb2.py from the vendored Eclipse
# Tahu schema, agent/sparkplug/sparkplug_b.proto (EPL-2.0; upstream eclipse/tahu
# sparkplug_b/sparkplug_b.proto, commit 5736e404889d4b95910613040a99ba79589ffb13).
# Maintainer step, after a change to the schema (commit the result). The compiler is
# grpcio-tools' protoc, pinned, in a throwaway venv: the output does not depend on whatever
# is installed. The .proto is compiled from its own folder, so the descriptor's file name is
# `sparkplug_b.proto`, the one every other Python Sparkplug library registers: the same bytes,
# so they share one descriptor in a process (docs/sparkplug.md, "Encoding").
set -euo pipefail
cd "$(dirname "$0")/.."
GRPCIO_TOOLS_VERSION=1.85.1   # libprotoc 35.1: gencode for protobuf >= 7.35.1, < 8
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"${PYTHON:-python3}" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q --disable-pip-version-check "grpcio-tools==$GRPCIO_TOOLS_VERSION"
"$tools/venv/bin/python" -m grpc_tools.protoc -Iagent/sparkplug \
  --python_out=agent/sparkplug agent/sparkplug/sparkplug_b.proto
echo "agent/sparkplug/sparkplug_b_pb2.py: $(wc -c < agent/sparkplug/sparkplug_b_pb2.py) bytes"
