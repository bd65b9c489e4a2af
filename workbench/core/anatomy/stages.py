"""Pipeline stages: where a training step is cut into S stages along its repeated blocks.

Read from structure alone (``layers``' repeated blocks), never from names:

- *unrolled* blocks: the forward pass is cut, in program order, between block k's last
  read of its parameters and block k+1's first (half a layer either way), at the gap where
  the fewest bytes of activations are live (the residual stream); what comes before the
  first block (the embedding) and after the last (the head, the loss) joins them;
- a block repeated *under a loop* (``scan``): a stage runs a contiguous range of the loop's
  iterations; what comes before the loop is stage 0's, what comes after it the last's;
- *backward* ops go to the earliest block they read a value of (a residual, a parameter, a
  cotangent), else to their readers'; forward ops after the backward began (a checkpoint's
  recomputation) to the latest; *optimizer* ops to the stage of the parameter, state
  or gradient they read. An op reading several stages' values (a global gradient norm), or
  feeding several (a step counter), is listed in ``unplaced`` with why;
- a parameter goes to the stage whose forward ops read it (several: ``shared``).

Blocks are grouped into contiguous stages minimising the largest stage cost (a block's
forward and backward ops; FLOPs at global shapes by default), or as ``layers=`` says.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, pairwise

from workbench.core.anatomy.layers import carried_inputs, region_operands
from workbench.core.anatomy.stage_costs import checked_cost, flops_cost, weight
from workbench.core.anatomy.updates import update_chains
from workbench.core.errors import InputError, given
from workbench.core.ops import traits as traits_of

LOOPED = -1  # a level: every stage, on its range of the loop's iterations
EVERY = -2  # an optimizer op several stages read (unplaced)


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: its blocks (a loop's iterations when ``StageCuts.loop`` is set),
    the parameters and data inputs it reads, its ops by phase and its cost."""

    index: int
    blocks: tuple[int, ...]
    parameters: tuple[int, ...]
    inputs: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    optimizer: tuple[int, ...]
    cost: float


@dataclass(frozen=True, slots=True)
class Boundary:
    """The forward values stage ``after`` sends to stage ``after + 1``, and their bytes."""

    after: int
    values: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class StageCuts:
    """Where a pipeline cuts the step (see the module docstring).

    ``loop``: the forward loop whose iterations the stages split (None: unrolled blocks);
    ``looped``: the loops' ops (forward, backward, the stacked parameters' updates) that
    every stage runs on its iterations; ``shared``: ``(parameter, stages)`` read by several
    stages; ``unplaced``: ``(op id, why)``; ``chosen``: "balanced" or "layers"."""

    stages: tuple[Stage, ...]
    boundaries: tuple[Boundary, ...]
    balance: float
    loop: int | None
    looped: tuple[int, ...]
    shared: tuple[tuple[int, tuple[int, ...]], ...]
    unplaced: tuple[tuple[int, str], ...]
    chosen: str

    def stage_of(self, op: int) -> int | None:
        """The stage holding op ``op`` (None: looped or unplaced)."""
        return self.holders().get(op)

    def holders(self) -> dict[int, int]:
        """Op -> the (virtual) stage holding it: its forward, backward and optimizer ops."""
        return {o: s.index for s in self.stages for o in (*s.forward, *s.backward, *s.optimizer)}


