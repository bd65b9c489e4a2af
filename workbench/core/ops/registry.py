"""The records, keyed by primitive name, and the queries the rest of core asks of them.

A family module registers each primitive once (``register``); a second registration is a
bug. Core asks ``record``, ``traits``, ``local_lowering``, ``calls`` and ``fusion_sets``
instead of comparing names; ``mapping_for`` gives an op's factor mapping (an unknown
primitive warns once and is a barrier).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.core.ops.local import runs_unchanged
from workbench.core.ops.mapping import FactorMapping, TensorType, barrier_mapping
from workbench.core.ops.record import (
    BACKENDS,
    NO_TRAITS,
    Barrier,
    Fusion,
    Fusions,
    Record,
    Rule,
    Traits,
)

RECORDS: dict[str, Record] = {}


class _Rules(Mapping):
    """Primitive -> its rule: a read-only view of the records' rules."""

    def __getitem__(self, primitive: str) -> Rule:
        return RECORDS[primitive].rule

    def __iter__(self):
        return iter(RECORDS)

    def __len__(self) -> int:
        return len(RECORDS)


RULES: Mapping[str, Rule] = _Rules()
_warned: set[str] = set()


def register(
    *primitives: str,
    cost: Callable,
    fusion: Fusion | Fusions,
    local: Callable = runs_unchanged,
    traits: Traits = NO_TRAITS,
) -> Callable[[Rule], Rule]:
    """Register one rule with its facets under one or more primitive names (as a decorator,
    or called on a ``Barrier``). Cost and fusion have no default: a new primitive says them."""
    if isinstance(fusion, Fusion):
        fusion = Fusions(cpu=fusion)
    family = sys._getframe(1).f_globals.get("__name__", "?").rsplit(".", 1)[-1]

    def wrap(rule: Rule) -> Rule:
        for name in primitives:
            if name in RECORDS:
                raise ValueError(f"primitive {name!r} already has a record: {RECORDS[name]}")
            RECORDS[name] = Record(name, family, rule, cost, fusion, local, traits)
        return rule

    return wrap


# -- queries ---------------------------------------------------------------------------------------
def record(primitive: str) -> Record | None:
    """The record of ``primitive``; None for a primitive workbench does not know."""
    return RECORDS.get(primitive)


def traits(primitive: str) -> Traits:
    """The traits of ``primitive`` (none for an unknown primitive)."""
    rec = RECORDS.get(primitive)
    return NO_TRAITS if rec is None else rec.traits


def local_lowering(primitive: str) -> Callable:
    """How ``primitive`` runs on local shards (unchanged for an unknown primitive)."""
    rec = RECORDS.get(primitive)
    return runs_unchanged if rec is None else rec.local


def has_rule(primitive: str) -> bool:
    return primitive in RECORDS


def calls() -> dict[str, str]:
    """The calls capture inlines: primitive -> the param holding the callee."""
    return {name: r.traits.call.param for name, r in RECORDS.items() if r.traits.call}


@dataclass(frozen=True, slots=True)
class FusionSets:
    """The simulator's fusion tables for one backend (see ``record.Fusion``)."""

    fusible: frozenset[str]  # fuse into loop kernels
    fusing_readers: frozenset[str]  # read fused values without a buffer
    expensive: frozenset[str]  # fusible, but computed once when several kernels read them
    copying: frozenset[str]  # read operands through transposed copies
    free: frozenset[str]  # compile to no kernel


def fusion_sets(backend: str = "cpu") -> FusionSets:
    """The five fusion tables of ``backend``, read from the records."""
    if backend not in BACKENDS:
        raise ValueError(f"no backend {backend!r}; choose one of {BACKENDS}")
    per = {name: getattr(r.fusion, backend) for name, r in RECORDS.items()}
    missing = sorted(name for name, f in per.items() if f is None)
    if missing:
        raise ValueError(
            f"no {backend} fusion classes for {len(missing)} primitives ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); only cpu's are read so far"
        )

    def those(flag: str) -> frozenset[str]:
        return frozenset(name for name, f in per.items() if getattr(f, flag))

    return FusionSets(
        those("loop"), those("fuses_inputs"), those("expensive"), those("copies_operands"),
        those("bitcast"),
    )  # fmt: skip


def mapping_for(
    primitive: str,
    params: Mapping[str, Any],
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
) -> FactorMapping:
    """The factor mapping of one op. An unknown primitive warns once and becomes a barrier;
    an explicit ``Barrier`` warns once with its reason."""
    rec = RECORDS.get(primitive)
    if rec is None:
        if primitive not in _warned:
            _warned.add(primitive)
            warnings.warn(
                f"workbench has no sharding rule for primitive {primitive!r}; it is treated as a "
                "barrier: its operands are gathered and nothing propagates across it.",
                stacklevel=2,
            )
        return barrier_mapping(operands, results)
    if isinstance(rec.rule, Barrier):
        rec.rule.warn(primitive)
    return rec.rule(params, operands, results)
