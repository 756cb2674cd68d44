"""A long synthetic transcript stream of one factory line, for a rolling-context benchmark.

Hours of 5 s segments of routine talk (part counts, normal readings, forklifts, quality
checks, breaks, small talk) with a few percent of fillers, and faults that develop slowly,
the kind no single sentence states:

- bearing_noise: from ~15% of the shift, hints about spindle two ("the drive end sounds a
  bit rough", "a faint hum from spindle two") that grow more frequent and stronger; the
  literal "bearing noise" only now and then, in the second half.
- temperature_over_limit: motor three's casing temperature creeps up linearly from 61 C to
  92 C (limit 85 C), heard as readings ("motor three casing reads 74 degrees") and in other
  words ("running hot", "warm to the touch"); the literal "temperature over limit" exactly
  once, at the first mention after a reading above the limit.
- belt_slip: one short unrelated incident mid-shift, said outright once.

Ground truth (`SynthSegment.faults`): the fault codes a segment gives evidence of. A motor
three reading counts from 66 C (above the 52-63 C the line's other motors read); below
that it is a plain reading, part of the baseline, with no fault. The chance that a segment
talks about a developing fault rises linearly from 1% to 15% over the shift.

Deterministic: one `random.Random(seed)`, no global state; the same arguments give the same
stream.

    python -m bench.context.synth --hours 2 --out shift.jsonl [--seed 0] [--seg-s 5]

writes one `payload()` JSON per line (the MQTT transcript body) and prints a one-line
summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BEARING",
    "BELT",
    "FAULT_CODES",
    "TEMPERATURE",
    "SynthSegment",
    "generate_shift",
    "main",
    "summarize",
]

BEARING = "bearing_noise"
TEMPERATURE = "temperature_over_limit"
BELT = "belt_slip"
FAULT_CODES = (BEARING, TEMPERATURE, BELT)

TEMP_START_C = 61.0
TEMP_END_C = 92.0
TEMP_LIMIT_C = 85.0
TEMP_EVIDENCE_C = 66.0  # above what the other motors read: the drift has become evidence
BEARING_ONSET = 0.15  # fraction of the shift before the first hint
BELT_WINDOW = (0.45, 0.55)  # the incident falls somewhere in here
RATE_START = 0.01  # chance that a segment talks about a developing fault, at the start
RATE_END = 0.15  # ... and at the end
FILLER_RATE = 0.03
MIN_WORDS = 8
MAX_WORDS = 30


@dataclass(frozen=True)
class SynthSegment:
    """One transcript segment and the faults it gives evidence of (ground truth)."""

    stream_id: str
    seq: int
    start: float
    end: float
    text: str
    lang: str
    faults: tuple[str, ...]

    def payload(self) -> dict[str, object]:
        """The MQTT transcript JSON body (`pipelines.ingest.Segment`); no ground truth."""
        return {
            "stream_id": self.stream_id,
            "seq": self.seq,
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "lang": self.lang,
        }


# -- vocabulary -----------------------------------------------------------------------------

NAMES = (
    "Maria", "Dev", "Tomasz", "Priya", "Ken", "Aisha", "Luis", "Sam", "Jonah", "Mei",
    "Greg", "Nadia", "Omar", "Hannah", "Raj", "Beth",
)  # fmt: skip
NUMBERS = ("one", "two", "four", "five", "six", "seven", "eight")  # "three" is motor three's
PARTS = (
    "brackets", "housings", "flanges", "gaskets", "shafts", "end caps", "covers", "clips",
    "spacers", "hinge plates", "mounting rails", "pump bodies",
)  # fmt: skip
OPENERS = (
    "", "", "", "", "so ", "alright, ", "okay so ", "yeah, ", "hey {name}, ", "{name}, ",
    "right, ", "listen, ", "um, ",
)  # fmt: skip
ROUTINE = (
    # part counts and the plan
    "we're at {count} {part} for the shift, about {ahead} ahead of plan",
    "station {station} has done {count} {part} since the start of the shift",
    "the board says {count} good {part} and {scrap} scrap so far",
    "can you log {count} {part} off station {station} before the hour",
    "next batch is {part}, {batch} of them, the order came in this morning",
    "we need {batch} more {part} before the truck at {clock}",
    "cycle time on station {station} is {cycle} seconds, right on target",
    "the {part} order got bumped, we finish the {part2} first",
    # normal readings
    "air pressure on the main header is {pressure} bar, steady",
    "hydraulic pressure on the press is {hyd} bar, same as yesterday",
    "conveyor speed is {speed} meters a minute, nothing changed",
    "spindle {spindle} is at {rpm} rpm, load is about {load} percent",
    "motor {motor} reads {cool} degrees on the casing, normal for this time of day",
    "coolant is at {coolant} degrees and the level is fine",
    "I checked motor {motor}, {cool} degrees, fan cover is clean",
    "oven zone {station} is holding at {oven} degrees, right where it should be",
    "chiller outlet is {coolant} degrees, the gauge has not moved all morning",
    "humidity in the hall is {humid} percent, the paint booth likes that",
    # forklift and logistics
    "forklift is coming through bay {station}, watch the walkway",
    "{name2} is bringing {pallets} pallets of {part} from the warehouse",
    "can somebody move that empty pallet out of aisle {station}",
    "the forklift battery is at {load} percent, swap it at break",
    "the {part} bins at station {station} are almost empty, call the tugger",
    "the truck from the supplier is late again, maybe {minutes} minutes",
    "stack the finished {part} by the dock door, two high, not three",
    # quality checks
    "quality check on the last {part}, all within tolerance",
    "bore diameter is {dim} millimeters, spec is {dim} plus or minus two hundredths",
    "torque check on station {station}, {torque} newton meters, good",
    "{name2} pulled five {part} for the audit, all passed",
    "first article on the new {part} is signed off, you can run",
    "the gauge block was calibrated last week, readings are good",
    "visual check on the welds, they look clean, no spatter",
    "the surface finish on the {part} looks better since the new inserts",
    "put the red tag ones in the quarantine cage, {name2} will look later",
    # breaks and shift chatter
    "break is at {clock}, I'll go second if that's okay",
    "who took my coffee mug from the break room again",
    "{name2} is covering station {station} while I grab lunch",
    "shift handover is at {clock}, write it up on the board",
    "did you see the game last night, unbelievable finish",
    "my kid has a school thing tonight so I'm leaving right at {clock}",
    "the canteen has soup again, third day in a row",
    "I'm back, thanks for covering, anything happen while I was out",
    "{name2} said the overtime sheet is up for next weekend",
    "it's cold in here today, somebody left the dock door open",
    "we're short one person on the line, {name2} called in sick",
    "new guy starts Monday, {name2} is going to train him on station {station}",
    # maintenance small talk
    "maintenance greased the slides on station {station} this morning",
    "the filter on the air dryer was changed last week",
    "{name2} from maintenance is coming to look at the guard door latch",
    "the light over station {station} is flickering, I put in a ticket",
    "tool change on station {station} is done, new insert is in",
    "the lube reservoir on the press is topped up",
    "planned maintenance on the paint line is next Tuesday",
    "I tightened the guard bolts on station {station}, they were a bit loose",
    "the safety scanner on cell {station} tested fine at the start of shift",
    "we swapped the gripper fingers on the robot, picks look good now",
)  # fmt: skip
TAILS = (
    "", "", "", "", "", ", I think", ", give or take", " for now", ", just so you know",
    ", okay", ", yeah", " by the way",
)  # fmt: skip
FILLERS = (
    "okay", "yeah", "uh huh", "mm", "right", "okay okay", "yep", "uh", "got it", "sure",
    "mhm", "alright",
)  # fmt: skip

# Bearing hints about spindle two, by stage (subtle -> clear), none with a catalogue phrase.
BEARING_SUBTLE = (
    "the drive end sounds a bit rough",
    "there's a faint hum from spindle two",
    "spindle two has a slight whine when it spins up",
    "does spindle two sound different to you, kind of a low hum",
    "the drive end of spindle two sounds a little off today",
    "I keep hearing a soft ticking near spindle two, maybe it's nothing",
    "spindle two sounds a touch rougher than spindle one",
)
BEARING_MODERATE = (
    "that hum from spindle two is louder than it was this morning",
    "spindle two drive end is rumbling when it ramps up",
    "there's a rough ticking from the spindle two housing now",
    "spindle two sounds gravelly at full speed",
    "the drive end on spindle two is humming again, more than before",
    "I can hear spindle two from the next station now, that low rumble",
    "spindle two whines every time it spins up, it didn't do that yesterday",
)
BEARING_STRONG = (
    "spindle two is really growling now, you can hear it over the press",
    "you can feel spindle two rumbling through the guard",
    "that grinding from the drive end of spindle two is getting worse",
    "spindle two sounds like gravel in a can, it's bad",
    "the drive end on spindle two is screeching when it ramps up",
    "spindle two is rattling the whole housing, that's not right",
    "put your hand on the spindle two guard, it's shaking and growling",
)
BEARING_LITERAL = (
    "I'd log that as bearing noise on spindle two, drive end",
    "sounds like bearing abnormal noise on the spindle two drive end",
    "write it up, bearing noise on spindle two, getting louder",
)

# Motor three's temperature: readings (any time) and other words (once warm).
TEMP_READING = (
    "motor three casing reads {t} degrees",
    "logged motor three at {t} C on the round",
    "the IR gun says {t} on motor three",
    "motor three is at {t} degrees on the casing",
    "checked motor three, {t} degrees",
    "motor three casing temperature, {t} degrees",
)
TEMP_WARM = (  # evidence, mild
    "motor three housing is warm to the touch, warmer than the others",
    "motor three feels a bit warm, {t} on the gun",
    "motor three reads {t}, that's up from this morning",
    "motor three is warmer than motor two, {t} against {cool}",
)
TEMP_HOT = (  # evidence, strong
    "motor three is running hot again, {t} degrees",
    "you can't keep your hand on motor three for long",
    "motor three fan cover is hot, smells a bit like hot paint",
    "motor three is really hot, {t} on the casing, limit is 85",
    "motor three keeps climbing, {t} now, it was in the sixties this morning",
)
TEMP_LITERAL_PHRASE = "temperature over limit"  # said once, never before the limit
TEMP_LITERAL = (
    "motor three at {t}, that's temperature over limit, the limit is 85, call maintenance",
)

BELT_INCIDENT = (
    "{name}, belt slip on conveyor one, the parts are bunching at the transfer, "
    "I'm tensioning it now"
)
BELT_FOLLOW_UP = (
    "okay conveyor one is tensioned, tracking straight again, parts spacing looks right"
)


# -- generation -----------------------------------------------------------------------------


def _fills(rng: random.Random) -> dict[str, object]:
    part, part2 = rng.sample(PARTS, 2)
    name, name2 = rng.sample(NAMES, 2)
    dim = rng.choice((12, 16, 20, 25, 32, 40, 48))
    return {
        "name": name,
        "name2": name2,
        "part": part,
        "part2": part2,
        "station": rng.choice(NUMBERS),
        "motor": rng.choice(("one", "two", "four")),
        "spindle": rng.choice(("one", "three", "four")),
        "count": rng.randrange(40, 1200),
        "ahead": rng.randrange(5, 60),
        "scrap": rng.randrange(0, 9),
        "batch": rng.choice((50, 80, 100, 120, 150, 200, 240, 300, 500)),
        "clock": f"{rng.randrange(1, 12)}:{rng.choice(('00', '15', '30', '45'))}",
        "cycle": rng.randrange(28, 75),
        "pressure": f"{rng.uniform(5.8, 6.4):.1f}",
        "hyd": rng.randrange(175, 190),
        "speed": f"{rng.uniform(11.5, 12.5):.1f}",
        "rpm": rng.randrange(2900, 3100, 10),
        "load": rng.randrange(40, 80),
        "cool": rng.randrange(52, 64),
        "coolant": rng.randrange(18, 24),
        "oven": rng.randrange(178, 184),
        "humid": rng.randrange(38, 52),
        "pallets": rng.choice(("two", "three", "four", "five", "six")),
        "minutes": rng.choice((10, 15, 20, 30, 45)),
        "dim": dim,
        "torque": rng.randrange(22, 48),
    }


def _sentence(rng: random.Random, templates: Sequence[str], fills: dict[str, object]) -> str:
    return rng.choice(templates).format(**fills)


def _spoken(rng: random.Random, body: str, fills: dict[str, object]) -> str:
    """An opener and a tail around one clause, capitalized and punctuated like ASR output."""
    text = rng.choice(OPENERS).format(**fills) + body + rng.choice(TAILS)
    return text[0].upper() + text[1:] + "."


def _words(text: str) -> int:
    return len(text.split())


def _routine(rng: random.Random) -> str:
    fills = _fills(rng)
    text = _spoken(rng, _sentence(rng, ROUTINE, fills), fills)
    while _words(text) < MIN_WORDS or rng.random() < 0.3:
        more = _spoken(rng, _sentence(rng, ROUTINE, _fills(rng)), fills)
        if _words(text) + _words(more) > MAX_WORDS:
            if _words(text) >= MIN_WORDS:
                break
            continue
        text = f"{text} {more}"
    return text


def _embed(rng: random.Random, clause: str) -> str:
    """A fault remark, sometimes next to routine talk, so it does not stand out."""
    fills = _fills(rng)
    text = _spoken(rng, clause, fills)
    if rng.random() < 0.4:
        other = _spoken(rng, _sentence(rng, ROUTINE, fills), fills)
        if _words(text) + _words(other) <= MAX_WORDS:
            text = f"{other} {text}" if rng.random() < 0.5 else f"{text} {other}"
    return text


def _motor_three_c(progress: float, rng: random.Random) -> int:
    drift = TEMP_START_C + (TEMP_END_C - TEMP_START_C) * progress
    return round(drift + rng.uniform(-0.6, 0.6))


def _bearing_clause(rng: random.Random, progress: float) -> str:
    grown = (progress - BEARING_ONSET) / (1.0 - BEARING_ONSET)  # 0 at onset, 1 at the end
    if grown >= 0.4 and rng.random() < 0.07:
        return rng.choice(BEARING_LITERAL)
    # Weights slide from subtle to strong as the fault grows.
    weights = (max(0.05, 1.0 - 1.6 * grown), 1.0 - abs(grown - 0.5), max(0.0, 2.0 * grown - 0.6))
    stage = rng.choices((BEARING_SUBTLE, BEARING_MODERATE, BEARING_STRONG), weights)[0]
    return rng.choice(stage)


def _developing(
    rng: random.Random, progress: float, *, literal_ok: bool
) -> tuple[str, tuple[str, ...]]:
    """A remark about spindle two or motor three, and the faults it is evidence of.

    `literal_ok`: "temperature over limit" has not been said yet (it is said once).
    """
    temp = _motor_three_c(progress, rng)
    fills: dict[str, object] = {"t": temp, "cool": rng.randrange(55, 63)}
    if progress >= BEARING_ONSET and rng.random() < 0.5:
        clause = _bearing_clause(rng, progress)
        if progress > 0.7 and temp >= TEMP_EVIDENCE_C and rng.random() < 0.12:
            return f"{clause}, and {_sentence(rng, TEMP_HOT, fills)}", (BEARING, TEMPERATURE)
        return clause, (BEARING,)
    if temp > TEMP_LIMIT_C and literal_ok:
        return _sentence(rng, TEMP_LITERAL, fills), (TEMPERATURE,)
    if temp < TEMP_EVIDENCE_C:  # motor three still normal: a plain reading, the baseline
        return _sentence(rng, TEMP_READING, fills), ()
    if rng.random() < 0.5:
        return _sentence(rng, TEMP_READING, fills), (TEMPERATURE,)
    return _sentence(rng, TEMP_HOT if temp >= 76 else TEMP_WARM, fills), (TEMPERATURE,)


def generate_shift(
    hours: float,
    *,
    seg_s: float = 5.0,
    seed: int = 0,
    stream_id: str = "line3-mic1",
    start_epoch: float = 1_790_000_000.0,
) -> list[SynthSegment]:
    """`hours` of contiguous `seg_s` segments of one line's talk, seq from 0; deterministic."""
    if hours <= 0 or seg_s <= 0:
        raise ValueError("hours and seg_s must be positive")
    count = round(hours * 3600 / seg_s)
    if count < 1:
        raise ValueError(f"{hours} h of {seg_s} s segments is not one segment")
    rng = random.Random(seed)
    belt_at = rng.randrange(
        min(count - 1, int(count * BELT_WINDOW[0])),
        max(int(count * BELT_WINDOW[0]) + 1, int(count * BELT_WINDOW[1])),
    )
    over_limit_said = False
    segments: list[SynthSegment] = []
    for seq in range(count):
        progress = seq / count
        faults: tuple[str, ...] = ()
        if seq == belt_at:
            fills = _fills(rng)
            text = _spoken(rng, BELT_INCIDENT.format(**fills), fills)
            faults = (BELT,)
        elif seq == belt_at + 1:
            text = _spoken(rng, BELT_FOLLOW_UP, _fills(rng))
        elif rng.random() < RATE_START + (RATE_END - RATE_START) * progress:
            clause, faults = _developing(rng, progress, literal_ok=not over_limit_said)
            over_limit_said = over_limit_said or TEMP_LITERAL_PHRASE in clause
            text = _embed(rng, clause)
        elif rng.random() < FILLER_RATE:
            text = rng.choice(FILLERS)
        else:
            text = _routine(rng)
        segments.append(
            SynthSegment(
                stream_id=stream_id,
                seq=seq,
                start=start_epoch + seq * seg_s,
                end=start_epoch + (seq + 1) * seg_s,
                text=text,
                lang="en",
                faults=faults,
            )
        )
    return segments


