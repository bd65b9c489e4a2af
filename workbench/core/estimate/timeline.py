"""A pipeline schedule's timeline: when each work item runs, the bubble, activations in flight.

`simulate(schedule, forward, backward, weight=0, p2p=0)` runs a `pipeline.Schedule` op by
op. Each stage runs its table row in order, one item at a time; an item starts when its
stage is free and what it reads has arrived:

- F of microbatch m on virtual stage g after F of m on g-1, plus the send between them;
- B of m on g after F of m on g, and after B of m on g+1 plus the send back;
- W of m on g after B of m on g.

A send between chunks on one stage is free. Durations are per stage, or per stage and
chunk; in a schedule without W the backward item takes `backward + weight`, so one set of
durations prices split and unsplit schedules alike.

Activations in flight: a microbatch's chunk holds its activations from the start of its F
to the end of its last backward pass on that stage: W where the backward is split, since
the weight gradient x^T dy reads each layer's stored input x; `peak_to_b` also counts to the
end of B, what the B-only buffers (those dy reads alone) would hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.core.errors import InputError, given
from workbench.core.plan.schedule import Schedule, Work


@dataclass(frozen=True, slots=True)
class Slot:
    """One work item placed on the timeline: `work` on `stage` from `start` to `end` (s)."""

    stage: int
    work: Work
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """The simulated step of a schedule.

    `slots[s]`: stage s's items in table order. `busy[s]`: seconds it computes.
    `in_flight[s]`: (time, chunk activations held from then on), at every change.
    `peak_chunks[s]` / `peak_to_b[s]`: the most (microbatch, chunk) activations held, to the
    last backward pass / to B. Divide by the chunks per stage for full-stage microbatches
    (`peak_in_flight`).
    """

    schedule: Schedule
    slots: tuple[tuple[Slot, ...], ...]
    makespan: float
    busy: tuple[float, ...]
    in_flight: tuple[tuple[tuple[float, int], ...], ...]
    peak_chunks: tuple[int, ...]
    peak_to_b: tuple[int, ...]

    @property
    def idle(self) -> tuple[float, ...]:
        """Each stage's bubble: the seconds of the step it does not compute."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble(self) -> float:
        """Seconds the stages stand idle, added up over the stages."""
        return sum(self.idle)

    @property
    def bubble_share(self) -> float:
        """The share of the stages' time idle: bubble / (stages * makespan)."""
        total = self.schedule.stages * self.makespan
        return self.bubble / total if total else 0.0

    @property
    def peak_in_flight(self) -> tuple[float, ...]:
        """Per stage, the peak activations held in full-stage microbatches (chunks / v)."""
        return tuple(p / self.schedule.virtual_stages for p in self.peak_chunks)

    def __str__(self) -> str:
        s = self.schedule
        rows = [
            f"{s.kind} timeline: S={s.stages} M={s.microbatches} v={s.virtual_stages}: "
            f"step {self.makespan:.6g} s, bubble share {self.bubble_share:.3f}"
        ]
        for i in range(s.stages):
            rows.append(
                f"  stage {i}: busy {self.busy[i]:.6g} s, idle {self.idle[i]:.6g} s, "
                f"peak in flight {self.peak_in_flight[i]:.4g}"
            )
        return "\n".join(rows)


def simulate(
    schedule: Schedule,
    forward,
    backward,
    weight=0.0,
    p2p=0.0,
) -> Timeline:
    """The timeline of `schedule` with these durations in seconds.

    `forward`, `backward`, `weight`: one number, one per stage, or per stage one per chunk
    (backward is the input gradient where the schedule splits it, else B and W together with
    `weight`). `p2p`: seconds per send, one number or one per link s -> s+1 (S-1 links;
    S with chunks, the last link S-1 -> 0). An order in which stages wait on each other for
    ever raises `InputError` naming what each stage waits for.
    """
    if not isinstance(schedule, Schedule):
        raise InputError(
            f"simulate takes a pipeline Schedule, got {given(schedule)}; build one with "
            "pipeline.schedule(kind, stages, microbatches)"
        )
    S, v = schedule.stages, schedule.virtual_stages
    tf = _durations("forward", forward, S, v)
    tb = _durations("backward", backward, S, v)
    tw = _durations("weight", weight, S, v)
    if not schedule.split_backward:
        tb = tuple(
            tuple(b + w for b, w in zip(rb, rw, strict=True)) for rb, rw in zip(tb, tw, strict=True)
        )
    time = {"F": tf, "B": tb, "W": tw}
    link = _links(p2p, S, v)
    last = S * v - 1

    def needs(w: Work, s: int) -> list[tuple[tuple[str, int, int], float]]:
        g = schedule.virtual(s, w.chunk)
        if w.kind == "F":
            return [(("F", w.microbatch, g - 1), _send(link, g - 1, S))] if g else []
        if w.kind == "W":
            return [(("B", w.microbatch, g), 0.0)]
        out = [(("F", w.microbatch, g), 0.0)]
        return out + ([(("B", w.microbatch, g + 1), _send(link, g, S))] if g < last else [])

    ends: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * S, [0] * S
    slots: list[list[Slot]] = [[] for _ in range(S)]
    left = sum(len(row) for row in schedule.table)
    while left:
        moved = False
        for s, row in enumerate(schedule.table):
            while pos[s] < len(row):
                w = row[pos[s]]
                deps = needs(w, s)
                if any(key not in ends for key, _ in deps):
                    break
                start = max([free[s], *(ends[key] + delay for key, delay in deps)])
                end = start + time[w.kind][s][w.chunk]
                ends[(w.kind, w.microbatch, schedule.virtual(s, w.chunk))] = end
                slots[s].append(Slot(s, w, start, end))
                free[s], pos[s] = end, pos[s] + 1
                left, moved = left - 1, True
        if not moved:
            raise InputError(_deadlock(schedule, pos, needs, ends))
    makespan = max((slot.end for row in slots for slot in row), default=0.0)
    busy = tuple(sum(slot.end - slot.start for slot in row) for row in slots)
    flights = [_in_flight(row, schedule.split_backward) for row in slots]
    return Timeline(
        schedule,
        tuple(map(tuple, slots)),
        makespan,
        busy,
        tuple(f for f, _, _ in flights),
        tuple(p for _, p, _ in flights),
        tuple(b for _, _, b in flights),
    )


