"""The execution plan: how every op runs on each device, and what moves between them.

For each op the plan fixes which mesh axes split which of its factors (read off the
layouts the state decided for its results, plus the contracting factors its operands
are tiled on), hence the layout each operand must arrive in and the layout each result
comes out in. Operands are fetched into those layouts from the cheapest layout already
materialised (a value reduced once serves every later use), and every fetch is a
redistribution whose collectives make up the plan's collective list. The explicit
lowering performs exactly this plan and the simulator prices it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from workbench.core import caches
from workbench.core.gcpause import without_gc
from workbench.core.layout.collectives import Collective
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import (
    Step,
    as_layout,
    cost_bytes,
    peak_bytes,
    redistribute,
    steps_wire_bytes,
)
from workbench.core.layout.sharding import Sharding, canonical
from workbench.core.layout.state import State
from workbench.core.propagate.propagation import OpIndex, op_index, walk_axes


@dataclass(frozen=True, slots=True)
class Fetch:
    """Bring ``value`` from an available layout ``src`` into ``dst``, by ``steps``.

    ``copy`` numbers the copies of ``dst`` the plan makes of the value (``src_copy`` the one
    read): a layout gathered in one phase is made again in another (``Planner.fetch``).
    """

    value: int
    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]
    copy: int = 0
    src_copy: int = 0


@dataclass(frozen=True, slots=True)
class OpPlan:
    """How one op runs: its factors' axes, operand layouts in, result layouts out."""

    op: int
    factor_axes: Mapping[int, tuple[str, ...]]
    contracted: tuple[
        tuple[str, str], ...
    ]  # (axis, reduction) the op leaves pending by contracting
    passed: tuple[tuple[str, str], ...]  # (axis, reduction) pending reductions it passes on
    operands: tuple[Sharding | None, ...]  # per linked operand: the layout it needs (None: literal)
    results: tuple[Sharding, ...]  # per linked result: the layout it produces
    fetches: tuple[Fetch | None, ...]  # per linked operand (region outputs: at the end of the body)
    repeats: int = 1  # how many times it runs per step


@dataclass(frozen=True, slots=True)
class Plan:
    ops: tuple[OpPlan | None, ...]  # by op id
    outputs: tuple[Fetch | None, ...]  # per program output
    collectives: tuple[Collective, ...]
    # values some fetch redistributes (a collective or a local step reads them from memory)
    redistributed: frozenset[int] = frozenset()
    probes: tuple[Fetch, ...] = ()  # per probed value (see ``build_plan``), after the outputs

    def op(self, op_id: int) -> OpPlan:
        return self.ops[op_id]


def _layout(s: Sharding, dims, partial=()) -> Sharding:
    return Sharding(s.shape, s.dtype, tuple(dims), tuple(sorted(partial)))


def _prod(axes, size) -> int:
    return math.prod(size[a] for a in axes)


