"""A mesh: named axes with sizes. A plan, not devices."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from numbers import Integral

from workbench.core.errors import MeshError, given

_FORMS = (
    'a dict of axis sizes such as {"batch": 2, "model": 4}, a list of (name, size) pairs, '
    "or a jax.sharding.Mesh"
)


def _items(axes) -> list:
    """The (name, size) pairs a mesh description holds, or MeshError saying what would work."""
    if isinstance(axes, Mapping):
        return list(axes.items())
    if isinstance(axes, list | tuple):
        return list(axes)
    shape = getattr(axes, "shape", None)  # a jax Mesh or AbstractMesh: axis name -> size
    if hasattr(axes, "axis_names") and isinstance(shape, Mapping):
        return list(shape.items())
    if isinstance(axes, str):
        hint = f'Mesh({{"{axes}": 2}})' if axes.isidentifier() else 'Mesh({"batch": 2})'
        why = f"a string is not a mesh; to name one axis with its size write {hint}"
    elif isinstance(axes, Integral) and not isinstance(axes, bool):
        why = f'a number is not a mesh; for {axes} devices on one axis write Mesh({{"batch": {axes}}})'
    else:
        why = "that is not a mesh description"
    raise MeshError(f"cannot make a mesh of {given(axes)}: {why}. A mesh is {_FORMS}.")


def _whole(size) -> bool:
    """A float or a string that holds a positive whole number (for the hint in a message)."""
    try:
        return not isinstance(size, bool) and float(size) == int(float(size)) >= 1
    except (TypeError, ValueError, OverflowError):
        return False


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named mesh axes in major-to-minor order, e.g. ``Mesh({"batch": 2, "model": 4})``.

    A mesh says how devices are arranged for partitioning; it holds no devices,
    so a 64x32 mesh can be planned on a laptop.
    """

    axes: tuple[tuple[str, int], ...]
    _hash: int = field(default=0, compare=False, repr=False)

    def __init__(self, axes: Mapping[str, int] | tuple[tuple[str, int], ...] | list):
        items = _items(axes)
        if not items:
            raise MeshError(
                f"a mesh needs at least one axis; got {given(axes)}. "
                'Describe it as a dict of axis sizes, e.g. Mesh({"batch": 2, "model": 4}).'
            )
        seen = set()
        for item in items:
            if not (isinstance(item, tuple | list) and len(item) == 2):
                raise MeshError(
                    f"mesh axes must be (name, size) pairs; got {given(item)} in {given(axes)}. "
                    'Use e.g. Mesh({"batch": 2, "model": 4}).'
                )
            name, size = item
            if not isinstance(name, str) or not name.isidentifier():
                raise MeshError(
                    f"mesh axis name {given(name)} is not a valid identifier; "
                    "use names like 'batch' or 'model'."
                )
            if name in seen:
                raise MeshError(
                    f"mesh axis {name!r} appears twice in {given(axes)}; each axis name must be "
                    f"unique: give the second one its own name (e.g. {name + '2'!r}), or merge "
                    "them into one axis whose size is their product."
                )
            if isinstance(size, bool) or not isinstance(size, Integral) or size < 1:
                hint = f" (write {int(size)})" if _whole(size) else ""
                raise MeshError(
                    f"mesh axis {name!r} has size {given(size)}; a size must be a positive "
                    f"integer{hint}, e.g. Mesh({{{name!r}: 2}})."
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
        raise MeshError(
            f"mesh axis {given(name)} is not in this mesh; its axes are {list(self.names)}."
        )

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self.axes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __str__(self) -> str:
        return "Mesh(" + ", ".join(f"{n}={s}" for n, s in self.axes) + ")"

    def __repr__(self) -> str:
        return "Mesh({" + ", ".join(f"{n!r}: {s}" for n, s in self.axes) + "})"


def as_mesh(mesh) -> Mesh:
    """``mesh`` as a ``Mesh``: a ``Mesh`` itself, else one made of a dict of axis sizes, a list
    of (name, size) pairs or a ``jax.sharding.Mesh`` (MeshError for anything else)."""
    return mesh if isinstance(mesh, Mesh) else Mesh(mesh)


def same_axes(jax_mesh, mesh: Mesh, what: str) -> None:
    """``jax_mesh`` is a ``jax.sharding.Mesh`` with ``mesh``'s axes at their sizes (for
    NamedShardings of a plan over ``mesh``); else MeshError naming ``what`` took it."""
    build = f"jax.make_mesh({mesh.sizes}, {mesh.names})"
    shape = getattr(jax_mesh, "shape", None)
    if not (hasattr(jax_mesh, "axis_names") and hasattr(jax_mesh, "devices")):
        raise MeshError(
            f"{what} takes a jax.sharding.Mesh; got {given(jax_mesh)}. Build one, e.g. {build}."
        )
    theirs = dict(shape)
    wrong = [n for n, size in mesh.axes if theirs.get(n) != size]
    if wrong:
        raise MeshError(
            f"{what}: the jax mesh {theirs} lacks the axes {wrong} at the sizes of {mesh}; "
            f"use a jax mesh with them, e.g. {build}."
        )
