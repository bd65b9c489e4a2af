"""Collectives over named mesh axes, and the mesh cast of explicit sharding.

They appear inside per-device programs (``shard_map`` bodies, which capture keeps whole) or
under JAX's explicit sharding, so a captured program holds them only as barriers. Costs:
their local part only (``psum``: one flop per element, like XLA's all-reduce); their
communication is ``hardware.collective_time``'s.
"""

from __future__ import annotations

from workbench.core.ops.costs import OpCost, elements, free, io_bytes, moves
from workbench.core.ops.record import BITCAST, KERNEL, Barrier
from workbench.core.ops.registry import register

_PER_DEVICE = Barrier("a collective of a per-device program (shard_map), which capture keeps whole")
_EXPLICIT = Barrier("a cast of JAX's explicit sharding, whose layouts workbench does not read")


def _all_reduce_cost(params, operands, results):
    return OpCost(float(sum(elements(r) for r in results)), 0.0, io_bytes(operands, results))


register("psum", "pmax", "pmin", "psum_invariant", cost=_all_reduce_cost, fusion=KERNEL)(
    _PER_DEVICE
)
register(
    "all_gather", "all_to_all", "ppermute", "psum_scatter", "reduce_scatter", "pbroadcast",
    cost=moves, fusion=KERNEL,
)(_PER_DEVICE)  # fmt: skip
register("pvary", cost=free, fusion=BITCAST)(_PER_DEVICE)
register("mesh_cast", cost=free, fusion=KERNEL)(_EXPLICIT)
