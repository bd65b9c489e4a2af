"""Per-device versions of primitives: local shapes in params, masked lookups, iota offsets.

Most primitives run unchanged on local shards. Those that carry global shapes in their
params get local ones; an ``iota`` tiled along its counting dimension adds its shard's
offset; a ``gather`` whose looked-up dimension is tiled looks up only the rows its device
holds (the others give zero, and the result is a pending sum); a ``scatter`` into a tiled
dimension shifts its indices and drops the updates other devices own.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding


def shard_index(axes, mesh: Mesh):
    """This device's block index along a dimension tiled over ``axes`` (major to minor)."""
    index = 0
    for axis in axes:
        index = index * mesh.axis_size(axis) + lax.axis_index(axis)
    return index


def offset(layout: Sharding, dim: int, mesh: Mesh):
    """Where this device's block of ``dim`` starts in the global array."""
    local = layout.shape[dim] // layout.shards(dim, mesh)
    return shard_index(layout.dims[dim], mesh) * local


def local_params(op, params: dict, ins: list[Sharding], outs: list[Sharding], mesh: Mesh) -> dict:
    params = {k: (None if k in ("sharding", "out_sharding") else v) for k, v in params.items()}
    prim = op.primitive
    out_local = [o.local_shape(mesh) for o in outs]
    in_local = [i.local_shape(mesh) if i is not None else None for i in ins]
    if prim == "broadcast_in_dim":
        params["shape"] = out_local[0]
    elif prim == "reshape":
        params["new_sizes"] = out_local[0]
    elif prim == "iota":
        params["shape"] = out_local[0]
    elif prim == "dynamic_slice":
        params["slice_sizes"] = out_local[0]
    elif prim == "slice":
        g, loc = ins[0].shape, in_local[0]
        params["limit_indices"] = tuple(
            m if lim == n else lim for lim, n, m in zip(params["limit_indices"], g, loc)
        )
    elif prim == "gather":
        g, loc = ins[0].shape, in_local[0]
        params["slice_sizes"] = tuple(
            m if s == n else s for s, n, m in zip(params["slice_sizes"], g, loc)
        )
    elif prim == "conv_general_dilated" and params.get("feature_group_count", 1) > 1:
        dn = params["dimension_numbers"]
        params["feature_group_count"] = in_local[0][dn.lhs_spec[1]] // in_local[1][dn.rhs_spec[1]]
    return params


def bind_local(op, args: list, ins: list[Sharding], outs: list[Sharding], mesh: Mesh, plan) -> list:
    """Run ``op`` on local shards laid out as ``ins``, producing ``outs``: by the lowering
    in the primitive's record if it has one (see ``rules.registry.Record``)."""
    from workbench.core.ops.registry import RECORDS

    record = RECORDS.get(op.primitive)
    if record is not None and record.local is not None:
        return record.local(op, args, ins, outs, mesh)
    params = local_params(op, dict(op.params), ins, outs, mesh)
    prim = op.jax_primitive
    if op.primitive == "iota":
        return [_iota(prim, params, outs[0], mesh)]
    if op.primitive == "gather":
        return [_gather(prim, params, args, ins, outs, mesh)]
    if op.primitive in (
        "scatter-add",
        "scatter_add",
        "scatter",
        "scatter-mul",
        "scatter-min",
        "scatter-max",
    ):
        return [_scatter(prim, params, args, ins, mesh)]
    out = prim.bind(*args, **params)
    return list(out) if prim.multiple_results else [out]


def _iota(prim, params, layout: Sharding, mesh: Mesh):
    out = prim.bind(**params)
    d = params["dimension"]
    if layout.dims[d]:
        out = out + offset(layout, d, mesh).astype(out.dtype)
    return out


def _gather(prim, params, args, ins, outs, mesh):
    x, idx = args
    xl = ins[0]
    dn = params["dimension_numbers"]
    tiled = [
        (p, d)
        for p, d in enumerate(dn.start_index_map)
        if d in dn.collapsed_slice_dims and xl.dims[d]
    ]
    if not tiled:
        return prim.bind(x, idx, **params)
    valid = None
    for p, d in tiled:
        local = xl.shape[d] // xl.shards(d, mesh)
        shifted = idx[..., p] - offset(xl, d, mesh).astype(idx.dtype)
        ok = (shifted >= 0) & (shifted < local)
        idx = idx.at[..., p].set(jnp.clip(shifted, 0, local - 1))
        valid = ok if valid is None else valid & ok
    params = dict(params, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS, fill_value=None)
    out = prim.bind(x, idx, **params)
    batch_dims = [d for d in range(out.ndim) if d not in dn.offset_dims]
    mask = jnp.expand_dims(valid, tuple(dn.offset_dims)) if dn.offset_dims else valid
    assert mask.ndim == out.ndim and len(batch_dims) == valid.ndim
    return jnp.where(mask, out, jnp.zeros((), out.dtype))


def _scatter(prim, params, args, ins, mesh):
    x, idx, upd = args
    xl = ins[0]
    dn = params["dimension_numbers"]
    tiled = [(p, d) for p, d in enumerate(dn.scatter_dims_to_operand_dims) if xl.dims[d]]
    if not tiled:
        return prim.bind(x, idx, upd, **params)
    clip = params.get("mode") == lax.GatherScatterMode.CLIP
    for p, d in tiled:
        column = idx[..., p]
        if clip:
            column = jnp.clip(column, 0, xl.shape[d] - 1)
        idx = idx.at[..., p].set(column - offset(xl, d, mesh).astype(idx.dtype))
    params = dict(params, mode=lax.GatherScatterMode.FILL_OR_DROP)
    return prim.bind(x, idx, upd, **params)
