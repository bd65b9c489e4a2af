"""dot_general: batch factors in all three tensors, free factors in one operand and the result,
contracting factors in both operands only (tiling one leaves the result a partial sum).
It costs 2 x output elements x contracting size FLOPs."""

from __future__ import annotations

import math

from workbench.core.ops.costs import OpCost, elements, io_bytes
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import COPYING, Traits
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
