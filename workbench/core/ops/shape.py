"""Ops that move data between dimensions: broadcast, tile, reshape, transpose, squeeze,
reverse, concatenate, pad, slice, split, iota.

A reshape maps each dimension to several factors (a merge ``[B, S] -> [B*S]`` gives the
result dimension the factors ``(B, S)``), so a split batch still propagates. They move
data (no FLOPs; a slice reads only what it writes); on local shards, those whose params
hold a global shape get the local one, and an iota tiled along its counting dimension adds
its block's offset.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp

from workbench.core.ops.costs import OpCost, moves, tensor_bytes
from workbench.core.ops.elementwise import is_zero_literal
from workbench.core.ops.local import (
    bind,
    local_params,
    offset,
    order_free,
    positions,
    result_shape,
    zigzag,
)
from workbench.core.ops.mapping import MappingBuilder
from workbench.core.ops.record import BITCAST, LOOP, MOVES, RENAME, Barrier, Traits
from workbench.core.ops.registry import register

_RELAYOUT = Traits(transparent=True)


def _slice_cost(params, operands, results):
    """A slice reads only what it writes."""
    return OpCost(0.0, 0.0, 2 * sum(tensor_bytes(r) for r in results))


@order_free
def _slice_local(op, args, ins, outs, mesh):
    """Limits at the end of a dimension become the local end."""
    g, loc = ins[0].shape, ins[0].local_shape(mesh)
    limits = tuple(m if lim == n else lim for lim, n, m in zip(op.params["limit_indices"], g, loc))
    return bind(op, args, local_params(op, limit_indices=limits))


@order_free
def _iota_local(op, args, ins, outs, mesh):
    """The local block of the count: the local shape, plus the block's offset where tiled
    (its positions, where a balanced sequence's block is two chunks)."""
    layout = outs[0]
    params = local_params(op, shape=layout.local_shape(mesh))
    out = op.jax_primitive.bind(**params)
    d = params["dimension"]
    if zigzag() is not None and zigzag().applies(layout, d):
        at = [1] * out.ndim
        at[d] = -1
        return [
            jnp.broadcast_to(positions(layout, d, mesh).reshape(at), out.shape).astype(out.dtype)
        ]
    if layout.dims[d]:
        out = out + offset(layout, d, mesh).astype(out.dtype)
    return [out]


@register(
    "broadcast_in_dim",
    cost=moves,
    fusion=LOOP,
    local=result_shape("shape"),
    traits=Traits(broadcasts=True),
)
def _broadcast_in_dim_rule(params, operands, results):
    x = operands[0]
    (out,) = results
    b = MappingBuilder()
    out_dims = [None] * out.rank
    in_dims = []
    for d, od in enumerate(params["broadcast_dimensions"]):
        if x.shape[d] == out.shape[od]:
            f = b.factor(x.shape[d])
            out_dims[od] = (f,)
            in_dims.append((f,))
        else:  # a size-1 dimension stretched
            in_dims.append(())
    for od in range(out.rank):
        if out_dims[od] is None:
            out_dims[od] = (b.factor(out.shape[od]),) if out.shape[od] != 1 else ()
    b.operand(in_dims)
    for extra in operands[1:]:  # dynamic shape operands
        b.operand([() for _ in extra.shape])
    b.result(out_dims)
    return b.build(linear=((0,),), structural=True)


def _tile_local(op, args, ins, outs, mesh):
    """Each local block of a tiled dimension repeats the local operand block a whole number
    of times: the ratio of the local result and operand sizes."""
    reps = tuple(o // i for o, i in zip(outs[0].local_shape(mesh), ins[0].local_shape(mesh)))
    return bind(op, args, local_params(op, reps=reps))


@register(
    "tile",
    cost=moves,
    fusion=replace(LOOP, why="not in the simulator's tables before; XLA:CPU compiles it to a "
                   "broadcast and a bitcast fused into the loop kernels that read it"),
    local=_tile_local,
    traits=Traits(broadcasts=True),
)  # fmt: skip
def _tile_rule(params, operands, results):
    """A dimension repeated ``r`` times is the factors (r, n), major to minor: the copy, then
    the operand's own index (a size-1 operand dimension gives the copies alone, as the cls
    token of a ViT tiled over the batch)."""
    (x,) = operands
    b = MappingBuilder()
    ins, outs = [], []
    for n, r in zip(x.shape, params["reps"]):
        own = (b.factor(n),) if n != 1 else ()
        copies = (b.factor(r),) if r != 1 else ()
        ins.append(own)
        outs.append(copies + own)
    b.operand(ins)
    b.result(outs)
    return b.build(linear=((0,),), structural=True)


def reshape_factors(in_shape, out_shape) -> tuple[list[int], list[tuple], list[tuple], set[int]]:
    """The common refinement of two shapes of one array: factor sizes, per-dim factors, blocked.

    Dimensions are grouped where their products agree; within a group the factors are
    the ratios of the merged prefix-product boundaries. A group whose boundaries do not
    divide one another (``[6, 4] -> [4, 6]``) gets blocked factors.
    """
    sizes: list[int] = []
    blocked: set[int] = set()
    in_dims: list = [()] * len(in_shape)
    out_dims: list = [()] * len(out_shape)
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        gi, gj = [], []
        pi = pj = 1
        while True:
            while i < len(in_shape) and in_shape[i] == 1:
                i += 1
            while j < len(out_shape) and out_shape[j] == 1:
                j += 1
            if i >= len(in_shape) and j >= len(out_shape):
                break
            if pi <= pj and i < len(in_shape):
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            elif j < len(out_shape):
                gj.append(j)
                pj *= out_shape[j]
                j += 1
            else:
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            if pi == pj:
                break
        if not gi and not gj:
            break
        _refine(in_shape, out_shape, gi, gj, sizes, blocked, in_dims, out_dims)
    return sizes, in_dims, out_dims, blocked


def _refine(in_shape, out_shape, gi, gj, sizes, blocked, in_dims, out_dims):
    def bounds(shape, group):
        acc, out = 1, []
        for d in group:
            acc *= shape[d]
            out.append(acc)
        return out

    bi, bj = bounds(in_shape, gi), bounds(out_shape, gj)
    merged = sorted(set(bi) | set(bj))
    ok = all(b % a == 0 for a, b in zip([1, *merged], merged))
    if not ok:
        for shape, group, dims in ((in_shape, gi, in_dims), (out_shape, gj, out_dims)):
            for d in group:
                sizes.append(shape[d])
                blocked.add(len(sizes) - 1)
                dims[d] = (len(sizes) - 1,)
        return
    first = len(sizes)
    prev = 1
    for boundary in merged:
        sizes.append(boundary // prev)
        prev = boundary
    index = {boundary: first + k for k, boundary in enumerate(merged)}
    for group, dims, bnds in ((gi, in_dims, bi), (gj, out_dims, bj)):
        lo = 1
        for d, hi in zip(group, bnds):
            dims[d] = tuple(index[m] for m in merged if lo < m <= hi)
            lo = hi


@register("reshape", cost=moves, fusion=RENAME, local=result_shape("new_sizes"), traits=_RELAYOUT)
def _reshape_rule(params, operands, results):
    if params.get("dimensions") not in (None, ()):
        raise ValueError("reshape with a dimension permutation")
    x = operands[0]
    (out,) = results
    sizes, in_dims, out_dims, blocked = reshape_factors(tuple(x.shape), tuple(out.shape))
    b = MappingBuilder()
    for n in sizes:
        b.factor(n)
    b.blocked |= blocked
    b.operand(in_dims)
    for extra in operands[1:]:
        b.operand([() for _ in extra.shape])
    b.result(out_dims)
    return b.build(linear=((0,),), structural=True)


@register("transpose", cost=moves, fusion=MOVES, traits=Traits(transparent=True, permutes=True))
def _transpose_rule(params, operands, results):
    (x,) = operands
    b = MappingBuilder()
    dims = b.dims_for(x.shape)
    b.operand(dims)
    b.result([dims[p] for p in params["permutation"]])
    return b.build(linear=((0,),), structural=True)


@register("squeeze", cost=moves, fusion=RENAME, traits=_RELAYOUT)
def _squeeze_rule(params, operands, results):
    (x,) = operands
    gone = {d % x.rank for d in params["dimensions"]}
    b = MappingBuilder()
    dims = [() if d in gone else (b.factor(n),) for d, n in enumerate(x.shape)]
    b.operand(dims)
    b.result([dims[d] for d in range(x.rank) if d not in gone])
    return b.build(linear=((0,),), structural=True)


@register("rev", cost=moves, fusion=MOVES)
def _rev_rule(params, operands, results):
    (x,) = operands
    b = MappingBuilder()
    dims = [(b.factor(n, blocked=d in params["dimensions"]),) for d, n in enumerate(x.shape)]
    b.operand(dims)
    b.result(dims)
    return b.build(linear=((0,),), structural=True)


@register("concatenate", cost=moves, fusion=MOVES)
def _concatenate_rule(params, operands, results):
    axis = params["dimension"]
    (out,) = results
    b = MappingBuilder()
    shared = [None if d == axis else (b.factor(n),) for d, n in enumerate(out.shape)]
    for t in [*operands, out]:
        dims = [
            s if s is not None else (b.factor(t.shape[d], blocked=True),)
            for d, s in enumerate(shared)
        ]
        (b.result if t is out else b.operand)(dims)
    return b.build(linear=(tuple(range(len(operands))),), structural=True)


@register("pad", cost=moves, fusion=MOVES)
def _pad_rule(params, operands, results):
    x, pad_value = operands
    (out,) = results
    b = MappingBuilder()
    ins, outs = [], []
    for d, (lo, hi, interior) in enumerate(params["padding_config"]):
        if lo == hi == interior == 0:
            f = b.factor(x.shape[d])
            ins.append((f,))
            outs.append((f,))
        else:
            ins.append((b.factor(x.shape[d], blocked=True),))
            outs.append((b.factor(out.shape[d], blocked=True),))
    b.operand(ins)
    b.operand(())
    b.result(outs)
    zero = is_zero_literal(pad_value)
    return b.build(linear=((0,),) if zero else (), structural=zero)


@register("slice", cost=_slice_cost, fusion=MOVES, local=_slice_local)
def _slice_rule(params, operands, results):
    (x,) = operands
    (out,) = results
    strides = params.get("strides") or (1,) * x.rank
    b = MappingBuilder()
    ins, outs = [], []
    for d, n in enumerate(x.shape):
        full = (
            params["start_indices"][d] == 0 and params["limit_indices"][d] == n and strides[d] == 1
        )
        if full:
            f = b.factor(n)
            ins.append((f,))
            outs.append((f,))
        else:
            ins.append((b.factor(n, blocked=True),))
            outs.append((b.factor(out.shape[d], blocked=True),))
    b.operand(ins)
    b.result(outs)
    return b.build(linear=((0,),), structural=True)


@register("split", cost=_slice_cost, fusion=MOVES)
def _split_rule(params, operands, results):
    (x,) = operands
    axis = params["axis"]
    b = MappingBuilder()
    shared = [None if d == axis else (b.factor(n),) for d, n in enumerate(x.shape)]
    for t in [x, *results]:
        dims = [
            s if s is not None else (b.factor(t.shape[d], blocked=True),)
            for d, s in enumerate(shared)
        ]
        (b.operand if t is x else b.result)(dims)
    return b.build(linear=((0,),), structural=True)


@register("iota", cost=moves, fusion=LOOP, local=_iota_local, traits=Traits(broadcasts=True))
def _iota_rule(params, operands, results):
    (out,) = results
    b = MappingBuilder()
    b.result(b.dims_for(out.shape))
    for extra in operands:
        b.operand([() for _ in extra.shape])
    return b.build()


register(
    "expand_dims",
    cost=moves,
    fusion=BITCAST,
    traits=_RELAYOUT,
)(Barrier("not a primitive of current JAX (jnp.expand_dims binds broadcast_in_dim or reshape)"))
