"""`agentctl doctor`: say exactly what this device lacks for its configuration.

Exit codes: 0 nothing the configuration needs is missing (warnings may remain), 1 something
is missing, 2 the configuration is invalid.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agent.cli.common import DEFAULT_CONFIG, EXIT_INVALID

if TYPE_CHECKING:  # agent.doctor loads the engine's model helpers: only when doctor runs
    from agent.doctor import Report

__all__ = ["EXIT_MISSING", "doctor", "register"]

EXIT_MISSING = 1
_STYLE = {"ok": "green", "missing": "bold red", "warn": "yellow", "skip": "dim"}


def doctor(
    config: Annotated[Path, typer.Option("--config", "-c", help="Agent config file.")] = (
        DEFAULT_CONFIG
    ),
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a key: --set llm.enabled=false.")
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where models are looked for (default: $EDGE_AGENT_CACHE_DIR, else the "
            "installed unit's, else ~/.cache/edge-agent)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The findings as JSON.")] = False,
) -> None:
    """What this device lacks for the config: vLLM/torch (LLM tier), CUDA CTranslate2
    (asr.device: cuda), NVML (GPU watchdog), models, the config, the service's unit, user,
    directories and credential, the broker. Exit 1 when something needed is missing, 2 when
    the config is invalid."""
    from agent.doctor import RealHost, diagnose, read_unit

    report = diagnose(
        config, RealHost(), unit=read_unit(), overrides=set_ or [], cache_dir=cache_dir
    )
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        _render(report, Console())
    if report.config_invalid:
        raise typer.Exit(EXIT_INVALID)
    if report.missing:
        raise typer.Exit(EXIT_MISSING)


def _render(report: Report, console: Console) -> None:
    table = Table(title=f"edge-agent doctor: {report.config}", title_justify="left")
    for column in ("area", "check", "state", "detail"):
        table.add_column(column, overflow="fold")
    for f in report.findings:
        state = f"[{_STYLE[f.state]}]{f.state.upper() if f.state == 'missing' else f.state}[/]"
        table.add_row(escape(f.area), escape(f.check), state, escape(f.detail))
    console.print(table)
    for f in report.findings:
        if f.hint and f.state in ("missing", "warn"):
            style = _STYLE[f.state]
            console.print(f"[{style}]{escape(f.check)}[/]: {escape(f.hint)}", highlight=False)
    missing = report.missing
    if missing:
        names = escape(", ".join(f"{f.area} {f.check}" for f in missing))
        console.print(f"[bold red]missing ({len(missing)}):[/] {names}", highlight=False)
    else:
        console.print("[green]nothing the configuration needs is missing[/]")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
