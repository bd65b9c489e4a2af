"""Attention priced as the fused kernels real runs call (``Hardware.fused_attention``).

A program captured on the host writes its attention out: a scores dot, a mask, a softmax
and a context dot, whose logits and probabilities reach memory. On GPUs and TPUs large
runs call one fused kernel instead (FlashAttention, cuDNN's, a Pallas kernel), which
keeps them on chip. Here each attention `anatomy.attention.region` finds is priced as
such a kernel, at the op its pass ends at:

- forward (and a recomputation under remat): the two dots' FLOPs at the chip's fused
  attention rate (``Hardware.attention_flops``), less the tiles its mask hides (read by
  ``anatomy.masks`` on 128-row tiles; a device holding a part of the queries computes its
  rows' tiles, the busiest device's priced), or the bytes of the queries, keys, values,
  output and log-sum-exp at the memory's rate, whichever is longer;
- backward: 2.5 times the forward's FLOPs (it recomputes the scores: five dots of the
  forward's two), and the bytes of those with the output's gradient and the three it gives.

The ops between are priced by the kernel; what they make never reaches memory, nor the
mask's arrays built from counts alone. A ring (``CP(kind="ring")``) runs the same kernels
block by block: priced whole here, its blocks' transfers hidden behind them, its balanced
steps' hidden blocks skipped and its replayed pass left out by ``estimate/rings.py``. An
attention with no region (a dropout between its dots, a loop around it) is priced as
written, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.anatomy.attention import region
from workbench.core.anatomy.masks import hidden_blocks
from workbench.core.estimate.compute import OpEstimate
from workbench.core.ops.costs import OpCost

TILE = 128  # the query and key rows of a kernel's tile
BACKWARD = 2.5  # a fused backward's FLOPs over its forward's


@dataclass(frozen=True)
class Fused:
    """What fused kernels replace: ``ops`` (priced by ``kernels`` instead) and ``inside``
    (values that never reach memory); `note` says what is priced as written."""

    ops: frozenset[int]
    inside: frozenset[int]
    kernels: tuple[OpEstimate, ...]

    def replace(self, estimates) -> list[OpEstimate]:
        """``estimates`` with the ops the kernels replace taken out and the kernels in."""
        return [e for e in estimates if e.op not in self.ops] + list(self.kernels)


NONE = Fused(frozenset(), frozenset(), ())


def fused(program, mesh, state, plan, hardware, estimates) -> Fused:
    """The fused kernels of every attention the program writes out, on ``hardware``, at the
    local shapes of ``plan`` (``estimates``: the ops' `OpEstimate` as written)."""
    by_op = {e.op: e for e in estimates}
    outputs = {v for v in program.outputs if isinstance(v, int)}
    replaced: set[int] = set()
    inside: set[int] = set()
    kernels: list[OpEstimate] = []
    rings = set(plan.rings) | set(plan.skipped)
    for r in _regions(program):
        if isinstance(r, str):
            continue
        passes = [p for p in (r.forward, r.replay) if p is not None]
        if any(p.scores not in by_op or p.context not in by_op for p in passes):
            continue  # the plan does not run it
        # a ring's busiest device computes every block; a balanced ring's skips are its own
        kept = 1.0 if r.skipped & rings else _kept(program, mesh, state, r.forward)
        ops = set(r.skipped) | _mask_ops(program, r)
        made = {v for o in ops for v in program.ops[o].results}
        read_outside = {v for v in made if any(u not in ops for u in program.users[v])}
        inside |= made - read_outside - outputs
        replaced |= ops
        dtype = program.values[r.forward.queries].dtype
        rate = hardware.attention_flops(dtype)
        for p in passes:
            e = by_op[p.context]
            flops = kept * (by_op[p.scores].cost.flops + e.cost.flops)
            nbytes = _read(program, mesh, plan, p) + _lse(program, mesh, state, p)
            kernels.append(_kernel(p.context, flops, nbytes, e.count, rate, hardware))
        first = r.forward
        flops = BACKWARD * kept * (by_op[first.scores].cost.flops + by_op[first.context].cost.flops)
        nbytes = _read(program, mesh, plan, first) + _lse(program, mesh, state, first)
        nbytes += _bytes(mesh, state, r.cotangent, *r.grads)
        count = by_op[first.context].count
        kernels.append(_kernel(r.first_backward, flops, nbytes, count, rate, hardware))
    return Fused(frozenset(replaced), frozenset(inside), tuple(kernels))


def note(program) -> str:
    """Which attentions a fused estimate prices as written, and why ("" when none)."""
    reasons = [r for r in _regions(program) if isinstance(r, str)]
    if not reasons:
        return ""
    n = len(reasons)
    why = "; ".join(sorted(set(reasons)))
    return f"{n} attention{'s' * (n != 1)} priced as written, not fused ({why})"


def _regions(program) -> list:
    """Per attention, its `Region`, or why a fused kernel does not price it."""
    return [region(program, a.scores, a.context) for a in program.anatomy().layers.attention]


def _kernel(op: int, flops: float, nbytes: float, count: int, rate: float, hw) -> OpEstimate:
    seconds = max(flops / rate, nbytes / hw.hbm_bandwidth) + hw.op_overhead
    return OpEstimate(op, OpCost(flops, 0.0, nbytes), seconds, count)


def _read(program, mesh, plan, p) -> float:
    """A pass's queries, keys, values and output as its dots hold them (the keys and values
    gathered where the plan gathers them)."""
    scores, context = plan.ops[p.scores], plan.ops[p.context]
    held = [*scores.operands, *context.operands, *context.results]
    made = {p.queries, p.keys, p.values, p.out}
    values = [*program.ops[p.scores].operands, *program.ops[p.context].operands, p.out]
    return float(sum(lay.local_nbytes(mesh) for v, lay in zip(values, held) if v in made))


def _bytes(mesh, state, *values: int) -> float:
    return float(sum(state.shardings[v].local_nbytes(mesh) for v in values if v is not None))


def _lse(program, mesh, state, p) -> float:
    """A pass's float32 log-sum-exp: one per row of its logits."""
    lay = state.shardings[p.logits]
    return (
        lay.local_nbytes(mesh)
        / lay.local_shape(mesh)[p.key_dim]
        / program.values[p.logits].dtype.itemsize
        * 4
    )


def _kept(program, mesh, state, p) -> float:
    """The part of the tiles the busiest device computes: those its mask does not hide, of
    the query rows it holds (1 where the mask cannot be read from the program)."""
    shape = program.values[p.logits].shape
    length = shape[p.key_dim]
    rows = [d for d in range(len(shape)) if d != p.key_dim and shape[d] == length]
    if len(rows) != 1 or length % TILE:
        return 1.0
    n = length // TILE
    while n > 64 and n % 2 == 0:  # coarser tiles read fewer samples; causal masks alike
        n //= 2
    hidden = hidden_blocks(program, p, rows[0], n)
    if hidden is None:
        return 1.0
    parts = state.shardings[p.logits].dims[rows[0]]
    devices = 1
    for axis in parts:
        devices *= mesh.axis_size(axis)
    if n % devices:
        devices = 1
    per = n // devices
    return float(max((~hidden[i * per : (i + 1) * per]).mean() for i in range(devices)))


def _mask_ops(program, r) -> set[int]:
    """The ops that build a mask or bias of the region from counts alone (iotas, compares,
    selects; no input or constant array), read only by the region and each other: a fused
    kernel computes them inside."""
    region_ops = set(r.skipped)
    found: set[int] = set()
    frontier = [v for p in (r.forward, r.replay) if p is not None for v, _ in p.sides]
    while frontier:
        o = program.values[frontier.pop()].producer
        if o is None or o in found or o in region_ops:
            continue
        op = program.ops[o]
        tensors = [x for x in op.operands if isinstance(x, int)]
        if op.regions or any(program.values[x].producer is None for x in tensors):
            return set()  # reads an input or a constant array: the mask stays as written
        found.add(o)
        frontier += tensors
    changed = True
    while changed:  # keep only those read by the region and each other
        keep = region_ops | found
        drop = {
            o
            for o in found
            for v in program.ops[o].results
            for u in program.users[v]
            if u not in keep
        }
        changed = bool(drop)
        found -= drop
    return found
