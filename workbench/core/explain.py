"""Answers to "why is this value sharded so?" and "why did propagation stop here?"."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.sharding import Sharding
from workbench.core.state import Conflict, Provenance, State


@dataclass(frozen=True, slots=True)
class Hop:
    """One edge of a decision's path: ``value`` got the axis from ``source`` over ``op``."""

    value: str
    op: str | None
    factor: str | None
    step: int


@dataclass(frozen=True, slots=True)
class Trace:
    """How one axis reached a value: the tactic, then the hops from its seed to the value."""

    axis: str
    decision: str  # "dim 0", "pending sum", "replicated" or "atomic"
    tactic: int | None
    tactic_text: str
    hops: tuple[Hop, ...]  # from the tactic's seed to the value

    def __str__(self) -> str:
        head = f"  {self.axis} on {self.decision}"
        if self.tactic is None:
            return head + f" ({self.tactic_text})"
        lines = [head + f": tactic #{self.tactic} {self.tactic_text}"]
        for i, hop in enumerate(self.hops):
            if hop.op is None:
                lines.append(f"    {hop.value}  (selected by the tactic)")
            else:
                via = f"{hop.op}" + (f" [factor {hop.factor}]" if hop.factor else "")
                lines.append(f"    {'-> ' if i else ''}{hop.value}  via {via}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Why:
    """The provenance of every axis on one value."""

    value: str
    sharding: Sharding
    traces: tuple[Trace, ...]

    def __str__(self) -> str:
        if not self.traces:
            return (
                f"{self.value}: {self.sharding}\n  replicated on every axis: no tactic reached it."
            )
        return f"{self.value}: {self.sharding}\n" + "\n".join(str(t) for t in self.traces)

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def chain(state: State, vid: int, axis: str) -> list[Provenance]:
    """The decisions from the tactic's seed to ``(vid, axis)``, seed first."""
    out: list[Provenance] = []
    seen = set()
    key = (vid, axis)
    while key in state.provenance and key not in seen:
        seen.add(key)
        p = state.provenance[key]
        out.append(p)
        if p.source is None:
            break
        key = (p.source, axis)
    return out[::-1]


def why(program, state: State, vid: int) -> Why:
    s = state.shardings[vid]
    traces = []
    axes = [a for axes in s.dims for a in axes] + [a for a, _ in s.partial]
    for axis in axes:
        steps = chain(state, vid, axis)
        last = state.provenance.get((vid, axis))
        decision = (
            f"dim {s.dim_of(axis)}"
            if s.dim_of(axis) is not None
            else f"pending {s.reduction_of(axis)}"
        )
        hops = tuple(
            Hop(
                program.values[p.value].name,
                None if p.op is None else program.ops[p.op].name,
                p.factor,
                p.step,
            )
            for p in steps
        )
        tactic = last.tactic if last else None
        text = (
            str(state.schedule[tactic])
            if tactic is not None and tactic < len(state.schedule)
            else ""
        )
        traces.append(Trace(axis, decision, tactic, text, hops))
    for axis in sorted(s.replicated):
        traces.append(Trace(axis, "replicated", None, "kept whole by a Replicate tactic", ()))
    for axis in sorted(s.atomic):
        traces.append(Trace(axis, "atomic", None, "frozen by an Atomic tactic", ()))
    return Why(program.values[vid].name, s, tuple(traces))


@dataclass(frozen=True, slots=True)
class ConflictReport:
    """A conflict in names a user reads: the op, the axis, who wants what and which tactic."""

    op: str
    axis: str
    reason: str
    claims: tuple[tuple[str, str, str], ...]  # (value, what it wants, tactic)
    found_by: str

    def __str__(self) -> str:
        lines = [
            f"conflict at {self.op} on axis {self.axis!r}: {self.reason} (found by {self.found_by})"
        ]
        lines += [f"  {value} wants {wants}  <- {tactic}" for value, wants, tactic in self.claims]
        return "\n".join(lines)


def report(program, state: State, conflict: Conflict) -> ConflictReport:
    def tactic_text(i):
        return (
            f"tactic #{i} {state.schedule[i]}" if i is not None and i < len(state.schedule) else "?"
        )

    claims = tuple(
        (program.values[c.value].name, c.wants, tactic_text(c.tactic)) for c in conflict.claims
    )
    return ConflictReport(
        program.ops[conflict.op].name,
        conflict.axis,
        conflict.reason,
        claims,
        tactic_text(conflict.tactic),
    )
