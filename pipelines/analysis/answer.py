"""One analysis's answer: asked under a deadline, parsed and checked, cut down to the news.

The scheduler (pipelines/analysis/scheduler.py) runs an analysis as: feed the window
(pipelines/analysis/window.py), `ask` the engine, `judge` the answer (every quote checked by
pipelines.evidence), deliver what `news` keeps, `remember` it, and report.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from pipelines.analysis.protocols import AnalysisLlm, LlmAnswer
from pipelines.analysis.settings import AnalysisSettings
from pipelines.analysis.state import StreamState
from pipelines.context import ContextLine
from pipelines.detect import FaultRule
from pipelines.evidence import AcceptedFault, parse_answer, verify

__all__ = ["AnalysisReport", "ask", "judge", "news", "remember"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class AnalysisReport:
    stream_id: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    latency_s: float
    dropped_lines: int
    dropped_tokens: int
    summary: str | None
    accepted: tuple[AcceptedFault, ...]
    new_faults: tuple[AcceptedFault, ...]
    rejected: Counter[str]
    valid: bool
    finish_reason: str | None
    answer: str


async def ask(
    llm: AnalysisLlm,
    st: StreamState,
    prompt: list[int],
    settings: AnalysisSettings,
    schema: Mapping[str, Any],
) -> LlmAnswer:
    """The engine's answer to the analysis prompt, under the schema and the deadline.

    Raises:
        asyncio.TimeoutError: past analysis_timeout_s (counted and logged here).
        LlmUnavailable: the engine is not serving.
    """
    try:
        return await asyncio.wait_for(
            llm.complete(prompt, max_tokens=settings.max_output_tokens, json_schema=schema),
            settings.analysis_timeout_s,
        )
    except asyncio.TimeoutError:
        st.timeouts += 1
        log.error(
            "analysis.timeout",
            stream_id=st.stream_id,
            deadline_s=settings.analysis_timeout_s,
            prompt_tokens=len(prompt),
        )
        raise


def judge(
    answer: LlmAnswer,
    st: StreamState,
    lines: Sequence[ContextLine],
    catalogue: Mapping[str, FaultRule],
    settings: AnalysisSettings,
    *,
    disabled: Collection[str],
) -> tuple[bool, tuple[AcceptedFault, ...], Counter[str]]:
    """(valid, accepted faults, rejections by reason) of one answer on the window's
    `lines`; an answer that is not the schema's JSON is invalid (counted in `st`)."""
    rejected: Counter[str] = Counter()
    # The raw answer, for whoever measures the model (bench/quality runs at debug).
    log.debug("analysis.answer", stream_id=st.stream_id, answer=answer.text[:2000])
    try:
        parsed = parse_answer(answer.text)
    except ValueError as exc:
        st.invalid_answers += 1
        log.warning(
            "analysis.invalid_answer",
            stream_id=st.stream_id,
            finish_reason=answer.finish_reason,
            error=str(exc),
            answer=answer.text[:200],
        )
        return False, (), rejected
    verdict = verify(
        parsed,
        lines,
        catalogue,
        disabled=disabled,
        allow_other=settings.allow_other,
        other_max_severity=settings.other_max_severity,
        min_quote_chars=settings.min_quote_chars,
        require_topic_word=settings.require_topic_word,
    )
    st.rejected.update(verdict.rejected)
    return True, verdict.accepted, verdict.rejected


def news(st: StreamState, accepted: Sequence[AcceptedFault]) -> tuple[AcceptedFault, ...]:
    """The accepted faults not reported before. An old quote is not news: each (fault,
    segment) reaches the tracker once, so a fault quoted from the window again and again
    does not keep its alert alive."""
    return tuple(f for f in accepted if _report_key(f) not in st.reported)


def remember(
    st: StreamState, delivered: Sequence[AcceptedFault], lines: Sequence[ContextLine]
) -> None:
    """Record `delivered` as reported (call once the sink took them: a sink that failed, or
    was cancelled, gets them again), forgetting keys of segments the window let go."""
    st.reported.update(_report_key(f) for f in delivered)
    held = {line.seq for line in lines}
    st.reported = {key for key in st.reported if key[1] in held}
    st.accepted += len(delivered)


def _report_key(fault: AcceptedFault) -> tuple[str, int]:
    """What makes a fault news: its code and segment. Every `other` label counts as one
    code, so the same segment relabelled at the next analysis is not a new alert."""
    code = fault.code.split(":", 1)[0]
    return code, fault.line.seq
