"""Memory probes: what the watchdog reads, one `MemorySample` per call.

- Host (every profile): `MemAvailable` from /proc/meminfo, the kernel's own estimate of what
  can be allocated without swapping (MemFree would count reclaimable page cache as used and
  look like pressure: the Jetson startup bug of vLLM and Ollama), and the memory pressure
  stall information of /proc/pressure/memory (stalls show reclaim thrash before
  MemAvailable reaches zero).
- Processes: resident memory of this service and of its child processes (the engine core).
- Discrete GPU: free and total device memory through NVML (nvidia-ml-py), loaded lazily.

`read()` blocks (file reads, NVML calls): the watchdog calls it on a worker thread. A probe
is anything with `read() -> MemorySample`; `ReplayProbe` plays a recorded sequence, so that a
test (or an engineer with a field recording) can drive the policy with measured numbers.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import psutil  # type: ignore[import-untyped]

__all__ = [
    "HostProbe",
    "MemoryProbe",
    "MemorySample",
    "NvmlGpu",
    "NvmlUnavailable",
    "ProbeError",
    "ReplayProbe",
    "read_meminfo",
    "read_psi",
]

MEMINFO = Path("/proc/meminfo")
PSI_MEMORY = Path("/proc/pressure/memory")


class ProbeError(Exception):
    """A probe source could not be read or parsed."""


class NvmlUnavailable(ProbeError):
    """NVML (nvidia-ml-py, the driver's libnvidia-ml) is not there."""


@dataclass(frozen=True)
class MemorySample:
    """One reading. Sizes in bytes; pressure in percent of wall time; None: not measured."""

    mem_total: int
    mem_available: int
    psi_some_avg10: float | None = None
    psi_full_avg10: float | None = None
    service_rss: int | None = None
    engine_rss: int | None = None  # all child processes together (the engine core)
    gpu_free: int | None = None
    gpu_total: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "mem_total": self.mem_total,
            "mem_available": self.mem_available,
            "psi_some_avg10": self.psi_some_avg10,
            "psi_full_avg10": self.psi_full_avg10,
            "service_rss": self.service_rss,
            "engine_rss": self.engine_rss,
            "gpu_free": self.gpu_free,
            "gpu_total": self.gpu_total,
        }


class MemoryProbe(Protocol):
    def read(self) -> MemorySample:
        """One sample. Blocking; raises ProbeError when the source cannot be read."""
        ...


def read_meminfo(path: Path = MEMINFO) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes.

    Raises:
        ProbeError: unreadable, or either field missing (MemAvailable needs Linux 3.14+).
    """
    try:
        text = path.read_text(encoding="ascii")
    except OSError as exc:
        raise ProbeError(f"{path}: {exc}") from exc
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            unit = parts[1] if len(parts) > 1 else ""
            fields[name] = int(parts[0]) * (1024 if unit == "kB" else 1)
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        raise ProbeError(f"{path}: no MemTotal/MemAvailable")
    return fields["MemTotal"], fields["MemAvailable"]


def read_psi(path: Path = PSI_MEMORY) -> tuple[float, float] | None:
    """(some avg10, full avg10) in percent; None where the kernel has no PSI
    (CONFIG_PSI off, or `psi=0` on the command line: the file is absent or unreadable).

    Raises:
        ProbeError: the file exists but does not parse.
    """
    try:
        text = path.read_text(encoding="ascii")
    except OSError:
        return None
    values: dict[str, float] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "avg10":
                try:
                    values[kind] = float(value)
                except ValueError as exc:
                    raise ProbeError(f"{path}: bad avg10 {value!r}") from exc
    if "some" not in values:
        raise ProbeError(f"{path}: no 'some' line")
    # Older kernels have no 'full' line for memory... all current ones do; 0 if absent.
    return values["some"], values.get("full", 0.0)


def process_rss(pid: int | None = None) -> tuple[int, int]:
    """(RSS of the process, summed RSS of all its descendants) in bytes. Children that exit
    while being read are skipped (the engine may be restarting)."""
    proc = psutil.Process(pid or os.getpid())
    own = int(proc.memory_info().rss)
    children = 0
    for child in proc.children(recursive=True):
        try:
            children += int(child.memory_info().rss)
        except psutil.Error:
            continue
    return own, children


class NvmlGpu:
    """Free and total memory of one GPU through NVML; initialised on first read."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._handle: Any = None
        self._nvml: Any = None
        self._lock = threading.Lock()

    def read(self) -> tuple[int, int]:
        """(free, total) bytes.

        Raises:
            NvmlUnavailable: no nvidia-ml-py, or no driver library / device.
        """
        with self._lock:
            if self._handle is None:
                self._open()
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            except Exception as exc:  # NVMLError subclasses; a lost GPU too
                raise ProbeError(f"NVML memory info: {exc}") from exc
            return int(info.free), int(info.total)

    def _open(self) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError as exc:
            raise NvmlUnavailable(
                "nvidia-ml-py is not installed (pip install 'edge-agent[gpu]')"
            ) from exc
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML: {exc}") from exc
        self._nvml = pynvml

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                with contextlib.suppress(Exception):  # shutting down anyway
                    self._nvml.nvmlShutdown()
            self._nvml = self._handle = None


