"""Running a primitive on local shards under ``shard_map``: the default and its helpers.

Most primitives run unchanged on local shards (``runs_unchanged``). A record whose params
carry global shapes, or whose indices are global (iota, gather, scatter), gives its own
``local`` function, built from ``local_params``, ``bind``, ``shard_index`` and ``offset``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType

import jax.numpy as jnp
import numpy as np
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


@dataclass(frozen=True, slots=True)
class Zigzag:
    """A sequence balanced over ``axis`` for causal attention: a dim of one of ``lengths``
    split over ``axis`` alone is cut into ``2 * size`` chunks, and device ``i`` holds
    chunks ``i`` and ``2 * size - 1 - i`` (Llama 3's and Megatron's load balancing), so
    each holds early and late positions alike."""

    axis: str
    size: int  # devices on the axis
    lengths: frozenset[int]  # the sequence lengths it balances

    def applies(self, layout: Sharding, dim: int) -> bool:
        """Whether ``layout`` holds ``dim`` in this order (split over the axis alone)."""
        return layout.dims[dim] == (self.axis,) and layout.shape[dim] in self.lengths

    def order(self, n: int) -> np.ndarray:
        """The global positions of a length-``n`` dim in the order the devices hold them."""
        h = n // (2 * self.size)
        chunks = [c for i in range(self.size) for c in (i, 2 * self.size - 1 - i)]
        return np.concatenate([np.arange(c * h, (c + 1) * h) for c in chunks])

    def chunks(self, index):
        """The two chunks device ``index`` holds (traced or not)."""
        return index, 2 * self.size - 1 - index


_ZIGZAG: ContextVar[Zigzag | None] = ContextVar("zigzag", default=None)


@contextlib.contextmanager
def balanced(zigzag: Zigzag | None):
    """Within this block local lowerings index a sequence ``zigzag`` balances its way."""
    token = _ZIGZAG.set(zigzag)
    try:
        yield
    finally:
        _ZIGZAG.reset(token)


def zigzag() -> Zigzag | None:
    """The balanced order local lowerings follow now (`balanced`), if any."""
    return _ZIGZAG.get()


def positions(layout: Sharding, dim: int, mesh: Mesh):
    """The global positions of this device's block of ``dim``, in local order."""
    z, local = _ZIGZAG.get(), layout.shape[dim] // layout.shards(dim, mesh)
    if z is None or not z.applies(layout, dim):
        return offset(layout, dim, mesh) + jnp.arange(local)
    h = layout.shape[dim] // (2 * z.size)
    first, second = z.chunks(shard_index((z.axis,), mesh))
    return jnp.concatenate([first * h + jnp.arange(h), second * h + jnp.arange(h)])


def order_free(fn):
    """Marks a local lowering that reads no global position: it runs the same on a balanced
    sequence (`Zigzag`), whose blocks are not contiguous."""
    fn.order_free = True
    return fn


def order_free_but(indexed):
    """Marks a local lowering that reads global positions only along the dims of its first
    operand that ``indexed(params)`` names (a lookup's table): it runs the same on a
    balanced sequence (`Zigzag`) anywhere else."""

    def mark(fn):
        fn.order_free = lambda op, ins, z: (
            not any(z.applies(ins[0], d) for d in indexed(op.params["dimension_numbers"]))
        )
        return fn

    return mark


def shard_index(axes, mesh: Mesh):
    """This device's block index along a dimension tiled over ``axes`` (major to minor)."""
    index = 0
    for axis in axes:
        index = index * mesh.axis_size(axis) + lax.axis_index(axis_name((axis,)))
    return index


def offset(layout: Sharding, dim: int, mesh: Mesh):
    """Where this device's block of ``dim`` starts in the global array."""
    z = _ZIGZAG.get()
    if z is not None and z.applies(layout, dim):  # pragma: no cover - plans refuse it
        raise AssertionError("a balanced sequence has no single offset; see positions()")
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
    return order_free(local)


@order_free
def runs_unchanged(op, args, ins, outs, mesh) -> list:
    """The default lowering: the primitive as it is, on the local shards."""
    return bind(op, args, local_params(op))


@order_free
def as_it_is(op, args, ins, outs, mesh) -> list:
    """The identity: the operands are already what the op stands for per device."""
    return list(args)