def summarize(segments: Sequence[SynthSegment]) -> str:
    """One line: segments, words, fault mentions by code."""
    mentions = Counter(code for s in segments for code in s.faults)
    by_code = " ".join(f"{code}={mentions.get(code, 0)}" for code in FAULT_CODES)
    with_fault = sum(1 for s in segments if s.faults)
    words = sum(_words(s.text) for s in segments)
    return f"segments={len(segments)} words={words} fault_segments={with_fault} mentions: {by_code}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.context.synth",
        description="Write a synthetic factory-line transcript stream as JSON lines.",
    )
    parser.add_argument("--hours", type=float, default=2.0, help="length of the shift")
    parser.add_argument("--seg-s", type=float, default=5.0, help="seconds per segment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream-id", default="line3-mic1")
    parser.add_argument("--start-epoch", type=float, default=1_790_000_000.0)
    parser.add_argument("--out", default="-", help="output JSONL file ('-': stdout)")
    args = parser.parse_args(argv)
    segments = generate_shift(
        args.hours,
        seg_s=args.seg_s,
        seed=args.seed,
        stream_id=args.stream_id,
        start_epoch=args.start_epoch,
    )
    lines = "".join(json.dumps(s.payload(), ensure_ascii=False) + "\n" for s in segments)
    if args.out == "-":
        sys.stdout.write(lines)
    else:
        Path(args.out).write_text(lines, encoding="utf-8")
    print(summarize(segments), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
