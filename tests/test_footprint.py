"""agent/footprint.py and `agentctl doctor --memory`: a real process tree read from /proc."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import doctor as doctor_cli
from agent.cli.agentctl import app
from agent.footprint import Footprint, footprint, kind_of, parse_smaps, service_pid

MIB = 1 << 20
# A parent that holds 64 MiB of fresh heap and starts one idle child, then says so.
_TREE = """
import subprocess, sys
block = bytearray(64 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1  # touch every page: resident
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """(parent pid, child pid) of a running two-process tree; both end with the test."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        child = int(proc.stdout.readline())  # printed once the heap is touched
        yield proc.pid, child
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("", "heap"),
        ("[heap]", "heap"),
        ("[anon:libc_malloc]", "heap"),
        ("[stack]", "stack"),
        ("[vdso]", "python"),
        ("/usr/lib/python3/dist-packages/torch/lib/libtorch_cuda.so", "torch"),
        ("/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.13", "cuda"),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", "cuda"),
        ("/usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so", "cuda"),
        ("/root/.triton/cache/AbC/fused_recurrent.so", "triton"),
        ("/tmp/torchinductor_root/xy/cxy.so", "triton"),
        ("/dev/shm/psm_1234", "shared"),
        ("/memfd:vllm-ipc", "shared"),
        ("/dev/nvidia0", "device"),
        ("/dev/nvmap", "device"),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "python"),
        ("/usr/lib/x86_64-linux-gnu/libcurl.so.4", "python"),  # not CUDA for its "libcu"
        ("/usr/lib/x86_64-linux-gnu/libcups.so.2", "python"),
        ("/usr/lib/x86_64-linux-gnu/libnvpair.so.3", "python"),
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.1", "cuda"),
        ("[anon_shmem]", "shared"),
        ("/dev/zero", "shared"),
    ],
)
def test_each_mapping_has_one_kind(path: str, kind: str) -> None:
    assert kind_of(path) == kind


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def test_the_kinds_add_up_to_the_kernels_rollup(tree: tuple[int, int]) -> None:
    """Summed over the kinds, the mappings of an idle process give smaps_rollup's resident and
    anonymous totals: no mapping is lost or counted twice by the parser."""
    parent, _ = tree  # idle once it has printed
    text = Path(f"/proc/{parent}/smaps").read_text()
    kinds = parse_smaps(text)
    rollup = _rollup(parent)
    # a few pages of slack: under memory pressure the kernel may drop a clean file page
    # between the two reads
    assert abs(sum(b.rss for b in kinds.values()) - rollup["Rss"]) <= 16 * 4096
    assert abs(sum(b.anonymous for b in kinds.values()) - rollup["Anonymous"]) <= 16 * 4096
    # Pss is not compared: a library page's share moves whenever another process of the
    # machine maps or drops it, between the two reads
    assert all(0 < b.pss <= b.rss for b in kinds.values() if b.rss)


def test_a_tree_is_read_process_by_process(tree: tuple[int, int]) -> None:
    parent, child = tree
    found = footprint(parent, gpu=False)
    assert [p.pid for p in found.processes] == [parent, child]
    by_pid = {p.pid: p for p in found.processes}
    assert by_pid[child].ppid == parent
    assert by_pid[parent].kinds["heap"].anonymous >= 64 * MIB  # the bytearray
    assert by_pid[child].anonymous < 64 * MIB
    assert found.pss == sum(p.pss for p in found.processes)
    assert found.kind_totals()["heap"].rss >= 64 * MIB
    assert found.gpu_source == "not asked" and found.gpu_bytes == 0


def test_a_missing_process_is_an_error() -> None:
    with pytest.raises(ProcessLookupError):
        footprint(2**22 + 12345, gpu=False)


def test_doctor_memory_prints_the_tree_and_exits_1_without_one(tree: tuple[int, int]) -> None:
    parent, child = tree
    runner = CliRunner()
    shown = runner.invoke(app, ["doctor", "--memory", "--pid", str(parent)])
    assert shown.exit_code == 0, shown.output
    assert str(child) in shown.output and "kind heap" in shown.output
    as_json = runner.invoke(app, ["doctor", "--memory", "--pid", str(parent), "--json"])
    assert as_json.exit_code == 0, as_json.output
    found = Footprint.model_validate_json(as_json.output)
    assert {p.pid for p in found.processes} == {parent, child}
    gone = runner.invoke(app, ["doctor", "--memory", "--pid", str(2**22 + 12345)])
    assert gone.exit_code == doctor_cli.EXIT_MISSING
    assert "no process" in gone.output


def test_no_unit_no_pid() -> None:
    """A unit that does not exist (or no systemd at all) has no MainPID."""
    assert service_pid("edge-agent-no-such-unit.service") is None
