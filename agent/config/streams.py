"""`streams:`: per-stream settings, alert timing and their overrides."""

from __future__ import annotations

from pydantic import Field

from agent.config.base import SectionModel
from agent.config.merge import deep_merge

__all__ = ["AlertOverride", "AlertSettings", "StreamOverride", "StreamSettings", "StreamsSettings"]


class AlertSettings(SectionModel):
    debounce_s: float = Field(
        10.0,
        ge=0,
        title="Debounce",
        description="Repeated matches of an active alert within this window fold into one update.",
    )
    quiet_end_s: float = Field(
        120.0,
        gt=0,
        title="Quiet period",
        description="An alert ends after this many seconds without a new match.",
    )
    max_evidence: int = Field(
        5, ge=1, le=50, title="Evidence kept", description="Most recent evidence items per alert."
    )


class StreamSettings(SectionModel):
    """Settings that may differ per stream; `streams.defaults` gives the global values."""

    language: str | None = Field(
        None,
        title="Language hint",
        description="Language of the stream (en, zh); None trusts each segment's `lang`.",
    )
    alerts: AlertSettings = Field(
        default_factory=AlertSettings, title="Alerts", description="Alert lifecycle timing."
    )
    disabled_faults: list[str] = Field(
        default_factory=list,
        title="Disabled faults",
        description="Fault codes never raised for this stream.",
    )


class AlertOverride(SectionModel):
    debounce_s: float | None = Field(None, ge=0, title="Debounce", description="See alerts.")
    quiet_end_s: float | None = Field(None, gt=0, title="Quiet period", description="See alerts.")
    max_evidence: int | None = Field(
        None, ge=1, le=50, title="Evidence kept", description="See alerts."
    )


class StreamOverride(SectionModel):
    """A partial StreamSettings: only the keys given replace the defaults."""

    language: str | None = Field(None, title="Language hint", description="See defaults.")
    alerts: AlertOverride | None = Field(None, title="Alerts", description="See defaults.")
    disabled_faults: list[str] | None = Field(
        None, title="Disabled faults", description="Replaces the default list."
    )


class StreamsSettings(SectionModel):
    defaults: StreamSettings = Field(
        default_factory=StreamSettings,
        title="Defaults",
        description="Settings for every stream.",
    )
    overrides: dict[str, StreamOverride] = Field(
        default_factory=dict,
        title="Per-stream overrides",
        description="Partial settings per stream id, merged over the defaults.",
    )

    def for_stream(self, stream_id: str) -> StreamSettings:
        """Effective settings of one stream: the defaults with its override merged over them."""
        override = self.overrides.get(stream_id)
        if override is None:
            return self.defaults
        merged = deep_merge(
            self.defaults.model_dump(mode="python"), override.model_dump(exclude_none=True)
        )
        return StreamSettings.model_validate(merged)
