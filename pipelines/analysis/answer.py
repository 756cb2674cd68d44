"""One analysis's answer: asked under a deadline, parsed and checked, cut down to the news.

The scheduler (pipelines/analysis/scheduler.py) runs an analysis as: feed the window
(pipelines/analysis/window.py), `ask` the engine, `judge` the answer (every pointed line checked by
pipelines.evidence), deliver what `news` keeps, `remember` it, and report.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from pipelines.analysis.confidence import fault_confidences
from pipelines.analysis.protocols import AnalysisLlm, LlmAnswer
from pipelines.analysis.settings import AnalysisSettings
from pipelines.analysis.state import StreamState
from pipelines.context import ContextLine
from pipelines.detect import FaultRule
from pipelines.evidence import AcceptedFault, EvidenceRules, parse_answer, verify

__all__ = ["AnalysisReport", "ask", "evidence_rules", "judge", "news", "remember"]

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
            llm.complete(
                prompt, max_tokens=settings.max_output_tokens, json_schema=schema, logprobs=True
            ),
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
    confidences = fault_confidences(answer.tokens, len(parsed.faults))
    if confidences is None and parsed.faults:
        st.unscored_answers += 1  # no token probabilities: the thresholds cannot apply
        log.warning(
            "analysis.unscored_answer",
            stream_id=st.stream_id,
            faults=len(parsed.faults),
            reason="the engine reported no token probabilities for it",
        )
    verdict = verify(parsed, lines, evidence_rules(settings, catalogue, disabled), confidences)
    st.rejected.update(verdict.rejected)
    return True, verdict.accepted, verdict.rejected


def evidence_rules(
    settings: AnalysisSettings, catalogue: Mapping[str, FaultRule], disabled: Collection[str]
) -> EvidenceRules:
    """The evidence rules the `llm:` settings ask for, on this catalogue and stream."""
    return EvidenceRules(
        catalogue=catalogue,
        disabled=disabled,
        allow_other=settings.allow_other,
        other_max_severity=settings.other_max_severity,
        require_topic_word=settings.require_topic_word,
        reject_all_clear=settings.reject_all_clear,
        min_confidence=settings.min_confidence,
        confidence_by_code=settings.confidence,
    )


def news(st: StreamState, accepted: Sequence[AcceptedFault]) -> tuple[AcceptedFault, ...]:
    """The accepted faults not reported before. An old line is not news: each (fault,
    segment) reaches the tracker once, so a fault pointed at in the window again and again
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
