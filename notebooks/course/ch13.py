"""Checks for chapter 13, pipeline parallelism (notebooks/course_13_*.ipynb): schedules and their
simulated timelines, when interleaving pays, and the microbatch count of a priced step."""

from __future__ import annotations

import math

from workbench.core import hardware as hw
from workbench.core.estimate import price_pipeline, schedule, simulate
from workbench.core.units import format_seconds

from .common import call, data_inputs, ok, require, unanswered

#: (stages, microbatches) the formulas are tried on: one stage, fewer and more microbatches
#: than stages.
SIZES = ((1, 4), (2, 2), (2, 7), (3, 5), (4, 2), (4, 4), (4, 16), (8, 3), (8, 32))
#: Seconds of a stage's forward and backward per microbatch in the formula checks.
FORWARD, BACKWARD = 1.0, 2.0
#: Chunks per stage 13.3 chooses from (1: plain 1F1B).
CHOICES = (1, 2, 4)


def _callable(fn, what: str) -> None:
    __tracebackhide__ = True
    unanswered(fn, what)
    require(callable(fn), f"expected {what}; got {fn!r}.")


def bubble(bubble_share) -> None:
    """Exercise 13.1: ``bubble_share(S, M)`` is the share of the stages' time idle in a GPipe
    and a 1F1B step of equal stages, as the simulator times it."""
    _callable(bubble_share, "a function bubble_share(S, M)")
    for kind in ("gpipe", "1f1b"):
        for S, M in SIZES:
            got = simulate(schedule(kind, S, M), FORWARD, BACKWARD).bubble_share
            mine = call(bubble_share, S, M, what=f"S={S}, M={M}")
            if math.isclose(mine, got, rel_tol=1e-6, abs_tol=1e-9):
                continue
            where = f"{kind}, S={S} stages, M={M} microbatches: your share {mine:.4g} is"
            side = "too large" if mine > got else "too small"
            require(S > 1, f"{where} not 0; a single stage never waits for another.")
            require(
                not math.isclose(mine, (S - 1) / M, rel_tol=1e-6),
                f"{where} {side}: it divides the idle time by the work alone. The share is of "
                "the whole step, the work and the waiting together.",
            )
            require(
                False,
                f"{where} {side}. Count in slots of F+B: how many does each stage wait while "
                "the first microbatch's forward comes down to it and the last backward goes "
                "back up, and how many does the whole step last? (print the timeline)",
            )
    ok(
        f"your bubble_share matches the simulated GPipe and 1F1B steps for {len(SIZES)} (S, M) pairs"
    )


def in_flight(held) -> None:
    """Exercise 13.2: ``held(kind, S, M, i)`` is the most microbatches whose activations stage
    i holds at once, for "gpipe" and "1f1b", as the simulator counts them."""
    _callable(held, "a function in_flight(kind, S, M, i)")
    cases = 0
    for kind in ("gpipe", "1f1b"):
        for S, M in SIZES:
            peaks = simulate(schedule(kind, S, M), FORWARD, BACKWARD).peak_in_flight
            for i, got in enumerate(peaks):
                mine = call(held, kind, S, M, i, what=f"{kind}, S={S}, M={M}, stage {i}")
                cases += 1
                if mine == got:
                    continue
                where = f"{kind}, S={S}, M={M}, stage {i}: your count {mine!r} is " + (
                    "too large" if mine > got else "too small"
                )
                require(
                    kind == "1f1b",
                    f"{where}. GPipe runs every forward before its first backward: how many "
                    "microbatches has a stage stored by then?",
                )
                require(
                    not (S - i > M and mine > M),
                    f"{where}: there are only M={M} microbatches to hold.",
                )
                require(
                    mine != S - 1 - i,
                    f"{where}: you count the warmup forwards, but the stage runs one more "
                    "forward (the one whose backward it runs next) before it frees anything.",
                )
                require(
                    False,
                    f"{where}. Stage i frees a microbatch's activations with its backward; "
                    "how many forwards does it run before its first backward? "
                    f"print(schedule('1f1b', {S}, {M})) shows each stage's order.",
                )
    ok(f"your in_flight matches the simulated peaks on {cases} (schedule, S, M, stage) cases")


