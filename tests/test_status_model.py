"""The status model (agent.status) is the status: every field the docs name is in it, the
service's real snapshots validate against it with unknown keys refused, its JSON keeps the
producers' keys in their order, and `/metrics` rendered from it exports every documented
metric (and nothing undocumented).

The docs are read, not copied: docs/mqtt.md's status example and field lists, every
`status.<path>` named in docs/*.md and README.md, and docs/metrics.md's two tables."""

from __future__ import annotations

import asyncio
import json
import re
import time
import types
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from agent.config import load_config
from agent.config.models import AgentConfig
from agent.control import request
from agent.daemon import Daemon
from agent.devbroker import DevBroker
from agent.fleet.store import FleetState, FleetStore, TargetState
from agent.metrics import Histogram, families
from agent.status import AsrStatus, FleetStatus, LlmStatus, Status, WatchdogStatus
from agent.watchdog.probes import MemorySample
from pipelines.compat import timeout
from tests.helpers import MqttWatcher, publish_all, scrape, until
from tests.watchdog.test_supervisor_faults import StandInEngine

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
AGENT_YAML = REPO / "configs" / "agent.yaml"
# A field or key path as the docs write it: `llm.rung.index`, `streams.<id>.context`.
_PATH = re.compile(r"^[a-z_][a-z0-9_]*(\.(<[a-z_]+>|[a-z0-9_]+))*$")


# -- walking the model's types --------------------------------------------------------------


def _members(tp: Any) -> list[Any]:
    """The types an annotation admits (unions and Annotated unwrapped)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _step(options: list[Any], key: str) -> list[Any]:
    """The types reached by following `key` from any of `options` (a model's field, any key
    of a map, into a list's items; an open model's extra fields are anything)."""
    out: list[Any] = []
    for tp in options:
        origin = typing.get_origin(tp)
        if origin is list:
            out += _step(_members(typing.get_args(tp)[0]), key)
        elif origin is dict:
            out += _members(typing.get_args(tp)[1])
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(key)
            if field is not None:
                out += _members(field.annotation)
            elif tp.model_config.get("extra") == "allow":
                out.append(Any)
        elif tp is Any:
            out.append(Any)
    return out


def _resolve(root: type[BaseModel], path: list[str]) -> list[Any]:
    """The types at `path` from `root` ([]: no such field)."""
    options: list[Any] = [root]
    for key in path:
        options = _step(options, key)
        if not options:
            return []
    return options


def _literals(options: list[Any]) -> set[str]:
    return {
        str(v) for tp in options if typing.get_origin(tp) is Literal for v in typing.get_args(tp)
    }


# -- (a) the docs name only fields the model has ------------------------------------------------


def _status_part() -> tuple[Any, str]:
    """docs/mqtt.md's status: the JSON example, and the prose around it."""
    text = (DOCS / "mqtt.md").read_text(encoding="utf-8")
    start = text.index("- `<prefix>/status` (retained)")
    part = text[start : text.index("- `<prefix>/errors`", start)]
    example = re.search(r"```json\n(.*?)```", part, re.S)
    assert example is not None, "docs/mqtt.md: no status example"
    return json.loads(example.group(1)), part[: example.start()] + part[example.end() :]


def _unknown_keys(obj: Any, path: list[str]) -> Iterator[str]:
    if isinstance(obj, list):
        for item in obj:
            yield from _unknown_keys(item, path)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if not _resolve(Status, [*path, key]):
                yield ".".join([*path, key])
            else:
                yield from _unknown_keys(value, [*path, key])


def test_every_key_of_the_documented_status_example_is_in_the_model() -> None:
    example, _ = _status_part()
    assert list(_unknown_keys(example, [])) == []
    Status.model_validate(example)  # and the example is a status, types included


def test_every_status_path_the_docs_name_is_in_the_model() -> None:
    named = {
        (doc.name, path)
        for doc in [*DOCS.glob("*.md"), REPO / "README.md"]
        for path in re.findall(r"`status\.([^`]+)`", doc.read_text(encoding="utf-8"))
    }
    assert len(named) >= 15  # the docs' habit of naming a counter by its status path
    unknown = [(doc, p) for doc, p in sorted(named) if not _resolve(Status, p.split("."))]
    assert unknown == []


