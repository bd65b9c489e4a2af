"""Reductions and scans along a dimension.

reduce_sum / reduce_max / reduce_min leave the result pending that reduction when the
reduced dimension is tiled. Other reductions (prod, and, or, argmax...) and cumulative
ops cannot split the dimension they run along: it is blocked.
"""

from __future__ import annotations

from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.registry import register


def _reduction(operands, axes, *, blocked: bool, **kwargs):
    (x,) = operands[:1]
    b = MappingBuilder()
    dims = []
    out = []
    for d, n in enumerate(x.shape):
        f = b.factor(n, blocked=blocked and d in axes)
        dims.append((f,))
        if d not in axes:
            out.append((f,))
    b.operand(dims)
    return b, out


@register("reduce_sum")
def _reduce_sum_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="sum", linear=((0,),))


@register("reduce_max")
def _reduce_max_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="max")


@register("reduce_min")
def _reduce_min_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="min")


@register("reduce_prod", "reduce_and", "reduce_or", "reduce_xor", "argmax", "argmin")
def _blocked_reduction_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=True)
    for _ in results:
        b.result(out)
    return b.build()


def _along_axis(params, operands):
    (x,) = operands
    b = MappingBuilder()
    dims = [(b.factor(n, blocked=d == params["axis"]),) for d, n in enumerate(x.shape)]
    b.operand(dims)
    b.result(dims)
    return b


@register("cumsum")
def _cumsum_rule(params, operands, results):
    return _along_axis(params, operands).build(linear=((0,),))


@register("cumprod", "cummax", "cummin", "cumlogsumexp")
def _cumulative_rule(params, operands, results):
    return _along_axis(params, operands).build()