def _step(S: int, M: int, v: int, forward, backward, p2p: float) -> float:
    """The simulated step of 1F1B (v=1) or interleaved with v chunks, each a v-th of its stage."""
    kind = "1f1b" if v == 1 else "interleaved"
    f = [x / v for x in forward]
    b = [x / v for x in backward]
    return simulate(schedule(kind, S, M, v), f, b, p2p=p2p).makespan


def interleaving(program, fastest_v, stages: int = 2) -> None:
    """Exercise 13.3: ``fastest_v(S, M, forward, backward, p2p)`` picks the chunks per stage in
    `CHOICES` that give the shortest simulated step, for ``program``'s priced stage times
    (H100, 1F1B) at two microbatch counts, with sends 1, 10 and 100 times the priced one."""
    _callable(fastest_v, "a function fastest_v(S, M, forward, backward, p2p)")
    truths, cases = set(), 0
    for M in (8, 16):
        e = price_pipeline(program, stages, M, hw.H100, schedule="1f1b")
        for scale in (1, 10, 100):
            p2p = max(e.p2p) * scale
            steps = {v: _step(stages, M, v, e.forward, e.backward, p2p) for v in CHOICES}
            best = min(steps, key=steps.get)
            truths.add(best)
            where = f"S={stages}, M={M}, sends of {format_seconds(p2p)}"
            mine = call(fastest_v, stages, M, e.forward, e.backward, p2p, what=where)
            require(
                mine in CHOICES,
                f"{where}: your function returned {mine!r}; return one of {CHOICES}.",
            )
            cases += 1
            if steps[mine] <= steps[best] * (1 + 1e-9):
                continue
            why = (
                "Each chunk boundary is a send, v per microbatch per link: at this price "
                "do the sends cost more than the bubble saves?"
                if mine > best
                else "More chunks shrink the bubble to (S-1)/(vM+S-1); a chunk holds a v-th "
                "of its stage's layers, so its F and B take a v-th of the stage's."
            )
            require(
                False,
                f"{where}: your v={mine} gives a step of {format_seconds(steps[mine])}; another "
                f"of {CHOICES} is shorter. {why}",
            )
    require(len(truths) > 1, "the check needs cases where different v win; use a larger model.")
    ok(f"your fastest_v picks the shortest step in all {cases} cases, sends from fast to slow")


def _batch(program) -> int:
    sizes = {program.value(n).shape[d] for n, d in data_inputs(program) if d is not None}
    require(len(sizes) == 1, f"the data inputs' batch sizes are {sorted(sizes)}; expected one.")
    return sizes.pop()


def own_microbatches(program, M, stages: int = 2) -> None:
    """Exercise 13.4: the number of microbatches (dividing the batch) that gives ``program``
    the shortest priced 1F1B step on ``stages`` stages of an H100."""
    unanswered(M, "a number of microbatches")
    batch = _batch(program)
    counts = [m for m in range(1, batch + 1) if batch % m == 0]
    require(
        M in counts,
        f"M={M!r}: give a number of microbatches that divides the batch of {batch}.",
    )
    steps = {m: price_pipeline(program, stages, m, hw.H100).step_s for m in counts}
    best = min(steps, key=steps.get)
    if steps[M] > steps[best] * (1 + 1e-9):
        why = (
            "Fewer, larger microbatches: a smaller bubble is not all a microbatch costs. "
            "Compare each stage's F and the send (est.p2p) across M."
            if best < M
            else "More microbatches shrink the bubble; price a few more."
        )
        require(
            False,
            f"M={M}: the step takes {format_seconds(steps[M])}; another M that divides the "
            f"batch of {batch} is shorter. {why}",
        )
    e = price_pipeline(program, stages, M, hw.H100)
    ok(
        f"M={M}: {format_seconds(e.step_s)} per step, bubble share {e.bubble_share:.2f}; "
        f"no other of {counts} is shorter"
    )
