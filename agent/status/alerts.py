"""`status.detect`, `status.alerts` and `status.errors`: what both tiers found, the alert
events they made, and the error events reported on `<prefix>/errors` (agent.stats)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["AlertsStatus", "DetectStatus", "ErrorsStatus", "LatencySummary"]


class DetectStatus(StatusModel):
    keyword_matches: int = Field(title="Keyword matches", description="Keyword-tier matches.")
    llm_faults: int = Field(
        title="LLM faults", description="Faults the LLM reported and the checks accepted."
    )
    errors: int = Field(title="Errors", description="Segments whose detection failed (a bug).")


class LatencySummary(StatusModel):
    """A latency's recent percentiles (the histogram is on /metrics)."""

    count: int = Field(title="Count", description="Observations since the start.")
    p50_s: float | None = Field(title="p50 (s)", description="Recent median; null before one.")
    p95_s: float | None = Field(title="p95 (s)", description="Recent p95; null before one.")


class AlertsStatus(StatusModel):
    events: dict[str, int] = Field(
        title="Events", description="Alert lifecycle events, by type (`new`, `update`, `end`)."
    )
    published: int = Field(title="Published", description="Alert events the broker acknowledged.")
    publish_failures: int = Field(
        title="Publish failures", description="Alert publishes not acknowledged in time."
    )
    publish_refused: dict[str, int] = Field(
        title="Publishes refused",
        description="Alert publishes the broker answered with a failure reason code (MQTT 5, "
        "by reason: `Not authorized` from an ACL, `Quota exceeded`...): the row stays and is "
        "retried with backoff.",
    )
    last_refusal: str | None = Field(
        title="Last refusal",
        description="The latest refusal: topic, reason code and reason; null if none.",
    )
    by_fault: dict[str, int] = Field(
        title="By fault",
        description="New alerts per fault code; every fault of the catalogue from the start, "
        "at 0 (an LLM's `other:<label>` counts as `other`).",
    )
    verdicts: dict[str, int] = Field(
        title="Verdicts",
        description="Keyword alerts by the slow tier's verdict (docs/mqtt.md): `confirmed` "
        "when it came, `unreviewed` when the alert ended without one.",
    )
    time_to_verdict: LatencySummary = Field(
        title="Time to verdict",
        description="A keyword alert's `new` to the slow tier's verdict on it.",
    )
    segment_to_alert: dict[str, LatencySummary] = Field(
        title="Segment to alert",
        description="By source (`keyword`, `llm`): a segment's arrival to the new alert it "
        "raised, committed to the outbox.",
    )


class ErrorsStatus(StatusModel):
    reported: int = Field(title="Reported", description="Error events published.")
    suppressed: int = Field(title="Suppressed", description="Error events over the rate limit.")
