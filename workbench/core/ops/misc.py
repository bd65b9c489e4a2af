"""Sorting, top-k and windowed reductions (pooling and its gradient)."""

from __future__ import annotations

from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.registry import register


@register("sort")
def _sort_rule(params, operands, results):
    axis = params["dimension"]
    b = MappingBuilder()
    dims = [(b.factor(n, blocked=d == axis),) for d, n in enumerate(operands[0].shape)]
    for _ in operands:
        b.operand(dims)
    for _ in results:
        b.result(dims)
    return b.build()


@register("top_k")
def _top_k_rule(params, operands, results):
    (x,) = operands
    b = MappingBuilder()
    lead = [(b.factor(n),) for n in x.shape[:-1]]
    b.operand([*lead, (b.factor(x.shape[-1], blocked=True),)])
    for t in results:
        b.result([*lead, (b.factor(t.shape[-1], blocked=True),)])
    return b.build()


def _window_trivial(params, d) -> bool:
    def at(key, default):
        value = params.get(key)
        return default if value is None else value[d]

    return (
        params["window_dimensions"][d] == 1
        and at("window_strides", 1) == 1
        and tuple(at("padding", (0, 0))) == (0, 0)
        and at("base_dilation", 1) == 1
        and at("window_dilation", 1) == 1
    )


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def _reduce_window_rule(params, operands, results):
    x = operands[0]
    out = results[0]
    b = MappingBuilder()
    ins, outs = [], []
    for d, n in enumerate(x.shape):
        if _window_trivial(params, d):
            f = b.factor(n)
            ins.append((f,))
            outs.append((f,))
        else:
            ins.append((b.factor(n, blocked=True),))
            outs.append((b.factor(out.shape[d], blocked=True),))
    for t in operands:
        b.operand(ins if t.rank == x.rank else [() for _ in t.shape])
    for _ in results:
        b.result(outs)
    return b.build()


@register("select_and_scatter_add", "select_and_gather_add")
def _select_and_scatter_rule(params, operands, results):
    # select_and_scatter_add(source, operand) -> like operand; select_and_gather_add(tangents, operand)
    src, x = operands[0], operands[1]
    (out,) = results
    b = MappingBuilder()
    sd, xd, od = [], [], []
    for d, n in enumerate(x.shape):
        if _window_trivial(params, d):
            f = b.factor(n)
            sd.append((f,))
            xd.append((f,))
            od.append((f,))
        else:
            sd.append((b.factor(src.shape[d], blocked=True),))
            xd.append((b.factor(n, blocked=True),))
            od.append((b.factor(out.shape[d], blocked=True),))
    b.operand(sd)
    b.operand(xd)
    b.result(od)
    return b.build()
