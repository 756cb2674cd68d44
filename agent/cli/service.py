"""agentctl's commands for the running service, over its control socket (agent.control):
`status`, `alerts [--follow]`, `alerts ack|shelve|unshelve ID`, `engine restart`,
`config show --running`.

Exit codes: 0 fine, 2 the service answers but is degraded (keyword-only) or refused the
request, 3 unreachable (no socket, permission denied, no answer, or a status this agentctl
cannot read). The status is read into its model (agent.status.Status) and rendered from it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from agent.cli.common import DEFAULT_CONFIG, load_or_exit
from agent.config.loader import default_socket_path
from agent.status import AsrStatus, FleetStatus, LlmOff, LlmStatus, Status, WatchdogStatus

__all__ = ["EXIT_DEGRADED", "EXIT_UNREACHABLE", "engine_app", "register", "render_status"]

EXIT_DEGRADED = 2
EXIT_UNREACHABLE = 3
EXIT_UNREADABLE = 4  # the service answered a status of another version (shown raw)

engine_app = typer.Typer(no_args_is_help=True, help="Act on the service's engine.")

ConfigOpt = Annotated[
    Path, typer.Option("--config", "-c", help="Agent config (to find the control socket).")
]
SocketOpt = Annotated[
    Path | None, typer.Option("--socket", help="Control socket path (overrides --config).")
]


# systemd's RuntimeDirectory=edge-agent. The service's $RUNTIME_DIRECTORY is not in an
# operator's shell, so the config alone points agentctl beside the outbox instead.
SERVICE_SOCKET = Path("/run/edge-agent/control.sock")


def socket_of(config: Path, socket: Path | None) -> Path:
    """--socket, else the config's socket, else the systemd service's (when it is there)."""
    if socket is not None:
        return socket
    loaded = load_or_exit(config, [])
    cfg = loaded.config
    path = cfg.control.socket_path or default_socket_path(cfg.outbox.path)
    explicit = ("control", "socket_path") in loaded.provenance
    if not explicit and not path.exists() and SERVICE_SOCKET.exists():
        # Only for the default: a socket the config names is that service's or none.
        typer.echo(f"(using the systemd service's socket {SERVICE_SOCKET})", err=True)
        return SERVICE_SOCKET
    return path


def ask(path: Path, req: dict[str, Any]) -> dict[str, Any]:
    from agent.control import request

    try:
        resp = asyncio.run(request(path, req))
    except (OSError, ValueError, asyncio.TimeoutError) as exc:
        typer.echo(f"edge-agent unreachable at {path}: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if not resp.get("ok"):
        typer.echo(f"edge-agent refused: {resp.get('error')}", err=True)
        raise typer.Exit(EXIT_DEGRADED)
    return resp


def status(
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="The raw status as JSON.")] = False,
) -> None:
    """The running service: engine, rung, memory, MQTT, streams, queues, alerts. Exit 2 when
    degraded, 3 when unreachable, 4 when it answers a status of another version (printed
    raw; `--json` always prints the service's document as it is)."""
    path = socket_of(config, socket)
    raw = ask(path, {"cmd": "status"})["status"]
    if as_json:  # the service's own document, whichever version wrote it
        typer.echo(json.dumps(raw, indent=2, ensure_ascii=False))
        if isinstance(raw, dict) and raw.get("state") == "degraded":
            raise typer.Exit(EXIT_DEGRADED)
        return
    try:
        st = Status.model_validate(raw)
    except ValidationError as exc:  # another version's service (an upgrade under way)
        typer.echo(
            f"edge-agent at {path} answered a status this agentctl cannot render "
            f"(another version?): {exc.error_count()} field(s) differ; its document:",
            err=True,
        )
        typer.echo(json.dumps(raw, indent=2, ensure_ascii=False))
        raise typer.Exit(EXIT_UNREADABLE) from None
    render_status(st, Console())
    if st.state == "degraded":
        raise typer.Exit(EXIT_DEGRADED)


alerts_app = typer.Typer(
    invoke_without_command=True,
    help="The alarm list (JSON lines): active alerts, then those that cleared unacknowledged; "
    "with --follow, then each alert event as it happens. Subcommands act on one alarm.",
)


@alerts_app.callback()
def alerts(
    ctx: typer.Context,
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Then every alert event.")] = False,
) -> None:
    """The alarm list (JSON lines): active alerts, then those that cleared unacknowledged
    (`unack_cleared`); with --follow, then each alert event as it happens."""
    if ctx.invoked_subcommand is not None:
        return
    path = socket_of(config, socket)
    if not follow:
        resp = ask(path, {"cmd": "alerts"})
        for alert in [*resp["active"], *resp.get("standing", [])]:
            typer.echo(json.dumps(alert, ensure_ascii=False))
        return
    try:
        asyncio.run(_follow(path))
    except KeyboardInterrupt:
        pass
    except (OSError, ValueError) as exc:
        typer.echo(f"edge-agent unreachable at {path}: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None


AlertId = Annotated[str, typer.Argument(help="The alert's id (`agentctl alerts` lists them).")]
NoteOpt = Annotated[str | None, typer.Option("--note", help="Why (kept in the audit event).")]


@alerts_app.command("ack")
def alerts_ack(
    alert_id: AlertId,
    note: NoteOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
) -> None:
    """Acknowledge an alarm: `ack_active` while its fault is heard, gone once cleared."""
    _alarm(config, socket, {"action": "ack", "id": alert_id, "note": note})


@alerts_app.command("shelve")
def alerts_shelve(
    alert_id: AlertId,
    duration: Annotated[
        str,
        typer.Option("--for", help="How long: 90s, 30m, 2h, 1h30m (at most alarms.max_shelve_s)."),
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why it is shelved (required).")],
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
) -> None:
    """Shelve an active alarm: silent until the shelf ends, then back if its fault is heard.

    Nothing of it is published while shelved, and a repeat raises no new alert; when the shelf
    ends it comes back unacknowledged if its fault is still heard, else it ends."""
    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--for") from None
    _alarm(config, socket, {"action": "shelve", "id": alert_id, "note": reason, "for_s": seconds})


@alerts_app.command("unshelve")
def alerts_unshelve(
    alert_id: AlertId,
    note: NoteOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
) -> None:
    """Take an alarm off its shelf now."""
    _alarm(config, socket, {"action": "unshelve", "id": alert_id, "note": note})


def _alarm(config: Path, socket: Path | None, body: dict[str, Any]) -> None:
    """One command; its audit events printed (JSON lines). Refused: the reason, exit 2."""
    resp = ask(socket_of(config, socket), {"cmd": "alarm", **body})
    for event in resp.get("events", []):
        typer.echo(json.dumps(event, ensure_ascii=False))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """ "90", "90s", "30m", "2h", "1h30m", "1d" -> seconds.

    Raises:
        ValueError: anything else, or zero.
    """
    spec = text.strip().lower()
    if not spec:
        raise ValueError("empty duration")
    try:
        total = float(spec)
    except ValueError:
        total, number = 0.0, ""
        for ch in spec:
            if ch.isdigit() or ch == ".":
                number += ch
            elif ch in _UNITS and number:
                total += float(number) * _UNITS[ch]
                number = ""
            else:
                raise ValueError(f"{text!r} is not a duration like 90s, 30m, 2h or 1h30m") from None
        if number:
            raise ValueError(f"{text!r}: a number without a unit at the end") from None
    if total <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return total


async def _follow(path: Path) -> None:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=16 << 20)
    writer.write(json.dumps({"cmd": "alerts", "follow": True}).encode() + b"\n")
    await writer.drain()
    first = True
    while line := await reader.readline():
        msg = json.loads(line)
        if not msg.get("ok"):
            raise OSError(str(msg.get("error")))
        listed = [*msg.get("active", []), *msg.get("standing", [])]
        for item in listed if first else [msg["event"]]:
            sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        first = False


@engine_app.command("restart")
def engine_restart(config: ConfigOpt = DEFAULT_CONFIG, socket: SocketOpt = None) -> None:
    """Restart the engine on its current rung (an operator's restart: not counted toward the
    rate limit; in degraded mode, try the engine again now)."""
    resp = ask(socket_of(config, socket), {"cmd": "engine.restart"})
    typer.echo(f"engine restart requested ({resp.get('state')})")


def running_config(config: Path, socket: Path | None) -> dict[str, Any]:
    data: dict[str, Any] = ask(socket_of(config, socket), {"cmd": "config"})["config"]
    return data


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.add_typer(alerts_app, name="alerts")
    app.add_typer(engine_app, name="engine")


# -- the human table -------------------------------------------------------------------------


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f} s"


def _age(s: float | None) -> str:
    return "-" if s is None else f"{s:.0f} s ago"


def _service_rows(st: Status, head: Table) -> None:
    """The audio stage and the fleet's applied versions, when they are on."""
    asr = st.asr
    if isinstance(asr, AsrStatus):
        aq = asr.queue
        head.add_row(
            "asr",
            f"{asr.state} ({asr.model}, {asr.device} {asr.compute_type}): {asr.clips} clips, "
            f"RTF {'-' if asr.rtf is None else asr.rtf}, queue {aq.seconds}/"
            f"{aq.max_total_s} s (shed {aq.shed_clips} clips)"
            + (f", refused {sum(asr.rejected.values())}" if asr.rejected else ""),
        )
    fleet = st.fleet
    if isinstance(fleet, FleetStatus):
        applied = ", ".join(f"{t} v{v}" for t, v in fleet.applied.items())
        head.add_row("config", f"fleet: {applied or 'local file only'} ({fleet.phase})")


def _engine_rows(llm: LlmOff | LlmStatus, head: Table) -> None:
    # Not supervised: llm.enabled is false (the config refuses it enabled without an engine)
    if not llm.enabled or not isinstance(llm, LlmStatus):
        head.add_row("engine", "off (llm.enabled: false)")
        return
    head.add_row(
        "engine",
        f"{llm.state} ({llm.backend or '-'}, vLLM {llm.vllm_version or '-'}, {llm.spec or '-'})",
    )
    model = llm.model.line if llm.model is not None else None
    head.add_row("model", model or "- (not chosen yet: the engine has not started)")
    rung = llm.rung
    head.add_row("rung", f"{rung.index}/{rung.of}: {rung.name}")
    last = llm.last_restart
    if last is not None:
        head.add_row(
            "last restart",
            f"{last.reason}: {last.detail} (rung {last.from_rung} -> "
            f"{last.to_rung}, back in {last.recovery_s} s)",
        )


def render_status(st: Status, console: Console) -> None:
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("device", f"{st.device_id} (edge-agent {st.version})")
    head.add_row("state", f"{st.state}, up {st.uptime_s:.0f} s")
    head.add_row("profile", st.profile)
    _engine_rows(st.llm, head)
    wd = st.watchdog
    mem = wd.memory if isinstance(wd, WatchdogStatus) else None
    gpu_free = mem.gpu_free if mem is not None else None
    head.add_row(
        "memory",
        f"{wd.level or '-'}: MemAvailable {_gib(mem.mem_available if mem else None)} of "
        f"{_gib(mem.mem_total if mem else None)}, engine RSS "
        f"{_gib(mem.engine_rss if mem else None)}"
        + (f", GPU free {_gib(gpu_free)}" if gpu_free is not None else ""),
    )
    mqtt = st.mqtt
    if mqtt.connected:
        head.add_row("mqtt", f"connected to {mqtt.broker}, {mqtt.connects} connects")
    else:
        since = f" for {mqtt.disconnected_s:.0f} s" if mqtt.disconnected_s is not None else ""
        why = f": {mqtt.last_error}" if mqtt.last_error else ""
        head.add_row("mqtt", f"DISCONNECTED from {mqtt.broker}{since}{why}")
    q, ob = st.queue, st.outbox
    head.add_row(
        "queues",
        f"ingest {q.depth}/{q.max} (shed {q.shed}), outbox {ob.depth} (shed {ob.shed})",
    )
    _service_rows(st, head)
    head.add_row("alerts", f"{st.active_alerts} active, {st.alerts_last_hour} new in the last hour")
    v, ttv = st.alerts.verdicts, st.alerts.time_to_verdict
    head.add_row(
        "verdicts",
        ", ".join(f"{k} {n}" for k, n in v.items())
        + (f"; time to verdict p50 {_secs(ttv.p50_s)} p95 {_secs(ttv.p95_s)}" if ttv.count else ""),
    )
    al = st.alarms
    refused = sum(al.refused.values())
    head.add_row(
        "alarms",
        ", ".join(f"{k} {n}" for k, n in al.by_state.items() if n)
        + ("; " if any(al.by_state.values()) else "")
        + f"commands {sum(al.applied.values())} applied, {refused} refused",
    )
    timed = [
        f"{source} p50 {_secs(v.p50_s)} p95 {_secs(v.p95_s)} (n={v.count})"
        for source, v in st.alerts.segment_to_alert.items()
        if v.count
    ]
    head.add_row("segment->alert", "; ".join(timed) or "-")
    eng = st.llm.engine if isinstance(st.llm, LlmStatus) else None
    if eng is not None and eng.ttft_p50_s is not None:
        head.add_row(
            "engine latency",
            f"first token p50 {_secs(eng.ttft_p50_s)} p95 {_secs(eng.ttft_p95_s)}, "
            f"per token p50 {_secs(eng.per_token_p50_s)}",
        )
    metrics = st.metrics
    head.add_row("metrics", f"http://{metrics.address}/metrics" if metrics is not None else "off")
    console.print(head)
    if st.streams:
        table = Table(title="streams")
        for col in ("stream", "segments", "last segment", "active alerts", "window tokens"):
            table.add_column(col)
        for sid, s in st.streams.items():
            ctx = s.context
            window = f"{ctx.tokens}/{ctx.budget}" if ctx is not None else "-"
            table.add_row(
                sid,
                "-" if s.segments is None else str(s.segments),
                _age(s.last_segment_age_s),
                str(s.active_alerts or 0),
                window,
            )
        console.print(table)