class HostProbe:
    """The real probe: host figures always, the GPU's through NVML when `gpu` is given."""

    def __init__(
        self,
        *,
        gpu: NvmlGpu | None = None,
        meminfo: Path = MEMINFO,
        psi: Path = PSI_MEMORY,
        pid: int | None = None,
    ) -> None:
        self.gpu = gpu
        self.gpu_error: str | None = None  # why GPU figures are missing, once NVML failed
        self.psi_error: str | None = None  # why pressure figures are missing
        self.meminfo = meminfo
        self.psi = psi
        self.pid = pid

    def read(self) -> MemorySample:
        total, available = read_meminfo(self.meminfo)
        # A sub-probe that fails costs its own figures, never MemAvailable's.
        try:
            pressure = read_psi(self.psi)
            self.psi_error = None
        except ProbeError as exc:
            pressure, self.psi_error = None, str(exc)
        try:
            own, children = process_rss(self.pid)
        except psutil.Error as exc:
            raise ProbeError(f"process memory: {exc}") from exc
        gpu_free = gpu_total = None
        if self.gpu is not None:
            try:
                gpu_free, gpu_total = self.gpu.read()
                self.gpu_error = None
            except NvmlUnavailable as exc:
                # No NVML here (not installed, no driver): go on with the host figures
                # rather than going blind; the status says why the GPU is not watched.
                self.gpu_error = str(exc)
                self.gpu = None
            except ProbeError as exc:  # a lost GPU, a failed read: try again next time
                self.gpu_error = str(exc)
        return MemorySample(
            mem_total=total,
            mem_available=available,
            psi_some_avg10=pressure[0] if pressure else None,
            psi_full_avg10=pressure[1] if pressure else None,
            service_rss=own,
            engine_rss=children,
            gpu_free=gpu_free,
            gpu_total=gpu_total,
        )

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()


class ReplayProbe:
    """Plays `samples` in order, then repeats the last one (a recorded or built sequence).

    `overlay` probes (optional) fill what the recording leaves out, e.g. the real process
    figures under a recorded MemAvailable curve.
    """

    def __init__(self, samples: Iterable[MemorySample], overlay: MemoryProbe | None = None):
        self._samples: Sequence[MemorySample] = list(samples)
        if not self._samples:
            raise ValueError("a replay needs at least one sample")
        self._next = 0
        self._overlay = overlay
        self._lock = threading.Lock()

    def read(self) -> MemorySample:
        with self._lock:
            sample = self._samples[min(self._next, len(self._samples) - 1)]
            self._next += 1
        if self._overlay is None:
            return sample
        real = self._overlay.read()
        return replace(sample, service_rss=real.service_rss, engine_rss=real.engine_rss)