def _durations(name: str, value, S: int, v: int) -> tuple[tuple[float, ...], ...]:
    """`value` as per stage, per chunk seconds."""
    if _number(value):
        rows = [[value] * v for _ in range(S)]
    elif isinstance(value, Sequence) and len(value) == S:
        rows = [[x] * v if _number(x) else x for x in value]
    else:
        rows = None
    ok = rows is not None and all(
        isinstance(r, Sequence) and len(r) == v and all(_number(x) for x in r) for r in rows
    )
    if not ok or any(x < 0 or not math.isfinite(x) for r in rows for x in r):
        raise InputError(
            f"the {name} durations {given(value)} are not seconds for a pipeline of {S} "
            f"stages x {v} chunks; give one number >= 0, {S} of them (one per stage), or "
            f"{S} lists of {v} (per stage, per chunk)"
        )
    return tuple(tuple(float(x) for x in r) for r in rows)


def _links(p2p, S: int, v: int) -> tuple[float, ...]:
    n = S if v > 1 else S - 1
    links = [p2p] * n if _number(p2p) else p2p
    if (
        not isinstance(links, Sequence)
        or len(links) != n
        or not all(_number(x) and x >= 0 and math.isfinite(x) for x in links)
    ):
        what = "the last from stage S-1 back to 0" if v > 1 else "none back from S-1 to 0"
        raise InputError(
            f"the point-to-point time {given(p2p)} is not seconds per send for {S} stages; "
            f"give one number >= 0, or {n} of them, one per link s -> s+1 ({what})"
        )
    return tuple(float(x) for x in links)


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _send(link: tuple[float, ...], g: int, S: int) -> float:
    """Seconds to send between virtual stages g and g+1: free on one stage."""
    return 0.0 if S == 1 else link[g % S]


def _in_flight(row: list[Slot], split: bool) -> tuple[tuple[tuple[float, int], ...], int, int]:
    """(time, held) at every change, the peak held to the last pass, the peak held to B."""
    release = "W" if split else "B"
    held = held_b = peak = peak_b = 0
    series: list[tuple[float, int]] = []
    for slot in row:
        kind = slot.work.kind
        if kind == "F":
            held, held_b = held + 1, held_b + 1
            peak, peak_b = max(peak, held), max(peak_b, held_b)
        if kind == "B":
            held_b -= 1
        if kind == release:
            held -= 1
        if kind in ("F", release):
            series.append((slot.start if kind == "F" else slot.end, held))
    return tuple(series), peak, peak_b


def _deadlock(schedule: Schedule, pos, needs, ends) -> str:
    waits = []
    for s, row in enumerate(schedule.table):
        if pos[s] < len(row):
            w = row[pos[s]]
            missing = [key for key, _ in needs(w, s) if key not in ends]
            on = ", ".join(
                f"{k}{m}"
                + (f".{g // schedule.stages}" if g >= schedule.stages else "")
                + f" on stage {g % schedule.stages}"
                for k, m, g in missing
            )
            waits.append(f"stage {s} at {w} waits for {on}")
    return (
        f"the {schedule.kind!r} schedule's order deadlocks: "
        + "; ".join(waits)
        + "; each of these comes later in its own stage's order than the item waiting on it. "
        "Reorder the rows so that what one stage waits for runs before that stage's own wait"
    )
