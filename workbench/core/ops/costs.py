"""What one op costs on one device: FLOPs, transcendentals and bytes accessed.

``op_cost`` asks the primitive's record (each family module prices its primitives beside
their rules, by XLA's ``HloCostAnalysis`` conventions: see README.md); an unknown primitive
costs no FLOPs and the bytes of its operands and results. ``jaxpr_cost`` sums a jaxpr
(the roofline, ``op_time``, is the simulator's: ``estimate.compute``). The builders here (``PerElement``, ``moves``, ``free``) and
the sizes (``elements``, ``io_bytes``, ``tensor_bytes``) are what the families price with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.core.dtypes import itemsize as dtype_itemsize
from workbench.core.ops.mapping import TensorType
from workbench.core.ops.registry import RECORDS


@dataclass(frozen=True, slots=True)
class OpCost:
    """Per-device work of one op (or a sum of ops)."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    # a matmul's (batch, rows, columns, contraction), for the chip's tiles (a sum has none)
    gemm: tuple[int, int, int, int] | None = None

    def __add__(self, other: OpCost) -> OpCost:
        return OpCost(
            self.flops + other.flops,
            self.transcendentals + other.transcendentals,
            self.bytes_accessed + other.bytes_accessed,
        )

    def __mul__(self, k: float) -> OpCost:
        return OpCost(self.flops * k, self.transcendentals * k, self.bytes_accessed * k)

    __rmul__ = __mul__


ZERO = OpCost()


def op_cost(
    primitive: str,
    params,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
) -> OpCost:
    """The cost of one ``primitive`` on these local operand and result types."""
    record = RECORDS.get(primitive)
    if record is None:
        return OpCost(0.0, 0.0, io_bytes(operands, results))
    return record.cost(params or {}, list(operands), list(results))


def is_known(primitive: str) -> bool:
    """Whether op_cost has a rule for ``primitive`` (else it uses the unknown default)."""
    return primitive in RECORDS


# -- sizes ------------------------------------------------------------------------------------------
def elements(t: TensorType) -> int:
    return math.prod(t.shape)


def itemsize(dtype) -> int:
    """Bytes per element (per key for PRNG key dtypes); 4 when the dtype is unknown (None)."""
    return dtype_itemsize(dtype)


def tensor_bytes(t: TensorType) -> int:
    """Bytes of one tensor (elements x itemsize)."""
    return elements(t) * itemsize(t.dtype)


def io_bytes(operands, results) -> int:
    """Bytes of every operand plus every result (literals at their own, scalar, size)."""
    return sum(tensor_bytes(t) for t in operands) + sum(tensor_bytes(t) for t in results)


# -- builders -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PerElement:
    """An elementwise cost: ``flops`` and ``transcendentals`` per result element."""

    flops: float
    transcendentals: float = 0.0

    def __call__(self, params, operands, results) -> OpCost:
        n = elements(results[0]) if results else 0
        return OpCost(self.flops * n, self.transcendentals * n, io_bytes(operands, results))


def moves(params, operands, results) -> OpCost:
    """Data movement: no FLOPs, every operand read and every result written."""
    return OpCost(0.0, 0.0, io_bytes(operands, results))


def free(params, operands, results) -> OpCost:
    """Nothing: a rename, a layout, a call or a loop (whose bodies are priced op by op)."""
    return ZERO


# -- whole jaxprs -------------------------------------------------------------------------------------
def jaxpr_cost(jaxpr) -> OpCost:
    """The summed cost of a (closed) jaxpr's equations, on the shapes it was traced with.

    Calls are entered; a ``scan`` body counts ``length`` times; a ``while`` body and
    its condition once (the trip count is unknown); a ``cond`` costs its dearest branch.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = ZERO
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        record = RECORDS.get(name)
        control = record.traits.control if record is not None else None
        subs = [v for v in eqn.params.values() if _is_jaxpr(v)]
        if control is not None and control.kind == "branch" and control.jaxprs(eqn.params):
            costs = [jaxpr_cost(b) for b in control.jaxprs(eqn.params)]
            total += max(costs, key=lambda c: (c.flops + c.transcendentals, c.bytes_accessed))
        elif control is not None and control.kind == "loop":
            for body in control.jaxprs(eqn.params):
                total += jaxpr_cost(body) * control.trips(eqn.params)
        elif subs and record is not None and record.cost is free:
            for s in subs:
                total += jaxpr_cost(s)
        else:
            operands = [TensorType(tuple(v.aval.shape), v.aval.dtype) for v in eqn.invars]
            results = [TensorType(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars]
            total += op_cost(name, eqn.params, operands, results)
    return total


def _is_jaxpr(v) -> bool:
    return hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")
