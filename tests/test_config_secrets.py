"""A config error names a secret's key and the reason, never its value (pure, no service).

A password typed into agent.yaml, a token in a `--set`, a key's material in a fleet layer:
each is refused, and the line that says so (journal, `agentctl config validate`, the fleet
answer on MQTT) must not carry it. Walks every field of the schema whose name reads as a
secret, and the keys people put there by mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agent.config import AgentConfig, ConfigError, load_config
from agent.config.loader import is_secret_key

REPO = Path(__file__).resolve().parents[1]
MARK = "Hunter2-do-not-print"


def secret_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        if is_secret_key(name):
            out.append(path)
        ann: Any = field.annotation
        for candidate in (ann, *getattr(ann, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                out += secret_fields(candidate, path)
    return out


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out


def errors(layer: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(REPO / "configs" / "agent.yaml", layers=[("test layer", layer)])
    return str(caught.value)


def test_the_schema_has_secret_fields_to_walk() -> None:
    assert ("mqtt", "password_credential") in secret_fields(AgentConfig)


@pytest.mark.parametrize("path", secret_fields(AgentConfig), ids=".".join)
def test_an_invalid_secret_field_is_named_not_shown(path: tuple[str, ...]) -> None:
    text = errors(nested(path, {"nested": MARK, "list": [MARK]}))
    assert ".".join(path) in text
    assert MARK not in text


@pytest.mark.parametrize(
    "path",
    [("mqtt", "password"), ("mqtt", "token"), ("fleet", "private_key"), ("mqtt", "api_key"),
     ("mqtt", "tls", "passphrase"), ("secret",)],
    ids=".".join,
)  # fmt: skip
def test_a_secret_put_where_none_belongs_is_refused_unseen(path: tuple[str, ...]) -> None:
    text = errors(nested(path, MARK))
    assert "Extra inputs are not permitted" in text
    assert MARK not in text


def test_a_section_error_does_not_print_its_secrets() -> None:
    """A rule over a whole section (password_credential needs username) shows the section's
    input: its secret-named keys are masked there too."""
    text = errors({"mqtt": {"username": None, "password_credential": MARK}})
    assert "password_credential needs username" in text
    assert MARK not in text


def test_set_on_the_command_line_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(REPO / "configs" / "agent.yaml", overrides=[f"mqtt.password={MARK}"])
    assert "mqtt.password" in str(caught.value)
    assert MARK not in str(caught.value)
