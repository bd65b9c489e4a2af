"""Reductions synthesised per level (P2, Xie et al., MLSys 2022, arXiv 2110.10548, sec. 4).

A reduction over a group that spans levels may run as a sequence of collectives, each an
all-reduce (AR), reduce-scatter (RS) or all-gather (AG) over a set of the group's levels:

- AR and RS reduce over levels not yet reduced (RS also keeps 1/n of the data, pushing
  its levels on a stack of scatters);
- AG over the top entries of that stack undoes those scatters (last scattered, first
  gathered, so blocks return to their places);
- an all-reduce ends with every level reduced and nothing scattered; a reduce-scatter
  with every level reduced and scattered. Where its scatters run in another order than
  the result's layout (the group's sub-axes, each axis's outer level first), the input's
  blocks are permuted first: a local copy, priced as one (``copy_s``);
- an all-gather (not a reduction; its dual) gathers each level once, the last gathered
  major, and permutes its output's blocks last where that is not the result's layout.

A step over several levels is one flat ring at the slowest bandwidth and largest latency;
the default is one such step over all. Rooted reductions and broadcasts (P2's Reduce,
Broadcast) are left out: ``shard_map`` has none (README.md).

`best` finds the cheapest program by Dijkstra over the grammar's states (a state: the
levels reduced and the stack of scatters); `programs` lists every program, for checks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from workbench.core import caches
from workbench.core.hardware.formulas import (
    all_gather_time,
    all_reduce_time,
    reduce_scatter_time,
)
from workbench.core.hardware.levels import Link
from workbench.core.units import format_bytes, format_seconds

#: The reductions synthesised, and every kind synthesised (all-to-alls and permutes are not).
REDUCTIONS = ("all-reduce", "reduce-scatter")
SYNTHESISED = (*REDUCTIONS, "all-gather")
_SHORT = {"all-reduce": "AR", "reduce-scatter": "RS", "all-gather": "AG"}


@dataclass(frozen=True, slots=True)
class Step:
    """One collective of a program: ``kind`` over the group's ``levels`` (indices into
    the levels the group spans, innermost first)."""

    kind: str
    levels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Program:
    """A program of the grammar computing ``kind``; ``permuted``: a reduce-scatter whose
    input's blocks are permuted first (its scatters run in another order than its
    result's layout)."""

    kind: str
    steps: tuple[Step, ...]
    permuted: bool = False

    def describe(self, names) -> str:
        """The steps, each with the names of its levels: ``RS nvlink, AR ib, AG nvlink``
        (a permutation first, or last for an all-gather, as ``permute blocks``)."""
        steps = [f"{_SHORT[s.kind]} {'+'.join(names[j] for j in s.levels)}" for s in self.steps]
        if not self.permuted:
            return ", ".join(steps)
        return ", ".join(
            [*steps, "permute blocks"] if self.kind == "all-gather" else ["permute blocks", *steps]
        )


@dataclass(frozen=True, slots=True)
class Synthesis:
    """The cheapest program for one reduction, and the default it is set against."""

    kind: str
    nbytes: float
    levels: tuple[tuple[str, int], ...]  # (link name, devices of the group on it), innermost first
    program: Program
    seconds: float
    default_s: float  # the default: one collective over the whole group, one flat ring
    #: seconds of each part ``program.describe`` lists, in order (the permutation first)
    step_s: tuple[float, ...] = ()

    @property
    def speedup(self) -> float:
        """The default's time over the chosen program's (1.0: the default is the best)."""
        return self.default_s / self.seconds if self.seconds > 0 else 1.0

    def __str__(self) -> str:
        names = [n for n, _ in self.levels]
        group = " x ".join(f"{n} {k}" for n, k in self.levels)
        head = f"{self.kind} of {format_bytes(self.nbytes)} over {group}"
        if len(self.program.steps) == 1 and not self.program.permuted:
            return f"{head}: one collective, {format_seconds(self.seconds)}"
        return (
            f"{head}: {self.program.describe(names)}, {format_seconds(self.seconds)}; "
            f"{self.speedup:.2f}x the default's {format_seconds(self.default_s)} "
            "(one ring over the whole group)"
        )


