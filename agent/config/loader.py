"""Load the agent config: device profile under the agent file, command-line overrides over it.

Each YAML layer is read twice over the same text: once as data, once as a node tree whose
marks give the line of every key. The merged provenance map lets a pydantic error at
`mqtt.port` be reported as `configs/agent.yaml:7: mqtt.port = 70000: ...`, even when the
value came from the profile or from `--set`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agent.config.deprecated import strip_deprecated
from agent.config.merge import deep_merge
from agent.config.models import AgentConfig, ControlSettings, LocatedError, MqttSettings

__all__ = [
    "PASSWORD_ENV",
    "PROFILES_ENV",
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "load_config",
    "parse_set_option",
    "resolve_mqtt_password",
]

PROFILES_ENV = "EDGE_AGENT_PROFILES_DIR"
PASSWORD_ENV = "EDGE_AGENT_MQTT_PASSWORD"  # noqa: S105 - the variable's name, not a password
DEFAULT_PROFILE = "cpu-dev"

KeyPath = tuple[str | int, ...]
Where = tuple[str, int | None]  # (source, line)


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config source, located as precisely as the sources allow."""

    source: str
    line: int | None
    path: str
    value: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        path = self.path or "(top level)"
        return f"{where}: {path} = {self.value}: {self.reason}"


