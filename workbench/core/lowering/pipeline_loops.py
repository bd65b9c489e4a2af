"""A pipelined step whose repeated blocks run under a loop (scanned layers).

Every stage runs the forward loop over its own contiguous range of the loop's iterations
(`Stage.blocks`): the loop's per-iteration operands (the stacked parameters) sliced to the
range, its carry in what the previous stage sent (stage 0: what its own ops made). The
backward loop likewise runs its reversed range, reading the stacks the stage's forward
saved; its carry in is what the next stage sent (the last: its own head's cotangent). A
stage sends its loop's carry *out* in place of the carry *in* (``LoopParts.sends``). The
stacked gradients come out per range, are summed over microbatches, and are concatenated
over the stages before the update, which runs once.

Supported: one forward and one backward loop over the stacked parameters, each with
per-iteration operands (a scan); their carries made by the first (forward) and last
(backward) stage; the forward loop's stacks read by the backward loop alone; the
backward loop's stacks read after the pipeline alone. Anything else is refused, saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jax import lax

from workbench.core.errors import InputError
from workbench.core.ops import traits as traits_of


@dataclass(frozen=True, slots=True)
class LoopParts:
    """The loops a pipeline splits by iterations. ``ranges[s]``: stage s's iterations
    [a, b); ``sends``: carry-in value -> the carry-out value a stage sends in its place;
    ``local``: the loops' stacked results, a stage holding its range only; ``fresh``:
    the forward loop's (its backward's operands already cut to the range)."""

    forward: int
    backward: int
    ranges: tuple[tuple[int, int], ...]
    sends: dict
    local: frozenset
    fresh: frozenset
    carry_out: dict  # loop op -> its carry-out values


def _refuse(program, why: str) -> InputError:
    return InputError(
        f"{program.name!r} runs its blocks under a loop (scan), and the pipeline lowering "
        f"splits such a loop's iterations only when {why} (estimate() prices it anyway). "
        "Write the layers as repeated modules (unrolled) to run it pipelined."
    )


def roles(program, o: int) -> tuple[str, ...]:
    """The role of each outer operand of loop ``o`` ("const", "carry", "x")."""
    op = program.ops[o]
    regions = traits_of(op.primitive).control.regions(op.params, op.operands)
    return tuple(regions[0][2]) if len(regions) == 1 else ()


def _outer(op) -> tuple[int, ...]:
    """The loop's results: its carries out, then its stacks."""
    return tuple(op.results)


def loop_parts(program, cuts) -> LoopParts | None:
    """The loops ``cuts`` splits by iterations (None: unrolled blocks), checked."""
    if cuts.loop is None:
        return None
    ops, S = program.ops, len(cuts.stages)
    looped = set(cuts.looped)
    loops = []
    for o in program.body:
        t = traits_of(ops[o].primitive).control
        if o in looped and t is not None and t.kind == "loop":
            loops.append(o)
    backward = [o for o in loops if ops[o].phase == "backward"]
    if cuts.loop not in loops or len(backward) != 1 or len(loops) != 2:
        raise _refuse(program, "it has one forward and one backward loop over the blocks")
    fwd, bwd = cuts.loop, backward[0]
    trips = {}
    for o in (fwd, bwd):
        r, control = roles(program, o), traits_of(ops[o].primitive).control
        if "x" not in r or not hasattr(control, "trips"):
            raise _refuse(program, "its loops take per-iteration operands (a scan)")
        trips[o] = control.trips(ops[o].params)
    L = trips[fwd]
    ranges = tuple((st.blocks[0], st.blocks[-1] + 1) for st in cuts.stages)
    contiguous = all(st.blocks == tuple(range(a, b)) for st, (a, b) in zip(cuts.stages, ranges))
    if trips[bwd] != L or not contiguous or ranges[-1][1] != L:
        raise _refuse(program, "each stage runs a contiguous range of both loops' iterations")
    sends, carry_out, stacks = {}, {}, {}
    for o in (fwd, bwd):
        r, op = roles(program, o), ops[o]
        carries = [v for v, k in zip(op.operands, r) if k == "carry"]
        outer = _outer(op)
        carry_out[o] = outer[: len(carries)]
        stacks[o] = outer[len(carries) :]
        for v, out in zip(carries, carry_out[o]):
            if not isinstance(v, int):
                raise _refuse(program, "its loops' carries are values a stage makes")
            sends[v] = out
    lp = LoopParts(
        fwd,
        bwd,
        ranges,
        sends,
        frozenset(stacks[fwd]) | frozenset(stacks[bwd]),
        frozenset(stacks[fwd]),
        carry_out,
    )
    _check_uses(program, cuts, lp, S)
    return lp


