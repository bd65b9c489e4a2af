"""Sorting, top-k, windowed reductions (pooling and its gradient), the FFT and Pallas kernels.

Their costs follow XLA's formulas (sort: n x ceil(log2 n) over the whole first operand;
reduce-window: window - 1 per output; select-and-scatter: window per source element), except
``top_k``, a custom call XLA:CPU prices at -1: here a partial sort, n x ceil(log2(k + 1)).
A ``pallas_call`` costs what its author says it does, else its body times its grid.
"""

from __future__ import annotations

import math

from workbench.core.ops.costs import OpCost, elements, io_bytes, jaxpr_cost
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import KERNEL, Barrier
from workbench.core.ops.registry import register


def _sort_cost(params, operands, results):
    n = elements(operands[0])
    return OpCost(
        float(n * math.ceil(math.log2(n))) if n > 1 else 0.0, 0.0, io_bytes(operands, results)
    )


def _top_k_cost(params, operands, results):
    k = int(params.get("k", results[0].shape[-1] if results[0].shape else 1))
    return OpCost(
        float(elements(operands[0]) * max(1, math.ceil(math.log2(k + 1)))),
        0.0,
        io_bytes(operands, results),
    )


def _reduce_window_cost(params, operands, results):
    window = math.prod(params.get("window_dimensions", (1,)))
    n_out = sum(elements(r) for r in results)
    return OpCost(float((window - 1) * n_out), 0.0, io_bytes(operands, results))


def _select_and_scatter_add_cost(params, operands, results):
    # XLA: (window - 1) selects (one compare) + 1 scatter (one add) per source element.
    window = math.prod(params.get("window_dimensions", (1,)))
    return OpCost(float(window * elements(operands[0])), 0.0, io_bytes(operands, results))


def _select_and_gather_add_cost(params, operands, results):
    # lowered to a reduce-window over (value, tangent) pairs: 3 flops per combine
    window = math.prod(params.get("window_dimensions", (1,)))
    return OpCost(float(3 * (window - 1) * elements(results[0])), 0.0, io_bytes(operands, results))


def _fft_cost(params, operands, results):
    lengths = params.get("fft_lengths", ())
    logs = math.prod(int(math.log2(n)) for n in lengths) if lengths else 1
    return OpCost(8.0 * logs * elements(operands[0]), 0.0, io_bytes(operands, results))


@register("sort", cost=_sort_cost, fusion=KERNEL)
def _sort_rule(params, operands, results):
    axis = params["dimension"]
    b = MappingBuilder()
    dims = [(b.factor(n, blocked=d == axis),) for d, n in enumerate(operands[0].shape)]
    for _ in operands:
        b.operand(dims)
    for _ in results:
        b.result(dims)
    return b.build()


@register("top_k", cost=_top_k_cost, fusion=KERNEL)
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


@register(
    "reduce_window_sum",
    "reduce_window_max",
    "reduce_window_min",
    "reduce_window",
    cost=_reduce_window_cost,
    fusion=KERNEL,
)
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


@register("select_and_scatter_add", cost=_select_and_scatter_add_cost, fusion=KERNEL)
@register("select_and_gather_add", cost=_select_and_gather_add_cost, fusion=KERNEL)
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


register("fft", cost=_fft_cost, fusion=KERNEL)(
    Barrier("no rule written yet: an FFT needs its transformed dimensions whole")
)


def _pallas_cost(params, operands, results):
    """A Pallas kernel: the cost its author gave it (``pallas_call(cost_estimate=)``, which
    XLA takes too); else its body's on its blocks (``jaxpr_cost``) times the grid's steps,
    with its operands read and its results written once."""
    given = params.get("cost_estimate")
    if given is not None:
        flops, calls, nbytes = given.flops, given.transcendentals, given.bytes_accessed
        return OpCost(float(flops), float(calls), float(nbytes))
    steps = math.prod(int(n) for n in params["grid_mapping"].grid)
    body = jaxpr_cost(params["jaxpr"])
    return OpCost(body.flops * steps, body.transcendentals * steps, io_bytes(operands, results))


register("pallas_call", cost=_pallas_cost, fusion=KERNEL)(
    Barrier("a Pallas kernel's blocks index its whole arrays, so they are kept whole")
)
