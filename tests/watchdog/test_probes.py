"""The real probes against the real files of this kernel, a real child process, and NVML
where a GPU is present (the H200 run: `pytest tests/watchdog/test_probes.py -m gpu`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent.watchdog.probes import (
    HostProbe,
    MemorySample,
    NvmlGpu,
    NvmlUnavailable,
    ProbeError,
    ReplayProbe,
    process_rss,
    read_meminfo,
    read_psi,
)

MEMINFO = Path("/proc/meminfo")
PSI = Path("/proc/pressure/memory")


def test_meminfo_reads_memavailable_not_memfree() -> None:
    total, available = read_meminfo()
    assert 0 < available <= total
    text = MEMINFO.read_text()
    free_kb = next(
        int(line.split()[1]) for line in text.splitlines() if line.startswith("MemFree:")
    )
    # MemAvailable counts reclaimable page cache: at least MemFree on any loaded system
    assert available >= free_kb * 1024 * 0.9
    # and it is the kernel's figure psutil also reports (read moments apart)
    assert abs(available - psutil.virtual_memory().available) < 1 << 30


def test_meminfo_without_memavailable_is_a_probe_error(tmp_path: Path) -> None:
    old_kernel = tmp_path / "meminfo"
    old_kernel.write_text("MemTotal:       16000000 kB\nMemFree:         8000000 kB\n")
    with pytest.raises(ProbeError, match="MemAvailable"):
        read_meminfo(old_kernel)
    with pytest.raises(ProbeError):
        read_meminfo(tmp_path / "missing")


@pytest.mark.skipif(not PSI.exists(), reason="kernel without PSI")
def test_psi_of_this_kernel_parses() -> None:
    pressure = read_psi()
    assert pressure is not None
    some, full = pressure
    assert 0.0 <= full <= some <= 100.0 or (some == 0.0 and full == 0.0)


def test_psi_absent_is_none_and_malformed_is_an_error(tmp_path: Path) -> None:
    assert read_psi(tmp_path / "missing") is None
    bad = tmp_path / "memory"
    bad.write_text("some avg10=x avg60=0.00 avg300=0.00 total=0\n")
    with pytest.raises(ProbeError, match="avg10"):
        read_psi(bad)
    good = tmp_path / "good"
    good.write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=100\n"
        "full avg10=4.25 avg60=1.00 avg300=0.50 total=40\n"
    )
    assert read_psi(good) == (12.5, 4.25)


def test_child_rss_is_counted_as_engine_memory() -> None:
    """A child holding 200 MB shows up in the children's RSS, not in ours."""
    code = "b = bytearray(200 << 20); import sys; print('ready', flush=True); sys.stdin.read()"
    own_before, _ = process_rss()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        own, children = process_rss()
        assert children >= 200 << 20
        assert own - own_before < 100 << 20  # the child's 200 MB are not ours
        sample = HostProbe().read()
        assert sample.engine_rss is not None and sample.engine_rss >= 200 << 20
        assert sample.service_rss is not None and sample.service_rss > 0
        assert sample.gpu_free is None
    finally:
        child.kill()
        child.wait()


def test_replay_plays_in_order_then_holds_the_last_with_real_process_figures() -> None:
    samples = [MemorySample(mem_total=8 << 30, mem_available=n << 30) for n in (4, 2, 1)]
    replay = ReplayProbe(samples, overlay=HostProbe())
    got = [replay.read() for _ in range(5)]
    assert [s.mem_available >> 30 for s in got] == [4, 2, 1, 1, 1]
    assert all(s.service_rss and s.service_rss > 0 for s in got)
    with pytest.raises(ValueError):
        ReplayProbe([])


def _nvml_or_none() -> NvmlGpu | None:
    gpu = NvmlGpu()
    try:
        gpu.read()
    except NvmlUnavailable:
        return None
    return gpu


def test_without_a_gpu_nvml_is_unavailable_with_a_clear_reason() -> None:
    if _nvml_or_none() is not None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(NvmlUnavailable, match=r"NVML|nvidia-ml-py"):
        NvmlGpu().read()
    # The host probe goes on without the GPU figures and says why
    probe = HostProbe(gpu=NvmlGpu())
    sample = probe.read()
    assert sample.gpu_free is None and sample.mem_available > 0
    assert probe.gpu is None and probe.gpu_error is not None


@pytest.mark.gpu
def test_real_nvml_free_and_total() -> None:
    gpu = _nvml_or_none()
    if gpu is None:
        pytest.skip("no NVIDIA GPU here")
    free, total = gpu.read()
    assert 0 < free <= total
    sample = HostProbe(gpu=gpu).read()
    assert sample.gpu_total == total
    assert sample.gpu_free is not None and abs(sample.gpu_free - free) < 1 << 30
    # A tensor of 2 GiB on the device shows in NVML's free memory (when torch is here).
    torch = pytest.importorskip("torch")
    block = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.2)
    during, _ = gpu.read()
    del block
    torch.cuda.empty_cache()
    assert free - during >= (2 << 30) * 0.9
    gpu.close()


def test_a_broken_pressure_file_costs_only_the_pressure_figures(tmp_path: Path) -> None:
    bad = tmp_path / "memory"
    bad.write_text("some avg10=garbage\n")
    probe = HostProbe(psi=bad)
    sample = probe.read()
    assert sample.mem_available > 0 and sample.psi_some_avg10 is None
    assert probe.psi_error is not None and "avg10" in probe.psi_error
