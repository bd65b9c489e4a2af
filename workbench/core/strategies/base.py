"""What the strategy families share: selecting values and picking the dims a strategy tiles."""

from __future__ import annotations

from workbench.core.ir.selectors import exact, select
from workbench.core.propagate.tactics import Tactic, Tile


def matches(program, selector) -> list[int]:
    """The values ``selector`` picks; none is no error (the strategy says what it missed)."""
    return select(program, selector, required=False)


def names_of(program, ids) -> list[str]:
    """Selectors for exactly these values (a name with glob characters stays one name)."""
    return [exact(program.values[i].name) for i in ids]


def by_dim(program, mesh, state, axis, picks) -> list[Tactic]:
    """``Tile`` tactics for ``(value, dim)`` picks, one per dim in first-seen order; values the
    axis already sits on, or whose dim it does not divide, are left to propagation."""
    size = mesh.axis_size(axis)
    groups: dict[int, list[int]] = {}
    for vid, d in picks:
        v, sh = program.values[vid], state.shardings[vid]
        if d is None or sh.uses(axis) or axis in sh.replicated:
            continue
        d %= len(v.shape)
        if v.shape[d] % (sh.shards(d, mesh) * size) == 0 and vid not in groups.get(d, ()):
            groups.setdefault(d, []).append(vid)
    return [Tile(names_of(program, ids), d, axis) for d, ids in groups.items()]


def shard_dim(shape, sharding, mesh, axis) -> int | None:
    """The largest dim the axis still divides (ties: the later dim), or None."""
    size = mesh.axis_size(axis)
    best = None
    for d, n in enumerate(shape):
        if n % (sharding.shards(d, mesh) * size) == 0 and (best is None or n >= shape[best]):
            best = d
    return best
