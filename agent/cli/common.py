"""Pieces both console scripts share: where the config is and how load errors are shown."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from agent.config import ConfigError, LoadedConfig, load_config

__all__ = ["CONFIG_ENV", "DEFAULT_CONFIG", "EXIT_INVALID", "load_or_exit"]

CONFIG_ENV = "EDGE_AGENT_CONFIG"
DEFAULT_CONFIG = Path(os.environ.get(CONFIG_ENV, "/etc/edge-agent/agent.yaml"))
EXIT_INVALID = 2


def load_or_exit(path: Path, overrides: list[str], profile: str | None = None) -> LoadedConfig:
    """Load the config, or print every located issue to stderr and exit 2."""
    try:
        return load_config(path, overrides=overrides, profile=profile)
    except ConfigError as exc:
        print(f"invalid config: {path}", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID) from None
