"""How one op runs on each device: which mesh axes split which of its factors.

Read off the layouts the state decided for the op's results, plus the contracting factors
its operands are tiled on; where the state leaves a choice, the way that moves the fewest
bytes. Hence the layout each operand must arrive in and each result comes out in. Cached
by factor mapping and tensor shardings, so the repeated layers of a model are planned once.
"""

from __future__ import annotations

import math

from workbench.core import caches
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import redistribute, steps_wire_bytes
from workbench.core.layout.sharding import Sharding, canonical
from workbench.core.layout.state import State
from workbench.core.propagate.propagation import OpIndex, walk_axes


def laid_out(s: Sharding, dims, partial=()) -> Sharding:
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
            operands.append(laid_out(sh[v], lay.dims_of(t), partial))
        results = []
        for j, v in enumerate(op.linked_results):
            t = ix.n_in + j
            partial = list(passed) if j < n_out else []
            for axis, kind in contracted:
                if j < n_out and t not in carriers[factor_of(axis)]:
                    partial.append((axis, kind))
            results.append(laid_out(sh[v], lay.dims_of(t), partial))
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
