"""The sharding of one value: per dimension the mesh axes it is tiled over, plus pending reductions.

Printed like JAX's sharding-in-types: ``f32[256@batch,1024@model]{sum: model}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from workbench.core import caches
from workbench.core.dtypes import as_dtype, is_extended
from workbench.core.layout.mesh import Mesh

#: Reductions a partial value can be pending: a contraction leaves a sum, reduce_max a max.
REDUCTIONS = ("sum", "max", "min")


def short_dtype(dtype) -> str:
    """``float32`` -> ``f32``, ``bfloat16`` -> ``bf16``, ``int32`` -> ``i32``, ``bool`` -> ``bool``."""
    if is_extended(dtype):
        return str(dtype)  # key<fry>
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return "bool"
    name = dt.name
    for long, short in (
        ("bfloat", "bf"),
        ("float", "f"),
        ("uint", "u"),
        ("int", "i"),
        ("complex", "c"),
    ):
        if name.startswith(long):
            return short + name[len(long) :]
    return name


@dataclass(frozen=True, slots=True)
class Sharding:
    """How one value is laid out over a mesh. Immutable; every change returns a new one.

    - ``dims[d]``: the mesh axes dimension ``d`` is tiled over, major to minor.
    - ``partial``: ``(axis, reduction)`` pairs, sorted: the value is a pending
      ``reduction`` ("sum", "max", "min") over ``axis``; each device holds a term.
    - ``replicated``: axes a ``Replicate`` tactic pinned: the value stays whole on them.
    - ``atomic``: axes an ``Atomic`` tactic froze: propagation never crosses the value on them.

    A mesh axis appears at most once per value, across dims and partial.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    dims: tuple[tuple[str, ...], ...]
    partial: tuple[tuple[str, str], ...] = ()
    replicated: frozenset[str] = frozenset()
    atomic: frozenset[str] = frozenset()
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    # (mesh, local shape, local size) of the last mesh asked about: the simulator asks often
    _local: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:  # shardings key the planner's caches: hash once
        h = self._hash
        if not h:
            h = (
                hash(
                    (self.shape, self.dtype, self.dims, self.partial, self.replicated, self.atomic)
                )
                or 1
            )
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other) -> bool:  # hot in the planner's cache lookups: cheapest test first
        if self is other:
            return True
        if other.__class__ is not Sharding:
            return NotImplemented
        return (
            self.dims == other.dims
            and self.partial == other.partial
            and self.shape == other.shape
            and self.replicated == other.replicated
            and self.atomic == other.atomic
            and (self.dtype is other.dtype or self.dtype == other.dtype)
        )

    @classmethod
    def unsharded(cls, shape, dtype) -> Sharding:
        return cls(tuple(shape), as_dtype(dtype), tuple(() for _ in shape))

    # -- queries -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def tiled_axes(self) -> tuple[str, ...]:
        return tuple(a for axes in self.dims for a in axes)

    @property
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.partial)

    @property
    def axes(self) -> frozenset[str]:
        """Every axis this value is tiled or partial over."""
        return frozenset(self.tiled_axes) | frozenset(self.partial_axes)

    @property
    def is_replicated(self) -> bool:
        """True when no axis tiles this value and none is pending a reduction."""
        return not self.tiled_axes and not self.partial

    def dim_of(self, axis: str) -> int | None:
        """The dimension tiled over ``axis``, or None."""
        for d, axes in enumerate(self.dims):
            if axis in axes:
                return d
        return None

    def reduction_of(self, axis: str) -> str | None:
        """The pending reduction over ``axis`` ("sum", "max", "min"), or None."""
        for a, kind in self.partial:
            if a == axis:
                return kind
        return None

    def uses(self, axis: str) -> bool:
        return self.dim_of(axis) is not None or self.reduction_of(axis) is not None

    def shards(self, dim: int, mesh: Mesh) -> int:
        """How many pieces dimension ``dim`` is cut into."""
        return math.prod(mesh.axis_size(a) for a in self.dims[dim])

    def local_shape(self, mesh: Mesh) -> tuple[int, ...]:
        """The shape each device holds."""
        return self._on(mesh)[1]

    def _on(self, mesh: Mesh) -> tuple:
        local = self._local
        if local is None or (local[0] is not mesh and local[0] != mesh):
            shape = _local_shape(self.shape, self.dims, mesh)
            local = (mesh, shape, math.prod(shape) * self.dtype.itemsize)
            object.__setattr__(self, "_local", local)
        return local

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def local_nbytes(self, mesh: Mesh) -> int:
        return self._on(mesh)[2]

    # -- updates -------------------------------------------------------------------------------
    def with_tile(self, dim: int, axis: str) -> Sharding:
        """Tile ``dim`` over ``axis`` as its new minor-most axis."""
        dims = list(self.dims)
        dims[dim] = (*dims[dim], axis)
        return replace(self, dims=tuple(dims))

    def with_partial(self, axis: str, reduction: str = "sum") -> Sharding:
        return replace(self, partial=tuple(sorted((*self.partial, (axis, reduction)))))

    def with_replicated(self, axis: str) -> Sharding:
        return replace(self, replicated=self.replicated | {axis})

    def with_atomic(self, axis: str) -> Sharding:
        return replace(self, atomic=self.atomic | {axis})

    # -- text ----------------------------------------------------------------------------------
    def spec(self) -> tuple[str | tuple[str, ...] | None, ...]:
        """The per-dimension axes in ``jax.sharding.PartitionSpec`` form."""
        return tuple(
            None if not axes else axes[0] if len(axes) == 1 else axes for axes in self.dims
        )

    def __str__(self) -> str:
        parts = []
        for n, axes in zip(self.shape, self.dims):
            if not axes:
                parts.append(str(n))
            elif len(axes) == 1:
                parts.append(f"{n}@{axes[0]}")
            else:
                parts.append(f"{n}@({','.join(axes)})")
        text = f"{short_dtype(self.dtype)}[{','.join(parts)}]"
        notes = []
        for kind in REDUCTIONS:
            axes = [a for a, k in self.partial if k == kind]
            if axes:
                notes.append(f"{kind}: {','.join(axes)}")
        if self.replicated:
            notes.append(f"replicated: {','.join(sorted(self.replicated))}")
        if self.atomic:
            notes.append(f"atomic: {','.join(sorted(self.atomic))}")
        if notes:
            text += "{" + "; ".join(notes) + "}"
        return text

    def __repr__(self) -> str:
        return f"Sharding({self})"


_CANONICAL: dict[Sharding, Sharding] = {}


def canonical(s: Sharding) -> Sharding:
    """One object for equal shardings (states and plans keep those they make canonical), so
    the planner's caches compare them by identity."""
    if len(_CANONICAL) > 1 << 18:
        _CANONICAL.clear()
    return _CANONICAL.setdefault(s, s)


caches.register("layout.canonical shardings", _CANONICAL.clear)


@caches.cache("layout.local shapes", maxsize=1 << 16)
def _local_shape(shape, dims, mesh: Mesh) -> tuple[int, ...]:
    sizes = mesh.shape
    return tuple(n // math.prod(sizes[a] for a in axes) for n, axes in zip(shape, dims))
