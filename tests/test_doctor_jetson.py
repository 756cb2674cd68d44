"""`agentctl doctor` on arm64 (agent/doctor/jetson.py) against a fake host: a JetPack 6 Orin,
the emulated arm64 Debian of tests/test_deb.py, and each way a Jetson can fall short (PyPI's
CTranslate2 in the venv, a sandbox that hides the GPU, nodes of a group the service lacks).
The real host runs inside the arm64 container in tests/test_deb.py."""

from __future__ import annotations

from pathlib import Path

from agent.doctor import Report, diagnose, read_unit
from agent.doctor.host import DeviceNode
from agent.doctor.jetson import VENDOR
from agent.doctor.unit import Unit
from tests.jetson import ARM64_DEBIAN_JETSON
from tests.lock import read_vendor
from tests.test_doctor import CONFIG, EVERYTHING, SHIPPED_UNIT, FakeHost, file, installed

ORIN = ["profile=orin-nx-16gb"]
L4T = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n"
NODES = {
    "/dev/nvmap": [DeviceNode("/dev/nvmap", "video", 0o660)],
    "/dev/nvhost-*": [
        DeviceNode("/dev/nvhost-ctrl-gpu", "video", 0o660),
        DeviceNode("/dev/nvhost-gpu", "render", 0o660),
    ],
}
JETSON_CHECKS = [
    "L4T",
    "vendor torch",
    "vendor vllm",
    "vendor ctranslate2",
    "/dev/nvmap",
    "/dev/nvhost-*",
    "device policy",
    "groups video, render",
]


def orin(cache: Path, **kw: object) -> FakeHost:
    """JetPack 6 with NVIDIA's torch, vLLM and CTranslate2 in the system Python, the GPU's
    nodes, the package installed and the deployment's model in its slot."""
    files = installed(cache)
    files[Path("/var/lib/edge-agent/models/llm/config.json")] = file()
    args: dict[str, object] = {
        "arch": "aarch64",
        "files": files,
        "texts": {"/etc/nv_tegra_release": L4T},
        "nodes": NODES,
    }
    args.update(kw)
    return FakeHost(**args)  # type: ignore[arg-type]


def unit_with(tmp_path: Path, extra: str = "") -> Unit:
    path = tmp_path / "edge-agent.service"
    path.write_text(SHIPPED_UNIT.read_text() + "[Service]\n" + extra)  # after [Install]
    found = read_unit([path], [])
    assert found is not None
    return found


def jetson(report: Report) -> dict[str, str]:
    return {f.check: f.state for f in report.findings if f.area == "jetson"}


def test_an_orin_with_jetpack_lacks_nothing(tmp_path: Path) -> None:
    unit = unit_with(tmp_path)
    report = diagnose(CONFIG, orin(tmp_path), unit=unit, overrides=ORIN, cache_dir=tmp_path)
    assert report.missing == [], report.findings
    assert list(jetson(report)) == JETSON_CHECKS
    assert set(jetson(report).values()) == {"ok"}
    by_check = {f.check: f for f in report.findings if f.area == "jetson"}
    assert by_check["L4T"].detail.startswith("R36 (release), REVISION: 4.3")
    torch = by_check["vendor torch"].detail
    assert "from the system (/usr/lib/python3/dist-packages/torch" in torch


def test_the_emulated_arm64_debian(tmp_path: Path) -> None:
    """What tests/test_deb.py's arm64 root is: no L4T, no GPU nodes, no vendor builds (and
    the arm64 package leaves CTranslate2 out). With the shipped CPU config the Jetson pieces
    are warnings; with the Orin's profile they are what is missing."""
    bare = {m: v for m, v in EVERYTHING.items() if m not in ("vllm", "torch", "ctranslate2")}
    host = FakeHost(arch="aarch64", modules=bare, files=installed(tmp_path))
    unit = unit_with(tmp_path)
    cpu = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path)
    assert jetson(cpu) == ARM64_DEBIAN_JETSON
    assert [(f.area, f.check) for f in cpu.missing] == [
        ("llm", "vllm"),
        ("llm", "torch"),
        ("asr", "ctranslate2"),
    ]
    ct2 = cpu.missing[2]  # the package leaves it out on arm64: JetPack's, not PyPI's
    assert "NVIDIA's CUDA build of CTranslate2" in (ct2.hint or ""), ct2
    off = ["llm.enabled=false", "asr.enabled=false"]
    keyword_only = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path, overrides=off)
    assert keyword_only.missing == []
    on_cuda = diagnose(CONFIG, host, unit=unit, cache_dir=tmp_path, overrides=ORIN)
    assert [f.check for f in on_cuda.missing if f.area == "jetson"] == [
        "L4T",
        "/dev/nvmap",
        "/dev/nvhost-*",
    ]
    nvmap = next(f for f in on_cuda.missing if f.check == "/dev/nvmap")
    assert "not a Jetson" in nvmap.detail and "the profile runs on CUDA" in nvmap.detail


