"""Synthesised reductions lowered (``hardware/synthesis.py``): each step of a `Program` as a
JAX collective over sub-axes of a mesh whose axes are split by level.

A placement (``hardware/placement.py``) splits each mesh axis into one factor per level;
`split_mesh` makes those factors axes of their own (``data@1`` outer, ``data@0`` inner,
the outer first, so the tuple ``("data@1", "data@0")`` indexes as ``data`` does), its
devices in the placement's order. Inside ``shard_map`` over it, `reduce` runs a program:
an all-reduce on the array flattened and padded to the group's size, a reduce-scatter
along its dimension (its blocks permuted first where the program says so). Each step is
``psum``, ``psum_scatter`` or ``all_gather`` over the sub-axes of its levels, in the
result's order.
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from workbench.core.errors import InputError, given
from workbench.core.hardware.collectives import priced
from workbench.core.hardware.placement import Placement
from workbench.core.hardware.synthesis import SYNTHESISED, Program, scatters
from workbench.core.layout.mesh import Mesh
from workbench.core.ops.local import split_axes

#: While a lowering traces with reductions synthesised: (mesh, hardware placed).
_ACTIVE: ContextVar[tuple | None] = ContextVar("synthesising", default=None)


def sub_axes(placement: Placement, axis: str) -> tuple[tuple[str, int, int], ...]:
    """``(name, level, factor)`` of each part of ``axis``, outermost level first (an axis
    of one device: one part, on the innermost level)."""
    factors = placement.of(axis)
    parts = [(f"{axis}@{j}", j, f) for j, f in reversed(list(enumerate(factors))) if f > 1]
    return tuple(parts) or ((f"{axis}@0", 0, 1),)


def split_mesh(mesh: Mesh, placement: Placement, devices=None) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` with each axis of ``mesh`` split into its parts per level
    (`sub_axes`), over ``devices`` (default: all attached) in ``placement``'s order."""
    devices = np.asarray(jax.devices() if devices is None else list(devices), dtype=object)
    if devices.size != mesh.size:
        raise InputError(
            f"split_mesh: {devices.size} devices given for the mesh {mesh} of {mesh.size}; "
            "give exactly as many."
        )
    parts = [p for axis in mesh.names for p in sub_axes(placement, axis)]
    ids = placement.device_ids(mesh).reshape([f for _, _, f in parts])
    return jax.sharding.Mesh(devices[ids], tuple(name for name, _, _ in parts))


def parts(mesh: Mesh, placement: Placement) -> dict[str, tuple[str, ...]]:
    """Each axis of ``mesh`` -> the names of its parts in `split_mesh` (outermost first)."""
    return {a: tuple(name for name, _, _ in sub_axes(placement, a)) for a in mesh.names}


@contextlib.contextmanager
def synthesising(mesh: Mesh, hardware):
    """Within this block (a lowering tracing over `split_mesh` of ``hardware.placement``),
    every collective names the parts of the axes it runs over, and each sum over axes
    whose group spans levels runs as the program ``hardware`` prices it as (`chosen`)."""
    token = _ACTIVE.set((mesh, hardware))
    try:
        with split_axes(parts(mesh, hardware.placement)):
            yield
    finally:
        _ACTIVE.reset(token)


def parts_of(jmesh: jax.sharding.Mesh) -> dict[str, tuple[str, ...]]:
    """Each mesh axis -> its parts in a mesh `split_mesh` made (``data@1``, ``data@0``, in
    its order); empty for a mesh not split (mesh axis names are identifiers: no ``@``)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in jmesh.axis_names:
        if "@" in name:
            axis = name.split("@")[0]
            out[axis] = (*out.get(axis, ()), name)
    return out


def lowered_on(mesh: Mesh, state, hardware):
    """``hardware`` placed as a lowering that synthesises reductions runs it (the state's
    placement, else the hardware's own, else the mesh order's), or None: no hardware, or
    levels that do not divide the mesh. A placement on other levels than ``hardware``'s
    is an `InputError`."""
    if hardware is None:
        return None
    from workbench.core.hardware.names import resolve
    from workbench.core.hardware.placement import placed

    hardware = resolve(hardware)
    chosen = getattr(state, "placement", None) or hardware.placement
    if chosen is not None and chosen.levels != tuple(x.name for x in hardware.links):
        raise InputError(
            f"the placement {chosen} is on levels {chosen.levels}, but {hardware.name!r} has "
            f"{tuple(x.name for x in hardware.links)}; give the hardware it was made for."
        )
    chosen = placed(chosen, mesh, hardware.links)
    return None if chosen is None else hardware.with_placement(chosen)


def placement() -> Placement:
    """The placement of the lowering tracing now (inside `synthesising`)."""
    return _ACTIVE.get()[1].placement


def chosen(step) -> Program | None:
    """The synthesised program a redistribution ``step`` runs as: a sum (all-reduce or
    reduce-scatter) or an all-gather over a group spanning levels, while `synthesising`;
    else None."""
    active = _ACTIVE.get()
    if active is None or step.kind not in SYNTHESISED:
        return None
    if step.kind == "all-reduce" and step.reduction != "sum":
        return None
    mesh, hardware = active
    _, s = priced(step.kind, step.bytes, step.axes, mesh, hardware)
    return None if s is None else s.program


def group_levels(placement: Placement, axes) -> tuple[int, ...]:
    """The levels (indices into ``placement.levels``) a group over ``axes`` spans,
    innermost first: a program's level ``i`` is the ``i``-th of these."""
    return tuple(sorted({j for a in axes for _, j, f in sub_axes(placement, a) if f > 1}))