def stage_cuts(program, stages, *, cost=None, layers=None) -> StageCuts:
    """Cut ``program``'s training step into ``stages`` pipeline stages along its repeated
    blocks. ``cost(op_id) -> float`` weighs an op (default: its FLOPs at global shapes);
    ``layers=[k1, ...]``: the ``stages - 1`` block indices where a new stage starts."""
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise InputError(f"stages={given(stages)} is not a count of stages; give an int >= 1.")
    anatomy = program.anatomy()
    found = anatomy.layers
    if not found.stacked and len(found.blocks) < 2:
        raise InputError(
            f"the workbench sees no repeated blocks in {program.name!r} (parameters of one "
            "shape recurring once per layer, or sliced per step by a loop); "
            "program.anatomy().report() shows what it sees. A pipeline cuts only between "
            "repeated blocks: write the layers as repeated modules of one shape or under a "
            "lax.scan."
        )
    n_blocks = found.count
    if stages > n_blocks:
        raise InputError(
            f"stages={stages} is more than the {n_blocks} repeated blocks of {program.name!r}; "
            f"a stage holds at least one block: give stages <= {n_blocks}."
        )
    starts = _layers(layers, stages, n_blocks) if layers is not None else None
    weigh = checked_cost(cost) if cost is not None else flops_cost(program)
    cut = _Cut(program, anatomy)
    cut.looped_levels() if found.stacked else cut.unrolled_levels()
    cut.backward_levels()
    costs = cut.block_costs(weigh, n_blocks)
    chosen = "balanced" if starts is None else "layers"
    return cut.result(starts or _balanced(costs, stages), costs, n_blocks, chosen)


def _layers(layers, stages: int, n_blocks: int) -> list[int]:
    ok = isinstance(layers, list | tuple) and all(
        isinstance(k, int) and not isinstance(k, bool) for k in layers
    )
    if not ok or len(layers) != stages - 1:
        raise InputError(
            f"the stage starts {given(layers)} are not {stages - 1} block indices; give the "
            f"stages - 1 = {stages - 1} indices where a new stage starts, e.g. "
            f"{[round(n_blocks * (s + 1) / stages) for s in range(stages - 1)]}."
        )
    starts = [0, *layers]
    if any(b <= a for a, b in pairwise(starts)) or (layers and layers[-1] >= n_blocks):
        raise InputError(
            f"the stage starts {given(layers)} must increase strictly within 1..{n_blocks - 1} (the "
            f"{n_blocks} blocks are numbered from 0, and a stage holds at least one)."
        )
    return starts


def _balanced(costs: list[float], stages: int) -> list[int]:
    """Starts of ``stages`` contiguous groups of blocks minimising the largest group's cost."""
    n, prefix = len(costs), [0.0, *accumulate(costs)]
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    back = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for k in range(s, n - (stages - s) + 1):
            for j in range(s - 1, k):
                m = max(best[s - 1][j], prefix[k] - prefix[j])
                if m < best[s][k] * (1 - 1e-12):
                    best[s][k], back[s][k] = m, j
    starts, k = [], n
    for s in range(stages, 0, -1):
        k = back[s][k]
        starts.append(k)
    return starts[::-1]


