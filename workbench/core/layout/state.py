"""Sharding state: immutable snapshots of every value's sharding, with provenance and conflicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from workbench.core.layout.sharding import Sharding, canonical


@dataclass(frozen=True, slots=True)
class Provenance:
    """Why one mesh axis sits on one value: the tactic, and the op edge it came over.

    ``op`` and ``source`` are None when the tactic itself put it there. ``step`` orders
    the decisions of one tactic, so its propagation can be replayed step by step.
    """

    value: int
    axis: str
    tactic: int  # index into the schedule
    dim: int | None  # tiled dimension, or None for a pending reduction
    reduction: str | None = None
    op: int | None = None
    source: int | None = None
    factor: str | None = None  # the factor of ``op`` that carried it, as the op's rule names it
    step: int = 0
    part: int | None = None  # which of a composite tactic's parts it flowed from (``State.parts``)


@dataclass(frozen=True, slots=True)
class Claim:
    """One side of a conflict: a value and what it wants of the op on the axis."""

    value: int
    wants: str  # e.g. "factor k (dim 1)" or "sum"
    tactic: int | None


@dataclass(frozen=True, slots=True)
class Conflict:
    """Propagation stopped at ``op`` on ``axis``: its tensors disagree and nothing was guessed."""

    op: int
    axis: str
    claims: tuple[Claim, ...]
    reason: str
    tactic: int  # the tactic whose propagation found it
    step: int = 0  # its place among the tactic's events
    part: int | None = None


@dataclass(frozen=True, slots=True)
class Pin:
    """A Replicate (``atomic`` False) or Atomic tactic holding ``value`` on ``axis``."""

    value: int
    axis: str
    atomic: bool
    tactic: int
    step: int = 0
    part: int | None = None


@dataclass(frozen=True, slots=True)
class Note:
    """What tactic ``tactic`` could not do: ``value``, which it targets, stays whole on
    ``axis``, for ``reason`` (in names). ``value`` is None when a selector of it selected
    nothing; ``size`` is the dim's size the axis does not divide, ``what`` the dim's role."""

    value: int | None
    axis: str
    tactic: int
    reason: str
    size: int | None = None
    what: str = ""


@dataclass(frozen=True, eq=False)
class State:
    """One snapshot: what the schedule so far decided. Never mutated; tactics make new ones."""

    shardings: Mapping[int, Sharding]
    provenance: Mapping[tuple[int, str], Provenance]
    conflicts: tuple[Conflict, ...] = ()
    schedule: tuple[Any, ...] = ()  # the tactics applied, in order
    changed: frozenset[int] = frozenset()  # values the last tactic changed
    notes: tuple[Note, ...] = ()  # what each tactic of the schedule could not do, in order
    events: tuple[Provenance | Conflict | Pin, ...] = field(
        default=(), repr=False
    )  # the last tactic's decisions, pins and conflicts, in the order propagation made them
    parts: Mapping[int, tuple[Any, ...]] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )  # per composite tactic of the schedule, the primitive tactics it ran, in order
    pipeline: Any = None  # the tactic that pipelines the step (``PP``), alone or in a composite
    #: (op, axis, factor): the op never spreads that factor on that axis, and claims of it
    #: beside another factor are a re-split the plan makes, not a conflict (``Fence``)
    fences: frozenset[tuple[int, str, int]] = frozenset()
    #: the axes whose attention runs as a ring (a ``CP(kind="ring")``, alone or in a
    #: composite: ``plan/rings.py``), in the order applied
    rings: tuple[str, ...] = ()
    balanced: tuple[str, ...] = ()  # of those, the axes whose sequence is balanced (zigzag)

    @property
    def order(self) -> tuple[Provenance, ...]:
        """The last tactic's decisions (axis on a value), in order."""
        return tuple(e for e in self.events if isinstance(e, Provenance))

    @property
    def placement(self):
        """Where the mesh's axes lie on a hardware's levels: the ``placement`` of the last
        tactic of the schedule that has one (a ``Place`` step), else None."""
        for tactic in reversed(self.schedule):
            placement = getattr(tactic, "placement", None)
            if placement is not None:
                return placement
        return None

    @classmethod
    def initial(cls, program) -> State:
        whole: dict = {}  # (shape, dtype) -> its unsharded sharding, made once
        shardings = {}
        for v in program.values:
            s = whole.get((v.shape, v.dtype))
            if s is None:
                s = whole[v.shape, v.dtype] = canonical(Sharding.unsharded(v.shape, v.dtype))
            shardings[v.id] = s
        return cls(MappingProxyType(shardings), MappingProxyType({}))

    def __getitem__(self, value_id: int) -> Sharding:
        return self.shardings[value_id]

    def changed_since(self, other: State) -> frozenset[int]:
        """Values whose sharding differs between ``other`` and this state."""
        return frozenset(v for v, s in self.shardings.items() if other.shardings[v] != s)