class _OpLayout:
    """Works out one op's factor axes from the state (see module doc)."""

    def __init__(self, program, mesh: Mesh, state: State, op, ix: OpIndex):
        self.program, self.state, self.op, self.ix = program, state, op, ix
        self.m = ix.mapping
        self.size = mesh.shape
        self.fa: dict[int, tuple[str, ...]] = {}

    def assigned(self) -> set[str]:
        return {a for axes in self.fa.values() for a in axes}

    def claim(self, t: int, axis: str):
        """(factor, prefix) that tensor ``t`` puts ``axis`` on, or None."""
        vid = self.ix.tensors[t]
        if vid < 0:
            return None
        s = self.state.shardings[vid]
        d = s.dim_of(axis)
        if d is None:
            return None
        walked = walk_axes(self.ix.dims[t][d], self.m.sizes, s.dims[d], self.size)
        if walked is None:
            return None
        return walked[0][s.dims[d].index(axis)]

    def from_results(self) -> None:
        ix, m = self.ix, self.m
        n_out = len(self.op.results)
        order = list(range(ix.n_in + n_out, len(ix.tensors))) + list(
            range(ix.n_in, ix.n_in + n_out)
        )
        for t in order:
            s = self.state.shardings[ix.tensors[t]]
            for d, axes in enumerate(s.dims):
                walked = walk_axes(ix.dims[t][d], m.sizes, axes, self.size) if axes else None
                if walked is None:
                    continue
                for axis, (f, prefix) in zip(axes, walked[0]):
                    have = self.fa.get(f, ())
                    if axis in have:
                        continue
                    if f in m.blocked or have != prefix:
                        break
                    self.fa[f] = (*have, axis)

    def claim_prefix(self, axis: str, f: int):
        """The axes before ``axis`` on factor ``f`` in the operands that claim it."""
        for t in range(self.ix.n_in):
            claim = self.claim(t, axis)
            if claim is not None and claim[0] == f:
                return claim[1]
        return None

    def contracting_claim(self, axis: str, kind: str | None):
        """The contracting factor the operands agree to split on ``axis``, or None."""
        claims = {self.claim(t, axis) for t in range(self.ix.n_in)} - {None}
        if len(claims) != 1:
            return None
        ((f, prefix),) = claims
        if f not in self.m.contracting or self.fa.get(f, ()) != prefix:
            return None
        if kind is not None and kind != self.m.reduction:
            return None
        return f, prefix

    def contraction(self, axis: str, kind: str | None) -> bool:
        """Split a contracting factor on ``axis`` if the operands agree on one."""
        claim = self.contracting_claim(axis, kind)
        if claim is not None:
            self.fa[claim[0]] = (*claim[1], axis)
        return claim is not None

    def scatter_into_contraction(self, axis: str, mesh: Mesh) -> int | None:
        """A contracting factor to reduce-scatter a pending-sum operand onto, when that beats
        reducing it whole: the op then contracts locally and leaves its result pending."""
        sh, ix, m = self.state.shardings, self.ix, self.m
        pending = [
            t
            for t in range(ix.n_in)
            if ix.tensors[t] >= 0 and sh[ix.tensors[t]].reduction_of(axis) == "sum"
        ]
        if len(pending) != 1 or any(
            ix.tensors[t] >= 0 and sh[ix.tensors[t]].dim_of(axis) is not None
            for t in range(ix.n_in)
        ):
            return None
        (t,) = pending
        if not any(t in group and len(group) == 1 for group in m.linear):
            return None
        if len(self.program.users[ix.tensors[t]]) != 1:
            return None  # another use needs it whole anyway: reduce it once, slice for free
        operand = sh[ix.tensors[t]]
        for d, factors in enumerate(ix.dims[t]):
            for f in factors[:1]:
                if f in m.contracting and not self.fa.get(f) and m.sizes[f] % self.size[axis] == 0:
                    if operand.shape[d] % (operand.shards(d, mesh) * self.size[axis]):
                        continue
                    whole = 2 * operand.local_nbytes(mesh)
                    results = ix.tensors[ix.n_in : ix.n_in + len(self.op.results)]
                    scattered = operand.local_nbytes(mesh) + sum(
                        2 * sh[v].local_nbytes(mesh) for v in results
                    )
                    if scattered < whole:
                        return f
        return None

    def passing(self, axis: str, kind: str) -> tuple[int, ...] | None:
        """The operands a pending ``kind`` over ``axis`` passes through, if the op allows it."""
        ix, m = self.ix, self.m
        partial = tuple(
            t
            for t in range(ix.n_in)
            if ix.tensors[t] >= 0 and self.state.shardings[ix.tensors[t]].reduction_of(axis) == kind
        )
        if not partial:
            return None
        if kind == "sum" and any(set(g) == set(partial) for g in m.linear):
            return partial
        if m.structural and partial == (0,):
            return partial
        return None

    def expressible(self) -> None:
        """Drop axes until every tensor's layout is one a device can hold."""
        ix, m = self.ix, self.m
        changed = True
        while changed:
            changed = False
            for dims in ix.dims:
                seen: set[str] = set()
                for factors in dims:
                    covered = True
                    for f in factors:
                        axes = self.fa.get(f, ())
                        if axes and (not covered or seen & set(axes)):
                            self.fa[f] = axes[:-1]
                            changed = True
                            break
                        seen |= set(axes)
                        covered = covered and _prod(axes, self.size) == m.sizes[f]
                    if changed:
                        break
                if changed:
                    break

    def dims_of(self, t: int) -> tuple[tuple[str, ...], ...]:
        return tuple(
            tuple(a for f in factors for a in self.fa.get(f, ())) for factors in self.ix.dims[t]
        )


_PLAN_CACHE: dict = {}
caches.register("plan.op layouts", _PLAN_CACHE.clear)


