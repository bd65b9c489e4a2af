"""Indexing: dynamic_slice, dynamic_update_slice, gather and the scatters.

A gather whose looked-up dimension is tiled (an embedding table sharded on its vocab)
is a masked local lookup: each device answers the indices it holds and the result is a
partial sum, exactly like a contraction. The transpose, scatter-add, sums the updates it
scatters: their scatter dimensions are contracting factors. On local shards such a gather
looks up only the rows its device holds (the others give zero: the pending sum), and a
scatter into a tiled dimension shifts its indices and drops the updates others own. Slices,
gathers and scatters touch only what they read or write (see README.md).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax import lax

from workbench.core.ops.costs import OpCost, elements, tensor_bytes
from workbench.core.ops.local import (
    bind,
    local_params,
    offset,
    order_free_but,
    result_shape,
)
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import KERNEL, MOVES, Barrier, Traits
from workbench.core.ops.registry import register


# -- costs (local types) ---------------------------------------------------------------------
def _dynamic_slice_cost(params, operands, results):
    idx = sum(tensor_bytes(t) for t in operands[1:])
    return OpCost(0.0, 0.0, 2 * tensor_bytes(results[0]) + idx)


def _dynamic_update_slice_cost(params, operands, results):
    idx = sum(tensor_bytes(t) for t in operands[2:])
    return OpCost(0.0, 0.0, 2 * tensor_bytes(operands[1]) + idx)


def _gather_cost(params, operands, results):
    return OpCost(0.0, 0.0, 2 * tensor_bytes(results[0]) + tensor_bytes(operands[1]))


def _scatter_cost(params, operands, results, combine: int):
    """In place: the updates read, combined (``combine`` flops each) and written."""
    updates = operands[2]
    flops = float(combine * elements(updates))
    return OpCost(flops, 0.0, 3 * tensor_bytes(updates) + tensor_bytes(operands[1]))


# -- on local shards --------------------------------------------------------------------------
@order_free_but(lambda dn: dn.start_index_map)
def _gather_local(op, args, ins, outs, mesh):
    """Local slice sizes; where a looked-up dimension is tiled, a masked local lookup."""
    x, idx = args
    xl = ins[0]
    g, loc = xl.shape, xl.local_shape(mesh)
    sizes = tuple(m if s == n else s for s, n, m in zip(op.params["slice_sizes"], g, loc))
    params = local_params(op, slice_sizes=sizes)
    dn = params["dimension_numbers"]
    tiled = [
        (p, d)
        for p, d in enumerate(dn.start_index_map)
        if d in dn.collapsed_slice_dims and xl.dims[d]
    ]
    if not tiled:
        return bind(op, args, params)
    valid = None
    for p, d in tiled:
        local = xl.shape[d] // xl.shards(d, mesh)
        shifted = idx[..., p] - offset(xl, d, mesh).astype(idx.dtype)
        ok = (shifted >= 0) & (shifted < local)
        idx = idx.at[..., p].set(jnp.clip(shifted, 0, local - 1))
        valid = ok if valid is None else valid & ok
    params = dict(params, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS, fill_value=None)
    (out,) = bind(op, [x, idx], params)
    batch_dims = [d for d in range(out.ndim) if d not in dn.offset_dims]
    mask = jnp.expand_dims(valid, tuple(dn.offset_dims)) if dn.offset_dims else valid
    assert mask.ndim == out.ndim and len(batch_dims) == valid.ndim
    return [jnp.where(mask, out, jnp.zeros((), out.dtype))]


@order_free_but(lambda dn: dn.scatter_dims_to_operand_dims)
def _scatter_local(op, args, ins, outs, mesh):
    """Indices into a tiled dimension shifted to the local block; others' updates dropped."""
    x, idx, upd = args
    xl = ins[0]
    params = local_params(op)
    dn = params["dimension_numbers"]
    tiled = [(p, d) for p, d in enumerate(dn.scatter_dims_to_operand_dims) if xl.dims[d]]
    if not tiled:
        return bind(op, args, params)
    clip = params.get("mode") == lax.GatherScatterMode.CLIP
    for p, d in tiled:
        column = idx[..., p]
        if clip:
            column = jnp.clip(column, 0, xl.shape[d] - 1)
        idx = idx.at[..., p].set(column - offset(xl, d, mesh).astype(idx.dtype))
    params = dict(params, mode=lax.GatherScatterMode.FILL_OR_DROP)
    return bind(op, [x, idx, upd], params)


# -- rules -----------------------------------------------------------------------------------
@register(
    "dynamic_slice",
    cost=_dynamic_slice_cost,
    fusion=MOVES,
    local=result_shape("slice_sizes"),
)
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


@register("dynamic_update_slice", cost=_dynamic_update_slice_cost, fusion=MOVES)
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


@register(
    "gather", cost=_gather_cost, fusion=MOVES, local=_gather_local, traits=Traits(lookup=True)
)
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


_ADD = partial(_scatter_cost, combine=1)


@register("scatter-add", "scatter_add", cost=_ADD, fusion=KERNEL, local=_scatter_local)
def _scatter_add_rule(params, operands, results):
    return _scatter(params, operands, results, additive=True)


@register("scatter", cost=partial(_scatter_cost, combine=0), fusion=KERNEL, local=_scatter_local)
@register(
    "scatter-mul",
    "scatter_mul",
    "scatter-min",
    "scatter_min",
    "scatter-max",
    "scatter_max",
    cost=_ADD,
    fusion=KERNEL,
    local=_scatter_local,
)
def _scatter_rule(params, operands, results):
    return _scatter(params, operands, results, additive=False)


register("scatter-sub", "scatter_sub", cost=_ADD, fusion=KERNEL)(
    Barrier("no rule written yet for a scatter that subtracts its updates")
)
