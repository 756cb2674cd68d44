"""Where the service's memory goes: per process and per kind (`agentctl doctor --memory`).

The service is one process tree: edge-agent (vLLM's frontend, in-process AsyncLLM), vLLM's
engine core (`VLLM::EngineCore`, with the worker inside it under the uni executor) and
whatever they start (compile workers, the resource tracker). For each, `/proc/<pid>/smaps`
says, mapping by mapping, the resident bytes (Rss), the proportional share (Pss: a library
page two processes map counts half in each) and the anonymous part (the Python heap and
every allocation; file-backed pages of libraries are clean and the kernel can drop them
under pressure, anonymous ones it cannot). The mappings are grouped by kind:

- `torch`: torch's own libraries (libtorch_cuda, libc10, ...);
- `cuda`: CUDA's libraries (cuBLAS, cuDNN, NCCL, the driver, nvidia-* wheels, JetPack's);
- `triton`: Triton and torch.compile's (Inductor) compiled kernels;
- `python`: every other file: the interpreter, extension modules, mapped data files;
- `heap`: anonymous memory (the Python heap, allocators, pinned host buffers);
- `shared`: shared memory (/dev/shm, memfd): IPC between the frontend and the engine core;
- `device`: mappings of the GPU's device files (/dev/nvidia*, /dev/nvmap);
- `stack`: thread stacks.

GPU memory per process comes from NVML where it answers (a discrete GPU; a Jetson's NVML
has no per-process figures, and there the engine's allocations are not in any RSS either:
read them from tegrastats). bench/engine/bench_runtime.py uses the same probe on the H200.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "KINDS",
    "Footprint",
    "KindBytes",
    "ProcessFootprint",
    "footprint",
    "kind_of",
    "load_nvml",
    "nvml_by_pid",
    "parse_smaps",
    "service_pid",
    "tree",
]

KINDS = ("torch", "cuda", "triton", "python", "heap", "shared", "device", "stack")
# CUDA's own libraries by name, where they are not under an nvidia/ or cuda folder (the
# driver's libcuda and libnvidia-*, a system CUDA's toolkit libraries).
_CUDA_LIBS = (
    "libcuda.", "libcudart", "libcublas", "libcudnn", "libcufft", "libcurand", "libcusparse",
    "libcusolver", "libcupti", "libnccl", "libnvidia-", "libnvrtc", "libnvJitLink",
    "libnvToolsExt", "libnvrm", "libnvos",
)  # fmt: skip


class KindBytes(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rss: int = 0
    pss: int = 0
    anonymous: int = 0

    def __add__(self, other: KindBytes) -> KindBytes:
        return KindBytes(
            rss=self.rss + other.rss,
            pss=self.pss + other.pss,
            anonymous=self.anonymous + other.anonymous,
        )


class ProcessFootprint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    ppid: int
    name: str  # the process title (vLLM names its engine core VLLM::EngineCore)
    threads: int
    rss: int
    pss: int
    anonymous: int
    swap: int
    kinds: dict[str, KindBytes]
    gpu_bytes: int | None  # NVML's figure for this process; None where NVML has none


class Footprint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    root_pid: int
    processes: list[ProcessFootprint]
    unreadable: list[int]  # processes of the tree whose smaps could not be read
    gpu_source: str  # "nvml", or why there are no per-process GPU figures

    @property
    def pss(self) -> int:
        """The tree's share of host memory: a page shared by n processes counts 1/n in each,
        so pages shared only within the tree count once (with a process outside it, less)."""
        return sum(p.pss for p in self.processes)

    @property
    def gpu_bytes(self) -> int:
        return sum(p.gpu_bytes or 0 for p in self.processes)

    def kind_totals(self) -> dict[str, KindBytes]:
        out = {k: KindBytes() for k in KINDS}
        for p in self.processes:
            for kind, b in p.kinds.items():
                out[kind] = out[kind] + b
        return out


def kind_of(path: str) -> str:
    """The kind of a mapping, from the path field of its smaps header ("" when anonymous)."""
    if path.startswith(("[anon_shmem", "/dev/zero", "/SYSV")):
        return "shared"  # shared anonymous memory
    if path in {"", "[heap]"} or path.startswith("[anon"):
        return "heap"
    if path.startswith("[stack"):
        return "stack"
    if path.startswith("["):  # [vdso], [vvar], [vsyscall]
        return "python"
    if path.startswith(("/dev/shm/", "/memfd:", "memfd:", "/SYSV")):  # noqa: S108 (a name)
        return "shared"
    if path.startswith(("/dev/nvidia", "/dev/nvmap", "/dev/nvhost", "/dev/dri")):
        return "device"
    lowered = path.lower()
    if "triton" in lowered or "torchinductor" in lowered:
        return "triton"
    if "/torch/" in path:
        return "torch"
    name = path.rsplit("/", 1)[-1]
    if "/nvidia/" in path or "/cuda" in path or "/tegra" in path or name.startswith(_CUDA_LIBS):
        return "cuda"
    return "python"


def parse_smaps(text: str) -> dict[str, KindBytes]:
    """Each kind's bytes from the text of /proc/<pid>/smaps."""
    sums: dict[str, list[int]] = {}
    current: list[int] | None = None
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head.endswith(":"):  # a field of the current mapping: "Rss:   12 kB"
            if current is None:
                continue
            field = head[:-1]
            slot = {"Rss": 0, "Pss": 1, "Anonymous": 2}.get(field)
            if slot is not None:
                with contextlib.suppress(ValueError, IndexError):
                    current[slot] += int(rest.split()[0]) * 1024
            continue
        # a mapping's header: "7f..-7f.. r-xp 00000000 08:01 1234   /path/lib.so"
        parts = line.split(None, 5)
        path = parts[5].strip() if len(parts) > 5 else ""
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        current = sums.setdefault(kind_of(path), [0, 0, 0])
    return {k: KindBytes(rss=v[0], pss=v[1], anonymous=v[2]) for k, v in sums.items()}


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _kib(value: str | None) -> int:
    try:
        return int((value or "0").split()[0]) * 1024
    except (ValueError, IndexError):
        return 0


