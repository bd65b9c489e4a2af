"""Propagation: carry one tactic's decisions across the program, one mesh axis at a time.

For an axis, a worklist visits ops next to values that changed. At each op, every tensor
tiled on the axis is projected onto the op's factors (``FactorMapping``). If they all
name the same factor, the axis spreads to every tensor carrying that factor (and a
contracted factor leaves the results pending a reduction); if they name different
factors, the op is a *conflict*: recorded, and nothing is guessed. With no tile on the
axis, a pending sum flows on through ops linear in it, as long as the value has no other
use (where it forks it is reduced once, unless every other use reads it tiled on the axis
and the result is at most half its size) and the result is no larger in bytes. Decisions
only ever add: a later tactic never overrides an earlier one. The worklist runs to a
fixed point.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import MappingProxyType

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding, canonical
from workbench.core.layout.state import Claim, Conflict, Pin, Provenance, State
from workbench.core.ops.mapping import FactorMapping


@dataclass(frozen=True, slots=True)
class OpIndex:
    """What propagation needs of one op, precomputed: its tensors and where each factor sits."""

    tensors: tuple[int, ...]  # value ids of linked operands then linked results; -1 for literals
    n_in: int
    mapping: FactorMapping
    dims: tuple[tuple[tuple[int, ...], ...], ...]  # per tensor, per dim, its factors
    where: dict  # factor -> ((tensor, dim), ...)
    letters: dict  # factor -> name in the mapping's text


def op_index(program) -> tuple[OpIndex, ...]:
    """The per-op index of a program, built once and kept in the program's cache."""
    return program.cache.get("propagate.op index", lambda: _op_index(program))


def _op_index(program) -> tuple[OpIndex, ...]:
    out = []
    shared: dict[int, tuple] = {}  # per class of ops alike: (mapping, dims, where, letters)
    mappings: dict = {}  # equal mappings of different classes as one object
    for op, c in zip(program.ops, program.alike):
        parts = shared.get(c)
        if parts is None:
            mapping = program.mappings[op.id]
            mapping = mappings.setdefault(mapping, mapping)
            dims = (*mapping.operands, *mapping.results)
            where: dict[int, list] = {}
            for t, tdims in enumerate(dims):
                for d, factors in enumerate(tdims):
                    for f in factors:
                        where.setdefault(f, []).append((t, d))
            parts = shared[c] = (
                mapping,
                dims,
                {f: tuple(w) for f, w in where.items()},
                mapping.letters(),
            )
        mapping, dims, where, letters = parts
        tensors = tuple(
            v if isinstance(v, int) else -1 for v in (*op.linked_operands, *op.linked_results)
        )
        out.append(OpIndex(tensors, len(op.linked_operands), mapping, dims, where, letters))
    return tuple(out)


def walk_axes(factors, sizes, axes, axis_size):
    """Assign the axes tiling one dimension to its factors, major to minor.

    Returns ``(assigned, end)``: per axis ``(factor, prefix)`` where prefix lists the axes
    before it on the same factor, and ``end = (factor, prefix, remaining)`` where the next
    axis would go. None when an axis straddles two factors (not expressible).
    """
    assigned = []
    fi = 0
    rem = sizes[factors[0]] if factors else 1
    cur: list[str] = []
    for ax in axes:
        while rem == 1 and fi + 1 < len(factors):
            fi += 1
            rem = sizes[factors[fi]]
            cur = []
        s = axis_size[ax]
        if not factors or rem % s:
            return None
        assigned.append((factors[fi], tuple(cur)))
        cur.append(ax)
        rem //= s
    while rem == 1 and fi + 1 < len(factors):
        fi += 1
        rem = sizes[factors[fi]]
        cur = []
    return assigned, ((factors[fi] if factors else None), tuple(cur), rem)


