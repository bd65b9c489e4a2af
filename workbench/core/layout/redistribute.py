"""Redistribution: the steps that turn one layout of a value into another, memory-efficiently.

Steps are local slices, collectives (all-gather, reduce-scatter, all-reduce, all-to-all,
collective-permute) and masks (making a whole value a pending sum). A plan shrinks
first and grows last, as in the memory-efficient redistribution paper (arXiv 2112.01075):
pending reductions are resolved first (as a reduce-scatter where the target tiles the
axis), then slices, then all-to-alls and permutes, then gathers. Where that greedy order
would create a buffer larger than both the source and the destination shard, a small
exhaustive search over layouts finds the plan with the smallest largest buffer, then the
fewest bytes moved.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, replace

from workbench.core import caches
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding

LOCAL_KINDS = ("slice", "mask")


@dataclass(frozen=True, slots=True)
class Step:
    """One redistribution step. ``bytes`` follows the Collective convention; 0 for local steps."""

    kind: str  # "slice", "mask", or a collective kind
    axes: tuple[str, ...]
    before: Sharding
    after: Sharding
    bytes: int
    dim: int | None = None  # slice / gather / scatter / all-to-all split dimension
    dim_from: int | None = None  # all-to-all: the dimension concatenated
    reduction: str | None = None
    order: tuple[str, ...] | None = None  # collective-permute: the dimension's new axis order

    @property
    def is_collective(self) -> bool:
        return self.kind not in LOCAL_KINDS


def layout_key(s: Sharding) -> tuple:
    """What a layout is, ignoring the replicated/atomic pins of tactics."""
    return (s.dims, s.partial)


def as_layout(s: Sharding) -> Sharding:
    return (
        s
        if not (s.replicated or s.atomic)
        else replace(s, replicated=frozenset(), atomic=frozenset())
    )


def _set_dim(s: Sharding, d: int, axes: tuple[str, ...]) -> Sharding:
    dims = list(s.dims)
    dims[d] = axes
    return replace(s, dims=tuple(dims))


def _without_partial(s: Sharding, axis: str) -> Sharding:
    return replace(s, partial=tuple(p for p in s.partial if p[0] != axis))


def _divisible(s: Sharding, d: int, extra: int, mesh: Mesh) -> bool:
    return s.shape[d] % (s.shards(d, mesh) * extra) == 0


def moves(cur: Sharding, dst: Sharding, mesh: Mesh):
    """Every single step from ``cur`` that uses only axes the source or target involve."""
    size = mesh.shape
    wanted = set(dst.tiled_axes)
    dst_partial = dict(dst.partial)
    for axis, kind in cur.partial:
        if dst_partial.get(axis) == kind:
            continue
        yield Step(
            "all-reduce",
            (axis,),
            cur,
            _without_partial(cur, axis),
            cur.local_nbytes(mesh),
            reduction=kind,
        )
        if kind == "sum":
            for d in range(cur.rank):
                if _divisible(cur, d, size[axis], mesh):
                    after = _set_dim(_without_partial(cur, axis), d, (*cur.dims[d], axis))
                    yield Step(
                        "reduce-scatter",
                        (axis,),
                        cur,
                        after,
                        cur.local_nbytes(mesh),
                        dim=d,
                        reduction="sum",
                    )
    used = cur.axes
    for axis in wanted - used:
        for d in range(cur.rank):
            if _divisible(cur, d, size[axis], mesh):
                yield Step("slice", (axis,), cur, _set_dim(cur, d, (*cur.dims[d], axis)), 0, dim=d)
    for axis, kind in dst.partial:
        if axis not in used:
            yield Step("mask", (axis,), cur, cur.with_partial(axis, kind), 0, reduction=kind)
    for d, axes in enumerate(cur.dims):
        if not axes:
            continue
        minor = axes[-1]
        gathered = _set_dim(cur, d, axes[:-1])
        yield Step("all-gather", (minor,), cur, gathered, gathered.local_nbytes(mesh), dim=d)
        for j in range(cur.rank):
            if j != d and _divisible(gathered, j, size[minor], mesh):
                after = _set_dim(gathered, j, (*cur.dims[j], minor))
                yield Step(
                    "all-to-all", (minor,), cur, after, cur.local_nbytes(mesh), dim=j, dim_from=d
                )
        if len(axes) > 1:
            for order in itertools.permutations(axes):
                if order != axes:
                    yield Step(
                        "collective-permute",
                        axes,
                        cur,
                        _set_dim(cur, d, order),
                        cur.local_nbytes(mesh),
                        dim=d,
                        order=order,
                    )


def _greedy(src: Sharding, dst: Sharding, mesh: Mesh) -> list[Step] | None:
    """Reductions, then slices and all-to-alls into place, then gathers; None if it gets stuck."""
    cur, steps = src, []
    dst_partial = dict(dst.partial)

    def place(axis):  # (dim, position) the target wants ``axis`` at
        d = dst.dim_of(axis)
        return (d, dst.dims[d].index(axis)) if d is not None else None

    def fits(c, axis):  # the target dim of ``axis`` currently holds exactly the axes before it
        where = place(axis)
        return where is not None and c.dims[where[0]] == dst.dims[where[0]][: where[1]]

    for axis, kind in cur.partial:
        if dst_partial.get(axis) == kind:
            continue
        if kind == "sum" and fits(cur, axis):
            d = place(axis)[0]
            after = _set_dim(_without_partial(cur, axis), d, (*cur.dims[d], axis))
            steps.append(
                Step(
                    "reduce-scatter",
                    (axis,),
                    cur,
                    after,
                    cur.local_nbytes(mesh),
                    dim=d,
                    reduction="sum",
                )
            )
        else:
            after = _without_partial(cur, axis)
            steps.append(
                Step("all-reduce", (axis,), cur, after, cur.local_nbytes(mesh), reduction=kind)
            )
        cur = after
    for _ in range(4 * (len(mesh.names) + 1)):
        if cur.dims == dst.dims:
            break
        progressed = False
        for axis in dst.tiled_axes:
            if not cur.uses(axis) and fits(cur, axis):
                d = place(axis)[0]
                after = _set_dim(cur, d, (*cur.dims[d], axis))
                steps.append(Step("slice", (axis,), cur, after, 0, dim=d))
                cur, progressed = after, True
        for d, axes in enumerate(cur.dims):
            if axes and axes != dst.dims[d][: len(axes)]:
                minor = axes[-1]
                if fits(_set_dim(cur, d, axes[:-1]), minor) and place(minor)[0] != d:
                    j = place(minor)[0]
                    after = _set_dim(_set_dim(cur, d, axes[:-1]), j, (*cur.dims[j], minor))
                    steps.append(
                        Step(
                            "all-to-all",
                            (minor,),
                            cur,
                            after,
                            cur.local_nbytes(mesh),
                            dim=j,
                            dim_from=d,
                        )
                    )
                    cur, progressed = after, True
                    break
        if progressed:
            continue
        for d, axes in enumerate(cur.dims):
            if axes and axes != dst.dims[d][: len(axes)]:
                after = _set_dim(cur, d, axes[:-1])
                steps.append(
                    Step("all-gather", (axes[-1],), cur, after, after.local_nbytes(mesh), dim=d)
                )
                cur, progressed = after, True
                break
        if not progressed:
            return None
    if cur.dims != dst.dims:
        return None
    for axis, kind in dst.partial:
        if cur.reduction_of(axis) is None:
            after = cur.with_partial(axis, kind)
            steps.append(Step("mask", (axis,), cur, after, 0, reduction=kind))
            cur = after
    return steps if layout_key(cur) == layout_key(dst) else None


def _search(src: Sharding, dst: Sharding, mesh: Mesh) -> list[Step]:
    """The plan with the smallest largest buffer, then the fewest bytes, then the fewest steps."""
    target = layout_key(dst)
    start = (src.local_nbytes(mesh), 0, 0)
    counter = itertools.count()
    heap = [(start, next(counter), src, [])]
    best: dict[tuple, tuple] = {layout_key(src): start}
    while heap:
        cost, _, cur, path = heapq.heappop(heap)
        if layout_key(cur) == target:
            return path
        if best.get(layout_key(cur), cost) < cost:
            continue
        for step in moves(cur, dst, mesh):
            new = (max(cost[0], step.after.local_nbytes(mesh)), cost[1] + step.bytes, cost[2] + 1)
            key = layout_key(step.after)
            if key not in best or new < best[key]:
                best[key] = new
                heapq.heappush(heap, (new, next(counter), step.after, [*path, step]))
    raise ValueError(f"no redistribution from {src} to {dst} on {mesh}")  # pragma: no cover


def peak_bytes(steps, src: Sharding, mesh: Mesh) -> int:
    """The largest local buffer the steps create (the source's own counts too)."""
    return max([src.local_nbytes(mesh), *(s.after.local_nbytes(mesh) for s in steps)])


@caches.cache("layout.redistributions", maxsize=65536)
def _plan(src: Sharding, dst: Sharding, mesh: Mesh) -> tuple[Step, ...]:
    steps = _greedy(src, dst, mesh)
    bound = max(src.local_nbytes(mesh), dst.local_nbytes(mesh))
    if steps is None or peak_bytes(steps, src, mesh) > bound:
        steps = _search(src, dst, mesh)
    return tuple(merge(steps, mesh))


def redistribute(src: Sharding, dst: Sharding, mesh: Mesh) -> tuple[Step, ...]:
    """The steps from layout ``src`` to layout ``dst`` of one value (empty when equal)."""
    src, dst = as_layout(src), as_layout(dst)
    if layout_key(src) == layout_key(dst):
        return ()
    if src.shape != dst.shape:
        raise ValueError(f"cannot redistribute {src} into {dst}: shapes differ")
    return _plan(src, dst, mesh)


def merge(steps, mesh: Mesh) -> list[Step]:
    """Fuse consecutive steps of one kind on one dimension into one multi-axis step."""
    out: list[Step] = []
    for step in steps:
        prev = out[-1] if out else None
        if (
            prev is not None
            and step.kind == prev.kind
            and step.kind in ("all-gather", "all-reduce", "slice", "mask")
            and step.dim == prev.dim
            and step.reduction == prev.reduction
        ):
            if step.kind == "all-gather":  # gathered minor first: the fused group is major to minor
                axes = step.axes + prev.axes
            else:
                axes = prev.axes + step.axes
            nbytes = step.bytes if step.kind == "all-gather" else prev.bytes
            out[-1] = replace(prev, axes=axes, after=step.after, bytes=nbytes)
        else:
            out.append(step)
    return out


def cost_bytes(steps) -> int:
    return sum(s.bytes for s in steps)


#: Bytes each device sends per byte of a collective's ``bytes``, for a group of n (ring algorithms).
WIRE = {
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0,
}


def wire_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes each device sends for one collective over a group of ``n`` (0 for local steps)."""
    return WIRE[kind](n) * nbytes if kind in WIRE and n > 1 else 0.0


def steps_wire_bytes(steps, mesh: Mesh) -> float:
    return sum(wire_bytes(s.kind, s.bytes, group_size(s, mesh)) for s in steps)


def group_size(step: Step, mesh: Mesh) -> int:
    return math.prod(mesh.axis_size(a) for a in step.axes)
