"""agent.fleet.store on real files: the saved last answers are what the status shows, so
one the status model refuses (a hand edit) makes the whole file unreadable, set aside, and
the service starts on its local file, instead of a status that can never be built."""

from __future__ import annotations

import json
from pathlib import Path

from agent.fleet.store import FleetState, FleetStore
from agent.status.fleet import FleetAnswer


def test_saved_last_answers_come_back_as_written(tmp_path: Path) -> None:
    store = FleetStore(tmp_path)
    answer = {"version": 3, "status": "applied", "reason": "health gate passed", "at": 17}
    store.save(FleetState(last={"fleet/line-3": answer}))
    loaded = store.load()
    assert loaded.last == {"fleet/line-3": answer}
    FleetAnswer.model_validate(loaded.last["fleet/line-3"])


def test_a_last_answer_the_status_refuses_sets_the_file_aside(tmp_path: Path) -> None:
    store = FleetStore(tmp_path)
    store.save(FleetState(seen={"fleet/line-3": 3}))
    body = json.loads(store.path.read_text())
    body["last"] = {"fleet/line-3": {"version": 3, "status": "applied", "reason": "ok"}}  # no at
    store.path.write_text(json.dumps(body))
    loaded = store.load()
    assert loaded.last == {} and loaded.seen == {}  # the local file alone
    assert not store.path.exists()
    assert [p.name.startswith("state.json.corrupt-") for p in tmp_path.iterdir()] == [True]
