"""`agentctl doctor` on arm64: what a Jetson (JetPack 6) provides that the package does not.

Run on aarch64 only (area `jetson`), one finding for each difference docs/install.md names
between the arm64 package and a working Orin:

- `L4T`: NVIDIA's Linux for Tegra (/etc/nv_tegra_release), i.e. a Jetson at all;
- `vendor torch`, `vendor vllm`, `vendor ctranslate2` (packaging/vendor.txt): NVIDIA's
  builds in the system's site-packages, which the venv sees; a PyPI build in the venv is
  CPU-only on aarch64 and would shadow them;
- `/dev/nvmap`, `/dev/nvhost-*`: the integrated GPU's device nodes exist, and their groups
  are ones the service has (the unit's Group=, SupplementaryGroups=, the user's groups);
- `device policy`: the unit lets the service open them (no PrivateDevices=, no closed
  DevicePolicy= without a DeviceAllow= for them);
- `groups video, render`: the unit grants both (the groups JetPack gives the GPU's nodes).

A problem is `missing` when the configuration runs something on CUDA (the engine's device
or `asr.device`), else a `warn`: a CPU configuration works without the GPU.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

from agent.config.models import AgentConfig
from agent.doctor.findings import INSTALL_DOC, Finding, State
from agent.doctor.host import Host
from agent.doctor.unit import Unit

__all__ = ["DEVICE_NODES", "GPU_GROUPS", "VENDOR", "jetson"]

L4T_RELEASE = "/etc/nv_tegra_release"
# (module, distribution, the area that needs it): packaging/vendor.txt, as installed (the
# package does not ship packaging/; tests/test_doctor.py checks the two agree).
VENDOR = (("torch", "torch", "llm"), ("vllm", "vllm", "llm"), ("ctranslate2", "ctranslate2", "asr"))
DEVICE_NODES = ("/dev/nvmap", "/dev/nvhost-*")
GPU_GROUPS = ("video", "render")
_TRUE = ("yes", "true", "on", "1")


def uses_cuda(cfg: AgentConfig) -> bool:
    engine = cfg.engine if cfg.llm.enabled else None
    return (engine is not None and engine.device.kind == "cuda") or (
        cfg.asr.enabled and cfg.asr.device == "cuda"
    )


def jetson(cfg: AgentConfig | None, host: Host, unit: Unit | None) -> Iterator[Finding]:
    """The Jetson findings; nothing on another architecture."""
    if host.machine() != "aarch64":
        return
    needed = cfg is not None and uses_cuda(cfg)
    bad: State = "missing" if needed else "warn"
    why = "the profile runs on CUDA" if needed else "only for CUDA (this configuration is CPU)"
    release = host.read_text(L4T_RELEASE)
    if release is None:
        yield Finding(
            area="jetson",
            check="L4T",
            state=bad,
            detail=f"no {L4T_RELEASE}: not a Jetson (an arm64 machine without NVIDIA's L4T); "
            f"the GPU checks below cannot pass here; {why}",
            hint=f"JetPack 6 on the Orin ({INSTALL_DOC})",
        )
    else:
        first = release.strip().splitlines()[0].lstrip("# ") if release.strip() else "?"
        yield Finding(area="jetson", check="L4T", state="ok", detail=first)
    if cfg is not None:
        yield from _vendor(cfg, host)
    yield from _nodes(host, unit, bad, why)
    yield from _policy(unit, bad, why)
    yield from _groups(host, unit, bad, why)


def _vendor(cfg: AgentConfig, host: Host) -> Iterator[Finding]:
    enabled = {"llm": cfg.llm.enabled, "asr": cfg.asr.enabled}
    for module, dist, area in VENDOR:
        check = f"vendor {dist}"
        if not enabled[area]:
            yield Finding(area="jetson", check=check, state="skip", detail=f"{area}.enabled: false")
            continue
        version = host.module(module, dist)
        origin = host.module_origin(module)
        if version is None or origin is None:
            yield Finding(
                area="jetson",
                check=check,
                state="skip",
                detail=f"not installed: the {area} findings say what it takes",
            )
            continue
        path, in_venv = origin
        if in_venv:
            yield Finding(
                area="jetson",
                check=check,
                state="warn",
                detail=f"{dist} {version} from the venv ({path}): a PyPI build, CPU-only on "
                "aarch64, and it shadows NVIDIA's in the system's site-packages",
                hint=f"NVIDIA's build in the system Python, and none in /opt/edge-agent "
                f"(the arm64 package leaves ctranslate2 out; {INSTALL_DOC})",
            )
        else:
            yield Finding(
                area="jetson",
                check=check,
                state="ok",
                detail=f"{dist} {version} from the system ({path})",
            )


def _granted(host: Host, unit: Unit | None) -> set[str]:
    """The groups the service runs with."""
    if unit is None:
        return set()
    return {unit.group, *unit.words("SupplementaryGroups"), *host.member_groups(unit.user)}


def _nodes(host: Host, unit: Unit | None, bad: State, why: str) -> Iterator[Finding]:
    granted = _granted(host, unit)
    for pattern in DEVICE_NODES:
        nodes = host.device_nodes(pattern)
        if not nodes:
            yield Finding(
                area="jetson",
                check=pattern,
                state=bad,
                detail=f"no {pattern}: the integrated GPU is not there (not a Jetson, or a "
                f"container without its device nodes); {why}",
                hint="JetPack's nvgpu and nvmap drivers (a container needs the nodes bound)",
            )
            continue
        closed = [
            f"{n.path} ({n.group} {n.mode:04o})"
            for n in nodes
            if not (n.mode & 0o006 == 0o006 or (n.mode & 0o060 == 0o060 and n.group in granted))
        ]
        names = ", ".join(sorted({n.group for n in nodes}))
        if unit is not None and closed:
            yield Finding(
                area="jetson",
                check=pattern,
                state=bad,
                detail=f"the service's groups ({', '.join(sorted(granted))}) cannot open "
                f"{'; '.join(closed[:3])}",
                hint="SupplementaryGroups= with the nodes' group (a drop-in, docs/systemd.md)",
            )
        else:
            yield Finding(
                area="jetson",
                check=pattern,
                state="ok",
                detail=f"{len(nodes)} node(s), group {names}",
            )


def _policy(unit: Unit | None, bad: State, why: str) -> Iterator[Finding]:
    if unit is None:
        yield Finding(area="jetson", check="device policy", state="skip", detail="no unit")
        return
    if unit.last("PrivateDevices").lower() in _TRUE:
        yield Finding(
            area="jetson",
            check="device policy",
            state=bad,
            detail=f"PrivateDevices=yes hides /dev/nvmap and /dev/nvhost-* from the service; {why}",
            hint="remove PrivateDevices= (the shipped unit has none; docs/systemd.md)",
        )
        return
    policy = unit.last("DevicePolicy", "auto")
    if policy in ("closed", "strict"):
        allowed = [value.split()[0] for value in unit.values.get("DeviceAllow", []) if value]
        shut = [
            node
            for node in DEVICE_NODES
            if not any(fnmatch.fnmatch(node, a) or a == node for a in allowed)
        ]
        if shut:
            yield Finding(
                area="jetson",
                check="device policy",
                state=bad,
                detail=f"DevicePolicy={policy} without DeviceAllow= for {', '.join(shut)}; {why}",
                hint="DeviceAllow=/dev/nvmap rw and DeviceAllow=/dev/nvhost-* rw, or no "
                "DevicePolicy= (docs/systemd.md)",
            )
            return
    yield Finding(
        area="jetson",
        check="device policy",
        state="ok",
        detail=f"DevicePolicy={policy}, no PrivateDevices=: the nodes' groups decide",
    )


def _groups(host: Host, unit: Unit | None, bad: State, why: str) -> Iterator[Finding]:
    check = "groups " + ", ".join(GPU_GROUPS)
    if unit is None:
        yield Finding(area="jetson", check=check, state="skip", detail="no unit")
        return
    granted = _granted(host, unit)
    lacking = [g for g in GPU_GROUPS if g not in granted or not host.group(g)]
    if lacking:
        yield Finding(
            area="jetson",
            check=check,
            state=bad,
            detail=f"the service is not in {', '.join(lacking)} (JetPack's groups of the GPU's "
            f"nodes); {why}",
            hint="SupplementaryGroups=video render (the shipped unit), groups that exist "
            "(the package's postinst makes them)",
        )
        return
    yield Finding(area="jetson", check=check, state="ok", detail=f"granted to {unit.user}")