def _subsets(items: tuple[int, ...]):
    for r in range(1, len(items) + 1):
        yield from itertools.combinations(items, r)


def _moves(kind: str, k: int, reduced: frozenset, stack: tuple):
    """``(step, reduced, stack)`` after each step the grammar allows from a state (an
    all-gather's: the levels gathered, in order)."""
    left = tuple(j for j in range(k) if j not in reduced)
    if kind == "all-gather":
        for levels in _subsets(left):
            yield Step("all-gather", levels), reduced | set(levels), (*stack, levels)
        return
    for levels in _subsets(left):
        done = reduced | set(levels)
        yield Step("all-reduce", levels), done, stack
        yield Step("reduce-scatter", levels), done, (*stack, levels)
    for top in range(1, len(stack) + 1):
        levels = tuple(sorted(j for entry in stack[-top:] for j in entry))
        yield Step("all-gather", levels), reduced, stack[:-top]


def _done(kind: str, k: int, reduced: frozenset, stack: tuple) -> bool:
    if len(reduced) < k:
        return False
    if kind == "all-reduce":
        return not stack
    if kind == "all-gather":
        return True
    return sorted(j for entry in stack for j in entry) == list(range(k))


def _link(levels: tuple[tuple[Link, int], ...], chosen: tuple[int, ...], kind: str):
    """``(bandwidth, latency, devices)`` of a step over ``chosen`` levels (one flat ring
    where there are several)."""
    figures = [levels[j][0].figures_for(kind) for j in chosen]
    n = math.prod(levels[j][1] for j in chosen)
    return min(b for b, _ in figures), max(lat for _, lat in figures), n


def _step_time(step: Step, levels, nbytes: float) -> tuple[float, float]:
    """``(seconds, bytes after)`` of ``step`` on a local array of ``nbytes``."""
    bw, lat, n = _link(levels, step.levels, step.kind)
    if step.kind == "all-reduce":
        return all_reduce_time(nbytes, n, bw, lat), nbytes
    if step.kind == "reduce-scatter":
        return reduce_scatter_time(nbytes, n, bw, lat), nbytes / n
    return all_gather_time(nbytes * n, n, bw, lat), nbytes * n


def permuted(stack: tuple, order: tuple[tuple[int, ...], ...]) -> bool:
    """Whether scatters in ``stack`` order leave blocks out of the result's layout:
    ``order`` lists, per axis of the group in order, the levels it lies on (outermost
    first); each scatter covers its levels' sub-axes in that order."""
    wanted = [(a, j) for a, js in enumerate(order) for j in js]
    done = [sub for entry in stack for sub in wanted if sub[1] in entry]
    return done != wanted


def out_of_order(kind: str, stack: tuple, order) -> bool:
    """Whether a finished program of ``kind`` leaves its blocks out of the result's
    layout: a reduce-scatter's scatters (the first major), an all-gather's gathers (the
    last major) in another order than ``order``'s; an all-reduce never."""
    if kind == "reduce-scatter":
        return permuted(stack, order)
    return kind == "all-gather" and permuted(tuple(reversed(stack)), order)


def _start(kind: str, levels, nbytes: float) -> float:
    """The local bytes a program starts from: an all-gather's ``nbytes`` is its output."""
    return nbytes / math.prod(n for _, n in levels) if kind == "all-gather" else nbytes


def price(program: Program, levels, nbytes: float, copy_s: float = 0.0) -> float:
    """Seconds ``program`` takes on a local array of ``nbytes`` over ``levels`` (``(link,
    devices)`` per level of the group, innermost first); ``copy_s``: a permutation's."""
    return sum(parts(program, levels, nbytes, copy_s))


