"""Answers to "why is this value sharded so?", "why did propagation stop here?" and "what
changed between two steps?"."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from workbench.core.errors import NothingTiled
from workbench.core.ir.source_lines import where
from workbench.core.layout.sharding import Sharding
from workbench.core.layout.state import Conflict, Note, Pin, Provenance, State


@dataclass(frozen=True, slots=True)
class Hop:
    """One edge of a decision's path: ``value`` got the axis from ``source`` over ``op``."""

    value: str
    op: str | None
    factor: str | None
    step: int
    source: str = ""  # the op's user line, "path:line (function)" (``ir.source_lines``)
    library: str = ""  # and the library line beside it


@dataclass(frozen=True, slots=True)
class Trace:
    """How one axis reached a value: the tactic, then the hops from its seed to the value."""

    axis: str
    decision: str  # "dim 0", "pending sum", "replicated" or "atomic"
    tactic: int | None
    tactic_text: str
    hops: tuple[Hop, ...]  # from the tactic's seed to the value
    part: str = ""  # within a composite tactic, the part whose seed it flowed from

    def __str__(self) -> str:
        head = f"  {self.axis} on {self.decision}"
        if self.tactic is None:
            return head + f" ({self.tactic_text})"
        lines = [head + f": tactic #{self.tactic} {self.tactic_text}"]
        if self.part:
            lines[0] += f", from its part {self.part}"
        for i, hop in enumerate(self.hops):
            if hop.op is None:
                lines.append(f"    {hop.value}  (selected by the tactic)")
            else:
                via = f"{hop.op}" + (f" [factor {hop.factor}]" if hop.factor else "")
                at = where(hop.source, hop.library)
                via += f" at {at}" if at else ""
                lines.append(f"    {'-> ' if i else ''}{hop.value}  via {via}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Why:
    """The provenance of every axis on one value."""

    value: str
    sharding: Sharding
    traces: tuple[Trace, ...]
    notes: tuple[str, ...] = ()  # the tactics that target it but left it whole, and why
    source: str = ""  # the user's line that made the value, "path:line (function)"
    library: str = ""  # and the library line beside it

    def __str__(self) -> str:
        at = where(self.source, self.library)
        lines = [f"{self.value}: {self.sharding}"] + [f"  made at {at}"] * bool(at)
        lines += [str(t) for t in self.traces]
        if not self.traces:
            lines.append("  replicated on every axis: no tactic reached it.")
        return "\n".join(lines + [f"  {n}" for n in self.notes])

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
                *(
                    (program.ops[p.op].source, program.ops[p.op].library)
                    if p.op is not None
                    else ()
                ),
            )
            for p in steps
        )
        tactic = last.tactic if last else None
        text = (
            str(state.schedule[tactic])
            if tactic is not None and tactic < len(state.schedule)
            else ""
        )
        traces.append(Trace(axis, decision, tactic, text, hops, _part_text(state, last)))
    for axis in sorted(s.replicated):
        traces.append(Trace(axis, "replicated", None, "kept whole by a Replicate tactic", ()))
    for axis in sorted(s.atomic):
        traces.append(Trace(axis, "atomic", None, "frozen by an Atomic tactic", ()))
    notes = tuple(
        f"{n.axis} left whole by tactic #{n.tactic} {_tactic(state, n.tactic)}: {n.reason}"
        for n in state.notes
        if n.value == vid
    )
    producer = program.values[vid].producer
    made = () if producer is None else (program.ops[producer].source, program.ops[producer].library)
    return Why(program.values[vid].name, s, tuple(traces), notes, *made)


def _tactic(state: State, i: int) -> str:
    return str(state.schedule[i]) if i < len(state.schedule) else "?"


def note_text(program, note: Note) -> str:
    """One note in names: what stays whole on which axis, and why."""
    if note.value is None:
        return f"on {note.axis!r}: {note.reason}"
    return f"{program.values[note.value].name} stays whole on {note.axis!r}: {note.reason}"


def notes(program, state: State, tactic: int) -> tuple[str, ...]:
    """What tactic ``tactic`` of the schedule could not do, one line per value it left whole."""
    return tuple(note_text(program, n) for n in state.notes if n.tactic == tactic)


def nothing_tiled(program, mesh, tactic, notes: list[Note]) -> NothingTiled:
    """The error of a strategy none of whose targets got its axis: why, and what would work."""
    axis, n = tactic.axis, mesh.axis_size(tactic.axis)
    sizes = sorted({x.size for x in notes if x.size})
    whats = {x.what for x in notes}
    if sizes and len(whats) == 1 and all(x.size for x in notes):
        what = whats.pop() or "targeted"
        g = 0
        for size in sizes:
            g = gcd(g, size)
        fits = [k for k in range(1, g + 1) if g % k == 0]
        listed = ", ".join(map(str, fits[:-1])) + (" or " if len(fits) > 1 else "")
        fit = f"of size {listed}{fits[-1]}" if len(fits) <= 6 else f"whose size divides {g}"
        return NothingTiled(
            f"{tactic} tiles nothing: the {n}-way axis {axis!r} does not divide the {what} "
            f"dimension ({', '.join(map(str, sizes))}); use an axis {fit}, a {what} "
            f"dimension that is a multiple of {n}, or tile another dimension."
        )
    reasons = list(dict.fromkeys(note_text(program, x) for x in notes))
    more = f"; ... and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    return NothingTiled(
        f"{tactic} tiles nothing: " + "; ".join(reasons[:3]) + more + ". Fix what these say, "
        f"use a mesh axis whose size ({n} now) divides the sizes they name, or tile another "
        "dimension."
    )


