"""Configuration: the schema (`models`), the layered loader (`loader`) and the merge rule."""

from __future__ import annotations

from agent.config.loader import (
    ConfigError,
    ConfigIssue,
    LoadedConfig,
    load_config,
    resolve_mqtt_password,
)
from agent.config.models import AgentConfig

__all__ = [
    "AgentConfig",
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "load_config",
    "resolve_mqtt_password",
]
