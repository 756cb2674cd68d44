"""agentctl's commands for the running service, over its control socket (agent.control):
`status`, `alerts [--follow]`, `engine restart`, `config show --running`.

Exit codes: 0 fine, 2 the service answers but is degraded (keyword-only) or refused the
request, 3 unreachable (no socket, permission denied, no answer).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agent.cli.common import DEFAULT_CONFIG, load_or_exit
from agent.config.loader import default_socket_path

__all__ = ["EXIT_DEGRADED", "EXIT_UNREACHABLE", "engine_app", "register", "render_status"]

EXIT_DEGRADED = 2
EXIT_UNREACHABLE = 3

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
    degraded, 3 when unreachable."""
    st = ask(socket_of(config, socket), {"cmd": "status"})["status"]
    if as_json:
        typer.echo(json.dumps(st, indent=2, ensure_ascii=False))
    else:
        render_status(st, Console())
    if st.get("state") == "degraded":
        raise typer.Exit(EXIT_DEGRADED)


def alerts(
    config: ConfigOpt = DEFAULT_CONFIG,
    socket: SocketOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Then every alert event.")] = False,
) -> None:
    """Active alerts (JSON lines); with --follow, then each alert event as it happens."""
    path = socket_of(config, socket)
    if not follow:
        for alert in ask(path, {"cmd": "alerts"})["active"]:
            typer.echo(json.dumps(alert, ensure_ascii=False))
        return
    try:
        asyncio.run(_follow(path))
    except KeyboardInterrupt:
        pass
    except (OSError, ValueError) as exc:
        typer.echo(f"edge-agent unreachable at {path}: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None


async def _follow(path: Path) -> None:
    reader, writer = await asyncio.open_unix_connection(str(path), limit=16 << 20)
    writer.write(json.dumps({"cmd": "alerts", "follow": True}).encode() + b"\n")
    await writer.drain()
    first = True
    while line := await reader.readline():
        msg = json.loads(line)
        if not msg.get("ok"):
            raise OSError(str(msg.get("error")))
        for item in msg.get("active", []) if first else [msg["event"]]:
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
    app.command("alerts")(alerts)
    app.add_typer(engine_app, name="engine")


# -- the human table -------------------------------------------------------------------------


def _gib(n: Any) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def _secs(s: Any) -> str:
    return "-" if s is None else f"{s:.3f} s"


def _age(s: Any) -> str:
    return "-" if s is None else f"{s:.0f} s ago"


def _service_rows(st: dict[str, Any], head: Table) -> None:
    """The audio stage and the fleet's applied versions, when they are on."""
    asr = st.get("asr") or {}
    if asr.get("state", "off") != "off":
        aq = asr.get("queue") or {}
        rtf = asr.get("rtf")
        head.add_row(
            "asr",
            f"{asr.get('state')} ({asr.get('model')}, {asr.get('device')} "
            f"{asr.get('compute_type')}): {asr.get('clips')} clips, "
            f"RTF {'-' if rtf is None else rtf}, queue {aq.get('seconds')}/"
            f"{aq.get('max_total_s')} s (shed {aq.get('shed_clips')} clips)"
            + (f", refused {sum(asr['rejected'].values())}" if asr.get("rejected") else ""),
        )
    fleet = st.get("fleet") or {}
    if fleet.get("enabled"):
        applied = ", ".join(f"{t} v{v}" for t, v in (fleet.get("applied") or {}).items())
        head.add_row("config", f"fleet: {applied or 'local file only'} ({fleet.get('phase')})")


def render_status(st: dict[str, Any], console: Console) -> None:
    llm = st.get("llm") or {}
    wd = st.get("watchdog") or {}
    mem = wd.get("memory") or {}
    rung = llm.get("rung") or {}
    last = llm.get("last_restart") or {}
    mqtt = st.get("mqtt") or {}
    q, ob = st.get("queue") or {}, st.get("outbox") or {}
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("device", f"{st.get('device_id')} (edge-agent {st.get('version')})")
    head.add_row("state", f"{st.get('state')}, up {st.get('uptime_s', 0):.0f} s")
    head.add_row("profile", str(st.get("profile")))
    if llm.get("enabled"):
        backend = llm.get("backend") or "-"
        vllm = llm.get("vllm_version") or "-"
        spec = llm.get("spec") or "-"
        head.add_row("engine", f"{llm.get('state')} ({backend}, vLLM {vllm}, {spec})")
        model = llm.get("model") or {}
        head.add_row(
            "model", str(model.get("line") or "- (not chosen yet: the engine has not started)")
        )
        head.add_row("rung", f"{rung.get('index')}/{rung.get('of')}: {rung.get('name')}")
        if last:
            head.add_row(
                "last restart",
                f"{last.get('reason')}: {last.get('detail')} (rung {last.get('from_rung')} -> "
                f"{last.get('to_rung')}, back in {last.get('recovery_s')} s)",
            )
    else:
        head.add_row("engine", "off (llm.enabled: false)")
    head.add_row(
        "memory",
        f"{wd.get('level') or '-'}: MemAvailable {_gib(mem.get('mem_available'))} of "
        f"{_gib(mem.get('mem_total'))}, engine RSS {_gib(mem.get('engine_rss'))}"
        + (f", GPU free {_gib(mem.get('gpu_free'))}" if mem.get("gpu_free") is not None else ""),
    )
    link = "connected" if mqtt.get("connected") else "DISCONNECTED"
    head.add_row("mqtt", f"{link}, {mqtt.get('connects')} connects")
    head.add_row(
        "queues",
        f"ingest {q.get('depth')}/{q.get('max')} (shed {q.get('shed')}), "
        f"outbox {ob.get('depth')} (shed {ob.get('shed')})",
    )
    _service_rows(st, head)
    head.add_row(
        "alerts",
        f"{st.get('active_alerts')} active, {st.get('alerts_last_hour')} new in the last hour",
    )
    latency = (st.get("alerts") or {}).get("segment_to_alert") or {}
    timed = [
        f"{source} p50 {_secs(v.get('p50_s'))} p95 {_secs(v.get('p95_s'))} (n={v.get('count')})"
        for source, v in latency.items()
        if v.get("count")
    ]
    head.add_row("segment->alert", "; ".join(timed) or "-")
    eng = llm.get("engine") or {}
    if eng.get("ttft_p50_s") is not None:
        head.add_row(
            "engine latency",
            f"first token p50 {_secs(eng.get('ttft_p50_s'))} p95 {_secs(eng.get('ttft_p95_s'))}, "
            f"per token p50 {_secs(eng.get('per_token_p50_s'))}",
        )
    metrics = st.get("metrics") or {}
    head.add_row("metrics", f"http://{metrics['address']}/metrics" if metrics else "off")
    console.print(head)
    streams = st.get("streams") or {}
    if streams:
        table = Table(title="streams")
        for col in ("stream", "segments", "last segment", "active alerts", "window tokens"):
            table.add_column(col)
        for sid, s in streams.items():
            ctx = s.get("context") or {}
            window = f"{ctx.get('tokens')}/{ctx.get('budget')}" if ctx else "-"
            table.add_row(
                sid,
                str(s.get("segments", "-")),
                _age(s.get("last_segment_age_s")),
                str(s.get("active_alerts", 0)),
                window,
            )
        console.print(table)
