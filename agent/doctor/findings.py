"""What `agentctl doctor` reports: one `Finding` per check, gathered in a `Report`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["INSTALL_DOC", "Finding", "Report", "State"]

State = Literal["ok", "missing", "warn", "skip"]
INSTALL_DOC = "docs/install.md"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    area: str  # config, llm, asr, gpu, service, jetson, broker
    check: str  # what was looked for
    state: State
    detail: str
    hint: str | None = None  # what to do about it (missing and warn)


class Report(BaseModel):
    model_config = ConfigDict(frozen=True)

    config: str
    cache_dir: str
    findings: list[Finding]

    @property
    def missing(self) -> list[Finding]:
        return [f for f in self.findings if f.state == "missing"]

    @property
    def config_invalid(self) -> bool:
        return any(f.area == "config" and f.state == "missing" for f in self.findings)
