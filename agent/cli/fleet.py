"""`agentctl fleet`: keys, signed documents, and what this device made of them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from agent.cli.common import DEFAULT_CONFIG
from agent.fleet.document import KEY_ID

fleet_app = typer.Typer(no_args_is_help=True, help="Signed fleet configuration (docs/fleet.md).")

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@fleet_app.command("keygen")
def keygen(
    key_id: Annotated[str, typer.Option("--key-id", help="Name of the key (its file names).")],
    out: Annotated[Path, typer.Option(help="Folder for <key-id>.key and <key-id>.pub.")] = Path(),
) -> None:
    """A new Ed25519 key pair: <key-id>.key (private, mode 0600: keep it off the devices)
    and <key-id>.pub (copy it into each device's fleet.trusted_keys_dir)."""
    import re

    from agent.fleet.document import generate_key

    if not re.match(KEY_ID, key_id):
        typer.echo(f"invalid key id {key_id!r}: letters, digits, _ . -", err=True)
        raise typer.Exit(2)
    private, public = generate_key()
    out.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out / f"{key_id}.key", out / f"{key_id}.pub"
    if key_path.exists():
        typer.echo(f"{key_path} exists: not overwriting a private key", err=True)
        raise typer.Exit(2)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub_path.write_bytes(public)
    typer.echo(f"private key: {key_path}\npublic key:  {pub_path}")


@fleet_app.command("sign")
def sign(
    patch: Annotated[Path, typer.Argument(help="YAML or JSON patch over the local config.")],
    *,
    key: Annotated[Path, typer.Option(help="Private key file (agentctl fleet keygen).")],
    target: Annotated[str, typer.Option(help="fleet/<group> or fleet/device/<device_id>.")],
    version: Annotated[int, typer.Option(help="Above every version sent to this target.")],
    reset: Annotated[
        list[str] | None, typer.Option(help="JSON pointer to reset to local (repeatable).")
    ] = None,
    expires_in: Annotated[
        str | None, typer.Option(help="Validity, e.g. 30m, 12h, 7d (default: none).")
    ] = None,
    key_id: Annotated[str | None, typer.Option(help="Default: the key file's name.")] = None,
    publish: Annotated[
        str | None, typer.Option(help="host:port of the broker: publish it, retained.")
    ] = None,
) -> None:
    """Print (or publish, retained, on <target>/config) a signed document."""
    from agent.fleet.document import load_private_key, sign_document

    body_patch = yaml.safe_load(patch.read_text(encoding="utf-8")) or {}
    if not isinstance(body_patch, dict):
        typer.echo(f"{patch}: the patch must be a mapping", err=True)
        raise typer.Exit(2)
    now = time.time()
    body: dict[str, Any] = {
        "version": version,
        "issued_at": round(now, 3),
        "target": target,
        "patch": body_patch,
        "reset": list(reset or []),
    }
    if expires_in:
        body["expires_at"] = round(now + _seconds(expires_in), 3)
    doc = sign_document(body, load_private_key(key), key_id or key.stem)
    text = json.dumps(doc, ensure_ascii=False)
    if publish is None:
        typer.echo(text)
        return
    host, _, port = publish.rpartition(":")
    asyncio.run(_publish(host or "127.0.0.1", int(port), f"{target}/config", text.encode()))
    typer.echo(f"published version {version} on {target}/config (retained)")


@fleet_app.command("status")
def status(
    config: Annotated[Path, typer.Option("--config", "-c")] = DEFAULT_CONFIG,
    socket: Annotated[Path | None, typer.Option(help="Control socket.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Per target: the applied version, and the last document's status and reason."""
    from agent.cli.service import ask, socket_of

    fleet = ask(socket_of(config, socket), {"cmd": "fleet"})["fleet"]
    if as_json:
        typer.echo(json.dumps(fleet, indent=1, ensure_ascii=False))
        return
    if not fleet.get("enabled"):
        typer.echo("fleet: off (fleet.enabled is false)")
        return
    typer.echo(f"fleet: {fleet['phase']}")
    for target in fleet["targets"]:
        applied = fleet["applied"].get(target, "-")
        last = fleet["last"].get(target) or {}
        line = f"  {target}: applied v{applied}"
        if last:
            line += f"; last v{last.get('version')} {last.get('status')}: {last.get('reason')}"
        typer.echo(line)


def _seconds(text: str) -> float:
    unit = text[-1]
    if unit not in _DURATION:
        raise typer.BadParameter(f"{text!r}: a number and s, m, h or d")
    return float(text[:-1]) * _DURATION[unit]


async def _publish(host: str, port: int, topic: str, payload: bytes) -> None:
    import aiomqtt

    async with aiomqtt.Client(host, port) as client:
        await client.publish(topic, payload, qos=1, retain=True)
