"""The base of every status section: unknown keys are refused, a snapshot is frozen.

A field that the service leaves out in some states (not null: absent) has the default
None and its description says when it is absent; `Status.document()` dumps only the keys
that were given (`exclude_unset`), so the published JSON has exactly the producers' keys.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StatusModel"]


class StatusModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())
