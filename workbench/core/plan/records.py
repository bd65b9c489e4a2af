"""The plan's records: how each op runs (``OpPlan``), each fetch (``Fetch``), the whole
``Plan`` with its collectives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from workbench.core.layout.collectives import Collective
from workbench.core.layout.redistribute import Step
from workbench.core.layout.sharding import Sharding


@dataclass(frozen=True, slots=True)
class Fetch:
    """Bring ``value`` from an available layout ``src`` into ``dst``, by ``steps``.

    ``copy`` numbers the copies of ``dst`` the plan makes of the value (``src_copy`` the one
    read): a layout gathered in one phase is made again in another (``Planner.fetch``).
    """

    value: int
    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]
    copy: int = 0
    src_copy: int = 0


@dataclass(frozen=True, slots=True)
class OpPlan:
    """How one op runs: its factors' axes, operand layouts in, result layouts out."""

    op: int
    factor_axes: Mapping[int, tuple[str, ...]]
    contracted: tuple[
        tuple[str, str], ...
    ]  # (axis, reduction) the op leaves pending by contracting
    passed: tuple[tuple[str, str], ...]  # (axis, reduction) pending reductions it passes on
    operands: tuple[Sharding | None, ...]  # per linked operand: the layout it needs (None: literal)
    results: tuple[Sharding, ...]  # per linked result: the layout it produces
    fetches: tuple[Fetch | None, ...]  # per linked operand (region outputs: at the end of the body)
    repeats: int = 1  # how many times it runs per step


@dataclass(frozen=True, slots=True)
class Plan:
    ops: tuple[OpPlan | None, ...]  # by op id
    outputs: tuple[Fetch | None, ...]  # per program output
    collectives: tuple[Collective, ...]
    # values some fetch redistributes (a collective or a local step reads them from memory)
    redistributed: frozenset[int] = frozenset()
    probes: tuple[Fetch, ...] = ()  # per probed value (see ``build_plan``), after the outputs
    rings: Mapping[int, object] = field(
        default_factory=lambda: MappingProxyType({})
    )  # op -> the ring attention run there
    skipped: frozenset[int] = frozenset()  # ops the rings replace
    notes: tuple[str, ...] = ()  # what the plan could not do as its tactics asked, and why
    zigzag: object = None  # the balanced order of a causal ring's sequence (``plan/zigzag.py``)
    #: collectives compiled on a branch the step takes only where a balanced ring reruns
    #: every pair (a row that sees no key): in the program, not in its price
    fallback: tuple[Collective, ...] = ()

    def op(self, op_id: int) -> OpPlan:
        return self.ops[op_id]
