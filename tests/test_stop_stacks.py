"""A stop that runs long writes every thread's stack to stderr (the journal) before
systemd's TimeoutStopSec kills the service (agent/cli/edge_agent.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_stop_past_its_mark_writes_every_threads_stack() -> None:
    # The handler as the service installs it, the mark brought down to 0.2 s, and a stop
    # that hangs in a worker thread for 2 s (as a join at exit would).
    code = textwrap.dedent(
        """
        import asyncio, threading, time
        import agent.cli.edge_agent as cli

        cli.STOP_STACKS_AFTER_S = 0.2
        stop = asyncio.Event()
        on_signal = cli._stopper(stop)
        on_signal()
        on_signal()  # a second SIGTERM re-arms nothing
        assert stop.is_set()

        def stuck_join():
            time.sleep(2)

        worker = threading.Thread(target=stuck_join, name="stuck")
        worker.start()
        worker.join()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Timeout (0:00:00.200000)!" in done.stderr
    assert "in stuck_join" in done.stderr  # the worker's frame
    assert done.stderr.count("Timeout (") == 1