def _outside_parentheses(text: str) -> str:
    """Values and notes are in parentheses: `knob` (`none`, `speculative`, ...)."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _items(prose: str) -> Iterator[tuple[int, str]]:
    """Paragraphs and bullets (with their continuation lines), with their indent."""
    indent, lines = -1, []
    for line in [*prose.splitlines(), ""]:
        bullet = re.match(r"^(\s*)- ", line)
        if bullet is not None or not line.strip():
            if lines:
                yield max(indent, 0), " ".join(lines)
            indent, lines = (len(bullet.group(1)), [line]) if bullet else (-1, [])
        else:
            lines.append(line.strip())


def _field_lists() -> tuple[int, list[str]]:
    """Each item of the status prose is a field (its head, the first name outside
    parentheses), then its own fields, its siblings, its values, or configuration keys
    (`mqtt.status_interval_s`). Sub-bullets are about their parent's fields. Returns how
    many names were checked, and those that are none of these."""
    _, prose = _status_part()
    parents: list[tuple[int, list[str]]] = []
    checked, problems = 0, []
    for indent, item in _items(prose):
        while parents and parents[-1][0] >= indent:
            parents.pop()
        context = parents[-1][1] if parents else []
        names = [t for t in re.findall(r"`([^`]+)`", _outside_parentheses(item)) if _PATH.match(t)]
        if not names:
            continue
        checked += len(names)
        head = names[0].split(".")
        where = next((p for p in ([*context, *head], head) if _resolve(Status, p)), None)
        if where is None and not _resolve(AgentConfig, head):
            problems.append(f"{names[0]!r} in {item[:70]!r}")
        values = _literals(_resolve(Status, where)) if where else set()
        bases = [where, where[:-1]] if where else []
        for name in names[1:]:
            path = name.split(".")
            if name in values or _resolve(AgentConfig, path):
                continue
            if not any(_resolve(Status, [*base, *path]) for base in [*bases, context, []]):
                problems.append(f"{name!r} (with {names[0]}) in {item[:70]!r}")
        if where and item.lstrip().startswith("- "):
            parents.append((indent, where))
    return checked, problems


def test_every_field_the_status_lists_name_is_in_the_model() -> None:
    checked, problems = _field_lists()
    assert checked > 100  # the lists were found (a reworded section is not a pass)
    assert problems == []


# -- (c) /metrics rendered from the model ---------------------------------------------------


def _table(text: str, header: str) -> list[list[str]]:
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _labels(cell: str) -> frozenset[str]:
    return frozenset(
        x.strip().strip("`") for x in _outside_parentheses(cell).split(",") if x.strip()
    )


def documented_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/metrics.md: {exported name without `edge_agent_`: (type or "", labels)}."""
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    out = {}
    for names, kind, labels, _what in _table(text, "| metric | type | labels | what |"):
        for name in re.findall(r"`([a-z0-9_]+)`", names):
            out[name] = (kind, _labels(labels))
    for names, labels, _what in _table(text, "| histogram | labels | from → to |"):
        for name in re.findall(r"`([a-z0-9_]+)`", names):
            out[name] = ("histogram", _labels(labels))
    return out


def emitted_metrics(
    st: Status, histograms: list[Histogram]
) -> dict[str, tuple[str, frozenset[str]]]:
    """families() of one model: {name as exported without `edge_agent_`: (type, labels)}."""
    out = {}
    for family in families(st, histograms):
        name = family.name.removeprefix("edge_agent_")
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        out[f"{name}_total" if family.type == "counter" else name] = (family.type, labels)
    return out


# -- (b) real snapshots ---------------------------------------------------------------------


def _same_document(given: Any, dumped: Any) -> None:
    """The model's JSON has the given keys, in their order, and the same values."""
    assert dumped == given
    if isinstance(given, dict):
        assert list(dumped) == list(given)
        for key, value in given.items():
            _same_document(value, dumped[key])
    elif isinstance(given, list):
        for a, b in zip(given, dumped, strict=True):
            _same_document(a, b)


def _validates(raw: dict[str, Any]) -> Status:
    st = Status.model_validate(raw)
    _same_document(raw, st.document())
    _same_document(raw, json.loads(st.payload()))
    return st


