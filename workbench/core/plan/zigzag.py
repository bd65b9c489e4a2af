"""Causal load balancing in the plan (``CP(kind="ring", balance=True)``).

Under a causal mask the device holding the sequence's first part would skip most of a
ring's blocks and the one holding its last part none, so each step waits for the last.
Balanced, every dim split over the ring's axis alone with a ring's sequence length is cut
into ``2C`` chunks and device ``i`` holds chunks ``i`` and ``2C - 1 - i`` (``Zigzag``):
each step, every device computes about half a block. Only the positions move: ops that
pair elements (elementwise ops, dots, reductions) run as they are; a count along the
sequence (an iota: positions, a causal mask) counts the device's own positions; the
data inputs arrive in order and are put in this one by two transfers of half a block
each, the outputs put back the same way; a gather of the sequence puts it back in
order, a split of a whole one takes the device's chunks.

A plan the order cannot follow (the sequence split with other axes, merged into another
dim, or read by an op that indexes positions: a gather, a random draw) keeps it in order
and says why (``Plan.notes``).
"""

from __future__ import annotations

import numpy as np

from workbench.core import ops
from workbench.core.layout.collectives import Collective
from workbench.core.layout.sharding import Sharding
from workbench.core.ops.local import Zigzag
from workbench.core.propagate.propagation import op_index


def balance(program, mesh, state, plan) -> tuple[Zigzag | None, str | None]:
    """The balanced order ``plan`` runs in (None: in order), and why not where asked."""
    if not state.balanced or not plan.rings:
        return None, None
    axis = state.balanced[-1]
    c = mesh.axis_size(axis)
    lengths = set()
    for ring in plan.rings.values():
        p = ring.region.forward
        n = program.values[p.keys].shape[p.keys_seq]
        rows = [s for s in program.values[p.queries].shape if s == n]
        if not rows:
            return None, _why(axis, "an attention's queries and keys differ in length")
        if n % (2 * c):
            return None, _why(axis, f"its sequence ({n}) is not a multiple of 2 x {c} chunks")
        lengths.add(n)
    z = Zigzag(axis, c, frozenset(lengths))
    why = _unfollowed(program, mesh, state, plan, z)
    return (None, _why(axis, why)) if why else (z, None)


def _why(axis: str, reason: str) -> str:
    return f"the sequence on {axis!r} stays in order (no causal load balancing): {reason}"


def _unfollowed(program, mesh, state, plan, z: Zigzag) -> str | None:
    """Why ``plan`` cannot hold the sequence in ``z``'s order, or None."""
    for layout in _layouts(program, state, plan):
        for d, axes in enumerate(layout.dims):
            if z.axis in axes and axes != (z.axis,) and layout.shape[d] in z.lengths:
                return f"a value of shape {layout.shape} is split on dim {d} over {axes}"
    for fetch in _fetches(plan):
        for step in fetch.steps:
            for d in range(len(step.before.dims)):
                was, now = z.applies(step.before, d), z.applies(step.after, d)
                if step.kind == "collective-permute" and (was or now):
                    return f"{program.values[fetch.value].name} reorders the axes of its sequence"
                if was != now and (step.after if was else step.before).dims[d]:
                    return f"{program.values[fetch.value].name} moves its sequence between axes"
    index = op_index(program)
    for p in plan.ops:
        if p is None or p.op in plan.skipped:
            continue
        layouts = (*p.operands, *p.results)
        held = {
            (t, d)
            for t, lay in enumerate(layouts)
            if lay is not None
            for d in range(len(lay.dims))
            if z.applies(lay, d)
        }
        if not held:
            continue
        op, ix = program.ops[p.op], index[p.op]
        free = getattr(ops.local_lowering(op.primitive), "order_free", False)
        if not (free(op, layouts[: ix.n_in], z) if callable(free) else free):
            return f"{op.name} ({op.primitive}) indexes positions along the sequence"
        for t, d in held:
            for f in ix.dims[t][d]:
                for t2, d2 in ix.where[f]:
                    if layouts[t2] is not None and (t2, d2) not in held:
                        return f"{op.name} ({op.primitive}) merges or splits the sequence"
    return None


def _layouts(program, state, plan):
    for v in program.inputs:
        yield state.shardings[v]
    for p in plan.ops:
        if p is not None:
            yield from (lay for lay in (*p.operands, *p.results) if lay is not None)
    for fetch in _fetches(plan):
        yield fetch.dst
        for step in fetch.steps:
            yield step.before
            yield step.after


def _fetches(plan):
    for p in plan.ops:
        if p is not None:
            yield from (f for f in p.fetches if f is not None)
    yield from (f for f in (*plan.outputs, *plan.probes) if f is not None)
    for ring in plan.rings.values():
        yield from (f for f in ring.fetches if f is not None)


def held(layout, z: Zigzag | None) -> int | None:
    """The dim of ``layout`` held in ``z``'s order, if any."""
    if z is None:
        return None
    return next((d for d in range(len(layout.dims)) if z.applies(layout, d)), None)


def agreements(program, plan, z: Zigzag) -> list[Collective]:
    """The all-reduces a balanced ring's passes run to agree, over the ring, on a bound of
    its scores (each pass) and on whether to rerun every pair (forward): one float32 each."""
    out = []
    f32 = Sharding.unsharded((), np.dtype(np.float32))
    for ring in plan.rings.values():
        if ring.kind == "replay":
            continue
        what = ["the largest norm of its keys"]
        what += ["whether a row of any device sees no key"] * (ring.kind == "forward")
        for i, agreed in enumerate(what):
            out.append(
                Collective(
                    "all-reduce",
                    ring.evaluated.keys,
                    (z.axis,),
                    4,
                    ring.at,
                    None,
                    f32.with_partial(z.axis, "max"),
                    f32,
                    reduction="max",
                    why=f"the balanced ring ({ring.kind}) agrees on {agreed} over {z.axis!r}",
                    step=i,
                )
            )
    return out


def transfers(program, mesh, state, plan, z: Zigzag) -> list[Collective]:
    """The transfers that put the data inputs in the balanced order and the outputs back:
    two collective-permutes of half a block each per value."""
    out = []
    ends = [(v, state.shardings[v], "input") for v in program.inputs]
    ends += [(f.value, f.dst, "output") for f in plan.outputs if f is not None]
    for v, lay, end in ends:
        d = held(lay, z)
        if d is None:
            continue
        at = next(iter(program.users[v]), None) if end == "input" else None
        what = "into the balanced order" if end == "input" else "back in order"
        for half in range(2):
            out.append(
                Collective(
                    "collective-permute",
                    v,
                    (z.axis,),
                    lay.local_nbytes(mesh) // 2,
                    at,
                    None,
                    lay,
                    lay,
                    dim=d,
                    why=f"causal load balancing puts the {end} {program.values[v].name} "
                    f"{what} on {z.axis!r} (half {half + 1} of each block)",
                    step=half,
                )
            )
    return out
