"""The Debian package as an operator gets it: built by packaging/build-deb.sh, installed
with apt-get into a minimal Debian 12 root booted under systemd-nspawn (systemd as PID 1,
Debian's mosquitto inside, a network of its own), doing its job, upgraded, purged.

Checked, in order, on one boot (the tests share its state):
- two builds (the version and a bumped one) hold the same payload, byte for byte, apart
  from the changelog that names the version; lintian reports nothing unreviewed;
- `apt-get install` of the .deb: the user, groups, directories, credential file, conffiles,
  the Whisper model joined by postinst, every shared library resolved in the root;
- postinst started the unit without waiting, and it became active after READY=1, with the
  shipped config (llm.enabled with no vLLM: degraded, keyword-only, and saying why);
- `agentctl status` and `agentctl doctor` answer inside; doctor names what is missing;
- a transcript published on the container's own broker comes back as an alert;
- `systemctl stop` is clean; an upgrade to the rebuilt package keeps an edited conffile;
- `apt-get purge` leaves nothing of the package behind but its system user.

The same tests run for the arm64 package (`[arm64]`): built inside an arm64 Debian 12 root
by packaging/build-foreign.sh, installed into another one booted under qemu-user-static,
with the limits scaled for emulation and what differs on arm64 checked as such (CTranslate2
left to the platform, `agentctl doctor`'s Jetson findings). Opt-in (EDGE_AGENT_DEB_ARM64=1,
`make deb-test-arm64`): its measured time is in docs/install.md.

Root only; the first run builds both packages (30-40 s each), runs lintian (about 50 s)
and debootstraps the root (about a minute); all are cached (tests/deb.py, tests/nspawn.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import __version__
from tests.deb import BuiltDeb, ensure_debs, missing_prerequisites, payload
from tests.jetson import ARM64_DEBIAN_JETSON
from tests.nspawn import Container, ensure_root, host_arch

_why_not = missing_prerequisites()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_why_not is not None, reason=f"the .deb under real systemd: {_why_not}"),
]

NATIVE = host_arch()
FOREIGN = "arm64" if NATIVE != "arm64" else "amd64"
# Everything under qemu: each limit of the container is multiplied by it.
EMULATED_TIME_FACTOR = 10.0
V1 = __version__
V2 = f"{V1}+rebuild1"  # sorts after V1: an upgrade
# The root the package is installed into: what it runs on, and nothing of the package's
# own Depends beyond what these pull in, so that apt-get must find them satisfied without a
# network (the container has none). mosquitto: the broker of the shipped config.
ROOT_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "adduser", "mosquitto",
                 "mosquitto-clients")  # fmt: skip
DEBS = Path("/srv/debs")
UNIT = "edge-agent.service"
CONFIG = Path("/etc/edge-agent/agent.yaml")
PREFIX = "factory/line3"  # the shipped config's topic prefix
STREAM = "line3-mic1"
# What the package may leave behind after a purge: its system user (Debian's practice).
PACKAGE_PATHS = (
    "/opt/edge-agent",
    "/var/lib/edge-agent",
    "/var/cache/edge-agent",
    "/etc/edge-agent",
    "/run/edge-agent",
    "/lib/systemd/system/edge-agent.service",
    "/etc/systemd/system/edge-agent.service",
    "/etc/systemd/system/multi-user.target.wants/edge-agent.service",
    "/usr/bin/edge-agent",
    "/usr/bin/agentctl",
    "/usr/share/doc/edge-agent",
)


@pytest.fixture(scope="module", params=[NATIVE, FOREIGN])
def arch(request: pytest.FixtureRequest) -> str:
    """The package's architecture: this machine's, then (opt-in) the other one under qemu."""
    name: str = request.param
    if name != NATIVE:
        if os.environ.get("EDGE_AGENT_DEB_ARM64") != "1":
            pytest.skip(f"the {name} package under qemu takes 27+ min: make deb-test-arm64")
        why = missing_prerequisites(name)
        if why is not None:
            pytest.skip(f"the {name} package under qemu: {why}")
    return name


@pytest.fixture(scope="module")
def emulated(arch: str) -> bool:
    return arch != NATIVE


@pytest.fixture(scope="module")
def debs(arch: str) -> dict[str, BuiltDeb]:
    built = ensure_debs([V1, V2], arch)
    for deb in built.values():
        size = deb.path.stat().st_size / 1e6
        how = "cached" if deb.cached else "built"
        print(f"\n{deb.path.name}: {size:.0f} MB, {how} in {deb.build_s:.0f} s")
    return built


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, debs: dict[str, BuiltDeb], arch: str, emulated: bool
) -> Iterator[Container]:
    """One boot for the module; powered off at the end whatever happened."""
    work = tmp_path_factory.mktemp(f"deb-{arch}")
    started = time.monotonic()
    root = ensure_root(ROOT_PACKAGES, (), arch)
    if time.monotonic() - started > 5:
        print(f"\ndebootstrap ({arch}): {time.monotonic() - started:.0f} s")
    folder = debs[V1].path.parent
    container = Container(
        root,
        {folder: DEBS},
        work / "console.log",
        private_network=True,
        time_factor=EMULATED_TIME_FACTOR if emulated else 1.0,
    )
    try:
        print(f"\nboot ({arch}): {container.boot():.1f} s")
        yield container
    finally:
        container.poweroff()


# When apt-get install began, for the time to the first READY=1; whether the credentials
# workaround below is in place.
MARKS: dict[str, float] = {}
# systemd 252 under qemu-user cannot set up any unit's credentials ("Failed to set up
# credentials: Invalid argument", exit 243/CREDENTIALS, a transient unit as much as ours):
# where a probe shows it, the unit's LoadCredential= is reset by this operator drop-in.
QEMU_DROPIN = Path("/etc/systemd/system/edge-agent.service.d/qemu-user.conf")


def credentials_work(box: Container) -> bool:
    probe = ["systemd-run", "--wait", "--quiet", "-p", "LoadCredential=probe:/etc/debian_version",
             "/bin/true"]  # fmt: skip
    return box.run(probe, check=False).returncode == 0


def inside(debs: dict[str, BuiltDeb], version: str) -> str:
    return str(DEBS / debs[version].path.name)


def apt(box: Container, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    argv = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q", *args]
    result = box.run(argv, check=False, timeout=600)
    took = time.monotonic() - started
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result, took


def status_json(box: Container) -> dict[str, Any]:
    raw = box.run(["agentctl", "status", "--json"], check=False)
    assert raw.returncode in (0, 2), raw.stderr  # 2: degraded, which is expected here
    data: dict[str, Any] = json.loads(raw.stdout)
    return data


def test_two_builds_hold_the_same_payload(
    debs: dict[str, BuiltDeb], arch: str, emulated: bool
) -> None:
    """Reproducible where the tools allow: the rebuild with another version differs only in
    the control file's Version and the changelog that names it."""
    first, second = payload(debs[V1].path), payload(debs[V2].path)
    assert first.keys() == second.keys()
    changelog = "./usr/share/doc/edge-agent/changelog.gz"
    differ = sorted(name for name in first if first[name] != second[name])
    assert differ == [changelog], differ
    assert {e.mtime for e in first.values()} == {next(iter(first.values())).mtime}
    assert {(e.uid, e.gid) for e in first.values()} == {(0, 0)}
    # What an operator gets: the venv, the entry points, the unit, the config.
    for name in (
        "./opt/edge-agent/bin/python",
        "./opt/edge-agent/pyvenv.cfg",
        "./usr/bin/edge-agent",
        "./usr/bin/agentctl",
        "./lib/systemd/system/edge-agent.service",
        "./etc/edge-agent/agent.yaml",
        "./etc/edge-agent/profiles/orin-nx-16gb.yaml",
        # the default adapter, a Model Derivative of Gemma, with the Gemma Terms of Use
        "./usr/share/edge-agent/models/gemma3-270m-edge/adapter_model.safetensors",
        "./usr/share/edge-agent/models/gemma3-270m-edge/NOTICE",
        "./usr/share/edge-agent/models/gemma3-270m-edge/GEMMA_TERMS.txt",
    ):
        assert name in first, name
    assert first["./opt/edge-agent/bin/python3"].link == "/usr/bin/python3"  # the device's
    assert "./etc/edge-agent/mqtt-password" not in first  # made by postinst, never replaced
    # Bytecode shipped for every module of the project (the service cannot write /opt).
    site = "./opt/edge-agent/lib/python3.11/site-packages/"
    sources = [n for n in first if n.startswith((site + "agent/", site + "pipelines/"))]
    modules = [Path(n) for n in sources if n.endswith(".py")]
    assert len(modules) > 50
    for module in modules:
        pyc = module.parent / "__pycache__" / f"{module.stem}.cpython-311.pyc"
        assert f"./{pyc}" in first, pyc
    fields = subprocess.run(
        ["dpkg-deb", "--field", str(debs[V1].path), "Depends"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for dep in ("python3 (>= 3.11)", "python3 (<< 3.12)", "libsystemd0", "adduser"):
        assert dep in fields, fields
    field = ["dpkg-deb", "--field", str(debs[V1].path), "Architecture"]
    assert subprocess.run(field, capture_output=True, text=True, check=True).stdout.strip() == arch
    # arm64: CTranslate2 is left to the platform (packaging/vendor.txt), the rest is aarch64.
    ct2 = [n for n in first if n.startswith(site + "ctranslate2/")]
    assert bool(ct2) is (arch == "amd64"), ct2[:3]
    elf = "./opt/edge-agent/lib/python3.11/site-packages/pydantic_core/"
    [core] = [n for n in first if n.startswith(elf) and n.endswith(".so")]
    assert ("aarch64" in core) is (arch == "arm64"), core


@pytest.mark.skipif(shutil.which("lintian") is None, reason="lintian is not installed")
def test_lintian_has_nothing_unreviewed(debs: dict[str, BuiltDeb]) -> None:
    """Errors and warnings are fixed or overridden with a reason
    (packaging/debian/lintian-overrides); the result is cached with the package."""
    deb = debs[V1].path
    cached = deb.with_suffix(".lintian")
    if not cached.exists():
        result = subprocess.run(
            ["lintian", "--display-level", ">=warning", str(deb)],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        cached.write_text(f"{result.returncode}\n{result.stdout}{result.stderr}")
    rc, _, output = cached.read_text().partition("\n")
    findings = [line for line in output.splitlines() if line[:2] in ("E:", "W:")]
    assert rc == "0" and not findings, output


def test_apt_get_install(box: Container, debs: dict[str, BuiltDeb], emulated: bool) -> None:
    if emulated and not credentials_work(box):
        print(f"\nqemu-user: no unit credentials here; {QEMU_DROPIN} resets LoadCredential=")
        box.run(["mkdir", "-p", str(QEMU_DROPIN.parent)])
        box.run(["sh", "-c", f"printf '[Service]\\nLoadCredential=\\n' > {QEMU_DROPIN}"])
        MARKS["no_credentials"] = 1.0
    MARKS["install"] = time.monotonic()
    result, took = apt(box, "install", "--no-install-recommends", inside(debs, V1))
    print(f"\napt-get install: {took:.1f} s")
    assert "Setting up edge-agent" in result.stdout
    state = box.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "edge-agent"]).stdout
    assert state == f"install ok installed {V1}"
    # The account postinst made: a system user, no login, in the GPU's groups.
    passwd = box.run(["getent", "passwd", "edge-agent"]).stdout.strip().split(":")
    assert int(passwd[2]) < 1000 and passwd[6] == "/usr/sbin/nologin", passwd
    groups = box.run(["id", "-nG", "edge-agent"]).stdout.split()
    assert {"edge-agent", "video", "render"} <= set(groups), groups
    # The credential file LoadCredential= needs: root's alone, empty, not a conffile.
    cred = box.run(["stat", "-c", "%a %U %s", "/etc/edge-agent/mqtt-password"]).stdout.split()
    assert cred == ["600", "root", "0"]
    conffiles = box.run(["dpkg-query", "-W", "-f", "${Conffiles}", "edge-agent"]).stdout
    assert str(CONFIG) in conffiles and "/etc/edge-agent/profiles/cpu-dev.yaml" in conffiles
    assert "mqtt-password" not in conffiles
    box.run(["test", "-d", "/etc/edge-agent/trusted_keys"])  # for the fleet's keys
    # The multilingual Whisper model, joined by postinst as the service's user.
    marker = "/var/cache/edge-agent/models/whisper-base/.edge-agent-whisper.json"
    assert box.run(["stat", "-c", "%U", marker]).stdout.strip() == "edge-agent"
    # The venv runs the root's own interpreter, and every shared library in it resolves
    # against what the package's Depends brought (no "not found").
    python = box.run(["readlink", "-f", "/opt/edge-agent/bin/python"]).stdout.strip()
    assert python.startswith("/usr/bin/python3.11"), python
    ldd = box.run(["sh", "-c", "find /opt/edge-agent -name '*.so*' -type f -exec ldd {} +"])
    assert "not found" not in ldd.stdout, [
        line for line in ldd.stdout.splitlines() if "not found" in line
    ]


def test_the_unit_becomes_active_after_ready(box: Container, emulated: bool) -> None:
    """postinst enabled the unit and started it without waiting; systemd calls it active
    only after READY=1, which comes once MQTT is connected and the engine has settled: with
    the shipped config (llm.enabled) and no vLLM, degraded after its start attempts."""
    props = box.wait_show("edge-agent", {"ActiveState": "active"}, limit_s=120)
    if "install" in MARKS:
        print(f"\nfirst READY=1: {time.monotonic() - MARKS['install']:.1f} s after apt-get began")
    assert box.run(["systemctl", "is-enabled", UNIT]).stdout.strip() == "enabled"
    assert props["StatusText"].startswith("0 streams, engine degraded"), props
    log = box.journal("edge-agent")
    assert "engine.degraded" in log and "agent.ready" in log, log
    cmdline = box.run(["cat", f"/proc/{props['MainPID']}/cmdline"]).stdout.split("\0")
    if emulated:  # binfmt_misc's P flag: qemu, the file it runs, then the process's own argv
        assert cmdline[0].startswith("/usr/libexec/qemu-binfmt/"), cmdline
        cmdline = cmdline[2:]
    assert cmdline[:2] == ["/opt/edge-agent/bin/python", "/usr/bin/edge-agent"], cmdline
    # `systemctl restart` returns once READY=1 came (Type=notify): by then the engine has
    # settled, so the status asked right after says degraded, never starting.
    started = time.monotonic()
    box.run(["systemctl", "restart", UNIT], timeout=120)
    took = time.monotonic() - started
    assert status_json(box)["llm"]["state"] == "degraded"
    print(f"\nsystemctl restart (until READY=1): {took:.1f} s")


def test_agentctl_status_answers(box: Container, arch: str) -> None:
    human = box.run(["agentctl", "status"], check=False)
    assert human.returncode == 2, human.stderr  # degraded: keyword-only
    # arm64: speech waits for the platform's CTranslate2, which the package leaves out.
    asr = "ready (base, cpu int8)" if arch == "amd64" else "unavailable (base, cpu int8)"
    for expected in ("line3-edge-01", "degraded", "connected", asr):
        assert expected in human.stdout, human.stdout
    status = status_json(box)
    assert status["state"] == "degraded" and status["mqtt"]["connected"] is True
    if arch == "arm64":
        assert "ctranslate2" in status["asr"]["error"], status["asr"]
    # Why, in the status: vLLM first, not the model it cannot prepare without it.
    assert "vLLM is not installed" in status["llm"]["detail"], status["llm"]


def test_agentctl_doctor_names_what_is_missing(box: Container, arch: str) -> None:
    result = box.run(["agentctl", "doctor", "--json"], check=False)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    states = {(f["area"], f["check"]): f["state"] for f in report["findings"]}
    assert states[("llm", "vllm")] == "missing"
    assert states[("llm", "torch")] == "missing"
    assert states[("asr", "ctranslate2")] == ("ok" if arch == "amd64" else "missing")
    assert states[("asr", "Whisper base")] == "ok"
    jetson = {check: state for (area, check), state in states.items() if area == "jetson"}
    if arch == "amd64":
        assert jetson == {}
    else:  # an arm64 Debian, not a Jetson: the GPU's pieces are named, as warnings (CPU)
        assert jetson == ARM64_DEBIAN_JETSON, jetson
        argv = ["agentctl", "doctor", "--json", "--set", "profile=orin-nx-16gb"]
        orin = box.run(argv, check=False)
        found = json.loads(orin.stdout)["findings"]
        missing = {f["check"] for f in found if f["area"] == "jetson" and f["state"] == "missing"}
        assert missing == {"L4T", "/dev/nvmap", "/dev/nvhost-*"}, orin.stdout
    if "no_credentials" in MARKS:  # the drop-in's empty LoadCredential=: nothing to check
        assert ("service", "credential mqtt-password") not in states
    else:
        assert states[("service", "credential mqtt-password")] == "ok"
    assert states[("service", "user edge-agent")] == "ok"
    assert states[("broker", "127.0.0.1:1883")] == "ok"
    assert report["cache_dir"] == "/var/cache/edge-agent"  # from the unit's Environment=
    # Without the LLM tier (and on arm64 speech) nothing is missing on this device.
    off = ["--set", "llm.enabled=false"] + (["--set", "asr.enabled=false"] * (arch != "amd64"))
    ok = box.run(["agentctl", "doctor", *off], check=False)
    assert ok.returncode == 0, ok.stdout
    assert "nothing the configuration needs is missing" in ok.stdout


def test_agentctl_plan_finds_the_installed_profiles(box: Container) -> None:
    """The venv has no source tree: profiles by name come from /etc/edge-agent/profiles.
    The Orin's model slot is empty here, so the plan stops at the model, not the profile."""
    result = box.run(["agentctl", "plan", "--profile", "orin-nx-16gb"], check=False)
    assert result.returncode == 2, result.stdout
    assert "no profile" not in result.stderr
    assert "/var/lib/edge-agent/models/llm" in result.stderr, result.stderr


def test_a_transcript_published_inside_becomes_an_alert(box: Container) -> None:
    """The installed package does the job: Debian's mosquitto in the container, a fault
    phrase on its transcript topic, an alert on its alerts topic."""
    sub = subprocess.Popen(
        # line-buffered: its SUBACK line is the signal to publish
        ["nsenter", "-t", str(box.leader), "-a", "stdbuf", "-oL", "mosquitto_sub", "-d",
         "-h", "127.0.0.1", "-t", f"{PREFIX}/alerts", "-C", "1", "-W",
         str(int(30 * box.time_factor))],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert sub.stdout is not None
        lines = []
        while "SUBACK" not in (line := sub.stdout.readline()):  # subscribed: publish now
            assert line, "mosquitto_sub ended before subscribing"
            lines.append(line)
        now = time.time()
        segment = {
            "stream_id": STREAM,
            "seq": 1,
            "start": now - 4,
            "end": now,
            "text": "Wait, I hear a bearing abnormal noise on roller four.",
        }
        box.run(["mosquitto_pub", "-h", "127.0.0.1", "-q", "1", "-t",
                 f"{PREFIX}/streams/{STREAM}/transcript", "-m", json.dumps(segment)])  # fmt: skip
        out, _ = sub.communicate(timeout=40 * box.time_factor)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    [event] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert event["type"] == "new"
    assert (event["alert"]["stream_id"], event["alert"]["fault"]) == (STREAM, "bearing_noise")
    assert event["device_id"] == "line3-edge-01"


def test_systemctl_stop_is_clean(box: Container) -> None:
    # systemd logs notify messages and a clean exit at debug level.
    box.run(["systemd-analyze", "log-level", "debug"])
    mark = box.cursor()
    try:
        started = time.monotonic()
        box.run(["systemctl", "stop", UNIT], timeout=120)
        took = time.monotonic() - started
    finally:
        box.run(["systemd-analyze", "log-level", "info"])
    assert box.show(UNIT, "ActiveState")["ActiveState"] == "inactive"
    log = box.journal("edge-agent", after=mark)
    assert "STOPPING=1" in log and "agent.stopped" in log, log
    assert "Main process exited, code=exited, status=0/SUCCESS" in log, log
    assert "SIGKILL" not in log and "Failed with result" not in log, log
    assert took < 15 * box.time_factor, f"stop took {took:.1f} s"
    print(f"\nsystemctl stop: {took:.1f} s")
    box.run(["systemctl", "start", UNIT], timeout=120)  # for the upgrade: running


def test_an_upgrade_keeps_the_edited_conffile(box: Container, debs: dict[str, BuiltDeb]) -> None:
    box.run(["sed", "-i", "s/^device_id: .*/device_id: line3-edge-upgraded/", str(CONFIG)])
    box.run(["sh", "-c", "printf s3cret > /etc/edge-agent/mqtt-password"])
    before = box.show(UNIT, "MainPID")["MainPID"]
    result, took = apt(box, "install", "--no-install-recommends", inside(debs, V2))
    print(f"\napt-get install (upgrade): {took:.1f} s")
    assert f"Unpacking edge-agent ({V2}) over ({V1})" in result.stdout, result.stdout
    version = box.run(["dpkg-query", "-W", "-f", "${Version}", "edge-agent"]).stdout
    assert version == V2
    # The operator's edit and password are kept; dpkg had nothing to ask (the package's
    # conffile did not change), so no .dpkg-dist or .dpkg-old beside it.
    assert "device_id: line3-edge-upgraded" in box.run(["cat", str(CONFIG)]).stdout
    assert box.run(["cat", "/etc/edge-agent/mqtt-password"]).stdout == "s3cret"
    leftovers = box.run(["find", "/etc/edge-agent", "-name", "*.dpkg-*"]).stdout
    assert leftovers == ""
    # Stopped by prerm, started again by postinst: a new process, running the edit.
    after = box.wait_show("edge-agent", {"ActiveState": "active"}, limit_s=120)
    assert after["MainPID"] != before
    assert status_json(box)["device_id"] == "line3-edge-upgraded"


def test_purge_leaves_nothing_behind(box: Container) -> None:
    box.run(["rm", "-rf", str(QEMU_DROPIN.parent)])  # the test's own, not the package's
    result, took = apt(box, "purge", "edge-agent")
    print(f"\napt-get purge: {took:.1f} s")
    assert "Purging configuration files for edge-agent" in result.stdout
    assert box.run(["dpkg-query", "-W", "edge-agent"], check=False).returncode != 0
    for path in PACKAGE_PATHS:
        assert box.run(["test", "-e", path], check=False).returncode != 0, path
        assert box.run(["dpkg", "-S", path], check=False).returncode != 0, path
    named = box.run(["find", "/", "-xdev", "(", "-name", "*edge-agent*", "-o", "-name",
                     "*edge_agent*", ")", "-not", "-path", "/proc/*"]).stdout  # fmt: skip
    assert named == "", named
    owned = box.run(["find", "/", "-xdev", "-user", "edge-agent", "-not", "-path", "/proc/*"])
    assert owned.stdout == "", owned.stdout
    assert box.run(["systemctl", "cat", UNIT], check=False).returncode != 0
    # Kept on purpose: a reused uid could own files left elsewhere (docs/install.md).
    assert box.run(["getent", "passwd", "edge-agent"], check=False).returncode == 0
