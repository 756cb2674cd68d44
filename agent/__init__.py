"""edge-agent daemon: wires the streaming stages of `pipelines` to MQTT, storage and the CLI."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edge-agent")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