def _config(tmp_path: Path, *overrides: str) -> Any:
    return load_config(
        AGENT_YAML,
        overrides=[
            f"outbox.path={tmp_path / 'state' / 'outbox.sqlite'}",
            f"control.socket_path=/tmp/ea-{uuid.uuid4().hex[:10]}.sock",
            "metrics.port=0",
            *overrides,
        ],
    )


@pytest.mark.broker
async def test_the_running_service_status_validates_as_published_and_as_answered(
    broker: DevBroker, prefix: str, tmp_path: Path
) -> None:
    """llm.enabled false (the cpu-dev config without the engine), asr off: published on
    `<prefix>/status`, answered on the control socket, then the last `stopped` one."""
    loaded = _config(
        tmp_path,
        f"mqtt.port={broker.port}",
        f"mqtt.topic_prefix={prefix}",
        "mqtt.status_interval_s=1",
        "llm.enabled=false",
        "asr.enabled=false",
    )
    watcher = MqttWatcher(broker.port, prefix)
    await watcher.start()
    daemon = Daemon(loaded)
    stop = asyncio.Event()
    run = asyncio.create_task(daemon.run(stop))

    def status(w: MqttWatcher) -> dict[str, Any]:
        got = w.on("status")
        return dict(got[-1].json()) if got else {}

    try:
        now = time.time()
        segment = {"stream_id": "mic1", "seq": 1, "start": now - 5, "end": now,
                   "text": "motor overload on line three", "lang": "en"}  # fmt: skip
        topic = f"{prefix}/streams/mic1/transcript"
        await watcher.wait_for(lambda w: bool(status(w)), what="a status")
        await publish_all(broker.port, [(topic, json.dumps(segment).encode()), (topic, b"{x")])
        await watcher.wait_for(
            lambda w: (
                status(w).get("active_alerts") == 1
                and status(w)["ingest"]["received"] == 2
                and bool((status(w).get("metrics") or {}).get("address"))
            ),
            what="the alert and the refusal in the status",
        )
        published = _validates(status(watcher))
        assert isinstance(published.watchdog, WatchdogStatus)
        assert published.streams["mic1"].active_alerts == 1
        assert published.ingest.rejected == {"invalid_json": 1}
        assert daemon.control is not None
        answer = await request(daemon.control.path, {"cmd": "status"})
        answered = _validates(answer["status"])
        assert answered.llm.enabled is False and not isinstance(answered.llm, LlmStatus)
        assert published.metrics is not None and published.metrics.address is not None
        scraped = {name for name, _ in await scrape(published.metrics.address)}
        documented = documented_metrics()
        undocumented = {
            n for n in scraped if re.sub(r"_(bucket|count|sum)$", "", n[11:]) not in documented
        }
        assert undocumented == set()
    finally:
        stop.set()
        async with timeout(30):
            await run
    await watcher.wait_for(lambda w: status(w).get("state") == "stopped", what="stopped")
    _validates(status(watcher))
    await watcher.stop()


class _Probe:
    """Every figure measured, a discrete GPU included."""

    def read(self) -> MemorySample:
        return MemorySample(
            mem_total=32 << 30, mem_available=20 << 30, psi_some_avg10=0.5, psi_full_avg10=0.1,
            service_rss=300 << 20, engine_rss=2 << 30, gpu_free=30 << 30, gpu_total=80 << 30,
        )  # fmt: skip


