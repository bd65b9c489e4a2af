"""dot_general: batch factors in all three tensors, free factors in one operand and the result,
contracting factors in both operands only (tiling one leaves the result a partial sum).
It costs 2 x output elements x contracting size FLOPs.

ragged_dot_general (``jax.lax.ragged_dot``, a grouped matmul: mixture-of-experts layers) is a
dot_general whose lhs ragged dimension is cut into groups by ``group_sizes``: the ragged
factor and the sizes' groups factor are blocked (the sizes count rows from the start of the
whole dimension); batch, free and other contracting factors map as dot_general's. The rhs's
group dim (free mode) and the result's (contracting mode: a weight gradient) have a factor of
their own that may be tiled (expert parallelism): each device runs its own groups, found at
an offset in the whole rows from the whole sizes; free mode leaves a pending sum (the other
groups' rows are zeros). Batch mode and batched sizes keep the groups whole.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from workbench.core.ops.costs import OpCost, elements, io_bytes
from workbench.core.ops.local import bind, local_params, shard_index
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import COPYING, Fusion, Traits
from workbench.core.ops.registry import register


def _dot_general_cost(params, operands, results):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lhs, rhs = operands[0].shape, operands[1].shape
    k = math.prod(lhs[d] for d in lc)
    rows = math.prod(n for d, n in enumerate(lhs) if d not in lc and d not in lb)
    columns = math.prod(n for d, n in enumerate(rhs) if d not in rc and d not in rb)
    gemm = (math.prod(lhs[d] for d in lb), rows, columns, k)
    return OpCost(2.0 * elements(results[0]) * k, 0.0, io_bytes(operands, results), gemm)


@register("dot_general", cost=_dot_general_cost, fusion=COPYING, traits=Traits(contraction=True))
def _dot_general_rule(params, operands, results):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lhs, rhs = operands
    b = MappingBuilder()
    ldims: list = [None] * lhs.rank
    rdims: list = [None] * rhs.rank
    out = []
    for i, j in zip(lb, rb):
        f = b.factor(lhs.shape[i])
        ldims[i] = rdims[j] = (f,)
        out.append((f,))
    for i, j in zip(lc, rc):
        f = b.factor(lhs.shape[i])
        ldims[i] = rdims[j] = (f,)
    for dims, t in ((ldims, lhs), (rdims, rhs)):
        for d in range(t.rank):
            if dims[d] is None:
                dims[d] = (b.factor(t.shape[d]),)
                out.append(dims[d])
    b.operand(ldims)
    b.operand(rdims)
    b.result(out)
    return b.build(linear=((0,), (1,)))


def _ragged_dims(params):
    rdn = params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = rdn.dot_dimension_numbers
    (ragged,) = rdn.lhs_ragged_dimensions
    return lc, rc, lb, rb, ragged, tuple(rdn.rhs_group_dimensions)


def _split_groups(params, sizes_rank: int) -> bool:
    """Whether the groups may be tiled: free or contracting mode with [g] sizes."""
    _, _, lb, _, ragged, _ = _ragged_dims(params)
    return sizes_rank == 1 and ragged not in lb


def _ragged_dot_cost(params, operands, results):
    """Each row meets one group's matrix: 2 x output rows x contracting size FLOPs (the
    groups' [g, ...] result of a ragged contraction is counted once, not g times). On local
    shapes with the groups tiled, a device runs only its g_local of the g groups' rows
    (counted as balanced: rows x g_local / g)."""
    lc, _, _, _, ragged, groups = _ragged_dims(params)
    k = math.prod(operands[0].shape[d] for d in lc)
    n_out = elements(results[0])
    g = max(operands[2].shape[-1], 1)
    if ragged in lc:  # [g_local, ...]: the groups split the contraction
        flops = 2.0 * n_out * k / g
    else:
        local = operands[1].shape[groups[0]] if groups else g
        flops = 2.0 * n_out * k * local / g
    return OpCost(flops, 0.0, io_bytes(operands, results))


def _ragged_local(op, args, ins, outs, mesh):
    """With the groups tiled (the rhs's group dim, or a ragged contraction's result's), the
    device's groups only: the rows shifted so its first group starts at row 0 (its offset:
    the sizes of the groups before it), its sizes, and the result shifted back; rows of the
    other groups are zeros (free mode: the pending sum) or left out (contracting mode)."""
    lc, rc, lb, _, ragged, groups = _ragged_dims(op.params)
    params = local_params(op)
    lhs, rhs, sizes = args
    contracting = ragged in lc
    split = _split_groups(op.params, sizes.ndim)
    axes = (outs[0].dims[0] if contracting else ins[1].dims[groups[0]]) if split else ()
    if not axes:
        return bind(op, args, params)
    n = outs[0].local_shape(mesh)[0] if contracting else rhs.shape[groups[0]]
    first = shard_index(axes, mesh) * n
    start = jnp.sum(jnp.where(jnp.arange(sizes.shape[-1]) < first, sizes, 0))
    mine = lax.dynamic_slice_in_dim(sizes, first, n)
    rows = jnp.arange(lhs.shape[ragged]) < jnp.sum(mine)
    lhs = jnp.roll(lhs, -start, axis=ragged)
    if contracting:  # rows of no local group contribute nothing
        keep = jnp.expand_dims(rows, [d for d in range(lhs.ndim) if d != ragged])
        lhs = jnp.where(keep, lhs, jnp.zeros((), lhs.dtype))
        rhs = jnp.roll(rhs, -start, axis=rc[list(lc).index(ragged)])
        return bind(op, [lhs, rhs, mine], params)
    (out,) = bind(op, [lhs, rhs, mine], params)
    free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    at = len(lb) + free.index(ragged)
    keep = jnp.expand_dims(rows, [d for d in range(out.ndim) if d != at])
    return [jnp.roll(jnp.where(keep, out, jnp.zeros((), out.dtype)), start, axis=at)]


_RAGGED_FUSION = Fusion(
    copies_operands=True,
    why="XLA:CPU expands it into a masked dense dot (every row against every group), whose "
    "operands are copied into its order as a dot_general's",
)


@register("ragged_dot_general", cost=_ragged_dot_cost, fusion=_RAGGED_FUSION, local=_ragged_local)
def _ragged_dot_rule(params, operands, results):
    """Three modes, by where the ragged dimension sits: free ([m, k] x [g, k, n] -> [m, n]),
    contracting ([k, m] x [k, n] -> [g, m, n]) or batch; ``group_sizes`` is [g] or
    [prefix..., g], its prefix the lhs dimensions before the ragged one (JAX's rule). With
    [g] sizes, free and contracting mode give the rhs's or the result's groups a factor of
    their own (the sizes' stays blocked: every device reads them whole)."""
    lc, rc, lb, rb, ragged, groups = _ragged_dims(params)
    lhs, rhs, sizes = operands
    b = MappingBuilder()
    g = b.factor(sizes.shape[-1], blocked=True)
    own = b.factor(sizes.shape[-1]) if _split_groups(params, sizes.rank) else g
    ldims: list = [None] * lhs.rank
    rdims: list = [None] * rhs.rank
    out = [(own,)] if ragged in lc else []
    for i, j in zip(lb, rb):
        f = b.factor(lhs.shape[i], blocked=i == ragged)
        ldims[i] = rdims[j] = (f,)
        out.append((f,))
    for i, j in zip(lc, rc):
        ldims[i] = rdims[j] = (b.factor(lhs.shape[i], blocked=i == ragged),)
    for d in groups:
        rdims[d] = (own,)
    for side, (dims, t) in enumerate(((ldims, lhs), (rdims, rhs))):
        for d in range(t.rank):
            if dims[d] is None:
                dims[d] = (b.factor(t.shape[d], blocked=side == 0 and d == ragged),)
                out.append(dims[d])
    if sizes.rank > 1:  # [b..., x..., g]: the lhs dimensions before the ragged one
        free = [d for d in range(lhs.rank) if d not in lc and d not in lb]
        if ragged in lb:
            prefix = list(lb[: list(lb).index(ragged)])
        elif ragged in lc:
            prefix = [*lb, *lc[: list(lc).index(ragged)]]
        else:
            prefix = [*lb, *free[: free.index(ragged)]]
    else:
        prefix = []
    b.operand(ldims)
    b.operand(rdims)
    b.operand([ldims[d] for d in prefix] + [(g,)])
    b.result(out)
    return b.build(linear=((0,), (1,)))
