"""A mesh: named axes with sizes. A plan, not devices."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from workbench.core.errors import MeshError


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named mesh axes in major-to-minor order, e.g. ``Mesh({"batch": 2, "model": 4})``.

    A mesh says how devices are arranged for partitioning; it holds no devices,
    so a 64x32 mesh can be planned on a laptop.
    """

    axes: tuple[tuple[str, int], ...]
    _hash: int = field(default=0, compare=False, repr=False)

    def __init__(self, axes: Mapping[str, int] | tuple[tuple[str, int], ...] | list):
        items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
        if not items:
            raise MeshError(
                "a mesh needs at least one axis; got none. "
                'Describe it as a dict of axis sizes, e.g. Mesh({"batch": 2, "model": 4}).'
            )
        seen = set()
        for item in items:
            if not (isinstance(item, tuple | list) and len(item) == 2):
                raise MeshError(
                    f"mesh axes must be (name, size) pairs; got {item!r}. "
                    'Use e.g. Mesh({"batch": 2, "model": 4}).'
                )
            name, size = item
            if not isinstance(name, str) or not name.isidentifier():
                raise MeshError(
                    f"mesh axis name {name!r} is not a valid identifier; "
                    "use names like 'batch' or 'model'."
                )
            if name in seen:
                raise MeshError(f"mesh axis {name!r} appears twice; each axis name must be unique.")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise MeshError(
                    f"mesh axis {name!r} has size {size!r}; a size must be a positive integer."
                )
            seen.add(name)
        object.__setattr__(self, "axes", tuple((n, int(s)) for n, s in items))
        object.__setattr__(self, "_hash", hash(self.axes))

    def __hash__(self) -> int:  # meshes key the planner's and simulator's caches: hash once
        return self._hash

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size (a fresh dict: callers may keep it)."""
        return dict(self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        """The number of devices the mesh spans."""
        return math.prod(self.sizes)

    def axis_size(self, name: str) -> int:
        for n, s in self.axes:
            if n == name:
                return s
        raise MeshError(f"mesh axis {name!r} is not in this mesh; its axes are {list(self.names)}.")

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self.axes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __str__(self) -> str:
        return "Mesh(" + ", ".join(f"{n}={s}" for n, s in self.axes) + ")"

    def __repr__(self) -> str:
        return "Mesh({" + ", ".join(f"{n!r}: {s}" for n, s in self.axes) + "})"