def test_pypi_ctranslate2_in_the_venv_shadows_jetpacks(tmp_path: Path) -> None:
    venv = "/opt/edge-agent/lib/python3.10/site-packages/ctranslate2/__init__.py"
    host = orin(tmp_path, origins={"ctranslate2": (venv, True)})
    report = diagnose(CONFIG, host, unit=unit_with(tmp_path), overrides=ORIN, cache_dir=tmp_path)
    ct2 = next(f for f in report.findings if f.check == "vendor ctranslate2")
    assert ct2.state == "warn" and venv in ct2.detail and "CPU-only" in ct2.detail
    assert "leaves ctranslate2 out" in (ct2.hint or "")


def test_a_sandbox_that_hides_the_gpu(tmp_path: Path) -> None:
    private = unit_with(tmp_path, "PrivateDevices=yes\n")
    report = diagnose(CONFIG, orin(tmp_path), unit=private, overrides=ORIN, cache_dir=tmp_path)
    [policy] = report.missing
    assert policy.check == "device policy" and "PrivateDevices=yes" in policy.detail
    closed = unit_with(tmp_path, "DevicePolicy=closed\nDeviceAllow=/dev/nvmap rw\n")
    report = diagnose(CONFIG, orin(tmp_path), unit=closed, overrides=ORIN, cache_dir=tmp_path)
    [policy] = report.missing
    assert "without DeviceAllow= for /dev/nvhost-*" in policy.detail
    allowed = unit_with(
        tmp_path, "DevicePolicy=closed\nDeviceAllow=/dev/nvmap rw\nDeviceAllow=/dev/nvhost-* rw\n"
    )
    report = diagnose(CONFIG, orin(tmp_path), unit=allowed, overrides=ORIN, cache_dir=tmp_path)
    assert report.missing == [] and jetson(report)["device policy"] == "ok"


def test_nodes_of_a_group_the_service_lacks(tmp_path: Path) -> None:
    nodes = dict(NODES)
    nodes["/dev/nvhost-*"] = [DeviceNode("/dev/nvhost-ctrl-gpu", "nvgpu", 0o660)]
    host = orin(tmp_path, nodes=nodes)
    report = diagnose(CONFIG, host, unit=unit_with(tmp_path), overrides=ORIN, cache_dir=tmp_path)
    [closed] = report.missing
    assert closed.check == "/dev/nvhost-*" and "/dev/nvhost-ctrl-gpu (nvgpu 0660)" in closed.detail
    # The user's own membership counts too (the unit only adds groups).
    host = orin(tmp_path, nodes=nodes, members={"edge-agent": {"edge-agent", "nvgpu"}})
    report = diagnose(CONFIG, host, unit=unit_with(tmp_path), overrides=ORIN, cache_dir=tmp_path)
    assert report.missing == []
    # A unit without the GPU's groups.
    bare = unit_with(tmp_path, "SupplementaryGroups=\n")
    report = diagnose(CONFIG, orin(tmp_path), unit=bare, overrides=ORIN, cache_dir=tmp_path)
    assert "groups video, render" in [f.check for f in report.missing]


def test_not_on_x86_64(tmp_path: Path) -> None:
    host = FakeHost(files=installed(tmp_path))
    report = diagnose(CONFIG, host, unit=unit_with(tmp_path), cache_dir=tmp_path)
    assert jetson(report) == {}


def test_the_vendor_list_is_packaging_vendor_txt() -> None:
    """The doctor's list of NVIDIA's builds is the one build-deb.sh and the lock test use."""
    assert [dist for _, dist, _ in VENDOR] == [v.name for v in read_vendor()]