def _part_text(state: State, record) -> str:
    if record is None or record.part is None:
        return ""
    parts = state.parts.get(record.tactic, ())
    return str(parts[record.part]) if record.part < len(parts) else ""


@dataclass(frozen=True, slots=True)
class Event:
    """One step of a tactic's propagation, in names a user reads.

    ``kind`` is "seed" (the tactic put ``axis`` on ``value``), "tile" or "sum" (it spread
    over ``op`` from ``source``: a tiled dim, or a pending reduction), "replicate" or
    "atomic" (a pin), or "conflict" (propagation stopped at ``op``; ``value`` is empty).
    """

    index: int  # 1-based, the order propagation made it in
    kind: str
    axis: str
    value: str
    value_id: int | None
    dim: int | None
    op: str | None
    op_id: int | None
    source: str | None
    part: str  # the composite's part it flowed from, "" for a primitive tactic
    text: str

    def __str__(self) -> str:
        return f"{self.index:>5}  {self.text}"


def events(program, state: State) -> tuple[Event, ...]:
    """The events of the tactic that made ``state``, in order (see `Event`)."""
    names = program.values
    out = []
    texts: dict = {}  # (tactic, part) -> its text: a composite's parts are few, its events many
    for e in state.events:
        key = (e.tactic, e.part)
        part = texts.get(key)
        if part is None:
            part = texts[key] = _part_text(state, e)
        if isinstance(e, Provenance):
            value = names[e.value].name
            what = f"dim {e.dim}" if e.dim is not None else f"pending {e.reduction}"
            if e.op is None:
                kind, text = "seed", f"{value}: {e.axis} on {what} (selected)"
            else:
                kind = "tile" if e.dim is not None else "sum"
                op = program.ops[e.op].name
                src = "" if e.source is None else f" from {names[e.source].name}"
                text = f"{value}: {e.axis} on {what} via {op}{src}"
            out.append(
                Event(
                    e.step,
                    kind,
                    e.axis,
                    value,
                    e.value,
                    e.dim,
                    None if e.op is None else program.ops[e.op].name,
                    e.op,
                    None if e.source is None else names[e.source].name,
                    part,
                    text,
                )
            )
        elif isinstance(e, Pin):
            kind = "atomic" if e.atomic else "replicate"
            value = names[e.value].name
            text = f"{value}: {kind} on {e.axis}"
            out.append(
                Event(e.step, kind, e.axis, value, e.value, None, None, None, None, part, text)
            )
        else:
            op = program.ops[e.op].name
            text = f"conflict at {op} on {e.axis}: {e.reason}"
            out.append(
                Event(e.step, "conflict", e.axis, "", None, None, op, e.op, None, part, text)
            )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ConflictReport:
    """A conflict in names a user reads: the op, the axis, who wants what and which tactic."""

    op: str
    axis: str
    reason: str
    claims: tuple[tuple[str, str, str], ...]  # (value, what it wants, tactic)
    found_by: str
    source: str = ""  # the op's user line, "path:line (function)" (``ir.source_lines``)
    library: str = ""  # and the library line beside it

    def __str__(self) -> str:
        lines = [
            f"conflict at {self.op} on axis {self.axis!r}: {self.reason} (found by {self.found_by})"
        ]
        at = where(self.source, self.library)
        lines += [f"  written at {at}"] * bool(at)
        lines += [f"  {value} wants {wants}  <- {tactic}" for value, wants, tactic in self.claims]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def report(program, state: State, conflict: Conflict) -> ConflictReport:
    def tactic_text(i):
        return (
            f"tactic #{i} {state.schedule[i]}" if i is not None and i < len(state.schedule) else "?"
        )

    claims = tuple(
        (program.values[c.value].name, c.wants, tactic_text(c.tactic)) for c in conflict.claims
    )
    op = program.ops[conflict.op]
    return ConflictReport(
        op.name,
        conflict.axis,
        conflict.reason,
        claims,
        tactic_text(conflict.tactic),
        op.source,
        op.library,
    )


@dataclass(frozen=True, slots=True)
class Diff:
    """Values whose sharding differs between two steps: ``(name, before, after)``."""

    before: int
    after: int
    changes: tuple[tuple[str, Sharding, Sharding], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.changes]

    def __len__(self) -> int:
        return len(self.changes)

    def __str__(self) -> str:
        head = f"step {self.before} -> {self.after}: {len(self.changes)} values changed"
        return "\n".join([head] + [f"  {n}: {a} -> {b}" for n, a, b in self.changes])


def diff(program, before: tuple[int, State], after: tuple[int, State]) -> Diff:
    """What changed between two (step, state) pairs of one history."""
    (i, a), (j, b) = before, after
    changes = tuple(
        (program.values[v].name, a.shardings[v], b.shardings[v]) for v in sorted(b.changed_since(a))
    )
    return Diff(i, j, changes)
