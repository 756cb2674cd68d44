"""Where the engine keeps what it prepares: the cache directory and path expansion.

Profiles name paths under the cache directory as `${EDGE_AGENT_CACHE_DIR}/...` so that one
profile works for a developer (~/.cache/edge-agent) and for the service (systemd's
CacheDirectory=, which sets the variable). The variable is expanded with its default even
when it is unset, which plain `os.path.expandvars` would not do.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_DIR_ENV", "DEFAULT_MODEL_NAME", "cache_dir", "default_model_dir", "expand_path"]

CACHE_DIR_ENV = "EDGE_AGENT_CACHE_DIR"
DEFAULT_MODEL_NAME = "gemma3-270m"
_PLACEHOLDER = "${" + CACHE_DIR_ENV + "}"


def cache_dir(override: Path | None = None) -> Path:
    """The cache root: `override`, else $EDGE_AGENT_CACHE_DIR, else ~/.cache/edge-agent."""
    if override is not None:
        return override.expanduser()
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "edge-agent"


def default_model_dir(cache: Path | None = None) -> Path:
    """Where the converted default base (Gemma 3 270M) lives."""
    return cache_dir(cache) / "models" / DEFAULT_MODEL_NAME


def expand_path(raw: str | Path, cache: Path | None = None) -> Path:
    """Expand `${EDGE_AGENT_CACHE_DIR}` (with its default) and `~` in a profile path.

    Other variables are left alone on purpose: a profile should not depend on the
    environment of whoever happens to start the service.
    """
    text = str(raw)
    if _PLACEHOLDER in text:
        text = text.replace(_PLACEHOLDER, str(cache_dir(cache)))
    return Path(text).expanduser()