def plan_op(program, mesh: Mesh, state: State, op, ix: OpIndex) -> tuple:
    """(factor_axes, contracted, passed, operand layouts, result layouts) for one op.

    Cached by the op's factor mapping and its tensors' shardings: the repeated layers of a
    model are planned once.
    """
    tensors = tuple(state.shardings[v] if v >= 0 else None for v in ix.tensors)
    key = (mesh, ix.mapping, tensors, len(op.results), bool(op.regions))
    hit = _PLAN_CACHE.get(key)
    if hit is None:
        if len(_PLAN_CACHE) > 200_000:
            _PLAN_CACHE.clear()
        fa, contracted, passed, operands, results = _plan_op(program, mesh, state, op, ix)
        operands = tuple(None if s is None else canonical(s) for s in operands)
        results = tuple(canonical(s) for s in results)
        hit = _PLAN_CACHE[key] = (fa, contracted, passed, operands, results)
    return hit


def _plan_op(program, mesh: Mesh, state: State, op, ix: OpIndex) -> tuple:
    lay = _OpLayout(program, mesh, state, op, ix)
    m = ix.mapping
    sh = state.shardings
    lay.from_results()
    contracted: list[tuple[str, str]] = []
    passed: list[tuple[str, str]] = []
    pass_groups: dict[str, tuple[int, ...]] = {}
    n_out = len(op.results)
    result_partials = sorted(
        {p for t in range(ix.n_in, ix.n_in + n_out) for p in sh[ix.tensors[t]].partial}
    )
    for axis, kind in result_partials:
        if axis in lay.assigned() or any(a == axis for a, _ in contracted + passed):
            continue
        if lay.contraction(axis, kind):
            contracted.append((axis, kind))
        elif (group := lay.passing(axis, kind)) is not None:
            passed.append((axis, kind))
            pass_groups[axis] = group
    carriers = {f: {t for t, _ in ix.where.get(f, ())} for f in ix.where}

    def layouts(fa, contracted):
        """Operand layouts in and result layouts out, for factor axes ``fa``."""
        lay.fa = fa

        def factor_of(axis):
            return next(f for f, axes in fa.items() if axis in axes)

        operands = []
        for t, v in enumerate(op.linked_operands):
            if not isinstance(v, int):
                operands.append(None)
                continue
            partial = [(a, k) for a, k in passed if t in pass_groups[a]]
            for axis, _kind in contracted:
                f = factor_of(axis)
                if t not in carriers[f] and any(t in g and carriers[f] & set(g) for g in m.linear):
                    partial.append((axis, "sum"))  # joins a sum the op forms: contributes once
            operands.append(_layout(sh[v], lay.dims_of(t), partial))
        results = []
        for j, v in enumerate(op.linked_results):
            t = ix.n_in + j
            partial = list(passed) if j < n_out else []
            for axis, kind in contracted:
                if j < n_out and t not in carriers[factor_of(axis)]:
                    partial.append((axis, kind))
            results.append(_layout(sh[v], lay.dims_of(t), partial))
        return operands, results

    def cost(fa, contracted) -> float:
        """Wire bytes to bring the operands in and take the results to their decided layouts."""
        operands, results = layouts(fa, contracted)
        total = 0.0
        for v, need in zip(op.linked_operands, operands):
            if need is not None:
                total += steps_wire_bytes(redistribute(sh[v], need, mesh), mesh)
        for v, made in zip(op.linked_results[:n_out], results[:n_out]):
            total += steps_wire_bytes(redistribute(made, sh[v], mesh), mesh)
        return total

    def decided(axis) -> bool:
        return any(a == axis for a, _ in contracted + passed)

    # Where the state leaves the op a choice on an axis (an operand is tiled along a factor the
    # results do not put the axis on), run it the way that moves the fewest bytes.
    for axis in mesh.names:
        if decided(axis) or m.barrier or op.regions:
            continue
        current = next((f for f, axes in lay.fa.items() if axis in axes), None)
        if current is not None and lay.fa[current][-1] != axis:
            continue  # a major axis of a factor split over several: moving it would reorder them
        options = {current}
        for t in range(ix.n_in):
            claim = lay.claim(t, axis)
            if claim is not None and claim[0] not in m.blocked and claim[0] != current:
                options.add(claim[0])
        if len(options) == 1:
            continue
        options.add(None)
        best = None
        baseline = dict(lay.fa)
        for f in sorted(options, key=lambda f: (f != current, -1 if f is None else f)):
            fa = {g: tuple(a for a in axes if a != axis) for g, axes in baseline.items()}
            new_contracted = [(a, k) for a, k in contracted if a != axis]
            if f == current:
                fa, new_contracted = dict(baseline), list(contracted)
            elif f is not None:
                if fa.get(f, ()) != (lay.claim_prefix(axis, f) or ()):
                    continue
                fa[f] = (*fa.get(f, ()), axis)
                if f in m.contracting:
                    new_contracted.append((axis, m.reduction))
            lay.fa = fa
            lay.expressible()
            fa = dict(lay.fa)
            new_contracted = [
                (a, k) for a, k in new_contracted if any(a in axes for axes in fa.values())
            ]
            c = cost(fa, new_contracted)
            if best is None or c < best[0]:
                best = (c, fa, new_contracted)
        lay.fa, contracted = best[1], best[2]
    # a pending sum entering a contraction, used only here: reduce-scatter it onto the factor
    for axis in mesh.names:
        if not decided(axis) and axis not in lay.assigned() and m.reduction == "sum":
            f = lay.scatter_into_contraction(axis, mesh)
            if f is not None:
                lay.fa[f] = (axis,)
                contracted.append((axis, "sum"))
    lay.expressible()
    contracted = [(a, k) for a, k in contracted if a in lay.assigned()]
    fa = dict(lay.fa)
    operands, results = layouts(fa, contracted)
    return fa, tuple(contracted), tuple(passed), tuple(operands), tuple(results)


