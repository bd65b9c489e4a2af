"""Overlap policies: how much of a step's communication hides behind its compute.

"none" adds the two, "full" takes the longer, a fraction hides that share of the shorter,
and "prefetch" hides what an FSDP runtime's scheduler hides: the gathers of values made
from the step's inputs alone (weights, fetched ahead of their use) and the reductions of
gradients (finished behind later work); every other collective waits for compute. Which
collectives those are is the simulator's to say (``Communication.hidden``).
"""

from __future__ import annotations

from workbench.core.anatomy.layers import carried_inputs, region_operands

OVERLAPS = ("none", "full", "prefetch")


def overlapped(compute: float, communication: float, overlap, hidden: float = 0.0) -> float:
    """Step time from compute and communication; ``hidden``: the part of communication the
    "prefetch" policy may hide (see module doc)."""
    if overlap == "none":
        return compute + communication
    if overlap == "full":
        return max(compute, communication)
    if overlap == "prefetch":
        return max(compute, hidden) + communication - hidden
    fraction = -1.0 if isinstance(overlap, str) else float(overlap)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(
            f"overlap must be 'none', 'full', 'prefetch' or a fraction in [0, 1]; got {overlap!r}"
        )
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
