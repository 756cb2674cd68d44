"""`agentctl`: check and inspect an edge-agent configuration, and the running service."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from agent.cli import doctor, service
from agent.cli.catalogue import catalogue_app
from agent.cli.common import DEFAULT_CONFIG, load_or_exit
from agent.cli.fleet import fleet_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
config_app = typer.Typer(no_args_is_help=True, help="Validate and show configuration.")
app.add_typer(config_app, name="config")
service.register(app)
doctor.register(app)
app.add_typer(fleet_app, name="fleet")
app.add_typer(catalogue_app, name="catalogue")

SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a key: --set mqtt.port=1884.")
]


@config_app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="Agent config file.")],
    set_: SetOpt = None,
) -> None:
    """Exit 0 if FILE (with its profile) is valid; else print each error and exit 2."""
    loaded = load_or_exit(file, set_ or [])
    cfg = loaded.config
    for issue in loaded.deprecations:
        where = f"{issue.source}:{issue.line}" if issue.line else issue.source
        typer.echo(f"deprecated: {where}: {issue.reason}")
    typer.echo(
        f"ok: {file} (profile {cfg.profile} from {loaded.profile_path}, "
        f"{len(cfg.faults)} faults, prefix {cfg.mqtt.topic_prefix!r})"
    )


@config_app.command("show")
def show(
    *,
    config: Annotated[Path, typer.Option("--config", "-c", help="Agent config file.")] = (
        DEFAULT_CONFIG
    ),
    effective: Annotated[
        bool, typer.Option(help="Print the merged result: profile + file + overrides.")
    ] = False,
    stream: Annotated[
        str | None, typer.Option(help="Also print the effective settings of this stream.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
    running: Annotated[
        bool, typer.Option(help="Ask the running service (its control socket) instead.")
    ] = False,
    socket: service.SocketOpt = None,
    set_: SetOpt = None,
) -> None:
    """Print the config file as written, or with --effective the merged, validated result,
    or with --running what the running service uses."""
    if running:
        live = service.running_config(config, socket)
        if as_json:
            typer.echo(json.dumps(live, indent=2, ensure_ascii=False))
        else:
            typer.echo(yaml.safe_dump(live, allow_unicode=True, sort_keys=False), nl=False)
        return
    if not effective:
        if stream is not None:
            typer.echo("--stream needs --effective", err=True)
            raise typer.Exit(2)
        sys.stdout.write(config.read_text(encoding="utf-8"))
        return
    loaded = load_or_exit(config, set_ or [])
    data: dict[str, Any] = loaded.config.model_dump(mode="json")
    if stream is not None:
        data = {
            "stream": stream,
            **loaded.config.streams.for_stream(stream).model_dump(mode="json"),
        }
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        header = f"# effective config: {loaded.config_path} over profile {loaded.profile_path}\n"
        typer.echo(header + yaml.safe_dump(data, allow_unicode=True, sort_keys=False), nl=False)


@config_app.command("schema")
def schema() -> None:
    """Print the JSON schema of the agent config (every key with its title and description)."""
    from agent.config.models import AgentConfig

    typer.echo(json.dumps(AgentConfig.model_json_schema(), indent=2, ensure_ascii=False))


@app.command("plan")
def plan(
    model: Annotated[
        Path | None,
        typer.Option(help="Model folder (config.json, safetensors); default: the profile's."),
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="Device profile name or YAML file (default cpu-dev).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Plan the engine this agent config would start "
            "(profile + file + --set), as the service's refusal does.",
        ),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Say, before anything is loaded, what fits: weights, KV per token, largest context,
    CUDA-graph and activation allowance, and an outcome. Exit 0 if it fits, 1 if not."""
    from agent.engine import PlanError, ProfileError, load_engine_profile, plan_memory

    try:
        if config is not None:
            engine = load_or_exit(config, set_ or [], profile).config.engine
            if engine is None:
                typer.echo(f"{config}: no engine section (profile or file)", err=True)
                raise typer.Exit(2)
            name = f"{config} ({profile or 'its profile'})"
        else:
            engine = load_engine_profile(profile or "cpu-dev")
            name = profile or "cpu-dev"
        result = plan_memory(model or engine.model_path(), engine)
    except (PlanError, ProfileError) as exc:
        typer.echo(f"cannot plan: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.render(name))
    raise typer.Exit(0 if result.fits else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