class Planner:
    """Walks the program in order, choosing layouts and fetches exactly as the lowering runs."""

    def __init__(self, program, mesh: Mesh, state: State):
        self.program, self.mesh, self.state = program, mesh, state
        self.index = op_index(program)
        self.scopes: list[list[int]] = []  # per open scope, the values given layouts in it
        # value -> layout (no tactic pins) -> (scope depth, the fetch that reads it as it is,
        # the phase that gathered it or None)
        self.versions: dict[int, dict[Sharding, tuple[int, Fetch, str | None]]] = {}
        self.copies: dict[tuple[int, Sharding], int] = {}  # (value, layout) -> copies made
        self.ops: list[OpPlan | None] = [None] * len(program.ops)
        self.collectives: list[Collective] = []
        self.redistributed: set[int] = set()
        self.repeat = 1

    def add(self, v: int, layout: Sharding, gathered_in: str | None = None) -> int:
        """Make ``layout`` of ``v`` available; returns its copy number."""
        layout = as_layout(layout)
        key = (v, layout)
        copy = self.copies[key] = self.copies.get(key, -1) + 1
        self.versions.setdefault(v, {})[layout] = (
            len(self.scopes),
            Fetch(v, layout, layout, (), copy, copy),
            gathered_in,
        )
        self.scopes[-1].append(v)
        return copy

    def open_scope(self) -> None:
        self.scopes.append([])

    def close_scope(self) -> None:
        depth = len(self.scopes)
        for v in set(self.scopes.pop()):
            kept = {k: entry for k, entry in self.versions[v].items() if entry[0] < depth}
            if kept:
                self.versions[v] = kept
            else:
                del self.versions[v]

    def fetch(self, v, dst: Sharding | None, consumer: int | None) -> Fetch | None:
        """Bring ``v`` into ``dst`` for ``consumer`` from the cheapest layout available to it.

        A layout gathered in one phase (forward, backward, update) serves that phase only:
        the next gathers it again rather than hold it in between, as FSDP and Megatron's
        sequence parallelism do (and as a loop does: each pass over the layers gathers its
        own). So the gathered weights of a layer are not all live at the turn of the step.
        """
        if dst is None or not isinstance(v, int):
            return None
        versions = self.versions.get(v)
        if not versions:
            raise AssertionError(f"value {self.program.values[v].name} used before it is defined")
        phase = None if consumer is None else self.program.ops[consumer].phase
        dst = as_layout(dst)
        hit = versions.get(dst)
        if hit is not None and (hit[2] is None or phase is None or hit[2] == phase):
            return hit[1]
        best = None
        for s, (_, held, gathered_in) in versions.items():
            if gathered_in is not None and phase is not None and gathered_in != phase:
                continue
            steps = redistribute(s, dst, self.mesh)
            cost = (cost_bytes(steps), peak_bytes(steps, s, self.mesh), len(steps))
            if best is None or cost < best[0]:
                best = (cost, s, steps, held.copy)
        _, src, steps, src_copy = best
        gathers = any(st.kind == "all-gather" for st in steps)
        copy = self.add(v, dst, phase if gathers else None)
        if steps:
            self.redistributed.add(v)
        self.record(v, steps, consumer)
        return Fetch(v, src, dst, steps, copy, src_copy)

    def record(self, v: int, steps, consumer: int | None) -> None:
        for i, step in enumerate(steps):
            if step.is_collective:
                tactic = self.tactic_for(v, step.axes, consumer)
                self.collectives.append(
                    Collective(
                        kind=step.kind,
                        value=v,
                        axes=step.axes,
                        bytes=step.bytes,
                        op=consumer,
                        tactic=tactic,
                        src=step.before,
                        dst=step.after,
                        dim=step.dim,
                        dim_from=step.dim_from,
                        reduction=step.reduction,
                        why=collective_why(self.program, step, v, consumer),
                        count=self.repeat,
                        step=i,
                    )
                )

    def tactic_for(self, v: int, axes, consumer: int | None) -> int | None:
        prov = self.state.provenance
        for axis in axes:
            if (v, axis) in prov:
                return prov[(v, axis)].tactic
        if consumer is not None:
            for r in self.program.ops[consumer].results:
                for axis in axes:
                    if (r, axis) in prov:
                        return prov[(r, axis)].tactic
        return None

    def run(self, probes=()) -> Plan:
        p = self.program
        self.open_scope()
        for v in p.inputs:
            self.add(v, self.state.shardings[v])
        for v in p.consts:
            if p.values[v].region_of is None:
                self.add(v, p.values[v].type_sharding())
        self.walk(p.body)
        outputs = tuple(
            self.fetch(v, _layout(self.state.shardings[v], self.state.shardings[v].dims), None)
            if isinstance(v, int)
            else None
            for v in p.outputs
        )
        probed = tuple(
            self.fetch(v, _layout(self.state.shardings[v], self.state.shardings[v].dims), None)
            for v in probes
        )
        return Plan(
            tuple(self.ops),
            outputs,
            tuple(self.collectives),
            frozenset(self.redistributed),
            probed,
        )

    def walk(self, op_ids) -> None:
        p = self.program
        for o in op_ids:
            op = p.ops[o]
            ix = self.index[o]
            fa, contracted, passed, operands, results = plan_op(p, self.mesh, self.state, op, ix)
            n_outer = len(op.operands)
            fetches = [self.fetch(v, operands[t], o) for t, v in enumerate(op.operands)]
            n_res = len(op.results)
            region_in = n_res
            region_out = n_outer
            for region in op.regions:
                saved = self.repeat
                if op.primitive == "scan":
                    self.repeat *= int(op.params["length"])
                self.open_scope()
                for k, v in enumerate(region.inputs):
                    self.add(v, results[region_in + k])
                for v in p.consts:
                    if p.values[v].region_of == o:
                        self.add(v, p.values[v].type_sharding())
                self.walk(region.ops)
                for k, v in enumerate(region.outputs):
                    fetches.append(self.fetch(v, operands[region_out + k], o))
                self.close_scope()
                self.repeat = saved
                region_in += len(region.inputs)
                region_out += len(region.outputs)
            for j, v in enumerate(op.results):
                self.add(v, results[j])
            self.ops[o] = OpPlan(
                o, fa, contracted, passed, operands, results, tuple(fetches), self.repeat
            )


