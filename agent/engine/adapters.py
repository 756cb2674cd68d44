"""Our LoRA adapters (models/ in the tree, /usr/share/edge-agent/models in the package),
merged into their base model once and served as one plain folder.

An adapter folder holds `adapter_config.json`, `adapter_model.safetensors` (bf16) and
`adapter_meta.json` (the base's weights digest it was trained on, the corpus it was
trained from); `MODEL_CARD.md` says the rest. The merged model is written to
`$EDGE_AGENT_CACHE_DIR/models/<base>+<adapter>/` with a marker naming the base and
adapter digests, so a changed adapter or base is merged again and an unchanged one is
reused. A missing or damaged adapter is never fatal: the caller serves the base and says
why (`AdapterInvalid`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent.engine.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterInvalid,
    adapter_digest,
    merge_lora,
    weights_digest,
)
from agent.engine.paths import cache_dir

__all__ = [
    "ADAPTER_META",
    "MODELS_ENV",
    "Merged",
    "ensure_merged",
    "find_adapter",
    "is_model_path",
    "model_digest",
    "model_folders",
    "models_search_path",
]

log = structlog.get_logger(__name__)

MODELS_ENV = "EDGE_AGENT_MODELS_DIR"
ADAPTER_META = "adapter_meta.json"
MERGE_MARKER = ".edge-agent-merge.json"
_REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
_INSTALLED_MODELS = Path("/usr/share/edge-agent/models")
_MARKER_VERSION = 1
_DIGESTS = "model-digests.json"


@dataclass(frozen=True)
class Merged:
    path: Path
    weights_sha256: str
    base_sha256: str
    adapter_sha256: str
    warning: str | None  # e.g. the adapter was trained on other base weights


def models_search_path() -> list[Path]:
    roots = [Path(p) for p in os.environ.get(MODELS_ENV, "").split(os.pathsep) if p]
    return [*roots, _REPO_MODELS, _INSTALLED_MODELS]


def is_model_path(name_or_path: str) -> bool:
    """A path (absolute, or with a '/'), not a name to look up in the models search path."""
    return Path(name_or_path).expanduser().is_absolute() or "/" in name_or_path


def model_folders(name_or_path: str) -> list[Path]:
    """Where a model folder named `name_or_path` may be, in order: itself if it is a path,
    else that name under every root of the models search path (adapters, drafts, the
    instant tier's reader)."""
    if is_model_path(name_or_path):
        return [Path(name_or_path).expanduser()]
    return [root / name_or_path for root in models_search_path()]


def find_adapter(name_or_path: str) -> Path:
    """An adapter folder by name (in the models search path) or by path.

    Raises:
        AdapterInvalid: not found.
    """
    for folder in model_folders(name_or_path):
        if folder.is_dir():
            return folder
    if is_model_path(name_or_path):
        raise AdapterInvalid(f"no adapter folder {Path(name_or_path).expanduser()}")
    searched = ", ".join(str(r) for r in models_search_path())
    raise AdapterInvalid(f"no adapter {name_or_path!r} in {searched}")


def model_digest(folder: Path, cache: Path | None = None) -> str:
    """sha256 over a model folder's safetensors weights (lora.weights_digest of each file,
    in name order). Cached by path, size and mtime: a multi-GB model is read once.

    Raises:
        ValueError: no readable safetensors file in the folder.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {folder}")
    key = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    store = cache_dir(cache) / _DIGESTS
    known: dict[str, str] = {}
    try:
        loaded = json.loads(store.read_text(encoding="utf-8"))
        known = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    if isinstance(known.get(key), str):
        return known[key]
    if len(files) == 1:
        digest = weights_digest(files[0])
    else:
        import hashlib

        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}:{weights_digest(f)}".encode())
        digest = h.hexdigest()
    known[key] = digest
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".{store.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
        tmp.replace(store)
    except OSError as exc:  # a read-only cache costs a re-read next time, nothing else
        log.warning("model_digest_not_cached", error=str(exc))
    return digest


def _read_adapter(folder: Path) -> tuple[dict[str, object], dict[str, object], str]:
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        meta_path = folder / ADAPTER_META
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        digest = adapter_digest(folder)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AdapterInvalid(f"{folder.name}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(meta, dict):
        raise AdapterInvalid(f"{folder.name}: config or meta is not a JSON object")
    return config, meta, digest


def _is_current(target: Path, base_sha: str, adapter_sha: str) -> Merged | None:
    try:
        marker = json.loads((target / MERGE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (
        isinstance(marker, dict)
        and marker.get("version") == _MARKER_VERSION
        and marker.get("base_sha256") == base_sha
        and marker.get("adapter_sha256") == adapter_sha
        and (target / "model.safetensors").is_file()
    ):
        return None
    return Merged(
        target, str(marker["weights_sha256"]), base_sha, adapter_sha, marker.get("warning")
    )


def ensure_merged(base: Path, adapter: Path, cache: Path | None = None) -> Merged:
    """The base with the adapter merged in, merging first if needed (a few seconds).

    Blocking (reads and writes the weights): from async code call it in a thread.

    Raises:
        AdapterInvalid: the adapter is missing, damaged or does not fit the base.
    """
    config, meta, adapter_sha = _read_adapter(adapter)
    try:
        base_sha = model_digest(base, cache)
    except (OSError, ValueError) as exc:  # no weights to merge into: the base as it is
        raise AdapterInvalid(f"cannot merge into {base}: {exc}") from exc
    target = cache_dir(cache) / "models" / f"{base.name}+{adapter.name}"
    found = _is_current(target, base_sha, adapter_sha)
    if found is not None:
        return found
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # setup and a first start may merge at once
        found = _is_current(target, base_sha, adapter_sha)
        if found is not None:
            return found
        trained_on = meta.get("base_weights_sha256")
        warning = None
        if trained_on and trained_on != base_sha:
            warning = (
                f"adapter {adapter.name} was trained on base weights {str(trained_on)[:12]}, "
                f"merged into {base_sha[:12]}"
            )
            log.warning("adapter_base_mismatch", detail=warning)
        t0 = time.perf_counter()
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _write_merged(base, adapter, config, tmp)
        except AdapterInvalid:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:  # a damaged weights file, a full disk: the base serves
            shutil.rmtree(tmp, ignore_errors=True)
            raise AdapterInvalid(f"{adapter.name}: merge failed: {exc!r}") from exc
        merged_sha = weights_digest(tmp / "model.safetensors")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        marker = {
            "version": _MARKER_VERSION,
            "base": str(base),
            "base_sha256": base_sha,
            "adapter": str(adapter),
            "adapter_sha256": adapter_sha,
            "weights_sha256": merged_sha,
            "warning": warning,
        }
        (target / MERGE_MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
        log.info(
            "adapter_merged",
            adapter=adapter.name,
            target=str(target),
            seconds=round(time.perf_counter() - t0, 1),
        )
    return Merged(target, merged_sha, base_sha, adapter_sha, warning)


def _write_merged(base: Path, adapter: Path, config: dict[str, object], out: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = sorted(base.glob("*.safetensors"))
    if [w.name for w in weights] != ["model.safetensors"]:
        raise AdapterInvalid(f"{base}: merging needs one model.safetensors file")
    out.mkdir(parents=True)
    for item in base.iterdir():  # config, tokenizer, chat template, generation config
        if item.is_file() and item.suffix != ".safetensors" and not item.name.startswith("."):
            shutil.copy2(item, out / item.name)
    try:
        lora = load_file(str(adapter / ADAPTER_WEIGHTS))
    except Exception as exc:
        raise AdapterInvalid(f"{adapter.name}: unreadable weights: {exc}") from exc
    merged = merge_lora(load_file(str(weights[0])), lora, config)
    save_file({k: v.contiguous() for k, v in merged.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