def order(placement: Placement, axes) -> tuple[tuple[int, ...], ...]:
    """Per axis of the group, the program levels it lies on, outermost first (the
    result's layout, ``synthesis.permuted``'s ``order``)."""
    index = {j: i for i, j in enumerate(group_levels(placement, axes))}
    return tuple(tuple(index[j] for _, j, f in sub_axes(placement, a) if f > 1) for a in axes)


def _names(placement: Placement, axes, levels) -> tuple[str, ...]:
    """The sub-axes of ``axes`` on program ``levels``, in the result's order."""
    chosen = {group_levels(placement, axes)[i] for i in levels}
    return tuple(
        name for a in axes for name, j, f in sub_axes(placement, a) if f > 1 and j in chosen
    )


def _steps(x, program: Program, placement: Placement, axes, dim: int):
    """The program's steps on ``x``: an all-gather over the top entries of the stack of
    scatters gathers their sub-axes in the order they were scattered (the first major)."""
    stack: list = []
    for step in program.steps:
        names = _names(placement, axes, step.levels)
        if program.kind == "all-gather":  # the gathered blocks go major
            x = lax.all_gather(x, names, axis=dim, tiled=True)
        elif step.kind == "all-reduce":
            x = lax.psum(x, names)
        elif step.kind == "reduce-scatter":
            x = lax.psum_scatter(x, names, scatter_dimension=dim, tiled=True)
            stack.append(names)
        else:
            popped, left = [], set(names)
            while left:
                popped.insert(0, stack.pop())
                left -= set(popped[0])
            x = lax.all_gather(x, tuple(n for e in popped for n in e), axis=dim, tiled=True)
    return x


def _permute(x, src: list[str], dst: list[str], sizes: dict[str, int], dim: int):
    """``x`` with the blocks of ``dim``, laid out over the sub-axes ``src`` (major first),
    laid out over ``dst`` instead."""
    shape = list(x.shape)
    split = [*shape[:dim], *(sizes[n] for n in src), -1, *shape[dim + 1 :]]
    lead = list(range(dim))
    moved = [dim + src.index(n) for n in dst]
    rest = list(range(dim + len(src), len(split)))
    return x.reshape(split).transpose([*lead, *moved, *rest]).reshape(shape)


def _layouts(program: Program, placement: Placement, axes):
    """``(result's sub-axes, the program's, their sizes)``: the order the result's blocks
    take (each axis's outer level first) and the order the program's scatters (the first
    major) or gathers (the last major) leave them in."""
    parts = [(name, f) for a in axes for name, _, f in sub_axes(placement, a) if f > 1]
    wanted = [name for name, _ in parts]
    entries = scatters(program)
    if program.kind == "all-gather":
        entries = tuple(reversed(entries))
    done = [n for levels in entries for n in _names(placement, axes, levels)]
    return wanted, done, dict(parts)


def reduce(x, program: Program, placement: Placement, axes, dim: int = 0):
    """``program`` (a sum, or an all-gather, over the mesh ``axes``) on the local array
    ``x``, inside ``shard_map`` over `split_mesh`: an all-reduce returns ``x``'s shape, a
    reduce-scatter ``x`` with ``dim`` divided by the group's size, an all-gather with it
    multiplied (blocks in the result's order)."""
    axes = tuple(axes)
    n = math.prod(f for a in axes for _, _, f in sub_axes(placement, a))
    if program.kind == "all-reduce":
        flat = x.reshape(-1)
        pad = (-flat.size) % n
        y = jnp.pad(flat, (0, pad)) if pad else flat
        return _steps(y, program, placement, axes, 0)[: flat.size].reshape(x.shape)
    if program.kind == "all-gather":
        y = _steps(x, program, placement, axes, dim)
        if program.permuted:
            wanted, done, sizes = _layouts(program, placement, axes)
            y = _permute(y, done, wanted, sizes, dim)
        return y
    if program.kind != "reduce-scatter":
        raise InputError(f"reduce: a program of kind {given(program.kind)} is no reduction.")
    if x.shape[dim] % n:
        raise InputError(
            f"reduce: dimension {dim} of {x.shape} does not split over the {n} devices of "
            f"{axes}; a reduce-scatter needs it divisible."
        )
    if program.permuted:
        wanted, done, sizes = _layouts(program, placement, axes)
        x = _permute(x, wanted, done, sizes, dim)
    return _steps(x, program, placement, axes, dim)
