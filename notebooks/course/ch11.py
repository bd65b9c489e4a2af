"""Checks for chapter 11, overlap and bucketing (notebooks/course_11_*.ipynb)."""

from __future__ import annotations

import dataclasses
import math

import workbench as wb
from workbench.core.units import format_seconds

from .common import CheckFailed, call, no_conflicts, ok, require, session, unanswered

#: Under "prefetch" a strategy's communication hides when at least this share of the shorter of
#: compute and communication comes off the step.
HIDES = 0.9


def _slow_links(hardware, factor: float = 20.0):
    """``hardware`` with links ``factor`` times slower: communication outgrows compute."""
    links = tuple(dataclasses.replace(x, bandwidth=x.bandwidth / factor) for x in hardware.links)
    return dataclasses.replace(hardware, name=f"{hardware.name}, links /{factor:g}", links=links)


def full_overlap(sessions: dict, formula) -> None:
    """Exercise 11.1: ``formula(compute_s, communication_s)`` gives the step under "full" overlap
    for every strategy, on the hardware and on one whose links are 20 times slower."""
    from workbench.core import hardware as hw

    unanswered(formula, "a function of compute and communication seconds")
    require(
        callable(formula),
        f"expected a function (def full_step(compute, comm): ...); got {formula!r}.",
    )
    seen = []
    for spec in (hw.H100, _slow_links(hw.H100)):
        for name, s in sessions.items():
            e = s.estimate(spec, overlap="full")
            mine = call(formula, e.compute_s, e.communication_s, what=f"{name} on {spec.name}")
            require(
                isinstance(mine, int | float) and math.isclose(mine, e.step_s, rel_tol=1e-6),
                f"{name} on {spec.name}: compute {format_seconds(e.compute_s)}, communication "
                f"{format_seconds(e.communication_s)}; your function gives "
                f"{format_seconds(mine) if isinstance(mine, int | float) else mine!r}, the engine "
                f"{format_seconds(e.step_s)}. When both run at once, which one decides when the "
                "step ends?",
            )
            seen.append(e.communication_s > e.compute_s)
    require(any(seen) and not all(seen), "the check needs strategies on both sides of the balance.")
    ok(f"your function matches the engine's 'full' overlap on {len(seen)} strategy-hardware pairs, "
       "with communication both shorter and longer than compute")  # fmt: skip


def hidden_share(session_: wb.Session, hardware) -> float:
    """The share of the shorter of compute and communication that "prefetch" takes off the step."""
    none = session_.estimate(hardware, overlap="none")
    pre = session_.estimate(hardware, overlap="prefetch")
    shorter = min(none.compute_s, none.communication_s)
    return 0.0 if shorter <= 0 else (none.step_s - pre.step_s) / shorter


def which_hide(sessions: dict, answer) -> None:
    """Exercise 11.2: for each strategy, whether its communication hides behind compute under
    "prefetch" (True) or sits on the critical path (False), judged by the engine."""
    from workbench.core import hardware as hw

    unanswered(answer, "a dict {strategy name: True or False}")
    if isinstance(answer, dict) and any(v is ... for v in answer.values()):
        raise CheckFailed(
            "not answered yet: replace each ... in the cell above with True or False."
        )
    require(
        isinstance(answer, dict) and set(answer) == set(sessions),
        f"expected a dict with one True/False per strategy {sorted(sessions)}; got {answer!r}.",
    )
    for name, s in sessions.items():
        truth = hidden_share(s, hw.H100) >= HIDES
        require(
            answer[name] is truth,
            f"{name}: you say its communication {'hides' if answer[name] else 'does not hide'}. "
            f"Look at the phase of the op that needs each of {name}'s collectives "
            "(Counter by kind and phase above): can the runtime start it before that op, or "
            "finish it after, while other work runs?",
        )
    ok("right for every strategy: gradient reductions and prefetched weight gathers hide; "
       "an activation all-reduce the next op waits for does not")  # fmt: skip


def own_hides(program, mesh, schedule) -> None:
    """Exercise 11.3: a schedule for the learner's model whose communication all hides under
    "prefetch" (the step is the longer of compute and communication), with no conflicts."""
    from workbench.core import hardware as hw

    s = session(program, mesh, schedule)
    no_conflicts(s)
    e = s.estimate(hw.H100, overlap="prefetch")
    require(
        e.communication_s > 0,
        "your schedule communicates nothing: split the work over the mesh first "
        "(a replicated program has nothing to hide).",
    )
    exposed = e.step_s - max(e.compute_s, e.communication_s)
    require(
        exposed <= 0.01 * e.step_s,
        f"under 'prefetch' {format_seconds(exposed)} of communication stays on the critical path "
        f"(step {format_seconds(e.step_s)}, compute {format_seconds(e.compute_s)}, communication "
        f"{format_seconds(e.communication_s)}). Which collectives does a runtime start early or "
        "finish late, and which does the very next op wait for?",
    )
    ok(f"all {format_seconds(e.communication_s)} of communication hides under 'prefetch' "
       f"(step {format_seconds(e.step_s)})")  # fmt: skip