def _name(pid: int, status: dict[str, str]) -> str:
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        title = cmdline[0].decode("utf-8", "replace").strip()
        if title.startswith("VLLM::") or (title and len(cmdline) == 1):
            return title  # a title set by setproctitle
        args = [a.decode("utf-8", "replace") for a in cmdline if a][:3]
        if args:
            return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(args))
    return status.get("Name", "?")


def tree(root: int) -> list[int]:
    """`root` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def load_nvml() -> Any:
    """The NVML binding (nvidia-ml-py, else the copy vLLM ships), None without either."""
    with contextlib.suppress(ImportError):
        import pynvml  # type: ignore[import-untyped]

        return pynvml
    with contextlib.suppress(ImportError):
        from vllm.third_party import pynvml as vendored  # vLLM ships a copy

        return vendored
    return None


def nvml_by_pid() -> tuple[dict[int, int], str]:
    """GPU bytes per process from NVML, and "nvml" or why there are none."""
    pynvml = load_nvml()
    if pynvml is None:
        return {}, "no NVML (neither nvidia-ml-py nor vLLM's copy of it is installed)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, a Jetson without the library
        return {}, f"NVML does not answer: {exc}"
    try:
        out: dict[int, int] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out[int(proc.pid)] = out.get(int(proc.pid), 0) + int(proc.usedGpuMemory or 0)
        return out, "nvml"
    except Exception as exc:  # NotSupported on Tegra
        return {}, f"NVML has no per-process figures here: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def service_pid(unit: str) -> int | None:
    """The unit's MainPID from systemd, None when it is not running or systemctl is absent."""
    try:
        run = subprocess.run(
            ["systemctl", "show", "--property", "MainPID", "--value", unit],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = run.stdout.strip()
    return int(value) if run.returncode == 0 and value.isdigit() and value != "0" else None


def footprint(root: int, pids: Iterable[int] | None = None, gpu: bool = True) -> Footprint:
    """The footprint of `root`'s process tree (or of `pids`). Raises ProcessLookupError when
    `root` does not exist and PermissionError when its smaps may not be read."""
    if not Path(f"/proc/{root}").exists():
        raise ProcessLookupError(f"no process {root}")
    gpu_by_pid, source = nvml_by_pid() if gpu else ({}, "not asked")
    procs: list[ProcessFootprint] = []
    unreadable: list[int] = []
    for pid in pids if pids is not None else tree(root):
        try:
            status = _status(pid)
            kinds = parse_smaps(Path(f"/proc/{pid}/smaps").read_text())
        except PermissionError:
            if pid == root:
                raise
            unreadable.append(pid)
            continue
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        total = KindBytes()
        for b in kinds.values():
            total = total + b
        procs.append(
            ProcessFootprint(
                pid=pid,
                ppid=int(status.get("PPid", "0") or 0),
                name=_name(pid, status),
                threads=int(status.get("Threads", "0") or 0),
                rss=total.rss,
                pss=total.pss,
                anonymous=total.anonymous,
                swap=_kib(status.get("VmSwap")),
                kinds=kinds,
                gpu_bytes=gpu_by_pid.get(pid) if source == "nvml" else None,
            )
        )
    return Footprint(root_pid=root, processes=procs, unreadable=unreadable, gpu_source=source)
