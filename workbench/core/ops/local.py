"""Running a primitive on local shards under ``shard_map``: the default and its helpers.

Most primitives run unchanged on local shards (``runs_unchanged``). A record whose params
carry global shapes, or whose indices are global (iota, gather, scatter), gives its own
``local`` function, built from ``local_params``, ``bind``, ``shard_index`` and ``offset``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType

from jax import lax

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding

#: Params that name a global layout: dropped on local shards.
GLOBAL_LAYOUT_PARAMS = ("sharding", "out_sharding")


#: While a lowering traces over a mesh whose axes a placement splits by level: each split
#: axis -> its JAX axes, outermost level first (``lowering/reductions.py``). A tuple of them
#: indexes as the axis does, so every collective and index names the tuple instead.
_SPLIT: ContextVar[Mapping[str, tuple[str, ...]]] = ContextVar(
    "split_axes", default=MappingProxyType({})
)


@contextlib.contextmanager
def split_axes(parts: Mapping[str, tuple[str, ...]]):
    """Within this block `jax_axes` names each axis of ``parts`` by its JAX axes."""
    token = _SPLIT.set(MappingProxyType(dict(parts)))
    try:
        yield
    finally:
        _SPLIT.reset(token)


def jax_axes(axes) -> tuple[str, ...]:
    """The JAX axis names of mesh ``axes`` in order (an axis split by level: its parts)."""
    split = _SPLIT.get()
    return tuple(name for a in axes for name in split.get(a, (a,)))


def axis_name(axes) -> str | tuple[str, ...]:
    """What a JAX collective or ``axis_index`` names mesh ``axes`` by: one name alone,
    else the tuple of them (`jax_axes`)."""
    names = jax_axes(axes)
    return names[0] if len(names) == 1 else names


def shard_index(axes, mesh: Mesh):
    """This device's block index along a dimension tiled over ``axes`` (major to minor)."""
    index = 0
    for axis in axes:
        index = index * mesh.axis_size(axis) + lax.axis_index(axis_name((axis,)))
    return index


def offset(layout: Sharding, dim: int, mesh: Mesh):
    """Where this device's block of ``dim`` starts in the global array."""
    local = layout.shape[dim] // layout.shards(dim, mesh)
    return shard_index(layout.dims[dim], mesh) * local


def local_params(op, **changes) -> dict:
    """``op``'s params on local shards: global layouts dropped, ``changes`` applied."""
    params = {k: (None if k in GLOBAL_LAYOUT_PARAMS else v) for k, v in op.params.items()}
    params.update(changes)
    return params


def bind(op, args, params) -> list:
    """``op``'s primitive bound to ``args`` with ``params``; always a list of results."""
    prim = op.jax_primitive
    out = prim.bind(*args, **params)
    return list(out) if prim.multiple_results else [out]


def result_shape(key: str):
    """A lowering that sets param ``key`` to the result's local shape (a broadcast's shape,
    a reshape's new sizes, a dynamic slice's sizes)."""

    def local(op, args, ins, outs, mesh):
        return bind(op, args, local_params(op, **{key: outs[0].local_shape(mesh)}))

    local.__name__ = local.__qualname__ = f"local_{key}"
    return local


def runs_unchanged(op, args, ins, outs, mesh) -> list:
    """The default lowering: the primitive as it is, on the local shards."""
    return bind(op, args, local_params(op))


def as_it_is(op, args, ins, outs, mesh) -> list:
    """The identity: the operands are already what the op stands for per device."""
    return list(args)
