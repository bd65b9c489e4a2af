"""Overlap policies: how much of a step's communication hides behind its compute.

"none" adds the two, "full" takes the longer, a fraction hides that share of the shorter,
and "prefetch" hides what an FSDP runtime's scheduler hides: the gathers of values made
from the step's inputs alone (weights, fetched ahead of their use) and the reductions of
gradients (finished behind later work); every other collective waits for compute. Which
collectives those are is the simulator's to say (``Communication.hidden``).
"""

from __future__ import annotations

import math
import numbers

from workbench.core.anatomy.layers import carried_inputs, region_operands
from workbench.core.errors import InputError, closest_names, given

OVERLAPS = ("none", "full", "prefetch")


def check_overlap(overlap):
    """``overlap`` if it is a policy: one of `OVERLAPS` or a fraction in [0, 1]; else an
    `InputError` saying what would work."""
    if isinstance(overlap, str):
        if overlap in OVERLAPS:
            return overlap
        near = closest_names(overlap.lower(), OVERLAPS)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        why = "is not an overlap policy"
    elif isinstance(overlap, numbers.Real) and not isinstance(overlap, bool):
        if math.isfinite(overlap) and 0 <= overlap <= 1:
            return overlap
        hint, why = "", "is not a fraction in [0, 1]"
    else:
        hint, why = "", "is neither a policy's name nor a fraction"
    raise InputError(
        f"overlap={given(overlap)} {why}; give 'none' (communication adds to compute), "
        "'full' (the longer of the two), 'prefetch' (gathers of weights and gradient "
        f"reductions hide) or a fraction in [0, 1] of the shorter that hides.{hint}"
    )


def overlapped(compute: float, communication: float, overlap, hidden: float = 0.0) -> float:
    """Step time from compute and communication; ``hidden``: the part of communication the
    "prefetch" policy may hide (see module doc)."""
    if overlap == "none":
        return compute + communication
    if overlap == "full":
        return max(compute, communication)
    if overlap == "prefetch":
        return max(compute, hidden) + communication - hidden
    fraction = float(check_overlap(overlap))
    return compute + communication - fraction * min(compute, communication)


def made_from_inputs(program) -> frozenset[int]:
    """Values computed from the step's inputs and constants alone (a weight, its bf16 copy,
    a loop's per-step slice of it): a runtime can fetch them before the step needs them.
    A loop's carries change from step to step: never."""
    out = set(program.inputs) | set(program.consts)
    for op in program.walk():
        if not op.regions:
            if all(v in out for v in op.operands if isinstance(v, int)):
                out.update(op.results)
            continue
        for region, outer in zip(op.regions, region_operands(op)):
            carried = carried_inputs(op, len(region.inputs))
            for k, (inner, o) in enumerate(zip(region.inputs, outer)):
                if o in out and k not in carried:
                    out.add(inner)
    return frozenset(out)
