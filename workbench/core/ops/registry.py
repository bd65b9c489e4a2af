"""The registry of what the engine knows per primitive, keyed by primitive name.

Every primitive with a sharding rule has a ``Record``: the rule, and optionally its
per-device cost (``costs.op_cost`` asks the record first) and its per-device lowering
under ``shard_map`` (``lowering.local.bind_local`` asks the record first).

A rule is a pure function ``(params, operands, results) -> FactorMapping`` where
operands and results are ``TensorType``s. For ops with regions (scan, while, cond) the
operands are the outer operands followed by every region's outputs, and the results
the outer results followed by every region's inputs, so one mapping ties a loop's
inside to its outside.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.core.ops.mapping import FactorMapping, TensorType, barrier_mapping


class Rule(Protocol):
    def __call__(
        self,
        params: Mapping[str, Any],
        operands: Sequence[TensorType],
        results: Sequence[TensorType],
    ) -> FactorMapping: ...


@dataclass(frozen=True, slots=True)
class Record:
    """One primitive's knowledge. ``cost(params, operands, results) -> OpCost`` prices it on
    local types; ``local(op, args, ins, outs, mesh) -> list`` runs it on local shards laid
    out as ``ins`` (operand ``Sharding``s), producing ``outs``. None: the defaults."""

    rule: Rule
    cost: Callable | None = None
    local: Callable | None = None


RULES: dict[str, Rule] = {}
RECORDS: dict[str, Record] = {}
_warned: set[str] = set()


def register(
    *primitives: str, cost: Callable | None = None, local: Callable | None = None
) -> Callable[[Rule], Rule]:
    """Register one rule (with its cost and local lowering, if given) under one or more
    primitive names; a second registration is a bug."""

    def wrap(rule: Rule) -> Rule:
        for name in primitives:
            if name in RULES:
                raise ValueError(f"primitive {name!r} already has a sharding rule: {RULES[name]}")
            RULES[name] = rule
            RECORDS[name] = Record(rule, cost, local)
        return rule

    return wrap


def has_rule(primitive: str) -> bool:
    return primitive in RULES


def mapping_for(
    primitive: str,
    params: Mapping[str, Any],
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
) -> FactorMapping:
    """The factor mapping of one op. An unknown primitive warns once and becomes a barrier."""
    rule = RULES.get(primitive)
    if rule is None:
        if primitive not in _warned:
            _warned.add(primitive)
            warnings.warn(
                f"workbench has no sharding rule for primitive {primitive!r}; it is treated as a "
                "barrier: its operands are gathered and nothing propagates across it.",
                stacklevel=2,
            )
        return barrier_mapping(operands, results)
    return rule(params, operands, results)
