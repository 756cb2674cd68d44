"""packaging/requirements.lock and packaging/vendor.txt, read for the tests.

The lock is uv's universal, hash-pinned output: one requirement per entry
(`name==version ; marker`), each followed by `--hash=sha256:...` for every file PyPI has.
`for_environment()` picks the entries one interpreter installs (markers evaluated against
its marker environment, e.g. JetPack 6's Python 3.10 on aarch64, which pip itself would not
do: it evaluates a requirements file's markers against the Python running pip).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = [
    "JETPACK6",
    "LOCK",
    "VENDOR",
    "Locked",
    "Vendor",
    "for_environment",
    "read_lock",
    "read_vendor",
]

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "packaging" / "requirements.lock"
VENDOR = REPO / "packaging" / "vendor.txt"
# The marker environment of JetPack 6's interpreter: Ubuntu 22.04's CPython 3.10 on the
# Orin's Cortex-A78AE, L4T 36 kernel.
JETPACK6: Mapping[str, str] = {
    "implementation_name": "cpython",
    "implementation_version": "3.10.12",
    "os_name": "posix",
    "platform_machine": "aarch64",
    "platform_python_implementation": "CPython",
    "platform_release": "5.15.136-tegra",
    "platform_system": "Linux",
    "platform_version": "#1 SMP PREEMPT",
    "python_full_version": "3.10.12",
    "python_version": "3.10",
    "sys_platform": "linux",
}


@dataclass(frozen=True)
class Locked:
    name: str  # canonical (PEP 503)
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]

    def line(self) -> str:
        """The entry as a requirements line for pip --require-hashes (without its marker:
        the caller has evaluated it)."""
        return f"{self.name}=={self.version} " + " ".join(f"--hash={h}" for h in self.hashes)


@dataclass(frozen=True)
class Vendor:
    name: str
    locked: bool
    reason: str


def read_lock(path: Path = LOCK) -> list[Locked]:
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out: list[Locked] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()  # "# via ..." lines; no hash or marker has one
        if not line:
            continue
        spec, *hashes = (part.strip() for part in line.split("--hash="))
        req = Requirement(spec)
        [pin] = list(req.specifier)
        assert pin.operator == "==", f"not an exact pin: {spec}"
        out.append(Locked(canonicalize_name(req.name), pin.version, req.marker, tuple(hashes)))
    return out


def for_environment(locked: list[Locked], env: Mapping[str, str]) -> list[Locked]:
    """The entries an interpreter with marker environment `env` installs: one per project."""
    picked = [e for e in locked if e.marker is None or e.marker.evaluate(dict(env))]
    names = [e.name for e in picked]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"two pins for one environment: {dupes}"
    return picked


def read_vendor(path: Path = VENDOR) -> list[Vendor]:
    out: list[Vendor] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        name, locked, reason = raw.split(None, 2)
        assert locked in ("yes", "no"), raw
        out.append(Vendor(canonicalize_name(name), locked == "yes", reason))
    return out
