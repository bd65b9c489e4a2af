"""Calls and wrappers: what capture inlines, and what it keeps whole.

A call (``jit``, ``custom_jvp_call``, ...) never becomes an op: capture inlines its callee,
found under the param its ``Call`` trait names. The wrappers after them (``shard_map``,
``xla_pmap``, ``run_state``, ...) are kept whole when a program holds one: a barrier. All cost
nothing themselves; ``costs.jaxpr_cost`` prices the jaxprs they hold.
"""

from __future__ import annotations

from workbench.core.ops.costs import free
from workbench.core.ops.record import KERNEL, Barrier, Call, Traits
from workbench.core.ops.registry import register

_INLINED = Barrier("a call: capture inlines its callee, so it is never an op of a program")

#: name: the param holding the callee, the param naming a scope (in capture's order).
CALLS = {
    "jit": ("jaxpr", "name"),
    "pjit": ("jaxpr", "name"),
    "closed_call": ("call_jaxpr", None),
    "core_call": ("call_jaxpr", None),
    "remat2": ("jaxpr", None),
    "checkpoint": ("jaxpr", None),
    "custom_jvp_call": ("call_jaxpr", None),
    "custom_vjp_call": ("call_jaxpr", None),
    "custom_vjp_call_jaxpr": ("fun_jaxpr", None),
}
for _name, (_param, _scope) in CALLS.items():
    register(_name, cost=free, fusion=KERNEL, traits=Traits(call=Call(_param, _scope)))(_INLINED)

register("remat", "custom_lin", cost=free, fusion=KERNEL)(
    Barrier("a wrapper of an older or internal form that capture does not enter")
)
register("shard_map", "xla_pmap", cost=free, fusion=KERNEL)(
    Barrier("a per-device program: capture keeps it whole, with its own collectives")
)
register("run_state", cost=free, fusion=KERNEL)(
    Barrier("stateful code (Pallas refs): capture keeps it whole")
)