class _Cut:
    """The levels of a program's ops: block indices (unrolled), or 0 before the loop and
    1 after it (``LOOPED`` for the loops' ops); then the stages they make."""

    def __init__(self, program, anatomy):
        self.program, self.anatomy = program, anatomy
        self.top = program.top_level  # per op, the top-level op it sits in
        self.ops, self.values = program.ops, program.values
        self.origin = anatomy.layers.origin
        self.level: dict[int, int] = {}  # top-level op -> level
        self.param_levels: dict[int, set[int]] = {}
        self.loop: int | None = None
        self.gaps: list[int] = []  # unrolled: the gap (a forward position) after each block
        body = program.body
        first = next((i for i, o in enumerate(body) if self.ops[o].phase == "backward"), len(body))
        # forward ops after the backward began recompute what a checkpoint dropped: backward
        self.recompute = {o for o in body[first:] if self.ops[o].phase == "forward"}
        self.fwd = [o for o in body[:first] if self.ops[o].phase == "forward"]
        self.pos = {o: i for i, o in enumerate(self.fwd)}
        self.derived = {  # casts, reshapes or slices of a parameter: they go with it
            o
            for o in self.fwd
            if self.ops[o].results and all(r in self.origin for r in self.ops[o].results)
        }

    def phase(self, o: int) -> str:
        """Op ``o``'s phase for the stages: its top-level op's, a recomputation's backward."""
        top = self.top[o]
        return "backward" if top in self.recompute else self.ops[top].phase

    def _reads(self, op_ids):
        """``(op, parameter)`` for each read of a parameter by a forward op (at any depth)
        that is not a cast, reshape or slice of it."""
        for o in op_ids:
            op = self.ops[o]
            derived = op.results and all(r in self.origin for r in op.results)
            if self.phase(o) != "forward" or self.top[o] in self.derived or derived:
                continue
            for v in op.operands:
                if isinstance(v, int) and v in self.origin:
                    yield o, self.origin[v]

    def unrolled_levels(self) -> None:
        program, blocks = self.program, self.anatomy.layers.blocks
        block_of = {p: k for k, b in enumerate(blocks) for p in b}
        anchors: list[list[int]] = [[] for _ in blocks]
        for o, p in self._reads(range(len(self.ops))):
            if p in block_of and self.top[o] in self.pos:
                anchors[block_of[p]].append(self.pos[self.top[o]])
        if not all(anchors):
            raise InputError(
                f"a block of {program.name!r} is read by no forward op outside a loop's body; "
                "a pipeline cannot cut around it. program.anatomy() shows the blocks it sees."
            )
        live = self._live()
        mean = [sum(a) / len(a) for a in anchors]
        half = int((mean[-1] - mean[0]) / (len(blocks) - 1) / 2)
        gaps: list[int] = []
        for k in range(len(blocks) - 1):
            lo, hi = max(anchors[k]) + 1, min(anchors[k + 1])
            if hi < lo:
                raise InputError(
                    f"{program.name!r} cannot be cut between blocks {k} and {k + 1}: the "
                    f"forward pass reads block {k + 1}'s parameters (op at position {hi}) "
                    f"before it is done with block {k}'s (position {lo - 1}); a pipeline needs "
                    "each block's forward ops to follow the last's. Reorder the layers, or "
                    "put them under a lax.scan."
                )
            first = max(min(anchors[k]) + 1, lo - half, gaps[-1] + 1 if gaps else 1)
            last = min(max(anchors[k + 1]), hi + half)
            gaps.append(
                min(
                    range(first, last + 1),
                    key=lambda g: (live[g], lo - g if g < lo else max(g - hi, 0), -g),
                )
            )
        self.gaps = gaps
        for o in self.fwd:
            self.level[o] = bisect_right(gaps, self.pos[o])
        self._param_levels()

    def _live(self) -> list[int]:
        """Bytes of forward activations live at each gap (before each forward position)."""
        n = len(self.fwd)
        diff = [0] * (n + 2)
        self.spans = []  # (value, made at, last read at)
        for i, o in enumerate(self.fwd):
            if o in self.derived:
                continue
            for r in self.ops[o].results:
                if r in self.origin:
                    continue
                last = max((self.pos.get(self.top[u], -1) for u in self.program.users[r]),
                           default=-1)  # fmt: skip
                if last > i:
                    diff[i + 1] += self.values[r].nbytes
                    diff[last + 1] -= self.values[r].nbytes
                    self.spans.append((r, i, last))
        return list(accumulate(diff))

    def looped_levels(self) -> None:
        program, anatomy = self.program, self.anatomy
        slices = anatomy.loop_slices
        loops = {
            self.top[self.values[inner].region_of]
            for p in anatomy.layers.stacked
            for inner, dropped in slices.get(p, ())
            if dropped == 1
        }
        forward = [o for o in loops if self.phase(o) == "forward"]
        if len(forward) != 1:
            raise InputError(
                f"{program.name!r} slices its stacked parameters in {len(forward)} forward "
                "loops; a pipeline splits the iterations of exactly one. program.anatomy() "
                "shows the blocks it sees."
            )
        self.loop = forward[0]
        for o in program.body:
            if o in loops:
                self.level[o] = LOOPED
            elif o in self.pos:
                self.level[o] = 0 if self.pos[o] < self.pos[self.loop] else 1
        self._param_levels()
        for p in anatomy.layers.stacked:
            self.param_levels[p] = {LOOPED}

    def _param_levels(self) -> None:
        for o, p in self._reads(range(len(self.ops))):
            level = self.level.get(self.top[o])
            if level is not None:
                self.param_levels.setdefault(p, set()).add(level)
        for o in self.derived:
            p = self.origin[self.ops[o].results[0]]
            self.level[o] = min(self.param_levels.get(p, {0}))

    def _value_level(self, v) -> int | None:
        """The level a value is held at, for the ops of a later phase that read it."""
        if isinstance(v, int) and v in self.param_levels:
            return min(self.param_levels[v])
        producer = self.values[v].producer if isinstance(v, int) else None
        if producer is None:
            return None
        level = self.level.get(self.top[producer])
        if self.phase(producer) != "forward":
            return level
        held = [level, *self._forward_levels(v)]
        known = [x for x in held if x is not None and x != LOOPED]
        return max(known) if known else (LOOPED if LOOPED in held else None)

    def _forward_levels(self, v: int, depth: int = 0) -> list:
        """The levels of the forward ops reading ``v``, through renames and casts of it."""
        out = []
        for u in self.program.users[v]:
            if self.phase(u) != "forward":
                continue
            out.append(self.level.get(self.top[u]))
            t, results = traits_of(self.ops[u].primitive), self.ops[u].results
            if (t.tag or t.transparent) and len(results) == 1 and depth < 8:
                out += self._forward_levels(results[0], depth + 1)
        return out

    def backward_levels(self) -> None:
        ops, pending = self.ops, []
        for o in self.program.body:
            if self.phase(o) != "backward" or o in self.level:
                continue
            levels = {self._value_level(v) for v in ops[o].operands} - {None}
            staged = levels - {LOOPED}
            if staged or levels:  # a recomputation, as a forward op, by its latest input
                pick = max if o in self.recompute else min
                self.level[o] = pick(staged) if staged else LOOPED
            else:
                pending.append(o)
        for o in reversed(pending):
            users = {self.level.get(self.top[u]) for r in ops[o].results
                     for u in self.program.users[r]} - {None, LOOPED}  # fmt: skip
            if users:
                self.level[o] = min(users)

    def block_costs(self, weigh, n_blocks: int) -> list[float]:
        """Per block, the weight of its forward and backward ops (with what comes before
        the first and after the last)."""
        per_level: dict[int, float] = {}
        for o, level in self.level.items():
            if self.ops[o].phase != "optimizer":
                w = weight(self.program, o, weigh, per_trip=level == LOOPED)
                if level == LOOPED and not self.ops[o].regions:
                    w /= n_blocks
                per_level[level] = per_level.get(level, 0.0) + w
        if self.loop is None:
            return [per_level.get(k, 0.0) for k in range(n_blocks)]
        costs = [per_level.get(LOOPED, 0.0)] * n_blocks
        costs[0] += per_level.get(0, 0.0)
        costs[-1] += per_level.get(1, 0.0)
        return costs

    def result(self, starts, block_costs, n_blocks, chosen) -> StageCuts:
        program, ops, n = self.program, self.ops, len(starts)
        group = [bisect_right(starts, k) - 1 for k in range(n_blocks)]
        stage_of = dict(enumerate(group)) if self.loop is None else {0: 0, 1: n - 1}
        stage_of[LOOPED] = LOOPED if n > 1 else 0
        stage = {o: stage_of[lv] for o, lv in self.level.items()}
        params = {p: {stage_of[lv] for lv in lvs} for p, lvs in self.param_levels.items()}
        unplaced = self._optimizer(stage, params)
        lost = [o for o in program.body if o not in stage and self.phase(o) == "backward"]
        unplaced += [(o, "reads no value a stage holds, and no staged op reads it") for o in lost]
        phases = ("forward", "backward", "optimizer")
        placed = {(s, ph): [] for s in range(n) for ph in phases}
        looped = []
        for o in program.walk():
            s = stage.get(self.top[o.id])
            if s == LOOPED:
                looped.append(o.id)
            elif s is not None:
                placed[s, self.phase(o.id)].append(o.id)
        data = {v for v, _ in self.anatomy.data}
        out = []
        for s in range(n):
            blocks = tuple(k for k in range(n_blocks) if group[k] == s)
            reads = {v for o in placed[s, "forward"] for v in ops[o].operands if isinstance(v, int)}
            mine = tuple(sorted(p for p, ss in params.items() if s in ss or LOOPED in ss))
            by_phase = (tuple(placed[s, ph]) for ph in phases)
            cost = sum(block_costs[k] for k in blocks)
            out.append(Stage(s, blocks, mine, tuple(sorted(reads & data)), *by_phase, cost))
        mean = sum(st.cost for st in out) / n
        return StageCuts(
            stages=tuple(out),
            boundaries=self._boundaries(starts),
            balance=max(st.cost for st in out) / mean if mean > 0 else 1.0,
            loop=self.loop,
            looped=tuple(looped),
            shared=tuple(
                (p, tuple(sorted(ss)))
                for p, ss in sorted(params.items())
                if len(ss) > 1 and LOOPED not in ss
            ),
            unplaced=tuple(unplaced),
            chosen=chosen,
        )

    def _optimizer(self, stage, params) -> list[tuple[int, str]]:
        """Optimizer ops: the stage of the parameter whose update chain they make (a tied
        parameter's first), else of the values they read, else of their readers. Returns
        what it could not place, with why."""
        ops, values, unplaced, pending, spanning = self.ops, self.values, [], [], set()
        chains = update_chains(self.program)
        chain: dict[int, set[int]] = {}
        for p, ss in params.items():
            chain.setdefault(chains.find(p), set()).update(ss)

        def of(v) -> set[int]:
            s = stage.get(self.top[values[v].producer]) if values[v].producer is not None else None
            return chain.get(chains.find(v), set()) if s is None else {s}

        for o in self.program.body:
            if ops[o].phase != "optimizer":
                continue
            reads = set().union(*(chain.get(chains.find(r), set()) for r in ops[o].results))
            made = [values[v].producer for v in ops[o].operands if isinstance(v, int)]
            if not reads and any(self.top[m] in spanning for m in made if m is not None):
                spanning.add(o)
                unplaced.append((o, "reads a value several stages make (a global norm?)"))
                continue
            reads = reads or set().union(*(of(v) for v in ops[o].operands if isinstance(v, int)))
            staged = reads - {LOOPED}
            if staged:
                if len(staged) > 1 and not chain.get(chains.find(ops[o].results[0])):
                    spanning.add(o)
                    unplaced.append((o, f"reads values of stages {sorted(staged)} (a norm?)"))
                else:
                    stage[o] = min(staged)
            elif reads:
                stage[o] = LOOPED
            else:
                pending.append(o)
        every = set()  # what several stages read: a step counter, a schedule
        for o in reversed(pending):
            users = {
                stage.get(self.top[u], EVERY if u in every else None)
                for r in ops[o].results
                for u in self.program.users[r]
            } - {None}
            if len(users) == 1 and EVERY not in users:
                stage[o] = users.pop()
            else:
                every.add(o)
                why = "feeds several stages (a step counter, a schedule)"
                unplaced.append((o, why if users else "reads and feeds no staged value"))
        return unplaced

    def _boundaries(self, starts) -> tuple[Boundary, ...]:
        values, n = self.values, len(starts) - 1
        if self.loop is not None:  # the loop's carry, and what else it reads but parameters
            loop, layers = self.ops[self.loop], self.anatomy.layers
            slices = {i for p in layers.stacked for i, _ in self.anatomy.loop_slices.get(p, ())}
            region, outer = next(
                (r, o) for r, o in zip(loop.regions, region_operands(loop)) if slices & {*r.inputs}
            )
            carried = carried_inputs(loop, len(region.inputs))
            crossing = [region.inputs[i] for i in carried] + [
                v
                for i, v in enumerate(outer)
                if i not in carried and isinstance(v, int) and values[v].kind == "intermediate"
                and v not in self.origin
            ]  # fmt: skip
            nbytes = sum(values[v].nbytes for v in crossing)
            return tuple(Boundary(s, tuple(crossing), nbytes) for s in range(n))
        cuts = [self.gaps[k - 1] for k in starts[1:]]
        crossing = [[] for _ in cuts]
        for v, made, last in self.spans:
            for c in range(bisect_right(cuts, made), bisect_right(cuts, last)):
                crossing[c].append(v)
        return tuple(
            Boundary(s, tuple(vs), sum(values[v].nbytes for v in vs))
            for s, vs in enumerate(crossing)
        )
