"""Checks for chapter 14, experts and long context (notebooks/course_14_*.ipynb): the number
of experts from which expert parallelism beats replicating the experts, and the sequence
length from which context parallelism beats splitting the batch alone."""

from __future__ import annotations

import dataclasses

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.units import format_bytes, format_seconds

from .common import no_conflicts, ok, require, unanswered

#: Numbers of experts 14.1 chooses from (each divisible by the 4-way experts axis).
EXPERTS = (4, 8, 16, 32, 64)
#: Sequence lengths 14.2 chooses from.
LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def moe_plans() -> tuple[wb.Mesh, dict[str, list]]:
    """The mesh of 14.1 and its two plans: the batch over all eight devices with every
    expert on each ("replicated"), and the batch over two with the experts split four ways."""
    mesh = wb.Mesh({"data": 2, "expert": 4})
    return mesh, {
        "replicated": [wb.BP("data"), wb.BP("expert")],
        "expert parallel": [wb.BP("data"), wb.EP("expert")],
    }


def cp_plans() -> tuple[wb.Mesh, dict[str, list]]:
    """The mesh of 14.2 and its two plans: a batch of two sequences split over "data" alone
    (the four devices of "seq" repeat the work), and with the sequence split over "seq"."""
    mesh = wb.Mesh({"data": 2, "seq": 4})
    return mesh, {"batch only": [wb.BP("data")], "context parallel": [wb.BP("data"), wb.CP("seq")]}


def estimates(cfg, mesh, plans) -> dict:
    """Plan name -> the H100 estimate of the zoo LM of ``cfg`` under it (from shapes alone)."""
    from workbench.models import build

    example = build("lm", cfg, abstract=True)
    program = wb.capture(example.fn, *example.args)
    out = {}
    for name, tactics in plans.items():
        s = wb.Session(program, mesh, tactics)
        no_conflicts(s)
        out[name] = s.estimate(hw.H100)
    return out


def _first(table, key, better: str, other: str):
    return next((k for k in table if key(table[k][better]) < key(table[k][other])), None)


def _pick(answer, choices, what: str) -> None:
    __tracebackhide__ = True
    unanswered(answer, f"one of {choices}")
    require(answer in choices, f"{what}={answer!r}: give one of {choices}.")


def experts_pay(E, cfg) -> None:
    """Exercise 14.1: ``E`` is the smallest of `EXPERTS` at which the zoo LM of ``cfg`` (its
    ``n_experts`` replaced) has a shorter estimated H100 step with its experts split over
    the experts axis than with them replicated, the batch split as the plans say."""
    _pick(E, EXPERTS, "E")
    mesh, plans = moe_plans()
    table = {n: estimates(dataclasses.replace(cfg, n_experts=n), mesh, plans) for n in EXPERTS}
    best = _first(table, lambda e: e.step_s, "expert parallel", "replicated")
    require(best is not None, "EP wins at no E here: the check needs a config where it does.")
    rep, ep = table[E]["replicated"], table[E]["expert parallel"]
    at = (
        f"E={E}: replicated {format_seconds(rep.step_s)}, peak {format_bytes(rep.memory.peak)}; "
        f"expert parallel {format_seconds(ep.step_s)}, peak {format_bytes(ep.memory.peak)}"
    )
    if best < E:
        memory = _first(table, lambda e: e.memory.peak, "expert parallel", "replicated")
        require(
            memory != E,
            f"{at}. This is where the peaks cross; the exercise asks for the step time, "
            "which crosses elsewhere: compare .step_s.",
        )
        require(False, f"{at}. A smaller E in {EXPERTS} already gives EP the shorter step.")
    require(
        best == E,
        f"{at}: EP's step is not shorter yet. With the tokens whole on the experts axis, "
        "what does each of its devices repeat, and what grows with E under replication "
        "(the gradient all-reduce, the optimizer)? Look further.",
    )
    ok(f"{at}: from E={E} on EP's step is the shorter of the two")


def context_pays(L, cfg) -> None:
    """Exercise 14.2: ``L`` is the shortest of `LENGTHS` at which the zoo LM of ``cfg`` (its
    ``seq_len`` replaced) has a shorter estimated H100 step with CP than with the batch
    split alone, on the mesh of `cp_plans`."""
    _pick(L, LENGTHS, "L")
    mesh, plans = cp_plans()
    table = {n: estimates(dataclasses.replace(cfg, seq_len=n), mesh, plans) for n in LENGTHS}
    best = _first(table, lambda e: e.step_s, "context parallel", "batch only")
    require(best is not None, "CP wins at no length here: the check needs a longer one.")
    bp, cp = table[L]["batch only"], table[L]["context parallel"]
    at = (
        f"L={L}: batch only {format_seconds(bp.step_s)}; context parallel "
        f"{format_seconds(cp.step_s)} (compute {format_seconds(cp.compute_s)}, "
        f"communication {format_seconds(cp.communication_s)})"
    )
    require(best >= L, f"{at}. A shorter length in {LENGTHS} already pays.")
    require(
        best == L,
        f"{at}: CP's step is not shorter yet. Its collectives cost about the same at every "
        "length; the compute it divides grows with L (attention as L squared). Look longer.",
    )
    ok(f"{at}: from L={L} on CP's step is the shorter")
