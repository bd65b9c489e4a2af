"""Checks for chapter 3, ZeRO and FSDP (notebooks/course_03_*.ipynb)."""

from __future__ import annotations

import math
from collections import Counter

import workbench as wb
from workbench.core.units import format_bytes

from .common import (
    call,
    close,
    data_inputs,
    matrices,
    no_conflicts,
    ok,
    phase,
    require,
    session,
    unanswered,
)


def zero_schedule(stage: str, axis: str) -> list:
    """The chapter's schedule of ``stage`` ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3") over ``axis``."""
    bp = wb.BP(axis)
    return {
        "DP": [bp],
        "ZeRO-1": [wb.Replicate("grads/**", axis), bp, wb.Z2(axis)],
        "ZeRO-2": [bp, wb.Z2(axis)],
        "ZeRO-3": [bp, wb.Z3(axis)],
    }[stage]


def model_state(s: wb.Session) -> float:
    """Model-state bytes per device: parameters, gradients and optimizer state."""
    from workbench.core import hardware as hw

    return sum(s.estimate(hw.H100).memory.states.values())


def n_params(program) -> int:
    """P: the elements of every parameter the anatomy finds."""
    return sum(math.prod(program.values[v].shape) for v in program.anatomy().parameters)


def zero_formula(program, formula, stage: str = "ZeRO-2", axis: str = "data") -> None:
    """Exercise 3.1: ``formula(P, N)`` gives the model-state bytes per device of ``stage``
    within 5% of the engine's estimate, for N = 2, 4 and 8 devices."""
    unanswered(None if formula is ... else formula, "a function of P and N")
    P, rows = n_params(program), []
    for n in (2, 4, 8):
        got = model_state(wb.Session(program, wb.Mesh({axis: n}), zero_schedule(stage, axis)))
        mine = call(formula, P, n, what=f"P={P}, N={n}")
        rows.append((n, mine, got))
        require(
            close(mine, got, 0.05),
            f"for N={n} devices your formula gives {format_bytes(mine)}, the engine "
            f"{format_bytes(got)} per device. Model state has three parts, each with its "
            f"own bytes per parameter (the table at the top). Under {stage}, which parts "
            "does each device still hold whole, and which does it hold only its 1/N share "
            "of? Check your formula's answer at N=1 as well: there every stage is plain DP.",
        )
    text = ", ".join(f"N={n}: {format_bytes(g)}" for n, _, g in rows)
    ok(f"your {stage} formula is within 5% of the engine for every mesh size ({text})")


def fsdp(program, mesh, schedule, axis: str = "data") -> None:
    """Exercises 3.2 and 3.3: FSDP / ZeRO-3 on ``axis``: the data inputs split on their batch
    dim, model state 1/N of data parallelism's (16P/N), every weight matrix all-gathered
    before use in the forward pass, every gradient reduce-scattered (none all-reduced)."""
    s = session(program, mesh, schedule)
    no_conflicts(s)
    for name, dim in data_inputs(program):
        sh = s.sharding(name)
        require(
            dim is None or sh.dim_of(axis) == dim,
            f"the data input {name} is {sh}: FSDP is data parallel, so each device should "
            f"get its own slice of the batch over {axis!r}.",
        )
    n = mesh.axis_size(axis)
    got = model_state(s)
    dp = model_state(wb.Session(program, mesh, [wb.BP(axis)]))
    require(
        close(got, dp / n, 0.05),
        f"model state is {format_bytes(got)} per device, {dp / got:.2f}x less than data "
        f"parallelism's {format_bytes(dp)}. FSDP stores each parameter, its gradient and its "
        f"optimizer state once over the {n} devices of {axis!r}: is each of the three sharded?",
    )
    p, cs = s.program, s.collectives()
    gathered = Counter()
    for c in cs:
        if c.kind == "all-gather" and axis in c.axes:
            gathered[(p.values[c.value].name, phase(p, c))] += 1
    weights = matrices(p)
    missing = [m for m in weights if not gathered[(m, "forward")]]
    require(
        not missing,
        f"{len(missing)} of the {len(weights)} weight matrices are not all-gathered before use "
        f"in the forward pass, e.g. {missing[:3]}: where are they stored whole?",
    )
    grads = set(p.anatomy().gradients.values())
    scattered = {c.value for c in cs if c.kind == "reduce-scatter" and axis in c.axes}
    reduced = {c.value for c in cs if c.kind == "all-reduce" and c.value in grads}
    require(
        grads <= scattered and not reduced,
        f"{len(grads & scattered)} of the {len(grads)} gradients are reduce-scattered over "
        f"{axis!r} and {len(reduced)} all-reduced: a device that updates only its shard of a "
        "parameter needs only that shard of the gradient's sum.",
    )
    again = sum(1 for m in weights if gathered[(m, "backward")])
    ok(
        f"model state {format_bytes(got)} per device = 1/{n} of data parallelism's within 5%; "
        f"all {len(weights)} weight matrices are all-gathered before use ({again} again in the "
        f"backward pass) and all {len(grads)} gradients are reduce-scattered"
    )
