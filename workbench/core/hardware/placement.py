"""Where a mesh's axes lie on a hardware's levels (the "placement" of P2, Xie et al., MLSys
2022, arXiv 2110.10548).

A `Placement` splits each mesh axis's size into one factor per level, innermost first: the
factors a level gets multiply to the devices of one of its groups (``level_sizes``), and
an axis's factors multiply to its size. A collective over an axis then runs
hierarchically over the levels where its factor exceeds 1 (``spread``), so the same
parallelism costs what the links its groups cross cost. The default (`row_major`) is the
order devices take in a mesh built from ``jax.devices()`` as listed: the last mesh axis on
neighbouring devices. `placements` enumerates every placement of a mesh (each level's
factors in turn, the outermost forced), capped at ``limit``.

Device ids: a device's position inside its level-j group is its axes' level-j indices in
mesh order (the last axis fastest), and its id is those positions with the innermost
level fastest; an axis's index has its innermost level's index fastest (`device_ids`).
Within a level the order of axes is not chosen: a switched level prices every subgroup
alike; on a torus level whose dimensions are known (``torus.py``) the axes lie on them in
mesh order, and other orders are not enumerated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from workbench.core import caches
from workbench.core.errors import given
from workbench.core.hardware.levels import HardwareError, Link
from workbench.core.layout.mesh import Mesh

#: Placements `placements` returns at most, unless told otherwise.
LIMIT = 256


@dataclass(frozen=True, slots=True)
class Placement:
    """Each mesh axis's factor on each level, innermost first (see the module docstring):
    ``Placement(("nvlink", "infiniband"), (("data", (2, 32)), ("model", (4, 1))))``."""

    levels: tuple[str, ...]  # the levels' link names, innermost first
    factors: tuple[tuple[str, tuple[int, ...]], ...]  # (mesh axis, a factor per level)

    def __post_init__(self):
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "factors", tuple((a, tuple(f)) for a, f in self.factors))
        for axis, fs in self.factors:
            ok = len(fs) == len(self.levels) and all(
                isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in fs
            )
            if not ok:
                raise HardwareError(
                    f"placement of axis {axis!r} is {given(fs)}; give one positive int per "
                    f"level ({', '.join(self.levels)}), innermost first."
                )

    def of(self, axis: str) -> tuple[int, ...]:
        """``axis``'s factor on each level, innermost first."""
        for a, fs in self.factors:
            if a == axis:
                return fs
        raise HardwareError(
            f"placement {self} does not place mesh axis {axis!r}; it places "
            f"{[a for a, _ in self.factors]}."
        )

    def __str__(self) -> str:
        parts = []
        for axis, fs in self.factors:
            on = [f"{level} {f}" for level, f in zip(self.levels, fs) if f > 1]
            parts.append(f"{axis}: {' x '.join(on) or 'one device'}")
        return "; ".join(parts)

    def check_axes(self, mesh: Mesh) -> None:
        """Raise unless this placement places ``mesh``'s axes, in mesh order, at their sizes."""
        axes = [a for a, _ in self.factors]
        if axes != list(mesh.names):
            raise HardwareError(
                f"placement {self} places axes {axes}, but the mesh is {mesh}; place its axes "
                f"{list(mesh.names)}, in that order (Session.placements(hardware) lists the "
                "placements of a mesh)."
            )
        for axis, fs in self.factors:
            if math.prod(fs) != mesh.axis_size(axis):
                raise HardwareError(
                    f"placement {self} splits axis {axis!r} into {fs}, whose product is "
                    f"{math.prod(fs)}, but the mesh gives it size {mesh.axis_size(axis)}; "
                    "give factors that multiply to the axis's size."
                )

    def check(self, mesh: Mesh, sizes: tuple[int, ...]) -> None:
        """Raise unless this placement places ``mesh`` on levels of ``sizes``."""
        self.check_axes(mesh)
        for j, (level, size) in enumerate(zip(self.levels, sizes)):
            have = math.prod(fs[j] for _, fs in self.factors)
            if have != size:
                raise HardwareError(
                    f"placement {self} puts {have} devices in each {level!r} group, which holds "
                    f"{size} of the mesh's {mesh.size} devices."
                )

    def device_of(self, index) -> int:
        """The device id at ``index`` (one position per mesh axis; the module docstring)."""
        sizes = [math.prod(fs[j] for _, fs in self.factors) for j in range(len(self.levels))]
        subs = []  # per axis, its index per level (innermost fastest)
        for i, (_, fs) in zip(index, self.factors):
            digits = []
            for f in fs:
                digits.append(i % f)
                i //= f
            subs.append(digits)
        device, stride = 0, 1
        for j, size in enumerate(sizes):
            position = 0
            for digits, (_, fs) in zip(subs, self.factors):
                position = position * fs[j] + digits[j]
            device += position * stride
            stride *= size
        return device

    def device_ids(self, mesh: Mesh) -> np.ndarray:
        """The device ids in mesh shape (see the module docstring)."""
        ids = np.zeros(mesh.sizes, dtype=np.int64)
        for index in np.ndindex(*mesh.sizes):
            ids[index] = self.device_of(index)
        return ids


