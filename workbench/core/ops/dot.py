"""dot_general: batch factors in all three tensors, free factors in one operand and the result,
contracting factors in both operands only (tiling one leaves the result a partial sum)."""

from __future__ import annotations

from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.registry import register


@register("dot_general")
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
