"""Draw the alarm state machine (docs/alarms.png) from its own table, pipelines.alarms.TRANSITIONS.

Each state is a box at a fixed place; each row of the table is an arrow labelled with its
trigger. The four `suppress` rows (every listed state -> suppressed_by_design) are drawn as
arrows too, so a row added to the table shows up here without touching this script; a
state added to the table without a place below fails loudly.

    .venv/bin/python bench/alarms/draw_states.py            # writes docs/alarms.png
    .venv/bin/python bench/alarms/draw_states.py --out x.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipelines.alarms import LISTED, TRANSITIONS, AlarmState, Trigger  # noqa: E402

# Where each state sits (x, y), and how far each arrow bends (0: straight).
PLACES: dict[AlarmState, tuple[float, float]] = {
    AlarmState.normal: (3.4, 0.3),
    AlarmState.unack_active: (3.4, 3.6),
    AlarmState.ack_active: (6.8, 2.0),
    AlarmState.unack_cleared: (0.0, 2.0),
    AlarmState.shelved: (3.4, 6.2),
    AlarmState.suppressed_by_design: (8.4, 5.0),
}
BEND: dict[tuple[AlarmState, Trigger], float] = {
    (AlarmState.shelved, Trigger.unshelve): 0.3,
    (AlarmState.unack_active, Trigger.shelve): 0.3,
    (AlarmState.shelved, Trigger.unshelve_quiet): 0.55,
    (AlarmState.ack_active, Trigger.shelve): 0.25,
    (AlarmState.unack_cleared, Trigger.suppress): -0.45,
    (AlarmState.shelved, Trigger.suppress): 0.15,
    (AlarmState.unack_active, Trigger.suppress): 0.1,
}


def edges() -> list[tuple[AlarmState, Trigger, AlarmState]]:
    """The table's rows as (from, trigger, to), in the table's order."""
    return [(src, trig, dst) for (src, trig), dst in TRANSITIONS.items()]


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    missing = {s for e in edges() for s in (e[0], e[2])} - PLACES.keys()
    if missing:
        raise SystemExit(f"no place for state(s) {sorted(m.value for m in missing)}")
    fig, ax = plt.subplots(figsize=(11, 7.2), dpi=110)
    w, h = 2.1, 0.72
    boxes = {}
    for state, (x, y) in PLACES.items():
        listed = state in LISTED
        fill = "#eef2f7" if listed else "#ffffff"
        boxes[state] = ax.add_patch(FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
            fc="#fde2c8" if state is AlarmState.unack_active else fill,
            ec="#333333", lw=1.6 if listed else 1.0, zorder=2,
        ))  # fmt: skip
        ax.text(x, y, state.value, ha="center", va="center", fontsize=11, zorder=3,
                weight="bold" if listed else "normal")  # fmt: skip
    for src, trig, dst in edges():
        (x0, y0), (x1, y1) = PLACES[src], PLACES[dst]
        rad = BEND.get((src, trig), 0.0)
        arrow = FancyArrowPatch(
            (x0, y0), (x1, y1), connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
            mutation_scale=16, lw=1.3, color="#888888" if trig is Trigger.suppress else "#1f4e79",
            patchA=boxes[src], patchB=boxes[dst], shrinkA=2, shrinkB=2, zorder=1,
        )  # fmt: skip
        ax.add_patch(arrow)
        # The label at the arc's middle: the chord's midpoint pushed out by the bend.
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        lx, ly = mx + rad * (y1 - y0) * 0.5, my - rad * (x1 - x0) * 0.5
        ax.text(lx, ly, trig.value, ha="center", va="center", fontsize=9, zorder=4,
                color="#555555" if trig is Trigger.suppress else "#1f4e79",
                bbox={"fc": "white", "ec": "none", "pad": 1.2})  # fmt: skip
    ax.set_xlim(-1.4, 9.8)
    ax.set_ylim(-0.3, 6.9)
    ax.set_axis_off()
    ax.set_title(
        "Alarm states (ISA-18.2), drawn from pipelines.alarms.TRANSITIONS\n"
        "bold: on the alarm list; an alert is raised unack_active; suppress: config "
        "switched the fault off",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out} ({len(edges())} transitions, {len(PLACES)} states)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "alarms.png")
    draw(ap.parse_args().out)


if __name__ == "__main__":
    main()