def level_sizes(mesh: Mesh, links: tuple[Link, ...]) -> tuple[int, ...] | None:
    """Devices of the mesh in one group of each level, innermost first: each level's group
    size until the mesh is covered, the outermost holding the rest; None where a level's
    groups do not divide the mesh (12 devices on nodes of 8)."""
    sizes, left = [], mesh.size
    for j, link in enumerate(links):
        n = link.group_size
        if j == len(links) - 1 or n is None or left <= n:
            if n is not None and j < len(links) - 1 and n % left:
                return None
            sizes.append(left)
            left = 1
        elif left % n:
            return None
        else:
            sizes.append(n)
            left //= n
    return tuple(sizes)


def row_major(mesh: Mesh, links: tuple[Link, ...]) -> Placement | None:
    """The placement of devices in mesh order, the last axis innermost; None where the
    levels do not divide it cleanly (`spread` then uses the level holding each axis)."""
    sizes = level_sizes(mesh, links)
    if sizes is None:
        return None
    room = list(sizes)
    factors = {}
    j = 0
    for axis, n in reversed(mesh.axes):
        fs = [1] * len(links)
        while n > 1:
            while room[j] == 1:
                j += 1
            f = math.gcd(n, room[j])
            if f == 1 or (f < n and f < room[j]):
                return None  # the axis straddles a level's boundary unevenly
            fs[j] = f
            n //= f
            room[j] //= f
        factors[axis] = tuple(fs)
    return Placement(tuple(x.name for x in links), tuple((a, factors[a]) for a in mesh.names))


@caches.cache("hardware.placed", maxsize=1024)
def placed(placement: Placement | None, mesh: Mesh, links: tuple[Link, ...]) -> Placement | None:
    """The placement collectives over ``mesh`` on ``links`` follow: ``placement`` once
    checked against them, or the mesh order's (`row_major`, None where the levels do not
    divide it) where none is given. Cached: every collective priced asks."""
    if placement is None:
        return row_major(mesh, links)
    placement.check(mesh, level_sizes(mesh, links))
    return placement


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(left: tuple[int, ...], size: int):
    """Each way to pick one divisor of each of ``left`` whose product is ``size``."""
    if not left:
        if size == 1:
            yield ()
        return
    for d in _divisors(left[0]):
        if size % d == 0:
            for rest in _splits(left[1:], size // d):
                yield (d, *rest)


def _filled(mesh: Mesh, links: tuple[Link, ...]) -> tuple[int, ...]:
    sizes = level_sizes(mesh, links)
    if sizes is None:
        raise HardwareError(
            f"the mesh {mesh} ({mesh.size} devices) does not fill whole groups of the levels "
            f"{[(x.name, x.group_size) for x in links]}; use a device count that is a "
            "multiple of a group's size (or divides it)."
        )
    return sizes


def count(mesh: Mesh, links: tuple[Link, ...]) -> int:
    """How many placements ``mesh`` has on ``links`` (`placements` without a limit),
    counted without listing them."""
    sizes = _filled(mesh, links)

    @functools.cache
    def ways(j: int, left: tuple[int, ...]) -> int:
        if j == len(sizes) - 1:
            return int(math.prod(left) == sizes[j])
        return sum(
            ways(j + 1, tuple(n // d for n, d in zip(left, split)))
            for split in _splits(left, sizes[j])
        )

    return ways(0, tuple(n for _, n in mesh.axes))


def placements(mesh: Mesh, links: tuple[Link, ...], limit: int = LIMIT) -> list[Placement]:
    """Every placement of ``mesh`` on ``links`` (the row-major one first), at most
    ``limit``; raises where the levels do not divide the mesh."""
    sizes = _filled(mesh, links)
    names = tuple(x.name for x in links)
    out = []

    def walk(j: int, left: tuple[int, ...], chosen: list):
        if len(out) >= limit:
            return
        if j == len(sizes) - 1:
            if math.prod(left) == sizes[j]:
                rows = [*chosen, left]
                out.append(
                    Placement(
                        names,
                        tuple((a, tuple(r[i] for r in rows)) for i, a in enumerate(mesh.names)),
                    )
                )
            return
        for split in _splits(left, sizes[j]):
            walk(j + 1, tuple(n // d for n, d in zip(left, split)), [*chosen, split])

    walk(0, tuple(n for _, n in mesh.axes), [])
    first = row_major(mesh, links)
    if first is not None and first in out:
        out.remove(first)
        out.insert(0, first)
    return out


def spread(placement: Placement, axes) -> dict[int, int]:
    """Level index -> the size of the group that a collective over ``axes`` forms there."""
    out: dict[int, int] = {}
    for axis in axes:
        for j, f in enumerate(placement.of(axis)):
            if f > 1:
                out[j] = out.get(j, 1) * f
    return out
