"""What the strategy families share: selecting values and picking the dims a strategy tiles."""

from __future__ import annotations

from workbench.core.errors import TacticError
from workbench.core.ir.selectors import exact, select
from workbench.core.propagate.tactics import (
    Expansion,
    Target,
    Tile,
    check_axis_name,
    check_dim,
    check_flag,
    check_optional_selector,
)


def check_fields(tactic, selectors=(), dims=(), optional_dims=()) -> None:
    """At construction: a strategy's axis is an axis name, its ``selectors`` fields None or
    selectors, its ``dims`` ints (``optional_dims``: or None), ``strict`` True or False
    (``TacticInputError`` otherwise); whether the mesh has the axis is checked when applied."""
    check_axis_name(tactic)
    for field in selectors:
        check_optional_selector(tactic, field)
    for field in dims:
        check_dim(tactic, field)
    for field in optional_dims:
        check_dim(tactic, field, optional=True)
    check_flag(tactic)


def matches(program, selector) -> list[int]:
    """The values ``selector`` picks; none is no error (the strategy says what it missed)."""
    return select(program, selector, required=False)


def strict_text(tactic, text: str) -> str:
    """A strategy's text, with ``strict=`` as given when it is not the default False."""
    return text if tactic.strict is False else f"{text[:-1]}, strict={tactic.strict!r})"


def unmatched(program, name: str, selector) -> list[Target]:
    """A note's target when a strategy's ``name=`` selector selects nothing; else none."""
    if selector is None or matches(program, selector):
        return []
    return [Target(None, f"{name}={selector!r} selects no value of {program.name}")]


def names_of(program, ids) -> list[str]:
    """Selectors for exactly these values (a name with glob characters stays one name)."""
    return [exact(program.values[i].name) for i in ids]


def by_dim(program, mesh, state, axis, picks, what: str = "") -> Expansion:
    """``Tile`` tactics for ``(value, dim)`` picks, one per dim in first-seen order; values the
    axis already sits on, or whose dim it does not divide, are left to propagation. Each
    pick with a dim is a target; ``what`` names the dims' role in the notes of those left
    whole (a pick without a dim, or a scalar, has nothing to tile and is none)."""
    size = mesh.axis_size(axis)
    groups: dict[int, list[int]] = {}
    targets = []
    for vid, d in picks:
        v, sh = program.values[vid], state.shardings[vid]
        if d is None or not v.shape:
            continue
        if not -len(v.shape) <= d < len(v.shape):  # a dim the user gave
            raise TacticError(
                f"{v.name} has rank {len(v.shape)} (shape {v.shape}), so dim {d} is out of "
                f"range; use a dim in [{-len(v.shape)}, {len(v.shape) - 1}]."
            )
        if sh.uses(axis):
            targets.append(Target(vid))
            continue
        if axis in sh.replicated:
            why = f"an earlier Replicate keeps it whole on {axis!r}"
            targets.append(Target(vid, why, what=what))
            continue
        d %= len(v.shape)
        already = sh.shards(d, mesh)
        if v.shape[d] % (already * size):
            cut = f", already cut in {already} pieces" if already > 1 else ""
            named = f" ({what})" if what else ""
            why = (
                f"dim {d}{named} has size {v.shape[d]}{cut}, which the {size}-way axis "
                f"{axis!r} does not divide"
            )
            targets.append(Target(vid, why, v.shape[d] // already, what))
            continue
        targets.append(Target(vid))
        if vid not in groups.get(d, ()):
            groups.setdefault(d, []).append(vid)
    tiles = [Tile(names_of(program, ids), d, axis) for d, ids in groups.items()]
    return Expansion(tiles, targets)


def shard_dim(shape, sharding, mesh, axis) -> int | None:
    """The largest dim the axis still divides (ties: the later dim), or None."""
    size = mesh.axis_size(axis)
    best = None
    for d, n in enumerate(shape):
        if n % (sharding.shards(d, mesh) * size) == 0 and (best is None or n >= shape[best]):
            best = d
    return best
