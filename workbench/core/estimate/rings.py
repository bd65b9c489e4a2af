"""Ring attention in the simulator (``CP(kind="ring")``, ``plan/rings.py``).

- Compute: the captured ops of each attention, as the all-gather kind runs them, and
  backward the logits of every block once more (``recompute_s``: the forward's scores,
  chain and softmax), as ring attention's backward pass replays its blocks.
- Transfers behind blocks (``behind_s``): each step's transfers run while the step's
  block computes, as the kernels do it (a step costs the longer of the two). Forward,
  the ``C - 1`` passes of the keys and values each hide behind one of the ``C`` blocks;
  backward, the same with the gradients, whose last hop home hides behind nothing.
- Balanced (``CP(balance=True)``): each step of a ring costs the part of a block its
  busiest device computes, the pairs of chunks its mask hides skipped (``fractions``,
  read from the mask by ``anatomy.masks``); a mask read from the inputs is priced whole.
- Memory (``working``): a pass holds one block of logits and probabilities (float32; the
  gradients' too, backward), the next block of keys and values arriving beside the one
  in use, its float32 accumulators, and backward the keys' and values' gradients in
  flight; the output and its log-sum-exp are kept from the forward pass for the backward.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from workbench.core.anatomy.masks import hidden_blocks
from workbench.core.layout.sharding import Sharding


def fractions(program, mesh, state, plan) -> dict[int, tuple[float, ...]]:
    """Per balanced ring (by the op it runs at), per step the part of a block its busiest
    device computes: the pairs of chunks its mask hides skipped. Rings computed whole are
    left out."""
    z = plan.zigzag
    out = {}
    for at, ring in plan.rings.items():
        if z is None or ring.axis != z.axis or ring.kind == "replay":
            continue
        p = ring.region.forward
        lay = state.shardings[p.logits]
        rows = next((d for d, axes in enumerate(lay.dims) if axes == (ring.axis,)), None)
        c = ring.size
        hidden = None if rows is None else hidden_blocks(program, p, rows, 2 * c)
        if hidden is None:
            continue
        steps = []
        for s in range(c):
            busiest = 0
            for i in range(c):
                j = (i - s) % c
                rows_i, keys_j = (i, 2 * c - 1 - i), (j, 2 * c - 1 - j)
                busiest = max(busiest, sum(not hidden[a, b] for a in rows_i for b in keys_j))
            steps.append(busiest / 4)
        out[at] = tuple(steps)
    return out


def _block_ops(ring) -> frozenset[int]:
    """The ops a ring's pass computes block by block: forward its region's, backward its
    backward's and the forward's it replays (less the context dot)."""
    r, p = ring.region, ring.evaluated
    return r.backward | (p.ops - {p.context}) if ring.backward else p.ops


def skipped_s(plan, ops, parts) -> float:
    """Seconds the balanced rings do not spend on the blocks their masks hide (``parts``:
    `fractions`), of their passes' compute and their replayed logits alike."""
    by_op = {o.op: o for o in ops}
    total = 0.0
    for at, steps in parts.items():
        ring = plan.rings[at]
        r, p = ring.region, ring.evaluated
        seconds = sum(by_op[x].total_s for x in _block_ops(ring) if x in by_op)
        if ring.backward and r.replay is None:  # the forward's logits, replayed
            seconds += sum(by_op[o].total_s for o in p.ops - {p.context} if o in by_op)
        total += seconds * (1 - sum(steps) / len(steps))
    return total


def recompute_s(plan, ops) -> float:
    """Seconds of the backward passes' replayed logits, for every ring of ``plan``: the
    forward's scores, chain and softmax once more; under remat the program's recomputation
    stands for them (its ops are priced), less its context dot, which the ring skips."""
    by_op = {o.op: o for o in ops}
    total = 0.0
    for ring in plan.rings.values():
        p = ring.region.forward
        if ring.backward and ring.region.replay is None:
            total += sum(by_op[o].total_s for o in p.ops - {p.context} if o in by_op)
        elif ring.kind == "replay" and ring.evaluated.context in by_op:
            total -= by_op[ring.evaluated.context].total_s
    return total


def behind_s(plan, ops, collectives, parts=None) -> dict[int, float]:
    """Per collective (its index in ``collectives``), the seconds of it each run hides
    behind the ring's blocks (``parts``: the balanced rings' `fractions`)."""
    by_op = {o.op: o for o in ops}
    at: dict[int, list[int]] = {}
    for i, c in enumerate(collectives):
        ring = plan.rings.get(c.collective.op)
        if ring is not None and c.collective.kind == "collective-permute":
            at.setdefault(c.collective.op, []).append(i)
    out = {}
    for o, idx in at.items():
        ring = plan.rings[o]
        r, c = ring.region, ring.size
        block = sum(by_op[x].total_s for x in _block_ops(ring) if x in by_op) / c
        # per step (one of the C - 1 that overlap), the seconds of all its transfers
        per_value = {collectives[i].collective.value: collectives[i].seconds for i in idx}
        per_step = sum(per_value.values())
        steps = (parts or {}).get(o, (1.0,) * c)
        for i in idx:
            c_i = collectives[i]
            share = c_i.seconds / per_step if per_step else 0.0
            # hop h runs while step h's block computes; the gradients' last hop home runs
            # after the last block: behind nothing
            hop = c_i.collective.step
            home = c_i.collective.value in r.grads and hop == c - 1
            out[i] = 0.0 if home else min(per_step, block * steps[hop]) * share
    return out


def hide(plan, ops, collectives, parts=None) -> list:
    """``collectives`` (``CollectiveEstimate``) with the part of each ring transfer that
    runs behind the ring's blocks set (``behind_s``)."""
    if not plan.rings:
        return list(collectives)
    behind = behind_s(plan, ops, collectives, parts)
    return [
        dataclasses.replace(c, behind_s=behind[i]) if i in behind else c
        for i, c in enumerate(collectives)
    ]


def working(ring, mesh, state) -> int:
    """Bytes per device a ring's pass holds beside what it reads and makes."""
    r, c = ring.evaluated, ring.size
    if ring.kind == "replay":
        return 0
    logits = math.prod(state.shardings[r.logits].local_shape(mesh)) // c * 4
    reads = dict(ring.reads)
    kv = reads[r.keys].local_nbytes(mesh) + reads[r.values].local_nbytes(mesh)
    out = math.prod(state.shardings[r.out].local_shape(mesh)) * 4
    if not ring.backward:
        return 2 * logits + kv + out
    grads = sum(math.prod(lay.local_shape(mesh)) * 4 for _, lay in ring.makes)
    return 3 * logits + kv + 2 * grads


def kept(ring, mesh, state) -> Sharding:
    """The log-sum-exp the forward pass keeps for the backward, as a buffer's layout."""
    r = ring.region.forward
    rows = (
        math.prod(state.shardings[r.logits].local_shape(mesh))
        // state.shardings[r.logits].local_shape(mesh)[r.key_dim]
    )
    return Sharding.unsharded((rows * 4,), np.dtype(np.uint8))
