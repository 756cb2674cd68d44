"""What every section of the configuration shares: the strict base model and located errors."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

__all__ = ["FLEET_NAME", "TOPIC_LEVEL", "LocatedError", "SectionModel"]

TOPIC_LEVEL = re.compile(r"^[^#+\x00]+$")
FLEET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a group or device id in fleet topics


class LocatedError(ValueError):
    """A cross-field error that knows which key it is about, so the loader can point at that
    key's line instead of at the whole file."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


class SectionModel(BaseModel):
    """Every section: unknown keys fail validation, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())
