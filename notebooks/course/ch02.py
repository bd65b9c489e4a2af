"""Checks for chapter 2, Megatron (notebooks/course_02_*.ipynb)."""

from __future__ import annotations

import math
from collections import Counter

import workbench as wb
from workbench.core.units import format_bytes

from .common import (
    call,
    no_conflicts,
    ok,
    phase,
    primitive_only,
    require,
    session,
    unanswered,
)

#: The LMs exercise 2.2 is tried on: zoo presets and overrides, built from shapes only.
MP_MODELS = (
    ("tiny", {}),
    ("small", {"n_layers": 1}),
    ("small", {"n_layers": 1, "batch": 4, "seq_len": 32}),
    ("tiny", {"n_layers": 1, "dtype": "bfloat16", "d_model": 48}),
)


def mlp_roles(program) -> tuple[list, list, set]:
    """The MLPs, from the anatomy: ``(up, down, hidden)``; ``up`` and ``down`` list
    ``(parameter, the dim that carries the MLP's hidden units, projection op)``, ``hidden``
    holds those dims' classes."""
    anatomy = program.anatomy()
    layers, values, classes = anatomy.layers, program.values, anatomy.classes
    up_dims = dict(anatomy.hidden_splits())
    hidden = {classes.of(p, d) for p, d in up_dims.items() if d is not None}
    attention_out = {v for a in layers.attention for v in a.output}
    up, down = [], []
    for proj in layers.projections:
        dims = classes.dims_of(proj.param, len(values[proj.param].shape))
        if proj.kind == "up" and up_dims.get(proj.param) is not None:
            up.append((proj.param, up_dims[proj.param], proj.op))
        elif proj.kind == "down" and proj.param not in attention_out and hidden & proj.contracted:
            down.append((proj.param, next(i for i, c in enumerate(dims) if c in hidden), proj.op))
    return up, down, hidden


def _reads(program, op: int, params: set[int]) -> bool:
    """Whether ``op`` reads one of ``params`` (or a cast, reshape or slice of one)."""
    origin = program.anatomy().layers.origin
    return any(origin.get(v, v) in params for v in program.ops[op].operands if isinstance(v, int))


def megatron_mlp(program, mesh, tactics, axis: str = "model") -> None:
    """Exercises 2.1 and 2.3: primitive tactics that split only the MLPs over ``axis``, the
    Megatron way: every up projection on its hidden dim, every down projection following on
    its own; then exactly one all-reduce per MLP in the forward pass (of the down
    projection's product) and one in the backward pass (of the gradient flowing into the
    MLP, through its up projection)."""
    s = session(program, mesh, primitive_only(tactics))
    no_conflicts(s)
    values = program.values
    up, down, hidden = mlp_roles(program)
    require(up and down, "the anatomy finds no MLP (up and down projections) in this program.")
    for param, d, _ in up:
        sh = s.sharding(values[param].name)
        require(
            sh.dim_of(axis) == d,
            f"{values[param].name} (an MLP's up projection) is {sh}: Megatron splits the "
            f"dimension the up projection makes, the MLP's hidden units, over {axis!r}, so the "
            "activation function runs on each device's slice with no communication.",
        )
    for param, d, _ in down:
        sh = s.sharding(values[param].name)
        require(
            sh.dim_of(axis) == d,
            f"{values[param].name} (an MLP's down projection) is {sh}: with the hidden units "
            f"split, it should follow on the hidden dimension it contracts. Split the up "
            "projection on the right dimension and let propagation do the rest.",
        )
    classes = program.anatomy().classes
    for v in program.anatomy().parameters:
        sh = s.sharding(values[v].name)
        d = sh.dim_of(axis)
        require(
            not sh.partial and (d is None or classes.of(v, d) in hidden),
            f"{values[v].name} is {sh}: this exercise splits the MLPs' hidden units only; "
            "attention, layer norms, embeddings and the residual stream stay whole.",
        )
    by_phase: dict[str, list] = {}
    for c in s.collectives():
        by_phase.setdefault(phase(program, c), []).append(c)
    extra = sorted(set(by_phase) - {"forward", "backward"})
    require(not extra, f"the plan has collectives in the {extra} phase(s); expected none there.")
    n, down_ops = len(down), {op for _, _, op in down}
    up_params = {p for p, _, _ in up}
    for when in ("forward", "backward"):
        cs = by_phase.get(when, [])
        kinds = Counter((c.kind, c.axes) for c in cs)
        require(
            kinds == Counter({("all-reduce", (axis,)): n}),
            f"the {when} pass has {dict(kinds)}; Megatron's MLP needs exactly one all-reduce "
            f"over {axis!r} per MLP ({n}) in each direction.",
        )
    fwd = {values[c.value].producer for c in by_phase["forward"]}
    require(
        fwd == down_ops,
        "the forward all-reduces are not of the down projections' products: each MLP's "
        "pending sum should appear where its down projection contracts the split hidden units.",
    )
    bwd = [values[c.value].producer for c in by_phase["backward"]]
    require(
        all(op is not None and _reads(program, op, up_params) for op in bwd),
        "the backward all-reduces are not of the gradient flowing into the MLPs (made by the "
        "backward matmul with an up projection); something else is split.",
    )
    ok(
        f"forward: exactly one all-reduce over {axis!r} per MLP ({n}), of its down "
        f"projection's product; backward: one per MLP, of the gradient of its input"
    )


def megatron_allreduce_bytes(formula) -> None:
    """Exercise 2.2: ``formula(batch, seq_len, d_model, dtype_bytes)`` gives the bytes of
    each forward all-reduce under Megatron (``wb.MP``), on several LM shapes and dtypes."""
    from workbench.models import build

    unanswered(None if formula is ... else formula, "a function of the config")
    require(callable(formula), f"expected a function; got {formula!r}.")
    cases = 0
    for size, overrides in MP_MODELS:
        example = build("lm", size, abstract=True, **overrides)
        cfg, program = example.config, wb.capture(example.fn, *example.args)
        s = wb.Session(program, wb.Mesh({"model": 4}), [wb.MP("model")])
        fwd = [c for c in s.collectives() if phase(program, c) == "forward"]
        sizes = {c.bytes for c in fwd if c.kind == "all-reduce"}
        (planned,) = sizes
        dtype_bytes = program.values[program.anatomy().parameters[0]].dtype.itemsize
        what = (
            f"batch={cfg.batch}, seq_len={cfg.seq_len}, d_model={cfg.d_model} in {cfg.dtype} "
            f"({dtype_bytes} bytes)"
        )
        mine = call(formula, cfg.batch, cfg.seq_len, cfg.d_model, dtype_bytes, what=what)
        require(
            math.isclose(mine, planned, rel_tol=1e-9),
            f"for {what} you give {mine:,.0f} bytes, which is not the size of the plan's "
            f"forward all-reduces. Each one makes whole the output of a block's attention or "
            "MLP: what shape does that activation have, whatever the weights' sizes, and how "
            "many bytes is each of its elements?",
        )
        cases += 1
        last = (what, planned, len(fwd))
    ok(
        f"your function matches the plan on {cases} LMs; e.g. {last[0]}: "
        f"{last[2]} forward all-reduces of {format_bytes(last[1])} each"
    )
