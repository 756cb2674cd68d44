"""Reading a model folder without loading it: config.json and safetensors headers.

The planner and the speculative-method detection both need the model's shape before vLLM
(or torch) is imported, so this module uses only the standard library.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ModelFolderError",
    "TensorInfo",
    "read_config",
    "safetensors_files",
    "tensor_infos",
    "text_config",
]

# Bytes per element of the dtypes the safetensors format defines.
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip

_MAX_HEADER = 100 << 20  # the format caps headers at 100 MB; anything larger is corrupt


class ModelFolderError(Exception):
    """The folder is not a readable HF-format model."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    numel: int
    nbytes: int


def read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFolderError(f"{model_dir}: no config.json") from exc
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path}: not a JSON object")
    return data


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: `text_config` (VL/omni wrappers) over the top.

    Top-level keys stay visible so that wrapper-level fields such as `architectures` are
    still found; keys inside text_config win where both exist.
    """
    inner = config.get("text_config")
    merged = dict(config)
    if isinstance(inner, Mapping):
        merged.update(inner)
    return merged


def safetensors_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise ModelFolderError(f"{path}: truncated safetensors file")
        (length,) = struct.unpack("<Q", raw_len)
        if length > _MAX_HEADER:
            raise ModelFolderError(f"{path}: header of {length} bytes, not safetensors")
        try:
            header = json.loads(fh.read(length))
        except ValueError as exc:
            raise ModelFolderError(f"{path}: unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelFolderError(f"{path}: header is not a JSON object")
    return header


def tensor_infos(model_dir: Path) -> Iterator[TensorInfo]:
    """Every tensor of every safetensors file, from the headers only (no weights read)."""
    for path in safetensors_files(model_dir):
        for name, meta in _header(path).items():
            if name == "__metadata__" or not isinstance(meta, dict):
                continue
            numel = 1
            for dim in meta.get("shape", []):
                numel *= int(dim)
            start, end = meta.get("data_offsets", (0, 0))
            yield TensorInfo(name=name, dtype=str(meta.get("dtype")), numel=numel,
                             nbytes=int(end) - int(start))  # fmt: skip
