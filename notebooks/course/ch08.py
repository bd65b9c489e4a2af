"""Checks for chapter 8, your own model (notebooks/course_08_*.ipynb)."""

from __future__ import annotations

from collections import Counter

import workbench as wb
from workbench.core.ir.selectors import select

from .common import no_conflicts, ok, phase, require, unanswered


def _relative(name: str, prefix: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else name


def mp_split_dims(session, answer, prefix: str, axis: str = "model") -> None:
    """Exercises 8.1 and 8.3: for the parameters under ``prefix`` (one block of a model), the
    dim MP splits over ``axis``: ``{name relative to prefix: dim}``, the ones kept whole left
    out (or given as None)."""
    unanswered(answer, "a dict {name: dim} of the parameters MP splits")
    p = session.program
    params = set(p.anatomy().parameters)
    names = [p.values[v].name for v in select(p, prefix + "**", required=False) if v in params]
    require(names, f"no parameter of the program is named {prefix}...; check the prefix.")
    require(
        isinstance(answer, dict),
        f"give a dict {{name: dim}} of the parameters MP splits, names relative to {prefix!r}, "
        f"e.g. {{{_relative(names[0], prefix)!r}: <dim>, ...}}; got {answer!r}.",
    )
    known = {_relative(n, prefix): n for n in names}
    unknown = [k for k in answer if k not in known]
    require(
        not unknown,
        f"{unknown} are not parameters under {prefix!r}; they are: {sorted(known)}.",
    )
    split = {}
    for rel, name in known.items():
        v, sh = p.value(name), session.sharding(name)
        expected = sh.dim_of(axis)
        given = answer.get(rel)
        if isinstance(given, int) and not isinstance(given, bool) and v.shape:
            given %= len(v.shape)
        shape = list(v.shape)
        if expected is None:
            require(
                given is None,
                f"{rel} {shape} stays whole under MP ({sh}). MP splits what makes attention's "
                "heads and the MLP's hidden dimension; propagation adds what reads them. Is "
                f"{rel} one of those?",
            )
            continue
        split[rel] = (expected, shape)
        require(
            given is not None,
            f"{rel} {shape} is split over {axis!r} too. Which of its dims is the heads or the "
            "MLP's hidden dimension?",
        )
        require(
            given == expected,
            f"you said dim {given} of {rel} {shape}; MP splits another one. Hint: find the "
            "dim of the heads or of the MLP's hidden size (not the model width) in its shape; "
            "how does the library store a kernel, [in, out] or [out, in]?",
        )
    text = ", ".join(f"{rel} {shape} on dim {d}" for rel, (d, shape) in split.items())
    ok(
        f"MP splits {len(split)} of the block's {len(known)} parameters over {axis!r}: {text}; "
        "the rest stay whole"
    )


def _phase_counts(program, session, axis: str) -> Counter:
    return Counter(
        (phase(program, c), c.kind, c.bytes)
        for c in session.collectives()
        if c.axes == (axis,) and c.op is not None
    )


def vocab_parallel_head(session, axis: str = "model") -> None:
    """Exercise 8.2: a ``Role`` step before MP makes MP split the output head on its
    vocabulary; every other parameter keeps MP's layout; no conflict."""
    unanswered(session, "a wb.Session(program, mesh, [...]) whose schedule makes MP split the head")
    require(
        isinstance(session, wb.Session),
        f"expected a wb.Session(program, mesh, [...]); got {type(session).__name__}.",
    )
    p = session.program
    schedule = list(session.history)
    anatomy = p.anatomy()
    mps = [i for i, t in enumerate(schedule) if isinstance(t, wb.MP) and t.axis == axis]
    require(mps, f"put wb.MP({axis!r}) in the schedule: the Role says what MP should split.")
    plain = wb.Session(p, session.mesh, [t for t in schedule if not isinstance(t, wb.Role)])
    mp_alone = wb.Session(p, session.mesh, [wb.MP(axis)])
    heads = [
        (v, d) for v, d in anatomy.layers.heads_out if not mp_alone.state.shardings[v].uses(axis)
    ]
    require(heads, "the workbench sees no output head that MP leaves whole in this program.")
    corrected = {
        v: i
        for i, t in reversed(list(enumerate(schedule)))
        if isinstance(t, wb.Role)
        for v in select(p, t.selector, required=False)
    }
    chosen = [(v, d) for v, d in heads if v in corrected]
    require(
        chosen,
        f"no wb.Role step in the schedule selects the output head {p.values[heads[0][0]].name}: "
        "MP splits only what it reads as attention or MLP; a Role step before it can say that "
        "the head is split like an MLP's up projection.",
    )
    head, vocab = chosen[0]
    name, shape = p.values[head].name, list(p.values[head].shape)
    require(
        corrected[head] < mps[-1],
        "your Role comes after MP: a correction changes what the strategies after it see, so "
        "put it first.",
    )
    sh = session.sharding(name)
    require(
        sh.dim_of(axis) == vocab,
        f"{name} {shape} is {sh}: not split on its vocabulary. Which of its dims is the "
        "vocabulary (the anatomy report's output head finding says), and which did your Role "
        "give?",
    )
    no_conflicts(session)
    for v in anatomy.parameters:
        mine, theirs = session.state.shardings[v], plain.state.shardings[v]
        require(
            v == head or mine == theirs,
            f"{p.values[v].name} is {mine}, but MP alone makes it {theirs}: correct the output "
            "head only.",
        )
    extra = _phase_counts(p, session, axis) - _phase_counts(p, plain, axis)
    forward = [(kind, b, n) for (phase, kind, b), n in extra.items() if phase == "forward"]
    text = ", ".join(f"{n} {kind}{'s' if n > 1 else ''} of {b:,} B" for kind, b, n in forward)
    ok(
        f"MP splits {name} on its vocabulary: {sh}; the loss now needs {text or 'nothing'} "
        "more in the forward pass (the softmax's max and sum and the target's logit over the "
        "split vocabulary), each one number per token instead of the whole logits"
    )
