"""Every result file written through bench._common.write_result says where it comes from:
the revision, the command and the machine (issue 30: every figure rerunnable)."""

from __future__ import annotations

import json
from pathlib import Path

from bench._common import provenance, write_result


def test_a_result_names_its_revision_command_and_machine(tmp_path: Path) -> None:
    prov = provenance("bench.quality.bench_quality", ["--part", "blind5"])
    assert prov.command == "python -m bench.quality.bench_quality --part blind5"
    assert prov.revision != "unknown"  # measured in this git checkout
    md, js = write_result(tmp_path, "r", prov, text="# Title\n\n| a |\n", data={"n": 1})
    lines = md.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# Title"
    assert lines[2] == prov.line() and prov.revision in lines[2] and prov.machine in lines[2]
    assert lines[4] == "| a |"
    body = json.loads(js.read_text(encoding="utf-8"))
    assert body["provenance"]["command"] == prov.command
    assert body["provenance"]["machine"] == prov.machine
    assert body["n"] == 1
