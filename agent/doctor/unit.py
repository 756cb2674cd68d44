"""The installed unit file, read the way `agentctl doctor` needs it.

Only what the doctor checks: who the service runs as, its directories, its credentials,
environment and device policy. Drop-ins in /etc/systemd/system/edge-agent.service.d/ apply
over the unit in file-name order; an empty assignment resets a list (`LoadCredential=`), as
in systemd.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DROPIN_DIRS", "UNIT_NAME", "UNIT_PATHS", "Unit", "read_unit"]

UNIT_NAME = "edge-agent.service"
# Highest precedence first, as systemd looks: an operator's copy, then the package's.
UNIT_PATHS = (
    Path("/etc/systemd/system") / UNIT_NAME,
    Path("/lib/systemd/system") / UNIT_NAME,
    Path("/usr/lib/systemd/system") / UNIT_NAME,
)
DROPIN_DIRS = (Path("/etc/systemd/system") / f"{UNIT_NAME}.d",)
_LISTS = ("LoadCredential", "Environment", "SupplementaryGroups", "DeviceAllow")


@dataclass(frozen=True)
class Unit:
    path: Path
    values: dict[str, list[str]] = field(default_factory=dict)

    def last(self, key: str, default: str = "") -> str:
        found = self.values.get(key)
        return found[-1] if found else default

    def words(self, key: str) -> list[str]:
        return [w for value in self.values.get(key, []) for w in value.split()]

    @property
    def user(self) -> str:
        return self.last("User", "root")

    @property
    def group(self) -> str:
        return self.last("Group", self.user)

    def credentials(self) -> dict[str, Path]:
        """LoadCredential=NAME:PATH, by name."""
        out: dict[str, Path] = {}
        for value in self.values.get("LoadCredential", []):
            name, _, path = value.partition(":")
            out[name] = Path(path)
        return out

    def environment(self) -> dict[str, str]:
        """Environment=, quoted as systemd quotes ("A=b c" D=e); later assignments win."""
        out: dict[str, str] = {}
        for value in self.values.get("Environment", []):
            for word in shlex.split(value):
                key, sep, val = word.partition("=")
                if sep:
                    out[key] = val
        return out

    def directories(self) -> list[Path]:
        """StateDirectory= and CacheDirectory=, as absolute paths."""
        roots = {"StateDirectory": Path("/var/lib"), "CacheDirectory": Path("/var/cache")}
        return [roots[key] / name for key in roots for name in self.words(key)]


def _parse(text: str, values: dict[str, list[str]]) -> None:
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section != "[Service]" or "=" not in line:
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        if key in _LISTS:
            if value:
                values.setdefault(key, []).append(value)
            else:
                values[key] = []
        else:
            values[key] = [value]


def read_unit(
    paths: Sequence[Path] = UNIT_PATHS, dropins: Sequence[Path] = DROPIN_DIRS
) -> Unit | None:
    """The unit as systemd would load it, or None when it is not installed."""
    for path in paths:
        if path.is_file():
            values: dict[str, list[str]] = {}
            _parse(path.read_text(encoding="utf-8"), values)
            confs = [conf for folder in dropins for conf in folder.glob("*.conf")]
            for conf in sorted(confs, key=lambda c: c.name):
                _parse(conf.read_text(encoding="utf-8"), values)
            return Unit(path, values)
    return None