@without_gc
def build_plan(program, mesh: Mesh, state: State, probes=()) -> Plan:
    """The execution plan of ``state`` (see module doc). ``probes``: top-level values the
    program also returns, after its outputs, in their decided layouts with pending
    reductions done (a run's verdict reads them to find where two runs part)."""
    return Planner(program, mesh, state).run(tuple(probes))


def collective_why(program, step: Step, v: int, consumer: int | None) -> str:
    """One sentence saying why a collective is there."""
    name = program.values[v].name
    who = program.ops[consumer].name if consumer is not None else "the program's output"
    axes = ",".join(step.axes)
    if step.kind == "all-reduce":
        return f"{name} is a pending {step.reduction} over {axes}; {who} needs it whole"
    if step.kind == "reduce-scatter":
        return (
            f"{name} is a pending sum over {axes}; {who} needs it tiled on dim {step.dim}, "
            "so it is reduced and scattered at once"
        )
    if step.kind == "all-gather":
        return f"{name} is tiled on dim {step.dim} over {axes}; {who} needs that dim whole"
    if step.kind == "all-to-all":
        return (
            f"{who} needs {name} split on dim {step.dim} over {axes} instead of dim {step.dim_from}"
        )
    return f"{who} needs the axes of dim {step.dim} of {name} in the order {','.join(step.order or ())}"
