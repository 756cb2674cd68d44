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
    from agent.footprint import Footprint

__all__ = ["EXIT_MISSING", "doctor", "register", "render_memory"]

EXIT_MISSING = 1
UNIT_NAME = "edge-agent.service"
_STYLE = {"ok": "green", "missing": "bold red", "warn": "yellow", "skip": "dim"}


def doctor(
    *,
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
    memory: Annotated[
        bool,
        typer.Option(
            "--memory",
            help="Instead: where the running service's memory goes, per process (the "
            "service, vLLM's engine core) and per kind (torch, CUDA, Triton, heap, ...).",
        ),
    ] = False,
    pid: Annotated[
        int | None,
        typer.Option(help="With --memory: the process tree to read (default: the unit's MainPID)."),
    ] = None,
) -> None:
    """What this device lacks for the config: vLLM/torch (LLM tier), CUDA CTranslate2
    (asr.device: cuda), NVML (GPU watchdog), models, the config, the service's unit, user,
    directories and credential, the broker. Exit 1 when something needed is missing, 2 when
    the config is invalid. With --memory: the running service's memory (exit 1 when there is
    no service process to read)."""
    if memory:
        _memory(pid, as_json)
        return
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


def _memory(pid: int | None, as_json: bool) -> None:
    from agent.footprint import footprint, service_pid

    console = Console()
    root = pid if pid is not None else service_pid(UNIT_NAME)
    if root is None:
        console.print(f"[bold red]{UNIT_NAME} has no running process[/]: pass --pid")
        raise typer.Exit(EXIT_MISSING)
    try:
        found = footprint(root)
    except ProcessLookupError:
        console.print(f"[bold red]no process {root}[/]")
        raise typer.Exit(EXIT_MISSING) from None
    except PermissionError:
        console.print(f"[bold red]may not read /proc/{root}/smaps[/]: run as root or the "
                      "service's user")  # fmt: skip
        raise typer.Exit(EXIT_MISSING) from None
    if as_json:
        typer.echo(found.model_dump_json(indent=2))
        return
    console.print(render_memory(found), highlight=False)


def render_memory(found: Footprint) -> Table:
    """One row a process, then one a kind over the tree (MiB)."""
    from agent.footprint import KINDS

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**20:,.0f}"

    table = Table(title=f"memory of process {found.root_pid} and below (MiB; GPU: "
                  f"{found.gpu_source})", title_justify="left")  # fmt: skip
    for column in ("pid", "process", "threads", "RSS", "PSS", "anonymous", "GPU"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for p in found.processes:
        table.add_row(str(p.pid), escape(p.name[:48]), str(p.threads), mib(p.rss), mib(p.pss),
                      mib(p.anonymous), mib(p.gpu_bytes))  # fmt: skip
    table.add_section()
    totals = found.kind_totals()
    for kind in KINDS:
        b = totals[kind]
        if b.rss:
            table.add_row("", f"[dim]kind[/] {kind}", "", mib(b.rss), mib(b.pss),
                          mib(b.anonymous), "")  # fmt: skip
    table.add_section()
    rss = sum(p.rss for p in found.processes)
    anon = sum(p.anonymous for p in found.processes)
    gpu = found.gpu_bytes if found.gpu_source == "nvml" else None
    table.add_row("", "[bold]total[/]", "", mib(rss), mib(found.pss), mib(anon), mib(gpu))
    return table


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
