"""Checks for chapter 1, Data parallelism (notebooks/course_01_*.ipynb)."""

from __future__ import annotations

import math

import workbench as wb
from workbench.core.units import format_bytes

from .common import (
    CheckFailed,
    call,
    data_inputs,
    gradients,
    no_conflicts,
    ok,
    parameters,
    primitive_only,
    require,
    session,
    unanswered,
)

#: The LMs exercise 1.2 is tried on: zoo presets and overrides, built from shapes only.
DP_MODELS = (
    ("tiny", {}),
    ("tiny", {"dtype": "bfloat16", "n_layers": 1}),
    ("small", {"n_layers": 1}),
)


def data_parallel(program, mesh, tactic, axis: str = "batch") -> None:
    """Exercises 1.1 and 1.3: primitive tactics that split every data input on its batch
    dimension over ``axis``, keep every parameter whole, and leave every gradient a
    partial sum over ``axis``. Roles come from the program's anatomy."""
    s = session(program, mesh, primitive_only(tactic))
    no_conflicts(s)
    inputs = [(n, d) for n, d in data_inputs(program) if d is not None]
    require(inputs, "the anatomy finds no data input with a batch dimension in this program.")
    for name, d in inputs:
        sh = s.sharding(name)
        require(
            sh.dim_of(axis) == d and len(sh.tiled_axes) == 1,
            f"{name} is {sh}: data parallelism gives each device its own examples, so every "
            f"data input is split over {axis!r} along the dimension that counts the examples "
            "(and along no other).",
        )
    params = parameters(program)
    for name in params:
        sh = s.sharding(name)
        require(
            sh.is_replicated,
            f"{name} is {sh}: it is a parameter, and in data parallelism every device holds "
            "every parameter whole. Split only what holds examples.",
        )
    grads = gradients(program)
    for param, name in grads.items():
        sh = s.sharding(name)
        require(
            sh.reduction_of(axis) == "sum",
            f"{name} (the gradient of {param}) is {sh}: each device only saw its slice of the "
            f"batch, so its gradient should be a pending (partial) sum over {axis!r}.",
        )
    example = next((grads[n] for n in params if len(program.value(n).shape) >= 2), name)
    ok(
        f"{len(inputs)} data input(s) split over {axis!r} on their batch dimension, all "
        f"{len(params)} parameters whole, and all {len(grads)} gradients partial sums over "
        f"{axis!r} (e.g. {example}: {s.sharding(example)})"
    )


def _gradient_allreduce_bytes(program, n: int) -> int:
    """What data parallelism over ``n`` devices all-reduces for the gradients: the
    collectives an op of the step needs (not the reported loss's)."""
    s = wb.Session(program, wb.Mesh({"batch": n}), [wb.BP("batch")])
    return sum(
        c.bytes * c.count for c in s.collectives() if c.kind == "all-reduce" and c.op is not None
    )


def _model_facts(program) -> tuple[int, int]:
    """``(parameters, bytes per gradient element)``, from the anatomy."""
    values, anatomy = program.values, program.anatomy()
    n_params = sum(math.prod(values[v].shape) for v in anatomy.parameters)
    sizes = {
        values[g].nbytes // max(1, math.prod(values[g].shape)) for g in anatomy.gradients.values()
    }
    (size,) = sizes
    return n_params, size


def dp_allreduce_bytes(formula) -> None:
    """Exercise 1.2: ``formula(n_params, bytes_per_param, n_devices)`` gives the gradient
    bytes data parallelism all-reduces per device per step, as the engine's plan counts
    them, on several LMs (float32 and bfloat16) and mesh sizes."""
    from workbench.models import build

    unanswered(None if formula is ... else formula, "a function of the model and the mesh")
    require(callable(formula), f"expected a function; got {formula!r}.")
    rows = []
    for size, overrides in DP_MODELS:
        example = build("lm", size, abstract=True, **overrides)
        program = wb.capture(example.fn, *example.args)
        n_params, nbytes = _model_facts(program)
        for n in (2, 4, 8):
            planned = _gradient_allreduce_bytes(program, n)
            model = f"{n_params:,} parameters of {nbytes} bytes"
            what = f"{model} on {n} devices"
            mine = call(formula, n_params, nbytes, n, what=what)
            rows.append((model, what, mine, planned))
    for model, what, mine, planned in rows:
        if math.isclose(mine, planned, rel_tol=1e-6):
            continue
        varies = len({r[2] for r in rows if r[0] == model}) > 1
        raise CheckFailed(
            f"for {what} you give {mine:,.0f} bytes, which is not what the plan all-reduces. "
            + (
                "Your answer changes with the number of devices: the plan counts the size of "
                "the array each all-reduce makes whole (what a ring sends is another matter). "
                if varies
                else ""
            )
            + "Every gradient has its parameter's shape and dtype, and each is all-reduced "
            "once per step, whole."
        )
    ok(
        f"your function matches the plan on {len(rows)} cases ({len(DP_MODELS)} LMs, float32 "
        f"and bfloat16, 2 to 8 devices); e.g. {rows[-1][1]}: {format_bytes(rows[-1][3])}"
    )
