"""The instant tier's reader model, found and loaded for the keyword detector.

The model folder is named in `keywords.reader.model` (the tree's models/instant-reader by
default; /usr/share/edge-agent/models in the package): pipelines.reading knows the file
format, this module where the file lives. A file that cannot be used is a located config
error (agent.config.loader), not a start that fails later.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from agent.engine.adapters import model_folders
from pipelines.catalogue import FaultRule
from pipelines.detect import KeywordDetector, KeywordSettings
from pipelines.keyword_settings import ReaderSettings
from pipelines.reading import Reader, ReaderError

__all__ = ["READER_FILE", "ReaderError", "keyword_detector", "load_reader", "reader_path"]

READER_FILE = "reader.json"


def reader_path(model: str) -> Path:
    """reader.json of the folder `model` names: a path (the config loader has made a
    relative one absolute, from the config file's folder), or a name in the models search
    path.

    Raises:
        ReaderError: no such folder or file.
    """
    candidates = model_folders(model)
    for folder in candidates:
        if (folder / READER_FILE).is_file():
            return folder / READER_FILE
    where = ", ".join(str(c) for c in candidates)
    raise ReaderError(f"no {READER_FILE} for reader model {model!r} (looked in {where})")


def load_reader(settings: ReaderSettings) -> Reader | None:
    """The reader the settings name, or None when it is switched off.

    Raises:
        ReaderError: not found, or not a usable model file (also when it vanishes between
            being found and being read).
    """
    if not settings.enabled:
        return None
    path = reader_path(settings.model).resolve()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise ReaderError(f"reader model {path}: {exc}") from exc
    return _load(path, mtime, settings.threshold)


@lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int, threshold: float | None) -> Reader:
    del mtime_ns  # part of the cache key: a file replaced in place is read again
    return Reader.from_file(path, threshold)


def keyword_detector(faults: list[FaultRule], settings: KeywordSettings) -> KeywordDetector:
    """The instant tier's detector as the service runs it: catalogue, settings and reader.

    Raises:
        ReaderError: the reader model cannot be used (the config loader reports it first).
    """
    return KeywordDetector(faults, settings, load_reader(settings.reader))
