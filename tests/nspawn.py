"""A real systemd for the tests: a cached minimal Debian root booted with systemd-nspawn.

`ensure_root()` debootstraps the root once (about a minute; an arm64 one, under qemu, about
five) and caches it under
`$EDGE_AGENT_TEST_CACHE/nspawn/` (default `~/.cache/edge-agent/nspawn/`), keyed by what it
is built from; `ensure_venv()` builds the project's venv with the host's /usr/bin/python3
(Debian 12's 3.11, the same interpreter as the root's) and reinstalls the project itself
once per test session; `Container` boots the root with a tmpfs overlay over it (the cache is
never written) and runs commands inside through nsenter. Root only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "VENV_MOUNT",
    "Container",
    "digest",
    "ensure_root",
    "ensure_venv",
    "host_arch",
    "locked",
    "missing_emulation",
    "missing_prerequisites",
]

REPO = Path(__file__).resolve().parents[1]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the service needs at run time: systemd as PID 1 (libsystemd0 comes with it), dbus for
# systemctl, and the interpreter the host's venv points at (/usr/bin/python3, 3.11).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv")
# The .deb's postinst will create the service's user and groups; until it exists the root
# gets them here (the unit's User=, Group= and SupplementaryGroups= need them to start).
ACCOUNTS = (
    "getent group video >/dev/null || groupadd --system video",
    "getent group render >/dev/null || groupadd --system render",
    "getent passwd edge-agent >/dev/null || useradd --system --user-group"
    " --home-dir /var/lib/edge-agent --no-create-home --shell /usr/sbin/nologin edge-agent",
)
# Where the venv appears inside the container (dh-virtualenv's layout). Not the host path:
# the unit's ProtectHome=yes hides /root and /home from the service, so a venv under the
# host's ~/.cache would not be executable there.
VENV_MOUNT = Path("/opt/venvs/edge-agent")
# The host's interpreter must be the root's: the venv's bin/python is a symlink to it.
HOST_PYTHON = Path("/usr/bin/python3")
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
    "COLUMNS": "160",  # rich's tables and systemctl status, without a terminal
}


def cache_dir() -> Path:
    base = os.environ.get("EDGE_AGENT_TEST_CACHE") or Path.home() / ".cache" / "edge-agent"
    path = Path(base) / "nspawn"
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_arch() -> str:
    """This machine's Debian architecture (amd64)."""
    argv = ["dpkg", "--print-architecture"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return out.stdout.strip() or "amd64"


def missing_emulation(arch: str) -> str | None:
    """Why roots of `arch` cannot run here (qemu-user-static through binfmt_misc), or None."""
    if arch == host_arch():
        return None
    qemu = {"arm64": "aarch64"}.get(arch)
    if qemu is None:
        return f"no emulation for {arch}"
    binfmt = Path(f"/proc/sys/fs/binfmt_misc/qemu-{qemu}")
    try:
        lines = binfmt.read_text().splitlines()
    except OSError:
        lines = []
    if (
        not lines
        or lines[0] != "enabled"
        or not any(line.startswith("flags:") and "F" in line for line in lines)
    ):
        return (
            f"qemu-{qemu} is not registered with binfmt_misc (as root: bash "
            "packaging/qemu-setup.sh)"
        )
    return None


def missing_prerequisites() -> str | None:
    """Why the container tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, systemd-nspawn, nsenter)"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter", "pgrep", "gcc", "pkg-config"):
        if shutil.which(tool) is None:
            return (
                f"{tool} is missing (scripts/setup.sh installs debootstrap and systemd-container)"
            )
    if subprocess.run(["pkg-config", "--exists", "libsystemd"], check=False).returncode != 0:
        return "libsystemd-dev is missing (systemd-python is built for the venv)"
    probe = [str(HOST_PYTHON), "-c", "import sys; assert sys.version_info[:2] == (3, 11)"]
    if not HOST_PYTHON.exists() or subprocess.run(probe, check=False).returncode != 0:
        return f"{HOST_PYTHON} is not Python 3.11 (the {SUITE} root's interpreter)"
    return None


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One builder at a time across concurrent test sessions."""
    with (cache_dir() / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def _run(argv: Sequence[str | Path], log: Path) -> None:
    with log.open("ab") as out:
        result = subprocess.run(
            [str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{argv[0]} failed ({result.returncode}); {log}:\n{tail}")


def ensure_root(
    packages: Sequence[str] = PACKAGES, setup: Sequence[str] = ACCOUNTS, arch: str | None = None
) -> Path:
    """The cached root of `packages`, with the shell commands `setup` run in it, debootstrapped
    on first use. Built in a temporary folder and renamed into place when complete, so an
    interrupted build never leaves a half root behind. `arch`: another architecture than
    the machine's (arm64), run under qemu-user-static (about 5 minutes more, once)."""
    foreign = arch is not None and arch != host_arch()
    key = digest(SUITE, MIRROR, *packages, *setup, *([arch] if foreign else []))
    root = cache_dir() / (f"{SUITE}-{arch}-{key}" if foreign else f"{SUITE}-{key}")
    if root.is_dir():
        return root
    with locked("root"):
        if root.is_dir():  # another session built it while we waited
            return root
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=cache_dir()))
        log = cache_dir() / f"{root.name}.log"
        try:
            _run(
                ["debootstrap", *([f"--arch={arch}"] if foreign else []), "--variant=minbase",
                 f"--include={','.join(packages)}", SUITE, tmp / "root", MIRROR],
                log,
            )  # fmt: skip
            for command in setup:
                _run(["chroot", tmp / "root", "sh", "-ec", command], log)
            (tmp / "root").rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _stage_source(dest: Path) -> Path:
    """The project's packaging inputs, copied: a non-editable build writes build/ and
    *.egg-info into its source folder, which must not be the checkout."""
    src = dest / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("agent", "pipelines"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    return src


def ensure_venv(workdir: Path) -> Path:
    """The host-side venv (installed, not editable, with the `systemd` extra), its project
    reinstalled from the working tree so the container runs the current code. Rebuilt from
    scratch only when pyproject.toml changes."""
    key = digest((REPO / "pyproject.toml").read_bytes())
    venv = cache_dir() / f"venv-{key}"
    python: list[str | Path] = [venv / "bin" / "python"]
    pip = [*python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    log = workdir / "venv.log"
    with locked("venv"):
        if not (venv / ".complete").exists():
            # 75 MB each: keep only the venv of the current pyproject.toml
            for stale in cache_dir().glob("venv-*"):
                shutil.rmtree(stale, ignore_errors=True)
            _run([HOST_PYTHON, "-m", "venv", venv], log)
            # setuptools in the venv: the per-session reinstall builds without isolation
            # (no fresh build environment from the index every session).
            _run([*pip, "setuptools>=68", "wheel"], log)
            _run([*pip, f"{_stage_source(workdir / 'full')}[systemd]"], log)
            (venv / ".complete").touch()
        _run(
            [*pip, "--no-deps", "--force-reinstall", "--no-build-isolation",
             _stage_source(workdir / "project")],
            log,
        )  # fmt: skip
        # pip wrote the host path into the console scripts; inside they run from VENV_MOUNT.
        for script in ("edge-agent", "agentctl"):
            path = venv / "bin" / script
            lines = path.read_text().splitlines(keepends=True)
            path.write_text(f"#!{VENV_MOUNT}/bin/python\n" + "".join(lines[1:]))
    return venv


class Container:
    """The root booted under systemd-nspawn (systemd as PID 1), commands run inside with
    nsenter. `--register=no --keep-unit`: the host has no systemd (no machined, no bus to
    register with); `--volatile=overlay`: every write goes to a tmpfs over the cached root."""

    def __init__(
        self,
        root: Path,
        binds: dict[Path, Path],
        log: Path,
        *,
        private_network: bool = False,
        time_factor: float = 1.0,
    ) -> None:
        self.root = root
        # Every limit is multiplied by it: a root of another architecture runs under qemu.
        self.time_factor = time_factor
        self.binds = binds  # host path -> container path, read-only
        self.log = log
        # Only a loopback of its own: a broker inside listens on 127.0.0.1:1883 without
        # meeting the host's (or another test session's) ports.
        self.private_network = private_network
        self.name = f"edge-agent-test-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0  # the container's systemd, as a host pid

    def boot(self, limit_s: float = 60.0) -> float:
        """Start the container; return once systemd reports the system running (or degraded:
        a unit of the minimal root may fail in a container, which the tests do not need).
        Returns the boot time in seconds."""
        argv = [
            "systemd-nspawn", "--quiet", "--directory", str(self.root), "--machine", self.name,
            "--register=no", "--keep-unit", "--boot", "--console=pipe", "--volatile=overlay",
        ]  # fmt: skip
        argv += [f"--bind-ro={host}:{inside}" for host, inside in self.binds.items()]
        if self.private_network:
            argv.append("--private-network")
        limit_s *= self.time_factor
        start = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = start + limit_s
        while not self.leader or not self._has_bus():
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"container did not boot in {limit_s:g} s; see {self.log}")
            self.leader = self.leader or self._find_leader()
            time.sleep(0.05)
        state = self.run(
            ["systemctl", "is-system-running", "--wait"],
            check=False,
            timeout=limit_s / self.time_factor,
        )
        if state.stdout.strip() not in ("running", "degraded"):
            raise RuntimeError(f"system state {state.stdout.strip()!r}; see {self.log}")
        return time.monotonic() - start

    def _find_leader(self) -> int:
        assert self.proc is not None
        found = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-x", "systemd"],
            capture_output=True,
            text=True,
            check=False,
        )
        pids = found.stdout.split()
        return int(pids[0]) if pids else 0

    def _has_bus(self) -> bool:
        test = ["nsenter", "-t", str(self.leader), "-a", "test", "-S", "/run/systemd/private"]
        return subprocess.run(test, check=False).returncode == 0

    def run(
        self,
        argv: Sequence[str | Path],
        *,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """A command inside the container (all its namespaces), as root, clean environment."""
        assert self.leader, "not booted"
        result = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", *[str(a) for a in argv]],
            capture_output=True,
            text=True,
            env=CLEAN_ENV,
            timeout=timeout * self.time_factor,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(map(str, argv))} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """`systemctl show -p ...` as a dict."""
        out = self.run(["systemctl", "show", unit, *[f"--property={p}" for p in props]]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_show(self, unit: str, check: dict[str, str], limit_s: float) -> dict[str, str]:
        """Poll `systemctl show` until every property in `check` has its value."""
        limit_s *= self.time_factor
        deadline = time.monotonic() + limit_s
        while True:
            props = self.show(unit, *check, "MainPID", "NRestarts", "StatusText")
            if all(props.get(k) == v for k, v in check.items()):
                return props
            if time.monotonic() > deadline:
                raise AssertionError(f"after {limit_s:g} s: {props}, wanted {check}")
            time.sleep(0.1)

    def journal(self, unit: str, after: str | None = None) -> str:
        """The unit's journal (messages only), all of it or after a `cursor()`."""
        argv = ["journalctl", f"--unit={unit}", "--output=cat", "--no-pager"]
        return self.run([*argv, f"--after-cursor={after}"] if after else argv).stdout

    def cursor(self) -> str:
        """The journal's position now, to read only what comes after it."""
        out = self.run(["journalctl", "--show-cursor", "--lines=0", "--no-pager"]).stdout
        return out.strip().rsplit("-- cursor: ", 1)[1]

    def poweroff(self, limit_s: float = 30.0) -> None:
        """Shut the container down; kill it if that hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.leader:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run(["systemctl", "poweroff"], check=False, timeout=10)
        else:  # not booted far enough for systemctl: nspawn turns SIGTERM into a poweroff
            self.proc.terminate()
        try:
            self.proc.wait(limit_s * self.time_factor)
            return
        except subprocess.TimeoutExpired:
            pass
        # Killing the container's PID 1 ends its whole pid namespace; nspawn then exits.
        # Killing only nspawn would leave the container's processes running.
        if self.leader:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
