"""Auto's candidates: what the tree search found beside every registered named strategy on
Auto's axes, each applied to the state Auto starts from exactly as Auto's expansion applies
its decisions, and priced by the same simulator, hardware and memory limit. The best wins,
so Auto is never slower than a named strategy it could have chosen.

Pipelines (``PP``: 1F1B and zero-bubble at a few microbatch counts, `pipeline_moves`) and
ring attention (``CP(kind="ring")``, `context_moves`) are tried on each axis beside the
strategies. Where BP cannot split the batch over an axis (it
does not divide, or a pipeline's microbatches need whole examples on each device), BP on
each other dim the data inputs share is tried instead (the sequence, say: `other_splits`).
With several axes, the candidates are each strategy on each axis alone, then a composition
grown greedily: the best so far, then each strategy on each axis it leaves free (BP on the
data axis after MP on the model axis, say), the best of those, and so on while that helps.
A strategy that raises a ``WorkbenchError`` (it tiles nothing, say) does not apply and is
listed with its reason. A candidate that adds conflicts wins only when it beats every
conflict-free one; the report then says what each conflict costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import WorkbenchError
from workbench.core.estimate import estimate
from workbench.core.plan.plan import build_plan
from workbench.core.propagate.tactics import Tactic, apply_tactic
from workbench.core.units import format_bytes, format_seconds

SEARCH = "tree search"


@dataclass(frozen=True, slots=True)
class Decided(Tactic):
    """Tactics applied as one step, as Auto's expansion applies them (to price a candidate)."""

    parts: tuple[Tactic, ...]

    @property
    def axis(self) -> str:
        """The parts' one axis; "" when they run on several (every tactic has an axis)."""
        axes = {getattr(t, "axis", "") for t in self.parts}
        return axes.pop() if len(axes) == 1 else ""

    def expand(self, program, mesh, state):
        return list(self.parts)

    def __str__(self) -> str:
        return " + ".join(map(str, self.parts)) or "nothing"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan Auto compared: its tactics, simulated step and peak memory per device, its
    score (Auto's reward: higher is better), and the conflicts it adds with what each costs
    (communication at the conflicting op); or why it does not apply (``error``)."""

    name: str
    tactics: tuple[Tactic, ...]
    step_s: float | None = None
    peak: int | None = None
    score: float = 0.0
    conflicts: tuple[str, ...] = ()
    error: str = ""

    @property
    def applies(self) -> bool:
        return not self.error

    def __str__(self) -> str:
        if self.error:
            return f"{self.name}: does not apply ({self.error})"
        extra = f", {len(self.conflicts)} conflict(s)" if self.conflicts else ""
        return (
            f"{self.name}: step {format_seconds(self.step_s)}, "
            f"peak {format_bytes(self.peak)}{extra}"
        )


@dataclass(frozen=True, slots=True)
class AutoReport:
    """What an Auto compared and chose: ``candidates`` (the winner among them), the
    ``winner``'s tactics (what Auto decides), and ``why`` it won."""

    auto: str
    candidates: tuple[Candidate, ...]
    winner: Candidate
    why: str

    @property
    def tactics(self) -> tuple[Tactic, ...]:
        return self.winner.tactics

    def __str__(self) -> str:
        lines = [f"{self.auto} compared {len(self.candidates)} candidates:"]
        for c in self.candidates:
            lines.append(f"  {'*' if c is self.winner else ' '} {c}")
        lines.append(f"won: {self.winner.name}. {self.why}")
        lines += [f"  {text}" for text in self.winner.conflicts]
        return "\n".join(lines)

    def _ranked(self) -> list[Candidate]:
        """The candidates that apply, best score first (the winner first), then the rest."""
        ok = sorted((c for c in self.candidates if c.applies), key=lambda c: -c.score)
        ok.sort(key=lambda c: c is not self.winner)
        return ok + [c for c in self.candidates if not c.applies]

    def __repr__(self) -> str:
        from workbench.core import display as d

        w = self.winner
        head = (
            f"AutoReport: {self.auto} chose {w.name}: step {format_seconds(w.step_s)}, "
            f"peak {format_bytes(w.peak)} (best of {len(self.candidates)} candidates)"
        )
        body = [d.clip(self.why, d.WIDTH - 4)]
        body += [d.clip(f"{'*' if c is w else ' '} {c}", d.WIDTH - 4) for c in self._ranked()[:6]]
        rest = len(self.candidates) - 6
        if rest > 0:
            body.append(f"... and {rest} more (str(report) lists every one)")
        body += [d.clip(f"conflict: {t}", d.WIDTH - 4) for t in w.conflicts[:3]]
        return d.lines(d.clip(head, 2 * d.WIDTH), body, hint="str(report)")

    def _repr_html_(self) -> str:
        from workbench.core import display as d

        def row(c: Candidate):
            if not c.applies:
                return (c.name, "", "", "", c.error)
            extra = f"{len(c.conflicts)} conflict(s)" if c.conflicts else ""
            return (
                ("* " if c is self.winner else "") + c.name,
                format_seconds(c.step_s),
                format_bytes(c.peak),
                f"{c.score:.3g}",
                extra,
            )

        ranked = self._ranked()
        ok = [row(c) for c in ranked if c.applies]
        no = [row(c) for c in ranked if not c.applies]
        headers = ("candidate", "step", "peak", "score", "conflicts / why not")
        parts = [d.facts([("won", self.winner.name), ("why", self.why)]), d.table(headers, ok)]
        if self.winner.conflicts:
            rows = ((t,) for t in self.winner.conflicts)
            parts.append(d.details("the winner's conflicts", d.table(("conflict",), rows)))
        if no:
            parts.append(d.details(f"{len(no)} do not apply", d.table(headers, no)))
        parts.append(
            d.details("tactics decided", d.table(("tactic",), ((t,) for t in self.tactics)))
        )
        return d.panel(f"{self.auto} compared {len(self.candidates)} candidates", *parts)


def price(program, mesh, start, name: str, tactics, search) -> Candidate:
    """``tactics`` applied to ``start`` as one step and priced as ``search`` prices a state."""
    tactics = tuple(tactics)
    try:
        state = apply_tactic(program, mesh, start, Decided(tactics)) if tactics else start
    except WorkbenchError as err:
        return Candidate(name, tactics, error=" ".join(str(err).split())[:300])
    e = estimate(program, mesh, state, build_plan(program, mesh, state), search.hardware)
    objective = e.memory.peak if search.auto.goal == "memory" else e.step_s
    score = search.reward(state, (objective, e.memory.peak))
    before = {(c.op, c.axis) for c in start.conflicts}
    conflicts = tuple(
        _conflict_text(program, c, e) for c in state.conflicts if (c.op, c.axis) not in before
    )
    return Candidate(name, tactics, e.step_s, e.memory.peak, score, conflicts)


def _conflict_text(program, conflict, e) -> str:
    """A conflict in a line: where, why, and the communication the plan spends there."""
    spent = [
        c.total_s
        for c in e.collectives
        if c.collective.op == conflict.op and conflict.axis in c.collective.axes
    ]
    cost = (
        f"costs {format_seconds(sum(spent))} of communication there ({len(spent)} collective(s))"
        if spent
        else "costs no communication there"
    )
    op = program.ops[conflict.op].name
    return f"conflict at {op} on axis {conflict.axis!r}: {conflict.reason}; {cost}"


def named(program, mesh, start, auto, search) -> list[Candidate]:
    """Every registered named strategy on each of ``auto``'s axes, priced from ``start``;
    with several axes, also a composition grown greedily (see module doc)."""
    from workbench.core.strategies import STRATEGIES
    from workbench.core.strategies.context import context_moves
    from workbench.core.strategies.data import BP
    from workbench.core.strategies.pipeline import PP, pipeline_moves

    if auto.inputs != "**":
        why = f"Auto(inputs={auto.inputs!r}) may decide only those inputs; a strategy decides all"
        return [Candidate(name, (), error=why) for name in STRATEGIES]
    out: list[Candidate] = []
    by_axis: dict[str, list[tuple[str, Tactic]]] = {}
    for axis in auto.axes:
        for name, cls in STRATEGIES.items():
            try:
                by_axis.setdefault(axis, []).append((f"{name}({axis!r})", cls(axis)))
            except (WorkbenchError, TypeError) as err:  # a strategy that needs more than an axis
                out.append(Candidate(f"{name}({axis!r})", (), error=str(err)))
        by_axis.setdefault(axis, []).extend(
            (str(t), t)
            for t in [*pipeline_moves(program, mesh, axis), *context_moves(program, mesh, axis)]
        )

    def moves(before: Candidate | None, axis: str) -> list[Candidate]:
        """Each move on ``axis`` after ``before``'s tactics, priced (no second pipeline: a
        step has one); BP on the data inputs' other dims too where BP on the batch dim does
        not apply."""
        tactics, prefix = (before.tactics, f"{before.name} + ") if before else ((), "")
        piped = start.pipeline is not None or any(isinstance(t, PP) for t in tactics)
        priced = [
            price(program, mesh, start, prefix + n, (*tactics, t), search)
            for n, t in by_axis.get(axis, [])
            if not (piped and isinstance(t, PP))
        ]
        batch = next((c for c in priced if c.tactics[-1] == BP(axis)), None)
        if batch is not None and not batch.applies:
            priced += [
                price(program, mesh, start, prefix + str(t), (*tactics, t), search)
                for t in other_splits(program, mesh, start, axis)
            ]
        return priced

    for axis in auto.axes:
        out += moves(None, axis)
    best = choose(out)
    while best is not None and len(best.tactics) < len(auto.axes):
        used = {t.axis for t in best.tactics}
        grown = [c for axis in auto.axes if axis not in used for c in moves(best, axis)]
        out += grown
        chosen = choose([best, *grown])
        if chosen is best:
            break  # nothing on a free axis helps
        best = chosen
    return out


def other_splits(program, mesh, start, axis: str) -> list[Tactic]:
    """BP on ``axis`` over each dim, other than the batch dim, that every data input has at
    one size the axis divides (a sequence): what splits the data where the batch cannot."""
    from workbench.core.strategies.data import BP
    from workbench.core.strategies.roles import roles

    data = [(program.values[v].shape, d) for v, d in roles(program, start).data]
    data = [(shape, d) for shape, d in data if shape]
    if not any(d is not None for _, d in data):
        return []
    size, batch_dims = mesh.axis_size(axis), {d for _, d in data}
    return [
        BP(axis, dim=dim)
        for dim in range(min(len(shape) for shape, _ in data))
        if dim not in batch_dims
        and len(sizes := {shape[dim] for shape, _ in data}) == 1
        and sizes.pop() % size == 0
    ]


def compare(program, mesh, start, search) -> AutoReport:
    """The named strategies, then ``search`` run (so its seconds count their time), priced
    alike from ``start``; the report of the winner."""
    strategies = named(program, mesh, start, search.auto, search)
    found = price(program, mesh, start, SEARCH, search.run(), search)
    return decide(search.auto, [*strategies, found])


def choose(candidates: list[Candidate]) -> Candidate | None:
    """The best scoring conflict-free candidate, unless one with conflicts scores higher;
    ties go to the one with fewer tactics, then to the earlier one."""

    def key(c: Candidate):
        return c.score, -len(c.tactics)

    clean = [c for c in candidates if c.applies and not c.conflicts]
    dirty = [c for c in candidates if c.applies and c.conflicts]
    best = max(clean, key=key, default=None)  # max keeps the first of equals
    rival = max(dirty, key=key, default=None)
    if rival is not None and (best is None or rival.score > best.score):
        return rival
    return best


def decide(auto, candidates: list[Candidate]) -> AutoReport:
    """The report of ``auto`` over ``candidates``: the winner, and why (see module doc)."""
    winner = choose(candidates)
    if winner is None:  # the search's own candidate always applies: it is a bug otherwise
        raise WorkbenchError(f"{auto}: no candidate applies: {[str(c) for c in candidates]}")
    clean = choose([c for c in candidates if not c.conflicts])
    measure = "peak memory" if auto.goal == "memory" else "step"
    if not winner.conflicts:
        why = f"It scores best on {measure} (within the memory limit, if any), with no conflict."
    elif clean is None:
        why = f"No conflict-free candidate applies; it keeps {len(winner.conflicts)} conflict(s)."
    else:
        why = (
            f"It keeps {len(winner.conflicts)} conflict(s) because it scores "
            f"{winner.score / max(clean.score, 1e-30):.2f}x the best conflict-free candidate, {clean.name} "
            f"(step {format_seconds(clean.step_s)}, peak {format_bytes(clean.peak)}), "
            f"each conflict's cost included:"
        )
    return AutoReport(str(auto), tuple(candidates), winner, why)
