"""A pipelined step's parts: the segments each stage runs per microbatch, what moves
between stages, and the tick grid a schedule table unrolls into.

The captured step is cut (`anatomy.stages.stage_cuts`) and its ops sorted into:

- *pre*: ops that read only data inputs and constants (a mask, a masked mean's token
  count), run once on the whole batch before the pipeline, so a reduction over the
  batch among them is the global one;
- *segments*: per stage, its forward ops ("F") and backward ops ("B"; split into the
  input-gradient "B" and the weight-gradient "W" when the schedule splits the backward),
  run once per microbatch at one microbatch's local shapes;
- *accumulated* values: sums over the batch a segment leaves pending (a parameter's
  gradient, the loss's sum), added up over microbatches;
- *post*: what the outputs need from those sums, the parameters and the pre values (the
  optimizer, global-norm clipping, the loss's division), run once after the pipeline.

``Parts.fwd[s]``/``bwd[s]`` are the values crossing boundary s | s+1 per microbatch (to
s+1, back to s); ``saved[s]``: what stage s keeps from its F for its B (and W);
``wsaved[s]``: what its W needs from its B. Stages here are the cuts' stages: interleaved,
the S*v virtual stages (`ticks` places virtual stage c*S + s on device s).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import InputError, TacticError
from workbench.core.lowering.pipeline_loops import LoopParts, loop_parts, summed_stacks

PHASE_KIND = {"forward": "F", "backward": "B"}


@dataclass(frozen=True, slots=True)
class Parts:
    """Where each op of the step runs in a pipeline (see the module docstring)."""

    pre: tuple[int, ...]
    segments: dict  # (stage, kind) -> top-level op ids, in program order
    post: tuple[int, ...]
    home: dict  # segment-made value -> (stage, kind)
    accumulated: dict  # stage -> values it sums over microbatches
    fwd: tuple[tuple[int, ...], ...]
    bwd: tuple[tuple[int, ...], ...]
    saved: tuple[tuple[int, ...], ...]
    wsaved: tuple[tuple[int, ...], ...]
    loop: LoopParts | None = None  # scanned blocks: the loops every stage runs a range of


def reads_of(program, op_ids) -> set[int]:
    """Top-level values the ops (at any depth) read that none of them makes."""
    inside = set(op_ids)
    out = set()
    for op in program.walk(op_ids):
        for v in op.linked_operands:
            if not isinstance(v, int) or program.values[v].region_of is not None:
                continue
            made = program.values[v].producer
            if made is None or made not in inside:
                out.add(v)
    return out


def _name(program, o: int) -> str:
    op = program.ops[o]
    where = f" at {op.source}" if op.source else ""
    return f"op {o} ({op.primitive}, {op.phase}, {'/'.join(op.scope) or 'top'}{where})"


def split_parts(program, cuts, state, axis: str, split_backward: bool, plan=None) -> Parts:
    """The parts of ``program`` pipelined along ``cuts``; ``state`` tiles the data inputs
    over the microbatch axis ``axis`` (a partial sum over it is a sum over microbatches);
    ``plan`` (``state``'s): where a scanned step's loop sums its stacks over it."""
    values, ops = program.values, program.ops
    lp = loop_parts(program, cuts)
    data = {v for v, _ in program.anatomy().data}
    body = set(program.body)
    dataonly: set[int] = set(data) | set(program.consts)
    pre = []
    for o in program.body:
        if all(v in dataonly for v in reads_of(program, [o])):
            pre.append(o)
            dataonly.update(ops[o].results)
    pre_set = set(pre)
    segments: dict = {}
    home: dict = {}
    S = len(cuts.stages)
    for st in cuts.stages:
        for phase, kind in PHASE_KIND.items():
            ids = [o for o in getattr(st, phase) if o in body and o not in pre_set]
            if lp is not None:  # every stage runs the loops, on its range of iterations
                ids.append(lp.forward if kind == "F" else lp.backward)
            segments[st.index, kind] = sorted(ids)
            for o in ids:
                for r in ops[o].results:
                    home[r] = (st.index, kind)
    if lp is not None:  # where a loop's carry out is read whole: after the last, first
        home.update({v: (S - 1, "F") for v in lp.carry_out[lp.forward]})
        home.update({v: (0, "B") for v in lp.carry_out[lp.backward]})
        _check_carries(program, lp, home, S)
    summed = summed_stacks(program, lp, plan, axis) if plan is not None else frozenset()
    post, accumulated, moved = _post(program, home, dataonly, state, axis, summed)
    if lp is not None:
        accumulated = _loop_sums(program, lp, accumulated, moved, post, S)
    for key, ids in segments.items():
        segments[key] = [o for o in ids if o not in moved]
    for o in moved:
        for r in ops[o].results:
            home.pop(r, None)
    if split_backward:
        pinned = {lp.backward} if lp is not None else set()
        _split_weight_gradients(program, segments, home, S, pinned)
    kinds = ("F", "B", "W") if split_backward else ("F", "B")
    reads = {key: reads_of(program, ids) for key, ids in segments.items()}
    placed = {o for ids in segments.values() for o in ids} | pre_set
    for key, rs in reads.items():
        for v in rs:
            made = values[v].producer
            if made is not None and made not in placed and v not in dataonly:
                raise TacticError(
                    f"the pipeline's stage {key[0]} reads value {v}, made by "
                    f"{_name(program, made)}, which no stage runs (stage_cuts left it "
                    "unplaced); a pipeline needs every forward and backward op on a stage."
                )
            _check_order(program, key, v, home)

    local = lp.local if lp is not None else frozenset()  # a loop's stacks: each stage's own

    def needed_by(v, stages, allowed):
        return v not in local and any(
            v in reads[s, k] for s in stages for k in allowed if (s, k) in reads
        )

    carry_f, carry_b = set(), set()  # the loops' carries in: each stage sends its out
    if lp is not None:
        carry_f = {v for v, out in lp.sends.items() if out in lp.carry_out[lp.forward]}
        carry_b = set(lp.sends) - carry_f
    fwd = tuple(
        tuple(
            sorted(
                {
                    v
                    for v, (h, k) in home.items()
                    if k == "F" and h <= s and needed_by(v, range(s + 1, S), kinds)
                }
                | carry_f
            )
        )
        for s in range(S - 1)
    )
    bwd = tuple(
        tuple(
            sorted(
                {v for v, (h, _) in home.items() if h > s and needed_by(v, range(s + 1), kinds[1:])}
                | carry_b
            )
        )
        for s in range(S - 1)
    )
    saved, wsaved = [], []
    for s in range(S):
        have = {v for v, (h, k) in home.items() if (h, k) == (s, "F")}
        have |= set(fwd[s - 1]) if s else set()
        later = reads[s, "B"] | (reads[s, "W"] if split_backward else set())
        later |= set(bwd[s - 1]) if s else set()
        if lp is not None:  # the forward loop's stacks of this stage's range
            have |= set(lp.fresh)
        saved.append(tuple(sorted(have & later)))
        if split_backward:
            made_b = {v for v, (h, k) in home.items() if (h, k) == (s, "B")}
            made_b |= set(bwd[s]) if s < S - 1 else set()
            wsaved.append(tuple(sorted(made_b & reads[s, "W"])))
        else:
            wsaved.append(())
    return Parts(
        tuple(pre),
        segments,
        post,
        home,
        accumulated,
        fwd,
        bwd,
        tuple(saved),
        tuple(wsaved),
        lp,
    )


def _check_order(program, key, v, home) -> None:
    """A segment reads only what the schedule's dependencies have made by then."""
    if v not in home:
        return
    s, kind = key
    h, k = home[v]
    ok = {
        "F": k == "F" and h < s,
        "B": k == "F" or (k == "B" and h > s),
        "W": k == "F" or (k == "B" and h >= s),
    }[kind]
    if not ok:
        raise TacticError(
            f"the pipeline's {kind} segment of stage {s} reads value {v}, made by the {k} "
            f"segment of stage {h} ({_name(program, program.values[v].producer)}), which a "
            "pipeline schedule does not run before it; the stage cuts do not separate this "
            "step into forward and backward passes a pipeline can order."
        )


def _split_weight_gradients(program, segments, home, S, pinned=()) -> None:
    """Zero-bubble: each stage's backward ops into those another stage's backward needs
    (and their inputs within the stage; and ``pinned``, a loop): "B"; the rest: "W"."""
    ops, values = program.ops, program.values
    for s in range(S):
        ids = segments[s, "B"]
        mine = set(ids)
        wanted = set()
        for (t, _), other in segments.items():
            if t != s:
                wanted |= {v for v in reads_of(program, other) if home.get(v) == (s, "B")}
        keep = set()
        stack = [values[v].producer for v in wanted] + [o for o in ids if o in pinned]
        while stack:
            o = stack.pop()
            if o in keep or o not in mine:
                continue
            keep.add(o)
            stack.extend(
                values[v].producer for v in reads_of(program, [o]) if values[v].producer is not None
            )
        segments[s, "B"] = [o for o in ids if o in keep]
        segments[s, "W"] = [o for o in ids if o not in keep]
        for o in segments[s, "W"]:
            for r in ops[o].results:
                home[r] = (s, "W")


def _check_carries(program, lp, home, S) -> None:
    """A loop's carry in is made by the stage starting it: the forward's by the first, the
    backward's by the last (it then crosses the boundaries as the carry out)."""
    ops = program.ops
    want = {lp.forward: (0, "F"), lp.backward: (S - 1, "B")}
    for o, where in want.items():
        carries = set(lp.carry_out[o])
        for v, out in lp.sends.items():
            if out in carries and v in home and home[v] != where:
                raise InputError(
                    f"the carry {v} of {_name(program, o)} is not made by stage {where[0]}'s "
                    f"{'forward' if where[1] == 'F' else 'backward'} ops, so the pipeline "
                    "cannot send each stage's carry on in its place; a carry starts in the "
                    f"stage starting the loop, or before the pipeline ({ops[o].phase})."
                )


def _loop_sums(program, lp, accumulated, moved, post, S) -> dict:
    """The backward loop's stacks (stacked gradients) are summed on every stage, each over
    its range; nothing of the loops reruns after the pipeline."""
    if {lp.forward, lp.backward} & (set(moved) | set(post)):
        raise InputError(
            f"after the pipeline, {program.name!r} reads a loop's result that is neither a "
            "stacked gradient nor summed over the batch; the pipeline runs its loops per "
            "microbatch and stage only."
        )
    sums = {v for vs in accumulated.values() for v in vs}
    stacks = sums & lp.local
    out = {s: tuple(v for v in vs if v not in stacks) for s, vs in accumulated.items()}
    for s in range(S):
        out[s] = tuple(sorted({*out.get(s, ()), *stacks}))
    return out


def _post(program, home, dataonly, state, axis, summed=frozenset()):
    """The ops the outputs need after the pipeline; per stage the sums it accumulates; and
    the segment ops moved after it (they read such sums: a loss's division by a count)."""
    values = program.values
    post, accumulated, moved, seen = set(), {}, set(), set()
    stack = [v for v in program.outputs if isinstance(v, int)]
    while stack:
        v = stack.pop()
        if v in seen or v in dataonly or values[v].producer is None:
            continue
        seen.add(v)
        o = values[v].producer
        if v in home:
            layout = state.shardings[v]
            pending = layout.reduction_of(axis) == "sum" and layout.dim_of(axis) is None
            if pending or v in summed:  # summed: a loop's stack, summed in its body
                accumulated.setdefault(home[v][0], set()).add(v)
                continue
            if layout.uses(axis):
                raise TacticError(
                    f"after the pipeline, the step reads value {v} {layout}, made per "
                    f"microbatch by {_name(program, o)}, which is neither a sum over the batch "
                    "nor the same for every microbatch; the update can run once only on sums "
                    "over microbatches."
                )
            moved.add(o)  # the same for every microbatch: run it once more, after
        if o not in post:
            post.add(o)
            stack.extend(reads_of(program, [o]))
    order = {o: i for i, o in enumerate(program.body)}
    sums = {v for vs in accumulated.values() for v in vs}
    made, after = set(sums), set()
    for o in sorted(moved, key=order.__getitem__):
        if reads_of(program, [o]) & made:
            after.add(o)
            made.update(program.ops[o].results)
    return (
        tuple(sorted(post, key=order.__getitem__)),
        {s: tuple(sorted(vs)) for s, vs in accumulated.items()},
        after,
    )


@dataclass(frozen=True, slots=True)
class Tick:
    """One step of the unrolled pipeline: per device along the stage axis, the work it runs
    (None: idle), and the messages it stores at the tick's start: ("fin"|"bin", virtual
    stage, microbatch)."""

    work: tuple
    stores: tuple


def ticks(schedule) -> tuple[Tick, ...]:
    """The schedule's table unrolled into ticks: each device runs its row in order, a work
    item as soon as what it needs arrived (F of virtual stage g and microbatch m after F(g-1,
    m)'s tick, B(g, m) after B(g+1, m)'s; chunk c of device s is virtual stage c*S + s, so
    device S-1's chunk c feeds device 0's chunk c+1); a value sent in one tick is stored at
    the start of the next."""
    S = schedule.stages
    V = S * schedule.virtual_stages
    pos, done, out, arriving = [0] * S, {}, [], [[] for _ in range(S)]
    total = sum(len(r) for r in schedule.table)
    t = 0
    while sum(pos) < total:
        work, sent = [], [[] for _ in range(S)]
        for s, row in enumerate(schedule.table):
            w = row[pos[s]] if pos[s] < len(row) else None
            g = w.chunk * S + s if w is not None else None
            if w is not None and _ready(w, g, V, done, t):
                pos[s] += 1
                done[w.kind, g, w.microbatch] = t
                if w.kind == "F" and g < V - 1:
                    sent[(g + 1) % S].append(("fin", g + 1, w.microbatch))
                if w.kind == "B" and g > 0:
                    sent[(g - 1) % S].append(("bin", g - 1, w.microbatch))
                work.append(w)
            else:
                work.append(None)
        if all(w is None for w in work):  # pragma: no cover - tables are checked
            raise InputError(f"the {schedule.kind!r} schedule's table deadlocks at tick {t}")
        out.append(Tick(tuple(work), tuple(tuple(a) for a in arriving)))
        arriving = sent
        t += 1
    if any(arriving):
        out.append(Tick((None,) * S, tuple(tuple(a) for a in arriving)))
    return tuple(out)


def _ready(w, g, V, done, t) -> bool:
    if w.kind == "F":
        return g == 0 or done.get(("F", g - 1, w.microbatch), t) < t
    if w.kind == "B":
        return g == V - 1 or done.get(("B", g + 1, w.microbatch), t) < t
    return True