def _check_uses(program, cuts, lp: LoopParts, S: int) -> None:
    """Each loop-made value is read only where a stage holds it whole."""
    top, users = program.top_level, program.users
    first = {top[o] for o in (*cuts.stages[0].forward, *cuts.stages[0].backward)}
    last = {top[o] for o in (*cuts.stages[-1].forward, *cuts.stages[-1].backward)}
    staged = {top[o] for st in cuts.stages for o in (*st.forward, *st.backward)}
    fr, bw = program.ops[lp.forward], program.ops[lp.backward]
    r_f, r_b = roles(program, lp.forward), roles(program, lp.backward)
    allowed = {v: {lp.forward} | first for v, k in zip(fr.operands, r_f) if k == "carry"}
    allowed |= {v: {lp.backward} | last for v, k in zip(bw.operands, r_b) if k == "carry"}
    allowed |= {v: last for v in lp.carry_out[lp.forward]}
    allowed |= {v: first for v in lp.carry_out[lp.backward]}
    allowed |= {v: {lp.backward} for v in lp.fresh}
    for v, ok in allowed.items():
        bad = {top[u] for u in users[v]} - ok
        if bad:
            o = program.ops[min(bad)]
            raise _refuse(
                program,
                f"its loops' carries and stacks are read where a stage holds them whole "
                f"(value {v} is read by op {o.id}, {o.primitive}, {o.phase})",
            )
    for v in lp.local - lp.fresh:
        if {top[u] for u in users[v]} & (staged | {lp.forward, lp.backward}):
            raise _refuse(program, f"its stacked gradients are read after the pipeline only "
                          f"(value {v})")  # fmt: skip


def resized(layout_of, lp: LoopParts | None, s: int):
    """``layout_of`` with the loops' stacks cut to stage ``s``'s range of iterations."""
    if lp is None:
        return layout_of
    a, b = lp.ranges[s]

    def layout(v):
        x = layout_of(v)
        return replace(x, shape=(b - a, *x.shape[1:])) if v in lp.local else x

    return layout


def check_layouts(program, lp: LoopParts | None, plan, layout_of, real_of) -> None:
    """The loops' iteration dimension is whole on every device (a stage cuts it)."""
    if lp is None:
        return
    tiled = []
    for o in (lp.forward, lp.backward):
        operands = plan.ops[o].operands
        for i, (v, k) in enumerate(zip(program.ops[o].operands, roles(program, o))):
            if k == "x" and isinstance(v, int) and operands[i].dims[0]:
                tiled.append((v, operands[i]))
    tiled += [(v, f(v)) for v in sorted(lp.local) for f in (layout_of, real_of) if f(v).dims[0]]
    if tiled:
        v, layout = tiled[0]
        raise InputError(
            f"value {v} is {layout}: it tiles the loop's iteration dimension, which the "
            "pipeline splits over its stages; give a state that leaves dimension 0 of the "
            "stacked parameters and the loop's stacks whole."
        )


def run_range(interp, env, op, args, lp: LoopParts, s: int):
    """Loop ``op`` over stage ``s``'s range of its iterations: its per-iteration operands
    cut to the range (the forward's stacks already are), ``interp`` running its body."""
    a, b = lp.ranges[s]
    cut = []
    for v, x, k in zip(op.operands, args, roles(interp.program, op.id)):
        keep = k != "x" or v in lp.fresh
        cut.append(x if keep else lax.slice_in_dim(x, a, b, axis=0))
    params = {**op.params, "length": b - a}

    def body(k, values, out_start, in_start):
        return interp._body(env, op, k, values, out_start, in_start)

    control = traits_of(op.primitive).control
    return control.run(params, cut, len(op.operands), len(op.results), body)


def stack_fetches(program, lp: LoopParts | None) -> dict:
    """Fetch index -> value, for the backward loop's body outputs that it stacks (the
    stacked gradients: a plan sums them over the batch in the body, step by step)."""
    if lp is None:
        return {}
    op = program.ops[lp.backward]
    n, nk = len(op.operands), len(lp.carry_out[lp.backward])
    outer = _outer(op)
    return {n + j: outer[j] for j in range(nk, len(outer))}


def summed_stacks(program, lp: LoopParts | None, plan, axis: str) -> frozenset:
    """The backward loop's stacks its body sums over ``axis`` (the microbatches): a stage
    leaves its microbatch's term, the pipeline sums them over microbatches."""
    fetches = plan.ops[lp.backward].fetches if lp is not None else ()
    out = set()
    for i, v in stack_fetches(program, lp).items():
        steps = fetches[i].steps if fetches[i] is not None else ()
        if any(s.kind == "all-reduce" and s.reduction == "sum" and axis in s.axes for s in steps):
            out.add(v)
    return frozenset(out)