@pytest.fixture
async def llm_daemon(tmp_path: Path) -> Any:
    """The cpu-dev config with llm.enabled, asr and fleet on, its supervisor serving a
    stand-in engine (no vLLM), after one operator restart; a stream with a window."""
    fleet_dir = tmp_path / "fleet"
    FleetStore(fleet_dir).save(
        FleetState(layers={"fleet/line-3": TargetState(1, {}, time.time())})
    )  # a document applied before this start: the layers in force
    (tmp_path / "keys").mkdir()
    loaded = _config(
        tmp_path,
        "llm.enabled=true",
        "asr.enabled=true",
        "fleet.enabled=true",
        "fleet.groups=[line-3]",
        f"fleet.state_dir={fleet_dir}",
        f"fleet.trusted_keys_dir={tmp_path / 'keys'}",
        "watchdog.gpu_warn_bytes=4294967296",
        "watchdog.gpu_critical_bytes=2147483648",
    )
    daemon = Daemon(loaded, probe=_Probe())
    # The real engine's latency windows, before the swap (the stand-in has none).
    histograms = daemon.status.histograms()
    sup = daemon.supervisor
    assert sup is not None and daemon.analysis is not None and daemon.fleet is not None
    sup.engine = StandInEngine()
    task = asyncio.create_task(sup.run())
    fleet = asyncio.create_task(daemon.fleet.run())
    try:
        await until(sup.ready.is_set, "the stand-in serving")
        assert sup.request_restart("operator")
        await until(
            lambda: (
                sup.ready.is_set()
                and sup.last_restart is not None
                and sup.last_restart["recovery_s"] is not None
            ),
            "the restart",
        )
        daemon.analysis.add("mic1", seq=1, start=0.0, end=5.0, text="the belt is slipping")
        assert daemon.watchdog is not None
        await daemon.watchdog.check()
        daemon.fleet.submit("fleet/line-3/config", b'{"version": 2}')  # not signed
        fleet_state = daemon.fleet.state
        # Its answer is in the state at once (publishing it waits for a broker: none here).
        await until(lambda: "fleet/line-3" in fleet_state.last, "the fleet's answer")
        yield daemon, histograms
    finally:
        for t in (fleet, task):
            t.cancel()
        await asyncio.wait([fleet, task])
        await sup.stop()


async def test_the_llm_shape_validates_with_a_stand_in_engine(llm_daemon: Any) -> None:
    daemon, _ = llm_daemon
    st = _validates(daemon.status.snapshot().document())
    assert isinstance(st.llm, LlmStatus) and st.llm.state == "running"
    assert st.llm.model is not None and st.llm.analysis is not None
    assert st.llm.last_restart is not None and st.llm.last_restart.reason == "operator"
    assert st.llm.restarts_by_reason == {"operator": 1}
    context = st.streams["mic1"].context
    assert context is not None and context.pending_lines == 1
    assert isinstance(st.watchdog, WatchdogStatus) and st.watchdog.memory is not None
    assert st.watchdog.thresholds.gpu_critical_bytes == 2 << 30
    assert isinstance(st.asr, AsrStatus) and st.asr.state == "loading"
    assert isinstance(st.fleet, FleetStatus) and st.fleet.applied == {"fleet/line-3": 1}
    assert st.fleet.last["fleet/line-3"].status == "rejected"
    assert [e.event for e in st.watchdog.events][:1] == ["engine.ready"]


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


async def test_every_documented_metric_is_rendered_from_the_model(llm_daemon: Any) -> None:
    """The llm shape, with a first count where a labelled series needs one and a figure
    where a series is absent while unknown (rates before any request)."""
    daemon, histograms = llm_daemon
    doc = _merge(
        daemon.status.snapshot().document(),
        {
            "ingest": {"rejected": {"invalid_json": 1}, "duplicates": {"covered": 1}},
            "alerts": {"events": {"new": 1}, "publish_refused": {"Not authorized": 1}},
            "queue": {"spool": {"depth": 1, "max": 10, "written": 1, "taken": 0, "shed": 0,
                                "write_errors": 0, "damaged": None}},
            "streams": {"mic1": {"segments": 1, "duplicates": 0, "last_segment_age_s": 1.0,
                                 "active_alerts": 1}},
            "asr": {"rejected": {"not_audio": 1}, "rtf": 0.2,
                    "queue": {"per_stream_s": {"mic1": 1.5}}},
            "llm": {"analysis": {"prefix_hit_rate": 0.9},
                    "engine": {"prefix_cache_hit_rate": 0.8, "spec_acceptance_rate": 0.4,
                               "spec_mean_accepted_length": 1.8}},
        },
    )  # fmt: skip
    emitted = emitted_metrics(Status.model_validate(doc), histograms)
    documented = documented_metrics()
    missing = sorted(set(documented) - set(emitted))
    assert missing == [], missing
    assert sorted(set(emitted) - set(documented)) == []
    wrong = {
        name: (documented[name], got)
        for name, got in emitted.items()
        if documented[name][1] != got[1] or documented[name][0] not in ("", got[0])
    }
    assert wrong == {}
