"""Ring attention in the plan (``CP(kind="ring")``): which attentions run as rings, what
they fetch and make, and the transfers they add.

Each attention `anatomy.attention.region` finds runs as one step of the plan at its context
dot (forward) and at the first op of its backward pass, the ops between skipped. It reads
its queries as the scores dot would, its keys and values as they were made (split on their
sequence over the ring's axis), and any mask or bias as the mask's op would. Forward, the
keys and the values pass around the ring ``C - 1`` times; backward, again ``C - 1`` times,
with the gradients of the keys and values ``C`` times (the last hop returns them to their
owner), each gradient made split as its keys and values are. An attention whose layouts do
not allow this (another split of its sequence, a pending sum in its scores) runs by
gathering instead, as ``kind="all-gather"`` does, and the plan says why (``Plan.notes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.anatomy.attention import Pass, Region, region
from workbench.core.layout.collectives import Collective
from workbench.core.layout.redistribute import as_layout, redistribute
from workbench.core.layout.sharding import Sharding
from workbench.core.plan.op_layout import plan_op


@dataclass(frozen=True, slots=True)
class Ring:
    """One pass of one ring attention: where it runs, what it reads in which layout, and the
    layouts of what it makes."""

    region: Region
    axis: str
    size: int  # the devices on the ring
    kind: str  # "forward", "backward", or "replay" (a recomputation's output: the forward's)
    reads: tuple[tuple[int, Sharding], ...]  # value -> the layout it is read in
    makes: tuple[tuple[int, Sharding], ...]  # value -> the layout it is made in
    fetches: tuple = ()  # per read, the plan's ``Fetch`` of it (once planned)

    @property
    def backward(self) -> bool:
        return self.kind == "backward"

    @property
    def evaluated(self) -> Pass:
        """The pass whose ops it evaluates (its recomputation's, backward under remat)."""
        return self.region.forward if self.kind == "forward" else self.region.evaluated

    @property
    def at(self) -> int:
        if self.kind == "backward":
            return self.region.first_backward
        return self.evaluated.context


def rings(program, mesh, state, index) -> tuple[dict[int, Ring], frozenset[int], tuple[str, ...]]:
    """(op -> the ring that runs there, the ops the rings replace, notes) for the state's
    ring axes (``State.rings``)."""
    axes = state.rings
    if not axes:
        return {}, frozenset(), ()
    at, skipped, notes = {}, set(), []
    axis = axes[-1]
    for a in program.anatomy().layers.attention:
        r = region(program, a.scores, a.context)
        name = program.ops[a.scores].name
        if isinstance(r, str):
            notes.append(f"the attention at {name} runs by gathering on {axis!r}: {r}")
            continue
        made = _plan(program, mesh, state, index, r, axis)
        if isinstance(made, str):
            notes.append(f"the attention at {name} runs by gathering on {axis!r}: {made}")
            continue
        for ring in made:
            at[ring.at] = ring
        skipped |= r.skipped
    return at, frozenset(skipped), tuple(notes)


def _plan(program, mesh, state, index, r: Region, axis: str) -> tuple[Ring, ...] | str:
    f, e = r.forward, r.evaluated
    forward = _reads(program, mesh, state, index, f, axis)
    if isinstance(forward, str):
        return forward
    reads, out = forward
    backward = reads if e is f else _reads(program, mesh, state, index, e, axis)
    if isinstance(backward, str):
        return f"its recomputation under remat: {backward}"
    back_reads, replayed = (reads, out) if e is f else backward
    if replayed != out:
        return "its recomputation's output is laid out otherwise than its output"
    ops = program.ops
    dp = next(
        o for o in r.backward if r.cotangent in ops[o].operands and e.values in ops[o].operands
    )
    cot = plan_op(program, mesh, state, ops[dp], index[dp])[3][ops[dp].operands.index(r.cotangent)]
    if cot.partial:
        return "its output's gradient arrives with a sum pending"
    dtypes = [program.values[g].dtype for g in r.grads]
    grads = tuple(
        (g, Sharding(lay.shape, dt, lay.dims))
        for g, (_, lay), dt in zip(r.grads, back_reads[:3], dtypes)
    )
    size = mesh.axis_size(axis)
    rings = [
        Ring(r, axis, size, "forward", reads, ((f.out, out),)),
        Ring(r, axis, size, "backward", (*back_reads, (r.cotangent, cot)), grads),
    ]
    if r.replay is not None:
        rings.append(Ring(r, axis, size, "replay", (), ((e.out, out),)))
    return tuple(rings)


def _reads(program, mesh, state, index, p: Pass, axis: str):
    """(what a ring over ``p`` reads, in which layouts: queries, keys, values, masks; its
    output's layout), or why it cannot run as one."""
    ops = program.ops

    def planned(o):
        return plan_op(program, mesh, state, ops[o], index[o])

    s_plan, c_plan = planned(p.scores), planned(p.context)
    if s_plan[1] or c_plan[1]:
        return "its scores or context leave a sum pending (their contracted dims are split)"
    own = {x: as_layout(state.shardings[x]) for x in (p.keys, p.values)}
    for x, seq, o, plan in ((p.keys, p.keys_seq, p.scores, s_plan),
                            (p.values, p.values_seq, p.context, c_plan)):  # fmt: skip
        what = "keys" if x == p.keys else "values"
        if own[x].dims[seq] != (axis,) or own[x].partial:
            return f"its {what} are not split on their sequence by {axis!r} alone"
        steps = redistribute(own[x], plan[3][ops[o].operands.index(x)], mesh)
        if [(s.kind, s.axes, s.dim) for s in steps] != [("all-gather", (axis,), seq)]:
            return f"its {what} are read otherwise than gathered on their sequence"
    queries = s_plan[3][ops[p.scores].operands.index(p.queries)]
    if queries.partial or axis not in {a for d in queries.dims for a in d}:
        return f"its queries are not split on {axis!r}"
    out = c_plan[4][0]
    if out.partial:
        return "its output leaves a sum pending"
    sides, keyed = [], dict(p.sides)
    for o in p.chain:
        lays = planned(o)[3]
        for t, x in enumerate(ops[o].operands):
            if isinstance(x, int) and x in keyed:
                if keyed[x] is not None and lays[t].dims[keyed[x]]:
                    return "a mask or bias of its scores is split on the keys"
                sides.append((x, lays[t]))
    sides = list(dict.fromkeys(sides))
    if len({x for x, _ in sides}) != len(sides):
        return "a mask or bias of its scores is read in two layouts"
    base = [(p.queries, queries), (p.keys, own[p.keys]), (p.values, own[p.values])]
    return (*base, *sides), as_layout(out)


def transfers(program, mesh, ring: Ring, repeat: int, tactic) -> list[Collective]:
    """The ring's collective-permutes, one per hop (``step``: the hop): per pass, the keys
    and the values ``C - 1`` times; backward, the gradients of both ``C`` times."""
    r, p, c = ring.region, ring.evaluated, ring.size
    if ring.kind == "replay":
        return []
    reads = dict(ring.reads)
    moved = [(p.keys, reads[p.keys], c - 1), (p.values, reads[p.values], c - 1)]
    if ring.backward:  # the gradients travel as their float32 accumulators
        f32 = np.dtype(np.float32)
        moved += [(g, Sharding(lay.shape, f32, lay.dims), c) for g, lay in ring.makes[1:]]
    out = []
    for v, lay, n in moved:
        name = program.values[v].name
        what = "gradient" if v in r.grads else "block"
        for hop in range(n):
            out.append(
                Collective(
                    "collective-permute",
                    v,
                    (ring.axis,),
                    lay.local_nbytes(mesh),
                    ring.at,
                    tactic,
                    lay,
                    lay,
                    why=f"ring attention passes each {what} of {name} to the next device on "
                    f"{ring.axis!r} (hop {hop + 1} of {n}, {ring.kind})",
                    count=repeat,
                    step=hop,
                )
            )
    return out
