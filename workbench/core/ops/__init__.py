"""Sharding rules, one module per primitive family, all registered in ``registry.RULES``."""

from __future__ import annotations

import warnings

from workbench.core.ops import (  # noqa: F401  (importing registers the rules)
    control_flow,
    conv,
    dot,
    elementwise,
    indexing,
    misc,
    random,
    reduce,
    shape,
)
from workbench.core.ops.mapping import (
    FactorMapping,
    MappingBuilder,
    TensorType,
    barrier_mapping,
    einsum_mapping,
)
from workbench.core.ops.registry import RULES, has_rule, mapping_for, register

__all__ = [
    "RULES",
    "FactorMapping",
    "MappingBuilder",
    "TensorType",
    "barrier_mapping",
    "einsum_mapping",
    "has_rule",
    "mapping_for",
    "mapping_of",
    "register",
]


def mapping_of(program, op) -> FactorMapping:
    """The factor mapping of ``op`` in ``program``; a rule that fails on it makes it a barrier."""
    operands = [program.operand_type(v) for v in op.linked_operands]
    results = [program.operand_type(v) for v in op.linked_results]
    try:
        mapping = mapping_for(op.primitive, op.params, operands, results)
        mapping.check(operands, results)
    except Exception as err:  # a rule that cannot describe this configuration
        warnings.warn(
            f"sharding rule for {op.primitive!r} could not describe op {op.name} "
            f"({type(err).__name__}: {err}); it is treated as a barrier.",
            stacklevel=2,
        )
        mapping = barrier_mapping(operands, results)
    return mapping
