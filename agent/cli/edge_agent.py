"""`edge-agent`: run the daemon in the foreground (systemd runs exactly this), or the demo."""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from agent.cli.common import DEFAULT_CONFIG, EXIT_INVALID, load_or_exit
from agent.config import ConfigError, LoadedConfig
from agent.logsetup import configure_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Agent config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a key: --set mqtt.port=1884 (repeatable)."),
]
ProfileOpt = Annotated[str | None, typer.Option(help="Device profile; overrides the file's.")]

# systemd's TimeoutStopSec is 90 s (systemd/edge-agent.service): a stop still running at
# half of it writes every thread's stack to stderr (the journal), so a slow or stuck stop
# says where it is before systemd kills it.
STOP_STACKS_AFTER_S = 45.0


@app.command()
def run(
    config: ConfigOpt = DEFAULT_CONFIG,
    set_: SetOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Run the service until SIGTERM or SIGINT, then stop without losing accepted data."""
    loaded = load_or_exit(config, set_ or [], profile)
    configure_logging(loaded.config.logging.level, loaded.config.logging.format.value)
    try:
        asyncio.run(_serve(loaded))
    except ConfigError as exc:  # e.g. the named MQTT password credential is missing
        for issue in exc.issues:
            typer.echo(f"invalid config: {issue}", err=True)
        raise typer.Exit(EXIT_INVALID) from None


async def _serve(loaded: LoadedConfig) -> None:
    from agent.daemon import Daemon

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopper(stop))
    await Daemon(loaded).run(stop)


def _stopper(stop: asyncio.Event) -> Callable[[], None]:
    """The signal handler: stop, and arm the stack dump of a stop that takes too long. The
    dump stays armed to the process's end: the joins at interpreter exit (the threads of
    executors) are part of the stop too."""

    def on_signal() -> None:
        if not stop.is_set():
            faulthandler.dump_traceback_later(STOP_STACKS_AFTER_S, exit=False, file=sys.stderr)
        stop.set()

    return on_signal


@app.command()
def demo(
    config: ConfigOpt = Path("configs/agent.yaml"),
    sample: Annotated[Path, typer.Option(help="JSONL transcript to replay.")] = Path(
        "configs/samples/line3-shift.jsonl"
    ),
    speed: Annotated[float, typer.Option(help="Replay speed-up over real time.")] = 10.0,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="KEY.PATH=VALUE over the config (llm.enabled=false: no LLM)."),
    ] = None,
) -> None:
    """Local broker + the service on the embedded defaults + a sample stream; alerts printed."""
    from agent.demo import run_demo

    raise typer.Exit(run_demo(config, sample, speed, set_ or []))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