def programs(kind: str, k: int, order=None, depth: int | None = None) -> list[Program]:
    """Every program of the grammar computing ``kind`` over ``k`` levels, at most ``depth``
    steps long (default: ``3 * k``, enough for any program without a wasted step);
    ``order``: the result's layout (see `permuted`; default one axis over all levels)."""
    order = order or (tuple(reversed(range(k))),)
    depth = 3 * k if depth is None else depth
    out = []

    def walk(steps, reduced, stack):
        if _done(kind, k, reduced, stack):
            out.append(Program(kind, tuple(steps), out_of_order(kind, stack, order)))
        if len(steps) < depth:
            for step, r, s in _moves(kind, k, reduced, stack):
                walk([*steps, step], r, s)

    walk([], frozenset(), ())
    return out


def default(kind: str, k: int) -> Program:
    """One collective over every level of the group."""
    return Program(kind, (Step(kind, tuple(range(k))),))


@caches.cache("hardware.synthesis", maxsize=8192)
def best(
    kind: str,
    nbytes: float,
    levels: tuple[tuple[Link, int], ...],
    copy_s: float = 0.0,
    order: tuple[tuple[int, ...], ...] | None = None,
) -> Synthesis:
    """The cheapest program for a ``kind`` reduction of a local array of ``nbytes`` over
    ``levels`` (``(link, devices)`` per level, innermost first), its time, and the
    default's; ties keep the default, then the fewer steps."""
    k = len(levels)
    order = order or (tuple(reversed(range(k))),)
    start = (frozenset(), ())
    # Dijkstra on (seconds to 12 digits, steps taken, tie, seconds, state, bytes now, steps):
    # times equal but for rounding go to the shorter program
    queue = [(0.0, 0, 0, 0.0, start, _start(kind, levels, float(nbytes)), ())]
    settled: set = set()
    tie = itertools.count(1)
    found = None
    while queue:
        _, n, _, t, state, size, steps = heapq.heappop(queue)
        if state in settled:
            continue
        settled.add(state)
        reduced, stack = state
        if _done(kind, k, reduced, stack):
            found = (t, Program(kind, steps))
            break
        for step, r, s in _moves(kind, k, reduced, stack):
            if (r, s) in settled:
                continue
            dt, after = _step_time(step, levels, size)
            if _done(kind, k, r, s) and out_of_order(kind, s, order):
                dt += copy_s
            key = float(f"{t + dt:.12g}")
            heapq.heappush(queue, (key, n + 1, next(tie), t + dt, (r, s), after, (*steps, step)))
    t, program = found
    if kind != "all-reduce":
        program = Program(kind, program.steps, out_of_order(kind, scatters(program), order))
    base = default(kind, k)
    default_s = price(base, levels, nbytes)
    if default_s <= t * (1 + 1e-12):
        program, t = base, default_s
    named = tuple((link.name, size) for link, size in levels)
    return Synthesis(
        kind, float(nbytes), named, program, t, default_s, parts(program, levels, nbytes, copy_s)
    )


def parts(program: Program, levels, nbytes: float, copy_s: float = 0.0) -> tuple[float, ...]:
    """Seconds of each part of ``program`` (`price`'s terms), in ``describe``'s order."""
    out = []
    nbytes = _start(program.kind, levels, nbytes)
    for step in program.steps:
        t, nbytes = _step_time(step, levels, nbytes)
        out.append(t)
    if not program.permuted:
        return tuple(out)
    return (*out, copy_s) if program.kind == "all-gather" else (copy_s, *out)


def scatters(program: Program) -> tuple[tuple[int, ...], ...]:
    """The levels of each scatter a program leaves in place, first scattered first (an
    all-gather's: each gather's, in order)."""
    if program.kind == "all-gather":
        return tuple(s.levels for s in program.steps)
    stack: list = []
    for s in program.steps:
        if s.kind == "reduce-scatter":
            stack.append(s.levels)
        elif s.kind == "all-gather":
            left = set(s.levels)
            while left:
                left -= set(stack.pop())
    return tuple(stack)


def flat(kind: str, nbytes: float, levels: tuple[tuple[Link, int], ...]) -> float:
    """The default's seconds: one ring over the whole group."""
    return price(default(kind, len(levels)), levels, nbytes)


__all__ = [
    "REDUCTIONS",
    "SYNTHESISED",
    "Program",
    "Step",
    "Synthesis",
    "best",
    "flat",
    "price",
    "programs",
    "scatters",
]