class Propagator:
    """Builds the next State from one tactic's decisions. Used once, then discarded."""

    def __init__(self, program, mesh: Mesh, state: State, tactic: int, schedule=()):
        self.program = program
        self.schedule = tuple(schedule)
        self.index = op_index(program)
        self.axis_size = mesh.shape
        self.sh: dict[int, Sharding] = dict(state.shardings)
        self.prov: dict[tuple[int, str], Provenance] = dict(state.provenance)
        self.conflicts: dict[tuple[int, str], Conflict] = {
            (c.op, c.axis): c for c in state.conflicts
        }
        self.tactic = tactic
        self.step_count = 0
        self.changed: set[int] = set()
        self.fresh: set[int] = set()  # written since the last settle: where it restarts
        self.events: list[Provenance | Conflict | Pin] = []  # in the order they happen
        self.parts: dict[int, tuple] = dict(state.parts)
        self.notes: list = list(state.notes)  # what the tactics could not do (``Note``)
        self.pipeline = state.pipeline  # the tactic pipelining the step (``State.pipeline``)
        self.rings: tuple[str, ...] = state.rings  # axes of ring attention (``State.rings``)
        self.balanced: tuple[str, ...] = state.balanced  # of those, balanced (zigzag)
        self.fences: dict[tuple[int, str], set[int]] = {}  # (op, axis) -> factors it holds
        for o, axis, f in state.fences:
            self.fences.setdefault((o, axis), set()).add(f)
        self.part: int | None = None  # the composite's part being seeded
        self.nbytes = [v.nbytes for v in program.values]
        self.outputs = {v for v in program.outputs if isinstance(v, int)}

    # -- writes ----------------------------------------------------------------------------
    def begin_part(self, tactic) -> None:
        """Seeds from here on are ``tactic``'s, one part of the composite being applied."""
        parts = self.parts.get(self.tactic, ())
        self.parts[self.tactic] = (*parts, tactic)
        self.part = len(parts)

    def _part_of(self, source, axis) -> int | None:
        """A decision's part is its seed's: the part of the value it came from, if this tactic's."""
        if source is not None:
            p = self.prov.get((source, axis))
            if p is not None and p.tactic == self.tactic:
                return p.part
        return self.part

    def _record(self, vid, axis, **kwargs) -> None:
        self.step_count += 1
        part = self._part_of(kwargs.get("source"), axis)
        p = Provenance(
            value=vid, axis=axis, tactic=self.tactic, step=self.step_count, part=part, **kwargs
        )
        self.prov[(vid, axis)] = p
        self.events.append(p)
        self.changed.add(vid)
        self.fresh.add(vid)

    def tile(self, vid, dim, axis, *, op=None, source=None, factor=None) -> None:
        self.sh[vid] = self.sh[vid].with_tile(dim, axis)
        self._record(vid, axis, dim=dim, op=op, source=source, factor=factor)

    def make_partial(self, vid, axis, reduction, *, op=None, source=None, factor=None) -> None:
        self.sh[vid] = self.sh[vid].with_partial(axis, reduction)
        self._record(vid, axis, dim=None, reduction=reduction, op=op, source=source, factor=factor)

    def pin(self, vid, axis, *, atomic: bool) -> None:
        s = self.sh[vid]
        self.sh[vid] = s.with_atomic(axis) if atomic else s.with_replicated(axis)
        self.step_count += 1
        self.events.append(Pin(vid, axis, atomic, self.tactic, self.step_count, self.part))
        self.changed.add(vid)
        self.fresh.add(vid)

    def fence(self, o: int, axis: str, factor: int) -> None:
        """Op ``o`` never spreads ``factor`` on ``axis`` from here on (``State.fences``)."""
        self.fences.setdefault((o, axis), set()).add(factor)

    # -- the worklist ----------------------------------------------------------------------
    def run(self, axis: str, seeds) -> int:
        """Propagate ``axis`` from the ``seeds`` values to a fixed point; returns the write count."""
        users, writers = self.program.users, self.program.writers
        queue: deque[int] = deque()
        queued: set[int] = set()
        for v in seeds:
            for o in users[v] + writers[v]:
                if o not in queued:
                    queued.add(o)
                    queue.append(o)
        writes = 0
        while queue:
            o = queue.popleft()
            queued.discard(o)
            written = self.visit(o, axis)
            for v in written:
                writes += 1
                for n in users[v] + writers[v]:
                    if n not in queued:
                        queued.add(n)
                        queue.append(n)
            if written:  # o may now read a pending operand tiled: its other uses may pass it
                for v in self.index[o].tensors[: self.index[o].n_in]:
                    if v >= 0 and len(users[v]) > 1 and self.sh[v].reduction_of(axis) == "sum":
                        for n in users[v]:
                            if n != o and n not in queued:
                                queued.add(n)
                                queue.append(n)
        return writes

    def settle(self, first_axis: str | None = None) -> None:
        """Run every axis to a fixed point; an axis reruns only from values other axes wrote.

        One axis can open a way for another: a dimension merged from factors (B, S) takes
        an axis on S only once B is tiled. It starts from the values written since the last
        settle: everything before is at a fixed point already, so a composite's parts cost
        what they change, not what the parts before them changed.
        """
        axes = list(self.axis_size)
        if first_axis is not None:
            axes.remove(first_axis)
            axes.insert(0, first_axis)
        dirty = {axis: set(self.fresh) for axis in axes}
        self.fresh = set()
        while any(dirty.values()):
            for axis in axes:
                if not dirty[axis]:
                    continue
                seeds, dirty[axis] = dirty[axis], set()
                start = len(self.events)
                self.run(axis, seeds)
                newly = {p.value for p in self.events[start:] if isinstance(p, Provenance)}
                for other in axes:
                    if other != axis:
                        dirty[other] |= newly

    # -- one op, one axis ------------------------------------------------------------------
    def visit(self, o: int, axis: str) -> list[int]:
        ix = self.index[o]
        m = ix.mapping
        sh = self.sh
        claims = []  # (tensor, factor, prefix)
        partial_in = []  # (tensor, reduction) for operands pending a reduction over axis
        for t, vid in enumerate(ix.tensors):
            if vid < 0:
                continue
            s = sh[vid]
            if axis in s.atomic:
                continue
            d = s.dim_of(axis)
            if d is not None:
                walked = walk_axes(ix.dims[t][d], m.sizes, s.dims[d], self.axis_size)
                if walked is None:
                    self.conflict(
                        o, axis, [(t, None, ())], "an axis straddles two factors of the op"
                    )
                    return []
                for ax, (f, prefix) in zip(s.dims[d], walked[0]):
                    if ax == axis:
                        claims.append((t, f, prefix))
            elif t < ix.n_in:
                kind = s.reduction_of(axis)
                if kind is not None:
                    partial_in.append((t, kind))
        held = self.fences.get((o, axis))
        if held and claims:  # a fenced factor stays where it is: the plan re-splits it
            claims = [c for c in claims if c[1] not in held]
            if not claims:
                return []
        written = []
        if claims:
            written = self.spread(o, ix, axis, claims)
        elif partial_in:
            written = self.pass_partial(o, ix, axis, partial_in)
        return written

    def spread(self, o, ix: OpIndex, axis, claims) -> list[int]:
        """Spread the claimed factors. One axis may tile several factors of an op only when no
        tensor carries two of them (a loop's carry and its scanned input, say); otherwise
        the op is a conflict."""
        by_factor: dict[int, tuple] = {}
        for _t, f, prefix in claims:
            if f in by_factor and by_factor[f] != prefix:
                self.conflict(
                    o, axis, claims, "tensors of the op are tiled on the axis after different axes"
                )
                return []
            by_factor[f] = prefix
        if len(by_factor) > 1 and self.scatters(ix, claims):
            # the contraction reaches the operands alone: the result keeps its own tiling
            by_factor = {f: p for f, p in by_factor.items() if f in ix.mapping.contracting}
        elif len(by_factor) > 1:  # a contraction reaches every result: it makes them pending
            results = set(range(ix.n_in, len(ix.tensors)))
            carriers = {
                f: {t for t, _ in ix.where.get(f, ())}
                | (results if f in ix.mapping.contracting else set())
                for f in by_factor
            }
            factors = list(carriers)
            for i, f in enumerate(factors):
                for g in factors[i + 1 :]:
                    if carriers[f] & carriers[g]:
                        self.conflict(
                            o,
                            axis,
                            claims,
                            "tensors of the op are tiled on the axis along different factors",
                        )
                        return []
        written = []
        for f, prefix in by_factor.items():
            source = next(ix.tensors[t] for t, g, _ in claims if g == f)
            written += self.spread_factor(o, ix, axis, f, prefix, source, claims)
        return written

    @staticmethod
    def scatters(ix: OpIndex, claims) -> bool:
        """Whether the claims read as a reduce-scatter: operands tiled on one contracted factor
        alone, a result tiled on one free factor: each device sums its share of the
        contraction and the sums are scattered onto the result's tiling (a key gradient whose
        consumer was tiled first). No conflict: the contracted factor spreads to the operands
        alone."""
        m = ix.mapping
        if m.reduction != "sum":
            return False
        inside = {f for t, f, _ in claims if t < ix.n_in}
        outside = {f for t, f, _ in claims if t >= ix.n_in}
        return (
            len(inside) == 1
            and inside <= set(m.contracting)
            and len(outside) == 1
            and not outside & set(m.contracting)
        )

    def spread_factor(self, o, ix: OpIndex, axis, f, prefix, source, claims) -> list[int]:
        m = ix.mapping
        if f in m.blocked:
            return []
        sh = self.sh
        size = self.axis_size[axis]
        written = []
        for t, d in ix.where.get(f, ()):
            vid = ix.tensors[t]
            if vid < 0:
                continue
            s = sh[vid]
            if s.dim_of(axis) is not None or axis in s.atomic or axis in s.replicated:
                continue
            if s.reduction_of(axis) is not None:
                if t >= ix.n_in:  # a result already pending a reduction cannot also be tiled
                    self.conflict(
                        o,
                        axis,
                        [*claims, (t, "partial", ())],
                        "a result pending a reduction is wanted tiled",
                    )
                    return written
                continue  # an operand pending a sum: lowering reduce-scatters it
            walked = walk_axes(ix.dims[t][d], m.sizes, s.dims[d], self.axis_size)
            if walked is None:
                continue
            end_f, end_prefix, rem = walked[1]
            if end_f != f or end_prefix != prefix or rem % size:
                continue  # not expressible on this tensor: lowering redistributes
            self.tile(vid, d, axis, op=o, source=source, factor=ix.letters[f])
            written.append(vid)
        if f in m.contracting:
            carrying = {t for t, _ in ix.where.get(f, ())}
            for t in range(ix.n_in, len(ix.tensors)):
                vid = ix.tensors[t]
                if t in carrying or vid < 0:
                    continue
                s = sh[vid]
                if s.uses(axis) or axis in s.atomic or axis in s.replicated:
                    continue
                self.make_partial(vid, axis, m.reduction, op=o, source=source, factor=ix.letters[f])
                written.append(vid)
        return written

    def pass_partial(self, o, ix: OpIndex, axis, partial_in) -> list[int]:
        m = ix.mapping
        kinds = {k for _, k in partial_in}
        if len(kinds) != 1:
            return []
        (kind,) = kinds
        tensors = {t for t, _ in partial_in}
        ok = False
        if kind == "sum":
            ok = any(set(group) == tensors for group in m.linear)
        elif m.structural and len(ix.mapping.operands) >= 1 and tensors == {0}:
            ok = True
        if not ok:
            return []
        # a value used more than once (or returned) is reduced once where it forks: passing
        # the pending sum along one use would only add a second reduction further on; unless
        # every other use reads it tiled on the axis (a reduce-scatter, never whole) and the
        # result is at most half its size (Megatron's sequence parallelism: a layer norm's
        # bias gradient beside the reduce-scattered cotangent)
        users = self.program.users
        smallest = min(self.nbytes[ix.tensors[t]] for t in tensors)
        forks = [ix.tensors[t] for t in tensors if len(users[ix.tensors[t]]) != 1]
        if any(ix.tensors[t] in self.outputs for t in tensors) or (
            forks
            and not all(self.reads_tiled(u, v, axis) for v in forks for u in users[v] if u != o)
        ):
            return []
        made = [self.nbytes[r] for r in ix.tensors[ix.n_in :] if r >= 0]
        if forks and 2 * max(made, default=0) > smallest:
            return []
        source = ix.tensors[partial_in[0][0]]
        written = []
        for t in range(ix.n_in, ix.n_in + len(m.results)):
            vid = ix.tensors[t]
            s = self.sh[vid]
            if s.uses(axis) or axis in s.atomic or axis in s.replicated:
                continue
            if self.nbytes[vid] > smallest:
                continue  # reducing before a broadcast (or a widening cast) moves fewer bytes
            self.make_partial(vid, axis, kind, op=o, source=source)
            written.append(vid)
        return written

    def reads_tiled(self, o: int, vid: int, axis: str) -> bool:
        """Whether op ``o`` reads ``vid`` tiled on ``axis``: another of its tensors is tiled on
        it along a factor ``vid`` carries."""
        ix = self.index[o]
        carried = {
            f for t in range(ix.n_in) if ix.tensors[t] == vid for fs in ix.dims[t] for f in fs
        }
        for t, v in enumerate(ix.tensors):
            if v < 0 or v == vid or axis in self.sh[v].atomic:
                continue
            s = self.sh[v]
            d = s.dim_of(axis)
            walked = (
                None
                if d is None
                else walk_axes(ix.dims[t][d], ix.mapping.sizes, s.dims[d], self.axis_size)
            )
            if walked and any(
                a == axis and f in carried for a, (f, _) in zip(s.dims[d], walked[0])
            ):
                return True
        return False

    def conflict(self, o, axis, claims, reason) -> None:
        if (o, axis) in self.conflicts:
            return
        ix = self.index[o]
        out = []
        for t, f, _prefix in claims:
            vid = ix.tensors[t]
            s = self.sh[vid]
            p = self.prov.get((vid, axis))
            side = f"operand {t}" if t < ix.n_in else f"result {t - ix.n_in}"
            if f == "partial":
                wants = f"pending {s.reduction_of(axis)} ({side})"
            elif f is None:
                wants = f"dim {s.dim_of(axis)} ({side}), not aligned with the op's factors"
            else:
                wants = f"factor {ix.letters[f]} on dim {s.dim_of(axis)} ({side})"
            out.append(Claim(vid, wants, p.tactic if p else None))
        self.step_count += 1
        parts = {self._part_of(c.value, axis) for c in out} - {None}
        c = Conflict(
            o, axis, tuple(out), reason, self.tactic, self.step_count, min(parts, default=self.part)
        )
        self.conflicts[(o, axis)] = c
        self.events.append(c)

    # -- result ----------------------------------------------------------------------------
    def state(self) -> State:
        """The state built so far (the final one once the tactic is done)."""
        for v in self.changed:
            self.sh[v] = canonical(self.sh[v])
        return State(
            shardings=MappingProxyType(self.sh),
            provenance=MappingProxyType(self.prov),
            conflicts=tuple(self.conflicts.values()),
            schedule=self.schedule,
            changed=frozenset(self.changed),
            notes=tuple(self.notes),
            events=tuple(self.events),
            parts=MappingProxyType(self.parts),
            pipeline=self.pipeline,
            fences=frozenset((o, a, f) for (o, a), fs in self.fences.items() for f in fs),
            rings=self.rings,
            balanced=self.balanced,
        )
