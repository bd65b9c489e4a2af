"""Reductions and scans along a dimension.

reduce_sum / reduce_max / reduce_min leave the result pending that reduction when the
reduced dimension is tiled. Other reductions (prod, and, or, argmax...) and cumulative
ops cannot split the dimension they run along: it is blocked. A reduction costs one flop
per reducer application (argmax/argmin: XLA's 9 per application of JAX's comparator for
floats, 7 for integers); a cumulative op the n - 1 combines per line of a work-efficient
scan (XLA:CPU rewrites JAX's O(n^2) reduce-window its own way: see README.md).
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp

from workbench.core.ops.costs import OpCost, elements, io_bytes
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import KERNEL, REDUCTION
from workbench.core.ops.registry import register

#: XLA:CPU reduces these by a reduce-window tree that reads its input from a buffer
_TREE = replace(
    KERNEL,
    why="not in the simulator's tables before; XLA:CPU reduces it by a reduce-window tree "
    "reading its input from a buffer: it fuses no input, unlike reduce_sum",
)


def _reduce_cost(params, operands, results):
    applied = elements(operands[0]) - elements(results[0])
    return OpCost(float(applied), 0.0, io_bytes(operands, results))


def _argreduce_cost(params, operands, results):
    applied = elements(operands[0]) - elements(results[0])
    per = 9 if jnp.issubdtype(operands[0].dtype or "float32", jnp.inexact) else 7
    return OpCost(float(per * applied), 0.0, io_bytes(operands, results))


def _combines(params, x) -> int:
    """n - 1 combines along the scanned axis, per line: a work-efficient scan."""
    n = x.shape[params.get("axis", 0)] if x.shape else 1
    return elements(x) // max(n, 1) * max(n - 1, 0)


def _cumulative_cost(params, operands, results):
    return OpCost(float(_combines(params, operands[0])), 0.0, io_bytes(operands, results))


def _cumlogsumexp_cost(params, operands, results):
    c = _combines(params, operands[0])  # logaddexp: 8 flops and 2 transcendentals
    return OpCost(8.0 * c, 2.0 * c, io_bytes(operands, results))


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


@register("reduce_sum", cost=_reduce_cost, fusion=REDUCTION)
def _reduce_sum_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="sum", linear=((0,),))


@register("reduce_max", cost=_reduce_cost, fusion=REDUCTION)
def _reduce_max_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="max")


@register("reduce_min", cost=_reduce_cost, fusion=REDUCTION)
def _reduce_min_rule(params, operands, results):
    b, out = _reduction(operands, params["axes"], blocked=False)
    b.result(out)
    return b.build(reduction="min")


@register("reduce_prod", "reduce_and", "reduce_or", "reduce_xor", cost=_reduce_cost, fusion=_TREE)
@register("argmax", "argmin", cost=_argreduce_cost, fusion=REDUCTION)
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


@register("cumsum", cost=_cumulative_cost, fusion=KERNEL)
def _cumsum_rule(params, operands, results):
    return _along_axis(params, operands).build(linear=((0,),))


@register("cumprod", "cummax", "cummin", cost=_cumulative_cost, fusion=KERNEL)
@register("cumlogsumexp", cost=_cumlogsumexp_cost, fusion=KERNEL)
def _cumulative_rule(params, operands, results):
    return _along_axis(params, operands).build()
