"""Checks for chapter 5, reading collectives (notebooks/course_05_*.ipynb)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

import workbench as wb

from .common import call, ok, phase, require

#: The sizes 5.1 is tried on besides the notebook's: (config overrides of the tiny LM, mesh).
SIZES = (
    (dict(batch=4, seq_len=32, dtype="bfloat16"), {"batch": 4, "model": 2}),
    (dict(d_model=64, n_heads=8, d_ff=128), {"batch": 1, "model": 8}),
)


def attention_allreduces(session) -> list:
    """The forward all-reduces of each attention's output (its down projection's result),
    found from the anatomy: one per attention the plan all-reduces."""
    p = session.program
    layers = p.anatomy().layers
    outputs = {v for a in layers.attention for v in a.output}
    made = {p.ops[x.op].results[0] for x in layers.projections if x.param in outputs}
    return [
        c
        for c in session.collectives()
        if c.kind == "all-reduce" and c.value in made and phase(p, c) == "forward"
    ]


def _inputs(session) -> tuple:
    """(batch, seq, d_model, itemsize, mesh) of the program's attention output."""
    cs = attention_allreduces(session)
    require(bool(cs), "this program's plan all-reduces no attention output in forward.")
    v = session.program.values[cs[0].value]
    require(len(v.shape) == 3, f"expected an attention output [batch, seq, d_model]; {v.shape}.")
    return (*v.shape, np.dtype(v.dtype).itemsize, session.mesh), cs


def _judge(fn, session, where: str) -> tuple[int, list]:
    __tracebackhide__ = True
    args, cs = _inputs(session)
    got = call(fn, *args)
    batch, seq, d_model, itemsize, mesh = args
    dims = f"batch={batch}, seq={seq}, d_model={d_model}, itemsize={itemsize}, mesh={mesh}"
    wrong = [c for c in cs if got != c.bytes]
    require(
        not wrong,
        f"{where} ({dims}) your function gives {got!r} bytes, but the plan's all-reduce of "
        f"{session.program.values[cs[0].value].name} moves a different amount. Which of the "
        "mesh's axes split this array on each device, and which only sum it?",
    )
    return got, cs


def attention_allreduce(fn, session, hlo) -> None:
    """Exercise 5.1: ``fn(batch, seq, d_model, itemsize, mesh)`` gives the bytes of each
    attention output's forward all-reduce under BP + MP, on the notebook's session (its plan
    and XLA's program) and on other sizes and meshes of the tiny LM."""
    require(callable(fn), f"expected a function; got {fn!r}.")
    got, cs = _judge(fn, session, "on the notebook's session")
    same = [h for h in hlo if h.kind == "all-reduce" and h.axes == cs[0].axes and h.bytes == got]
    require(
        len(same) >= len(cs),
        f"XLA's program has {len(same)} all-reduce(s) of {got} bytes over {cs[0].axes}, "
        f"fewer than the {len(cs)} attentions: compare your bytes with the records of `hlo`.",
    )
    from workbench.models import build, lm

    for overrides, axes in SIZES:
        e = build("lm", lm.Config.preset("tiny", **overrides), abstract=True)
        s = wb.Session(wb.capture(e.fn, *e.args), wb.Mesh(axes), [wb.BP("batch"), wb.MP("model")])
        _judge(fn, s, f"on the tiny LM with {overrides} over {axes}")
    ok(
        f"your function matches the plan on {1 + len(SIZES)} sizes and meshes, and XLA's "
        f"program has {len(same)} all-reduces of {got:,} bytes over {cs[0].axes} "
        f"(e.g. {same[0].name}, shape {same[0].operand_shapes[0]})"
    )


def own_allreduce(program, mesh, answer) -> None:
    """Exercise 5.3: the bytes of the first attention output's forward all-reduce on the
    learner's own model under BP + MP over ``mesh``."""
    require(
        answer is not ... and isinstance(answer, int | float),
        f"expected a number of bytes; got {answer!r}. Call your function from 5.1 with "
        "this model's sizes.",
    )
    s = wb.Session(program, mesh, [wb.BP("batch"), wb.MP("model")])
    cs = attention_allreduces(s)
    require(bool(cs), "BP + MP all-reduces no attention output of this model in forward.")
    name = program.values[cs[0].value].name
    require(
        answer == cs[0].bytes,
        f"you said {answer!r}; the plan all-reduces {name} over {cs[0].axes} with a different "
        f"size. Read its shape and dtype with own.value({name!r}), and split what "
        f"{dict(mesh.axes)} splits.",
    )
    ok(f"{name} is all-reduced over {cs[0].axes} with {answer:,} bytes per device")


def runs(hlo, kind: str, axes) -> int:
    """Arrays of ``kind`` over ``axes`` XLA's program reduces or moves per step."""
    return sum(h.count for h in hlo if h.kind == kind and h.axes == tuple(axes))


def xla_count(fn, session, hlo, xla_hlo) -> None:
    """Exercise 5.2: ``fn(hlo, kind, axes)`` counts the arrays XLA's program moves with
    ``kind`` over ``axes`` per step, on both compiled programs and as if in a loop."""
    require(callable(fn), f"expected a function; got {fn!r}.")
    looped = [dataclasses.replace(h, count=2 * h.count) for h in hlo]
    cases = [
        ("the explicit lowering's program", hlo),
        ("the constrained lowering's program", xla_hlo),
        ("the explicit program as if its collectives ran in a loop of 2 trips", looped),
    ]
    kinds = [("all-reduce", ("batch",)), ("all-reduce", ("model",)), ("all-gather", ("model",))]
    for where, h in cases:
        for kind, axes in kinds:
            got = call(fn, h, kind, axes)
            require(
                got == runs(h, kind, axes),
                f"on {where}, your count of {kind}s over {axes} is {got!r}, not what the "
                "records say. A record per array: do some share an instruction, does one run "
                "more than once per step (its `count`), and do you match kind and axes exactly?",
            )
    ours = Counter()
    for c in session.collectives():
        ours[(c.kind, c.axes)] += c.count
    n = runs(hlo, "all-reduce", ("batch",))
    ok(
        f"XLA's program all-reduces {n} arrays over ('batch',) per step (our plan: "
        f"{ours[('all-reduce', ('batch',))]}); constrained: {runs(xla_hlo, 'all-reduce', ('model',))} "
        f"over ('model',) against our {ours[('all-reduce', ('model',))]}"
    )
