"""The Debian package for the tests: built by packaging/build-deb.sh, cached by its inputs.

`ensure_debs()` builds each requested version once per state of the package's inputs (the
code, the config and profiles, the unit, packaging/) and keeps the result under
`$EDGE_AGENT_TEST_CACHE/deb/<key>/` (default `~/.cache/edge-agent/deb/`; an arm64 build,
made inside an arm64 root under qemu by packaging/build-foreign.sh, in `deb-arm64/<key>/`),
with the time each build took; `payload()` reads a package's files (names, modes, owners,
mtimes and a hash of each content) for comparing two builds. Root only, like tests/nspawn.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests import nspawn

__all__ = ["BuiltDeb", "Entry", "ensure_debs", "missing_prerequisites", "payload"]

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "packaging" / "build-deb.sh"
# Everything build-deb.sh reads from the checkout.
INPUTS = (
    "agent",
    "pipelines",
    "pyproject.toml",
    "README.md",
    "configs/agent.yaml",
    "configs/profiles",
    "systemd/edge-agent.service",
    "packaging",
)


@dataclass(frozen=True)
class BuiltDeb:
    version: str
    path: Path
    build_s: float  # what the build took (when it was built, maybe in an earlier session)
    cached: bool  # built by an earlier session


@dataclass(frozen=True)
class Entry:
    """One member of a package's data archive."""

    mode: int
    uid: int
    gid: int
    mtime: int
    kind: bytes
    link: str
    sha256: str


def missing_prerequisites(arch: str | None = None) -> str | None:
    """Why the package tests (of `arch`, default this machine's) cannot run here, or None."""
    why = nspawn.missing_prerequisites() or nspawn.missing_emulation(arch or nspawn.host_arch())
    if why is not None:
        return why
    for tool in ("dpkg-deb", "dpkg-shlibdeps"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh installs dpkg-dev as root)"
    probe = ["/usr/bin/python3", "-c", "import ensurepip"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        return "python3-venv is missing (scripts/setup.sh installs it as root)"
    return None


def _cache(arch: str | None = None) -> Path:
    base = os.environ.get("EDGE_AGENT_TEST_CACHE") or Path.home() / ".cache" / "edge-agent"
    path = Path(base) / (f"deb-{arch}" if arch else "deb")
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_key() -> str:
    """A digest of every file the build reads (bytecode and caches aside)."""
    parts: list[str | bytes] = []
    for name in INPUTS:
        top = REPO / name
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for path in files:
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            parts += [str(path.relative_to(REPO)), path.read_bytes()]
    return nspawn.digest(*parts)


def ensure_debs(versions: Sequence[str], arch: str | None = None) -> dict[str, BuiltDeb]:
    """Each version's package, built now or found from an earlier build of the same inputs.
    `arch`: another architecture than the machine's (arm64), built under qemu."""
    arch = arch or nspawn.host_arch()
    foreign = arch != nspawn.host_arch()
    cache = _cache(arch if foreign else None)
    key = source_key()
    folder = cache / key
    log = cache / f"{key}.log"
    out: dict[str, BuiltDeb] = {}
    with nspawn.locked("deb"):
        for stale in cache.iterdir():  # 340 MB a package: keep only the current inputs'
            if stale.is_dir() and stale.name != key:
                shutil.rmtree(stale, ignore_errors=True)
                stale.with_suffix(".log").unlink(missing_ok=True)
        folder.mkdir(exist_ok=True)
        times = folder / "build-times.json"
        recorded: dict[str, float] = json.loads(times.read_text()) if times.exists() else {}
        env = {**os.environ, "ARCH": arch} if foreign else dict(os.environ)
        for version in versions:
            deb = folder / f"edge-agent_{version}_{arch}.deb"
            if deb.exists() and version in recorded:
                out[version] = BuiltDeb(version, deb, recorded[version], cached=True)
                continue
            started = time.monotonic()
            with log.open("ab") as sink:
                result = subprocess.run(
                    ["bash", str(BUILD)],
                    env={**env, "VERSION": version, "OUT": str(folder)},
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if result.returncode != 0:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"build-deb.sh failed ({result.returncode}); {log}:\n{tail}")
            recorded[version] = round(time.monotonic() - started, 1)
            times.write_text(json.dumps(recorded))
            out[version] = BuiltDeb(version, deb, recorded[version], cached=False)
    return out


def payload(deb: Path) -> dict[str, Entry]:
    """The data archive's members, read as a stream (the payload is 700 MB unpacked)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    entries: dict[str, Entry] = {}
    with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
        for member in archive:
            digest = hashlib.sha256()
            if member.isfile():
                data = archive.extractfile(member)
                assert data is not None
                while chunk := data.read(1 << 20):
                    digest.update(chunk)
            entries[member.name] = Entry(
                member.mode,
                member.uid,
                member.gid,
                int(member.mtime),
                member.type,
                member.linkname,
                digest.hexdigest(),
            )
    if proc.wait() != 0:
        raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb} exited {proc.returncode}")
    return entries
