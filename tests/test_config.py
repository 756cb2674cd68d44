"""Config models, the layered YAML loader, secrets, and the `agentctl config` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from agent.config import ConfigError, ConfigIssue, load_config, resolve_mqtt_password
from agent.config import models as config_models
from agent.config.loader import PASSWORD_ENV, PROFILES_ENV
from agent.config.models import MqttSettings
from pipelines.detect import FaultRule, KeywordSettings

REPO = Path(__file__).resolve().parents[1]

# Line numbers matter: tests below point at them.
VALID = """\
device_id: test-edge
mqtt:
  host: broker.test
  topic_prefix: factory/test
outbox:
  path: data/outbox.sqlite
streams:
  overrides:
    mic2:
      alerts: {debounce_s: 2}
      disabled_faults: [belt_slip]
faults:
  - code: bearing_noise
    severity: warning
    labels: {en: bearing noise, zh: 轴承异响}
    keywords: {en: [bearing noise], zh: [轴承异响]}
  - code: belt_slip
    labels: {en: belt slip}
    keywords: {en: [belt slip]}
"""

PROFILE = """\
description: CI box
mqtt:
  port: 1884
  host: profile-host
logging:
  level: debug
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (PROFILES_ENV, PASSWORD_ENV, "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cfg_dir(tmp_path: Path) -> Path:
    root = tmp_path.resolve()
    (root / "profiles").mkdir()
    (root / "profiles" / "cpu-dev.yaml").write_text(PROFILE, encoding="utf-8")
    return root


def write(directory: Path, text: str, name: str = "agent.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def issues_of(path: Path, overrides: tuple[str, ...] = ()) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides=overrides)
    return info.value.issues


def located(issues: list[ConfigIssue]) -> list[tuple[str, int | None, str]]:
    return [(i.source, i.line, i.path) for i in issues]


# -- merging ------------------------------------------------------------------------------


def test_profile_is_merged_under_the_agent_file(cfg_dir: Path) -> None:
    """Profile values fill in what the file leaves out; the file wins where both set a key."""
    loaded = load_config(write(cfg_dir, VALID))
    cfg = loaded.config
    assert cfg.mqtt.host == "broker.test"  # file over profile
    assert cfg.mqtt.port == 1884  # from the profile
    assert cfg.logging.level == "debug"  # from the profile
    assert cfg.mqtt.keepalive_s == 30  # schema default
    assert cfg.profile == "cpu-dev"
    assert loaded.profile_path == cfg_dir / "profiles" / "cpu-dev.yaml"
    assert loaded.profile_description == "CI box"
    assert [f.code for f in cfg.faults] == ["bearing_noise", "belt_slip"]


def test_set_overrides_win_over_file_and_profile(cfg_dir: Path) -> None:
    """--set KEY.PATH=VALUE overrides both layers; values are parsed as YAML."""
    cfg = load_config(
        write(cfg_dir, VALID),
        overrides=["mqtt.port=1999", "mqtt.host=override", "ingest.allowed_streams=[mic1, mic2]"],
    ).config
    assert (cfg.mqtt.host, cfg.mqtt.port) == ("override", 1999)
    assert cfg.ingest.allowed_streams == ["mic1", "mic2"]


def test_malformed_set_option_is_reported(cfg_dir: Path) -> None:
    """A --set without '=' is refused with the option named."""
    [issue] = issues_of(write(cfg_dir, VALID), ("mqtt.port",))
    assert (issue.source, issue.path) == ("--set", "mqtt.port")
    assert issue.reason == "expected KEY.PATH=VALUE"


def test_profile_named_in_file_is_used(cfg_dir: Path) -> None:
    """`profile: jetson` in the file loads profiles/jetson.yaml instead of the default."""
    write(cfg_dir, "mqtt:\n  port: 2883\n", "profiles/jetson.yaml")
    loaded = load_config(write(cfg_dir, "profile: jetson\n" + VALID))
    assert loaded.config.profile == "jetson"
    assert loaded.config.mqtt.port == 2883
    assert loaded.profile_description is None


def test_profiles_dir_from_environment_is_searched_first(
    cfg_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$EDGE_AGENT_PROFILES_DIR is searched before the profiles folder beside the file."""
    other = tmp_path / "fleet-profiles"
    write(other, "mqtt:\n  port: 3883\n", "cpu-dev.yaml")
    monkeypatch.setenv(PROFILES_ENV, str(other))
    loaded = load_config(write(cfg_dir, VALID))
    assert loaded.config.mqtt.port == 3883
    assert loaded.profile_path == other / "cpu-dev.yaml"


def test_missing_profile_is_reported(cfg_dir: Path) -> None:
    """A profile with no file is an error naming the profile and where it was looked for."""
    [issue] = issues_of(write(cfg_dir, "profile: nope\n"))
    assert (issue.path, issue.value) == ("profile", "nope")
    assert issue.reason.startswith("no nope.yaml in ")
    assert str(cfg_dir / "profiles") in issue.reason


def test_profile_may_not_set_faults(cfg_dir: Path) -> None:
    """A device profile setting the fault catalogue is refused at the profile's line."""
    write(cfg_dir, "description: x\nmqtt:\n  port: 1\nfaults: []\n", "profiles/cpu-dev.yaml")
    [issue] = issues_of(write(cfg_dir, VALID))
    assert located([issue]) == [(str(cfg_dir / "profiles" / "cpu-dev.yaml"), 4, "faults")]
    assert "may not set this key" in issue.reason


def test_relative_outbox_path_is_resolved_beside_the_file(cfg_dir: Path) -> None:
    """A relative outbox.path is taken relative to the config file's folder."""
    cfg = load_config(write(cfg_dir, VALID)).config
    assert cfg.outbox.path == cfg_dir / "data" / "outbox.sqlite"


def test_watchdog_state_sits_beside_the_outbox_unless_set(cfg_dir: Path) -> None:
    """The rung file lives in the state directory (the outbox's); a relative state_path is
    taken beside the config file."""
    cfg = load_config(write(cfg_dir, VALID)).config
    assert cfg.watchdog.state_path == cfg_dir / "data" / "watchdog.json"
    cfg = load_config(write(cfg_dir, VALID), overrides=["watchdog.state_path=st/w.json"]).config
    assert cfg.watchdog.state_path == cfg_dir / "st" / "w.json"


def test_a_hang_deadline_the_analysis_would_beat_is_refused() -> None:
    issues = issues_of(
        REPO / "configs" / "agent.yaml",
        ("llm.enabled=true", "watchdog.hang_s=119.5", "llm.analysis_timeout_s=120"),
    )
    assert [i.path for i in issues] == ["watchdog.hang_s"]
    assert "before the analysis gives up" in issues[0].reason


def test_empty_file_loads_with_defaults(cfg_dir: Path) -> None:
    """An empty config file is valid: schema defaults under the profile."""
    cfg = load_config(write(cfg_dir, "")).config
    assert cfg.mqtt.port == 1884
    assert cfg.faults == []
    assert cfg.llm.enabled is False


def test_stream_override_merges_over_defaults(cfg_dir: Path) -> None:
    """A stream's override replaces only the keys it sets; other streams get the defaults."""
    streams = load_config(write(cfg_dir, VALID)).config.streams
    mic2 = streams.for_stream("mic2")
    assert mic2.alerts.debounce_s == 2
    assert mic2.alerts.quiet_end_s == 120
    assert mic2.disabled_faults == ["belt_slip"]
    mic1 = streams.for_stream("mic1")
    assert mic1.alerts.debounce_s == 10
    assert mic1.disabled_faults == []


# -- located errors -----------------------------------------------------------------------


def test_errors_carry_file_line_key_value_and_reason(cfg_dir: Path) -> None:
    """Every validation error names its file, line, key path, value and reason."""
    path = write(
        cfg_dir,
        """\
device_id: t1
mqtt:
  host: broker.test
  port: 70000
  bogus: 1
faults:
  - code: ok_one
    labels: {en: fine}
    keywords: {en: [fine words]}
  - code: Bad-Code
    labels: {zh: 坏}
    keywords: {en: [x]}
  - code: no_labels
    keywords: {en: [x]}
""",
    )
    src = str(path)
    issues = issues_of(path)
    assert [str(i) for i in issues] == [
        f"{src}:4: mqtt.port = 70000: Input should be less than or equal to 65535",
        f"{src}:5: mqtt.bogus = 1: Extra inputs are not permitted",
        f"{src}:10: faults.1.code = 'Bad-Code': String should match pattern '^[a-z][a-z0-9_]*$'",
        f"{src}:11: faults.1.labels = {{'zh': '坏'}}: an `en` label is required",
        f"{src}:13: faults.2.labels = (missing): Field required",
    ]


def test_error_from_profile_points_into_profile(cfg_dir: Path) -> None:
    """A bad value that came from the profile is reported at the profile's line."""
    write(cfg_dir, "mqtt:\n  port: 1884\n  keepalive_s: 2\n", "profiles/cpu-dev.yaml")
    [issue] = issues_of(write(cfg_dir, VALID))
    assert located([issue]) == [(str(cfg_dir / "profiles" / "cpu-dev.yaml"), 3, "mqtt.keepalive_s")]
    assert issue.value == "2"


def test_error_from_set_names_the_option(cfg_dir: Path) -> None:
    """A bad value given with --set is reported against that option, not a file line."""
    [issue] = issues_of(write(cfg_dir, VALID), ("mqtt.port=0",))
    assert str(issue) == (
        "--set mqtt.port=0: mqtt.port = 0: Input should be greater than or equal to 1"
    )


def test_override_of_bad_file_value_fixes_it(cfg_dir: Path) -> None:
    """A --set that replaces an invalid file value makes the config valid."""
    path = write(cfg_dir, "mqtt:\n  port: 70000\n")
    assert issues_of(path)[0].line == 2
    assert load_config(path, overrides=["mqtt.port=1885"]).config.mqtt.port == 1885


def test_model_level_error_points_at_its_section(cfg_dir: Path) -> None:
    """A rule spanning keys of one section is reported at that section's line."""
    path = write(cfg_dir, "device_id: x\nmqtt:\n  host: h\n  password_credential: mqtt-pw\n")
    [issue] = issues_of(path)
    assert located([issue]) == [(str(path), 2, "mqtt")]
    assert issue.reason == "password_credential needs username"


def test_tls_cert_without_key_is_reported_at_tls(cfg_dir: Path) -> None:
    """A TLS client certificate without its key is reported at the tls line."""
    path = write(cfg_dir, "mqtt:\n  tls:\n    enabled: true\n    cert_file: /etc/c.pem\n")
    [issue] = issues_of(path)
    assert located([issue]) == [(str(path), 2, "mqtt.tls")]
    assert issue.reason == "cert_file and key_file must be set together"


def test_list_item_error_points_at_the_item(cfg_dir: Path) -> None:
    """A bad item of a block list is reported at that item's own line."""
    path = write(cfg_dir, "ingest:\n  allowed_streams:\n    - mic1\n    - [nested]\n")
    [issue] = issues_of(path)
    assert located([issue]) == [(str(path), 4, "ingest.allowed_streams.1")]


def test_fault_without_keywords_is_reported_at_the_fault(cfg_dir: Path) -> None:
    """A fault entry with no keywords is reported at the entry's first line."""
    path = write(
        cfg_dir, "device_id: x\nfaults:\n  - code: a\n    labels: {en: a}\n    keywords: {}\n"
    )
    [issue] = issues_of(path)
    assert located([issue]) == [(str(path), 3, "faults.0")]
    assert issue.reason == "at least one keyword is required"


def test_clear_text_password_in_yaml_is_refused(cfg_dir: Path) -> None:
    """A `password` key in YAML is rejected: secrets never live in the config file."""
    path = write(cfg_dir, "mqtt:\n  username: u\n  password: hunter2\n")
    [issue] = issues_of(path)
    assert located([issue]) == [(str(path), 3, "mqtt.password")]
    assert issue.reason == "Extra inputs are not permitted"


def test_invalid_yaml_reports_its_line(cfg_dir: Path) -> None:
    """A YAML syntax error is reported with the line where the parser failed."""
    path = write(cfg_dir, "device_id: x\nmqtt:\n  host: [a, b\n  port: 1\nlogging: {}\n")
    [issue] = issues_of(path)
    assert issue.source == str(path)
    assert issue.line == 4
    assert issue.reason.startswith("invalid YAML:")


def test_top_level_must_be_a_mapping(cfg_dir: Path) -> None:
    """A file holding a list instead of a mapping is refused at line 1."""
    path = write(cfg_dir, "- a\n- b\n")
    [issue] = issues_of(path)
    assert (issue.line, issue.value, issue.reason) == (1, "list", "must be a mapping")


def test_unreadable_file_is_reported(cfg_dir: Path) -> None:
    """A config path that does not exist is one issue naming the file."""
    missing = cfg_dir / "absent.yaml"
    [issue] = issues_of(missing)
    assert issue.source == str(missing)
    assert issue.reason.startswith("cannot read:")


def test_duplicate_fault_code_is_reported_with_line(cfg_dir: Path) -> None:
    """A repeated fault code is reported at the repeated entry's line in the file."""
    path = write(
        cfg_dir,
        """\
device_id: t1
faults:
  - code: dup
    labels: {en: a}
    keywords: {en: [a b]}
  - code: dup
    labels: {en: b}
    keywords: {en: [c d]}
""",
    )
    [issue] = issues_of(path)
    assert "fault codes must be unique" in issue.reason
    assert (issue.source, issue.line) == (str(path), 6)


def test_unknown_disabled_fault_is_reported_with_line(cfg_dir: Path) -> None:
    """A stream disabling a fault code that does not exist is reported at that key's line."""
    path = write(
        cfg_dir,
        """\
device_id: t1
streams:
  overrides:
    mic1:
      disabled_faults: [nope]
faults:
  - code: real
    labels: {en: a}
    keywords: {en: [a b]}
""",
    )
    [issue] = issues_of(path)
    assert "unknown codes ['nope']" in issue.reason
    assert (issue.source, issue.line) == (str(path), 5)


# -- schema -------------------------------------------------------------------------------


def test_every_config_field_has_title_and_description() -> None:
    """Every key of the schema documents itself (title and description)."""
    classes = [
        obj
        for obj in vars(config_models).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__.startswith("agent.config.")  # a section's own module
    ]
    classes += [FaultRule, KeywordSettings]
    missing = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, field in cls.model_fields.items()
        if not field.title or not field.description
    ]
    assert len(classes) > 10
    assert missing == []


def test_real_catalogue_is_valid_and_bilingual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/agent.yaml loads, and every fault has English and Chinese labels and keywords."""
    write(tmp_path, "description: neutral\n", "cpu-dev.yaml")
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path))  # the file alone, whatever the profile
    cfg = load_config(REPO / "configs" / "agent.yaml", overrides=["llm.enabled=false"]).config
    assert {f.code for f in cfg.faults} >= {
        "bearing_noise",
        "temperature_over_limit",
        "belt_slip",
        "abnormal_vibration",
        "leak",
        "motor_overload",
        "emergency_stop",
    }
    for fault in cfg.faults:
        assert set(fault.labels) >= {"en", "zh"}, fault.code
        assert fault.keywords.get("en") and fault.keywords.get("zh"), fault.code
    assert cfg.llm.enabled is False


# -- secrets ------------------------------------------------------------------------------


def mqtt_with_credential() -> MqttSettings:
    return MqttSettings(username="edge", password_credential="mqtt-password")


def test_no_credential_means_no_password() -> None:
    """Without password_credential no password is looked up."""
    assert resolve_mqtt_password(MqttSettings()) is None


def test_password_from_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The password is read from $CREDENTIALS_DIRECTORY/<name>, trailing newline removed."""
    (tmp_path / "mqtt-password").write_text("s3cret pw\n", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert resolve_mqtt_password(mqtt_with_credential()) == "s3cret pw"


def test_password_from_environment_when_no_credential_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a credential file, $EDGE_AGENT_MQTT_PASSWORD is used."""
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert resolve_mqtt_password(mqtt_with_credential()) == "from-env"


def test_missing_password_is_an_error_without_leaking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A named credential found nowhere is a config error naming both places searched."""
    with pytest.raises(ConfigError) as info:
        resolve_mqtt_password(mqtt_with_credential())
    [issue] = info.value.issues
    assert issue.path == "mqtt.password_credential"
    assert "$CREDENTIALS_DIRECTORY (unset)" in issue.reason
    assert PASSWORD_ENV in issue.reason


# -- agentctl -----------------------------------------------------------------------------


def agentctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {PROFILES_ENV, PASSWORD_ENV, "CREDENTIALS_DIRECTORY"}
    }
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.agentctl", *args],
        check=False,
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_agentctl_validate_valid_file_exits_0(cfg_dir: Path) -> None:
    """`agentctl config validate` on a valid file exits 0 and summarises it."""
    path = write(cfg_dir, VALID)
    proc = agentctl("config", "validate", str(path))
    assert proc.returncode == 0, proc.stderr
    profile = cfg_dir / "profiles" / "cpu-dev.yaml"
    assert proc.stdout.strip() == (
        f"ok: {path} (profile cpu-dev from {profile}, 2 faults, prefix 'factory/test')"
    )


def test_agentctl_validate_real_config_exits_0() -> None:
    """The shipped configs/agent.yaml validates with its cpu-dev profile."""
    proc = agentctl("config", "validate", "configs/agent.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "profile cpu-dev" in proc.stdout
    assert "7 faults" in proc.stdout


def test_agentctl_validate_invalid_file_exits_2_with_located_lines(cfg_dir: Path) -> None:
    """An invalid file exits 2 and prints one `file:line: key = value: reason` line per error."""
    path = write(cfg_dir, "device_id: x\nmqtt:\n  port: 70000\nlogging:\n  level: loud\n")
    proc = agentctl("config", "validate", str(path))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"invalid config: {path}",
        f"  {path}:3: mqtt.port = 70000: Input should be less than or equal to 65535",
        f"  {path}:5: logging.level = 'loud': must be one of debug, info, warning, error",
    ]


def test_agentctl_validate_reports_set_errors(cfg_dir: Path) -> None:
    """A bad --set value makes validate exit 2 naming the option."""
    path = write(cfg_dir, VALID)
    proc = agentctl("config", "validate", str(path), "--set", "mqtt.port=0")
    assert proc.returncode == 2
    assert (
        "  --set mqtt.port=0: mqtt.port = 0: Input should be greater than or equal to 1"
        in proc.stderr.splitlines()
    )


def test_agentctl_show_effective_json_is_the_merged_config(cfg_dir: Path) -> None:
    """`show --effective --json` prints profile + file + --set merged, as JSON."""
    path = write(cfg_dir, VALID)
    proc = agentctl(
        "config", "show", "--effective", "--json", "--config", str(path), "--set", "mqtt.port=1999"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mqtt"]["host"] == "broker.test"
    assert data["mqtt"]["port"] == 1999
    assert data["logging"]["level"] == "debug"
    assert data["profile"] == "cpu-dev"
    assert data["outbox"]["path"] == str(cfg_dir / "data" / "outbox.sqlite")
    assert data["faults"][0]["labels"]["zh"] == "轴承异响"


def test_agentctl_show_effective_for_one_stream(cfg_dir: Path) -> None:
    """`show --effective --stream ID` prints that stream's settings with its override."""
    path = write(cfg_dir, VALID)
    proc = agentctl("config", "show", "--effective", "--json", "--stream", "mic2", "-c", str(path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["stream"] == "mic2"
    assert data["alerts"] == {"debounce_s": 2.0, "quiet_end_s": 120.0, "max_evidence": 5}
    assert data["disabled_faults"] == ["belt_slip"]


def test_agentctl_show_effective_yaml_has_header(cfg_dir: Path) -> None:
    """The YAML form starts with a comment naming both layers and parses back."""
    path = write(cfg_dir, VALID)
    proc = agentctl("config", "show", "--effective", "--config", str(path))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first == (
        f"# effective config: {path} over profile {cfg_dir / 'profiles' / 'cpu-dev.yaml'}"
    )
    data = yaml.safe_load(proc.stdout)
    assert data["mqtt"]["port"] == 1884


def test_agentctl_show_effective_invalid_exits_2(cfg_dir: Path) -> None:
    """`show --effective` on an invalid file exits 2 with the located errors."""
    path = write(cfg_dir, "mqtt:\n  port: 70000\n")
    proc = agentctl("config", "show", "--effective", "--config", str(path))
    assert proc.returncode == 2
    assert f"  {path}:2: mqtt.port = 70000:" in proc.stderr


def test_agentctl_show_stream_needs_effective(cfg_dir: Path) -> None:
    """`show --stream` without --effective is a usage error (exit 2)."""
    path = write(cfg_dir, VALID)
    proc = agentctl("config", "show", "--stream", "mic1", "--config", str(path))
    assert proc.returncode == 2
    assert "--stream needs --effective" in proc.stderr


def test_agentctl_show_never_prints_the_password(cfg_dir: Path) -> None:
    """The effective config names the credential but never contains the password itself."""
    path = write(
        cfg_dir,
        VALID.replace(
            "  host: broker.test\n",
            "  host: b\n  username: edge\n  password_credential: mqtt-password\n",
        ),
    )
    proc = agentctl(
        "config",
        "show",
        "--effective",
        "--json",
        "--config",
        str(path),
        env={PASSWORD_ENV: "Sup3r-S3cret"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mqtt"]["password_credential"] == "mqtt-password"
    assert "Sup3r-S3cret" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        (["llm.context_tokens=8192"], "llm.context_tokens", "exceed the engine's max_model_len"),
        (
            ["llm.context_tokens=null", "engine.max_model_len=2048"],
            "llm.max_output_tokens",
            "at least 2048",
        ),
        (["engine.skip_tokenizer_init=true"], "llm.enabled", "needs the model's tokenizer"),
    ],
)
def test_slow_tier_window_must_fit_the_engine(overrides: list[str], key: str, reason: str) -> None:
    """The window and the answer must fit the engine's context, and the slow tier needs the
    tokenizer: refused at load time, pointing at the key, not at the first analysis."""
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "agent.yaml", overrides=overrides)
    [issue] = info.value.issues
    assert issue.path == key
    assert reason in issue.reason