class ConfigError(Exception):
    """The config could not be loaded; `issues` says where and why."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass(frozen=True)
class LoadedConfig:
    config: AgentConfig
    config_path: Path
    profile_path: Path | None
    profile_description: str | None
    provenance: Mapping[KeyPath, Where] = field(repr=False)
    # What it was loaded with, so the same file can be loaded again under other layers
    # (a fleet document is validated exactly as the running configuration was).
    overrides: tuple[str, ...] = ()
    profile_option: str | None = None
    layers: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=(), repr=False)
    # Retired keys found and dropped (agent.config.deprecated): located, for people to fix.
    deprecations: tuple[ConfigIssue, ...] = ()


def _key_lines(node: yaml.Node, source: str, prefix: KeyPath, out: dict[KeyPath, Where]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            path = (*prefix, key)
            out[path] = (source, key_node.start_mark.line + 1)
            _key_lines(value_node, source, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, i)
            out[path] = (source, item.start_mark.line + 1)
            _key_lines(item, source, path, out)


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[KeyPath, Where]]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigIssue(source, None, "", "", f"cannot read: {exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigIssue(source, None, "", "", "not UTF-8 text")]) from exc
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = f"invalid YAML: {getattr(exc, 'problem', None) or exc}"
        raise ConfigError([ConfigIssue(source, line, "", "", reason)]) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(source, 1, "", type(data).__name__, "must be a mapping")])
    lines: dict[KeyPath, Where] = {}
    if node is not None:
        _key_lines(node, source, (), lines)
    return data, lines


def parse_set_option(option: str) -> dict[str, Any]:
    """`mqtt.port=1884` -> {"mqtt": {"port": 1884}}; the value is parsed as YAML."""
    key, sep, raw = option.partition("=")
    if not sep or not key.strip():
        raise ConfigError([ConfigIssue("--set", None, option, "", "expected KEY.PATH=VALUE")])
    value = yaml.safe_load(raw) if raw.strip() else ""
    out: dict[str, Any] = {}
    cursor = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return out


def _flat_paths(data: Mapping[str, Any], prefix: KeyPath = ()) -> list[KeyPath]:
    paths: list[KeyPath] = []
    for key, value in data.items():
        path = (*prefix, key)
        paths.append(path)
        if isinstance(value, Mapping):
            paths.extend(_flat_paths(value, path))
    return paths


def _profile_path(name: str, config_path: Path) -> Path:
    roots = [Path(p) for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    roots.append(config_path.parent / "profiles")
    for root in roots:
        candidate = root / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(r) for r in roots)
    raise ConfigError(
        [ConfigIssue(str(config_path), None, "profile", name, f"no {name}.yaml in {searched}")]
    )


# Keys whose values are never printed (a password put in the YAML by mistake, a token, a
# key's material): an error names the key and the reason only.
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?$|secret|token|private|credential|psk|api_?key",
                        re.IGNORECASE)  # fmt: skip
HIDDEN = "(value hidden: a secret)"


def is_secret_key(key: object) -> bool:
    return isinstance(key, str) and bool(SECRET_KEY.search(key))


def _redacted(value: Any) -> Any:
    """`value` with every secret-named key's value replaced, at any depth."""
    if isinstance(value, Mapping):
        return {k: "***" if is_secret_key(k) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def _short(value: Any, loc: KeyPath = ()) -> str:
    if any(is_secret_key(part) for part in loc):
        return HIDDEN
    text = repr(_redacted(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _lookup(data: Any, loc: KeyPath) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _issues_from(exc: ValidationError, provenance: Mapping[KeyPath, Where]) -> list[ConfigIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        loc: KeyPath = tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, LocatedError):
            loc = (*loc, *cause.loc)
        where: Where = ("(defaults)", None)
        for n in range(len(loc), 0, -1):
            if loc[:n] in provenance:
                where = provenance[loc[:n]]
                break
        path = ".".join(str(p) for p in loc)
        value = "(missing)" if err["type"] == "missing" else _short(err.get("input"), loc)
        if isinstance(cause, LocatedError):
            value = _short(_lookup(err.get("input"), cause.loc), loc)
        reason = err["msg"].removeprefix("Value error, ")
        issues.append(ConfigIssue(where[0], where[1], path, value, reason))
    return issues


def load_config(
    config_path: Path,
    *,
    overrides: Sequence[str] = (),
    profile: str | None = None,
    layers: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> LoadedConfig:
    """Read, merge and validate: profile < agent file < `layers` (fleet documents, each
    named by its source) < `overrides` (KEY.PATH=VALUE strings).

    Raises:
        ConfigError: with one located issue per problem found.
    """
    config_path = config_path.resolve()
    data, provenance = _read_yaml(config_path)
    for source, layer in layers:
        data = deep_merge(data, layer)
        for path in _flat_paths(layer):
            provenance[path] = (source, None)
    override_data: dict[str, Any] = {}
    for option in overrides:
        layer = parse_set_option(option)
        override_data = deep_merge(override_data, layer)
        key, _, _ = option.partition("=")
        shown = f"{key}={HIDDEN}" if any(is_secret_key(k) for k in key.split(".")) else option
        for path in _flat_paths(layer):
            provenance[path] = (f"--set {shown}", None)
    name = profile or override_data.get("profile") or data.get("profile") or DEFAULT_PROFILE
    if not isinstance(name, str):
        raise ConfigError(
            [ConfigIssue(str(config_path), None, "profile", _short(name), "not a name")]
        )
    profile_path = _profile_path(name, config_path)
    profile_data, profile_lines = _read_yaml(profile_path)
    description = profile_data.pop("description", None)
    for forbidden in ("profile", "faults", "device_id"):
        if forbidden in profile_data:
            _, line = profile_lines.get((forbidden,), (str(profile_path), None))
            raise ConfigError(
                [
                    ConfigIssue(
                        str(profile_path),
                        line,
                        forbidden,
                        _short(profile_data[forbidden]),
                        "a device profile may not set this key (it belongs to the agent config)",
                    )
                ]
            )
    merged = deep_merge(deep_merge(profile_data, data), override_data)
    merged["profile"] = name
    full_provenance = {**profile_lines, **provenance}
    deprecations = tuple(
        ConfigIssue(*_where(d.path, full_provenance, config_path), ".".join(d.path), "", str(d))
        for d in strip_deprecated(merged)
    )
    try:
        config = AgentConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_issues_from(exc, full_provenance)) from exc
    config = _checked_reader(config, full_provenance, config_path)
    config = _resolved_paths(config, config_path)
    config = config.model_copy(
        update={"control": _control_paths(config.control, config_path, config.outbox.path)}
    )
    return LoadedConfig(
        config=config,
        config_path=config_path,
        profile_path=profile_path,
        profile_description=str(description) if description is not None else None,
        provenance=full_provenance,
        overrides=tuple(overrides),
        profile_option=profile,
        layers=tuple(layers),
        deprecations=deprecations,
    )


def _resolved_paths(config: AgentConfig, config_path: Path) -> AgentConfig:
    """Relative state paths (outbox, spool, watchdog state) taken from the config file's
    folder; the watchdog's state beside the outbox when unset."""
    if not config.outbox.path.is_absolute():
        outbox = config.outbox.model_copy(update={"path": config_path.parent / config.outbox.path})
        config = config.model_copy(update={"outbox": outbox})
    spool = config.ingest.spool_path
    if spool is not None and not spool.is_absolute():
        ingest = config.ingest.model_copy(update={"spool_path": config_path.parent / spool})
        config = config.model_copy(update={"ingest": ingest})
    state = config.watchdog.state_path
    if state is None:  # the state directory is where the outbox lives
        state = config.outbox.path.parent / "watchdog.json"
    elif not state.is_absolute():
        state = config_path.parent / state
    if state != config.watchdog.state_path:
        watchdog = config.watchdog.model_copy(update={"state_path": state})
        config = config.model_copy(update={"watchdog": watchdog})
    return config


def _where(path: KeyPath, provenance: Mapping[KeyPath, Where], config_path: Path) -> Where:
    return provenance.get(path, (str(config_path), None))


def _checked_reader(
    config: AgentConfig, provenance: Mapping[KeyPath, Where], config_path: Path
) -> AgentConfig:
    """The keyword tier's reader model, a relative path made absolute from the config
    file's folder (like outbox.path; a bare name is looked up in the models search path);
    it must load, or the config is refused here."""
    from agent.engine.adapters import is_model_path
    from agent.reader import ReaderError, load_reader  # the pipelines, only when checked

    reader = config.keywords.reader
    if is_model_path(reader.model) and not Path(reader.model).expanduser().is_absolute():
        model = str(config_path.parent / reader.model)
        keywords = config.keywords.model_copy(
            update={"reader": reader.model_copy(update={"model": model})}
        )
        config = config.model_copy(update={"keywords": keywords})
    try:
        load_reader(config.keywords.reader)
    except (ReaderError, OSError) as exc:
        key = ("keywords", "reader", "model")
        where, line = provenance.get(key, (str(config_path), None))
        model = config.keywords.reader.model
        raise ConfigError([ConfigIssue(where, line, ".".join(key), model, str(exc))]) from exc
    return config


def default_socket_path(outbox_path: Path) -> Path:
    """systemd's RuntimeDirectory= (/run/edge-agent) when set, else the state directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime) / "control.sock" if runtime else outbox_path.parent / "control.sock"


def _control_paths(control: ControlSettings, config_path: Path, outbox: Path) -> ControlSettings:
    path = control.socket_path
    if path is None:
        path = default_socket_path(outbox)
    elif not path.is_absolute():
        path = config_path.parent / path
    return control.model_copy(update={"socket_path": path})


def resolve_mqtt_password(mqtt: MqttSettings) -> str | None:
    """The broker password from systemd credentials or the environment; never from YAML.

    Raises:
        ConfigError: a credential is named but neither source holds it.
    """
    name = mqtt.password_credential
    if name is None:
        return None
    cred_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    if cred_dir:
        cred = Path(cred_dir) / name
        if cred.is_file():
            return cred.read_text(encoding="utf-8").rstrip("\r\n")
    from_env = os.environ.get(PASSWORD_ENV)
    if from_env is not None:
        return from_env
    where = f"$CREDENTIALS_DIRECTORY/{name}" if cred_dir else "$CREDENTIALS_DIRECTORY (unset)"
    raise ConfigError(
        [
            ConfigIssue(
                "(credentials)",
                None,
                "mqtt.password_credential",
                name,
                f"not found in {where} nor in ${PASSWORD_ENV}",
            )
        ]
    )
