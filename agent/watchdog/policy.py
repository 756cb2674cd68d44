"""Headroom levels with hysteresis: ok, warn (shed load), critical (restart a rung down).

A level is entered when any figure crosses its threshold, and left only when every figure
is clear of it by the hysteresis margin: MemAvailable hovering at the warn line must not
pause and resume analyses every second.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from agent.watchdog.probes import MemorySample
from agent.watchdog.settings import WatchdogSettings

__all__ = ["Assessment", "HeadroomPolicy", "Level"]


class Level(IntEnum):
    ok = 0
    warn = 1
    critical = 2


@dataclass(frozen=True)
class Assessment:
    level: Level
    previous: Level
    reasons: tuple[str, ...]  # why the level is above ok (empty at ok)
    entered: Level  # the level this sample reaches by itself, without hysteresis

    @property
    def changed(self) -> bool:
        return self.level != self.previous


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class HeadroomPolicy:
    def __init__(self, settings: WatchdogSettings) -> None:
        self.settings = settings
        self.level = Level.ok

    def assess(self, sample: MemorySample) -> Assessment:
        entered, reasons = self._level(sample, margin=0.0)
        held, held_reasons = self._level(sample, margin=self.settings.hysteresis)
        previous = self.level
        level = max(entered, min(previous, held))
        self.level = Level(level)
        why = reasons if entered >= level else held_reasons
        return Assessment(self.level, previous, tuple(why) if self.level else (), entered)

    def _level(self, s: MemorySample, *, margin: float) -> tuple[Level, list[str]]:
        """The level the sample is at with thresholds widened by `margin` (0: entering;
        the hysteresis: what it takes to leave)."""
        cfg = self.settings
        crit: list[str] = []
        warn: list[str] = []

        def below(value: int | None, threshold: int | None, name: str, out: list[str]) -> None:
            if value is not None and threshold is not None and value < threshold * (1 + margin):
                out.append(f"{name} {_gib(value)} < {_gib(threshold)}")

        def above(value: float | None, threshold: float | None, name: str, out: list[str]) -> None:
            if value is not None and threshold is not None and value >= threshold * (1 - margin):
                out.append(f"{name} {value:.1f}% >= {threshold:.1f}%")

        below(s.mem_available, cfg.host_critical_bytes, "MemAvailable", crit)
        below(s.gpu_free, cfg.gpu_critical_bytes, "GPU free", crit)
        above(s.psi_full_avg10, cfg.psi_critical_full_avg10, "memory pressure full", crit)
        if crit:
            return Level.critical, crit
        below(s.mem_available, cfg.host_warn_bytes, "MemAvailable", warn)
        below(s.gpu_free, cfg.gpu_warn_bytes, "GPU free", warn)
        above(s.psi_some_avg10, cfg.psi_warn_some_avg10, "memory pressure some", warn)
        return (Level.warn, warn) if warn else (Level.ok, [])
