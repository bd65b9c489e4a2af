"""What a pipeline stage weighs: an op's cost (FLOPs at global shapes, or a user's function,
checked), and an op's with its regions' (a loop's body times its trips)."""

from __future__ import annotations

import math
from numbers import Real

from workbench.core.errors import InputError, given
from workbench.core.ops import traits as traits_of
from workbench.core.ops.costs import op_cost


def checked_cost(cost):
    """``cost``, checked to be callable and to give finite numbers >= 0."""
    if not callable(cost):
        raise InputError(
            f"cost={given(cost)} is not callable; give a function of an op id returning its "
            "cost as a number >= 0, e.g. cost=lambda op: 1.0."
        )

    def weigh(op_id: int) -> float:
        c = cost(op_id)
        if not isinstance(c, Real) or isinstance(c, bool) or not math.isfinite(c) or c < 0:
            raise InputError(
                f"cost({op_id}) returned {given(c)}, not a finite number >= 0; the cost "
                "function must weigh every op id of the program."
            )
        return float(c)

    return weigh


def flops_cost(program):
    """An op's FLOPs at global shapes, as ``ops`` costs it (its regions aside)."""

    def weigh(o: int) -> float:
        op, types = program.ops[o], program.operand_type
        results = [program.values[r].type for r in op.results]
        return op_cost(op.primitive, op.params, [types(v) for v in op.operands], results).flops

    return weigh


def weight(program, op_id: int, weigh, per_trip: bool = False) -> float:
    """``weigh`` of an op and of its regions' ops (a loop's body times its trips, a
    branch's dearest region); ``per_trip``: one trip of a loop, its own cost shared."""
    op = program.ops[op_id]
    own = weigh(op_id)
    if not op.regions:
        return own
    control = traits_of(op.primitive).control
    inner = [sum(weight(program, o, weigh) for o in r.ops) for r in op.regions]
    if control is not None and control.kind == "branch":
        return own + max(inner)
    trips = control.trips(op.params) if control is not None else 1
    return own / max(trips, 1) + sum(inner) if per_trip else own + sum(inner) * trips
