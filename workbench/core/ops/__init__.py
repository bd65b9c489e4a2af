"""One record per primitive (rule, cost, fusion, local lowering, traits) and the queries on
them; importing the package registers every family (see README.md)."""

from __future__ import annotations

import warnings

from workbench.core.ops import (  # noqa: F401  (importing registers the records)
    collectives,
    control_flow,
    conv,
    dot,
    elementwise,
    indexing,
    misc,
    random,
    reduce,
    shape,
    wrappers,
)
from workbench.core.ops.mapping import (
    FactorMapping,
    MappingBuilder,
    TensorType,
    barrier_mapping,
    einsum_mapping,
)
from workbench.core.ops.record import Barrier, Call, Control, Fusion, Fusions, Record, Traits
from workbench.core.ops.registry import (
    RECORDS,
    RULES,
    FusionSets,
    calls,
    fusion_sets,
    has_rule,
    local_lowering,
    mapping_for,
    record,
    register,
    traits,
)

__all__ = [
    "RECORDS",
    "RULES",
    "Barrier",
    "Call",
    "Control",
    "FactorMapping",
    "Fusion",
    "FusionSets",
    "Fusions",
    "MappingBuilder",
    "Record",
    "TensorType",
    "Traits",
    "barrier_mapping",
    "calls",
    "einsum_mapping",
    "fusion_sets",
    "has_rule",
    "local_lowering",
    "mapping_for",
    "mapping_of",
    "record",
    "register",
    "traits",
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
