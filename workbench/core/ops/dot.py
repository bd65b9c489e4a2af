"""dot_general: batch factors in all three tensors, free factors in one operand and the result,
contracting factors in both operands only (tiling one leaves the result a partial sum).
It costs 2 x output elements x contracting size FLOPs.

ragged_dot_general (``jax.lax.ragged_dot``, a grouped matmul: mixture-of-experts layers) is a
dot_general whose lhs ragged dimension is cut into groups by ``group_sizes``: the ragged
factor and the groups factor are blocked (the sizes count rows from the start of the whole
dimension); batch, free and other contracting factors map as dot_general's."""

from __future__ import annotations

import math

from workbench.core.ops.costs import OpCost, elements, io_bytes
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import COPYING, Fusion, Traits
from workbench.core.ops.registry import register


def _dot_general_cost(params, operands, results):
    (lc, _), _ = params["dimension_numbers"]
    k = math.prod(operands[0].shape[d] for d in lc)
    return OpCost(2.0 * elements(results[0]) * k, 0.0, io_bytes(operands, results))


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


def _ragged_dot_cost(params, operands, results):
    """Each row meets one group's matrix: 2 x output rows x contracting size FLOPs (the
    groups' [g, ...] result of a ragged contraction is counted once, not g times)."""
    lc, _, _, _, ragged, _ = _ragged_dims(params)
    k = math.prod(operands[0].shape[d] for d in lc)
    n_out = elements(results[0])
    if ragged in lc:  # [g, ...]: the groups split the contraction
        n_out //= max(results[0].shape[0], 1)
    return OpCost(2.0 * n_out * k, 0.0, io_bytes(operands, results))


_RAGGED_FUSION = Fusion(
    copies_operands=True,
    why="XLA:CPU expands it into a masked dense dot (every row against every group), whose "
    "operands are copied into its order as a dot_general's",
)


@register("ragged_dot_general", cost=_ragged_dot_cost, fusion=_RAGGED_FUSION)
def _ragged_dot_rule(params, operands, results):
    """Three modes, by where the ragged dimension sits: free ([m, k] x [g, k, n] -> [m, n]),
    contracting ([k, m] x [k, n] -> [g, m, n]) or batch; ``group_sizes`` is [g] or
    [prefix..., g], its prefix the lhs dimensions before the ragged one (JAX's rule)."""
    lc, rc, lb, rb, ragged, groups = _ragged_dims(params)
    lhs, rhs, sizes = operands
    b = MappingBuilder()
    g = b.factor(sizes.shape[-1], blocked=True)
    ldims: list = [None] * lhs.rank
    rdims: list = [None] * rhs.rank
    out = [(g,)] if ragged in lc else []
    for i, j in zip(lb, rb):
        f = b.factor(lhs.shape[i], blocked=i == ragged)
        ldims[i] = rdims[j] = (f,)
        out.append((f,))
    for i, j in zip(lc, rc):
        ldims[i] = rdims[j] = (b.factor(lhs.shape[i], blocked=i == ragged),)
    for d in groups:
        rdims[d] = (g,)
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
