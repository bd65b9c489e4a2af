"""Indexing: dynamic_slice, dynamic_update_slice, gather and the scatters.

A gather whose looked-up dimension is tiled (an embedding table sharded on its vocab)
is a masked local lookup: each device answers the indices it holds and the result is a
partial sum, exactly like a contraction. The transpose, scatter-add, sums the updates it
scatters: their scatter dimensions are contracting factors.
"""

from __future__ import annotations

from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.registry import register


@register("dynamic_slice")
def _dynamic_slice_rule(params, operands, results):
    x, *indices = operands
    (out,) = results
    b = MappingBuilder()
    ins, outs = [], []
    for d, n in enumerate(x.shape):
        if params["slice_sizes"][d] == n:
            f = b.factor(n)
            ins.append((f,))
            outs.append((f,))
        else:
            ins.append((b.factor(n, blocked=True),))
            outs.append((b.factor(out.shape[d], blocked=True),))
    b.operand(ins)
    for t in indices:
        b.operand([() for _ in t.shape])
    b.result(outs)
    return b.build(linear=((0,),), structural=True)


@register("dynamic_update_slice")
def _dynamic_update_slice_rule(params, operands, results):
    x, update, *indices = operands
    b = MappingBuilder()
    ins, ups = [], []
    for d, n in enumerate(x.shape):
        if update.shape[d] == n:
            f = b.factor(n)
            ins.append((f,))
            ups.append((f,))
        else:
            ins.append((b.factor(n, blocked=True),))
            ups.append((b.factor(update.shape[d], blocked=True),))
    b.operand(ins)
    b.operand(ups)
    for t in indices:
        b.operand([() for _ in t.shape])
    b.result(ins)
    return b.build(linear=((0, 1),), structural=True)


@register("gather")
def _gather_rule(params, operands, results):
    x, idx = operands
    (out,) = results
    dn = params["dimension_numbers"]
    slice_sizes = params["slice_sizes"]
    b = MappingBuilder()
    xd: list = [None] * x.rank
    idd: list = [None] * idx.rank
    od: list = [None] * out.rank
    # indices: every dim but the last (the index vector) is a batch dim of the result
    batch_out = [d for d in range(out.rank) if d not in dn.offset_dims]
    for k, d in enumerate(range(idx.rank - 1)):
        f = b.factor(idx.shape[d])
        idd[d] = od[batch_out[k]] = (f,)
    idd[idx.rank - 1] = (b.factor(idx.shape[-1], blocked=True),)
    for xdim, idim in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
        xd[xdim] = idd[idim]
    window = [
        d
        for d in range(x.rank)
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    for d, odim in zip(window, dn.offset_dims):
        if slice_sizes[d] == x.shape[d] and d not in dn.start_index_map:
            f = b.factor(x.shape[d])
            xd[d] = od[odim] = (f,)
        else:
            xd[d] = (b.factor(x.shape[d], blocked=True),)
            od[odim] = (b.factor(out.shape[odim], blocked=True),)
    for d in dn.collapsed_slice_dims:
        # a looked-up dimension: absent from the result, so tiling it leaves a partial sum
        xd[d] = (b.factor(x.shape[d], blocked=d not in dn.start_index_map),)
    b.operand(xd)
    b.operand(idd)
    b.result(od)
    return b.build(linear=((0,),))


def _scatter(params, operands, results, *, additive: bool):
    x, idx, upd = operands
    dn = params["dimension_numbers"]
    b = MappingBuilder()
    xd = [(b.factor(n),) for n in x.shape]
    idd: list = [None] * idx.rank
    ud: list = [None] * upd.rank
    scatter_upd = [d for d in range(upd.rank) if d not in dn.update_window_dims]
    batching = dict(zip(dn.scatter_indices_batching_dims, dn.operand_batching_dims))
    for k, d in enumerate(range(idx.rank - 1)):
        if d in batching:
            f = xd[batching[d]][0]
        else:  # summed into the result (scatter-add) or overwritten (scatter)
            f = b.factor(idx.shape[d], blocked=not additive)
        idd[d] = ud[scatter_upd[k]] = (f,)
    idd[idx.rank - 1] = (b.factor(idx.shape[-1], blocked=True),)
    window = [
        d
        for d in range(x.rank)
        if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims
    ]
    for d, udim in zip(window, dn.update_window_dims):
        if upd.shape[udim] == x.shape[d] and d not in dn.scatter_dims_to_operand_dims:
            ud[udim] = xd[d]
        else:
            ud[udim] = (b.factor(upd.shape[udim], blocked=True),)
            b.blocked.add(xd[d][0])
    b.operand(xd)
    b.operand(idd)
    b.operand(ud)
    b.result(xd)
    return b.build(linear=((0, 2),) if additive else ())


@register("scatter-add", "scatter_add")
def _scatter_add_rule(params, operands, results):
    return _scatter(params, operands, results, additive=True)


@register(
    "scatter",
    "scatter-mul",
    "scatter_mul",
    "scatter-min",
    "scatter_min",
    "scatter-max",
    "scatter_max",
)
def _scatter_rule(params, operands, results):
    return _scatter(params, operands, results, additive=False)
